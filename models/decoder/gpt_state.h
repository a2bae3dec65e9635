// The GPT's state between calls (Gpt::State): the activation slots of the micro-batches in flight
// and the backward scratch, in one allocation laid out by reserve(). Internal to models/decoder:
// activations.cc sizes and lays it out, gpt_step.cc runs the passes over it.
#pragma once

#include <atomic>   // std::atomic
#include <cstdint>  // int32_t
#include <array>    // std::array
#include <deque>    // std::deque
#include <memory>   // std::unique_ptr
#include <vector>   // std::vector

#include "core/device.h"             // Buffer, Device, Stream
#include "models/decoder/gpt.h"      // Gpt, GptConfig, GptPart
#include "models/kernels/kernels.h"  // gpt::Kernels
#include "models/decoder/layers.h"   // gpt::Dims, gpt::LayerActs, gpt::Scratch
#include "models/decoder/lora.h"     // gpt::LayerLora

namespace zeroth {

using gpt::Dims;
using gpt::LayerActs;

// One micro-batch in flight: what its backward needs from its forward.
struct Slot {
  int B = 0, T = 0;
  int32_t *tokens = nullptr, *targets = nullptr;
  gpt::Spans spans;  // a packed micro-batch's samples (null: one a row), over the Ulysses group's rows
  gpt::Runs runs;    // the embedding's runs of this rank's rows (null: unpacked)
  // [L + 1] residual stream: resid[l] is block l's input (null where another rank holds the layer).
  // With cpu_checkpointing these alternate between two device buffers, and saved[l] (host memory)
  // keeps the first L - 1 for backward.
  std::vector<float*> resid, saved;
  std::vector<LayerActs> layer;  // [L], or [1] shared when checkpointing
  // Per layer, for expert layers this rank holds (null elsewhere): the routing on the host, and with
  // activation checkpointing the experts' input (without, it is the layer's ln2).
  std::vector<gpt::MoeActs*> moe;
  std::vector<float*> moe_x;
  // The head: ln_f's output (whole [BT, C]) and statistics (this rank's rows), the logits of this
  // rank's vocabulary slice (null where the loss runs by chunks: Dims::keeps_logits), and the loss's
  // per-row statistics (4 x BT: each chunk's 3 x rows of Kernels::crossentropy_*, then the rows' losses).
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
  Buffer buffer;                      // every activation slot and the backward scratch, one allocation (tag: activations)
  Buffer host_buffer;                 // with cpu_checkpointing: every slot's checkpoints, in host memory
  Buffer token_buffer;                // tokens and targets of every slot, on the device
  std::vector<Slot> slots;            // chunk c of micro-batch m uses slot m mod chunk_slots[c]
  std::vector<int> chunk_slots;       // per chunk: the slots holding its activations (the first ones)
  int in_flight = 0;                  // chunk forwards whose backward has not been enqueued
  gpt::Scratch d;                     // passes run one at a time: shared
  std::deque<gpt::MoeActs> moe_acts;  // the expert layers' routing on the host (Slot::moe)
  MoeStats moe_stats;                 // written by the stream's work, taken by Gpt::take_moe_stats
  // Ulysses' exchanges' time on the stream while timed (Gpt::time_exchanges), taken by
  // Gpt::take_exchange_seconds.
  bool time_exchanges = false;
  std::atomic<int64_t> exchange_nanos{0};
  Buffer wbuf, gbuf;  // f32 copies of a narrow block's parameters and gradients
  // Expert parallelism: the stream the all-to-alls run on under the experts' products (null: the
  // compute stream), and the events between the two.
  std::unique_ptr<Stream> exchange;
  // cpu_checkpointing: the stream that copies checkpoints back ahead of their block's backward, the
  // event of a working copy's last reader before it is overwritten, and each working copy's copy
  // done (gpt_step.cc).
  std::unique_ptr<Stream> restore_stream;
  std::unique_ptr<Event> copy_free;
  std::array<std::unique_ptr<Event>, 2> restored;
  std::vector<std::unique_ptr<Event>> exchange_events;
  // Ring attention (context_ring.h): the stream its sends run on, and the hand-overs' events.
  std::unique_ptr<Stream> ring_stream;
  std::array<std::unique_ptr<Event>, 3> ring_events;
  // Generation (decode.cc): every layer's cache of qkv rows [kv_len, W] end to end, then the
  // attention's scratch; kv_pos positions are in it.
  Buffer kv_buffer;
  int kv_len = 0, kv_pos = 0;
  // LoRA (lora.h): each owned layer's adapters in f32 (its adapter block's parameters end to end),
  // copied by the block's forward use and read by the layer's passes; one layer's adapter gradients,
  // added into the block by its backward use; each layer's view of both with the passes' scratch.
  std::vector<float*> lora_values;
  float* lora_grads = nullptr;
  std::vector<gpt::LayerLora> lora;
  // An expert layer's experts' adapters alike: their block's values in f32, and each local expert's
  // view (their gradients in lora_grads, added by the block's backward use after the experts').
  std::vector<float*> expert_lora_values;
  std::vector<std::vector<gpt::LayerLora>> expert_lora;
  std::vector<std::vector<size_t>> expert_lora_sizes;  // the block's parameters' sizes, every expert's in turn
  // LoRA's floats in the activation allocation: the adapters, one layer's gradients, the scratch.
  static size_t lora_floats(const GptConfig& c, const GptPart& part, size_t BT);
  gpt::KvCache kv(int layer) const;

