// The GPT's blocks and its micro-step: which kernels run in which block use, and where the
// activations live. Kernels are in cpu/gpt_kernels.cc; all work is enqueued on the host's
// compute stream, one closure per block use, so the engine's gathers and reductions overlap it.
#include "models/gpt/gpt.h"

#include <algorithm>  // std::max, std::max_element
#include <cmath>      // std::sqrt
#include <cstring>    // std::memset

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/device.h"         // Buffer
#include "core/error.h"          // ZEROTH_THROW
#include "core/log.h"            // ZLOG_WARN
#include "models/gpt/kernels.h"  // gpt::Kernels

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

GptPart whole_part(const GptConfig& c) { return {{{0, c.n_layer}}}; }
const GptPart& or_whole(const GptPart& part, const GptConfig& c, GptPart& storage) {
  if (!part.chunks.empty()) return part;
  storage = whole_part(c);
  return storage;
}

// The part's block ids: the embedding (or the head's copy), each layer's (-1 elsewhere), ln_f.
struct PartBlocks {
  int embed = -1, ln_f = -1;
  std::vector<int> layers;
};

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
  return out;
}

int Gpt::embedding_block(const GptConfig& c, const GptPart& part) {
  return part_blocks(c, part.chunks.empty() ? whole_part(c) : part).embed;
}

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
  const PartBlocks ids = part_blocks(c, part);
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

// ---- activations ----------------------------------------------------------------------------

namespace {

// What one transformer block keeps from forward for backward.
struct LayerActs {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
};

// Backward scratch: the residual stream's gradient and the per-kernel gradients of activations.
struct GradScratch {
  float *dresid = nullptr, *dC = nullptr, *dqkv = nullptr, *dfch = nullptr, *datt = nullptr;
};

}  // namespace

// One micro-batch in flight: what its backward needs from its forward.
struct Slot {
  int B = 0, T = 0;
  int32_t *tokens = nullptr, *targets = nullptr;
  // [L + 1] residual stream: resid[l] is block l's input (null where another rank holds the layer).
  // With cpu_checkpointing these alternate between two device buffers, and saved[l] (host memory)
  // keeps the first L - 1 for backward.
  std::vector<float*> resid, saved;
  std::vector<LayerActs> layer;  // [L], or [1] shared when checkpointing
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr, *logits = nullptr, *row_loss = nullptr;
  // Per chunk, on a pipeline rank: the gradient at the chunk's output (received) and at its input
  // (sent), null at the model's ends.
  std::vector<float*> dout, din;
};

struct Gpt::State {
  GptConfig cfg;
  GptPart part;
  Device* device = nullptr;
  std::unique_ptr<gpt::Kernels> k;
  int B = 0, T = 0;
  BlockHost* host = nullptr;
  Buffer buffer;                 // every activation slot and the backward scratch, one allocation (tag: activations)
  Buffer host_buffer;            // with cpu_checkpointing: every slot's checkpoints, in host memory
  Buffer token_buffer;           // tokens and targets of every slot, on the device
  std::vector<Slot> slots;       // chunk c of micro-batch m uses slot m mod chunk_slots[c]
  std::vector<int> chunk_slots;  // per chunk: the slots holding its activations (the first ones)
  int in_flight = 0;             // chunk forwards whose backward has not been enqueued
  GradScratch d;                 // backward passes run one at a time: shared
  Buffer wbuf, gbuf;             // f32 copies of a narrow block's parameters and gradients

