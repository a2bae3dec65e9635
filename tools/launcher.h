// `zeroth launch`: starts N local processes of a command with torchrun's environment, prefixes
// their output with the rank, forwards signals, and when one fails stops the rest and returns
// its exit code.
#pragma once

#include <chrono>  // std::chrono::seconds
#include <string>  // std::string
#include <vector>  // std::vector

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
};

// Returns the job's exit code: 0 when every rank succeeded, else the first failing rank's code
// (128 + signal for a rank killed by a signal).
int run_launch(const LaunchOptions& options);

}  // namespace zeroth::tools
