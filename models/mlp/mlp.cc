// The MLP's forward and backward: sgemm per layer, element-wise loops for bias and tanh.
#include "models/mlp/mlp.h"


#include <cmath>   // std::tanh, std::sqrt
#include <string>  // std::to_string

#include "core/cpu/gemm.h"     // cpu::sgemm
#include "core/cpu/kernels.h"  // cpu::cast, cpu::axpy
#include "core/error.h"        // ZEROTH_CHECK

namespace zeroth {

struct Mlp::Scratch {
  std::vector<std::vector<float>> h;  // h[l]: the input of layer l, [batch, widths[l]]; h[L]: the output
  std::vector<float> g, g_next, w, dw;
};

namespace {

// The f32 values of a (possibly narrow) tensor: the tensor itself, or a converted copy in `tmp`.
const float* as_f32(TensorView v, std::vector<float>& tmp) {
  if (v.dtype == DType::f32) return v.as<float>();
  tmp.resize(v.numel);
  cpu::cast(v.data, v.dtype, tmp.data(), DType::f32, v.numel);
  return tmp.data();
}

}  // namespace

std::vector<BlockSpec> Mlp::block_specs(const MlpConfig& config) {
  ZEROTH_CHECK(config.widths.size() >= 2, "an MLP needs at least an input and an output width");
  std::vector<BlockSpec> out;
  for (size_t l = 0; l + 1 < config.widths.size(); ++l) {
    const int in = config.widths[l], o = config.widths[l + 1];
    ZEROTH_CHECK(in > 0 && o > 0, "MLP widths must be positive");
    out.push_back({"layer" + std::to_string(l),
                   {{"weight", {o, in}, InitRule::normal(1.0 / std::sqrt(in)), ParamRole::weight},
                    {"bias", {o}, InitRule::zeros(), ParamRole::bias}}});
  }
  return out;
}

Mlp::Mlp(BlockHost& host, MlpConfig config) : host_(host), config_(std::move(config)), scratch_(std::make_shared<Scratch>()) {
  ZEROTH_CHECK(host_.device().kind() == DeviceKind::cpu, "the MLP model runs on the CPU device only, not {}", host_.device().name());
  for (auto& spec : block_specs(config_)) blocks_.push_back(host_.add_block(std::move(spec)));
  scratch_->h.resize(layers() + 1);
}

void Mlp::forward_backward(const float* x, const float* target, int batch, float* loss, int micro) {
  ZEROTH_CHECK(batch > 0, "MLP micro-batch must have rows");
  // One set of activations: each micro-batch's backward must follow its forward.
  ZEROTH_CHECK(host_.micro_batches_in_flight() == 1,
               "the MLP keeps one micro-batch of activations; its host's pass order has {} in flight",
               host_.micro_batches_in_flight());
  const int L = layers();
  const auto& wd = config_.widths;
  auto s = scratch_;
  Stream& stream = host_.compute_stream();
  for (int l = 0; l < L; ++l) {
    const auto& v = host_.begin_forward(blocks_[l], micro);
    stream.enqueue_host([s, l, L, batch, x, in = wd[l], out = wd[l + 1], W = v.params[0], bias = v.params[1]] {
      if (l == 0) s->h[0].assign(x, x + static_cast<size_t>(batch) * in);
      std::vector<float> bias_tmp;
      const float* w = as_f32(W, s->w);
      const float* b = as_f32(bias, bias_tmp);
      auto& y = s->h[l + 1];
      y.resize(static_cast<size_t>(batch) * out);
      cpu::sgemm(false, true, batch, out, in, 1.0f, s->h[l].data(), in, w, in, 0.0f, y.data(), out);
      for (int i = 0; i < batch; ++i) {
        float* row = y.data() + static_cast<size_t>(i) * out;
        for (int j = 0; j < out; ++j) row[j] = l + 1 < L ? std::tanh(row[j] + b[j]) : row[j] + b[j];
      }
    });
    host_.end_forward(blocks_[l], micro);
  }
  const float scale = static_cast<float>(host_.loss_gradient_scale());
  stream.enqueue_host([s, L, batch, target, loss, out = wd[L], scale] {
    const auto& y = s->h[L];
    s->g.resize(y.size());
    double sum = 0;
    for (size_t k = 0; k < y.size(); ++k) {
      const float d = y[k] - target[k];
      sum += static_cast<double>(d) * d;
      s->g[k] = d * (scale / static_cast<float>(batch));
    }
    *loss = static_cast<float>(0.5 * sum / batch);
    (void)out;
  });
  for (int l = L - 1; l >= 0; --l) {
    const auto& v = host_.begin_backward(blocks_[l], micro);
    stream.enqueue_host([s, l, L, batch, in = wd[l], out = wd[l + 1], W = v.params[0], dW = v.grads[0], db = v.grads[1]] {
      // s->g is the gradient at this layer's output; through tanh first (the last layer is linear).
      if (l + 1 < L) {
        const auto& y = s->h[l + 1];
        for (size_t k = 0; k < s->g.size(); ++k) s->g[k] *= 1.0f - y[k] * y[k];
      }
      const float* g = s->g.data();
      if (dW.dtype == DType::f32) {
        cpu::sgemm(true, false, out, in, batch, 1.0f, g, out, s->h[l].data(), in, 1.0f, dW.as<float>(), in);
      } else {
        s->dw.resize(static_cast<size_t>(out) * in);
        cpu::sgemm(true, false, out, in, batch, 1.0f, g, out, s->h[l].data(), in, 0.0f, s->dw.data(), in);
        cpu::axpy(dW.data, dW.dtype, 1.0f, s->dw.data(), DType::f32, s->dw.size());
      }
      std::vector<float> dbias(out, 0.0f);
      for (int i = 0; i < batch; ++i) {
        for (int j = 0; j < out; ++j) dbias[j] += g[static_cast<size_t>(i) * out + j];
      }
      cpu::axpy(db.data, db.dtype, 1.0f, dbias.data(), DType::f32, out);
      if (l > 0) {
        const float* w = as_f32(W, s->w);
        s->g_next.resize(static_cast<size_t>(batch) * in);
        cpu::sgemm(false, false, batch, in, out, 1.0f, g, out, w, in, 0.0f, s->g_next.data(), in);
        s->g.swap(s->g_next);
      }
    });
    host_.end_backward(blocks_[l], micro);
  }
}

}  // namespace zeroth