  static size_t layer_floats(const GptConfig& c, size_t BT, size_t B, size_t T) {
    const size_t C = c.n_embd;
    return 15 * BT * C + 4 * BT + B * c.n_head * T * T;
  }
  // The residual stream positions the part reads or writes: each chunk's [lo, hi].
  static std::vector<bool> resid_positions(const GptConfig& c, const GptPart& part) {
    std::vector<bool> used(c.n_layer + 1, false);
    for (const auto& [lo, hi] : part.chunks) {
      for (int l = lo; l <= hi; ++l) used[l] = true;
    }
    return used;
  }
  static size_t owned_layers(const GptPart& part) {
    size_t n = 0;
    for (const auto& [lo, hi] : part.chunks) n += static_cast<size_t>(hi - lo);
    return n;
  }
  // The residual stream's copies on the device, and the checkpoints in host memory, per slot.
  static size_t resid_copies(const GptConfig& c, const GptPart& part) {
    if (c.cpu_checkpointing) return 2;
    size_t n = 0;
    for (bool u : resid_positions(c, part)) n += u ? 1 : 0;
    return n;
  }
  // Gradient ports per slot: a chunk's output gradient unless it ends the model, its input's
  // unless it starts it.
  static size_t port_count(const GptConfig& c, const GptPart& part) {
    size_t n = 0;
    for (size_t k = 0; k < part.chunks.size(); ++k) {
      n += part.last_chunk(static_cast<int>(k), c) ? 0 : 1;
      n += part.first_chunk(static_cast<int>(k)) ? 0 : 1;
    }
    return n;
  }
  // The inputs of blocks 0 .. L-2: backward finds the last two (ln_f's and block L-1's) still in
  // the working copies.
  static size_t saved_count(const GptConfig& c) {
    return c.cpu_checkpointing && c.n_layer > 1 ? static_cast<size_t>(c.n_layer) - 1 : 0;
  }
  static size_t saved_floats(const GptConfig& c, int B, int T) { return saved_count(c) * B * T * c.n_embd; }
  static size_t slot_floats(const GptConfig& c, const GptPart& part, int B, int T) {
    const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd;
    const size_t layers = c.activation_checkpointing ? 1 : owned_layers(part);
    const size_t head = part.has_head(c) ? BT * C + 3 * BT + BT * c.vocab_size : 0;
    return (resid_copies(c, part) + port_count(c, part)) * BT * C + layers * layer_floats(c, BT, B, T) + head;
  }
  // The chunks slot i holds: those with more than i slots.
  static GptPart slot_part(const GptPart& part, const std::vector<int>& chunk_slots, int i) {
    GptPart sub;
    for (size_t k = 0; k < part.chunks.size(); ++k) {
      if (i < chunk_slots.at(k)) sub.chunks.push_back(part.chunks[k]);
    }
    return sub;
  }
  static size_t all_slots_floats(const GptConfig& c, const GptPart& part, const std::vector<int>& chunk_slots, int B, int T) {
    size_t n = 0;
    const int most = *std::max_element(chunk_slots.begin(), chunk_slots.end());
    for (int i = 0; i < most; ++i) n += slot_floats(c, slot_part(part, chunk_slots, i), B, T);
    return n;
  }
  static size_t scratch_floats(const GptConfig& c, int B, int T) {
    const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd;
    return BT * C * (1 + 1 + 3 + 4) + static_cast<size_t>(B) * c.n_head * T * T;
  }
  // The layer whose activation set evaluation uses (nothing is kept for a backward).
  int eval_layer() const { return cfg.activation_checkpointing ? 0 : part.chunks.front()[0]; }

  // On the caller's thread: a new shape waits for the stream to finish with the old buffers.
  void check_shape(int b, int t) const {
    if (in_flight > 0 && (b != B || t != T)) {
      ZEROTH_THROW(
          InvalidArgument,
          "GPT micro-batch of {} x {} while {} micro-batch(es) of {} x {} are in flight: the micro-batches of a cycle share one shape",
          b, t, in_flight, B, T);
    }
  }

