// The GPT's micro-step: where the activations live (one slot per micro-batch in flight) and the
// order of the block uses, each enqueued on the host's compute stream as kernel work around the
// tensor-parallel group's collectives (layers.cc), so the engine's gathers and reductions overlap it.
#include <algorithm>  // std::max, std::max_element
#include <cstring>    // std::memset

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/device.h"  // Buffer
#include "core/error.h"   // ZEROTH_THROW
#include "core/log.h"     // ZLOG_WARN
#include "models/gpt/gpt.h"
#include "models/gpt/kernels.h"  // gpt::Kernels
#include "models/gpt/layers.h"   // gpt::layer_forward, gpt::Dims

namespace zeroth {

using gpt::Dims;
using gpt::LayerActs;

// One micro-batch in flight: what its backward needs from its forward.
struct Slot {
  int B = 0, T = 0;
  int32_t *tokens = nullptr, *targets = nullptr;
  // [L + 1] residual stream: resid[l] is block l's input (null where another rank holds the layer).
  // With cpu_checkpointing these alternate between two device buffers, and saved[l] (host memory)
  // keeps the first L - 1 for backward.
  std::vector<float*> resid, saved;
  std::vector<LayerActs> layer;  // [L], or [1] shared when checkpointing
  // The head: ln_f's output (whole [BT, C]) and statistics (this rank's rows), the logits of this
  // rank's vocabulary slice, and the loss's per-row statistics (4 x BT: Kernels::crossentropy_*).
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr, *logits = nullptr, *ce_stats = nullptr;
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
  gpt::Scratch d;                // passes run one at a time: shared
  Buffer wbuf, gbuf;             // f32 copies of a narrow block's parameters and gradients

