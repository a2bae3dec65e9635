// The GPT's block uses as kernel work and tensor-parallel collectives, in stream order (internal to
// models/decoder). Megatron-LM's split: QKV and MLP-up are column-parallel (each rank its heads and its
// quarter of the MLP), the attention output and MLP-down row-parallel (partial sums, reduced over
// the group), the token embedding and LM head vocabulary-parallel. Without sequence parallelism the
// residual stream is whole on every rank and a reduction is an all-reduce; with it, each rank holds
// its rows of the B x T tokens, a reduction is a reduce-scatter and the column-parallel inputs are
// all-gathered first. A group of one rank does no collective: the same code is the unsplit model.
#pragma once

#include <algorithm>   // std::min
#include <array>       // std::array
#include <cstddef>     // size_t
#include <cstdint>     // int32_t
#include <functional>  // std::function
#include <memory>      // std::shared_ptr, std::unique_ptr
#include <vector>      // std::vector

#include "comm/communicator.h"              // Communicator
#include "core/device.h"                    // Buffer, Stream, TensorView
#include "models/decoder/context_ring.h"    // ContextRing, RingScratch
#include "models/decoder/gpt.h"             // GptConfig, GptPart
#include "models/decoder/dims.h"            // Dims, PartBlocks
#include "models/decoder/lora.h"            // LayerLora, lora_forward, lora_backward
#include "models/decoder/sequence_group.h"  // SequenceGroup
#include "models/decoder/tensor_group.h"    // TensorGroup
#include "models/kernels/kernels.h"         // gpt::Kernels
#include "models/moe/dispatch.h"            // ExpertRows, ExpertGroup
#include "models/moe/router.h"              // gpt::Routing

