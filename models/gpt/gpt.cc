// The GPT's configuration and blocks: presets and checks, the parameters of each block (with
// their tensor-parallel cuts), how a pipeline stage's part is laid out and checked, layer
// partitions, and the block schedules the engine plans with. The passes are in gpt_step.cc, the
// activation memory in activations.cc.
#include "models/gpt/gpt.h"

#include <cmath>  // std::sqrt

#include "core/error.h"         // ZEROTH_THROW
#include "models/gpt/layers.h"  // gpt::complete_part, gpt::part_blocks

namespace zeroth {

// ---- configuration --------------------------------------------------------------------------

GptConfig GptConfig::preset(std::string_view name) {
  GptConfig c;
  if (name == "gpt2-124m" || name == "gpt2") return c;
  if (name == "gpt2-350m") c.n_layer = 24, c.n_head = 16, c.n_embd = 1024;
  else if (name == "gpt2-774m") c.n_layer = 36, c.n_head = 20, c.n_embd = 1280;
  else if (name == "gpt2-1558m") c.n_layer = 48, c.n_head = 25, c.n_embd = 1600;
  else
    ZEROTH_THROW(ConfigError, "model.preset \"{}\" is not a known preset; use one of gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m",
                 name);
  return c;
}

std::vector<std::string> GptConfig::preset_names() { return {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m"}; }

size_t GptConfig::num_parameters() const {
  size_t n = 0;
  for (const auto& b : Gpt::block_specs(*this)) {
    for (const auto& p : b.params) n += p.numel();
  }
  return n;
}

void GptConfig::validate() const {
  auto positive = [](const char* key, int v) {
    if (v <= 0) ZEROTH_THROW(ConfigError, "model.{} must be a positive integer, got {}", key, v);
  };
  positive("vocab_size", vocab_size);
  positive("seq_len", seq_len);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  if (n_embd % n_head != 0) {
    ZEROTH_THROW(ConfigError, "model.n_embd ({}) must be a multiple of model.n_head ({}): each head gets n_embd / n_head channels",
                 n_embd, n_head);
  }
  if (cpu_checkpointing && !activation_checkpointing) {
    ZEROTH_THROW(
        ConfigError,
        "activation_checkpointing.cpu_checkpointing moves the activation checkpoints to host memory, but checkpointing is off "
        "(model.activation_checkpointing false): turn it on, or drop cpu_checkpointing");
  }
}

// ---- blocks ---------------------------------------------------------------------------------

namespace gpt {

GptPart complete_part(const GptPart& part, const GptConfig& c) {
  if (!part.chunks.empty()) return part;
  GptPart whole = part;
  whole.chunks = {{0, c.n_layer}};
  return whole;
}

PartBlocks part_blocks(const GptConfig& c, const GptPart& part) {
  PartBlocks out;
  out.layers.assign(c.n_layer, -1);
  int next = 0;
  if (part.has_embedding()) out.embed = next++;
  for (const auto& [lo, hi] : part.chunks) {
    for (int l = lo; l < hi; ++l) out.layers[l] = next++;
  }
  if (part.has_head(c)) {
    out.ln_f = next++;
    if (out.embed < 0) out.embed = next++;
  }
  return out;
}

}  // namespace gpt


namespace {

BlockSpec layer_spec(const GptConfig& c, int l) {
  const int64_t C = c.n_embd;
  const double proj_std = 0.02 / std::sqrt(2.0 * c.n_layer);  // GPT-2: residual projections scaled by depth
  return {"h." + std::to_string(l),
          {{"ln_1.weight", {C}, InitRule::constant(1), ParamRole::norm},
           {"ln_1.bias", {C}, InitRule::zeros(), ParamRole::norm},
           {"attn.c_attn.weight", {3 * C, C}, InitRule::normal(0.02), ParamRole::weight},
           {"attn.c_attn.bias", {3 * C}, InitRule::zeros(), ParamRole::bias},
           {"attn.c_proj.weight", {C, C}, InitRule::normal(proj_std), ParamRole::weight},
           {"attn.c_proj.bias", {C}, InitRule::zeros(), ParamRole::bias},
           {"ln_2.weight", {C}, InitRule::constant(1), ParamRole::norm},
           {"ln_2.bias", {C}, InitRule::zeros(), ParamRole::norm},
           {"mlp.c_fc.weight", {4 * C, C}, InitRule::normal(0.02), ParamRole::weight},
           {"mlp.c_fc.bias", {4 * C}, InitRule::zeros(), ParamRole::bias},
           {"mlp.c_proj.weight", {C, 4 * C}, InitRule::normal(proj_std), ParamRole::weight},
           {"mlp.c_proj.bias", {C}, InitRule::zeros(), ParamRole::bias}}};
}

BlockSpec embed_spec(const GptConfig& c) {
  const int64_t V = c.vocab_size, T = c.seq_len, C = c.n_embd;
  return {"embed",
          {{"wte", {V, C}, InitRule::normal(0.02), ParamRole::embedding},
           {"wpe", {T, C}, InitRule::normal(0.02), ParamRole::embedding}}};
}

BlockSpec ln_f_spec(const GptConfig& c) {
  const int64_t C = c.n_embd;
  return {"ln_f", {{"weight", {C}, InitRule::constant(1), ParamRole::norm}, {"bias", {C}, InitRule::zeros(), ParamRole::norm}}};
}

// Megatron-LM's split of a parameter ([out, in] matrices): QKV (in three segments: q, k, v, each
// cut by heads) and MLP-up by output rows (column-parallel), the attention output and MLP-down by
// input columns (row-parallel), the token embedding by vocabulary rows. The rest is replicated; a
// LayerNorm's gradient is a partial sum over the ranks when each holds only its rows of the
// sequence. The row-parallel biases' gradients come from the gathered rows: whole on every rank.
ParamSpec tensor_parallel_cut(const ParamSpec& p, const GptPart& part) {
  const int r = part.tp_rank, n = part.tp_ranks;
  const bool sp = part.sequence_parallel;
  const std::string& name = p.name;
  if (name == "attn.c_attn.weight" || name == "attn.c_attn.bias") return p.cut(0, 3, r, n);
  if (name == "mlp.c_fc.weight" || name == "mlp.c_fc.bias" || name == "wte") return p.cut(0, 1, r, n);
  if (name == "attn.c_proj.weight" || name == "mlp.c_proj.weight") return p.cut(1, 1, r, n);
  const bool norm = p.role == ParamRole::norm;
  return p.cut(-1, 1, r, n, norm && sp);
}

const GptPart& or_whole(const GptPart& part, const GptConfig& c, GptPart& storage) {
  if (!part.chunks.empty()) return part;
  storage = gpt::complete_part(part, c);
  return storage;
}

void check_part(const GptConfig& c, const GptPart& part) {
  std::vector<int> owner(c.n_layer, -1);
  for (size_t k = 0; k < part.chunks.size(); ++k) {
    const auto [lo, hi] = part.chunks[k];
    if (lo < 0 || hi > c.n_layer || lo >= hi)
      ZEROTH_THROW(InvalidArgument, "GPT part: chunk {} holds layers [{}, {}) of a {}-layer model", k, lo, hi, c.n_layer);
    for (int l = lo; l < hi; ++l) {
      if (owner[l] >= 0) ZEROTH_THROW(InvalidArgument, "GPT part: layer {} is in chunks {} and {}", l, owner[l], k);
      owner[l] = static_cast<int>(k);
    }
  }
  if (part.tp_ranks < 1 || part.tp_rank < 0 || part.tp_rank >= part.tp_ranks)
    ZEROTH_THROW(InvalidArgument, "GPT part: tensor-parallel rank {} of {}", part.tp_rank, part.tp_ranks);
  if (c.n_head % part.tp_ranks != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.tensor = {} splits the attention heads over its ranks, but model.n_head = {} is not a multiple of it; "
                 "use a tensor-parallel size that divides the heads",
                 part.tp_ranks, c.n_head);
  }
  if (c.vocab_size < part.tp_ranks) {
    ZEROTH_THROW(ConfigError, "parallel.tensor = {} splits the vocabulary, but model.vocab_size is only {}", part.tp_ranks,
                 c.vocab_size);
  }
  if (c.cpu_checkpointing && !part.whole(c)) {
    ZEROTH_THROW(ConfigError,
                 "activation_checkpointing.cpu_checkpointing keeps a whole model's block inputs in host memory and cannot run on a "
                 "pipeline stage; turn it off (model.activation_checkpointing still recomputes each layer, with its inputs on the "
                 "device) or train without parallel.pipeline");
  }
}

}  // namespace

bool GptPart::whole(const GptConfig& c) const {
  return chunks.empty() || (chunks.size() == 1 && chunks[0][0] == 0 && chunks[0][1] == c.n_layer);
}
bool GptPart::has_embedding() const {
  if (chunks.empty()) return true;
  for (const auto& ch : chunks) {
    if (ch[0] == 0) return true;
  }
  return false;
}
bool GptPart::has_head(const GptConfig& c) const {
  if (chunks.empty()) return true;
  for (const auto& ch : chunks) {
    if (ch[1] == c.n_layer) return true;
  }
  return false;
}
bool GptPart::first_chunk(int chunk) const { return chunks.empty() ? chunk == 0 : chunks.at(chunk)[0] == 0; }
bool GptPart::last_chunk(int chunk, const GptConfig& c) const {
  return chunks.empty() ? chunk == 0 : chunks.at(chunk)[1] == c.n_layer;
}

GptPart GptPart::of_rank(const std::vector<int>& layers, int stages, int rank) {
  ZEROTH_CHECK(stages >= 1 && rank >= 0 && rank < stages && !layers.empty() && layers.size() % stages == 0,
               "GptPart::of_rank: {} virtual stages over {} stages, rank {}", layers.size(), stages, rank);
  std::vector<int> start(layers.size() + 1, 0);
  for (size_t k = 0; k < layers.size(); ++k) start[k + 1] = start[k] + layers[k];
  GptPart part;
  for (size_t k = rank; k < layers.size(); k += stages) part.chunks.push_back({start[k], start[k + 1]});
  return part;
}

std::vector<int> partition_layers(const GptConfig& c, int parts, const std::string& method, const std::vector<int>& counts) {
  const int L = c.n_layer;
  if (parts < 1) ZEROTH_THROW(ConfigError, "pipeline: {} virtual stages; need at least one", parts);
  if (L < parts) {
    ZEROTH_THROW(
        ConfigError,
        "pipeline: {} virtual stages (stages x virtual_stages) but the model has {} layer{}; every virtual stage needs one: use "
        "fewer stages or virtual stages, or more layers (model.n_layer)",
        parts, L, L == 1 ? "" : "s");
  }
  std::vector<int> out(parts, L / parts);
  if (!counts.empty()) {
    int sum = 0;
    for (int n : counts) sum += n;
    bool positive = true;
    for (int n : counts) positive = positive && n >= 1;
    if (static_cast<int>(counts.size()) != parts || sum != L || !positive) {
      ZEROTH_THROW(
          ConfigError,
          "pipeline.partition_method: the list gives {} virtual stages holding {} layers; it needs {} counts of at least 1 that "
          "add up to model.n_layer = {}",
          counts.size(), sum, parts, L);
    }
    return counts;
  }
  if (method == "uniform") {
    for (int k = 0; k < L % parts; ++k) ++out[k];
    return out;
  }
  if (method != "parameters") {
    ZEROTH_THROW(ConfigError, "pipeline.partition_method \"{}\" is not one of \"parameters\", \"uniform\" or a list of layer counts",
                 method);
  }
  // Contiguous layers with the embedding's weight in front and ln_f's behind: the smallest
  // largest stage, by binary search on the bound, each stage filled greedily (at least one layer).
  const auto count = [](const BlockSpec& b) {
    size_t n = 0;
    for (const auto& p : b.params) n += p.numel();
    return n;
  };
  // The last stage also holds the LM head's copy of the tied embedding (with its own optimizer
  // state), as DeepSpeed counts a tied layer on each stage that has it.
  const size_t layer = count(layer_spec(c, 0)), first = count(embed_spec(c));
  const size_t last = count(ln_f_spec(c)) + (parts > 1 ? first : 0);
  auto fill = [&](size_t bound, std::vector<int>* take) {
    int l = 0;
    for (int k = 0; k < parts; ++k) {
      size_t load = (k == 0 ? first : 0);
      int n = 0;
      const int left_for_rest = parts - k - 1;
      while (l + n < L - left_for_rest && (n == 0 || load + layer + (l + n + 1 == L ? last : 0) <= bound)) {
        load += layer;
        ++n;
      }
      if (take != nullptr) (*take)[k] = n;
      l += n;
    }
    return l == L;
  };
  size_t lo = layer, hi = first + last + static_cast<size_t>(L) * layer;
  while (lo < hi) {
    const size_t mid = lo + (hi - lo) / 2;
    if (fill(mid, nullptr)) hi = mid;
    else lo = mid + 1;
  }
  fill(lo, &out);
  return out;
}

std::vector<BlockSpec> Gpt::block_specs(const GptConfig& c) { return block_specs(c, {}); }

std::vector<BlockSpec> Gpt::block_specs(const GptConfig& c, const GptPart& given) {
  c.validate();
  GptPart storage;
  const GptPart& part = or_whole(given, c, storage);
  check_part(c, part);
  std::vector<BlockSpec> out;
  if (part.has_embedding()) out.push_back(embed_spec(c));
  for (const auto& [lo, hi] : part.chunks) {
    for (int l = lo; l < hi; ++l) out.push_back(layer_spec(c, l));
  }
  if (part.has_head(c)) {
    out.push_back(ln_f_spec(c));
    if (!part.has_embedding()) out.push_back(embed_spec(c));  // the LM head's copy of the tied embedding
  }
  if (part.tp_ranks > 1) {
    for (auto& block : out) {
      for (auto& param : block.params) param = tensor_parallel_cut(param, part);
    }
  }
  return out;
}

int Gpt::embedding_block(const GptConfig& c, const GptPart& part) { return gpt::part_blocks(c, gpt::complete_part(part, c)).embed; }

std::vector<Gpt::HfParam> Gpt::hf_params(const GptConfig& c) {
  std::vector<HfParam> out;
  const auto specs = block_specs(c);
  for (size_t b = 0; b < specs.size(); ++b) {
    // "embed" {wte, wpe}, "h.<l>" with Hugging Face's own suffixes, "ln_f" {weight, bias}.
    const std::string prefix = specs[b].name == "embed" ? "transformer." : "transformer." + specs[b].name + ".";
    for (size_t i = 0; i < specs[b].params.size(); ++i) {
      const std::string& p = specs[b].params[i].name;
      const bool conv1d = p == "attn.c_attn.weight" || p == "attn.c_proj.weight" || p == "mlp.c_fc.weight" || p == "mlp.c_proj.weight";
      out.push_back({static_cast<int>(b), i, prefix + (specs[b].name == "embed" ? p + ".weight" : p), conv1d});
    }
  }
  return out;
}

BlockSchedule Gpt::schedule(const GptConfig& c) { return schedules(c, {}).front(); }

std::vector<BlockSchedule> Gpt::schedules(const GptConfig& c, const GptPart& given) {
  GptPart storage;
  const GptPart& part = or_whole(given, c, storage);
  check_part(c, part);
  const gpt::PartBlocks ids = gpt::part_blocks(c, part);
  std::vector<BlockSchedule> out;
  for (size_t k = 0; k < part.chunks.size(); ++k) {
    const auto [lo, hi] = part.chunks[k];
    const bool first = lo == 0, last = hi == c.n_layer;
    BlockSchedule s;
    if (first) s.forward.push_back(ids.embed);
    for (int l = lo; l < hi; ++l) s.forward.push_back(ids.layers[l]);
    if (last) {
      s.forward.push_back(ids.ln_f);
      s.forward.push_back(ids.embed);  // the LM head
      s.backward.push_back(ids.embed);
      s.backward.push_back(ids.ln_f);
    }
    for (int l = hi - 1; l >= lo; --l) s.backward.push_back(ids.layers[l]);
    if (first) s.backward.push_back(ids.embed);
    out.push_back(std::move(s));
  }
  return out;
}

}  // namespace zeroth
