// The GPT's block uses as kernel work and tensor-parallel collectives, in stream order (internal to
// models/decoder). Megatron-LM's split: QKV and MLP-up are column-parallel (each rank its heads and its
// quarter of the MLP), the attention output and MLP-down row-parallel (partial sums, reduced over
// the group), the token embedding and LM head vocabulary-parallel. Without sequence parallelism the
// residual stream is whole on every rank and a reduction is an all-reduce; with it, each rank holds
// its rows of the B x T tokens, a reduction is a reduce-scatter and the column-parallel inputs are
// all-gathered first. A group of one rank does no collective: the same code is the unsplit model.
#pragma once

#include <algorithm>   // std::min
#include <cstddef>     // size_t
#include <cstdint>     // int32_t
#include <functional>  // std::function
#include <memory>      // std::shared_ptr, std::unique_ptr
#include <vector>      // std::vector

#include "comm/communicator.h"       // Communicator
#include "core/device.h"             // Buffer, Stream, TensorView
#include "models/decoder/gpt.h"      // GptConfig, GptPart
#include "models/kernels/kernels.h"  // gpt::Kernels
#include "models/moe/router.h"       // gpt::MoeGate, gpt::Routing

namespace zeroth::gpt {

// The part, or the whole model (keeping the part's tensor-parallel place) when it names no chunk.
GptPart complete_part(const GptPart& part, const GptConfig& config);
// The part's block ids: the embedding (or the head's copy), each layer's (-1 elsewhere), ln_f.
struct PartBlocks {
  int embed = -1, ln_f = -1, head = -1;  // head: the embedding's block when tied
  std::vector<int> layers;
  std::vector<int> experts;  // each expert layer's experts (right after its layer), -1 elsewhere
};
PartBlocks part_blocks(const GptConfig& config, const GptPart& part);

// A rank's widths: C channels in the residual stream, its query heads (NH) and key/value heads (KVH)
// of hs channels, the attention's output width (Cq = NH hs) and its qkv rows' (W = (NH + 2 KVH) hs),
// its MLP width (F), its vocabulary rows [v_lo, v_lo + V); and the architecture's switches.
struct Dims {
  int C = 0, NH = 0, KVH = 0, hs = 0, Cq = 0, W = 0, F = 0, v_lo = 0, V = 0;
  int tp = 1, tp_rank = 0;
  // Expert layers: the gate, each expert's MLP width (X), and the capacities' factors; expert
  // parallelism: this rank's place in the group of `ep` ranks that share the experts out (rank p
  // holds experts [p n, (p + 1) n), n = local_experts()).
  MoeGate gate;
  int X = 0, min_capacity = 0;
  double capacity_factor = 1, eval_capacity_factor = 1;
  bool moe = false;
  int ep = 1, ep_rank = 0;
  size_t ep_group_tokens = 0;  // GptPart::ep_group_tokens
  int local_experts() const { return gate.experts / ep; }
  // SwiGLU experts' up-projection width.
  int expert_up() const { return llama ? 2 * X : X; }
  // The most rows this rank dispatches for BT tokens of its own (every choice, or the experts'
  // capacities at the larger of the two factors), and the most its experts can receive from the
  // group (each rank's rows for them, the worst case being all of them).
  size_t moe_rows(size_t BT) const;
  size_t moe_expert_rows(size_t BT) const;
  // Floats only the all-to-alls need (expert parallelism): the rows on their way out, the experts'
  // outputs on their way back, the gradients at the received rows and at the experts' inputs.
  size_t moe_exchange_floats(size_t BT) const {
    return moe && ep > 1 ? (moe_rows(BT) + 3 * moe_expert_rows(BT)) * static_cast<size_t>(C) : 0;
  }
  int loss_rows = 0;  // GptConfig::loss_chunk_rows
  // Tokens per chunk of the LM head and loss, and whether the logits are kept whole instead.
  size_t loss_chunk(size_t BT) const { return loss_rows > 0 ? std::min<size_t>(loss_rows, BT) : BT; }
  bool keeps_logits() const { return loss_rows == 0; }
  bool sp = false;  // sequence parallel (with tp > 1)
  bool llama = false, qkv_bias = false, o_bias = false, qk_norm = false;
  float eps = 1e-5f;
  static Dims of(const GptConfig& config, const GptPart& part);
  // MLP-up's output width: gate and up (SwiGLU), or the GELU's input.
  int up() const { return llama ? 2 * F : F; }
  // Rows of the residual stream this rank holds of a micro-batch of BT tokens.
  size_t rows(size_t BT) const { return sp ? BT / tp : BT; }
  // Where this rank's rows start in a whole [BT, C] buffer.
  size_t row_offset(size_t BT) const { return sp ? tp_rank * rows(BT) * C : 0; }
};

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
//
// The dispatched rows are numbered by local expert slot, then by the rank holding it (slot j of
// rank p is expert p n + j): each slot's rows go to the ranks as one contiguous run per rank, and
// arrive as one contiguous run per slot. With one rank this is the experts' own order.
struct ExpertRows {
  std::vector<int32_t> row, row_token;  // the routing's, renumbered
  std::vector<size_t> sent;             // [slot x ep + peer]: rows sent to that peer's slot
  std::vector<size_t> received;         // [slot x ep + peer]: rows that peer sent to this rank's slot
  size_t sent_total() const;
  size_t received_total() const;
  size_t received_in(int slot, int ep) const;  // this rank's rows of one slot, from every peer
  ExpertRows(const Routing& routing, int ep);
  ExpertRows() = default;
};
// An expert layer's routing of one micro-batch, on the host, from the layer's use to the experts'
// (and kept for backward).
struct MoeActs {
  Routing routing;
  ExpertRows rows;
  std::vector<float> logits, probs, dweight, dlogits;  // host copies: [BT, E], [BT, k], [BT, E]
};
struct LayerActs {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_act;
  float *qk_pre = nullptr, *qk_rstd = nullptr;
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
struct Scratch {
  float *dresid = nullptr, *dC = nullptr, *dqkv = nullptr, *dfch = nullptr, *datt = nullptr;
  float *partial = nullptr, *gathered = nullptr, *ln_whole = nullptr;
  float *dact = nullptr, *dqk = nullptr, *rope = nullptr;
  float* logits = nullptr;  // one chunk's logits, where the loss runs by chunks
  float *moe_logits = nullptr, *moe_dlogits = nullptr, *moe_drows = nullptr, *moe_dinp = nullptr, *moe_dweight = nullptr;
  float *moe_rows = nullptr, *moe_eout = nullptr, *moe_erows = nullptr, *moe_einp = nullptr;
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
};

// The expert-parallel group's all-to-alls, one per local expert slot each way (each slot's rows from
// every rank land together, so an expert multiplies one run). On a stream of their own (`exchange`)
// they run under the products: the later slots' rows arrive while slot j's expert computes, and once
// every slot's rows are in, each slot's results leave as they are made; without one they run in turn
// on the compute stream.
// One rank: the rows stay where they are (the caller passes the same buffers both ways).
class ExpertGroup {
 public:
  // `events` (grown here) order the two streams; the group's passes reuse them.
  ExpertGroup(Communicator* comm, Stream& compute, Stream* exchange, std::vector<std::unique_ptr<Event>>* events, const Dims& dims)
      : comm_(comm), compute_(compute), exchange_(exchange), events_(events), dims_(dims) {}
  // Rows [at, at + n) of the received rows of local slot j.
  using SlotWork = std::function<void(int j, size_t at, size_t n)>;
  struct Trip {
    const float* send;  // this rank's rows [rows.sent_total(), C], ExpertRows order
    float* recv;        // the rows its experts receive (room for `room` rows)
    size_t room;
    const float* results;  // the experts' results at the received rows
    float* back;           // the results of this rank's rows, in `send`'s order
  };
  // One round trip: the rows out; `slot` enqueues slot j's compute work once its rows are in (and
  // before its results leave); `after` enqueues compute work that needs no exchange, under the
  // results' return; later compute work sees `back` complete. With record_counts (a layer's
  // forward) what came from whom is kept in rows.received; otherwise (recomputation, backward) it
  // is checked to be the same.
  void round_trip(ExpertRows& rows, bool record_counts, const Trip& t, const SlotWork& slot, const std::function<void()>& after) const;