  void reserve(Stream& stream, int b, int t, const std::vector<int>& per_chunk, DType compute) {
    if (b == B && t == T && per_chunk == chunk_slots) return;
    const int n_slots = *std::max_element(per_chunk.begin(), per_chunk.end());
    check_shape(b, t);
    stream.synchronize();
    const size_t BT = static_cast<size_t>(b) * t, C = cfg.n_embd, L = cfg.n_layer;
    buffer.reset();
    token_buffer.reset();
    host_buffer.reset();
    buffer = device->allocate((all_slots_floats(cfg, part, per_chunk, b, t) + scratch_floats(cfg, b, t)) * sizeof(float),
                              MemTag::activations);
    if (const size_t saved = n_slots * saved_floats(cfg, b, t); saved > 0) {
      host_buffer = host->allocate_host(saved * sizeof(float), MemTag::activations);
      std::memset(host_buffer.data(), 0, host_buffer.bytes());  // first touch here, not in a step
    }
    token_buffer = device->allocate(n_slots * 2 * BT * sizeof(int32_t), MemTag::activations);
    if (const size_t scratch = Gpt::scratch_bytes(cfg, compute); scratch > 0 && !wbuf) {
      wbuf = device->allocate(scratch / 2, MemTag::buffers);
      gbuf = device->allocate(scratch / 2, MemTag::buffers);
    }
    // Touched once here: first touch of fresh memory is slow, and a step must not pay it.
    device->fill(stream, buffer.view(DType::f32), 0.0f);
    stream.synchronize();
    float* at = buffer.as<float>();
    auto take = [&](size_t n) {
      float* p = at;
      at += n;
      return p;
    };
    slots.assign(n_slots, {});
    for (int i = 0; i < n_slots; ++i) {
      // Slot i holds the chunks with more than i slots.
      const GptPart held = slot_part(part, per_chunk, i);
      const std::vector<bool> positions = resid_positions(cfg, held);
      std::vector<bool> owned(L, false);
      for (const auto& [lo, hi] : held.chunks) {
        for (int l = lo; l < hi; ++l) owned[l] = true;
      }
      const bool head = held.has_head(cfg);
      auto& sl = slots[i];
      sl.B = b, sl.T = t;
      sl.tokens = token_buffer.as<int32_t>() + 2 * BT * i;
      sl.targets = sl.tokens + BT;
      sl.resid.assign(L + 1, nullptr);
      sl.saved.assign(saved_count(cfg), nullptr);
      float* copies[2] = {nullptr, nullptr};
      for (size_t l = 0; l <= L; ++l) {
        if (!cfg.cpu_checkpointing) {
          if (positions[l]) sl.resid[l] = take(BT * C);
          continue;
        }
        if (l < 2) copies[l] = take(BT * C);
        sl.resid[l] = copies[l % 2];
        if (l < sl.saved.size()) sl.saved[l] = host_buffer.as<float>() + (i * sl.saved.size() + l) * BT * C;
      }
      sl.layer.assign(cfg.activation_checkpointing ? 1 : L, {});
      for (size_t l = 0; l < sl.layer.size(); ++l) {
        if (sl.layer.size() > 1 && !owned[l]) continue;  // another rank's layer
        auto& a = sl.layer[l];
        a.ln1 = take(BT * C), a.ln1_mean = take(BT), a.ln1_rstd = take(BT), a.qkv = take(3 * BT * C);
        a.att = take(static_cast<size_t>(b) * cfg.n_head * t * t), a.atty = take(BT * C), a.res2 = take(BT * C);
        a.ln2 = take(BT * C), a.ln2_mean = take(BT), a.ln2_rstd = take(BT), a.fch = take(4 * BT * C), a.fch_gelu = take(4 * BT * C);
      }
      if (head) {
        sl.lnf = take(BT * C), sl.lnf_mean = take(BT), sl.lnf_rstd = take(BT), sl.logits = take(BT * cfg.vocab_size),
        sl.row_loss = take(BT);
      }
      sl.dout.assign(part.chunks.size(), nullptr);
      sl.din.assign(part.chunks.size(), nullptr);
      for (size_t k = 0; k < part.chunks.size(); ++k) {
        if (i >= per_chunk[k]) continue;
        if (!part.last_chunk(static_cast<int>(k), cfg)) sl.dout[k] = take(BT * C);
        if (!part.first_chunk(static_cast<int>(k))) sl.din[k] = take(BT * C);
      }
    }
    chunk_slots = per_chunk;
    d.dresid = take(BT * C), d.dC = take(BT * C), d.dqkv = take(3 * BT * C), d.dfch = take(4 * BT * C);
    d.datt = take(static_cast<size_t>(b) * cfg.n_head * t * t);
    B = b, T = t;
  }
};

