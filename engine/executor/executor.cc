// The executor's walk over a program and the actions of a block use: gathers and releases of
// parameters, placement and release of gradient buffers, accumulation and bucket reductions.
// The step's actions and the writes of values are in step.cc.
#include "engine/executor/executor.h"

#include <unistd.h>  // getpid

#include <type_traits>  // std::is_same_v
#include <variant>      // std::visit

#include <fmt/format.h>  // fmt::format

#include "core/error.h"  // ZEROTH_THROW
#include "core/log.h"    // ZLOG_WARN

namespace zeroth {
namespace {

// What tells apart the swap files of one process's ranks: the stage and the tensor-parallel rank (a
// pipeline's stages and a slice's ranks each number their data-parallel ranks from 0).
std::string swap_file_tag(const GroupLinks& links) {
  std::string tag;
  if (links.stages != nullptr && links.stages->size() > 1) tag += fmt::format("stage{}-", links.stages->rank());
  if (links.tensor != nullptr && links.tensor->size() > 1) tag += fmt::format("tp{}-", links.tensor->rank());
  return tag;
}

}  // namespace

Executor::Executor(Device& device, TierAllocators& tiers, Communicator& dp, const Plan& plan, const std::vector<BlockSpec>& specs,
                   const EngineConfig& config, GroupLinks links)
    : device_(device), plan_(plan), specs_(specs), config_(config), links_(links), swaps_(plan, config, swap_file_tag(links)) {
  ZEROTH_CHECK((plan_.tied_block >= 0) == (links_.tied != nullptr), "a tied block needs its pair's communicator, and only it");
  gather_stream_ = device_.create_stream();
  reduce_stream_ = device_.create_stream();
  gather_comm_ = dp.split(0, dp.rank());
  reduce_comm_ = dp.split(0, dp.rank());
  step_comm_ = dp.split(0, dp.rank());
  if (plan_.ep > 1) {
    // The ranks holding the same experts: every ep-th one.
    const int slice = dp.rank() % plan_.ep;
    expert_gather_comm_ = dp.split(slice, dp.rank());
    expert_reduce_comm_ = dp.split(slice, dp.rank());
    expert_step_comm_ = dp.split(slice, dp.rank());
  }
  const auto& offload = config_.zero.offload_optimizer;
  for (const auto& b : plan_.buffers) buffers_.push_back(b.tier == Tier::nvme ? Buffer{} : tiers.allocate(b.tier, b.bytes(), b.tag));
  register_io_buffers();
  auto arena = [&](int buffer) { return Arena(buffer >= 0 ? buffers_[buffer].data() : nullptr, dtype_size(plan_.compute_dtype)); };
  param_arena_ = arena(plan_.param_arena);
  grad_arena_ = arena(plan_.grad_arena);
  if (offload.enabled()) {
    swap_in_stream_ = device_.create_stream();
    swap_out_stream_ = device_.create_stream();
    update_stream_ = device_.create_stream();
    landing_.resize(plan_.reduce_buckets.size());
    bucket_sumsq_.assign(plan_.reduce_buckets.size(), 0.0);
    for (int k = 0; k < 3; ++k) {
      slot_ready_.push_back(device_.create_event());
      slot_written_.push_back(device_.create_event());
      slot_uploaded_.push_back(device_.create_event());
    }
  }

  if (plan_.delayed_update || plan_.publish_by_sub_group) {
    bucket_sub_groups_.resize(plan_.reduce_buckets.size());
    if (plan_.publish_by_sub_group) block_sub_groups_.resize(plan_.blocks.size());
    for (size_t g = 0; g < plan_.sub_groups.size(); ++g) {
      if (plan_.delayed_update) grads_read_.push_back(device_.create_event());
      if (plan_.publish_by_sub_group) published_.push_back(device_.create_event());
      for (const auto& span : plan_.sub_groups[g]) {
        auto& feeds = bucket_sub_groups_[plan_.blocks[span.block].reduce_bucket];
        if (feeds.empty() || feeds.back() != static_cast<int>(g)) feeds.push_back(static_cast<int>(g));
        if (!plan_.publish_by_sub_group || !plan_.sub_group_offloaded(static_cast<int>(g))) continue;
        auto& holders = block_sub_groups_[span.block];
        if (holders.empty() || holders.back() != static_cast<int>(g)) holders.push_back(static_cast<int>(g));
      }
    }
  }
  speculated_.assign(plan_.sub_groups.size(), false);
  const size_t n = plan_.blocks.size();
  gathered_.assign(n, nullptr);
  gather_pending_.assign(n, false);
  grads_.assign(n, nullptr);
  grad_reader_.assign(n, nullptr);
  views_.resize(n);
  for (size_t b = 0; b < n; ++b) {
    gathered_event_.push_back(device_.create_event());
    // Resident state has one home for the whole run; the rest is placed by the program.
    if (const auto* r = plan_.find(StateKind::params, static_cast<int>(b))) gathered_[b] = at(*r, 0);
    if (!plan_.blocks[b].transient_grads && !plan_.blocks[b].frozen)
      grads_[b] = at(plan_.range(StateKind::grad_accum, static_cast<int>(b)), 0);
  }
}

void Executor::register_io_buffers() {
  // The host buffers swaps move through, registered with every swap file's rings: the kernel then
  // keeps their pages pinned instead of pinning each piece's pages per request, which on some
  // machines costs more CPU than the transfer (bench offload's "registered" column).
  for (int buffer : {plan_.swap_slots, plan_.grad_host, plan_.param_staging, plan_.param_out}) {
    if (buffer < 0 || !buffers_[buffer]) continue;
    if (!swaps_.register_buffer(buffers_[buffer].data(), buffers_[buffer].bytes(), plan_.buffers[buffer].name)) return;
  }
}

Executor::~Executor() {
  // Streams may still run work that points into our buffers: every one is drained, even when
  // another failed.
  for (Stream* s : {gather_stream_.get(), reduce_stream_.get(), swap_in_stream_.get(), update_stream_.get(), swap_out_stream_.get(),
                    &compute_stream()}) {
    if (s == nullptr) continue;
    try {
      s->synchronize();
    } catch (const std::exception& e) {
      ZLOG_WARN("engine shutting down after a failed step: {}", e.what());
    }
  }
}

CommStats Executor::comm_stats() const {
  CommStats total;
  const Communicator* comms[] = {gather_comm_.get(),        reduce_comm_.get(),      step_comm_.get(), expert_gather_comm_.get(),
                                 expert_reduce_comm_.get(), expert_step_comm_.get(), links_.tensor,    links_.tensor_reduce};
  for (const Communicator* c : comms) {
    if (c == nullptr) continue;
    const auto s = c->stats();
    for (size_t op = 0; op < kCollectiveOpCount; ++op) {
      total.calls[op] += s.calls[op];
      total.bytes[op] += s.bytes[op];
      total.bus_bytes[op] += s.bus_bytes[op];
    }
  }
  return total;
}

// ---- views of the state -----------------------------------------------------------------------

void* Executor::at(const OwnedRange& r, size_t element) const {
  ZEROTH_CHECK(element >= r.lo && element <= r.hi, "element {} is outside the owned range [{}, {}) of {} of block {}", element, r.lo,
               r.hi, state_kind_name(r.kind), plan_.blocks[r.block].name);
  const auto& buf = plan_.buffers[r.buffer];
  ZEROTH_CHECK(buffers_[r.buffer], "{} of block {} lives in a swap file, not in memory", state_kind_name(r.kind),
               plan_.blocks[r.block].name);
  return static_cast<char*>(buffers_[r.buffer].data()) + (r.offset + element - r.lo) * dtype_size(buf.dtype);
}

TensorView Executor::view(StateKind kind, int block) const {
  const auto& r = plan_.range(kind, block);
  return {at(r, r.lo), r.numel(), plan_.buffers[r.buffer].dtype};
}

TensorView Executor::buffer_view(int buffer) const {
  return {buffers_[buffer].data(), plan_.buffers[buffer].numel, plan_.buffers[buffer].dtype};
}

TensorView Executor::full_params(int block) const {
  ZEROTH_CHECK(gathered_[block] != nullptr, "block {} is not gathered", plan_.blocks[block].name);
  return {gathered_[block], plan_.blocks[block].padded, plan_.compute_dtype};
}

TensorView Executor::grad_view(int block) const {
  const auto& blk = plan_.blocks[block];
  ZEROTH_CHECK(grads_[block] != nullptr, "block {} has no gradient buffer placed", blk.name);
  return {grads_[block], blk.padded, blk.transient_grads ? plan_.compute_dtype : DType::f32};
}

// ---- the walk ---------------------------------------------------------------------------------

const Action& Executor::expect_run(size_t from, int block, int micro, Pass pass, const char* what) const {
  const auto& prog = evaluating_ ? plan_.eval_program : plan_.program;
  size_t r = from;
  while (r < prog.size() && prog[r].kind() != ActionKind::run) ++r;
  auto name = [&](int b) { return b >= 0 && static_cast<size_t>(b) < specs_.size() ? specs_[b].name : std::to_string(b); };
  if (r == prog.size()) {
    ZEROTH_THROW(InvalidArgument, "{}({}, micro-batch {}): the {} is complete; {}", what, name(block), micro,
                 evaluating_ ? "evaluation pass" : "accumulation cycle", evaluating_ ? "call end_evaluation()" : "call step() first");
  }
  const auto& a = prog[r];
  if (a.block != block || a.micro != micro || a.pass != pass) {
    ZEROTH_THROW(InvalidArgument,
                 "{}({}, micro-batch {}) out of order: the program's next use is the {} of block {} for micro-batch {}; the model "
                 "must follow the block schedule and pass order given to the engine",
                 what, name(block), micro, a.pass == Pass::forward ? "forward" : "backward", name(a.block), a.micro);
  }
  return a;
}

const BlockViews& Executor::begin(int block, int micro, Pass pass, const char* what) {
  const auto& prog = evaluating_ ? plan_.eval_program : plan_.program;
  size_t& cursor = evaluating_ ? eval_cursor_ : cursor_;
  if (open_use_ >= 0) {
    ZEROTH_THROW(InvalidArgument, "{}({}, micro-batch {}) while the use before it is open; call its end_ first", what,
                 specs_[block].name, micro);
  }
  const auto& run = expect_run(cursor, block, micro, pass, what);
  while (prog[cursor].kind() != ActionKind::run) execute(prog[cursor++]);
  open_use_ = run.use;
  if (gather_pending_[block]) {
    compute_stream().wait(*gathered_event_[block]);
    gather_pending_[block] = false;
  }
  auto& v = views_[block];
  v.params.clear();
  v.grads.clear();
  const auto full = full_params(block);
  // A frozen block's backward gets no gradient views: it computes its input's gradient only.
  const bool grads_out = pass == Pass::backward && !plan_.blocks[block].frozen;
  const auto grads = grads_out ? grad_view(block) : TensorView{};
  const auto& spec = specs_[block];
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const size_t off = plan_.blocks[block].param_offsets[i], n = spec.params[i].numel();
    v.params.push_back(full.slice(off, n));
    if (grads_out) v.grads.push_back(grads.slice(off, n));
  }
  return v;
}