 private:
  Event& event(size_t i) const;
  void hand_over(Stream& from, Stream& to) const;
  // round_trip's exchanges and the compute work between them, from the rows made to the results back.
  void exchange(ExpertRows& rows, bool record_counts, const Trip& t, const SlotWork& slot, const std::function<void()>& after) const;

  Communicator* comm_;
  Stream& compute_;
  Stream* exchange_;
  std::vector<std::unique_ptr<Event>>* events_;
  Dims dims_;
};

// Generation's key/value cache of one layer (Gpt::decode, one sequence): `rows` holds the qkv rows
// of positions [0, pos) from earlier passes; a pass writes its rows at [pos, pos + BT) and attends
// over [0, pos + BT); att is scratch of NH BT (pos + BT) floats (the CPU uses NH BT of them: each
// row's log-sum-exp). rows == nullptr: no cache, the
// micro-batch attends within itself (training and evaluation).
struct KvCache {
  float* rows = nullptr;
  float* att = nullptr;
  int pos = 0;
};
// The attention of a block use's qkv rows into a.atty, in stream work: within the micro-batch, or
// over the cache.
void attend(Kernels& k, const LayerActs& a, const KvCache& kv, int B, int T, int NH, int KVH, int hs, DType products);

// The collectives of a block use, enqueued on the compute stream between the kernels' work.
class TensorGroup {
 public:
  TensorGroup(Communicator* comm, Stream& stream, const Dims& dims) : comm_(comm), stream_(stream), dims_(dims) {}
  // Partial sums [BT, C] in `partial` become their sum: in `partial` (all-reduce), or this rank's
  // rows of it in `rows` (reduce-scatter, sequence parallel).
  void reduce(float* partial, float* rows, size_t BT) const;
  // Sequence parallel: the ranks' rows of `whole` [BT, C] (this rank's already in place) gathered.
  void gather(float* whole, size_t BT) const;
  // This rank's rows of a gradient at `rows` gathered into `whole` (the same pointer without
  // sequence parallelism, where every rank holds every row): the input of the row-parallel
  // linears' backward.
  const float* gathered_rows(const float* rows, float* whole, size_t BT) const;
  void all_reduce(float* x, size_t n, ReduceOp op) const;
  // A whole [BT, C] that every rank computed alike (not a partial sum): this rank's rows of it in
  // `rows` (sequence parallel), or already in place (the same pointer).
  void keep_rows(const float* whole, float* rows, size_t BT) const;
  const Dims& dims() const { return dims_; }

