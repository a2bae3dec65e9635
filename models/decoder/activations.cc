// The GPT's activation memory: the slots' sizes (what the engine's estimate reads through
// footprint()) and their layout in one allocation, and the pipeline ports in it.
#include <algorithm>  // std::max, std::max_element
#include <cstring>    // std::memset

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/error.h"   // ZEROTH_THROW
#include "core/memory.h"  // format_bytes
#include "models/decoder/gpt_state.h"

namespace zeroth {

namespace {

// The MLP's activations per layer: [fch, fch_act] of a dense layer or of the rows an expert layer's
// experts receive, whichever is larger (every layer gets the same set), and an expert layer's
// received rows, its own rows' outputs and routing arrays (row and weight per choice, token per row).
// Tiled (Dims::mlp_tile_rows), a layer keeps none of the MLP's intermediates: the scratch holds a
// tile's, with the gradients' scratch a tile's too.
struct MlpFloats {
  size_t fch = 0, act = 0, moe = 0;
  size_t dfch = 0, dact = 0, tile = 0;  // scratch: the gradients at up's output and at the activation's, a tile's intermediates
  MlpFloats(const Dims& d, size_t BT) {
    if (const size_t t = d.mlp_tile_rows(BT); t > 0) {
      dfch = t * d.up(), dact = t * d.F, tile = dfch + dact;
      return;
    }
    fch = BT * d.up(), act = BT * d.F;
    dfch = fch, dact = act;
    if (!d.moe) return;
    const size_t rows = d.moe_rows(BT), received = d.moe_expert_rows(BT);
    fch = std::max(fch, received * d.expert_up()), act = std::max(act, received * d.X);
    dfch = fch, dact = act;
    moe = received * d.C + rows * d.C + 2 * BT * d.gate.top_k + rows;
  }
  size_t total() const { return fch + act + moe; }
};

// With activation checkpointing, each expert layer keeps its experts' input (the second norm's
// output, whole): the experts' backward runs before its layer's recomputation.
// Ring attention: the rotary table's rows for this rank's T rows of a sample (its two chunks'
// positions, context_ring.h), which the rotation reads by row modulo T.
std::vector<float> ring_rope_table(const std::vector<float>& table, const Dims& d, int T) {
  const size_t hs = d.hs, c = static_cast<size_t>(T) / 2;
  std::vector<float> mine(table.size());
  for (int slot = 0; slot < 2; ++slot) {
    const size_t first = static_cast<size_t>(gpt::ring_chunk(d.cp, d.cp_rank, slot)) * c;
    std::copy_n(table.data() + first * hs, c * hs, mine.data() + slot * c * hs);
  }
  return mine;
}

size_t expert_inputs(const GptConfig& c, const GptPart& part) {
  if (!c.activation_checkpointing) return 0;
  size_t n = 0;
  for (const auto& [lo, hi] : part.chunks) {
    for (int l = lo; l < hi; ++l) n += c.moe_layer(l) ? 1 : 0;
  }
  return n;
}

}  // namespace

size_t Gpt::State::attention_floats(const GptConfig& c, const Dims& d, size_t B, size_t T) {
  const size_t Ta = T * d.sq;  // with Ulysses the attention sees every position of its heads
  return B * d.NHa * Ta * (c.attention_probabilities ? Ta : 1);
}

size_t Gpt::State::layer_floats(const GptConfig& c, const Dims& d, size_t BT, size_t B, size_t T) {
  const size_t C = d.C, R = d.rows(BT);
  const size_t BTa = d.attn_rows(BT);
  const size_t qk_norm = d.qk_norm ? BTa * d.Wa + BTa * (d.NHa + d.KVHa) : 0;
  const size_t atty_rows = d.sq > 1 ? BT * d.Cq : 0;
  return BTa * d.Wa + BT * d.Cq + atty_rows + MlpFloats(d, BT).total() + 3 * R * C + 4 * R + attention_floats(c, d, B, T) + qk_norm +
         gpt::lora_h_floats(c, BT) + (d.moe ? gpt::expert_lora_h_floats(c, d.moe_expert_rows(BT)) : 0);
}

std::vector<bool> Gpt::State::resid_positions(const GptConfig& c, const GptPart& part) {
  std::vector<bool> used(c.n_layer + 1, false);
  for (const auto& [lo, hi] : part.chunks) {
    for (int l = lo; l <= hi; ++l) used[l] = true;
  }
  return used;
}

size_t Gpt::State::owned_layers(const GptPart& part) {
  size_t n = 0;
  for (const auto& [lo, hi] : part.chunks) n += static_cast<size_t>(hi - lo);
  return n;
}

size_t Gpt::State::resid_copies(const GptConfig& c, const GptPart& part) {
  if (c.cpu_checkpointing) return 2;
  size_t n = 0;
  for (bool u : resid_positions(c, part)) n += u ? 1 : 0;
  return n;
}

size_t Gpt::State::port_count(const GptConfig& c, const GptPart& part) {
  size_t n = 0;
  for (size_t k = 0; k < part.chunks.size(); ++k) {
    n += part.last_chunk(static_cast<int>(k), c) ? 0 : 1;
    n += part.first_chunk(static_cast<int>(k)) ? 0 : 1;
  }
  return n;
}

size_t Gpt::State::saved_count(const GptConfig& c) {
  return c.cpu_checkpointing && c.n_layer > 1 ? static_cast<size_t>(c.n_layer) - 1 : 0;
}

size_t Gpt::State::saved_floats(const GptConfig& c, const GptPart& part, int B, int T) {
  return saved_count(c) * Dims::of(c, part).rows(static_cast<size_t>(B) * T) * c.n_embd;
}

size_t Gpt::State::slot_floats(const GptConfig& c, const GptPart& part, int B, int T) {
  const Dims d = Dims::of(c, part);
  const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd, R = d.rows(BT);
  const size_t layers = c.activation_checkpointing ? 1 : owned_layers(part);
  const size_t head = part.has_head(c) ? BT * C + 2 * R + (d.keeps_logits() ? BT * d.V : 0) + 4 * BT : 0;
  return (resid_copies(c, part) + port_count(c, part)) * R * C + expert_inputs(c, part) * BT * C +
         layers * layer_floats(c, d, BT, B, T) + head;
}

GptPart Gpt::State::slot_part(const GptPart& part, const std::vector<int>& chunk_slots, int i) {
  GptPart sub = part;
  sub.chunks.clear();
  for (size_t k = 0; k < part.chunks.size(); ++k) {
    if (i < chunk_slots.at(k)) sub.chunks.push_back(part.chunks[k]);
  }
  return sub;
}

size_t Gpt::State::all_slots_floats(const GptConfig& c, const GptPart& part, const std::vector<int>& chunk_slots, int B, int T) {
  size_t n = 0;
  const int most = *std::max_element(chunk_slots.begin(), chunk_slots.end());
  for (int i = 0; i < most; ++i) n += slot_floats(c, slot_part(part, chunk_slots, i), B, T);
  return n;
}

size_t Gpt::State::expert_row_floats(const GptConfig& c, const GptPart& part, const std::vector<int>& chunk_slots, int B, int T) {
  const Dims d = Dims::of(c, part);
  if (!d.moe) return 0;
  const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd, rows = d.moe_rows(BT), received = d.moe_expert_rows(BT);
  size_t layers = 0;
  const int most = *std::max_element(chunk_slots.begin(), chunk_slots.end());
  for (int i = 0; i < most; ++i) layers += c.activation_checkpointing ? 1 : owned_layers(slot_part(part, chunk_slots, i));
  return layers * (received + rows) * C + 2 * rows * C + d.moe_exchange_floats(BT);
}

size_t Gpt::State::scratch_floats(const GptConfig& c, const GptPart& part, int B, int T) {
  const Dims d = Dims::of(c, part);
  const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd;
  const MlpFloats mlp(d, BT);
  // The Llama family adds dact, dqk (with per-head norms) and the rotary table.
  const size_t BTa = d.attn_rows(BT);
  const size_t llama = d.llama ? mlp.dact + (d.qk_norm ? BTa * d.Wa : 0) + static_cast<size_t>(c.seq_len) * d.hs : 0;
  // dC holds the gradient at the residual stream's width and at the attention's (wider in Qwen3).
  const size_t dC = std::max<size_t>(C, d.Cq);
  // Expert layers: the router's logits and their gradient, the gradients at the dispatched rows'
  // outputs and inputs, the combine weights' gradient; with expert parallelism the rows on their way
  // out, the experts' outputs on their way back, and the gradients at the received rows.
  const size_t rows = d.moe ? d.moe_rows(BT) : 0;
  const size_t moe = d.moe ? 2 * BT * d.gate.experts + 2 * rows * C + BT * d.gate.top_k + d.moe_exchange_floats(BT) : 0;
  const size_t datt = c.attention_probabilities ? attention_floats(c, d, B, T) : 0;
  // One chunk's logits where the loss runs by chunks (decoding's one row fits in it).
  const size_t logits = part.has_head(c) && !d.keeps_logits() ? d.loss_chunk(BT) * d.V : 0;
  return d.rows(BT) * C + BT * dC + BTa * d.Wa + d.ulysses_floats(B, BT) + d.ring_floats(B, BT) + mlp.dfch + mlp.tile + datt +
         (d.sp ? 3 * BT * C : 0) + llama + moe + logits + lora_floats(c, part, BT);
}

size_t Gpt::State::lora_floats(const GptConfig& c, const GptPart& part, size_t BT) {
  if (!c.lora.enabled()) return 0;
  size_t all = 0, largest = 0;
  for (const auto& spec : Gpt::block_specs(c, part)) {
    if (!spec.name.ends_with(".lora")) continue;
    size_t n = 0;
    for (const auto& p : spec.params) n += p.numel();
    all += n, largest = std::max(largest, n);
  }
  const Dims d = Dims::of(c, part);
  return all + largest + gpt::lora_scratch_floats(c, BT) + (d.moe ? gpt::expert_lora_scratch_floats(c, d.moe_expert_rows(BT)) : 0);
}

void Gpt::State::check_shape(int b, int t) const {
  const Dims d = Dims::of(cfg, part);
  if (d.sp && (static_cast<size_t>(b) * t) % d.tp != 0) {
    ZEROTH_THROW(InvalidArgument,
                 "sequence parallelism splits the {} x {} = {} tokens of a micro-batch over {} tensor-parallel ranks; the count "
                 "must be a multiple of it (change the micro-batch size or the sequence length)",
                 b, t, static_cast<size_t>(b) * t, d.tp);
  }
  if (in_flight > 0 && (b != B || t != T)) {
    ZEROTH_THROW(
        InvalidArgument,
        "GPT micro-batch of {} x {} while {} micro-batch(es) of {} x {} are in flight: the micro-batches of a cycle share one shape",
        b, t, in_flight, B, T);
  }
}

// Long: one allocation carved in order (`take` moves one pointer), slot by slot and then the scratch; split, the order
// all_slots_floats() and scratch_floats() size for would be spread over several functions.
void Gpt::State::reserve(Stream& stream, int b, int t, const std::vector<int>& per_chunk, DType compute) {
  if (b == B && t == T && per_chunk == chunk_slots) return;
  if (cfg.attention_probabilities != gpt::attention_keeps_probabilities(device->kind())) {
    ZEROTH_THROW(InvalidArgument, "GPT activations planned with attention_probabilities = {} on a device whose kernels keep {}",
                 cfg.attention_probabilities,
                 gpt::attention_keeps_probabilities(device->kind()) ? "the probabilities" : "log-sum-exps");
  }
  const int n_slots = *std::max_element(per_chunk.begin(), per_chunk.end());
  check_shape(b, t);
  stream.synchronize();
  const Dims dims = Dims::of(cfg, part);
  const size_t BT = static_cast<size_t>(b) * t, C = cfg.n_embd, L = cfg.n_layer, R = dims.rows(BT), BTa = dims.attn_rows(BT);
  // Rows of another width that fit the allocations (JSON Lines samples padded to the longest of
  // their step) are laid out in them again; a larger shape allocates anew, and so does another
  // micro-batch size (an evaluation's last round): a pipeline runner keys its ports' events by
  // their addresses (engine/pipeline/runner.cc, port_state), which must not change meaning under it.
  const size_t floats = all_slots_floats(cfg, part, per_chunk, b, t) + scratch_floats(cfg, part, b, t);
  const size_t saved = n_slots * saved_floats(cfg, part, b, t), tokens = n_slots * 2 * BT;
  if (!buffer || b != B || buffer.bytes() < floats * sizeof(float) ||
      (saved > 0 && (!host_buffer || host_buffer.bytes() < saved * sizeof(float))) ||
      token_buffer.bytes() < tokens * sizeof(int32_t)) {
    buffer.reset();
    token_buffer.reset();
    host_buffer.reset();
    buffer = device->allocate(floats * sizeof(float), MemTag::activations);
    if (saved > 0) {
      host_buffer = host->allocate_host(saved * sizeof(float), MemTag::activations);
      std::memset(host_buffer.data(), 0, host_buffer.bytes());  // first touch here, not in a step
    }
    token_buffer = device->allocate(tokens * sizeof(int32_t), MemTag::activations);
    // Touched once here: first touch of fresh memory is slow, and a step must not pay it. (The
    // passes write every activation before they read it: a layout laid again needs no clearing.)
    device->fill(stream, buffer.view(DType::f32), 0.0f);
    stream.synchronize();
  }
  if (const size_t scratch = Gpt::scratch_bytes(cfg, compute, part); scratch > 0 && !wbuf) {
    wbuf = device->allocate(scratch / 2, MemTag::buffers);
    gbuf = device->allocate(scratch / 2, MemTag::buffers);
  }
  float* at = buffer.as<float>();
  auto take = [&](size_t n) {
    float* p = at;
    at += n;
    return p;
  };
  slots.assign(n_slots, {});
  moe_acts.clear();
  const MlpFloats mlp(dims, BT);
  const size_t moe_rows = dims.moe ? dims.moe_rows(BT) : 0, choices = BT * dims.gate.top_k;
  const size_t received = dims.moe ? dims.moe_expert_rows(BT) : 0;
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
        if (positions[l]) sl.resid[l] = take(R * C);
        continue;
      }
      if (l < 2) copies[l] = take(R * C);
      sl.resid[l] = copies[l % 2];
      if (l < sl.saved.size()) sl.saved[l] = host_buffer.as<float>() + (i * sl.saved.size() + l) * R * C;
    }
    sl.layer.assign(cfg.activation_checkpointing ? 1 : L, {});
    for (size_t l = 0; l < sl.layer.size(); ++l) {
      if (sl.layer.size() > 1 && !owned[l]) continue;  // another rank's layer
      auto& a = sl.layer[l];
      a.ln1 = take(R * C), a.ln1_mean = take(R), a.ln1_rstd = take(R), a.qkv = take(BTa * dims.Wa);
      a.att = take(attention_floats(cfg, dims, b, t)), a.atty = take(BT * dims.Cq), a.res2 = take(R * C);
      a.ln2 = take(R * C), a.ln2_mean = take(R), a.ln2_rstd = take(R), a.fch = take(mlp.fch), a.fch_act = take(mlp.act);
      if (dims.qk_norm) a.qk_pre = take(BTa * dims.Wa), a.qk_rstd = take(BTa * (dims.NHa + dims.KVHa));
      if (dims.sq > 1) a.atty_rows = take(BT * dims.Cq);
      if (cfg.lora.enabled()) a.lora_h = take(gpt::lora_h_floats(cfg, BT));
      if (dims.moe) {
        a.moe_in = take(received * C), a.moe_out = take(moe_rows * C), a.moe_weight = take(choices);
        a.moe_lora_h = take(gpt::expert_lora_h_floats(cfg, received));
        a.moe_row = reinterpret_cast<int32_t*>(take(choices)), a.moe_token = reinterpret_cast<int32_t*>(take(moe_rows));
      }
    }
    sl.moe.assign(L, nullptr);
    sl.moe_x.assign(L, nullptr);
    for (size_t l = 0; l < L; ++l) {
      if (!owned[l] || !cfg.moe_layer(static_cast<int>(l))) continue;
      sl.moe[l] = &moe_acts.emplace_back();
      if (cfg.activation_checkpointing) sl.moe_x[l] = take(BT * C);
    }
    if (head) {
      sl.lnf = take(BT * C), sl.lnf_mean = take(R), sl.lnf_rstd = take(R);
      sl.logits = dims.keeps_logits() ? take(BT * dims.V) : nullptr, sl.ce_stats = take(4 * BT);
    }
    sl.dout.assign(part.chunks.size(), nullptr);
    sl.din.assign(part.chunks.size(), nullptr);
    for (size_t k = 0; k < part.chunks.size(); ++k) {
      if (i >= per_chunk[k]) continue;
      if (!part.last_chunk(static_cast<int>(k), cfg)) sl.dout[k] = take(R * C);
      if (!part.first_chunk(static_cast<int>(k))) sl.din[k] = take(R * C);
    }
  }
  chunk_slots = per_chunk;
  d.dresid = take(R * C), d.dC = take(BT * std::max<size_t>(C, dims.Cq)), d.dqkv = take(BTa * dims.Wa), d.dfch = take(mlp.dfch);
  if (dims.sq > 1) {
    d.sq_rows = take(BT * dims.W), d.sq_datt = take(BT * dims.Cq);
    d.sq_send = take(BTa * dims.Wa);
    d.sq_recv = b == 1 ? d.sq_send : take(BTa * dims.Wa);  // one sample: an exchange uses one of them
  }
  if (dims.cp > 1) {
    const size_t kv = BT * 2 * static_cast<size_t>(dims.KVH) * dims.hs, c = static_cast<size_t>(t) / 2;
    for (float*& x : d.ring.kv) x = take(kv);
    for (float*& x : d.ring.dkv) x = take(kv);
    d.ring.out = take(c * dims.Cq), d.ring.lse = take(c * dims.NH);
  }
  if (mlp.tile > 0) d.mlp_fch = take(mlp.dfch), d.mlp_act = take(mlp.dact);
  d.datt = cfg.attention_probabilities ? take(attention_floats(cfg, dims, b, t)) : nullptr;
  d.partial = dims.sp ? take(BT * C) : nullptr, d.gathered = dims.sp ? take(BT * C) : nullptr;
  d.ln_whole = dims.sp ? take(BT * C) : nullptr;
  d.logits = part.has_head(cfg) && !dims.keeps_logits() ? take(dims.loss_chunk(BT) * dims.V) : nullptr;
  if (dims.moe) {
    const size_t E = dims.gate.experts;
    d.moe_logits = take(BT * E), d.moe_dlogits = take(BT * E), d.moe_drows = take(moe_rows * C);
    d.moe_dinp = take(moe_rows * C), d.moe_dweight = take(choices);
    if (dims.ep > 1) {
      d.moe_rows = take(moe_rows * C), d.moe_eout = take(received * C), d.moe_erows = take(received * C);
      d.moe_einp = take(received * C);
    }
  }
  lora.assign(L, {});
  lora_values.assign(L, nullptr);
  expert_lora.assign(L, {});
  expert_lora_values.assign(L, nullptr);
  expert_lora_sizes.assign(L, {});
  if (cfg.lora.enabled()) {
    const auto specs = Gpt::block_specs(cfg, part);
    const gpt::PartBlocks ids = gpt::part_blocks(cfg, part);
    size_t largest = 0;
    auto values = [&](int block) {
      size_t n = 0;
      for (const auto& p : specs[block].params) n += p.numel();
      largest = std::max(largest, n);
      return take(n);
    };
    for (size_t l = 0; l < L; ++l) {
      if (ids.lora[l] >= 0) lora_values[l] = values(ids.lora[l]);
      if (ids.expert_lora[l] >= 0) expert_lora_values[l] = values(ids.expert_lora[l]);
    }
    lora_grads = take(largest);
    float* scratch = take(gpt::lora_scratch_floats(cfg, BT));
    float* expert_scratch = dims.moe ? take(gpt::expert_lora_scratch_floats(cfg, received)) : nullptr;
    for (size_t l = 0; l < L; ++l) {
      if (ids.lora[l] >= 0)
        lora[l] = gpt::layer_lora(cfg, dims, static_cast<int>(l), specs[ids.lora[l]].params, lora_values[l], lora_grads, scratch);
      if (ids.expert_lora[l] < 0) continue;
      expert_lora[l] = gpt::experts_lora(cfg, dims, specs[ids.expert_lora[l]].params, expert_lora_values[l], lora_grads,
                                         expert_scratch);
      for (const auto& e : expert_lora[l]) expert_lora_sizes[l].insert(expert_lora_sizes[l].end(), e.sizes.begin(), e.sizes.end());
    }
  }
  if (dims.llama) {
    d.dact = take(mlp.dact);
    d.dqk = dims.qk_norm ? take(BTa * dims.Wa) : nullptr;
    d.rope = take(static_cast<size_t>(cfg.seq_len) * dims.hs);
    std::vector<float> table = cfg.rope_table();
    if (dims.cp > 1) table = ring_rope_table(table, dims, t);
    device->copy(stream, d.rope, table.data(), table.size() * sizeof(float));
    stream.synchronize();  // `table` goes out of scope
  }
  B = b, T = t;
}