void Executor::end(int block, int micro, Pass pass, const char* what) {
  const auto& prog = evaluating_ ? plan_.eval_program : plan_.program;
  size_t& cursor = evaluating_ ? eval_cursor_ : cursor_;
  const auto& run = expect_run(cursor, block, micro, pass, what);
  if (open_use_ != run.use) {
    ZEROTH_THROW(InvalidArgument, "{}({}, micro-batch {}) before its begin_{}", what, specs_[block].name, micro,
                 pass == Pass::forward ? "forward" : "backward");
  }
  const int use = run.use;
  open_use_ = -1;
  ++cursor;
  while (cursor < prog.size() && prog[cursor].use == use) execute(prog[cursor++]);
}

void Executor::begin_evaluation() {
  evaluating_ = true;
  eval_cursor_ = 0;
  open_use_ = -1;
}

void Executor::end_evaluation() {
  // A pass cut short leaves gathered blocks placed; they go back to the arena so the next cycle
  // starts from the planned state. After a whole pass there are none.
  for (size_t b = 0; b < gathered_.size(); ++b) {
    if (gathered_[b] == nullptr || plan_.find(StateKind::params, static_cast<int>(b)) != nullptr) continue;
    if (gather_pending_[b]) compute_stream().wait(*gathered_event_[b]);
    gather_pending_[b] = false;
    release(static_cast<int>(b));
  }
  evaluating_ = false;
  open_use_ = -1;
}

