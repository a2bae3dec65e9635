// The estimate and the check against a budget.
#include "engine/plan/estimate.h"

#include <algorithm>  // std::max

#include <fmt/format.h>  // fmt::format

#include "core/error.h"                 // ZEROTH_THROW
#include "engine/checkpoint/staging.h"  // ckpt::kStagingBytes

namespace zeroth {

size_t MemoryNeed::total(Tier tier) const { return tier_total(bytes, tier) + (tier == Tier::device ? allowance : 0); }

std::string MemoryNeed::describe(Tier tier) const {
  std::string out;
  for (size_t g = 0; g < kMemTagCount; ++g) {
    const size_t n = bytes[static_cast<size_t>(tier)][g];
    if (n == 0) continue;
    const bool acts = static_cast<MemTag>(g) == MemTag::activations && !activation_note.empty();
    out += fmt::format("{}{} {}{}", out.empty() ? "" : ", ", mem_tag_name(static_cast<MemTag>(g)), format_bytes(n),
                       acts ? " (" + activation_note + ")" : "");
  }
  if (tier == Tier::device) out += fmt::format("{}allowance {}", out.empty() ? "" : ", ", format_bytes(allowance));
  return out;
}

MemoryNeed estimate(const Plan& plan, const ModelFootprint& model, bool snapshot_checkpoints, bool loads_checkpoint) {
  MemoryNeed need;
  need.bytes = plan.bytes;
  at(need.bytes, Tier::device, MemTag::activations) += model.activations;
  at(need.bytes, Tier::device, MemTag::buffers) += model.scratch;
  at(need.bytes, Tier::pinned_host, MemTag::activations) += model.host_activations;
  need.activation_note = model.note;
  // Gathering a block's fp32 master values (the weights a run saves at its end, Engine::
  // master_values) puts the rank's slice and the whole padded block on the device, one block at a
  // time, when the rank does not hold the block's master whole.
  // State in a swap file goes through an aligned bounce buffer (O_DIRECT) of its size, at most
  // kTransferBounceBytes.
  auto bounce = [&](const OwnedRange& r) -> size_t {
    if (plan.buffers[r.buffer].tier != Tier::nvme) return 0;
    constexpr size_t kPage = 4096;
    const size_t bytes = (r.numel() * dtype_size(plan.buffers[r.buffer].dtype) + kPage - 1) / kPage * kPage;
    return std::min(kTransferBounceBytes, bytes);
  };
  size_t gather = 0, weights_host = 0;
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    // The values a gather reads: the master, or a frozen block's parameter shard (read narrow, widened).
    const OwnedRange* m = &plan.values_owned(static_cast<int>(b));
    const size_t padded = plan.blocks[b].padded;
    if (m->numel() < padded) gather = std::max(gather, (m->numel() + padded) * sizeof(float));
    const DType held = plan.buffers[m->buffer].dtype;
    const size_t narrow = held == DType::f32 ? 0 : m->numel() * dtype_size(held);
    const size_t vectors = (m->numel() < padded ? m->numel() + padded : padded) * sizeof(float) + narrow;
    weights_host = std::max(weights_host, vectors + bounce(*m));
  }
  at(need.bytes, Tier::device, MemTag::other) += gather;
  // The checkpoint writer copies one owned range of one state at a time to the host and streams the
  // rank's file through its staging buffers, which a file smaller than them touches only in part.
  size_t checkpoint_host = 0, checkpoint_file = 0;
  for (const auto& r : plan.owned) {
    // A frozen block saves its weights (its parameter shard, widened) only.
    const bool frozen_weights = r.kind == StateKind::param_shard && plan.blocks[r.block].frozen;
    if (frozen_weights || r.kind == StateKind::master || r.kind == StateKind::moment0 || r.kind == StateKind::moment1) {
      checkpoint_host = std::max(checkpoint_host, r.numel() * sizeof(float) + bounce(r));
      checkpoint_file += r.numel() * sizeof(float);
    }
  }
  const size_t file_pages = (checkpoint_file + ckpt::kStagingAlignment - 1) / ckpt::kStagingAlignment * ckpt::kStagingAlignment;
  const size_t staging = std::min(ckpt::kWriteBuffers * ckpt::kStagingBytes, file_pages);
  // Writing a block's values into the engine (initialization, and a resume's load) takes a chunk of
  // them in f32 and in the compute dtype and two bounce buffers, one for the master values and one
  // for the parameter shard (and a resume's moments) in swap files; the engine keeps each at its
  // largest until the series of writes ends, so the maxima over the blocks add up. A resume also
  // streams the files through its read buffers into one block's run at a time (its values and owned
  // moments, f32).
  size_t chunk = 0, master_bounce = 0, shard_bounce = 0, moment_bounce = 0, largest_run = 0;
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    const int block = static_cast<int>(b);
    const auto [lo, hi] = plan.values_range(block);
    chunk = std::max(chunk, std::min(hi - lo, kTransferChunkNumel) * (sizeof(float) + dtype_size(plan.compute_dtype)));
    if (const OwnedRange* m = plan.find(StateKind::master, block)) master_bounce = std::max(master_bounce, bounce(*m));
    shard_bounce = std::max(shard_bounce, bounce(plan.range(StateKind::param_shard, block)));
    size_t run = hi - lo;
    for (StateKind kind : {StateKind::moment0, StateKind::moment1}) {
      if (const OwnedRange* r = plan.find(kind, block)) {
        run += r->numel();
        moment_bounce = std::max(moment_bounce, bounce(*r));
      }
    }
    largest_run = std::max(largest_run, run * sizeof(float));
  }
  const size_t init_host = chunk + master_bounce + shard_bounce;
  const size_t load_host = largest_run + chunk + master_bounce + std::max(shard_bounce, moment_bounce);
  // An asynchronous save first copies the whole file to a host snapshot, kept for the next save and
  // so still held when the run's end gathers its weights.
  need.save_host = std::max({init_host,
                             loads_checkpoint ? load_host + std::min(ckpt::kStreamBuffers * ckpt::kStagingBytes, file_pages) : 0,
                             std::max(weights_host, checkpoint_host + staging) + (snapshot_checkpoints ? checkpoint_file : 0)});
  return need;
}

