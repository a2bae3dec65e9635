// The programs: a dry run of one accumulation cycle (every micro-batch's passes in the planned
// order) and of one evaluation pass, which places every transient buffer and records each action
// against the block use it belongs to, so the executor only replays decisions made here; and the
// step's program (norms, sub-group updates with their swaps, the post-step gathers); and the
// offloaded sub-groups' updates moved into the backward pass.
#include <algorithm>  // std::max, std::min, std::stable_sort
#include <cstdint>    // SIZE_MAX
#include <map>        // std::map, std::multimap
#include <set>        // std::set
#include <vector>     // std::vector

#include "core/error.h"  // ZEROTH_CHECK
#include "engine/plan/plan.h"

namespace zeroth {
namespace {


// First-fit placement on a timeline; its high-water mark is what the arena must hold.
class ArenaSim {
 public:
  explicit ArenaSim(size_t align) : align_(align) {}
  size_t allocate(size_t n) {
    n = round_up(std::max<size_t>(n, 1), align_);
    size_t at = 0;
    for (const auto& [off, len] : used_) {
      if (off >= at + n) break;
      at = std::max(at, off + len);
    }
    used_[at] = n;
    peak_ = std::max(peak_, at + n);
    return at;
  }
  void release(size_t offset) { used_.erase(offset); }
  size_t peak() const { return peak_; }

 private:
  size_t align_;
  std::map<size_t, size_t> used_;
  size_t peak_ = 0;
};

struct Use {
  int micro = 0;
  Pass pass = Pass::forward;
  int block = -1;
  bool first_backward = false;  // the block's first backward use in its pass
  bool last_backward = false;   // its gradients are complete after it
  bool ends_pass = false;
  bool first_backward_pass = false, last_backward_pass = false;  // of the cycle
  size_t run_end = 0;  // one past the last use of the contiguous run of this micro-batch's uses
};

class Builder {
 public:
  Builder(Plan& p, const EngineConfig& config, std::vector<Action>& out)
      : p_(p), z_(config.zero), out_(out), params_(config.alignment), grads_(config.alignment) {}

  // Stage 3 with interleaved micro-batches (a pipeline's 1F1B, a 1F1B pass order): a block's
  // gathered parameters stay until its last use of the cycle when all of the rank's blocks fit in
  // stage3_max_live_parameters, instead of a gather per micro-batch and pass.
  void keep_gathered_for_the_cycle() { keep_ = true; }

  void run(const std::vector<Use>& uses) {
    uses_ = &uses;
    last_use_.assign(p_.blocks.size(), 0);
    for (size_t i = 0; i < uses.size(); ++i) last_use_[uses[i].block] = i;
    for (size_t i = 0; i < uses.size(); ++i) step(i);
    ZEROTH_CHECK(live_.empty() && grad_live_.empty() && in_flight_.empty(), "the program leaves buffers placed at its end");
  }
  size_t param_peak() const { return params_.peak(); }
  size_t grad_peak() const { return grads_.peak(); }

 private:
  void emit(size_t use, Action::Op op) {
    const auto& u = (*uses_)[use];
    const bool collective = std::holds_alternative<op::Gather>(op) || std::holds_alternative<op::AllReduce>(op) ||
                            std::holds_alternative<op::ReduceScatter>(op) || std::holds_alternative<op::OffloadGrads>(op) ||
                            std::holds_alternative<op::SumPartial>(op);
    out_.push_back({std::move(op), static_cast<int>(use), u.micro, u.block, u.pass, collective && !z_.overlap_comm});
  }

  void gather(size_t use, int b) {
    const size_t off = params_.allocate(p_.blocks[b].padded);
    live_[b] = off;
    live_numel_ += p_.blocks[b].padded;
    emit(use, op::Gather{b, off});
  }

  // Stage 3: the block on demand, then the window ahead up to the prefetch bucket of parameters,
  // counting the blocks already gathered for it, so it slides along the schedule instead of growing.
  void gathers(size_t i) {
    const auto& uses = *uses_;
    const int b = uses[i].block;
    if (!p_.blocks[b].persistent && !live_.contains(b)) gather(i, b);
    uint64_t budget = z_.stage3_prefetch_bucket_size;
    std::set<int> ahead;
    for (size_t j = i + 1; j < uses[i].run_end && budget > 0; ++j) {
      const int c = uses[j].block;
      const auto& cb = p_.blocks[c];
      if (c == b || cb.persistent || !ahead.insert(c).second) continue;
      if (cb.padded > budget) break;
      budget -= cb.padded;
      if (live_.contains(c)) continue;
      if (live_numel_ + cb.padded > z_.stage3_max_live_parameters) break;
      gather(i, c);
    }
  }

