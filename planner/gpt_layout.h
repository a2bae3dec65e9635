// Memory of a GPT trained at scale, from its dimensions and a parallel layout, without building a
// model or a plan: the ZeRO paper's model states (estimate.h) over the data-parallel group of a
// (tensor, pipeline) coordinate, the communication and prefetch buffers, and the activations of
// Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large Transformer Models",
// section 4) for the pipeline stage that holds the most. `zeroth estimate --layers ...` prints it
// and `zeroth plan` searches over it. A training config is estimated from the engine's own plan
// instead (estimate.h), which counts what zeroth allocates to the byte.
#pragma once

#include <cstdint>  // uint64_t
#include <string>   // std::string

#include "engine/config/config.h"      // OffloadDevice
#include "engine/pipeline/schedule.h"  // PipeKind

namespace zeroth {

// A decoder's shape. By default GPT-2's: layers of attention and a 4h GELU MLP, biases and
// LayerNorms, learned positions, the LM head tied to the token embedding. llama() gives the Llama
// family's: grouped-query attention (kv_heads of heads' width), a SwiGLU MLP of `ffn`, RMSNorm
// weights and no biases, rotary positions, a tied or untied head.
struct GptShape {
  uint64_t layers = 0, hidden = 0, heads = 0, seq_len = 0, vocab = 0;
  uint64_t kv_heads = 0;  // 0: heads
  uint64_t ffn = 0;       // the MLP's width; 0: 4 hidden
  bool llama = false;
  bool tied = true;
  bool qkv_bias = false;  // a Llama's q, k and v biases (Qwen2's)
  // Mixture of experts (models/decoder's model.moe): every moe_every-th layer's MLP is `experts` MLPs of
  // expert_ffn (0: the MLP's width) behind a router of experts x hidden, each token meeting top_k.
  uint64_t experts = 0, top_k = 2, expert_ffn = 0, moe_every = 1;

  static GptShape llama_shape(uint64_t layers, uint64_t hidden, uint64_t heads, uint64_t kv_heads, uint64_t ffn, uint64_t seq_len,
                              uint64_t vocab, bool tied);
  uint64_t mlp_width() const { return ffn > 0 ? ffn : 4 * hidden; }
  uint64_t kv_width() const { return (kv_heads > 0 ? kv_heads : heads) * (hidden / heads); }

  // GPT-2: l (12 h^2 + 13 h) + V h + s h + 2 h (124M has 124,439,808). Llama: l (2 h^2 + 2 h kv +
  // 3 h ffn + 2 h) + V h (twice untied) + h (Llama 3 8B has 8,030,261,248).
  uint64_t params() const;
  uint64_t layer_params() const { return layer_matmul_params() + layer_vector_params(); }
  uint64_t layer_matmul_params() const { return attention_matmul_params() + mlp_matmul_params(mlp_width()); }
  uint64_t layer_vector_params() const;                                                               // norms and biases
  uint64_t attention_matmul_params() const { return 2 * hidden * hidden + 2 * hidden * kv_width(); }  // q, o; k, v
  // An MLP of `width`: up and down (and a Llama's gate), and GPT-2's two biases.
  uint64_t mlp_matmul_params(uint64_t width) const { return (llama ? 3 : 2) * hidden * width; }
  uint64_t mlp_params(uint64_t width) const { return mlp_matmul_params(width) + (llama ? 0 : width + hidden); }
  // One tensor-parallel slice of a layer: the matmuls and the column-parallel biases split, the
  // norms and the row-parallel biases whole.
  uint64_t layer_slice(uint64_t tp) const;