namespace {

// A block's parameters as f32 pointers, and where its backward adds gradients in f32. For an f32
// block these are the engine's own views; for bf16/f16 the parameters are widened into scratch and
// the gradients gathered in f32 scratch, then added into the narrow views once (flush).
class Bound {
 public:
  Bound(gpt::Kernels& k, const std::vector<TensorView>& params, const std::vector<TensorView>* grads, const Buffer& wbuf,
        const Buffer& gbuf)
      : k_(k), grads_(grads) {
    size_t total = 0;
    for (const auto& p : params) total += p.numel;
    narrow_ = !params.empty() && params[0].dtype != DType::f32;
    if (narrow_ && grads != nullptr) k_.zero(gbuf.as<float>(), total);
    size_t off = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (narrow_) {
        k_.widen(params[i], wbuf.as<float>() + off);
        p_.push_back(wbuf.as<float>() + off);
        if (grads != nullptr) g_.push_back(gbuf.as<float>() + off);
      } else {
        p_.push_back(params[i].as<float>());
        if (grads != nullptr) g_.push_back((*grads)[i].as<float>());
      }
      off += params[i].numel;
    }
  }
  const float* p(size_t i) const { return p_[i]; }
  float* g(size_t i) const { return g_[i]; }
  void flush() const {
    if (!narrow_ || grads_ == nullptr) return;
    for (size_t i = 0; i < grads_->size(); ++i) k_.add_into((*grads_)[i], g_[i]);
  }

 private:
  gpt::Kernels& k_;
  const std::vector<TensorView>* grads_;
  bool narrow_ = false;
  std::vector<const float*> p_;
  std::vector<float*> g_;
};

// Parameter indices inside a transformer block, in block_specs order.
enum LayerParam { kLn1W, kLn1B, kAttnW, kAttnB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB };

void layer_forward(gpt::Kernels& k, const GptConfig& c, const Bound& w, const LayerActs& a, const float* x, float* out, int B, int T) {
  const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd;
  const int Ci = c.n_embd;
  k.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.p(kLn1W), w.p(kLn1B), BT, Ci);
  k.matmul_forward(a.qkv, a.ln1, w.p(kAttnW), w.p(kAttnB), BT, Ci, 3 * Ci);
  k.attention_forward(a.atty, a.att, a.qkv, B, T, Ci, c.n_head);
  k.matmul_forward(a.res2, a.atty, w.p(kProjW), w.p(kProjB), BT, Ci, Ci);
  k.accumulate(a.res2, x, BT * C);
  k.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.p(kLn2W), w.p(kLn2B), BT, Ci);
  k.matmul_forward(a.fch, a.ln2, w.p(kFcW), w.p(kFcB), BT, Ci, 4 * Ci);
  k.gelu_forward(a.fch_gelu, a.fch, 4 * BT * C);
  if (out != nullptr) {
    k.matmul_forward(out, a.fch_gelu, w.p(kFcProjW), w.p(kFcProjB), BT, 4 * Ci, Ci);
    k.accumulate(out, a.res2, BT * C);
  }
}

// dresid holds the gradient at the block's output on entry and at its input on return.
void layer_backward(gpt::Kernels& k, const GptConfig& c, const Bound& w, const LayerActs& a, const GradScratch& s, const float* x,
                    int B, int T) {
  const size_t BT = static_cast<size_t>(B) * T;
  const int C = c.n_embd;
  float* dresid = s.dresid;
  k.matmul_backward(s.dfch, w.g(kFcProjW), w.g(kFcProjB), dresid, a.fch_gelu, w.p(kFcProjW), BT, 4 * C, C);
  k.gelu_backward(s.dfch, a.fch, s.dfch, 4 * BT * C);
  k.matmul_backward(s.dC, w.g(kFcW), w.g(kFcB), s.dfch, a.ln2, w.p(kFcW), BT, C, 4 * C);
  k.layernorm_backward(dresid, w.g(kLn2W), w.g(kLn2B), s.dC, a.res2, w.p(kLn2W), a.ln2_mean, a.ln2_rstd, BT, C);
  k.matmul_backward(s.dC, w.g(kProjW), w.g(kProjB), dresid, a.atty, w.p(kProjW), BT, C, C);
  k.attention_backward(s.dqkv, s.datt, s.dC, a.qkv, a.att, B, T, C, c.n_head);
  k.matmul_backward(s.dC, w.g(kAttnW), w.g(kAttnB), s.dqkv, a.ln1, w.p(kAttnW), BT, C, 3 * C);
  k.layernorm_backward(dresid, w.g(kLn1W), w.g(kLn1B), s.dC, x, w.p(kLn1W), a.ln1_mean, a.ln1_rstd, BT, C);
}

