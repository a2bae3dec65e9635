// `zeroth generate CONFIG --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]
// [--top-p P] [--seed S]`: text from the weights a config starts from, streamed as it is decoded.
#include <cstdio>  // std::printf, std::fflush
#include <memory>  // std::make_shared
#include <string>  // std::string
#include <vector>  // std::vector

#include <CLI/CLI.hpp>  // CLI::App

#include "tools/commands.h"
#include "train/generate.h"  // generate

namespace zeroth::tools {
namespace {

struct GenerateCliOptions {
  std::string config;
  std::vector<std::string> overrides;
  std::string resume;
  GenerateOptions o;
  bool ids = false;
};

void run_generate(const GenerateCliOptions& g) {
  TrainConfig c = load_run_config(g.config, g.overrides);
  if (!g.resume.empty()) c.run.resume = g.resume == "-" ? c.run.checkpoint_dir : g.resume;
  std::printf("%s", g.o.prompt.c_str());
  std::fflush(stdout);
  const GenerateResult r = generate(c, g.o, [](std::string_view text) {
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  std::printf("\n");
  std::fflush(stdout);  // before the summary on stderr
  if (g.ids) {
    std::printf("prompt ids:");
    for (const int32_t id : r.prompt_ids) std::printf(" %d", id);
    std::printf("\nids:");
    for (const int32_t id : r.ids) std::printf(" %d", id);
    std::printf("\n");
    std::fflush(stdout);
  }
  std::fprintf(stderr, "%zu tokens in %.2f s (%.1f tokens/s, the prompt's %zu included)%s\n", r.ids.size(), r.seconds,
               r.seconds > 0 ? static_cast<double>(r.ids.size()) / r.seconds : 0.0, r.prompt_ids.size(),
               r.max_new_tokens < g.o.max_new_tokens ? " (cut at model.seq_len)" : "");
}

}  // namespace

void add_generate_command(CLI::App& app) {
  auto g = std::make_shared<GenerateCliOptions>();
  auto* cmd = app.add_subcommand(
      "generate", "Text from a config's starting weights (run.init_from, or --resume's checkpoint), decoded with a key/value "
                  "cache on one rank and streamed");
  cmd->add_option("config", g->config, "The run's JSON config (see configs/): its model, its data.tokenizer")->required();
  cmd->add_option("--set", g->overrides, "Override a key: --set run.init_from=runs/NAME/model.safetensors")
      ->expected(1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  cmd->add_option("--resume", g->resume,
                  "Generate from a checkpoint: a checkpoint folder (its latest) or a step folder; without a "
                  "value, run.checkpoint_dir")
      ->expected(0, 1)
      ->default_str("-");
  cmd->add_option("--prompt", g->o.prompt, "The text to continue (default: a newline)");
  cmd->add_option("--max-new-tokens", g->o.max_new_tokens, "Tokens to generate (default 128; at most what model.seq_len leaves)");
  cmd->add_option("--temperature", g->o.temperature, "Softmax temperature (default 1; 0: greedy)");
  cmd->add_option("--top-k", g->o.top_k, "Sample among the K most likely tokens (default 50; 0: all)");
  cmd->add_option("--top-p", g->o.top_p, "Then among the fewest holding this much probability (default 1)");
  cmd->add_option("--seed", g->o.seed, "The sampler's seed (default 1234)");
  cmd->add_flag("--ids", g->ids, "Also print the prompt's and the generated token ids");
  cmd->callback([g] { run_generate(*g); });
}

}  // namespace zeroth::tools