namespace zeroth::gpt {

// What one transformer block keeps from forward for backward. The LayerNorms' outputs (ln1, ln2),
// their statistics and res2 are this rank's rows (all of them without sequence parallelism; with
// it, the LayerNorm outputs are gathered again where a product needs them whole, as Megatron-LM
// does); the rest is in this rank's heads and MLP width.
// The Llama family keeps no means (RMSNorm), and with per-head q/k norms the projections' q and k
// before them (qk_pre, the qkv rows' layout) and their statistics (qk_rstd: BT NH, then BT KVH).
// fch is MLP-up's output ([gate | up] for SwiGLU), fch_act its activation.
// In an expert layer moe_in holds the rows this rank's experts received (their inputs), fch and
// fch_act theirs, moe_out the outputs of this rank's own dispatched rows once back, and moe_row /
// moe_token / moe_weight the routing's arrays (ExpertRows numbering) on the device.

// An expert layer's routing of one micro-batch, on the host, from the layer's use to the experts'
// (and kept for backward).
struct MoeActs {
  Routing routing;
  ExpertRows rows;
  std::vector<float> logits, probs, dweight, dlogits;  // host copies: [BT, E], [BT, k], [BT, E]
};
// With Ulysses (Dims::sq > 1) qkv (and qk_pre, qk_rstd), att and atty are in the attention's heads
// layout (every position of the samples, this rank's heads: sequence_group.h), and atty_rows holds the
// attention's output back in this rank's rows, the output projection's input.
struct LayerActs {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_act;
  float* atty_rows = nullptr;
  float *qk_pre = nullptr, *qk_rstd = nullptr;
  float* lora_h = nullptr;      // LoRA: each product's A x, [BT, rows] after one another (lora.h)
  float* moe_lora_h = nullptr;  // the experts' adapters' A x for the received rows, alike
  float *moe_in = nullptr, *moe_out = nullptr, *moe_weight = nullptr;
  int32_t *moe_row = nullptr, *moe_token = nullptr;
};

// Scratch of the passes: the residual stream's gradient (this rank's rows), the per-kernel
// gradients of activations, and (sequence parallelism) whole [BT, C] buffers for partial sums, a
// gathered gradient and a gathered LayerNorm output.
// The Llama family adds the gradient at SwiGLU's output (dact), the q/k gradients before their
// norms (dqk, the qkv rows' layout) and the rotary table (not scratch: written once, read by both).
// Expert layers add the router's logits and their gradient, the gradients at the dispatched rows'
// outputs and inputs (moe_drows, moe_dinp) and the combine weights' gradient; with expert
// parallelism also the dispatched rows before they leave (moe_rows), the experts' outputs before
// they go back (moe_eout) and the gradients at the received rows' outputs and inputs (moe_erows,
// moe_einp). dfch and dact are sized for the received rows too.
// Ulysses adds the q, k, v rows before they leave and their gradient once back (sq_rows), the
// gradient at the attention's output in its heads (sq_datt), and the all-to-alls' buffers.
struct Scratch {
  float *dresid = nullptr, *dC = nullptr, *dqkv = nullptr, *dfch = nullptr, *datt = nullptr;
  float *sq_rows = nullptr, *sq_datt = nullptr, *sq_send = nullptr, *sq_recv = nullptr;
  float *mlp_fch = nullptr, *mlp_act = nullptr;  // a tile's MLP intermediates (Dims::mlp_tile_rows; dfch and dact a tile's then)
  float *partial = nullptr, *gathered = nullptr, *ln_whole = nullptr;
  float *dact = nullptr, *dqk = nullptr, *rope = nullptr;
  float* logits = nullptr;  // one chunk's logits, where the loss runs by chunks
  float *moe_logits = nullptr, *moe_dlogits = nullptr, *moe_drows = nullptr, *moe_dinp = nullptr, *moe_dweight = nullptr;
  float *moe_rows = nullptr, *moe_eout = nullptr, *moe_erows = nullptr, *moe_einp = nullptr;
  RingScratch ring{};  // ring attention's (Dims::ring_floats)
};

// What an expert layer's pass needs beyond its activations: whether this layer is one, the
// capacity factor of the pass (training's or evaluation's), the loss gradient's scale (for the
// auxiliary losses' gradients), where the routing's figures are added (null: not counted), the
// layer's routing on the host, and the stream the router waits on.
struct MoePass {
  bool expert_layer = false;
  bool training = true;
  float loss_scale = 1;
  MoeStats* stats = nullptr;
  MoeActs* acts = nullptr;
  Stream* stream = nullptr;
  const std::vector<LayerLora>* lora = nullptr;  // each local expert's adapters (null: none)
};

// A packed micro-batch's samples (Gpt::forward's positions): each span {first row, rows} of its
// B x T rows is one sample, which attends within itself and whose positions start at 0. Null: each
// of the B rows is one sequence of T.
using Spans = std::shared_ptr<const std::vector<std::array<int, 2>>>;
// The embedding's runs of rows {first row, rows, first position} over which positions rise by one
// (a packed micro-batch's samples, cut where a Ulysses rank's rows begin); null: every row of T from
// the rank's first position.
using Runs = std::shared_ptr<const std::vector<std::array<int, 3>>>;
// The samples of a packed micro-batch from its positions ([B, T], Gpt::forward's), or null when
// every row is one sequence of T (InvalidArgument for positions that do not rise by one or restart).
Spans spans_of(const int32_t* positions, int B, int T);
// The embedding's runs of a Ulysses rank's rows: T of each of the B rows of T ranks positions, from
// position rank T on (positions.cc).
Runs runs_of(const int32_t* positions, int B, int T, int ranks, int rank);
// A ring attention rank's runs: its two chunks of each sample's positions (context_ring.h).
Runs ring_runs(int B, int T, int ranks, int rank);

// Generation's key/value cache of one layer (Gpt::decode, one sequence): `rows` holds the qkv rows
// of positions [0, pos) from earlier passes; a pass writes its rows at [pos, pos + BT) and attends
// over [0, pos + BT); att is scratch of NH BT (pos + BT) floats (the CPU uses NH BT of them: each
// row's log-sum-exp). rows == nullptr: no cache, the micro-batch attends within itself (training
// and evaluation), within each of `spans` when it is packed (`probabilities`: Dims::probabilities).
struct KvCache {
  float* rows = nullptr;
  float* att = nullptr;
  int pos = 0;
  Spans spans;
  bool probabilities = false;
  // No cache: within the micro-batch, or its samples.
  static KvCache within(Spans spans, bool probabilities) {
    KvCache kv;
    kv.spans = std::move(spans), kv.probabilities = probabilities;
    return kv;
  }
};
// Rotary positions from each span's first row (a packed micro-batch), else from each row of T's.
void rope_rows(Kernels& k, const Spans& spans, float* x, const float* table, size_t BT, int T, size_t ld, int heads, int hs,
               bool inverse);
// The attention of a block use's qkv rows into a.atty, in stream work: within the micro-batch, or
// over the cache.
void attend(Kernels& k, const LayerActs& a, const KvCache& kv, int B, int T, int NH, int KVH, int hs, DType products);

// A block's parameters as f32 pointers, and where its backward adds gradients in f32, for the
// stream's work of one block use. For an f32 block these are the engine's own views; for bf16/f16
// the parameters are widened into scratch and the gradients gathered in f32 scratch, added into the
// narrow views once (flush). Made by the use's first piece of work, read by the next ones.
class Bound {
 public:
  Bound(Kernels& k, std::vector<TensorView> params, const std::vector<TensorView>* grads, const Buffer& wbuf, const Buffer& gbuf);
  Weight p(size_t i) const { return {p_[i], i < bf16_.size() ? bf16_[i] : nullptr}; }
  // Null for a block whose backward has no gradient views (a frozen block): its products and norms
  // then give their inputs' gradients only.
  float* g(size_t i) const { return has_grads_ ? g_[i] : nullptr; }
  // bf16 for a block of bf16 parameters: its attention's products go bf16 as its linear layers' do.
  DType attention_products() const { return !bf16_.empty() && bf16_[0] != nullptr ? DType::bf16 : DType::f32; }
  void flush() const;