  // Expert layers: the layers l with (l + 1) a multiple of moe_every, as models/decoder places them.
  bool moe() const { return experts > 0; }
  uint64_t moe_layers() const { return moe() ? layers / moe_every : 0; }
  uint64_t expert_width() const { return expert_ffn > 0 ? expert_ffn : mlp_width(); }
  // One expert (its matmuls and, GPT-2's, biases): 2 h X + X + h, a Llama's 3 h X.
  uint64_t expert_params() const { return mlp_params(expert_width()); }
  uint64_t expert_matmul_params() const { return mlp_matmul_params(expert_width()); }
  // An expert layer without its experts: attention, norms, the router (E h); tensor-parallel
  // slices as layer_slice's, the router whole (models/decoder replicates router and experts over tp).
  uint64_t moe_layer_shared_params() const;
  uint64_t moe_layer_shared_slice(uint64_t tp) const;
  // Parameters a token meets: the dense ones and top_k experts of each expert layer.
  uint64_t active_params() const;
  // Matmul weights a token multiplies by in an expert layer (attention, router, top_k experts).
  uint64_t moe_layer_active_matmul() const;
  // Megatron-LM's published shapes (Narayanan et al. 2021, Table 1: 1.7B ... 1T, vocabulary 51,200,
  // sequence 2048), the nearest by parameter count, with the layers scaled (to a multiple of 4) to
  // come close to `params`. What `--params` plans for when no dimensions are given.
  static GptShape from_params(uint64_t params, uint64_t seq_len = 2048, uint64_t vocab = 51200);
  // "128 layers, hidden 25600, 160 heads, seq 2048, vocab 51200"; a Llama's adds its key/value
  // heads, MLP width and head.
  std::string describe() const;
  // Empty when the shape is usable, else what is wrong with it.
  std::string problem() const;
};

enum class Checkpointing : uint8_t { none, selective, full };
std::string_view checkpointing_name(Checkpointing c);


struct Layout {
  uint64_t dp = 1, tp = 1, pp = 1;
  uint64_t ep = 1;                              // expert parallelism: each expert layer's experts split over ep data-parallel ranks
  uint64_t micro_batch = 1, micro_batches = 1;  // per data-parallel rank: gradient accumulation
  int stage = 0;
  OffloadDevice offload_optimizer = OffloadDevice::none, offload_param = OffloadDevice::none;
  Checkpointing checkpointing = Checkpointing::none;
  bool sequence_parallel = false;
  PipeKind schedule = PipeKind::one_f_one_b;
  // Attention that keeps its s x s softmax tensors for backward (Korthikanti et al.'s count) instead
  // of each row's log-sum-exp (zeroth's blocked attention, as FlashAttention): layer_activation_bytes.
  bool attention_scores = false;
  // Ulysses (parallel.sequence): runs of sq of the dp ranks share each sample, s / sq positions each,
  // the attention's heads exchanged by all-to-alls; dp still counts every rank ZeRO shards over, and
  // dp / sq groups read different samples.
  uint64_t sq = 1;
  // The MLP by tiles (model.tiled_mlp: no layer keeps its intermediates) and, with full
  // recomputation, the layers' inputs in host memory (cpu_checkpointing: two working copies on the
  // device).
  bool tiled_mlp = false, host_checkpoints = false;
  // Ring attention (parallel.context): runs of cp of the dp ranks share each sample, two of its 2 cp
  // chunks each, keys and values sent round the run; one of sq and cp at a time.
  uint64_t cp = 1;
  uint64_t gpus() const { return dp * tp * pp; }
  uint64_t sample_ranks() const { return sq * cp; }
  uint64_t sample_groups() const { return dp / sample_ranks(); }
  std::string describe() const;
};

// DeepSpeed's bucket defaults, in elements (zero_optimization.reduce_bucket_size,
// stage3_prefetch_bucket_size, sub_group_size).
struct BufferSizes {
  uint64_t reduce_bucket = 500'000'000, prefetch_bucket = 50'000'000, sub_group = 1'000'000'000;
};

// Device memory a run needs beyond what it allocates for itself: the CUDA context, NCCL's and
// cuBLAS's workspaces (a stated constant, the default of layout_memory's `runtime_bytes`) and
// fragmentation of the caching allocator (a stated fraction of the rest).
inline constexpr uint64_t kDeviceRuntimeBytes = 1ull << 30;
inline constexpr double kFragmentation = 0.05;

struct LayoutMemory {
  // Per GPU of the pipeline stage that holds the most (the first with 1F1B: the embedding and
  // min(p, m) micro-batches of activations).
  uint64_t stage_params = 0;           // parameters that GPU's tensor-parallel slice of the stage holds
  uint64_t expert_params = 0;          // of which experts (its 1 / ep of the stage's, over dp / ep ranks)
  uint64_t model_states = 0;           // parameters, gradients and optimizer state on the device
  uint64_t activations = 0;            // Korthikanti's count for the layout's checkpointing
  uint64_t buffers = 0;                // reduce bucket, stage-3 gathered layer and prefetch bucket
  uint64_t allowance = 0;              // runtime constant + fragmentation
  uint64_t device = 0;                 // the sum: what must fit the device
  uint64_t host = 0, nvme = 0;         // per GPU: offloaded state, pinned swap buffers
  uint64_t in_flight = 0;              // micro-batches whose activations the stage holds at once
  uint64_t activations_per_layer = 0;  // one micro-batch, one layer
};

// Activation bytes of one transformer layer for one micro-batch (Korthikanti et al. 2022, 16-bit
// activations, 1-byte dropout masks): s b h (34 + 5 a s / h); with tensor parallelism t,
// s b h (10 + 24 / t + 5 a s / (h t)); with sequence parallelism s b h (34 + 5 a s / h) / t;
// selective recomputation drops the 5 a s / h term; full recomputation keeps only the layer's
// input, 2 s b h (/ t with sequence parallelism). A Llama layer, counted the same way without
// dropout: both norms' inputs and outputs (8 s b h, whole on every tensor-parallel rank), q and the
// attention output (4 s b h), k and v (4 s b kv), softmax's output (2 a s^2 b), the MLP's gate, up
// and their product (6 s b ffn).
// The 5 a s^2 b (a Llama's 2 a s^2 b) of softmax's tensors only with `attention_scores`: attention
// by blocks with an online softmax (zeroth's, FlashAttention) keeps each row's log-sum-exp, 4 a s b
// bytes (f32), in their place.
// A tiled MLP (`tiled_mlp`) keeps none of the MLP's intermediates (GPT-2's up projection and GELU
// outputs, 16 s b h; a Llama's gate, up and product, 6 s b ffn). With Ulysses pass the rank's
// s / sq positions in `shape`; the softmax tensors then count sq times: the rank's a / sq heads over
// all s positions, and the attention's output is kept twice (its heads' layout and the rows').
uint64_t layer_activation_bytes(const GptShape& shape, uint64_t micro_batch, uint64_t tp, bool sequence_parallel,
                                Checkpointing checkpointing, bool attention_scores = false, bool tiled_mlp = false, uint64_t sq = 1);
// An expert layer's, counted the same way: the dense MLP's intermediate activations (4 s b ffn of
// GPT-2's up projection and GELU, 6 s b ffn of a Llama's gate, up and product, split over tp)
// replaced by each routed row's, whole on every tensor-parallel rank: top_k s b rows of the
// dispatched input and the experts' output (4 top_k s b h) and of the expert's intermediates
// (4 or 6 top_k s b X), and with expert parallelism the rows received and sent back (4 top_k s b h).
// Full recomputation keeps the experts' input too (2 s b h).
uint64_t moe_layer_activation_bytes(const GptShape& shape, uint64_t micro_batch, uint64_t tp, bool sequence_parallel,
                                    Checkpointing checkpointing, uint64_t ep, bool attention_scores = false, uint64_t sq = 1);

LayoutMemory layout_memory(const GptShape& shape, const Layout& layout, const BufferSizes& buffers = {},
                           uint64_t runtime_bytes = kDeviceRuntimeBytes);

}  // namespace zeroth