size_t Gpt::scratch_bytes(const GptConfig& config, DType compute, const GptPart& part) {
  if (compute == DType::f32) return 0;
  size_t widest = 0;
  for (const auto& spec : block_specs(config, part)) {
    size_t n = 0;
    for (const auto& p : spec.params) n += p.numel();
    widest = std::max(widest, n);
  }
  return 2 * widest * sizeof(float);
}

size_t Gpt::activation_bytes(const GptConfig& config, int B, int T, int slots, const GptPart& given) {
  const GptPart part = gpt::complete_part(given, config);
  return activation_bytes(config, B, T, std::vector<int>(part.chunks.size(), slots), part);
}

size_t Gpt::activation_bytes(const GptConfig& config, int B, int T, const std::vector<int>& chunk_slots, const GptPart& given) {
  const GptPart part = gpt::complete_part(given, config);
  const size_t BT = static_cast<size_t>(B) * T;
  const int slots = *std::max_element(chunk_slots.begin(), chunk_slots.end());
  return (State::all_slots_floats(config, part, chunk_slots, B, T) + State::scratch_floats(config, part, B, T)) * sizeof(float) +
         slots * 2 * BT * sizeof(int32_t);
}

size_t Gpt::host_activation_bytes(const GptConfig& config, int B, int T, int slots, const GptPart& part) {
  return slots * State::saved_floats(config, gpt::complete_part(part, config), B, T) * sizeof(float);
}

