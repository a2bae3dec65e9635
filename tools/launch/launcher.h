// `zeroth launch`: starts N local processes of a command with torchrun's environment, prefixes
// their output with the rank, forwards signals, and when one fails stops the rest and returns
// its exit code, or starts them all again (up to --max-restarts times) with ZEROTH_RESTART_COUNT
// set, which `zeroth train` takes as --resume.
#pragma once

#include <chrono>   // std::chrono::seconds
#include <cstdint>  // int64_t
#include <string>   // std::string
#include <vector>   // std::vector

namespace zeroth::tools {

struct LaunchOptions {
  int nproc_per_node = 1;
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 0;                 // 0: a free port on a single node, 29500 across nodes
  std::chrono::seconds kill_grace{5};  // SIGTERM, then SIGKILL after this long
  std::vector<std::string> command;
  // A file (mode 600) holding the job's secret, handed to the ranks as ZEROTH_JOB_TOKEN. Without
  // it the ranks inherit ZEROTH_JOB_TOKEN, or get one made for this job on a single node.
  std::string token_file;
  bool prefix_output = true;  // "[rank N] " before each line
  // Times the job is started again after a rank fails (not after a signal to the launcher). Each
  // attempt gets its own store port: MASTER_PORT + attempt where a port is given or needed.
  int max_restarts = 0;
  // --nnodes MIN:MAX: a restart goes on with the nodes that join it, at least MIN (0: nnodes,
  // which is MAX). Node 0 waits `last_call` after MIN joined for the rest.
  int min_nnodes = 0;
  std::chrono::seconds last_call{30};
  int min_nodes() const { return min_nnodes > 0 ? min_nnodes : nnodes; }
  int64_t job_started = 0;  // set by run_launch: its start, for the ranks (ZEROTH_JOB_STARTED)
};

// Returns the job's exit code: 0 when every rank succeeded, else the first failing rank's code
// (128 + signal for a rank killed by a signal).
int run_launch(const LaunchOptions& options);

}  // namespace zeroth::tools
