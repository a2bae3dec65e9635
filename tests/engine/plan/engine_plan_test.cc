// The plan by itself: layout, shard order, stage-3 gathers and releases along a schedule with a
// tied block, the dry-run arenas, the JSON dump, and configuration errors.
#include <gtest/gtest.h>

#include <map>

#include <algorithm>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/plan/plan.h"
#include "models/decoder/gpt.h"
#include "models/mlp/mlp.h"

namespace zeroth {
namespace {

std::vector<BlockSpec> three_blocks() {
  return {{"embed", {{"weight", {100, 8}, InitRule::normal(0.02)}}},
          {"layer", {{"w", {8, 8}, InitRule::normal(0.1)}, {"b", {8}, InitRule::zeros(), ParamRole::bias}}},
          {"norm", {{"g", {8}, InitRule::constant(1.0), ParamRole::norm}}}};
}

EngineConfig stage3(uint64_t prefetch, uint64_t reuse) {
  EngineConfig c;
  c.zero.stage = 3;
  c.zero.stage3_prefetch_bucket_size = prefetch;
  c.zero.stage3_max_reuse_distance = reuse;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.overlap_comm = true;  // DeepSpeed's default for stage 3
  c.alignment = 8;
  return c;
}

TEST(Plan, LaysOutBlocksPaddedToTheWorldAndShardsThemByLastBackwardUse) {
  const auto plan = make_plan(three_blocks(), default_schedule(3), stage3(0, 0), 4, 1);
  ASSERT_EQ(plan.blocks.size(), 3u);
  EXPECT_EQ(plan.blocks[0].numel, 800u);
  EXPECT_EQ(plan.blocks[1].param_offsets, (std::vector<size_t>{0, 64}));
  EXPECT_EQ(plan.blocks[1].numel, 72u);
  EXPECT_EQ(plan.blocks[1].padded, 96u);  // a multiple of dp * alignment = 32
  EXPECT_EQ(plan.blocks[1].shard, 24u);
  // Backward runs norm, layer, embed: that is the order gradients complete and shards are laid out.
  EXPECT_EQ(plan.shard_order, (std::vector<int>{2, 1, 0}));
  EXPECT_EQ(plan.blocks[2].shard_offset, 0u);
  EXPECT_EQ(plan.blocks[1].shard_offset, 8u);
  EXPECT_EQ(plan.blocks[0].shard_offset, 32u);
  EXPECT_EQ(plan.shard_numel, 8u + 24 + 200);
}

// The actions of one kind, as the blocks or buckets they act on.
std::vector<int> targets(const std::vector<Action>& program, ActionKind kind) {
  std::vector<int> out;
  for (const auto& a : program) {
    if (a.kind == kind) out.push_back(a.target);
  }
  return out;
}

TEST(Plan, TiedBlockIsGatheredPerUseAndItsGradientsCompleteAtItsLastBackwardUse) {
  // The embedding is used again as the output head (weights tied).
  const BlockSchedule tied{{0, 1, 2, 0}, {0, 2, 1, 0}};
  const auto plan = make_plan(three_blocks(), tied, stage3(0, 0), 2, 0);
  // Without prefetch each use gathers its block; with reuse distance 0 only the head's forward
  // use keeps the embedding for the backward use that follows it at once.
  EXPECT_EQ(targets(plan.program, ActionKind::gather), (std::vector<int>{0, 1, 2, 0, 2, 1, 0}));
  EXPECT_EQ(targets(plan.program, ActionKind::release), (std::vector<int>{0, 1, 2, 0, 2, 1, 0}));
  EXPECT_EQ(targets(plan.program, ActionKind::run), (std::vector<int>{0, 1, 2, 0, 0, 2, 1, 0}));
  EXPECT_EQ(plan.shard_order, (std::vector<int>{2, 1, 0}));
  // The embedding's gradient buffer is placed at its first backward use (use 4) and its bucket
  // reduced after its last (use 7), on the one reduce action of the block.
  for (const auto& a : plan.program) {
    if (a.kind == ActionKind::place_grads && a.target == 0) {
      EXPECT_EQ(a.use, 4);
    }
    if (a.kind == ActionKind::reduce_scatter && a.target == plan.blocks[0].reduce_bucket) {
      EXPECT_EQ(a.use, 7);
    }
  }
  EXPECT_EQ(targets(plan.program, ActionKind::place_grads), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(std::count(plan.program.begin(), plan.program.end(),
                       Action{ActionKind::reduce_scatter, 7, 0, 0, Pass::backward, plan.blocks[0].reduce_bucket, 0, false}),
            1);
  // Every action carries the key of its use.
  for (const auto& a : plan.program) {
    EXPECT_EQ(a.micro, 0);
    EXPECT_EQ(a.pass, a.use < 4 ? Pass::forward : Pass::backward);
  }
}

TEST(Plan, PrefetchGathersAheadWithinTheBucketAndTheLiveLimit) {
  EngineConfig c = stage3(1000, 0);
  c.zero.stage3_max_live_parameters = 10'000;
  const auto plan = make_plan(three_blocks(), default_schedule(3), c, 2, 0);
  // At the first use, the embedding (on demand) and the next two blocks (prefetch) are gathered
  // before the block runs.
  std::vector<int> first_use;
  for (const auto& a : plan.program) {
    if (a.use == 0 && a.kind == ActionKind::gather) first_use.push_back(a.target);
  }
  EXPECT_EQ(first_use, (std::vector<int>{0, 1, 2}));
  // The arena holds all three at once: the peak is their padded sum.
  EXPECT_EQ(plan.buffer_numel(plan.param_arena), plan.blocks[0].padded + plan.blocks[1].padded + plan.blocks[2].padded);
  c.zero.stage3_max_live_parameters = plan.blocks[0].padded + plan.blocks[1].padded;
  const auto limited = make_plan(three_blocks(), default_schedule(3), c, 2, 0);
  size_t gathers = 0;
  for (const auto& a : limited.program) gathers += a.use == 0 && a.kind == ActionKind::gather;
  EXPECT_EQ(gathers, 2u);
}

TEST(Plan, DumpsAsJsonWithBytesPerTierAndTagAndTheActionList) {
  const auto plan = make_plan(three_blocks(), default_schedule(3), stage3(0, 0), 2, 0);
  const auto j = plan.to_json();
  EXPECT_EQ(j["stage"], 3);
  EXPECT_EQ(j["blocks"].size(), 3u);
  EXPECT_EQ(j["bytes"]["device"]["total"].get<size_t>(), plan.device_bytes());
  EXPECT_EQ(j["bytes"]["device"]["params"].get<size_t>(), (plan.shard_numel + plan.buffer_numel(plan.param_arena)) * 4);
  ASSERT_EQ(j["actions"].size(), plan.program.size());
  EXPECT_EQ(j["actions"][0]["op"], "gather");
  EXPECT_EQ(j["actions"][0]["block"], 0);
  EXPECT_EQ(j["actions"][0]["pass"], "forward");
  EXPECT_EQ(j["step_actions"][0]["op"], "grad_norm");
  EXPECT_NE(plan.table().find("stage 3"), std::string::npos);
  const std::string summary = plan.program_summary();
  EXPECT_NE(summary.find("gather 5,"), std::string::npos) << summary;
  EXPECT_NE(summary.find("F embed      gather embed [dp] | run | release embed"), std::string::npos) << summary;
}

// Stage 3 with the optimizer in swap files, sub-groups of 1024 elements and a bucket per block;
// and two blocks of 3000 (3072 padded) and 900 (1024) elements.
EngineConfig swapped_stage3() {
  auto c = stage3(1000, 0);
  c.zero.sub_group_size = 1024;
  c.zero.reduce_bucket_size = 0;
  c.zero.offload_optimizer.device = OffloadDevice::nvme;
  c.zero.offload_optimizer.nvme_path = "/unused";
  return c;
}
std::vector<BlockSpec> two_swapped_blocks() {
  return {{"a", {{"w", {1500, 2}, InitRule::zeros()}}}, {"b", {{"w", {900}, InitRule::zeros()}}}};
}

// The step's program but its norms, as "kind target/slot ...".
std::string step_text(const Plan& plan) {
  std::string step;
  for (const auto& a : plan.step_program) {
    if (a.kind == ActionKind::grad_norm) continue;
    step += fmt::format("{} {}/{} ", action_name(a.kind), a.target, a.offset);
  }
  return step;
}

// Offload is a program, not a flag: with the optimizer in swap files the step reads each
// sub-group into a slot ahead of its update and writes it back after, round robin over three
// slots; each reduction is followed by its bucket's copy to the host; the state buffers sit on
// the nvme tier, the staging on the host, and sub-groups start on the file's 4 KiB.
TEST(Plan, OffloadedOptimizerStepSwapsSubGroupsThroughSlotsInPipelineOrder) {
  const auto c = swapped_stage3();
  const auto blocks = two_swapped_blocks();
  const auto plan = make_plan(blocks, default_schedule(2), c, 1, 0);
  for (const char* name : {"master", "moment0", "moment1", "grad_shard"}) {
    const auto it = std::find_if(plan.buffers.begin(), plan.buffers.end(), [&](const auto& b) { return b.name == name; });
    ASSERT_NE(it, plan.buffers.end()) << name;
    EXPECT_EQ(it->tier, Tier::nvme) << name;
  }
  EXPECT_EQ(plan.buffers.at(plan.swap_slots).tier, Tier::host);
  EXPECT_EQ(plan.buffers.at(plan.swap_slots).numel, 3u * 4u * plan.slot_numel);  // slots x (master, 2 moments, grads)
  for (const auto& e : plan.sub_group_extent) EXPECT_EQ(e[0] % 1024, 0u);
  // a: 3000 elements padded to 3072, b: 900 to 1024: four sub-groups of 1024.
  ASSERT_EQ(plan.sub_groups.size(), 4u);
  const std::string step = step_text(plan);
  EXPECT_EQ(step,
            "swap_in 0/0 swap_in 1/1 update 0/0 upload 0/0 swap_out 0/0 swap_in 2/2 update 1/1 upload 1/1 swap_out 1/1 swap_in 3/0 "
            "update 2/2 upload 2/2 swap_out 2/2 update 3/0 upload 3/0 swap_out 3/0 ");
  size_t reductions = 0, offloads = 0;
  for (size_t i = 0; i < plan.program.size(); ++i) {
    if (plan.program[i].kind != ActionKind::reduce_scatter) continue;
    ++reductions;
    ASSERT_LT(i + 1, plan.program.size());
    offloads += plan.program[i + 1].kind == ActionKind::offload_grads && plan.program[i + 1].target == plan.program[i].target;
  }
  EXPECT_EQ(reductions, 2u);
  EXPECT_EQ(offloads, reductions);
  const std::string summary = plan.program_summary();
  EXPECT_NE(summary.find("swap_in sub-group 3 (slot 0)"), std::string::npos) << summary;
  EXPECT_NE(summary.find("grad_norm bucket 1 [dp],"), std::string::npos) << summary;
}

// The reduced gradients' swap file keeps a narrow reduction's dtype wherever nothing is added to
// the values after they land: stage 1 (one reduction of the f32 accumulator per cycle) and stages
// 2-3 with one micro-batch; f32 where micro-batches add into it, and once the block is tied
// (the pair's sum). A narrow file halves the gradients' bytes and their staging, and its layout
// quantum is 4 KiB of the narrow type (2048 elements).
TEST(Plan, SwappedGradientsKeepANarrowReductionsDtypeWhereNothingAddsToThem) {
  const auto blocks = two_swapped_blocks();
  auto grads = [](const Plan& plan) { return plan.buffers.at(plan.range(StateKind::grad_shard, 0).buffer); };
  struct Expect {
    int stage, gas;
    DType reduction, file;
  };
  for (const Expect& e :
       {Expect{3, 1, DType::bf16, DType::bf16}, Expect{3, 2, DType::bf16, DType::f32}, Expect{2, 1, DType::f16, DType::f16},
        Expect{2, 2, DType::f16, DType::f32}, Expect{1, 2, DType::bf16, DType::bf16}, Expect{3, 1, DType::f32, DType::f32}}) {
    auto c = swapped_stage3();
    c.zero.stage = e.stage;
    c.gradient_accumulation_steps = e.gas;
    c.communication_dtype = e.reduction;
    c.compute_dtype = DType::bf16;
    const auto plan = make_plan(blocks, default_schedule(2), c, 1, 0);
    const std::string what = fmt::format("stage {}, gas {}, reduced in {}", e.stage, e.gas, dtype_name(e.reduction));
    EXPECT_EQ(grads(plan).tier, Tier::nvme) << what;
    EXPECT_EQ(grads(plan).dtype, e.file) << what;
    EXPECT_EQ(plan.buffers.at(plan.grad_host).dtype, e.file) << what;
    const size_t quantum = 4096 / dtype_size(e.file);
    for (const auto& g : plan.sub_group_extent) EXPECT_EQ(g[0] % quantum, 0u) << what;
    EXPECT_EQ(plan.grad_piece_numel % quantum, 0u) << what;
  }
  auto c = swapped_stage3();
  c.communication_dtype = DType::bf16;
  c.compute_dtype = DType::bf16;
  auto plan = make_plan(blocks, default_schedule(2), c, 1, 0);
  const uint64_t narrow = at(plan.bytes, Tier::nvme, MemTag::grads);
  EXPECT_EQ(narrow, grads(plan).numel * 2);
  tie_block(plan, 0, true);
  EXPECT_EQ(grads(plan).dtype, DType::f32);
  EXPECT_EQ(plan.buffers.at(plan.grad_host).dtype, DType::f32);
  EXPECT_EQ(at(plan.bytes, Tier::nvme, MemTag::grads), 2 * narrow);
}

// offload_optimizer.ratio keeps the leading buckets' state on the device (ZeRO-Offload++): here
// b (1024 elements, first in shard order as its gradients complete first) fits in 30% of the
// 4096 owned elements and stays; a's three sub-groups are swapped, in their own buffers from 0,
// and only a's bucket goes to the host after its reduction. Ratio 0 is the in-device plan.
TEST(Plan, OffloadRatioKeepsTheLeadingBucketsOnTheDeviceAndSwapsTheRest) {
  auto c = swapped_stage3();
  c.zero.offload_optimizer.ratio = 0.7;
  const auto blocks = two_swapped_blocks();
  const auto plan = make_plan(blocks, default_schedule(2), c, 1, 0);
  EXPECT_EQ(plan.device_buckets, 1);
  EXPECT_EQ(plan.device_owned, 1024u);
  auto buffer = [&](const std::string& name) {
    const auto it = std::find_if(plan.buffers.begin(), plan.buffers.end(), [&](const auto& b) { return b.name == name; });
    return it == plan.buffers.end() ? PlannedBuffer{} : *it;
  };
  for (const char* name : {"master", "moment0", "moment1", "grad_shard"}) {
    EXPECT_EQ(buffer(name).tier, Tier::nvme) << name;
    // Master weights and moments hold two copies (updates during the backward pass write the one
    // the last step did not); gradients one.
    const bool two_copies = std::string(name) != "grad_shard";
    EXPECT_EQ(buffer(name).two_copies, two_copies) << name;
    EXPECT_EQ(buffer(name).numel, two_copies ? 6144u : 3072u) << name;
    // f32 parameters kept on the device are their own master, as without offload.
    const bool own_buffer = std::string(name) != "master";
    const PlannedBuffer kept = buffer(std::string("device_") + name);
    EXPECT_EQ(kept.numel, own_buffer ? 1024u : 0u) << name;
    if (own_buffer) {
      EXPECT_EQ(kept.tier, Tier::device) << name;
    }
  }
  EXPECT_EQ(plan.range(StateKind::master, 1).buffer, plan.range(StateKind::param_shard, 1).buffer);
  for (StateKind kind : {StateKind::master, StateKind::moment0, StateKind::grad_shard}) {
    EXPECT_EQ(plan.buffers.at(plan.range(kind, 1).buffer).tier, Tier::device) << state_kind_name(kind);
    EXPECT_EQ(plan.buffers.at(plan.range(kind, 0).buffer).tier, Tier::nvme) << state_kind_name(kind);
  }
  EXPECT_EQ(plan.range(StateKind::master, 0).offset, 0u);  // a starts the offloaded buffers
  ASSERT_EQ(plan.sub_groups.size(), 4u);
  EXPECT_FALSE(plan.sub_group_offloaded(0));
  for (int g = 1; g < 4; ++g) {
    EXPECT_TRUE(plan.sub_group_offloaded(g));
    EXPECT_EQ(plan.sub_group_extent[g][0], 1024u * (g - 1)) << g;
  }
  EXPECT_EQ(plan.slot_numel, 1024u);
  const std::string step = step_text(plan);
  EXPECT_EQ(step,
            "update 0/0 swap_in 1/0 swap_in 2/1 update 1/0 upload 1/0 swap_out 1/0 swap_in 3/2 update 2/1 upload 2/1 swap_out 2/1 "
            "update 3/2 upload 3/2 swap_out 3/2 ");
  std::vector<int> offloaded_buckets;
  for (const auto& a : plan.program) {
    if (a.kind == ActionKind::offload_grads) offloaded_buckets.push_back(a.target);
  }
  EXPECT_EQ(offloaded_buckets, std::vector<int>{plan.blocks[0].reduce_bucket});
  EXPECT_NE(plan.table().find("1 of 2 reduce bucket(s) kept on the device"), std::string::npos) << plan.table();
  // offload_optimizer.overlap_backward (the default): the offloaded sub-groups are updated during
  // the backward pass, right after the offload_grads that makes their gradients final (a's, the
  // last block's backward), in the slots the step program gives them.
  std::string in_backward;
  bool after_offload = false;
  for (const auto& a : plan.program) {
    if (a.kind == ActionKind::offload_grads) after_offload = true;
    if (a.kind == ActionKind::swap_in || a.kind == ActionKind::update || a.kind == ActionKind::upload ||
        a.kind == ActionKind::swap_out) {
      EXPECT_TRUE(after_offload) << action_name(a.kind) << " " << a.target;
      EXPECT_EQ(a.block, 0);
      in_backward += fmt::format("{} {}/{} ", action_name(a.kind), a.target, a.offset);
    }
  }
  EXPECT_EQ(in_backward,
            "swap_in 1/0 update 1/0 upload 1/0 swap_out 1/0 swap_in 2/1 update 2/1 upload 2/1 swap_out 2/1 swap_in 3/2 update 3/2 "
            "upload 3/2 swap_out 3/2 ");
  EXPECT_EQ(plan.in_backward, (std::vector<bool>{false, true, true, true}));
  auto serial = c;
  serial.zero.offload_optimizer.overlap_backward = false;
  const auto serial_plan = make_plan(blocks, default_schedule(2), serial, 1, 0);
  EXPECT_EQ(serial_plan.in_backward, std::vector<bool>(4, false));
  EXPECT_EQ(serial_plan.step_program, plan.step_program);
  EXPECT_EQ(serial_plan.program.size() + 12, plan.program.size());

  c.zero.offload_optimizer.device = OffloadDevice::cpu;  // the same padding as in the device
  c.zero.offload_optimizer.ratio = 0;
  const auto none_off = make_plan(blocks, default_schedule(2), c, 1, 0);
  auto in_device = c;
  in_device.zero.offload_optimizer = OffloadConfig::defaults(false);
  const auto ref = make_plan(blocks, default_schedule(2), in_device, 1, 0);
  EXPECT_EQ(none_off.program, ref.program);
  EXPECT_EQ(none_off.step_program, ref.step_program);
  EXPECT_EQ(none_off.device_bytes(), ref.device_bytes());
  EXPECT_EQ(none_off.device_buckets, 2);
  for (Tier t : {Tier::host, Tier::pinned_host, Tier::nvme}) EXPECT_EQ(tier_total(none_off.bytes, t), 0u) << tier_name(t);
}

// Updated after the backward pass at stage 3, the offloaded sub-groups are published one by one
// in the order the next cycle reads their blocks: the persistent block's (gathered after the step)
// first, then by first gather (a, b, then n when it is not persistent: the reverse of the shard
// order, which follows the backward pass). Only the order moves: the same actions, slots round robin in the new order.
// Not with updates during the backward pass, a delayed update or below stage 3.
TEST(Plan, SerialUpdatesArePublishedInTheOrderTheNextCycleReadsTheBlocks) {
  auto c = swapped_stage3();
  c.zero.offload_optimizer.overlap_backward = false;
  c.zero.stage3_param_persistence_threshold = 8;
  const std::vector<BlockSpec> blocks = {{"a", {{"w", {1500, 2}, InitRule::zeros()}}},
                                         {"b", {{"w", {900}, InitRule::zeros()}}},
                                         {"n", {{"g", {8}, InitRule::constant(1.0), ParamRole::norm}}}};
  const auto plan = make_plan(blocks, default_schedule(3), c, 1, 0);
  ASSERT_TRUE(plan.blocks[2].persistent);
  EXPECT_EQ(plan.shard_order, (std::vector<int>{2, 1, 0}));
  EXPECT_TRUE(plan.publish_by_sub_group);
  EXPECT_TRUE(plan.to_json().at("publish_by_sub_group").get<bool>());
  EXPECT_NE(plan.table().find("each published on its own"), std::string::npos) << plan.table();
  // n, b and a's three sub-groups, in shard order, each on the files' 1024-element quantum.
  ASSERT_EQ(plan.sub_groups.size(), 5u);
  for (int g = 0; g < 5; ++g) EXPECT_EQ(plan.sub_groups[g].front().block, std::vector<int>({2, 1, 0, 0, 0})[g]) << g;
  EXPECT_EQ(step_text(plan),
            "swap_in 0/0 swap_in 2/1 update 0/0 upload 0/0 swap_out 0/0 swap_in 3/2 update 2/1 upload 2/1 swap_out 2/1 swap_in 4/0 "
            "update 3/2 upload 3/2 swap_out 3/2 swap_in 1/1 update 4/0 upload 4/0 swap_out 4/0 update 1/1 upload 1/1 swap_out 1/1 "
            "all_gather 0/0 ");
  c.zero.stage3_param_persistence_threshold = 0;
  const auto unpersisted = make_plan(blocks, default_schedule(3), c, 1, 0);
  EXPECT_EQ(step_text(unpersisted),
            "swap_in 2/0 swap_in 3/1 update 2/0 upload 2/0 swap_out 2/0 swap_in 4/2 update 3/1 upload 3/1 swap_out 3/1 swap_in 1/0 "
            "update 4/2 upload 4/2 swap_out 4/2 swap_in 0/1 update 1/0 upload 1/0 swap_out 1/0 update 0/1 upload 0/1 swap_out 0/1 ");
  auto other = c;
  other.zero.offload_optimizer.overlap_backward = true;
  EXPECT_FALSE(make_plan(blocks, default_schedule(3), other, 1, 0).publish_by_sub_group);
  other = c;
  other.zero.offload_optimizer.delayed_update = true;
  EXPECT_FALSE(make_plan(blocks, default_schedule(3), other, 1, 0).publish_by_sub_group);
  other = c;
  other.zero.stage = 2;
  EXPECT_FALSE(make_plan(blocks, default_schedule(3), other, 1, 0).publish_by_sub_group);
  other = c;
  other.zero.offload_optimizer.device = OffloadDevice::cpu;
  EXPECT_TRUE(make_plan(blocks, default_schedule(3), other, 1, 0).publish_by_sub_group);
}

// overlap_comm = false moves every collective of a block use onto the compute stream and changes
// nothing else: the same actions in the same order, so the same arithmetic.
TEST(Plan, OverlapCommOffRunsEachCycleCollectiveOnTheComputeStreamAndChangesNothingElse) {
  auto is_collective = [](const Action& a) {
    return a.kind == ActionKind::gather || a.kind == ActionKind::all_reduce || a.kind == ActionKind::reduce_scatter;
  };
  for (int stage : {0, 1, 2, 3}) {
    EngineConfig c = stage3(40, 0);
    c.zero.stage = stage;
    c.zero.reduce_bucket_size = 100;
    c.gradient_accumulation_steps = 2;
    const auto overlapped = make_plan(three_blocks(), default_schedule(3), c, 2, 0);
    c.zero.overlap_comm = false;
    const auto serial = make_plan(three_blocks(), default_schedule(3), c, 2, 0);
    for (const auto* program : {&serial.program, &serial.eval_program}) {
      for (const auto& a : *program) EXPECT_EQ(a.serial, is_collective(a)) << "stage " << stage << ": " << action_name(a.kind);
    }
    size_t collectives = 0;
    for (const auto& a : serial.program) collectives += is_collective(a);
    // Stages 0-1 reduce the accumulator once per cycle (two buckets); 2-3 every micro-batch; 3
    // also gathers each block per use.
    EXPECT_EQ(collectives, std::vector<size_t>({2, 2, 4, 4 + 2 * 5})[stage]) << "stage " << stage;
    for (const auto& a : serial.step_program) EXPECT_FALSE(a.serial) << "stage " << stage;
    auto cleared = [](std::vector<Action> program) {
      for (auto& a : program) a.serial = false;
      return program;
    };
    EXPECT_EQ(cleared(serial.program), overlapped.program) << "stage " << stage;
    EXPECT_EQ(cleared(serial.eval_program), overlapped.eval_program) << "stage " << stage;
    EXPECT_EQ(serial.step_program, overlapped.step_program) << "stage " << stage;
    for (const auto& a : overlapped.program) EXPECT_FALSE(a.serial) << "stage " << stage;
    EXPECT_EQ(serial.bytes, overlapped.bytes) << "stage " << stage;

    // What --dry-run and ZEROTH_PLAN_JSON show.
    const auto j = serial.to_json();
    for (const auto& a : j["actions"]) {
      const std::string op = a["op"];
      if (op == "gather" || op == "all_reduce" || op == "reduce_scatter") {
        EXPECT_EQ(a["serial"], true) << op;
      }
    }
    EXPECT_NE(serial.table().find("communication serialised with compute"), std::string::npos) << serial.table();
    EXPECT_NE(overlapped.table().find("communication overlapped with compute"), std::string::npos) << overlapped.table();
    // The summary spells out micro-batch 0, where stages 0-1 do not reduce yet.
    if (stage >= 2) {
      EXPECT_NE(serial.program_summary().find(stage == 3 ? "gather embed (serial)" : "reduce_scatter bucket 0 (serial)"),
                std::string::npos)
          << serial.program_summary();
    }
    EXPECT_EQ(overlapped.program_summary().find("(serial)"), std::string::npos) << overlapped.program_summary();
  }
}

TEST(Plan, RejectsSchedulesThatSkipABlockAndDuplicateNames) {
  EXPECT_THROW(make_plan(three_blocks(), {{0, 1}, {1, 0}}, EngineConfig{}, 1, 0), ConfigError);
  auto dup = three_blocks();
  dup[1].name = "embed";
  try {
    make_plan(dup, default_schedule(3), EngineConfig{}, 1, 0);
    FAIL() << "duplicate names accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("\"embed\""), std::string::npos) << e.what();
  }
}

struct Model {
  const char* name;
  std::vector<BlockSpec> specs;
  BlockSchedule schedule;
};

std::vector<Model> models() {
  GptConfig g;
  g.vocab_size = 61, g.seq_len = 16, g.n_layer = 2, g.n_head = 2, g.n_embd = 24;
  const auto mlp = Mlp::block_specs({{16, 40, 24, 8}});
  return {{"gpt", Gpt::block_specs(g), Gpt::schedule(g)}, {"mlp", mlp, default_schedule(mlp.size())}};
}

// For every stage, world size, model and dtype: the ranks' owned ranges of each kind cover every
// element of every block exactly once (stage 0: each rank holds all of it), within their buffers
// and without overlap; the optimizer's sub-groups cover each rank's master range exactly once,
// with the weight decay of the parameter each element belongs to.
TEST(Plan, OwnedRangesCoverEveryParameterExactlyOncePerKind) {
  const StateKind sharded[] = {StateKind::param_shard, StateKind::master, StateKind::moment0, StateKind::moment1,
                               StateKind::grad_shard};
  for (const auto& model : models()) {
    for (DType dtype : {DType::f32, DType::bf16}) {
      for (int stage : {0, 1, 2, 3}) {
        for (int dp = 1; dp <= 4; ++dp) {
          EngineConfig c;
          c.zero.stage = stage;
          c.zero.stage3_param_persistence_threshold = 200;  // some blocks persistent at stage 3
          c.zero.sub_group_size = 300;                      // several sub-groups, spans split across them
          c.compute_dtype = dtype;
          c.alignment = 8;
          std::vector<Plan> plans;
          for (int r = 0; r < dp; ++r) plans.push_back(make_plan(model.specs, model.schedule, c, dp, r));
          const std::string where = fmt::format("{} {} stage {} dp {}", model.name, dtype_name(dtype), stage, dp);
          for (size_t b = 0; b < model.specs.size(); ++b) {
            const auto& blk = plans[0].blocks[b];
            for (StateKind kind : sharded) {
              std::vector<int> count(blk.padded, 0);
              for (const auto& p : plans) {
                const auto& o = p.range(kind, static_cast<int>(b));
                ASSERT_LE(o.hi, blk.padded) << where;
                ASSERT_LE(o.offset + o.numel(), p.buffers[o.buffer].numel) << where << " " << state_kind_name(kind);
                for (size_t e = o.lo; e < o.hi; ++e) ++count[e];
              }
              const int expected = stage == 0 ? dp : 1;
              EXPECT_EQ(std::count(count.begin(), count.end(), expected), static_cast<long>(blk.padded))
                  << where << " block " << b << " " << state_kind_name(kind);
            }
            // Full parameters: every block everywhere at stages 0-2, persistent blocks at stage 3.
            // At stages 0-2 the shard is the rank's slice of them, so the post-step all-gather
            // runs in place.
            for (const auto& p : plans) {
              const auto* full = p.find(StateKind::params, static_cast<int>(b));
              EXPECT_EQ(full != nullptr, stage < 3 || blk.persistent) << where;
              const auto& shard = p.range(StateKind::param_shard, static_cast<int>(b));
              if (stage < 3) {
                ASSERT_NE(full, nullptr);
                EXPECT_EQ(shard.buffer, full->buffer) << where;
                EXPECT_EQ(shard.offset, full->offset + shard.lo) << where;
              }
            }
          }
          for (const auto& p : plans) {
            // Ranges of one kind never share an element of their buffer.
            for (size_t k = 0; k < kStateKindCount; ++k) {
              std::vector<std::pair<size_t, size_t>> spans;
              for (const auto& o : p.owned) {
                if (static_cast<size_t>(o.kind) == k) spans.push_back({o.offset, o.offset + o.numel()});
              }
              std::sort(spans.begin(), spans.end());
              for (size_t i = 1; i < spans.size(); ++i) EXPECT_LE(spans[i - 1].second, spans[i].first) << where;
            }
            std::vector<std::vector<int>> updated(p.blocks.size());
            for (size_t b = 0; b < p.blocks.size(); ++b) updated[b].assign(p.blocks[b].padded, 0);
            size_t group_max = 0;
            for (const auto& g : p.sub_groups) {
              size_t n = 0;
              for (const auto& sp : g) {
                n += sp.hi - sp.lo;
                const auto& params = model.specs[sp.block].params;
                for (size_t e = sp.lo; e < sp.hi; ++e) {
                  ++updated[sp.block][e];
                  size_t i = 0;
                  while (i + 1 < params.size() && p.blocks[sp.block].param_offsets[i + 1] <= e) ++i;
                  ASSERT_EQ(sp.decay, params[i].role == ParamRole::weight || params[i].role == ParamRole::embedding)
                      << where << " element " << e;
                }
              }
              group_max = std::max(group_max, n);
            }
            EXPECT_LE(group_max, 300u) << where;
            for (size_t b = 0; b < p.blocks.size(); ++b) {
              const auto& m = p.range(StateKind::master, static_cast<int>(b));
              for (size_t e = 0; e < p.blocks[b].padded; ++e) EXPECT_EQ(updated[b][e], e >= m.lo && e < m.hi ? 1 : 0) << where;
            }
          }
        }
      }
    }
  }
}

TEST(Plan, PassOrdersMustRunEachMicroBatchForwardThenBackwardInOrder) {
  EngineConfig c;
  c.gradient_accumulation_steps = 4;
  const auto one_f_one_b = one_f_one_b_passes(4, 2);
  ASSERT_EQ(one_f_one_b.size(), 8u);
  EXPECT_EQ(one_f_one_b[2], (PassRef{0, Pass::backward}));
  EXPECT_EQ(one_f_one_b[3], (PassRef{2, Pass::forward}));
  const auto plan = make_plan(three_blocks(), default_schedule(3), c, 2, 0, one_f_one_b);
  EXPECT_EQ(plan.max_in_flight, 2);
  // The reduction of stage 0 is once per cycle, in the last backward pass.
  size_t reductions = 0;
  for (const auto& a : plan.program) {
    if (a.kind == ActionKind::all_reduce) {
      ++reductions;
      EXPECT_EQ(a.micro, 3);
    }
  }
  EXPECT_EQ(reductions, plan.reduce_buckets.size());
  auto message = [&](std::vector<PassRef> passes) {
    try {
      make_plan(three_blocks(), default_schedule(3), c, 2, 0, std::move(passes));
    } catch (const ConfigError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(message({{0, Pass::backward}}).find("backward of micro-batch 0 comes out of order"), std::string::npos);
  EXPECT_NE(message({{1, Pass::forward}}).find("forward of micro-batch 1 comes out of order"), std::string::npos);
  EXPECT_NE(message(sequential_passes(3)).find("the cycle has 4 micro-batches"), std::string::npos);
}

}  // namespace
}  // namespace zeroth

namespace zeroth {
namespace {

// Stage 3 with micro-batches interleaved (a pipeline's or a 1F1B pass order): when every block of
// the rank fits in stage3_max_live_parameters, each is gathered once per cycle and released after
// its last use; when they do not, per micro-batch and pass as in a sequential order.
TEST(Plan, InterleavedMicroBatchesKeepStageThreeGathersForTheCycleWhenTheyFit) {
  EngineConfig c = stage3(0, 0);
  c.gradient_accumulation_steps = 4;
  auto gathers = [](const Plan& p) {
    std::map<int, int> n;
    for (const auto& a : p.program) n[a.block] += a.kind == ActionKind::gather ? 1 : 0;
    return n;
  };
  const auto kept = make_plan(three_blocks(), default_schedule(3), c, 2, 0, one_f_one_b_passes(4, 2));
  for (const auto& [block, n] : gathers(kept)) EXPECT_EQ(n, kept.blocks[block].persistent ? 0 : 1) << "block " << block;
  const auto sequential = make_plan(three_blocks(), default_schedule(3), c, 2, 0);
  // At least once per micro-batch (a block whose backward directly follows its forward keeps it).
  for (const auto& [block, n] : gathers(sequential)) EXPECT_GE(n, sequential.blocks[block].persistent ? 0 : 4) << "block " << block;
  c.zero.stage3_max_live_parameters = kept.total_padded - 1;  // not all at once
  const auto tight = make_plan(three_blocks(), default_schedule(3), c, 2, 0, one_f_one_b_passes(4, 2));
  for (const auto& [block, n] : gathers(tight)) EXPECT_GE(n, tight.blocks[block].persistent ? 0 : 4) << "block " << block;
  EXPECT_GT(kept.device_bytes(), sequential.device_bytes());  // the parameter arena holds them all
}

}  // namespace
}  // namespace zeroth
