// The model options `zeroth estimate` and `zeroth plan` share: counts such as 7.5B, a GPT's
// dimensions (--layers, --hidden, --heads, --seq, --vocab), a preset's name and shape.
#include <string>  // std::string

#include <CLI/CLI.hpp>   // CLI::App
#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"  // ZEROTH_THROW
#include "tools/commands.h"

namespace zeroth::tools {

double parse_count(const std::string& text, const char* flag) {
  size_t used = 0;
  double v = 0;
  try {
    v = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  const std::string unit = used > 0 ? text.substr(used) : "";
  const double scale = unit.empty()                 ? 1
                       : unit == "K" || unit == "k" ? 1e3
                       : unit == "M"                ? 1e6
                       : unit == "B" || unit == "G" ? 1e9
                       : unit == "T"                ? 1e12
                                                    : 0;
  if (used == 0 || scale == 0 || !(v > 0))
    ZEROTH_THROW(InvalidArgument, "{} {}: give a count such as 7.5B, 350M, 1T or 175e9", flag, text);
  if (v * scale >= 1e19) ZEROTH_THROW(InvalidArgument, "{} {}: too large (below 1e19)", flag, text);
  return v * scale;
}

void add_gpt_shape_options(CLI::App* cmd, GptShape& shape, const std::string& role) {
  cmd->add_option("--layers", shape.layers, role + ": transformer layers (with --hidden and --heads)")->check(CLI::Range(1, 1 << 16));
  cmd->add_option("--hidden", shape.hidden, "Hidden size")->check(CLI::Range(1, 1 << 20));
  cmd->add_option("--heads", shape.heads, "Attention heads")->check(CLI::Range(1, 1 << 14));
  cmd->add_option("--seq", shape.seq_len, fmt::format("Sequence length (default {})", shape.seq_len))->check(CLI::Range(1, 1 << 22));
  cmd->add_option("--vocab", shape.vocab, fmt::format("Vocabulary (default {})", shape.vocab))->check(CLI::Range(1, 1 << 24));
}

bool gpt_shape_given(const GptShape& shape) { return shape.layers > 0 || shape.hidden > 0 || shape.heads > 0; }

const GptShape& checked_gpt_shape(const GptShape& shape) {
  if (const std::string bad = shape.problem(); !bad.empty()) ZEROTH_THROW(InvalidArgument, "--layers/--hidden/--heads: {}", bad);
  return shape;
}

GptConfig checked_preset(const std::string& name) {
  try {
    return GptConfig::preset(name);
  } catch (const ConfigError&) {
    ZEROTH_THROW(InvalidArgument, "--model {} is not a known preset; use one of {}", name, fmt::join(GptConfig::preset_names(), ", "));
  }
}

GptShape preset_shape(const std::string& name, uint64_t seq_len, uint64_t vocab_option) {
  if (vocab_option != GptShape{0, 0, 0, 2048, 51200}.vocab)
    ZEROTH_THROW(InvalidArgument, "--vocab goes with --layers, --hidden and --heads: --model {} has its own vocabulary", name);
  const GptConfig g = checked_preset(name);
  const auto u = [](int v) { return static_cast<uint64_t>(v); };
  if (!g.llama()) return GptShape{u(g.n_layer), u(g.n_embd), u(g.n_head), seq_len, u(g.vocab_size)};
  GptShape s = GptShape::llama_shape(u(g.n_layer), u(g.n_embd), u(g.n_head), u(g.kv_heads()), u(g.ffn()), seq_len, u(g.vocab_size),
                                     g.tie_word_embeddings);
  s.qkv_bias = g.qkv_bias;
  return s;
}

}  // namespace zeroth::tools
