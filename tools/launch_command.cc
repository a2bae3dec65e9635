// `zeroth launch -n N [--nnodes K --node-rank R --master-addr A --master-port P] -- CMD...`
#include <cstdlib>

#include "tools/commands.h"
#include "tools/launcher.h"

namespace zeroth::tools {

void add_launch_command(CLI::App& app) {
  auto options = std::make_shared<LaunchOptions>();
  auto* cmd = app.add_subcommand("launch", "Start N ranks of a command with torchrun's environment (RANK, WORLD_SIZE, ...)");
  cmd->add_option("-n,--nproc-per-node", options->nproc_per_node, "Processes on this node")->required();
  cmd->add_option("--nnodes", options->nnodes, "Nodes in the job (default 1)");
  cmd->add_option("--node-rank", options->node_rank, "This node's index (default 0)");
  cmd->add_option("--master-addr", options->master_addr, "Host of rank 0 (default 127.0.0.1)");
  cmd->add_option("--master-port", options->master_port, "Port of the rendezvous store (default: free port, 29500 across nodes)");
  cmd->add_option("--token-file", options->token_file,
                  "File (mode 600) holding the job's secret, the same on every node (default: ZEROTH_JOB_TOKEN, or one made "
                  "for a single-node job)");
  cmd->add_option("command", options->command, "The command each rank runs (after --)")->required();
  cmd->callback([options] {
    const int code = run_launch(*options);
    if (code != 0) std::exit(code);
  });
}

}  // namespace zeroth::tools