std::string Gpt::expert_rows_note(const GptConfig& config, int B, int T, const std::vector<int>& chunk_slots, const GptPart& given) {
  const GptPart part = gpt::complete_part(given, config);
  const size_t floats = State::expert_row_floats(config, part, chunk_slots, B, T);
  if (floats == 0) return "";
  const size_t exchanged = Dims::of(config, part).moe_exchange_floats(static_cast<size_t>(B) * T) * sizeof(float);
  return fmt::format(", of which {} rows for the experts (every layer's set holds them){}", format_bytes(floats * sizeof(float)),
                     exchanged > 0 ? fmt::format(" (all-to-all buffers {})", format_bytes(exchanged)) : "");
}

ModelFootprint Gpt::footprint(const GptConfig& config, int B, int T, DType compute, int slots, const GptPart& part) {
  const GptPart whole = gpt::complete_part(part, config);
  return {activation_bytes(config, B, T, slots, part), scratch_bytes(config, compute, part),
          host_activation_bytes(config, B, T, slots, part),
          fmt::format("{} slot{} of a {} x {} micro-batch{}", slots, slots == 1 ? "" : "s", B, T,
                      expert_rows_note(config, B, T, std::vector<int>(whole.chunks.size(), slots), part))};
}

ModelFootprint Gpt::footprint(const GptConfig& config, int B, int T, DType compute, const std::vector<int>& chunk_slots,
                              const GptPart& part) {
  if (chunk_slots.size() <= 1) return footprint(config, B, T, compute, chunk_slots.empty() ? 1 : chunk_slots[0], part);
  return {activation_bytes(config, B, T, chunk_slots, part), scratch_bytes(config, compute, part), 0,
          fmt::format("{} slots of {} chunks of a {} x {} micro-batch{}", fmt::join(chunk_slots, "+"), chunk_slots.size(), B, T,
                      expert_rows_note(config, B, T, chunk_slots, part))};
}

