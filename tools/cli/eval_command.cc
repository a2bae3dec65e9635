// `zeroth eval CONFIG [--set k=v]... [--resume [DIR]] [--json]`: the validation loss and perplexity
// of the weights a config starts from, over every complete window of its validation data (or the
// first --windows N, which a training run's validation measured).
#include <cmath>   // std::exp
#include <cstdio>  // std::printf
#include <memory>  // std::make_shared
#include <mutex>   // std::mutex
#include <string>  // std::string
#include <vector>  // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"  // ZEROTH_THROW
#include "tools/cli/commands.h"
#include "tools/cli/options.h"  // RunConfigArgs, load_run_config
#include "train/trainer.h"      // evaluate

namespace zeroth::tools {
namespace eval_cmd {

struct EvalOptions {
  RunConfigArgs run;
  int64_t windows = 0;
  bool windows_given = false;
  bool json = false;
};

void run_eval(EvalOptions& o) {
  if (o.windows < 0 || (o.windows == 0 && o.windows_given))
    ZEROTH_THROW(InvalidArgument, "--windows {}: give a positive number of windows (without it: all of them)", o.windows);
  TrainConfig c = load_run_config(o.run, /*trained_weights=*/true);
  EvalResult result;
  std::mutex mutex;
  on_every_rank(c, [&](Communicator& comm, Device& device) {
    const EvalResult r = evaluate(c, comm, device, o.windows);
    std::lock_guard lock(mutex);
    if (comm.rank() == 0) result = r;
  });
  const double perplexity = std::exp(result.loss);
  if (o.json) {
    const nlohmann::json j = {
        {"loss", result.loss}, {"perplexity", perplexity}, {"tokens", result.tokens}, {"windows", result.windows}, {"of", result.of}};
    std::printf("%s\n", j.dump().c_str());
    return;
  }
  const std::string from = !c.run.resume.empty()      ? "the checkpoint " + c.run.resume
                           : !c.run.init_from.empty() ? c.run.init_from
                                                      : "a fresh initialization (seed " + std::to_string(c.run.seed) + ")";
  std::printf("%s (%s) on %s\n", c.model.describe().c_str(), from.c_str(),
              c.data.val.empty() ? "the held-out tail of data.train" : c.data.val.c_str());
  const bool samples = c.data.format == DataFormat::jsonl;
  std::printf("loss %.6f  perplexity %.4f  over %s %s (%lld %s) in %.2f s\n", result.loss, perplexity,
              result.windows == result.of ? fmt::format("all {}", result.of).c_str()
                                          : fmt::format("the first {} of {}", result.windows, result.of).c_str(),
              samples ? "samples" : fmt::format("windows of {} tokens", c.model.seq_len).c_str(),
              static_cast<long long>(result.tokens), samples ? "targets counted by data.loss_on" : "tokens", result.seconds);
  if (o.windows > result.of)
    std::printf("(--windows %lld asked for more than the %lld %s the validation data holds: all of them were measured)\n",
                static_cast<long long>(o.windows), static_cast<long long>(result.of), result.rows);
}

}  // namespace eval_cmd

void add_eval_command(CLI::App& app) {
  using namespace eval_cmd;
  auto o = std::make_shared<EvalOptions>();
  auto* cmd = app.add_subcommand(
      "eval", "The mean next-token cross-entropy (and perplexity) of a run's trained weights, or of a config's starting "
              "weights (run.init_from, or --resume's checkpoint), over every complete window of its validation data");
  add_run_config_options(
      cmd, o->run, "Evaluate",
      "The run's JSON config (see configs/), or a run's folder: its config, and its trained weights (model.safetensors, "
      "else its checkpoints) unless --resume or --set run.init_from say otherwise",
      "--set run.init_from=DIR --set run.world_size=4");
  cmd->add_option("--windows", o->windows,
                  "Only the first N windows (a training run's validation measures the first run.eval_batches x micro-batch x "
                  "data-parallel ranks of them; its start box says how many)")
      ->each([o](const std::string&) { o->windows_given = true; });
  cmd->add_flag("--json", o->json, "Print {\"loss\", \"perplexity\", \"tokens\", \"windows\", \"of\"} as one JSON line");
  cmd->callback([o] { run_eval(*o); });
}

}  // namespace zeroth::tools