  // LayerActs of one layer: ln1, ln2, res2 and the statistics this rank's rows; the rest in this
  // rank's heads and MLP width.
  static size_t layer_floats(const GptConfig& c, const Dims& d, size_t BT, size_t B, size_t T);
  // What a layer's attention keeps for backward (GptConfig::attention_probabilities).
  static size_t attention_floats(const GptConfig& c, const Dims& d, size_t B, size_t T);
  // The residual stream positions the part reads or writes: each chunk's [lo, hi].
  static std::vector<bool> resid_positions(const GptConfig& c, const GptPart& part);
  static size_t owned_layers(const GptPart& part);
  // The residual stream's copies on the device, and the checkpoints in host memory, per slot.
  static size_t resid_copies(const GptConfig& c, const GptPart& part);
  // Gradient ports per slot: a chunk's output gradient unless it ends the model, its input's
  // unless it starts it.
  static size_t port_count(const GptConfig& c, const GptPart& part);
  // The inputs of blocks 0 .. L-2: backward finds the last two (ln_f's and block L-1's) still in
  // the working copies.
  static size_t saved_count(const GptConfig& c);
  static size_t saved_floats(const GptConfig& c, const GptPart& part, int B, int T);
  static size_t slot_floats(const GptConfig& c, const GptPart& part, int B, int T);
  // The chunks slot i holds: those with more than i slots.
  static GptPart slot_part(const GptPart& part, const std::vector<int>& chunk_slots, int i);
  static size_t all_slots_floats(const GptConfig& c, const GptPart& part, const std::vector<int>& chunk_slots, int B, int T);
  // dresid (this rank's rows), dC, dqkv, dfch, datt (where the attention keeps its probabilities);
  // with sequence parallelism the partial sums, a
  // gathered gradient and a gathered LayerNorm output, whole.
  static size_t scratch_floats(const GptConfig& c, const GptPart& part, int B, int T);
  // Of all_slots_floats + scratch_floats: the expert layers' dispatched and received rows (each
  // layer's set, the backward's gradients at them, and with expert parallelism the all-to-alls'
  // outgoing and returning rows).
  static size_t expert_row_floats(const GptConfig& c, const GptPart& part, const std::vector<int>& chunk_slots, int B, int T);
  // On the caller's thread: a new shape waits for the stream to finish with the old buffers.
  void check_shape(int b, int t) const;
  void reserve(Stream& stream, int b, int t, const std::vector<int>& per_chunk, DType compute);
  // The layer whose activation set evaluation uses (nothing is kept for a backward).
  int eval_layer() const { return cfg.activation_checkpointing ? 0 : part.chunks.front()[0]; }
};

}  // namespace zeroth