std::vector<int> Gpt::chunk_slots() const {
  std::vector<int> out;
  for (size_t k = 0; k < part_.chunks.size(); ++k) out.push_back(host_.chunk_micro_batches_in_flight(static_cast<int>(k)));
  return out;
}

void Gpt::check_rows(int B, int T) const {
  const int ranks = part_.sample_ranks();
  const int64_t positions = static_cast<int64_t>(T) * ranks;
  // A ring rank holds two equal chunks of each sample.
  const bool halves = part_.cp_ranks == 1 || T % 2 == 0;
  if (B > 0 && T > 0 && positions <= config_.seq_len && halves) return;
  if (ranks == 1)
    ZEROTH_THROW(InvalidArgument, "GPT micro-batch {} x {}: need B >= 1 and 1 <= T <= model.seq_len ({})", B, T, config_.seq_len);
  const char* group = part_.cp_ranks > 1 ? "ring attention" : "Ulysses";
  ZEROTH_THROW(InvalidArgument,
               "GPT micro-batch {} x {} on each of {} {} ranks ({} positions a sample): need B >= 1 and 1 <= T x {} <= "
               "model.seq_len ({}){}",
               B, T, ranks, group, positions, ranks, config_.seq_len,
               part_.cp_ranks > 1 ? ", and T even (each rank holds two chunks of T / 2 positions)" : "");
}

void Gpt::prepare(int B, int T) {
  check_rows(B, T);
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
  const size_t rows = Dims::of(config_, part_).rows(static_cast<size_t>(sl.B) * sl.T);
  return {at, rows * config_.n_embd, DType::f32};
}

}  // namespace zeroth
