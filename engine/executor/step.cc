// The executor's step phase: the norm, the update of the sub-groups (speculative during the backward
// pass, or delayed under the next cycle), clearing, and the post-step gathers.
#include <algorithm>  // std::min, std::max
#include <array>      // std::array
#include <optional>   // std::optional

#include "core/cpu/kernels.h"  // cpu::cast
#include "core/error.h"        // ZEROTH_CHECK
#include "engine/executor/executor.h"
#include "optim/optimizer.h"  // cpu_optimizer_step, cuda_optimizer_step

namespace zeroth {
void Executor::wait_for_reductions() {
  Stream& cs = compute_stream();
  if (reduced_) cs.wait(*reduced_);
  cs.synchronize();
}

void Executor::tie_gradients() {
  if (plan_.tied_block < 0 || plan_.blocks[plan_.tied_block].frozen) return;  // a frozen pair has no gradients
  Stream& cs = compute_stream();
  const int b = plan_.tied_block;
  const OwnedRange& r = plan_.range(StateKind::grad_shard, b);
  if (on_device(r.buffer)) {
    links_.tied->all_reduce(cs, view(StateKind::grad_shard, b), ReduceOp::sum);
    return;
  }
  // Offloaded (host memory or a swap file): through the device, synchronously, and the squares the
  // bucket's gradients left on their way to the host corrected by what changed.
  if (reduced_) reduced_->synchronize();
  std::vector<float> values(r.numel());
  read_owned(r, values.data());
  // The squares the bucket counted (none when the other copy counts the pair).
  auto counted_squares = [&] {
    double sum = 0;
    for (const auto& [lo, hi] : plan_.counted_in_norm(b)) sum += cpu::sum_squares(values.data() + lo, DType::f32, hi - lo);
    return sum;
  };
  const double before = counted_squares();
  const TensorView staging = buffer_view(plan_.tie_staging);
  device_.copy(cs, staging.data, values.data(), staging.bytes());
  links_.tied->all_reduce(cs, staging, ReduceOp::sum);
  device_.copy(cs, values.data(), staging.data, staging.bytes());
  cs.synchronize();
  write_owned(r, values.data());
  bucket_sumsq_[plan_.blocks[b].reduce_bucket] += counted_squares() - before;
}

void Executor::bucket_sum_squares(int bucket, float* out, bool accumulate) {
  Stream& cs = compute_stream();
  const TensorView grads = reduced_grads(bucket);
  if (plan_.bucket_fully_counted(bucket)) {
    device_.sum_squares(cs, grads, out, accumulate);
    return;
  }
  // Without what another rank counts: the tied copy, replicated tensor-parallel parameters.
  for (const auto& [lo, hi] : plan_.bucket_counted_in_norm(bucket)) {
    device_.sum_squares(cs, grads.slice(lo, hi - lo), out, accumulate);
    accumulate = true;
  }
  if (!accumulate) device_.fill(cs, {out, 1, DType::f32}, 0.0f);
}

double Executor::grad_norm() {
  Stream& cs = compute_stream();
  if (reduced_) cs.wait(*reduced_);
  tie_gradients();
  const TensorView scalar = buffer_view(plan_.scalar);
  // Offloaded gradients left their buckets' squares on the host; they add up in f32 in bucket
  // order, as the device's sum_squares accumulates (buckets kept on the device, with
  // offload_optimizer.ratio < 1, bring theirs over one by one).
  const bool on_host = plan_.device_buckets < static_cast<int>(plan_.reduce_buckets.size());
  if (on_host && reduced_) reduced_->synchronize();
  check_io();  // the gradients' way to their file, and the last step's swaps
  bool first = true, over_ranks = false, kept = false;
  float host = 0;
  for (const auto& a : plan_.step_program) {
    const auto* norm = a.as<op::GradNorm>();
    if (norm == nullptr) continue;
    if (!plan_.bucket_offloaded(norm->bucket)) {
      // The device's buckets lead the order: their partial sum comes to the host once.
      bucket_sum_squares(norm->bucket, scalar.as<float>(), !first);
      kept = true;
    } else {
      if (kept) {
        device_.copy(cs, &host, scalar.data, sizeof(float));
        cs.synchronize();
        kept = false;
      }
      const auto s = static_cast<float>(bucket_sumsq_[norm->bucket]);
      host = first ? s : host + s;
    }
    over_ranks = over_ranks || norm->sum_over_ranks;
    first = false;
  }
  if (on_host) device_.copy(cs, scalar.data, &host, sizeof(float));
  if (first) device_.fill(cs, scalar, 0.0f);  // no bucket: every block frozen (a frozen pipeline stage)
  if (over_ranks) step_comm_->all_reduce(cs, scalar, ReduceOp::sum);
  if (links_.stages != nullptr) links_.stages->all_reduce(cs, scalar, ReduceOp::sum);
  if (links_.tensor != nullptr) links_.tensor->all_reduce(cs, scalar, ReduceOp::sum);
  float sumsq = 0;
  device_.copy(cs, &sumsq, scalar.data, sizeof(float));
  cs.synchronize();
  return sumsq;
}

TensorView Executor::reduced_grads(int bucket) const {
  const auto& blocks = plan_.reduce_buckets[bucket].blocks;
  const auto& first = plan_.range(StateKind::grad_shard, blocks.front());
  size_t n = 0;
  for (int b : blocks) n += plan_.range(StateKind::grad_shard, b).numel();
  return {at(first, first.lo), n, DType::f32};
}

void Executor::launch_update(const std::optional<UpdateArgs>& args) {
  Stream& cs = compute_stream();
  for (const auto& a : plan_.step_program) {
    if (const auto* z = a.as<op::Zero>()) device_.fill(cs, buffer_view(z->buffer), 0.0f);
    if (!args) continue;
    // The gradients are read by the swap-in from their file, or by the update from host memory.
    if (const auto* in = a.as<op::SwapIn>()) {
      swap_in(in->sub_group, in->slot);
      grads_read_[in->sub_group]->record(*swap_in_stream_);
    }
    if (const auto* u = a.as<op::Update>()) {
      update(u->sub_group, u->slot, *args);
      if (plan_.swap_slots < 0) grads_read_[u->sub_group]->record(*update_stream_);
    }
    if (const auto* out = a.as<op::SwapOut>()) swap_out(out->sub_group, out->slot);
  }
  pending_ = pending_ || args.has_value();
}

void Executor::publish_update() {
  Stream& gs = *gather_stream_;
  // The uploads follow the update on its stream; the gathers wait for them, and for what the
  // compute stream wrote.
  for (const auto& a : plan_.step_program) {
    if (const auto* up = a.as<op::Upload>(); up != nullptr && pending_) upload(up->sub_group, up->slot);
  }
  gs.wait(*record(compute_stream()));
  gs.wait(*record(*update_stream_));
  for (const auto& a : plan_.step_program) {
    if (const auto* g = a.as<op::AllGather>(); g && pending_) all_gather(g->bucket);
  }
  pending_ = false;
}

void Executor::settle() {
  // Published by sub-group, the sweep may still run under the next cycle; between cycles the state
  // is read and written whole.
  if (plan_.publish_by_sub_group && update_stream_) {
    update_stream_->synchronize();
    check_io();
  }
  if (!pending_) return;
  publish_update();
  Stream& cs = compute_stream();
  cs.wait(*record(*gather_stream_));
  cs.synchronize();
  check_io();
}

Speculation Executor::finish_step(const std::optional<UpdateArgs>& args, bool delay) {
  Stream& cs = compute_stream();
  Stream& gs = *gather_stream_;
  if (plan_.delayed_update) {
    // Delayed: the last step's update is published, then this one's launched, and the gather
    // stream (which the next cycle's compute waits for) has waited for the first only.
    if (delay) {
      publish_update();
      launch_update(args);
    } else {
      launch_update(args);
      publish_update();
    }
    cs.wait(*record(gs));
    check_io();
    cursor_ = 0;
    return Speculation::none;
  }
  ZEROTH_CHECK(!delay, "finish_step: a delayed update on a plan without offload_optimizer.delayed_update");
  bool speculated = false;
  for (bool s : speculated_) speculated = speculated || s;
  const bool commit = speculated && args && speculative_args_ == args;
  const Speculation outcome = !speculated ? Speculation::none
                              : commit    ? Speculation::committed
                              : args      ? Speculation::redone
                                          : Speculation::restored;
  // A skipped step changes no state; it only clears what the cycle accumulated (and puts back the
  // parameters a speculative update changed).
  for (const auto& a : plan_.step_program) {
    const auto* in = a.as<op::SwapIn>();
    const auto* u = a.as<op::Update>();
    const auto* up = a.as<op::Upload>();
    const auto* out = a.as<op::SwapOut>();
    const int sub_group = in ? in->sub_group : u ? u->sub_group : up ? up->sub_group : out ? out->sub_group : -1;
    if (sub_group >= 0 && speculated_[sub_group]) {
      if (commit) continue;
      if (!args) {
        if (in) swap_in(in->sub_group, in->slot);
        if (u) restore(u->sub_group, u->slot);
        if (up) upload(up->sub_group, up->slot);
        continue;
      }
    }
    if (const auto* norms = a.as<op::UpdateNorms>(); norms && args) update_norms(norms->sub_group, *args);
    if (const auto* sum = a.as<op::SumNorms>(); sum && args) sum_tensor_norms(sum->over_data_parallel);
    if (u && args) update(u->sub_group, u->slot, *args);
    if (up && args) upload(up->sub_group, up->slot);
    if (in && args) swap_in(in->sub_group, in->slot);
    if (out && args) swap_out(out->sub_group, out->slot);
    if (const auto* z = a.as<op::Zero>()) device_.fill(cs, buffer_view(z->buffer), 0.0f);
  }
  // A speculative write-back known to have failed is not made current (the run ends here).
  if (commit) check_io();
  for (size_t g = 0; g < speculated_.size(); ++g) {
    if (speculated_[g] && commit) swaps_.flip(g);
    speculated_[g] = false;
  }
  speculative_args_.reset();
  speculation_asked_ = false;
  // Whatever the gather stream reads next (this step's post-step gathers, the next cycle's
  // gathers of parameter shards) must see the update and the uploads: all of them, or, published
  // by sub-group, those of the blocks it gathers (wait_published).
  gs.wait(*record(cs));
  if (update_stream_ && !plan_.publish_by_sub_group) gs.wait(*record(*update_stream_));
  for (const auto& a : plan_.step_program) {
    if (const auto* g = a.as<op::AllGather>(); g && args) all_gather(g->bucket);
  }
  // The next cycle's gathers may run on the compute stream (overlap_comm false), reading the shards
  // the uploads above wrote: it waits for them, as for the post-step gathers.
  cs.wait(*record(gs));
  check_io();
  cursor_ = 0;
  return outcome;
}

void Executor::speculate(const Action& a) {
  if (!speculation_asked_) {
    speculative_args_ = speculation_ ? speculation_() : std::nullopt;
    speculation_asked_ = true;
  }
  if (!speculative_args_) return;
  if (const auto* in = a.as<op::SwapIn>()) return swap_in(in->sub_group, in->slot);
  if (const auto* u = a.as<op::Update>()) return update(u->sub_group, u->slot, *speculative_args_);
  if (const auto* up = a.as<op::Upload>()) return upload(up->sub_group, up->slot);
  if (const auto* out = a.as<op::SwapOut>()) return swap_out(out->sub_group, out->slot, true);
  ZEROTH_THROW(InvalidArgument, "action {} is not a sub-group's", action_name(a.kind()));
}

void Executor::restore(int sub_group, int slot) {
  Stream& us = *update_stream_;
  us.wait(*slot_ready_[slot]);
  if (plan_.param_out < 0) return;  // f32: the upload copies the master weights themselves
  us.wait(*slot_uploaded_[slot]);
  auto g = sub_group_steps(sub_group, slot, UpdateArgs{});
  us.enqueue_host([g = std::move(g)] {
    for (const auto& steps : g.steps) {
      for (const auto& st : steps) cpu::cast(st.params, DType::f32, st.copy_out, st.copy_out_type, st.count);
    }
  });
}

Executor::SubGroupSteps Executor::sub_group_steps(int sub_group, int slot, const UpdateArgs& args) const {
  SubGroupSteps out{{config_.optimizer, config_.optimizer}, {}, {}};
  for (auto& p : out.params) {
    if (args.betas) {
      p.beta1 = (*args.betas)[0];
      p.beta2 = (*args.betas)[1];
    }
  }
  out.params[0].weight_decay = 0;
  for (const auto& span : plan_.sub_groups[sub_group]) {
    const int b = span.block;
    const auto& master = plan_.range(StateKind::master, b);
    const auto& shard = plan_.range(StateKind::param_shard, b);
    OptimizerStep s;
    s.params = static_cast<float*>(state_at(StateKind::master, b, span.lo, sub_group, slot));
    s.grad_type = plan_.buffers[plan_.range(StateKind::grad_shard, b).buffer].dtype;
    s.grads = state_at(StateKind::grad_shard, b, span.lo, sub_group, slot);
    const StateKind moments[2] = {StateKind::moment0, StateKind::moment1};
    for (int k = 0; k < 2; ++k) {
      if (plan_.find(moments[k], b) != nullptr) s.state[k] = static_cast<float*>(state_at(moments[k], b, span.lo, sub_group, slot));
    }
    // Narrow parameters are written from the updated master values in the same pass: straight
    // into the shard, or, offloaded, into param_out for the upload (which copies f32 ones from
    // the master itself).
    if (plan_.sub_group_offloaded(sub_group)) {
      s.copy_out = param_out_at(sub_group, slot, master, span.lo);
      s.copy_out_type = plan_.compute_dtype;
    } else if (!same_place(master, shard)) {
      s.copy_out = at(shard, span.lo);
      s.copy_out_type = plan_.compute_dtype;
    }
    s.count = span.hi - span.lo;
    s.step = args.step;
    s.lr = args.lr;
    s.grad_scale = args.grad_scale;
    s.check_finite = false;
    const int d = span.decay ? 1 : 0;
    out.steps[d].push_back(s);
    out.norms[d].push_back(span.tensor >= 0 ? buffer_view(plan_.tensor_norms).as<float>() + 2 * span.tensor : nullptr);
  }
  return out;
}

void Executor::sum_tensor_norms(bool over_data_parallel) {
  Stream& cs = compute_stream();
  const TensorView norms = buffer_view(plan_.tensor_norms);
  if (over_data_parallel) step_comm_->all_reduce(cs, norms, ReduceOp::sum);
  // A split tensor's squares add up over the tensor-parallel ranks. A replicated one's come out
  // t times over (t identical copies), which leaves its ratio ||w|| / ||u|| as it is.
  if (links_.tensor != nullptr) links_.tensor->all_reduce(cs, norms, ReduceOp::sum);
}

void Executor::update_norms(int sub_group, const UpdateArgs& args) {
  auto g = sub_group_steps(sub_group, 0, args);
  Stream& cs = compute_stream();
  if (device_.kind() == DeviceKind::cuda) {
    for (int d = 0; d < 2; ++d) cuda_lamb_norms(g.params[d], g.steps[d], g.norms[d], cs);
    return;
  }
  cs.enqueue_host([g = std::move(g)] {
    for (int d = 0; d < 2; ++d) {
      for (size_t k = 0; k < g.steps[d].size(); ++k) cpu_lamb_norms(g.params[d], g.steps[d][k], g.norms[d][k]);
    }
  });
}

void Executor::update(int sub_group, int slot, const UpdateArgs& args) {
  auto g = sub_group_steps(sub_group, slot, args);
  // Spans that name their tensor read its summed norms (the second pass of Lamb).
  const bool per_tensor = !plan_.sub_groups[sub_group].empty() && plan_.sub_groups[sub_group].front().tensor >= 0;
  const bool offloaded = plan_.sub_group_offloaded(sub_group);
  // Offloaded sub-groups are updated on the host, beside the device's compute.
  Stream& cs = offloaded ? *update_stream_ : compute_stream();
  if (offloaded) {
    // The slot's state must have arrived, and its parameters of two sub-groups ago have left.
    if (plan_.swap_slots >= 0) cs.wait(*slot_ready_[slot]);
    if (plan_.param_out >= 0) cs.wait(*slot_uploaded_[slot]);
    // The gradients: on their way from the device (offload_grads) until the reductions are done.
    if (reduced_) cs.wait(*reduced_);
  }
  if (device_.kind() == DeviceKind::cuda && !offloaded) {
    for (int d = 0; d < 2; ++d) {
      if (g.steps[d].empty()) continue;
      if (per_tensor) cuda_lamb_apply(g.params[d], g.steps[d], std::vector<const float*>(g.norms[d].begin(), g.norms[d].end()), cs);
      else cuda_optimizer_step(g.params[d], g.steps[d], cs);
    }
    return;
  }
  cs.enqueue_host([g = std::move(g), per_tensor] {
    for (int d = 0; d < 2; ++d) {
      for (size_t k = 0; k < g.steps[d].size(); ++k) {
        if (per_tensor) cpu_lamb_apply(g.params[d], g.steps[d][k], g.norms[d][k]);
        else cpu_optimizer_step(g.params[d], g.steps[d][k]);
      }
    }
  });
}

void Executor::all_gather(int index) {
  const auto& bucket = plan_.gather_buckets[index];
  Stream& gs = *gather_stream_;
  if (!bucket.staged) {
    const int b = bucket.blocks.front();
    gather_shards(gs, b, view(StateKind::params, b));
    return;
  }
  const int dp = plan_.group_ranks(bucket.blocks.front()), r = plan_.group_rank(bucket.blocks.front());
  const size_t n = bucket.shard_numel, c = dtype_size(plan_.compute_dtype);
  const TensorView staging{buffers_[plan_.gather_staging].data(), n * dp, plan_.compute_dtype};
  for (int b : bucket.blocks) {
    const auto& blk = plan_.blocks[b];
    wait_published(gs, b);
    device_.copy(gs, staging.slice(r * n + blk.shard_offset - bucket.shard_offset, blk.shard).data,
                 view(StateKind::param_shard, b).data, blk.shard * c);
  }
  gather_comm(bucket.blocks.front()).all_gather(gs, staging.slice(r * n, n), staging);
  for (int b : bucket.blocks) {
    const auto& blk = plan_.blocks[b];
    const TensorView full = view(StateKind::params, b);
    for (int k = 0; k < dp; ++k) {
      if (k == r) continue;
      device_.copy(gs, full.slice(k * blk.shard, blk.shard).data,
                   staging.slice(k * n + blk.shard_offset - bucket.shard_offset, blk.shard).data, blk.shard * c);
    }
  }
}

}  // namespace zeroth
