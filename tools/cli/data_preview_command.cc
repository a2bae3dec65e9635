// `zeroth data-preview CONFIG [--set k=v]... [--n N] [--json]`: the first training rows as the run
// will see them, in its order (step 1's first): each sample's text with the part the loss counts
// marked (green on a terminal, [[brackets]] otherwise), its tokens and counted targets, and for
// packed rows their samples and how full each row is. --json prints one object a sample:
// {"text", "ids", "mask"}, mask 1 where the token is a target that counts (Hugging Face's labels
// that are not -100).
#include <unistd.h>  // isatty

#include <cstdio>  // std::printf
#include <memory>  // std::make_shared
#include <string>  // std::string
#include <vector>  // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"  // ZEROTH_THROW
#include "tools/cli/commands.h"
#include "tools/cli/options.h"     // RunConfigArgs, load_run_config
#include "train/corpus/packing.h"  // Packed
#include "train/data.h"            // open_run_data
#include "train/text/tokenizer.h"  // Tokenizer

namespace zeroth::tools {
namespace data_preview_cmd {

struct PreviewOptions {
  RunConfigArgs run;
  int64_t n = 4;
  bool json = false;
};

// The sample's text, the counted stretches marked.
std::string marked(const Tokenizer& tok, std::span<const int32_t> ids, std::span<const uint8_t> mask, bool colour) {
  std::string out;
  size_t begin = 0;
  for (size_t j = 1; j <= ids.size(); ++j) {
    if (j < ids.size() && mask[j] == mask[begin]) continue;
    const std::string text = tok.decode(ids.subspan(begin, j - begin));
    if (mask[begin]) out += colour ? "\033[32m" + text + "\033[0m" : "[[" + text + "]]";
    else out += text;
    begin = j;
  }
  return out;
}

void run_preview(PreviewOptions& o) {
  if (o.n < 1) ZEROTH_THROW(InvalidArgument, "--n {}: give a positive number of samples", o.n);
  TrainConfig c = load_run_config(o.run);
  RunData data = open_run_data(c, 1, 0);
  const auto tok = c.data.tokenizer.empty() ? Tokenizer::bytes() : Tokenizer::open(c.data.tokenizer);
  const bool colour = !o.json && isatty(STDOUT_FILENO) == 1;
  const corpus::Rows& rows = data.train.rows();
  const corpus::Samples* samples = data.splits.train_samples.get();
  const auto* packed = dynamic_cast<const corpus::Packed*>(&rows);
  const int T = rows.width();
  int64_t shown = 0;
  auto show = [&](std::span<const int32_t> ids, std::span<const uint8_t> mask, const std::string& what) {
    int64_t counted = 0;
    for (const uint8_t m : mask) counted += m;
    if (o.json) {
      std::vector<int> m(mask.begin(), mask.end());
      std::printf("%s\n", nlohmann::json{{"text", tok->decode(ids)}, {"ids", ids}, {"mask", m}}.dump().c_str());
    } else {
      std::printf("%s: %zu tokens, %lld counted\n%s\n\n", what.c_str(), ids.size(), static_cast<long long>(counted),
                  marked(*tok, ids, mask, colour).c_str());
    }
    ++shown;
  };
  for (int64_t k = 0; shown < o.n && k < rows.size(); ++k) {
    const int64_t row = data.train.row_of(k);
    if (samples == nullptr) {
      // A window of a token stream: its inputs and the last target, every target counting.
      std::vector<int32_t> tokens(T), targets(T);
      rows.fill(row, tokens.data(), targets.data());
      tokens.push_back(targets.back());
      std::vector<uint8_t> mask(tokens.size(), 1);
      mask[0] = 0;
      show(tokens, mask, fmt::format("window {} of {}", row + 1, rows.size()));
      continue;
    }
    if (packed != nullptr) {
      const auto in_row = packed->samples_of(row);
      size_t used = 0;
      for (const uint32_t i : in_row) used += samples->ids(i).size();
      if (!o.json) {
        std::printf("packed row %lld of %lld: %zu samples, %zu of %d positions (%.1f%%)\n", static_cast<long long>(row + 1),
                    static_cast<long long>(rows.size()), in_row.size(), used, T, 100.0 * static_cast<double>(used) / T);
      }
      for (const uint32_t i : in_row) {
        if (shown == o.n) break;
        show(samples->ids(i), samples->trained(i), fmt::format("  sample {} ({})", i + 1, samples->source(i)));
      }
      continue;
    }
    show(samples->ids(row), samples->trained(row), fmt::format("sample {} ({})", row + 1, samples->source(row)));
  }
}

}  // namespace data_preview_cmd

void add_data_preview_command(CLI::App& app) {
  using namespace data_preview_cmd;
  auto o = std::make_shared<PreviewOptions>();
  auto* cmd = app.add_subcommand("data-preview",
                                 "The first training samples as a config's run will see them: the text with what the loss counts "
                                 "marked, token counts, and packed rows' samples and fill");
  add_run_config_options(cmd, o->run, "Preview", "The run's JSON config (see configs/), or a run's folder: its config",
                         "--set data.packing=true");
  cmd->add_option("--n", o->n, "How many samples (default 4)");
  cmd->add_flag("--json", o->json, "One JSON object a sample: {\"text\", \"ids\", \"mask\"}, mask 1 where the target counts");
  cmd->callback([o] { run_preview(*o); });
}

}  // namespace zeroth::tools
