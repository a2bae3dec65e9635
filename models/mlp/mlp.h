// A multi-layer perceptron on the block API: one block per layer (weight [out, in], bias [out]),
// tanh between layers, and the squared-error loss 0.5 * mean over the batch of ||y - target||^2.
// Small enough for exact references, and with real GEMMs (OpenBLAS) for the engine benchmark.
// CPU device only: its kernels run on the host, in stream order, through enqueue_host.
#pragma once

#include <memory>  // std::shared_ptr
#include <vector>  // std::vector

#include "models/block_api.h"  // BlockHost

namespace zeroth {

struct MlpConfig {
  std::vector<int> widths;  // inputs, hidden..., outputs: widths.size() - 1 layers
};

class Mlp {
 public:
  // Registers the layers as blocks "layer0", "layer1", ...; weights start normal(0, 1/sqrt(in)),
  // biases at zero and without weight decay.
  Mlp(BlockHost& host, MlpConfig config);
  // The blocks the constructor registers (for plans made without a host).
  static std::vector<BlockSpec> block_specs(const MlpConfig& config);

  // Enqueues micro-batch `micro` of the cycle (forward over the blocks, then backward) of `batch`
  // rows on the host's compute stream. x is [batch, inputs], target [batch, outputs]; both must
  // stay valid, and *loss is written, when the stream gets there.
  void forward_backward(const float* x, const float* target, int batch, float* loss, int micro = 0);

  int layers() const { return static_cast<int>(config_.widths.size()) - 1; }

 private:
  struct Scratch;  // activations and f32 copies of narrow weights, touched by the stream only
  BlockHost& host_;
  MlpConfig config_;
  std::vector<int> blocks_;
  std::shared_ptr<Scratch> scratch_;
};

}  // namespace zeroth
