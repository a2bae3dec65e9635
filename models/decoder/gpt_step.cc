// The GPT's passes: the order of the block uses of a forward, backward or evaluation, each enqueued
// on the host's compute stream as kernel work around the tensor-parallel group's collectives
// (layers.cc), so the engine's gathers and reductions overlap it. Where the activations live is
// activations.cc's.
#include <algorithm>  // std::max
#include <numeric>    // std::accumulate

#include "core/device.h"  // Buffer
#include "core/error.h"   // ZEROTH_THROW
#include "models/decoder/gpt_state.h"
#include "models/kernels/kernels.h"  // gpt::Kernels
#include "models/decoder/layers.h"   // gpt::layer_forward, gpt::Dims

namespace zeroth {

namespace {

// Targets may be -1: not counted (the loss mask).
void check_tokens(const int32_t* t, size_t n, int V, const char* what, int32_t lowest = 0) {
  for (size_t i = 0; i < n; ++i) {
    if (t[i] < lowest || t[i] >= V) {
      ZEROTH_THROW(InvalidArgument,
                   "{} id {} at position {} is outside the model's vocabulary [0, {}): the data and model.vocab_size disagree", what,
                   t[i], i, V);
    }
  }
}

}  // namespace

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

// What a micro-batch's loss is divided by: its BT rows, or the count set for the step.
double loss_divisor(double set, size_t BT) { return set > 0 ? set : static_cast<double>(BT); }

// The gradient of the loss over `divisor` rows at each token's logits, times the host's loss scale
// (the same in a micro-batch's forward and backward: the scale and the divisor change only at a step).
float logits_gradient_scale(BlockHost& host, double divisor) { return static_cast<float>(host.loss_gradient_scale() / divisor); }

// The use's gradients added into the engine's narrow views, and the binding let go.
void release(gpt::Kernels& k, const gpt::BoundRef& w) {
  k.submit([w] {
    (*w)->flush();
    w->reset();
  });
}

}  // namespace