bool Executor::after_backward_pass() const {
  const auto& prog = plan_.program;
  if (cursor_ == 0) return false;
  const auto& last = prog[cursor_ - 1];
  return last.pass == Pass::backward &&
         (cursor_ == prog.size() || prog[cursor_].micro != last.micro || prog[cursor_].pass != last.pass);
}

size_t Executor::uses_done() const {
  size_t n = 0;
  for (size_t i = 0; i < cursor_; ++i) n += plan_.program[i].kind() == ActionKind::run;
  return n;
}

void Executor::execute(const Action& a) {
  Stream& gs = a.serial ? compute_stream() : *gather_stream_;
  Stream& rs = a.serial ? compute_stream() : *reduce_stream_;
  std::visit(
      [&](const auto& o) {
    using Op = std::decay_t<decltype(o)>;
    if constexpr (std::is_same_v<Op, op::Gather>) {
      gather(o.block, o.arena_offset, gs);
    } else if constexpr (std::is_same_v<Op, op::Release>) {
      release(o.block);
    } else if constexpr (std::is_same_v<Op, op::PlaceGrads>) {
      place_grads(o.block, o.arena_offset);
    } else if constexpr (std::is_same_v<Op, op::Accumulate>) {
      device_.axpy(compute_stream(), view(StateKind::grad_accum, o.block), 1.0f, grad_view(o.block));
      grad_reader_[o.block] = record(compute_stream());
    } else if constexpr (std::is_same_v<Op, op::ReleaseGrads>) {
      release_grads(o.block);
    } else if constexpr (std::is_same_v<Op, op::AllReduce>) {
      all_reduce(o.bucket, rs);
    } else if constexpr (std::is_same_v<Op, op::ReduceScatter>) {
      reduce_scatter(o.bucket, o.add, rs);
    } else if constexpr (std::is_same_v<Op, op::OffloadGrads>) {
      offload_grads(o.bucket, o.add, rs);
    } else if constexpr (std::is_same_v<Op, op::SumPartial>) {
      sum_partial(o.bucket, rs);
    } else if constexpr (std::is_same_v<Op, op::SwapIn> || std::is_same_v<Op, op::Update> || std::is_same_v<Op, op::Upload> ||
                         std::is_same_v<Op, op::SwapOut>) {
      speculate(a);
    } else {
      ZEROTH_THROW(InvalidArgument, "action {} cannot run inside a block use", action_name(Op::kind));
    }
      },
      a.op);
}

