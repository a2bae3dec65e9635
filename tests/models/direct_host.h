// A BlockHost without an engine: it owns every parameter and gradient whole, in one dtype, on
// one device, so a model's forward and backward can be compared tensor by tensor with a reference.
#pragma once

#include <memory>
#include <set>
#include <string>
#include <vector>

#include "core/cpu/kernels.h"
#include "core/device.h"
#include "models/block_api.h"

namespace zeroth::testing {

class DirectHost final : public BlockHost {
 public:
  DirectHost(Device& device, DType dtype) : device_(device), dtype_(dtype) {}

  // One allocation per run of fused parameters (ParamSpec::fused_with_next), each parameter a view of it.
  int add_block(BlockSpec spec) override {
    Block b;
    const size_t width = dtype_size(dtype_);
    for (size_t first = 0; first < spec.params.size();) {
      size_t last = first, numel = spec.params[first].numel();
      while (spec.params[last].fused_with_next && last + 1 < spec.params.size()) numel += spec.params[++last].numel();
      b.param.push_back(device_.allocate(numel * width, MemTag::params));
      b.grad.push_back(device_.allocate(numel * width, MemTag::grads));
      device_.fill(device_.default_stream(), b.grad.back().view(dtype_), 0.0f);
      size_t at = 0;
      for (size_t i = first; i <= last; ++i) {
        const size_t n = spec.params[i].numel();
        b.views.params.push_back({static_cast<char*>(b.param.back().data()) + at * width, n, dtype_});
        b.views.grads.push_back({static_cast<char*>(b.grad.back().data()) + at * width, n, dtype_});
        at += n;
      }
      first = last + 1;
    }
    b.forward.params = b.views.params;
    b.spec = std::move(spec);
    blocks_.push_back(std::move(b));
    device_.default_stream().synchronize();
    return static_cast<int>(blocks_.size()) - 1;
  }
  void set_schedule(BlockSchedule) override {}
  const BlockViews& begin_forward(int b, int) override { return blocks_[b].forward; }
  void end_forward(int, int) override {}
  // A frozen block's backward gets its parameters and no gradient views, as the engine gives it.
  const BlockViews& begin_backward(int b, int) override { return frozen_.contains(b) ? blocks_[b].forward : blocks_[b].views; }
  void freeze(int b) { frozen_.insert(b); }
  void end_backward(int, int) override {}
  int micro_batches_in_flight() const override { return 1; }
  void begin_evaluation() override {}
  void end_evaluation() override {}
  Stream& compute_stream() override { return device_.default_stream(); }
  Device& device() override { return device_; }
  Buffer allocate_host(size_t bytes, MemTag tag) override {
    if (!host_) host_ = make_device("cpu");
    return host_->allocate(bytes, tag);
  }
  DType compute_dtype() const override { return dtype_; }
  double loss_gradient_scale() const override { return 1.0; }

  size_t blocks() const { return blocks_.size(); }
  const BlockSpec& spec(int b) const { return blocks_[b].spec; }
  void set_param(int b, size_t i, const std::vector<float>& values) {
    std::vector<char> narrow(values.size() * dtype_size(dtype_));
    cpu::cast(values.data(), DType::f32, narrow.data(), dtype_, values.size());
    device_.copy(device_.default_stream(), blocks_[b].views.params[i].data, narrow.data(), narrow.size());
    device_.default_stream().synchronize();
  }
  void zero_grads() {
    for (auto& b : blocks_)
      for (auto& g : b.grad) device_.fill(device_.default_stream(), g.view(dtype_), 0.0f);
    device_.default_stream().synchronize();
  }
  std::vector<float> values(int b, size_t i, bool grad) {
    const auto& v = grad ? blocks_[b].views.grads[i] : blocks_[b].views.params[i];
    std::vector<char> narrow(v.bytes());
    device_.copy(device_.default_stream(), narrow.data(), v.data, v.bytes());
    device_.default_stream().synchronize();
    std::vector<float> out(v.numel);
    cpu::cast(narrow.data(), v.dtype, out.data(), DType::f32, v.numel);
    return out;
  }

 private:
  struct Block {
    BlockSpec spec;
    std::vector<Buffer> param, grad;
    BlockViews views, forward;
  };
  Device& device_;
  std::unique_ptr<Device> host_;
  DType dtype_;
  std::vector<Block> blocks_;
  std::set<int> frozen_;
};

}  // namespace zeroth::testing