 private:
  Kernels& k_;
  std::vector<TensorView> grads_;
  bool has_grads_ = false, narrow_ = false;
  std::vector<const float*> p_;
  std::vector<const uint16_t*> bf16_;  // the engine's bf16 parameters, where they are bf16
  std::vector<float*> g_;
};
using BoundRef = std::shared_ptr<std::shared_ptr<Bound>>;  // filled in stream order
// Ring attention's products' dtype, read from the block's binding in stream order.
ContextRing::Products products_of(BoundRef w);
// Parameter and gradient `i` of a bound block, null for one the block does not have (-1).
inline const float* param(const Bound& b, int i) { return i >= 0 ? b.p(static_cast<size_t>(i)) : nullptr; }
inline float* grad(const Bound& b, int i) { return i >= 0 ? b.g(static_cast<size_t>(i)) : nullptr; }

// A block's dense MLP (mlp_pass.cc): its parameters' indices in the block (-1: none; GPT-2's
// down-projection bias joins the output on tensor-parallel rank 0 only, its gradient on every rank),
// and its passes over the BT rows of x (the second norm's output, whole), whole or by tiles
// (Dims::mlp_tile_rows): out (null: a recomputation, keeping the intermediates for the backward
// where they are kept) gets the down-projection; dx the input's gradient from dout.
struct MlpIx {
  int up = 0, up_bias = -1, down = 0, down_bias = -1, down_bias_grad = -1;
};
void mlp_forward(Kernels& k, const Bound& p, const MlpIx& ix, const Dims& d, const LayerActs& a, const Scratch& s, const float* x,
                 float* out, size_t BT, const LayerLora* lora);
void mlp_backward(Kernels& k, const Bound& p, const MlpIx& ix, const Dims& d, const LayerActs& a, const Scratch& s, const float* x,
                  const float* dout, float* dx, size_t BT, const LayerLora* lora);

// In stream work: an adapter block's parameters as bound, into f32 `into` end to end (`sizes`
// each) for the passes that read them (lora.h); and the passes' gradients at `grads`, laid out
// alike, added into the block's.
void copy_adapters(Kernels& k, BoundRef w, float* into, const std::vector<size_t>* sizes);
void add_adapter_grads(Kernels& k, BoundRef w, const float* grads, const std::vector<size_t>* sizes);

// The passes of one block, enqueued piece by piece (Kernels::submit) around the groups' collectives:
// the tensor-parallel group's, and Ulysses' exchanges (`q`) around the attention, which then runs
// over the T q.sq positions of each sample (B, T: this rank's rows).
// `w` is filled by the caller's first piece. x: the block's input rows; out: its output rows, or
// null (recomputation before backward: only the activations are made).
// kv: generation's cache (positions start at kv.pos).
void layer_forward(Kernels& k, const TensorGroup& g, const SequenceGroup& q, BoundRef w, const LayerActs& a, const Scratch& s,
                   const float* x, float* out, int B, int T, KvCache kv = {}, const MoePass& moe = {},
                   const LayerLora* lora = nullptr);
// lora: the layer's adapters (null: none), added to its products' outputs.
// s.dresid holds the gradient at the block's output rows on entry and at its input rows on return.
void layer_backward(Kernels& k, const TensorGroup& g, const SequenceGroup& q, BoundRef w, const LayerActs& a, const Scratch& s,
                    const float* x, int B, int T, const MoePass& moe = {}, const Spans& spans = {}, const LayerLora* lora = nullptr);
// The scratch the attention's backward reads: s, with Ulysses the gradient at its output (s.dC, this
// rank's rows) exchanged into its heads first (s.sq_datt in dC's place).
Scratch attention_scratch(const SequenceGroup& q, const Scratch& s, int B, int T);
// The attention's backward (s.dC at its output into s.dqkv) within each span, or over the micro-batch.
void attention_backward_rows(Kernels& k, const Spans& spans, const LayerActs& a, const Scratch& s, int B, int T, int NH, int KVH,
                             int hs, bool probabilities, DType products);
// The same for the Llama family (llama_layer.cc); layer_forward and layer_backward call them.
void llama_layer_forward(Kernels& k, const TensorGroup& g, const SequenceGroup& q, BoundRef w, const LayerActs& a, const Scratch& s,
                         const float* x, float* out, int B, int T, KvCache kv, const MoePass& moe, const LayerLora* lora);
void llama_layer_backward(Kernels& k, const TensorGroup& g, const SequenceGroup& q, BoundRef w, const LayerActs& a, const Scratch& s,
                          const float* x, int B, int T, const MoePass& moe, const Spans& spans, const LayerLora* lora);

// An expert layer's MLP (moe/experts.cc), for both architectures, in two block uses. The layer's use
// ends with the router (parameter `router` of its block): moe_router_forward multiplies the BT rows
// of `inp` by it, waits for the stream and routes on the caller's thread into pass.acts (the
// experts' row counts size the products and the all-to-alls, as in Megatron's dropless path).
// The experts' use (the block of this rank's experts) runs moe_experts_forward: each choice's row
// to its expert's rank, each expert's MLP, the outputs back, and their weighted sum plus `resid`
// into `out` (null when recomputing: the activations only).
// Backward: moe_experts_backward takes the gradient at the output (`dout`), leaves the one at each
// dispatched row in s.moe_dinp and the combine weights' on the host, adding the experts' gradients;
// then, in the layer's use, moe_router_backward writes the gradient at `inp` into `dinp` (the
// router's and the rows') and adds the router's.
void moe_router_forward(Kernels& k, BoundRef w, int router, const Dims& d, const Scratch& s, const float* inp, size_t BT,
                        const MoePass& pass);
void moe_experts_forward(Kernels& k, const ExpertGroup& g, BoundRef w, const Dims& d, const LayerActs& a, const Scratch& s,
                         const float* inp, float* out, const float* resid, size_t BT, const MoePass& pass);
void moe_experts_backward(Kernels& k, const ExpertGroup& g, BoundRef w, const Dims& d, const LayerActs& a, const Scratch& s,
                          const float* dout, size_t BT, const MoePass& pass);
void moe_router_backward(Kernels& k, BoundRef w, int router, const Dims& d, const LayerActs& a, const Scratch& s, const float* inp,
                         float* dinp, size_t BT, const MoePass& pass);

}  // namespace zeroth::gpt