std::shared_ptr<Event> Executor::record(Stream& stream) {
  std::shared_ptr<Event> e = device_.create_event();
  e->record(stream);
  return e;
}

void Executor::gather(int block, size_t arena_offset, Stream& gs) {
  const auto& blk = plan_.blocks[block];
  gathered_[block] = param_arena_.place(arena_offset, blk.padded, gs);
  gather_shards(gs, block, full_params(block));
  gathered_event_[block]->record(gs);
  gather_pending_[block] = true;
}

void Executor::release(int block) {
  param_arena_.release(gathered_[block], plan_.blocks[block].padded, record(compute_stream()));
  gathered_[block] = nullptr;
}

void Executor::place_grads(int block, size_t arena_offset) {
  grads_[block] = grad_arena_.place(arena_offset, plan_.blocks[block].padded, compute_stream());
  device_.fill(compute_stream(), grad_view(block), 0.0f);
}

void Executor::release_grads(int block) {
  // Free once the last work that read them (the accumulation, or the bucket's reduction, which
  // may still run) is done.
  grad_arena_.release(grads_[block], plan_.blocks[block].padded, grad_reader_[block]);
  grads_[block] = nullptr;
}

void Executor::all_reduce(int index, Stream& rs) {
  const auto& bucket = plan_.reduce_buckets[index];
  rs.wait(*record(compute_stream()));
  size_t full = 0;
  for (int b : bucket.blocks) full += plan_.blocks[b].padded;
  const TensorView grads{at(plan_.range(StateKind::grad_accum, bucket.blocks.front()), 0), full, DType::f32};
  if (bucket.staged) {
    const TensorView staging{buffers_[plan_.reduce_staging].data(), full, plan_.comm_dtype};
    device_.cast(rs, staging, grads);
    reduce_comm(bucket.blocks.front()).all_reduce(rs, staging, ReduceOp::sum);
    device_.cast(rs, grads, staging);
  } else {
    reduce_comm(bucket.blocks.front()).all_reduce(rs, grads, ReduceOp::sum);
  }
  reduced_ = record(rs);
  for (int b : bucket.blocks) grad_reader_[b] = reduced_;
}