  void step(size_t i) {
    const auto& u = (*uses_)[i];
    const int b = u.block;
    const auto& blk = p_.blocks[b];
    const bool stage3 = p_.stage == 3, backward = u.pass == Pass::backward;
    if (stage3) gathers(i);
    if (backward && blk.transient_grads && u.first_backward) {
      grad_live_[b] = grads_.allocate(blk.padded);
      emit(i, op::PlaceGrads{b, grad_live_[b]});
    }
    emit(i, op::Run{});

    std::vector<int> grad_releases;
    if (backward && u.last_backward && !blk.frozen) {
      if (blk.transient_grads && p_.stage <= 1) {
        // Narrow gradients join the f32 accumulator as soon as the block is done with them.
        emit(i, op::Accumulate{b});
        grad_releases.push_back(b);
      }
      // Stages 0-1 reduce the accumulator once per cycle; 2-3 reduce every micro-batch and add up.
      const auto& bucket = p_.reduce_buckets[blk.reduce_bucket];
      if (bucket.blocks.back() == b && (p_.stage >= 2 || u.last_backward_pass)) {
        bool partial = false;
        for (int c : bucket.blocks) partial = partial || !p_.blocks[c].tp_partial.empty();
        if (partial) emit(i, op::SumPartial{blk.reduce_bucket});
        if (p_.stage == 0) {
          emit(i, op::AllReduce{blk.reduce_bucket});
        } else {
          const bool add = p_.stage >= 2 && !u.first_backward_pass;
          emit(i, op::ReduceScatter{blk.reduce_bucket, add});
          // The reduced slice leaves the device as soon as it is complete.
          if (p_.bucket_offloaded(blk.reduce_bucket)) emit(i, op::OffloadGrads{blk.reduce_bucket, add});
        }
        // A fired bucket's gradient buffers stay placed until the next bucket fires, so the
        // backward writes new gradients while the previous reduction is still on the wire.
        if (blk.transient_grads && p_.stage >= 2) {
          grad_releases = std::move(in_flight_);
          in_flight_ = bucket.blocks;
        }
      }
    }
    // The pass may end on a frozen block, which has no gradients of its own.
    if (backward && u.ends_pass && p_.stage >= 2) {
      grad_releases.insert(grad_releases.end(), in_flight_.begin(), in_flight_.end());
      in_flight_.clear();
    }
    for (int g : grad_releases) {
      emit(i, op::ReleaseGrads{g});
      grads_.release(grad_live_.at(g));
      grad_live_.erase(g);
    }
    if (stage3 && !blk.persistent) {
      // Keep the block if this micro-batch uses it again soon; "soon" is the parameters touched
      // in between.
      const auto& uses = *uses_;
      size_t next = i + 1, between = 0;
      while (next < u.run_end && uses[next].block != b) between += p_.blocks[uses[next++].block].padded;
      const bool release = keep_ ? last_use_[b] == i : next == u.run_end || between > z_.stage3_max_reuse_distance;
      if (release) {
        emit(i, op::Release{b});
        params_.release(live_.at(b));
        live_numel_ -= blk.padded;
        live_.erase(b);
      }
    }
  }

