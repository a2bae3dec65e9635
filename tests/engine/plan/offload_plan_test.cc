// The plan of an offloaded optimizer step: sub-groups swapped through slots in pipeline order,
// the reductions' dtype where gradients are swapped, offload_ratio's split between the device and
// the swap files, and the order updates are published in at stage 3.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/plan/plan.h"
#include "tests/engine/plan/plan_fixture.h"

namespace zeroth {
namespace {

using namespace plan_fixture;

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

// The swap slot an action passes its sub-group through, 0 for those without one.
int slot_of(const Action& a) {
  return std::visit(
      [](const auto& o) {
    if constexpr (requires { o.slot; }) return o.slot;
    return 0;
      },
      a.op);
}

// The step's program but its norms, as "kind target/slot ...".
std::string step_text(const Plan& plan) {
  std::string step;
  for (const auto& a : plan.step_program) {
    if (a.kind() == ActionKind::grad_norm) continue;
    step += fmt::format("{} {}/{} ", action_name(a.kind()), action_target(a), slot_of(a));
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
    if (plan.program[i].kind() != ActionKind::reduce_scatter) continue;
    ++reductions;
    ASSERT_LT(i + 1, plan.program.size());
    offloads += plan.program[i + 1].kind() == ActionKind::offload_grads &&
                action_target(plan.program[i + 1]) == action_target(plan.program[i]);
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
    if (a.kind() == ActionKind::offload_grads) offloaded_buckets.push_back(action_target(a));
  }
  EXPECT_EQ(offloaded_buckets, std::vector<int>{plan.blocks[0].reduce_bucket});
  EXPECT_NE(plan.table().find("1 of 2 reduce bucket(s) kept on the device"), std::string::npos) << plan.table();
  // offload_optimizer.overlap_backward (the default): the offloaded sub-groups are updated during
  // the backward pass, right after the offload_grads that makes their gradients final (a's, the
  // last block's backward), in the slots the step program gives them.
  std::string in_backward;
  bool after_offload = false;
  for (const auto& a : plan.program) {
    if (a.kind() == ActionKind::offload_grads) after_offload = true;
    if (a.kind() == ActionKind::swap_in || a.kind() == ActionKind::update || a.kind() == ActionKind::upload ||
        a.kind() == ActionKind::swap_out) {
      EXPECT_TRUE(after_offload) << action_name(a.kind()) << " " << action_target(a);
      EXPECT_EQ(a.block, 0);
      in_backward += fmt::format("{} {}/{} ", action_name(a.kind()), action_target(a), slot_of(a));
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

}  // namespace
}  // namespace zeroth