 private:
  Communicator* comm_;
  Stream& stream_;
  Dims dims_;
};

// A block's parameters as f32 pointers, and where its backward adds gradients in f32, for the
// stream's work of one block use. For an f32 block these are the engine's own views; for bf16/f16
// the parameters are widened into scratch and the gradients gathered in f32 scratch, added into the
// narrow views once (flush). Made by the use's first piece of work, read by the next ones.
class Bound {
 public:
  Bound(Kernels& k, std::vector<TensorView> params, const std::vector<TensorView>* grads, const Buffer& wbuf, const Buffer& gbuf);
  Weight p(size_t i) const { return {p_[i], i < bf16_.size() ? bf16_[i] : nullptr}; }
  float* g(size_t i) const { return g_[i]; }
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

// The passes of one block, enqueued piece by piece (Kernels::submit) around the group's collectives.
// `w` is filled by the caller's first piece. x: the block's input rows; out: its output rows, or
// null (recomputation before backward: only the activations are made).
// kv: generation's cache (positions start at kv.pos).
void layer_forward(Kernels& k, const TensorGroup& g, BoundRef w, const LayerActs& a, const Scratch& s, const float* x, float* out,
                   int B, int T, KvCache kv = {}, const MoePass& moe = {});
// s.dresid holds the gradient at the block's output rows on entry and at its input rows on return.
void layer_backward(Kernels& k, const TensorGroup& g, BoundRef w, const LayerActs& a, const Scratch& s, const float* x, int B, int T,
                    const MoePass& moe = {});
// The same for the Llama family (llama_layer.cc); layer_forward and layer_backward call them.
void llama_layer_forward(Kernels& k, const TensorGroup& g, BoundRef w, const LayerActs& a, const Scratch& s, const float* x,
                         float* out, int B, int T, KvCache kv, const MoePass& moe);
void llama_layer_backward(Kernels& k, const TensorGroup& g, BoundRef w, const LayerActs& a, const Scratch& s, const float* x, int B,
                          int T, const MoePass& moe);

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
