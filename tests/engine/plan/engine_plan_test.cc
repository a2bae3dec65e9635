// The plan by itself: layout, shard order, stage-3 gathers and releases along a schedule with a
// tied block, the dry-run arenas, the JSON dump, and configuration errors. The offloaded step's
// plan is in offload_plan_test.cc.
#include <gtest/gtest.h>

#include <map>

#include <algorithm>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "engine/plan/plan.h"
#include "tests/engine/plan/plan_fixture.h"
#include "models/decoder/gpt.h"
#include "models/mlp/mlp.h"

namespace zeroth {
namespace {

using namespace plan_fixture;

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
    if (a.kind() == kind) out.push_back(kind == ActionKind::run ? a.block : action_target(a));
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
    if (a.kind() == ActionKind::place_grads && action_target(a) == 0) {
      EXPECT_EQ(a.use, 4);
    }
    if (a.kind() == ActionKind::reduce_scatter && action_target(a) == plan.blocks[0].reduce_bucket) {
      EXPECT_EQ(a.use, 7);
    }
  }
  EXPECT_EQ(targets(plan.program, ActionKind::place_grads), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(std::count(plan.program.begin(), plan.program.end(),
                       Action{op::ReduceScatter{plan.blocks[0].reduce_bucket, false}, 7, 0, 0, Pass::backward}),
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
    if (a.use == 0 && a.kind() == ActionKind::gather) first_use.push_back(action_target(a));
  }
  EXPECT_EQ(first_use, (std::vector<int>{0, 1, 2}));
  // The arena holds all three at once: the peak is their padded sum.
  EXPECT_EQ(plan.buffer_numel(plan.param_arena), plan.blocks[0].padded + plan.blocks[1].padded + plan.blocks[2].padded);
  c.zero.stage3_max_live_parameters = plan.blocks[0].padded + plan.blocks[1].padded;
  const auto limited = make_plan(three_blocks(), default_schedule(3), c, 2, 0);
  size_t gathers = 0;
  for (const auto& a : limited.program) gathers += a.use == 0 && a.kind() == ActionKind::gather;
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

// overlap_comm = false moves every collective of a block use onto the compute stream and changes
// nothing else: the same actions in the same order, so the same arithmetic.
TEST(Plan, OverlapCommOffRunsEachCycleCollectiveOnTheComputeStreamAndChangesNothingElse) {
  auto is_collective = [](const Action& a) {
    return a.kind() == ActionKind::gather || a.kind() == ActionKind::all_reduce || a.kind() == ActionKind::reduce_scatter;
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
      for (const auto& a : *program) EXPECT_EQ(a.serial, is_collective(a)) << "stage " << stage << ": " << action_name(a.kind());
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
    if (a.kind() == ActionKind::all_reduce) {
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


// Stage 3 with micro-batches interleaved (a pipeline's or a 1F1B pass order): when every block of
// the rank fits in stage3_max_live_parameters, each is gathered once per cycle and released after
// its last use; when they do not, per micro-batch and pass as in a sequential order.
TEST(Plan, InterleavedMicroBatchesKeepStageThreeGathersForTheCycleWhenTheyFit) {
  EngineConfig c = stage3(0, 0);
  c.gradient_accumulation_steps = 4;
  auto gathers = [](const Plan& p) {
    std::map<int, int> n;
    for (const auto& a : p.program) n[a.block] += a.kind() == ActionKind::gather ? 1 : 0;
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