  Plan& p_;
  const ZeroConfig& z_;
  std::vector<Action>& out_;
  const std::vector<Use>* uses_ = nullptr;
  ArenaSim params_, grads_;
  std::map<int, size_t> live_, grad_live_;  // block -> arena offset
  size_t live_numel_ = 0;
  std::vector<int> in_flight_;
  bool keep_ = false;
  std::vector<size_t> last_use_;  // per block: its last use in the program
};

// The block uses of `passes` in order, with what the builder needs to know about each. A block's
// first and last backward passes are those of the passes that use it (its chunk's).
std::vector<Use> expand(const std::vector<PassRef>& passes, const std::vector<BlockSchedule>& chunks, size_t blocks) {
  std::vector<Use> uses;
  std::vector<int> first_bwd_pass(blocks, -1), last_bwd_pass(blocks, -1);
  for (size_t k = 0; k < passes.size(); ++k) {
    if (passes[k].pass != Pass::backward) continue;
    for (int b : chunks[passes[k].chunk].backward) {
      if (first_bwd_pass[b] < 0) first_bwd_pass[b] = static_cast<int>(k);
      last_bwd_pass[b] = static_cast<int>(k);
    }
  }
  for (size_t k = 0; k < passes.size(); ++k) {
    const auto& pr = passes[k];
    const auto& order = pr.pass == Pass::forward ? chunks[pr.chunk].forward : chunks[pr.chunk].backward;
    std::vector<size_t> first(blocks, SIZE_MAX), last(blocks, 0);
    for (size_t j = 0; j < order.size(); ++j) {
      first[order[j]] = std::min(first[order[j]], j);
      last[order[j]] = j;
    }
    for (size_t j = 0; j < order.size(); ++j) {
      Use u;
      u.micro = pr.micro;
      u.pass = pr.pass;
      u.block = order[j];
      u.first_backward = first[u.block] == j;
      u.last_backward = last[u.block] == j;
      u.ends_pass = j + 1 == order.size();
      u.first_backward_pass = static_cast<int>(k) == first_bwd_pass[u.block];
      u.last_backward_pass = static_cast<int>(k) == last_bwd_pass[u.block];
      uses.push_back(u);
    }
  }
  for (size_t i = uses.size(); i-- > 0;) {
    uses[i].run_end = i + 1 < uses.size() && uses[i + 1].micro == uses[i].micro ? uses[i + 1].run_end : i + 1;
  }
  return uses;
}

}  // namespace

ArenaSizes build_programs(Plan& p, const std::vector<BlockSchedule>& chunks, const EngineConfig& config) {
  ArenaSizes sizes;
  Builder cycle(p, config, p.program);
  size_t gathered = 0;
  for (const auto& b : p.blocks) gathered += b.persistent ? 0 : b.padded;
  if (p.stage == 3 && p.passes != sequential_passes(p.micro_batches) && gathered <= config.zero.stage3_max_live_parameters)
    cycle.keep_gathered_for_the_cycle();
  cycle.run(expand(p.passes, chunks, p.blocks.size()));
  // Evaluation runs between cycles, when every transient buffer is back in its arena: every
  // chunk's forward of one micro-batch, in chunk order.
  std::vector<PassRef> eval;
  for (int c = 0; c < static_cast<int>(chunks.size()); ++c) eval.push_back({0, Pass::forward, c});
  Builder evaluation(p, config, p.eval_program);
  evaluation.run(expand(eval, chunks, p.blocks.size()));
  sizes.params = std::max(cycle.param_peak(), evaluation.param_peak());
  sizes.grads = cycle.grad_peak();
  return sizes;
}

void build_step_program(Plan& p, const OffloadConfig& offload, size_t slots) {
  auto add = [&](Action::Op op) {
    Action a;
    a.op = op;
    p.step_program.push_back(a);
  };
  // One pass of `kind` over the sub-groups. Offloaded, each updated sub-group's parameters go up
  // to the device; swapped, each is read into a slot first and written back after, with the reads
  // of the next (pipeline_read) and the writes of the previous (pipeline_write) overlapping the
  // update: slots = 1 + one per pipelined direction, reused round robin.
  const bool swapped = p.swap_slots >= 0;
  const int groups = static_cast<int>(p.sub_groups.size());
  // Sub-groups kept on the device (offload_optimizer.ratio < 1) lead and are updated in place.
  int first = 0;
  while (first < groups && !p.sub_group_offloaded(first)) ++first;
  std::vector<int> order(static_cast<size_t>(groups));
  for (int g = 0; g < groups; ++g) order[g] = g;
  // Updated serially at stage 3, the offloaded sub-groups are published one by one, in the order
  // the next cycle first reads their blocks: persistent blocks (the post-step gathers) first, then
  // by the cycle's first gather. The update is element-wise, so the order changes no value.
  p.publish_by_sub_group = p.stage == 3 && first < groups && !offload.delayed_update && !(offload.overlap_backward && swapped);
  if (p.publish_by_sub_group) {
    std::vector<size_t> needed(p.blocks.size(), SIZE_MAX);
    for (size_t b = 0; b < p.blocks.size(); ++b)
      if (p.blocks[b].persistent) needed[b] = 0;
    for (size_t i = 0; i < p.program.size(); ++i) {
      if (const auto* g = p.program[i].as<op::Gather>()) needed[g->block] = std::min(needed[g->block], i + 1);
    }
    std::vector<size_t> key(static_cast<size_t>(groups), SIZE_MAX);
    for (int g = 0; g < groups; ++g)
      for (const auto& span : p.sub_groups[g]) key[g] = std::min(key[g], needed[span.block]);
    std::stable_sort(order.begin() + first, order.end(), [&](int a, int b) { return key[a] < key[b]; });
  }
  // `update`: the optimizer's pass (else the norms' pass of a per-tensor update).
  auto sweep = [&](bool update) {
    const int ahead = swapped && offload.pipeline_read ? 1 : 0;
    auto pass = [&](int g, int slot) { return update ? Action::Op{op::Update{g, slot}} : Action::Op{op::UpdateNorms{g}}; };
    for (int g = 0; g < first; ++g) add(pass(g, 0));
    int next_in = first;
    for (int i = first; i < groups; ++i) {
      const int g = order[i];
      const int slot = static_cast<int>(static_cast<size_t>(i - first) % slots);
      for (; swapped && next_in <= std::min(i + ahead, groups - 1); ++next_in)
        add(op::SwapIn{order[next_in], static_cast<int>(static_cast<size_t>(next_in - first) % slots)});
      add(pass(g, slot));
      if (update && !offload.delayed_update) add(op::Upload{g, slot});
      if (swapped) add(op::SwapOut{g, slot});
    }
  };
  // The squared norm bucket by bucket, in f32 as the buckets add up, so offloaded gradients (whose
  // squares are taken on their way to the host) give the very same number; summed over the ranks
  // after the last.
  for (size_t k = 0; k < p.reduce_buckets.size(); ++k)
    add(op::GradNorm{static_cast<int>(k), (p.stage >= 1 || p.ep > 1) && k + 1 == p.reduce_buckets.size()});
  // Per-tensor norms: every owned piece first, then the sums over the ranks that split the tensors
  // (stage 0 owns whole tensors on every rank), then the update that reads them.
  if (p.tensor_norms >= 0) {
    sweep(false);
    const bool over_dp = p.stage >= 1 && p.dp > 1;
    if (over_dp || p.tp > 1) add(op::SumNorms{p.tensor_norms, over_dp});
  }
  sweep(true);
  // Delayed: the parameters go up together once the update is published (every sub-group is
  // offloaded: ratio 1).
  p.delayed_update = offload.delayed_update;
  if (p.delayed_update) {
    for (int g = 0; g < static_cast<int>(p.sub_groups.size()); ++g) add(op::Upload{g});
  }
  if (const auto* accum = p.find(StateKind::grad_accum, p.shard_order.front())) add(op::Zero{accum->buffer});
  if (p.tensor_norms >= 0) add(op::Zero{p.tensor_norms});
  for (size_t k = 0; k < p.gather_buckets.size(); ++k) add(op::AllGather{static_cast<int>(k)});
}

void schedule_updates_in_backward(Plan& p, const OffloadConfig& offload) {
  const size_t groups = p.sub_groups.size();
  p.in_backward.assign(groups, false);
  if (!offload.overlap_backward || offload.delayed_update || p.swap_slots < 0) return;
  // The gradients of a bucket are final after its last offload_grads of the cycle.
  std::vector<size_t> final_at(p.reduce_buckets.size(), SIZE_MAX);
  for (size_t i = 0; i < p.program.size(); ++i)
    if (const auto* o = p.program[i].as<op::OffloadGrads>()) final_at[o->bucket] = i;
  std::vector<int> slot(groups, 0);
  for (const auto& a : p.step_program)
    if (const auto* u = a.as<op::Update>()) slot[u->sub_group] = u->slot;
  // Per program position, the sub-groups that become ready there, in sub-group order (the order
  // their slots rotate in).
  std::multimap<size_t, int> ready;
  for (size_t g = 0; g < groups; ++g) {
    if (!p.sub_group_offloaded(static_cast<int>(g))) continue;
    size_t at = 0;
    for (const auto& span : p.sub_groups[g]) at = std::max(at, final_at[p.blocks[span.block].reduce_bucket]);
    if (at == SIZE_MAX) continue;
    ready.emplace(at, static_cast<int>(g));
    p.in_backward[g] = true;
  }
  if (ready.empty()) return;
  std::vector<Action> program;
  for (size_t i = 0; i < p.program.size(); ++i) {
    program.push_back(p.program[i]);
    auto [from, to] = ready.equal_range(i);
    for (auto it = from; it != to; ++it) {
      const int g = it->second;
      for (Action::Op op : {Action::Op{op::SwapIn{g, slot[g]}}, Action::Op{op::Update{g, slot[g]}}, Action::Op{op::Upload{g, slot[g]}},
                            Action::Op{op::SwapOut{g, slot[g]}}}) {
        Action a = p.program[i];
        a.op = op;
        a.serial = false;
        program.push_back(a);
      }
    }
  }
  p.program = std::move(program);
  // The step's values go to the copy the last step did not write, so a step that is clipped or
  // skipped after all still finds the state it started from.
  for (int g = 0; g < static_cast<int>(groups); ++g) {
    if (!p.in_backward[g]) continue;
    for (StateKind kind : {StateKind::master, StateKind::moment0, StateKind::moment1}) {
      const auto* r = p.find(kind, p.sub_groups[g].front().block);
      if (r == nullptr || p.buffers[r->buffer].two_copies) continue;
      p.buffers[r->buffer].two_copies = true;
      p.buffers[r->buffer].numel *= 2;
    }
  }
}

}  // namespace zeroth
