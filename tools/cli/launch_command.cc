// `zeroth launch -n N [--nnodes K|MIN:MAX --node-rank R --master-addr A --master-port P] [--max-restarts M] -- CMD...`
#include <chrono>
#include <cstdlib>
#include <exception>
#include <memory>
#include <string>

#include "core/error.h"

#include "tools/cli/commands.h"
#include "tools/launch/launcher.h"

namespace zeroth::tools {

namespace launch_cmd {

// "K" or "MIN:MAX".
void parse_nnodes(const std::string& text, LaunchOptions& o) {
  const auto colon = text.find(':');
  const auto number = [&](const std::string& part) {
    size_t used = 0;
    int value = 0;
    try {
      value = std::stoi(part, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != part.size() || value < 1)
      ZEROTH_THROW(ConfigError, "--nnodes {}: give a node count (2) or a range MIN:MAX (1:4) of counts of at least 1", text);
    return value;
  };
  if (colon == std::string::npos) {
    o.nnodes = number(text);
    return;
  }
  o.min_nnodes = number(text.substr(0, colon));
  o.nnodes = number(text.substr(colon + 1));
  if (o.min_nnodes > o.nnodes) ZEROTH_THROW(ConfigError, "--nnodes {}: MIN is more than MAX", text);
}

}  // namespace launch_cmd

void add_launch_command(CLI::App& app) {
  using namespace launch_cmd;
  auto options = std::make_shared<LaunchOptions>();
  auto* cmd = app.add_subcommand("launch", "Start N ranks of a command with torchrun's environment (RANK, WORLD_SIZE, ...)");
  cmd->add_option("-n,--nproc-per-node", options->nproc_per_node, "Processes on this node")->required();
  auto nnodes = std::make_shared<std::string>("1");
  cmd->add_option("--nnodes", *nnodes, "Nodes in the job, or MIN:MAX: restarts go on with at least MIN of them (default 1)");
  cmd->add_option("--node-rank", options->node_rank, "This node's index (default 0)");
  cmd->add_option("--master-addr", options->master_addr, "Host of rank 0 (default 127.0.0.1)");
  cmd->add_option("--master-port", options->master_port, "Port of the rendezvous store (default: free port, 29500 across nodes)");
  cmd->add_option("--token-file", options->token_file,
                  "File (mode 600) holding the job's secret, the same on every node (default: ZEROTH_JOB_TOKEN, or one made "
                  "for a single-node job)");
  cmd->add_option("--max-restarts", options->max_restarts,
                  "Start the job again this many times when a rank fails; `zeroth train` resumes from its latest checkpoint "
                  "(default 0)");
  cmd->add_option("command", options->command, "The command each rank runs (after --)")->required();
  auto last_call = std::make_shared<int>(30);
  cmd->add_option("--last-call", *last_call,
                  "Seconds node 0 waits for more nodes once MIN of --nnodes MIN:MAX joined a start (default 30)");
  cmd->callback([options, nnodes, last_call] {
    parse_nnodes(*nnodes, *options);
    options->last_call = std::chrono::seconds(*last_call);
    const int code = run_launch(*options);
    if (code != 0) std::exit(code);
  });
}

}  // namespace zeroth::tools