void check_fits(const MemoryNeed& need, const Plan& plan, Tier tier, size_t budget, size_t in_use, std::string_view budget_name) {
  // One host budget covers pinned and pageable host memory.
  const bool host = tier == Tier::host;
  const size_t total = host ? need.total(Tier::host) + need.total(Tier::pinned_host) : need.total(tier);
  if (budget == 0 || (in_use <= budget && total <= budget - in_use)) return;
  std::string advice;
  if (host) {
    std::string parts = need.describe(Tier::host);
    if (need.total(Tier::pinned_host) > 0) parts += (parts.empty() ? "pinned: " : "; pinned: ") + need.describe(Tier::pinned_host);
    auto on_host = [&](MemTag tag) { return at(need.bytes, Tier::host, tag) + at(need.bytes, Tier::pinned_host, tag) > 0; };
    std::string fixes;
    if (plan.swap_slots >= 0) fixes += " lower zero_optimization.sub_group_size (the swap slots hold a few sub-groups);";
    if (plan.swap_slots < 0 && on_host(MemTag::optimizer)) fixes += " offload the optimizer (and parameters) to nvme instead of cpu;";
    if (on_host(MemTag::activations))
      fixes += " keep the activation checkpoints on the device (activation_checkpointing.cpu_checkpointing false);";
    ZEROTH_THROW(OutOfMemory,
                 "the ZeRO stage {} plan needs {} of host memory per rank ({}) but {} is {}{}; nothing was allocated. To fit:{} or "
                 "raise {}",
                 plan.stage, format_bytes(total), parts, budget_name, format_bytes(budget),
                 in_use > 0 ? fmt::format(" ({} already in use)", format_bytes(in_use)) : std::string(), fixes, budget_name);
  }
  if (at(need.bytes, tier, MemTag::activations) > 0) {
    advice +=
        " a smaller train_micro_batch_size_per_gpu (with more gradient_accumulation_steps), activation checkpointing (with "
        "cpu_checkpointing, the checkpoints in host memory), the loss by chunks of tokens (model.chunked_loss, for a model with a "
        "vocabulary);";
  }
  if (plan.stage < 3) advice += fmt::format(" raise zero_optimization.stage (now {}) to shard more state;", plan.stage);
  if (plan.reduce_staging >= 0 || plan.gather_staging >= 0) advice += " lower reduce_bucket_size / allgather_bucket_size;";
  if (plan.stage == 3)
    advice += " lower stage3_prefetch_bucket_size / stage3_max_live_parameters or stage3_param_persistence_threshold;";
  advice += " use more data-parallel ranks, or a larger budget";
  ZEROTH_THROW(OutOfMemory,
               "the ZeRO stage {} plan needs {} per rank on the {} tier ({}) but {} is {}{}; nothing was allocated. To fit:{}",
               plan.stage, format_bytes(total), tier_name(tier), need.describe(tier), budget_name, format_bytes(budget),
               in_use > 0 ? fmt::format(" ({} already in use)", format_bytes(in_use)) : std::string(), advice);
}

}  // namespace zeroth
