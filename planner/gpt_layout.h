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

// A GPT-2-style decoder: layers of attention and a 4h MLP, learned positions, the LM head tied to
// the token embedding.
struct GptShape {
  uint64_t layers = 0, hidden = 0, heads = 0, seq_len = 0, vocab = 0;

  // l (12 h^2 + 13 h) + V h + s h + 2 h: GPT-2 124M has 124,439,808.
  uint64_t params() const;
  uint64_t layer_params() const { return 12 * hidden * hidden + 13 * hidden; }
  // Megatron-LM's published shapes (Narayanan et al. 2021, Table 1: 1.7B ... 1T, vocabulary 51,200,
  // sequence 2048), the nearest by parameter count, with the layers scaled (to a multiple of 4) to
  // come close to `params`. What `--params` plans for when no dimensions are given.
  static GptShape from_params(uint64_t params, uint64_t seq_len = 2048, uint64_t vocab = 51200);
  std::string describe() const;  // "128 layers, hidden 25600, 160 heads, seq 2048, vocab 51200"
  // Empty when the shape is usable, else what is wrong with it.
  std::string problem() const;
};

enum class Checkpointing : uint8_t { none, selective, full };
std::string_view checkpointing_name(Checkpointing c);


struct Layout {
  uint64_t dp = 1, tp = 1, pp = 1;
  uint64_t micro_batch = 1, micro_batches = 1;  // per data-parallel rank: gradient accumulation
  int stage = 0;
  OffloadDevice offload_optimizer = OffloadDevice::none, offload_param = OffloadDevice::none;
  Checkpointing checkpointing = Checkpointing::none;
  bool sequence_parallel = false;
  PipeKind schedule = PipeKind::one_f_one_b;
  uint64_t gpus() const { return dp * tp * pp; }
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
// input, 2 s b h (/ t with sequence parallelism).
uint64_t layer_activation_bytes(const GptShape& shape, uint64_t micro_batch, uint64_t tp, bool sequence_parallel,
                                Checkpointing checkpointing);

LayoutMemory layout_memory(const GptShape& shape, const Layout& layout, const BufferSizes& buffers = {},
                           uint64_t runtime_bytes = kDeviceRuntimeBytes);

}  // namespace zeroth