// Long: a micro-batch's forward in block order (embedding, layers with their experts, final norm, head and loss); each part
// uses the slot, kernels and stream set up at the top.
void Gpt::run_forward(int micro, int chunk, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits,
                      bool training, bool decoding, const int32_t* positions) {
  check_rows(B, T);
  if (micro < 0) ZEROTH_THROW(InvalidArgument, "GPT forward of micro-batch {}: micro-batch ids start at 0", micro);
  if (chunk < 0 || chunk >= static_cast<int>(part_.chunks.size()))
    ZEROTH_THROW(InvalidArgument, "GPT forward of chunk {}: this part has {}", chunk, part_.chunks.size());
  const auto [lo, hi] = part_.chunks[chunk];
  const bool embeds = lo == 0, heads = hi == config_.n_layer;
  // The caller's host arrays are checked here and copied in stream order to the device, once
  // the host has accepted the use (so a refused call leaves every slot as it was).
  if (embeds) check_tokens(tokens, static_cast<size_t>(B) * T, config_.vocab_size, "token");
  if (heads && !decoding) check_tokens(targets, static_cast<size_t>(B) * T, config_.vocab_size, "target", -1);
  // The attention's samples span the Ulysses group's rows: found in the whole rows' positions.
  if (positions != nullptr && part_.cp_ranks > 1) {
    ZEROTH_THROW(ConfigError,
                 "ring attention (parallel.context = {}) takes one sample a row: packed rows (their positions) are not split "
                 "over a context group yet; turn data.packing off, or use parallel.sequence (Ulysses) for packed samples",
                 part_.cp_ranks);
  }
  gpt::Spans spans = gpt::spans_of(positions, B, T * part_.sq_ranks);
  gpt::Runs runs = part_.cp_ranks > 1 ? gpt::ring_runs(B, T, part_.cp_ranks, part_.cp_rank)
                                      : gpt::runs_of(positions, B, T, part_.sq_ranks, part_.sq_rank);
  auto s = state_;
  Stream& stream = host_.compute_stream();
  s->check_shape(B, T);
  const int first_block = embeds ? embed_ : lora_[lo] >= 0 ? lora_[lo] : layers_[lo];
  const auto& first_views = host_.begin_forward(first_block, micro);
  s->reserve(stream, B, T, chunk_slots(), host_.compute_dtype());
  Slot* sl = &s->slots[training ? micro % s->chunk_slots[chunk] : 0];
  if (embeds) host_.device().copy(stream, sl->tokens, tokens, static_cast<size_t>(B) * T * sizeof(int32_t));
  if (heads && !decoding) host_.device().copy(stream, sl->targets, targets, static_cast<size_t>(B) * T * sizeof(int32_t));
  sl->spans = spans, sl->runs = runs;
  gpt::Kernels& k = *s->k;
  const Dims d = Dims::of(config_, part_);
  const gpt::TensorGroup g(tensor_, stream, d);
  std::atomic<int64_t>* nanos = s->time_exchanges ? &s->exchange_nanos : nullptr;
  const gpt::ContextRing ring(sequence_, k, stream, s->ring_stream.get(),
                              {s->ring_events[0].get(), s->ring_events[1].get(), s->ring_events[2].get()}, d, s->d.ring, nanos);
  const gpt::SequenceGroup q(sequence_, k, stream, d, s->d.sq_send, s->d.sq_recv, nanos, &ring);
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
    // GPT-2's learned positions (the Llama family has none: rotary ones, in each layer), from the
    // generation's position on when decoding, from the rank's first in a Ulysses group.
    const size_t shift = static_cast<size_t>(decoding ? s->kv_pos : d.sq_rank * T) * d.C;
    k.submit([&k, w, partial, ids, d, B, T, shift, runs] {
      const float* wpe = d.tp_rank == 0 && !d.llama ? (*w)->p(1) : nullptr;
      if (!runs) return k.encoder_forward(partial, ids, (*w)->p(0), wpe != nullptr ? wpe + shift : nullptr, B, T, d.C, d.v_lo, d.V);
      for (const auto& [r0, n, p0] : *runs) {
        k.encoder_forward(partial + static_cast<size_t>(r0) * d.C, ids + r0, (*w)->p(0),
                          wpe != nullptr ? wpe + static_cast<size_t>(p0) * d.C : nullptr, 1, n, d.C, d.v_lo, d.V);
      }
    });
    g.reduce(partial, sl->resid[0], BT);
    release(k, w);
    keep(0);
    host_.end_forward(embed_, micro);
  }
  const gpt::ExpertGroup eg(experts_comm_, stream, s->exchange.get(), &s->exchange_events, d);
  const gpt::KvCache within = gpt::KvCache::within(spans, d.probabilities);
  for (int l = lo; l < hi; ++l) {
    const bool first = l == lo && !embeds;
    const gpt::LayerLora* lora = lora_[l] >= 0 ? &s->lora[l] : nullptr;
    if (lora != nullptr) {
      // The adapters in f32 for the layer's passes (forward and backward: they change at the step).
      const auto& lv = first ? first_views : host_.begin_forward(lora_[l], micro);
      auto wl = bind(k, &s->wbuf, &s->gbuf, lv, false);
      gpt::copy_adapters(k, wl, s->lora_values[l], &lora->sizes);
      release(k, wl);
      host_.end_forward(lora_[l], micro);
    }
    const auto& v = first && lora == nullptr ? first_views : host_.begin_forward(layers_[l], micro);
    auto w = bind(k, &s->wbuf, &s->gbuf, v, false);
    const gpt::MoePass moe{config_.moe_layer(l), training, 1.0f, training ? &s->moe_stats : nullptr, sl->moe[l], &stream};
    gpt::layer_forward(k, g, q, w, acts(l), s->d, sl->resid[l], sl->resid[l + 1], B, T, decoding ? s->kv(l) : within, moe, lora);
    release(k, w);
    host_.end_forward(layers_[l], micro);
    if (experts_[l] >= 0) {
      // The experts' use: their input is the layer's ln2, kept apart when checkpointing (the
      // experts' backward runs before the layer is recomputed).
      const LayerActs& a = acts(l);
      const float* x = d.sp ? s->d.ln_whole : a.ln2;  // whole: the layer's use gathered it last
      if (training && sl->moe_x[l] != nullptr) {
        host_.device().copy(stream, sl->moe_x[l], x, BT * C * sizeof(float));
        x = sl->moe_x[l];
      }
      gpt::MoePass experts = moe;
      if (expert_lora_[l] >= 0) {
        // The experts' adapters in f32 for their passes, as a layer's (above).
        auto wl = bind(k, &s->wbuf, &s->gbuf, host_.begin_forward(expert_lora_[l], micro), false);
        gpt::copy_adapters(k, wl, s->expert_lora_values[l], &s->expert_lora_sizes[l]);
        release(k, wl);
        host_.end_forward(expert_lora_[l], micro);
        experts.lora = &s->expert_lora[l];
      }
      auto we = bind(k, &s->wbuf, &s->gbuf, host_.begin_forward(experts_[l], micro), false);
      gpt::moe_experts_forward(k, eg, we, d, a, s->d, x, sl->resid[l + 1], a.res2, BT, experts);
      release(k, we);
      host_.end_forward(experts_[l], micro);
    }
    keep(l + 1);
  }
  if (!heads) {
    if (training) ++s->in_flight;
    return;
  }
  {
    auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_forward(ln_f_, micro), false);
    float *lnf = sl->lnf + at, *mean = sl->lnf_mean, *rstd = sl->lnf_rstd;
    const float* x = sl->resid[L];
    k.submit([&k, w, lnf, mean, rstd, x, R, C, d] {
      if (d.llama) k.rmsnorm_forward(lnf, rstd, x, (*w)->p(0), R, 1, C, C, d.eps);
      else k.layernorm_forward(lnf, mean, rstd, x, (*w)->p(0), (*w)->p(1), R, C);
    });
    release(k, w);
    host_.end_forward(ln_f_, micro);
  }
  g.gather(sl->lnf, BT);
  auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_forward(head_, micro), false);
  // Where the loss runs by chunks, one chunk's logits at a time in the scratch.
  float* const logits_at = d.keeps_logits() ? sl->logits : s->d.logits;
  if (decoding) {
    // The next token's logits: the last position's row only.
    float* lg = logits_at;
    const float* last = sl->lnf + (BT - 1) * C;
    k.submit([&k, w, lg, last, logits, d] {
      k.matmul_forward(lg, last, (*w)->p(0), nullptr, 1, d.C, d.V);
      k.download(logits, lg, d.V);
    });
    release(k, w);
    host_.end_forward(head_, micro);
    return;
  }
  // Kept whole, the logits become their gradient here; by chunks, backward makes them again.
  const double divisor = loss_divisor(loss_divisor_, BT);
  const float dscale = training && d.keeps_logits() ? logits_gradient_scale(host_, divisor) : 0.0f;
  float* row_losses = sl->ce_stats + 3 * BT;
  const size_t rows = d.loss_chunk(BT);
  for (size_t r0 = 0; r0 < BT; r0 += rows) {
    const size_t n = std::min(rows, BT - r0);
    float* lg = d.keeps_logits() ? logits_at + r0 * d.V : logits_at;
    float* stats = sl->ce_stats + 3 * r0;  // this chunk's [max | sums | picked], n each
    float* out = logits != nullptr ? logits + r0 * d.V : nullptr;
    const float* lnf = sl->lnf + r0 * C;
    const int32_t* ys = sl->targets + r0;
    // The vocabulary-parallel loss: each rank its slice of the logits; the row max and the sums of
    // the softmax's denominator and the target's logit combine over the ranks (the logits never do).
    k.submit([&k, w, lg, lnf, stats, out, d, n] {
      k.matmul_forward(lg, lnf, (*w)->p(0), nullptr, n, d.C, d.V);
      if (out != nullptr) k.download(out, lg, n * d.V);
      k.crossentropy_max(lg, n, d.V, stats);
    });
    g.all_reduce(stats, n, ReduceOp::max);
    k.submit([&k, lg, ys, stats, d, n] { k.crossentropy_sums(lg, ys, n, d.V, d.v_lo, stats); });
    g.all_reduce(stats + n, 2 * n, ReduceOp::sum);
    float* losses = row_losses + r0;
    k.submit([&k, lg, ys, stats, losses, dscale, d, n] { k.crossentropy_finish(lg, ys, n, d.V, d.v_lo, dscale, stats, losses); });
  }
  k.submit([&k, row_losses, loss, BT, divisor] { k.mean_loss(row_losses, BT, divisor, loss); });
  release(k, w);
  host_.end_forward(head_, micro);
  if (training) ++s->in_flight;
}