void check_tokens(const int32_t* t, size_t n, int V, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    if (t[i] < 0 || t[i] >= V) {
      ZEROTH_THROW(InvalidArgument,
                   "{} id {} at position {} is outside the model's vocabulary [0, {}): the data and model.vocab_size disagree", what,
                   t[i], i, V);
    }
  }
}

}  // namespace

// ---- the micro-step -------------------------------------------------------------------------

size_t Gpt::scratch_bytes(const GptConfig& config, DType compute) {
  if (compute == DType::f32) return 0;
  size_t widest = 0;
  for (const auto& spec : block_specs(config)) {
    size_t n = 0;
    for (const auto& p : spec.params) n += p.numel();
    widest = std::max(widest, n);
  }
  return 2 * widest * sizeof(float);
}

Gpt::Gpt(BlockHost& host, GptConfig config, GptPart part)
    : host_(host),
      config_(config),
      part_(part.chunks.empty() ? whole_part(config) : std::move(part)),
      state_(std::make_shared<State>()) {
  auto specs = block_specs(config_, part_);
  for (auto& spec : specs) host_.add_block(std::move(spec));
  const PartBlocks ids = part_blocks(config_, part_);
  embed_ = ids.embed, ln_f_ = ids.ln_f, layers_ = ids.layers;
  host_.set_chunk_schedules(schedules(config_, part_));
  state_->cfg = config_;
  state_->part = part_;
  state_->host = &host_;
  state_->device = &host_.device();
  state_->k = gpt::make_kernels(host_.compute_stream());
}

Gpt::~Gpt() {
  // Work still queued on the stream uses the state's buffers. A destructor must not throw: an
  // error the stream kept (the run is usually unwinding from it already) is logged instead.
  try {
    host_.compute_stream().synchronize();
  } catch (const std::exception& e) {
    ZLOG_WARN("GPT teardown: the compute stream had failed: {}", e.what());
  }
}

size_t Gpt::activation_bytes(const GptConfig& config, int B, int T, int slots, const GptPart& given) {
  GptPart storage;
  const GptPart& part = or_whole(given, config, storage);
  return activation_bytes(config, B, T, std::vector<int>(part.chunks.size(), slots), part);
}

size_t Gpt::activation_bytes(const GptConfig& config, int B, int T, const std::vector<int>& chunk_slots, const GptPart& given) {
  GptPart storage;
  const GptPart& part = or_whole(given, config, storage);
  const size_t BT = static_cast<size_t>(B) * T;
  const int slots = *std::max_element(chunk_slots.begin(), chunk_slots.end());
  return (State::all_slots_floats(config, part, chunk_slots, B, T) + State::scratch_floats(config, B, T)) * sizeof(float) +
         slots * 2 * BT * sizeof(int32_t);
}

size_t Gpt::host_activation_bytes(const GptConfig& config, int B, int T, int slots) {
  return slots * State::saved_floats(config, B, T) * sizeof(float);
}

ModelFootprint Gpt::footprint(const GptConfig& config, int B, int T, DType compute, int slots, const GptPart& part) {
  return {activation_bytes(config, B, T, slots, part), scratch_bytes(config, compute), host_activation_bytes(config, B, T, slots),
          fmt::format("{} slot{} of a {} x {} micro-batch", slots, slots == 1 ? "" : "s", B, T)};
}

