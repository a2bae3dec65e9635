// `zeroth eval CONFIG [--set k=v]... [--resume [DIR]] [--json]`: the validation loss and perplexity
// of the weights a config starts from, over every complete window of its validation data.
#include <cmath>   // std::exp
#include <cstdio>  // std::printf
#include <memory>  // std::make_shared
#include <mutex>   // std::mutex
#include <string>  // std::string
#include <vector>  // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <nlohmann/json.hpp>  // nlohmann::json

#include "tools/commands.h"
#include "train/trainer.h"  // evaluate

namespace zeroth::tools {
namespace {

struct EvalOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
  bool json = false;
};

void run_eval(const EvalOptions& o) {
  TrainConfig c = load_run_config(o.config, o.overrides);
  if (!o.resume.empty()) c.run.resume = o.resume == "-" ? c.run.checkpoint_dir : o.resume;
  EvalResult result;
  std::mutex mutex;
  on_every_rank(c, [&](Communicator& comm, Device& device) {
    const EvalResult r = evaluate(c, comm, device);
    std::lock_guard lock(mutex);
    if (comm.rank() == 0) result = r;
  });
  const double perplexity = std::exp(result.loss);
  if (o.json) {
    const nlohmann::json j = {{"loss", result.loss},
                              {"perplexity", perplexity},
                              {"tokens", result.tokens},
                              {"windows", result.windows}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  const std::string from = !c.run.resume.empty()      ? "the checkpoint " + c.run.resume
                           : !c.run.init_from.empty() ? c.run.init_from
                                                      : "a fresh initialization (seed " + std::to_string(c.run.seed) + ")";
  std::printf("%s (%s) on %s\n", c.model.describe().c_str(), from.c_str(),
              c.data.val.empty() ? "the held-out tail of data.train" : c.data.val.c_str());
  std::printf("loss %.6f  perplexity %.4f  over %lld windows of %d tokens (%lld tokens) in %.2f s\n", result.loss, perplexity,
              static_cast<long long>(result.windows), c.model.seq_len, static_cast<long long>(result.tokens), result.seconds);
}

}  // namespace

void add_eval_command(CLI::App& app) {
  auto o = std::make_shared<EvalOptions>();
  auto* cmd = app.add_subcommand(
      "eval", "The mean next-token cross-entropy (and perplexity) of a config's starting weights (run.init_from, or "
              "--resume's checkpoint) over every complete window of its validation data");
  cmd->add_option("config", o->config, "The run's JSON config (see configs/)")->required();
  cmd->add_option("--set", o->overrides, "Override a key: --set run.init_from=DIR --set run.world_size=4")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--resume", o->resume,
                  "Evaluate a checkpoint: a checkpoint folder (its latest) or a step folder; without a value, "
                  "run.checkpoint_dir")
      ->expected(0, 1)
      ->default_str("-");
  cmd->add_flag("--json", o->json, "Print {\"loss\", \"perplexity\", \"tokens\", \"windows\"} as one JSON line");
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace zeroth::tools
