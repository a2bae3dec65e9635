// `zeroth generate CONFIG --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-k K]
// [--top-p P] [--seed S]`: text from the weights a config starts from, streamed as it is decoded.
#include <cstdio>   // std::printf, std::fflush
#include <cstdlib>  // std::getenv
#include <memory>   // std::make_shared
#include <string>   // std::string
#include <vector>   // std::vector

#include <CLI/CLI.hpp>   // CLI::App
#include <fmt/format.h>  // fmt::format

#include "core/env.h"  // env::kLogLevel
#include "core/log.h"  // log::set_level
#include "tools/cli/commands.h"
#include "tools/cli/options.h"  // RunConfigArgs, load_run_config
#include "train/generate.h"     // generate

namespace zeroth::tools {
namespace generate_cmd {

struct GenerateCliOptions {
  RunConfigArgs run;
  GenerateOptions o;
  bool ids = false;
};

void run_generate(GenerateCliOptions& g) {
  TrainConfig c = load_run_config(g.run, /*trained_weights=*/true);
  // The engine's plan of one rank holding the weights is not news here.
  if (std::getenv(std::string(env::kLogLevel).c_str()) == nullptr) log::set_level(log::Level::warn);
  // The prompt is echoed once it is taken (a prompt too long for the model is an error alone); a
  // chat's reply stands alone.
  bool echoed = g.o.chat;
  auto echo = [&] {
    if (!echoed) std::printf("%s", g.o.prompt.c_str());
    echoed = true;
  };
  const GenerateResult r = generate(c, g.o, [&](std::string_view text) {
    echo();
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  echo();
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
  // The limit the generation ran into, if it ran into one: the window's, where it is below --max-new-tokens.
  const bool full = !r.ended && r.ids.size() == static_cast<size_t>(r.max_new_tokens);
  const char* limit = r.max_new_tokens < g.o.max_new_tokens ? "model.seq_len" : "--max-new-tokens";
  const std::string cut = full ? fmt::format(" (cut at {})", limit) : "";
  const std::string turn = !g.o.chat ? "" : r.ended ? ", ended at the end of turn" : fmt::format(", no end of turn within {}", limit);
  std::fprintf(stderr, "%zu new tokens after the prompt's %zu, in %.2f s with the prompt's pass (%.1f new tokens/s)%s%s\n",
               r.ids.size(), r.prompt_ids.size(), r.seconds, r.seconds > 0 ? static_cast<double>(r.ids.size()) / r.seconds : 0.0,
               cut.c_str(), turn.c_str());
}

}  // namespace generate_cmd

void add_generate_command(CLI::App& app) {
  using namespace generate_cmd;
  auto g = std::make_shared<GenerateCliOptions>();
  auto* cmd = app.add_subcommand("generate",
                                 "Text from a run's trained weights, or a config's starting weights (run.init_from, or --resume's "
                                 "checkpoint), decoded with a key/value cache on one rank and streamed");
  add_run_config_options(cmd, g->run, "Generate from",
                         "The run's JSON config (see configs/): its model, its data.tokenizer; or a run's folder: its config, and its "
                         "trained weights unless --resume or --set run.init_from say otherwise",
                         "--set run.init_from=runs/NAME/model.safetensors");
  cmd->add_option("--prompt", g->o.prompt, "The text to continue (default: a newline)");
  cmd->add_option("--max-new-tokens", g->o.max_new_tokens, "Tokens to generate (default 128; at most what model.seq_len leaves)");
  cmd->add_option("--temperature", g->o.temperature, "Softmax temperature (default 1; 0: greedy)");
  cmd->add_option("--top-k", g->o.top_k, "Sample among the K most likely tokens (default 50; 0: all)");
  cmd->add_option("--top-p", g->o.top_p, "Then among the fewest holding this much probability (default 1)");
  cmd->add_option("--seed", g->o.seed, "The sampler's seed (default 1234)");
  cmd->add_flag("--ids", g->ids, "Also print the prompt's and the generated token ids");
  cmd->add_flag("--chat", g->o.chat,
                "The prompt as a user's message through the chat template (data.tokenizer's folder, or data.chat_template) with "
                "the generation prompt; the reply alone is printed, up to the template's end of turn");
  cmd->add_option("--system", g->o.system, "With --chat: a system message before the user's");
  cmd->callback([g] { run_generate(*g); });
}

}  // namespace zeroth::tools