ModelFootprint Gpt::footprint(const GptConfig& config, int B, int T, DType compute, const std::vector<int>& chunk_slots,
                              const GptPart& part) {
  if (chunk_slots.size() <= 1) return footprint(config, B, T, compute, chunk_slots.empty() ? 1 : chunk_slots[0], part);
  return {activation_bytes(config, B, T, chunk_slots, part), scratch_bytes(config, compute), 0,
          fmt::format("{} slots of {} chunks of a {} x {} micro-batch", fmt::join(chunk_slots, "+"), chunk_slots.size(), B, T)};
}

void Gpt::forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, int micro) {
  forward(micro, tokens, targets, B, T, loss);
  backward(micro);
}

void Gpt::evaluate(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits) {
  if (!part_.whole(config_)) ZEROTH_THROW(InvalidArgument, "Gpt::evaluate on a pipeline stage; run its chunks (evaluate_chunk)");
  host_.begin_evaluation();
  try {
    run_forward(0, 0, tokens, targets, B, T, loss, logits, false);
  } catch (...) {
    host_.end_evaluation();
    throw;
  }
  host_.end_evaluation();
}

void Gpt::evaluate_chunk(int chunk, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss) {
  run_forward(0, chunk, tokens, targets, B, T, loss, nullptr, false);
}

void Gpt::forward(int micro, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss) {
  if (!part_.whole(config_)) ZEROTH_THROW(InvalidArgument, "Gpt::forward on a pipeline stage; run its chunks (forward_chunk)");
  run_forward(micro, 0, tokens, targets, B, T, loss, nullptr, true);
}

void Gpt::backward(int micro) {
  if (!part_.whole(config_)) ZEROTH_THROW(InvalidArgument, "Gpt::backward on a pipeline stage; run its chunks (backward_chunk)");
  run_backward(micro, 0);
}

void Gpt::forward_chunk(int micro, int chunk, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss) {
  run_forward(micro, chunk, tokens, targets, B, T, loss, nullptr, true);
}

void Gpt::backward_chunk(int micro, int chunk) { run_backward(micro, chunk); }

std::vector<int> Gpt::chunk_slots() const {
  std::vector<int> out;
  for (size_t k = 0; k < part_.chunks.size(); ++k) out.push_back(host_.chunk_micro_batches_in_flight(static_cast<int>(k)));
  return out;
}

void Gpt::prepare(int B, int T) {
  if (B <= 0 || T <= 0 || T > config_.seq_len) {
    ZEROTH_THROW(InvalidArgument, "GPT micro-batch {} x {}: need B >= 1 and 1 <= T <= model.seq_len ({})", B, T, config_.seq_len);
  }
  state_->check_shape(B, T);
  state_->reserve(host_.compute_stream(), B, T, chunk_slots(), host_.compute_dtype());
}

TensorView Gpt::port(Port which, int micro, int chunk) const {
  const auto& s = *state_;
  if (s.slots.empty()) ZEROTH_THROW(InvalidArgument, "Gpt::port before prepare()");
  const Slot& sl = s.slots[micro < 0 ? 0 : micro % s.chunk_slots.at(chunk)];
  const auto [lo, hi] = part_.chunks.at(chunk);
  float* at = which == Port::input        ? sl.resid[lo]
              : which == Port::output     ? sl.resid[hi]
              : which == Port::input_grad ? sl.din[chunk]
                                          : sl.dout[chunk];
  ZEROTH_CHECK(at != nullptr, "chunk {} (layers {} to {}) has no such port: it is at an end of the model", chunk, lo, hi);
  return {at, static_cast<size_t>(sl.B) * sl.T * config_.n_embd, DType::f32};
}