// Long: the backward in reverse block order (head and loss, final norm, layers with their experts, embedding), the mirror
// of run_forward; each part uses the slot, scratch and stream set up at the top.
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
  std::atomic<int64_t>* nanos = s->time_exchanges ? &s->exchange_nanos : nullptr;
  const gpt::ContextRing ring(sequence_, k, stream, s->ring_stream.get(),
                              {s->ring_events[0].get(), s->ring_events[1].get(), s->ring_events[2].get()}, d, s->d.ring, nanos);
  const gpt::SequenceGroup q(sequence_, k, stream, d, s->d.sq_send, s->d.sq_recv, nanos, &ring);
  const size_t R = d.rows(BT);
  const gpt::Scratch& sc = s->d;
  // cpu_checkpointing: block l's input comes back from host memory on a stream of its own while
  // block l + 1 runs its backward, into the working copy that block l + 2's input (ln_f's for the
  // last layer) held: the copy waits for that copy's last reader, block l's recomputation for the copy.
  const int first_layer = lo;  // a lambda takes no structured binding in clang before 16
  auto prefetch = [&](int l) {
    if (l < first_layer || static_cast<size_t>(l) >= sl->saved.size()) return;
    s->copy_free->record(stream);
    s->restore_stream->wait(*s->copy_free);
    host_.device().copy(*s->restore_stream, sl->resid[l], sl->saved[l], R * C * sizeof(float));
    s->restored[l % 2]->record(*s->restore_stream);
  };
  auto restored = [&](int l) {
    if (static_cast<size_t>(l) < sl->saved.size()) stream.wait(*s->restored[l % 2]);
  };
  prefetch(hi - 1);  // none where block L - 1's input is in a working copy, as with a whole model
  if (heads) {
    {
      auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_backward(head_, micro), true);
      --s->in_flight;
      // d(ln_f output) from this rank's vocabulary slice is a partial sum over the ranks.
      float* partial = d.sp ? sc.partial : sc.dC;
      if (d.keeps_logits()) {
        const float* lg = sl->logits;  // their gradient, since forward
        const float* lnf = sl->lnf;
        k.submit(
            [&k, w, partial, lg, lnf, d, BT] { k.matmul_backward(partial, (*w)->g(0), nullptr, lg, lnf, (*w)->p(0), BT, d.C, d.V); });
      } else {
        // Each chunk's logits again, from the same product as forward's, into their gradient.
        const float dscale = logits_gradient_scale(host_, loss_divisor(loss_divisor_, BT));
        const size_t rows = d.loss_chunk(BT);
        for (size_t r0 = 0; r0 < BT; r0 += rows) {
          const size_t n = std::min(rows, BT - r0);
          float *lg = sc.logits, *dx = partial + r0 * C;
          const float* stats = sl->ce_stats + 3 * r0;
          const float* lnf = sl->lnf + r0 * C;
          const int32_t* ys = sl->targets + r0;
          k.submit([&k, w, lg, dx, lnf, stats, ys, dscale, d, n] {
            k.matmul_forward(lg, lnf, (*w)->p(0), nullptr, n, d.C, d.V);
            k.crossentropy_gradient(lg, ys, n, d.V, d.v_lo, dscale, stats);
            k.matmul_backward(dx, (*w)->g(0), nullptr, lg, lnf, (*w)->p(0), n, d.C, d.V);
          });
        }
      }
      g.reduce(partial, sc.dC, BT);
      release(k, w);
      host_.end_backward(head_, micro);
    }
    auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_backward(ln_f_, micro), true);
    const float *x = sl->resid[L], *mean = sl->lnf_mean, *rstd = sl->lnf_rstd;
    k.submit([&k, w, sc, x, mean, rstd, R, C, d] {
      if (d.llama) {
        k.rmsnorm_backward(sc.dresid, (*w)->g(0), sc.dC, x, (*w)->p(0), rstd, R, 1, C, C, false);
        return;
      }
      k.zero(sc.dresid, R * C);
      k.layernorm_backward(sc.dresid, (*w)->g(0), (*w)->g(1), sc.dC, x, (*w)->p(0), mean, rstd, R, C);
    });
    release(k, w);
    host_.end_backward(ln_f_, micro);
  }
  const gpt::ExpertGroup eg(experts_comm_, stream, s->exchange.get(), &s->exchange_events, d);
  const gpt::KvCache within = gpt::KvCache::within(sl->spans, d.probabilities);
  for (int l = hi - 1; l >= lo; --l) {
    // The layer's routing stays as the forward made it; recomputations count nothing again.
    const gpt::MoePass moe{config_.moe_layer(l), true, static_cast<float>(host_.loss_gradient_scale()), nullptr, sl->moe[l], &stream};
    // The gradient at the chunk's output arrived from the next stage: taken at the layer's first use.
    bool output_grad = l == hi - 1 && !heads;
    auto take_output_grad = [&] {
      if (!output_grad) return;
      output_grad = false;
      --s->in_flight;
      host_.device().copy(stream, sc.dresid, sl->dout[chunk], R * C * sizeof(float));
    };
    if (experts_[l] >= 0) {
      const auto& v = host_.begin_backward(experts_[l], micro);
      take_output_grad();
      auto we = bind(k, &s->wbuf, &s->gbuf, v, true);
      const LayerActs& a = acts(l);
      gpt::MoePass experts = moe;
      const int adapters = expert_lora_[l];
      if (adapters >= 0) {
        experts.lora = &s->expert_lora[l];
        const auto& sizes = s->expert_lora_sizes[l];
        k.submit([&k, grads = s->lora_grads, n = std::accumulate(sizes.begin(), sizes.end(), size_t{0})] { k.zero(grads, n); });
      }
      if (ckpt) gpt::moe_experts_forward(k, eg, we, d, a, sc, sl->moe_x[l], nullptr, nullptr, BT, experts);
      gpt::moe_experts_backward(k, eg, we, d, a, sc, g.gathered_rows(sc.dresid, sc.gathered, BT), BT, experts);
      release(k, we);
      host_.end_backward(experts_[l], micro);
      if (adapters >= 0) {
        // The experts' adapter gradients into their block, as a layer's (below).
        auto wl = bind(k, &s->wbuf, &s->gbuf, host_.begin_backward(adapters, micro), true);
        gpt::add_adapter_grads(k, wl, s->lora_grads, &s->expert_lora_sizes[l]);
        release(k, wl);
        host_.end_backward(adapters, micro);
      }
    }
    const auto& v = host_.begin_backward(layers_[l], micro);
    take_output_grad();
    restored(l);
    prefetch(l - 1);
    auto w = bind(k, &s->wbuf, &s->gbuf, v, true);
    const gpt::LayerLora* lora = lora_[l] >= 0 ? &s->lora[l] : nullptr;
    // The layer's backward adds its adapters' gradients from zero.
    if (lora != nullptr) k.submit([&k, grads = s->lora_grads, n = lora->floats()] { k.zero(grads, n); });
    if (ckpt) gpt::layer_forward(k, g, q, w, acts(l), sc, sl->resid[l], nullptr, B, T, within, moe, lora);
    gpt::layer_backward(k, g, q, w, acts(l), sc, sl->resid[l], B, T, moe, sl->spans, lora);
    release(k, w);
    host_.end_backward(layers_[l], micro);
    if (lora != nullptr) {
      auto wl = bind(k, &s->wbuf, &s->gbuf, host_.begin_backward(lora_[l], micro), true);
      gpt::add_adapter_grads(k, wl, s->lora_grads, &lora->sizes);
      release(k, wl);
      host_.end_backward(lora_[l], micro);
    }
  }
  if (embeds) {
    auto w = bind(k, &s->wbuf, &s->gbuf, host_.begin_backward(embed_, micro), true);
    const float* dout = g.gathered_rows(sc.dresid, sc.gathered, BT);
    const int32_t* ids = sl->tokens;
    k.submit([&k, w, dout, ids, d, B, T, runs = sl->runs] {
      if ((*w)->g(0) == nullptr) return;  // a frozen embedding: nothing before it takes a gradient
      float* dwpe = d.llama ? nullptr : (*w)->g(1);
      if (!runs) {
        const size_t shift = static_cast<size_t>(d.sq_rank) * T * d.C;
        return k.encoder_backward((*w)->g(0), dwpe != nullptr ? dwpe + shift : nullptr, dout, ids, B, T, d.C, d.v_lo, d.V);
      }
      for (const auto& [r0, n, p0] : *runs) {
        k.encoder_backward((*w)->g(0), dwpe != nullptr ? dwpe + static_cast<size_t>(p0) * d.C : nullptr,
                           dout + static_cast<size_t>(r0) * d.C, ids + r0, 1, n, d.C, d.v_lo, d.V);
      }
    });
    release(k, w);
    host_.end_backward(embed_, micro);
  } else {
    host_.device().copy(stream, sl->din[chunk], sc.dresid, R * C * sizeof(float));  // for the previous stage
  }
}

}  // namespace zeroth
