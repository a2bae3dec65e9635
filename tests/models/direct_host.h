// A BlockHost without an engine: it owns every parameter and gradient whole, in one dtype, so a
// model's forward and backward can be compared tensor by tensor with a reference.
#pragma once

#include <string>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/device.h"
#include "models/block_api.h"

namespace zeroth::testing {

class DirectHost final : public BlockHost {
 public:
  DirectHost(Device& device, DType dtype) : device_(device), dtype_(dtype) {}

  int add_block(BlockSpec spec) override {
    Block b;
    for (const auto& p : spec.params) {
      b.param.emplace_back(p.numel() * dtype_size(dtype_), 0);
      b.grad.emplace_back(p.numel() * dtype_size(dtype_), 0);
    }
    for (size_t i = 0; i < spec.params.size(); ++i) {
      b.views.params.push_back({b.param[i].data(), spec.params[i].numel(), dtype_});
      b.views.grads.push_back({b.grad[i].data(), spec.params[i].numel(), dtype_});
    }
    b.spec = std::move(spec);
    blocks_.push_back(std::move(b));
    return static_cast<int>(blocks_.size()) - 1;
  }
  void set_schedule(BlockSchedule) override {}
  const BlockViews& begin_forward(int b) override { return forward_views(b); }
  void end_forward(int) override {}
  const BlockViews& begin_backward(int b) override { return blocks_[b].views; }
  void end_backward(int) override {}
  void begin_evaluation() override {}
  void end_evaluation() override {}
  Stream& compute_stream() override { return device_.default_stream(); }
  Device& device() override { return device_; }
  DType compute_dtype() const override { return dtype_; }
  double loss_scale() const override { return 1.0; }

  size_t blocks() const { return blocks_.size(); }
  const BlockSpec& spec(int b) const { return blocks_[b].spec; }
  void set_param(int b, size_t i, const std::vector<float>& values) {
    cpu::cast(values.data(), DType::f32, blocks_[b].param[i].data(), dtype_, values.size());
  }
  std::vector<float> values(int b, size_t i, bool grad) const {
    const auto& v = grad ? blocks_[b].views.grads[i] : blocks_[b].views.params[i];
    std::vector<float> out(v.numel);
    cpu::cast(v.data, v.dtype, out.data(), DType::f32, v.numel);
    return out;
  }
  void zero_grads() {
    for (auto& b : blocks_) {
      for (auto& g : b.grad) std::fill(g.begin(), g.end(), 0);
    }
  }

 private:
  struct Block {
    BlockSpec spec;
    std::vector<std::vector<char>> param, grad;
    BlockViews views, forward;
  };
  const BlockViews& forward_views(int b) {
    blocks_[b].forward.params = blocks_[b].views.params;
    return blocks_[b].forward;
  }
  Device& device_;
  DType dtype_;
  std::vector<Block> blocks_;
};

}  // namespace zeroth::testing