void Gpt::run_forward(int micro, int chunk, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits,
                      bool training) {
  if (B <= 0 || T <= 0 || T > config_.seq_len) {
    ZEROTH_THROW(InvalidArgument, "GPT micro-batch {} x {}: need B >= 1 and 1 <= T <= model.seq_len ({})", B, T, config_.seq_len);
  }
  if (micro < 0) ZEROTH_THROW(InvalidArgument, "GPT forward of micro-batch {}: micro-batch ids start at 0", micro);
  if (chunk < 0 || chunk >= static_cast<int>(part_.chunks.size()))
    ZEROTH_THROW(InvalidArgument, "GPT forward of chunk {}: this part has {}", chunk, part_.chunks.size());
  const auto [lo, hi] = part_.chunks[chunk];
  const bool embeds = lo == 0, heads = hi == config_.n_layer;
  // The caller's host arrays are checked here and copied in stream order to the device, once
  // the host has accepted the use (so a refused call leaves every slot as it was).
  if (embeds) check_tokens(tokens, static_cast<size_t>(B) * T, config_.vocab_size, "token");
  if (heads) check_tokens(targets, static_cast<size_t>(B) * T, config_.vocab_size, "target");
  auto s = state_;
  Stream& stream = host_.compute_stream();
  s->check_shape(B, T);
  const int first_block = embeds ? embed_ : layers_[lo];
  const auto& first_views = host_.begin_forward(first_block, micro);
  s->reserve(stream, B, T, chunk_slots(), host_.compute_dtype());
  Slot* sl = &s->slots[training ? micro % s->chunk_slots[chunk] : 0];
  if (embeds) host_.device().copy(stream, sl->tokens, tokens, static_cast<size_t>(B) * T * sizeof(int32_t));
  if (heads) host_.device().copy(stream, sl->targets, targets, static_cast<size_t>(B) * T * sizeof(int32_t));
  gpt::Kernels& k = *s->k;
  const GptConfig c = config_;
  const size_t BT = static_cast<size_t>(B) * T;
  const int L = c.n_layer, C = c.n_embd, V = c.vocab_size;
  // Without backward nothing is kept per layer: evaluation runs in one set.
  const int eval_layer = s->eval_layer();
  auto acts = [sl, training, eval_layer](int l) -> const LayerActs& {
    return sl->layer[sl->layer.size() == 1 ? 0 : !training ? eval_layer : l];
  };
  // cpu_checkpointing: each block's input goes to host memory once it is computed (evaluation
  // has no backward to keep it for).
  const size_t bytes = BT * C * sizeof(float);
  auto keep = [&](int l) {
    if (training && static_cast<size_t>(l) < sl->saved.size()) host_.device().copy(stream, sl->saved[l], sl->resid[l], bytes);
  };
  if (embeds) {
    k.submit([s, sl, &k, B, T, C, params = first_views.params] {
      Bound w(k, params, nullptr, s->wbuf, s->gbuf);
      k.encoder_forward(sl->resid[0], sl->tokens, w.p(0), w.p(1), B, T, C);
    });
    keep(0);
    host_.end_forward(embed_, micro);
  }
  for (int l = lo; l < hi; ++l) {
    const auto& v = l == lo && !embeds ? first_views : host_.begin_forward(layers_[l], micro);
    k.submit([s, sl, &k, c, l, B, T, acts, params = v.params] {
      Bound w(k, params, nullptr, s->wbuf, s->gbuf);
      layer_forward(k, c, w, acts(l), sl->resid[l], sl->resid[l + 1], B, T);
    });
    keep(l + 1);
    host_.end_forward(layers_[l], micro);
  }
  if (heads) {
    {
      const auto& v = host_.begin_forward(ln_f_, micro);
      k.submit([s, sl, &k, L, BT, C, params = v.params] {
        Bound w(k, params, nullptr, s->wbuf, s->gbuf);
        k.layernorm_forward(sl->lnf, sl->lnf_mean, sl->lnf_rstd, sl->resid[L], w.p(0), w.p(1), BT, C);
      });
      host_.end_forward(ln_f_, micro);
    }
    const auto& v = host_.begin_forward(embed_, micro);
    const float dscale = training ? static_cast<float>(host_.loss_gradient_scale() / static_cast<double>(BT)) : 0.0f;
    k.submit([s, sl, &k, BT, C, V, loss, logits, dscale, params = v.params] {
      Bound w(k, params, nullptr, s->wbuf, s->gbuf);
      k.matmul_forward(sl->logits, sl->lnf, w.p(0), nullptr, BT, C, V);
      if (logits != nullptr) k.download(logits, sl->logits, BT * V);
      k.crossentropy(sl->logits, sl->targets, BT, V, dscale, sl->row_loss, loss);
    });
    host_.end_forward(embed_, micro);
  }
  if (training) ++s->in_flight;
}