void Executor::sum_partial(int index, Stream& rs) {
  ZEROTH_CHECK(links_.tensor_reduce != nullptr, "sum_partial without a tensor-parallel group");
  const auto& bucket = plan_.reduce_buckets[index];
  rs.wait(*record(compute_stream()));
  for (int b : bucket.blocks) {
    const TensorView grads = bucket.from_accumulator ? view(StateKind::grad_accum, b) : grad_view(b);
    for (const auto& [lo, hi] : plan_.blocks[b].tp_partial)
      links_.tensor_reduce->all_reduce(rs, grads.slice(lo, hi - lo), ReduceOp::sum);
  }
}

void Executor::reduce_scatter(int index, bool add, Stream& rs) {
  const auto& bucket = plan_.reduce_buckets[index];
  const int dp = plan_.group_ranks(bucket.blocks.front()), r = plan_.group_rank(bucket.blocks.front());
  Communicator& comm = reduce_comm(bucket.blocks.front());
  rs.wait(*record(compute_stream()));
  auto source = [&](int b) { return bucket.from_accumulator ? view(StateKind::grad_accum, b) : grad_view(b); };
  const size_t n = bucket.shard_numel;
  TensorView send;
  if (bucket.staged) {
    send = {buffers_[plan_.reduce_staging].data(), n * dp, plan_.comm_dtype};
    for (int b : bucket.blocks) {
      const auto& blk = plan_.blocks[b];
      const TensorView src = source(b);
      for (int k = 0; k < dp; ++k) {
        device_.cast(rs, send.slice(k * n + (blk.shard_offset - bucket.shard_offset), blk.shard), src.slice(k * blk.shard, blk.shard));
      }
    }
  } else {
    send = source(bucket.blocks.front());
  }
  const int shard_buffer = plan_.range(StateKind::grad_shard, bucket.blocks.front()).buffer;
  if (!on_device(shard_buffer)) {
    // Offloaded: the slice stays in place until offload_grads takes it to the host.
    landing_[index] = send.slice(r * n, n);
    comm.reduce_scatter(rs, send, landing_[index], ReduceOp::sum);
  } else if (!add && send.dtype == DType::f32) {
    const TensorView shard{view(StateKind::grad_shard, bucket.blocks.front()).data, n, DType::f32};
    comm.reduce_scatter(rs, send, shard, ReduceOp::sum);
  } else {
    const TensorView shard{view(StateKind::grad_shard, bucket.blocks.front()).data, n, DType::f32};
    const TensorView mine = send.slice(r * n, n);
    comm.reduce_scatter(rs, send, mine, ReduceOp::sum);
    if (add) {
      device_.axpy(rs, shard, 1.0f, mine);
    } else {
      device_.cast(rs, shard, mine);
    }
  }
  reduced_ = record(rs);
  for (int b : bucket.blocks) grad_reader_[b] = reduced_;
}

}  // namespace zeroth