  // LayerActs of one layer: ln1, ln2, res2 and the statistics this rank's rows; the rest in this
  // rank's heads and MLP width.
  static size_t layer_floats(const Dims& d, size_t BT, size_t B, size_t T) {
    const size_t C = d.C, R = d.rows(BT);
    return BT * (4 * d.Cq + 2 * d.F) + 3 * R * C + 4 * R + B * d.NH * T * T;
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
  static size_t saved_floats(const GptConfig& c, const GptPart& part, int B, int T) {
    return saved_count(c) * Dims::of(c, part).rows(static_cast<size_t>(B) * T) * c.n_embd;
  }
  static size_t slot_floats(const GptConfig& c, const GptPart& part, int B, int T) {
    const Dims d = Dims::of(c, part);
    const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd, R = d.rows(BT);
    const size_t layers = c.activation_checkpointing ? 1 : owned_layers(part);
    const size_t head = part.has_head(c) ? BT * C + 2 * R + BT * d.V + 4 * BT : 0;
    return (resid_copies(c, part) + port_count(c, part)) * R * C + layers * layer_floats(d, BT, B, T) + head;
  }
  // The chunks slot i holds: those with more than i slots.
  static GptPart slot_part(const GptPart& part, const std::vector<int>& chunk_slots, int i) {
    GptPart sub = part;
    sub.chunks.clear();
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
  // dresid (this rank's rows), dC, dqkv, dfch, datt; with sequence parallelism the partial sums, a
  // gathered gradient and a gathered LayerNorm output, whole.
  static size_t scratch_floats(const GptConfig& c, const GptPart& part, int B, int T) {
    const Dims d = Dims::of(c, part);
    const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd;
    return d.rows(BT) * C + BT * (C + 3 * d.Cq + d.F) + static_cast<size_t>(B) * d.NH * T * T + (d.sp ? 3 * BT * C : 0);
  }
  // The layer whose activation set evaluation uses (nothing is kept for a backward).
  int eval_layer() const { return cfg.activation_checkpointing ? 0 : part.chunks.front()[0]; }

  // On the caller's thread: a new shape waits for the stream to finish with the old buffers.
  void check_shape(int b, int t) const {
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

  void reserve(Stream& stream, int b, int t, const std::vector<int>& per_chunk, DType compute) {
    if (b == B && t == T && per_chunk == chunk_slots) return;
    const int n_slots = *std::max_element(per_chunk.begin(), per_chunk.end());
    check_shape(b, t);
    stream.synchronize();
    const Dims dims = Dims::of(cfg, part);
    const size_t BT = static_cast<size_t>(b) * t, C = cfg.n_embd, L = cfg.n_layer, R = dims.rows(BT);
    buffer.reset();
    token_buffer.reset();
    host_buffer.reset();
    buffer = device->allocate((all_slots_floats(cfg, part, per_chunk, b, t) + scratch_floats(cfg, part, b, t)) * sizeof(float),
                              MemTag::activations);
    if (const size_t saved = n_slots * saved_floats(cfg, part, b, t); saved > 0) {
      host_buffer = host->allocate_host(saved * sizeof(float), MemTag::activations);
      std::memset(host_buffer.data(), 0, host_buffer.bytes());  // first touch here, not in a step
    }
    token_buffer = device->allocate(n_slots * 2 * BT * sizeof(int32_t), MemTag::activations);
    if (const size_t scratch = Gpt::scratch_bytes(cfg, compute, part); scratch > 0 && !wbuf) {
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
        a.ln1 = take(R * C), a.ln1_mean = take(R), a.ln1_rstd = take(R), a.qkv = take(3 * BT * dims.Cq);
        a.att = take(static_cast<size_t>(b) * dims.NH * t * t), a.atty = take(BT * dims.Cq), a.res2 = take(R * C);
        a.ln2 = take(R * C), a.ln2_mean = take(R), a.ln2_rstd = take(R), a.fch = take(BT * dims.F), a.fch_gelu = take(BT * dims.F);
      }
      if (head) {
        sl.lnf = take(BT * C), sl.lnf_mean = take(R), sl.lnf_rstd = take(R), sl.logits = take(BT * dims.V), sl.ce_stats = take(4 * BT);
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
    d.dresid = take(R * C), d.dC = take(BT * C), d.dqkv = take(3 * BT * dims.Cq), d.dfch = take(BT * dims.F);
    d.datt = take(static_cast<size_t>(b) * dims.NH * t * t);
    d.partial = dims.sp ? take(BT * C) : nullptr, d.gathered = dims.sp ? take(BT * C) : nullptr;
    d.ln_whole = dims.sp ? take(BT * C) : nullptr;
    B = b, T = t;
  }
};

namespace {

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

Gpt::Gpt(BlockHost& host, GptConfig config, GptPart part, Communicator* tensor)
    : host_(host), config_(config), part_(gpt::complete_part(part, config)), tensor_(tensor), state_(std::make_shared<State>()) {
  const int group = tensor != nullptr ? tensor->size() : 1, rank = tensor != nullptr ? tensor->rank() : 0;
  if (part_.tp_ranks != group || (group > 1 && part_.tp_rank != rank)) {
    ZEROTH_THROW(InvalidArgument, "GPT part for tensor-parallel rank {} of {}, but the group given makes it rank {} of {}",
                 part_.tp_rank, part_.tp_ranks, rank, group);
  }
  auto specs = block_specs(config_, part_);
  for (auto& spec : specs) host_.add_block(std::move(spec));
  const gpt::PartBlocks ids = gpt::part_blocks(config_, part_);
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

ModelFootprint Gpt::footprint(const GptConfig& config, int B, int T, DType compute, int slots, const GptPart& part) {
  return {activation_bytes(config, B, T, slots, part), scratch_bytes(config, compute, part),
          host_activation_bytes(config, B, T, slots, part),
          fmt::format("{} slot{} of a {} x {} micro-batch", slots, slots == 1 ? "" : "s", B, T)};
}

ModelFootprint Gpt::footprint(const GptConfig& config, int B, int T, DType compute, const std::vector<int>& chunk_slots,
                              const GptPart& part) {
  if (chunk_slots.size() <= 1) return footprint(config, B, T, compute, chunk_slots.empty() ? 1 : chunk_slots[0], part);
  return {activation_bytes(config, B, T, chunk_slots, part), scratch_bytes(config, compute, part), 0,
          fmt::format("{} slots of {} chunks of a {} x {} micro-batch", fmt::join(chunk_slots, "+"), chunk_slots.size(), B, T)};
}

void Gpt::forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, int micro) {
  forward(micro, tokens, targets, B, T, loss);
  backward(micro);
}

void Gpt::evaluate(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits) {
  if (!part_.whole(config_)) ZEROTH_THROW(InvalidArgument, "Gpt::evaluate on a pipeline stage; run its chunks (evaluate_chunk)");
  if (logits != nullptr && part_.tp_ranks > 1) {
    ZEROTH_THROW(InvalidArgument, "Gpt::evaluate with logits on tensor-parallel rank {} of {}: a rank holds only its vocabulary slice",
                 part_.tp_rank, part_.tp_ranks);
  }
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
  const size_t rows = Dims::of(config_, part_).rows(static_cast<size_t>(sl.B) * sl.T);
  return {at, rows * config_.n_embd, DType::f32};
}

namespace {

// The block use's parameters (and gradients) bound in stream order: the first piece of its work.
// wbuf and gbuf (the state's f32 scratch) outlive the stream's work.
gpt::BoundRef bind(gpt::Kernels& k, const Buffer* wbuf, const Buffer* gbuf, const BlockViews& views, bool grads) {
  auto w = std::make_shared<std::shared_ptr<gpt::Bound>>();
  k.submit([w, wbuf, gbuf, &k, params = views.params, g = grads ? views.grads : std::vector<TensorView>{}, grads] {
    *w = std::make_shared<gpt::Bound>(k, params, grads ? &g : nullptr, *wbuf, *gbuf);
  });
  return w;
}

// The use's gradients added into the engine's narrow views, and the binding let go.
void release(gpt::Kernels& k, const gpt::BoundRef& w) {
  k.submit([w] {
    (*w)->flush();
    w->reset();
  });
}

}  // namespace

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
  const Dims d = Dims::of(config_, part_);
  const gpt::TensorGroup g(tensor_, stream, d);
  const size_t BT = static_cast<size_t>(B) * T, R = d.rows(BT), at = d.row_offset(BT);
  const int L = config_.n_layer, C = config_.n_embd;
  // Without backward nothing is kept per layer: evaluation runs in one set.
  const int eval_layer = s->eval_layer();
  auto acts = [sl, training, eval_layer](int l) -> const LayerActs& {
    return sl->layer[sl->layer.size() == 1 ? 0 : !training ? eval_layer : l];
  };
  // cpu_checkpointing: each block's input goes to host memory once it is computed (evaluation
  // has no backward to keep it for).
  const size_t bytes = R * C * sizeof(float);
  auto keep = [&](int l) {
    if (training && static_cast<size_t>(l) < sl->saved.size()) host_.device().copy(stream, sl->saved[l], sl->resid[l], bytes);
  };
  if (embeds) {
    // Vocabulary-parallel: each rank adds the rows of its tokens, rank 0 the positions; the sum over
    // the ranks is the embedding.
    auto w = bind(k, &s->wbuf, &s->gbuf, first_views, false);
    float* partial = d.sp ? s->d.partial : sl->resid[0];
    const int32_t* ids = sl->tokens;
    k.submit([&k, w, partial, ids, d, B, T] {
      k.encoder_forward(partial, ids, (*w)->p(0), d.tp_rank == 0 ? (*w)->p(1) : nullptr, B, T, d.C, d.v_lo, d.V);
    });
    g.reduce(partial, sl->resid[0], BT);
    release(k, w);
    keep(0);
    host_.end_forward(embed_, micro);
  }
  for (int l = lo; l < hi; ++l) {
    const auto& v = l == lo && !embeds ? first_views : host_.begin_forward(layers_[l], micro);
    auto w = bind(k, &s->wbuf, &s->gbuf, v, false);
    gpt::layer_forward(k, g, w, acts(l), s->d, sl->resid[l], sl->resid[l + 1], B, T);
    release(k, w);
    keep(l + 1);
    host_.end_forward(layers_[l], micro);
  }
  if (!heads) {
    if (training) ++s->in_flight;
    return;
  }
  {
    auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_forward(ln_f_, micro), false);
    float *lnf = sl->lnf + at, *mean = sl->lnf_mean, *rstd = sl->lnf_rstd;
    const float* x = sl->resid[L];
    k.submit([&k, w, lnf, mean, rstd, x, R, C] { k.layernorm_forward(lnf, mean, rstd, x, (*w)->p(0), (*w)->p(1), R, C); });
    release(k, w);
    host_.end_forward(ln_f_, micro);
  }
  g.gather(sl->lnf, BT);
  auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_forward(embed_, micro), false);
  const float dscale = training ? static_cast<float>(host_.loss_gradient_scale() / static_cast<double>(BT)) : 0.0f;
  float* lg = sl->logits;
  float* stats = sl->ce_stats;
  const float* lnf = sl->lnf;
  const int32_t* ys = sl->targets;
  // The vocabulary-parallel loss: each rank its slice of the logits; the row max and the sums of the
  // softmax's denominator and the target's logit combine over the ranks (the logits never do).
  k.submit([&k, w, lg, lnf, stats, logits, d, BT] {
    k.matmul_forward(lg, lnf, (*w)->p(0), nullptr, BT, d.C, d.V);
    if (logits != nullptr) k.download(logits, lg, BT * d.V);
    k.crossentropy_max(lg, BT, d.V, stats);
  });
  g.all_reduce(stats, BT, ReduceOp::max);
  k.submit([&k, lg, ys, stats, d, BT] { k.crossentropy_sums(lg, ys, BT, d.V, d.v_lo, stats); });
  g.all_reduce(stats + BT, 2 * BT, ReduceOp::sum);
  k.submit([&k, lg, ys, stats, loss, dscale, d, BT] { k.crossentropy_finish(lg, ys, BT, d.V, d.v_lo, dscale, stats, loss); });
  release(k, w);
  host_.end_forward(embed_, micro);
  if (training) ++s->in_flight;
}

void Gpt::run_backward(int micro, int chunk) {
  auto s = state_;
  if (s->slots.empty() || micro < 0) ZEROTH_THROW(InvalidArgument, "GPT backward of micro-batch {} before its forward", micro);
  if (chunk < 0 || chunk >= static_cast<int>(part_.chunks.size()))
    ZEROTH_THROW(InvalidArgument, "GPT backward of chunk {}: this part has {}", chunk, part_.chunks.size());
  Slot* sl = &s->slots[micro % s->chunk_slots.at(chunk)];
  gpt::Kernels& k = *s->k;
  const int B = sl->B, T = sl->T;
  const size_t BT = static_cast<size_t>(B) * T;
  const int L = config_.n_layer, C = config_.n_embd;
  const auto [lo, hi] = part_.chunks[chunk];
  const bool embeds = lo == 0, heads = hi == L;
  const bool ckpt = config_.activation_checkpointing;
  auto acts = [sl](int l) -> const LayerActs& { return sl->layer[sl->layer.size() == 1 ? 0 : l]; };
  Stream& stream = host_.compute_stream();
  const Dims d = Dims::of(config_, part_);
  const gpt::TensorGroup g(tensor_, stream, d);
  const size_t R = d.rows(BT);
  const gpt::Scratch& sc = s->d;
  auto restore = [&](int l) {
    if (static_cast<size_t>(l) < sl->saved.size()) host_.device().copy(stream, sl->resid[l], sl->saved[l], R * C * sizeof(float));
  };
  if (heads) {
    {
      auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_backward(embed_, micro), true);
      --s->in_flight;
      // d(ln_f output) from this rank's vocabulary slice is a partial sum over the ranks.
      float* partial = d.sp ? sc.partial : sc.dC;
      const float* lg = sl->logits;
      const float* lnf = sl->lnf;
      k.submit(
          [&k, w, partial, lg, lnf, d, BT] { k.matmul_backward(partial, (*w)->g(0), nullptr, lg, lnf, (*w)->p(0), BT, d.C, d.V); });
      g.reduce(partial, sc.dC, BT);
      release(k, w);
      host_.end_backward(embed_, micro);
    }
    auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_backward(ln_f_, micro), true);
    const float *x = sl->resid[L], *mean = sl->lnf_mean, *rstd = sl->lnf_rstd;
    k.submit([&k, w, sc, x, mean, rstd, R, C] {
      k.zero(sc.dresid, R * C);
      k.layernorm_backward(sc.dresid, (*w)->g(0), (*w)->g(1), sc.dC, x, (*w)->p(0), mean, rstd, R, C);
    });
    release(k, w);
    host_.end_backward(ln_f_, micro);
  }
  for (int l = hi - 1; l >= lo; --l) {
    const auto& v = host_.begin_backward(layers_[l], micro);
    if (l == hi - 1 && !heads) {
      // The gradient at the chunk's output arrived from the next stage.
      --s->in_flight;
      host_.device().copy(stream, sc.dresid, sl->dout[chunk], R * C * sizeof(float));
    }
    restore(l);
    auto w = bind(k, &s->wbuf, &s->gbuf, v, true);
    if (ckpt) gpt::layer_forward(k, g, w, acts(l), sc, sl->resid[l], nullptr, B, T);
    gpt::layer_backward(k, g, w, acts(l), sc, sl->resid[l], B, T);
    release(k, w);
    host_.end_backward(layers_[l], micro);
  }
  if (embeds) {
    auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_backward(embed_, micro), true);
    const float* dout = g.gathered_rows(sc.dresid, sc.gathered, BT);
    const int32_t* ids = sl->tokens;
    k.submit([&k, w, dout, ids, d, B, T] { k.encoder_backward((*w)->g(0), (*w)->g(1), dout, ids, B, T, d.C, d.v_lo, d.V); });
    release(k, w);
    host_.end_backward(embed_, micro);
  } else {
    host_.device().copy(stream, sl->din[chunk], sc.dresid, R * C * sizeof(float));  // for the previous stage
  }
}

}  // namespace zeroth