void Gpt::run_backward(int micro, int chunk) {
  auto s = state_;
  if (s->slots.empty() || micro < 0) ZEROTH_THROW(InvalidArgument, "GPT backward of micro-batch {} before its forward", micro);
  if (chunk < 0 || chunk >= static_cast<int>(part_.chunks.size()))
    ZEROTH_THROW(InvalidArgument, "GPT backward of chunk {}: this part has {}", chunk, part_.chunks.size());
  Slot* sl = &s->slots[micro % s->chunk_slots.at(chunk)];
  gpt::Kernels& k = *s->k;
  const GptConfig c = config_;
  const int B = sl->B, T = sl->T;
  const size_t BT = static_cast<size_t>(B) * T;
  const int L = c.n_layer, C = c.n_embd, V = c.vocab_size;
  const auto [lo, hi] = part_.chunks[chunk];
  const bool embeds = lo == 0, heads = hi == L;
  const bool ckpt = c.activation_checkpointing;
  auto acts = [sl](int l) -> const LayerActs& { return sl->layer[sl->layer.size() == 1 ? 0 : l]; };
  Stream& stream = host_.compute_stream();
  auto restore = [&](int l) {
    if (static_cast<size_t>(l) < sl->saved.size()) host_.device().copy(stream, sl->resid[l], sl->saved[l], BT * C * sizeof(float));
  };
  if (heads) {
    {
      const auto& v = host_.begin_backward(embed_, micro);
      --s->in_flight;
      k.submit([s, sl, &k, BT, C, V, params = v.params, grads = v.grads] {
        Bound w(k, params, &grads, s->wbuf, s->gbuf);
        k.matmul_backward(s->d.dC, w.g(0), nullptr, sl->logits, sl->lnf, w.p(0), BT, C, V);
        w.flush();
      });
      host_.end_backward(embed_, micro);
    }
    const auto& v = host_.begin_backward(ln_f_, micro);
    k.submit([s, sl, &k, L, BT, C, params = v.params, grads = v.grads] {
      Bound w(k, params, &grads, s->wbuf, s->gbuf);
      k.zero(s->d.dresid, BT * C);
      k.layernorm_backward(s->d.dresid, w.g(0), w.g(1), s->d.dC, sl->resid[L], w.p(0), sl->lnf_mean, sl->lnf_rstd, BT, C);
      w.flush();
    });
    host_.end_backward(ln_f_, micro);
  }
  for (int l = hi - 1; l >= lo; --l) {
    const auto& v = host_.begin_backward(layers_[l], micro);
    if (l == hi - 1 && !heads) {
      // The gradient at the chunk's output arrived from the next stage.
      --s->in_flight;
      host_.device().copy(stream, s->d.dresid, sl->dout[chunk], BT * C * sizeof(float));
    }
    restore(l);
    k.submit([s, sl, &k, c, l, B, T, ckpt, acts, params = v.params, grads = v.grads] {
      Bound w(k, params, &grads, s->wbuf, s->gbuf);
      if (ckpt) layer_forward(k, c, w, acts(l), sl->resid[l], nullptr, B, T);
      layer_backward(k, c, w, acts(l), s->d, sl->resid[l], B, T);
      w.flush();
    });
    host_.end_backward(layers_[l], micro);
  }
  if (embeds) {
    const auto& v = host_.begin_backward(embed_, micro);
    k.submit([s, sl, &k, B, T, C, params = v.params, grads = v.grads] {
      Bound w(k, params, &grads, s->wbuf, s->gbuf);
      k.encoder_backward(w.g(0), w.g(1), s->d.dresid, sl->tokens, B, T, C);
      w.flush();
    });
    host_.end_backward(embed_, micro);
  } else {
    host_.device().copy(stream, sl->din[chunk], s->d.dresid, BT * C * sizeof(float));  // for the previous stage
  }
}

}  // namespace zeroth
