// The ZeRO engine against itself: every stage, world size and accumulation setting must train the
// MLP to what dp=1 stage 0 computes for the same global batch; memory and traffic must match the
// plan and the ZeRO paper; overflow and budget failures must behave.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "comm/local/local_comm.h"
#include "core/error.h"
#include "models/decoder/gpt.h"
#include "tests/engine/mlp_harness.h"
#include "tests/process_util.h"

namespace zeroth {
namespace {

using testing::MlpRun;
using testing::RankResult;
using testing::run_ranks;

// Mean over ranks of each step's loss: the global batch's loss.
std::vector<double> global_losses(const std::vector<RankResult>& ranks) {
  std::vector<double> out(ranks[0].losses.size(), 0.0);
  for (const auto& r : ranks) {
    for (size_t k = 0; k < out.size(); ++k) out[k] += r.losses[k] / ranks.size();
  }
  return out;
}

// Largest |a - b| over the model, relative to the largest |b|.
double weight_error(const RankResult& a, const RankResult& b) {
  double diff = 0, scale = 0;
  for (size_t blk = 0; blk < b.weights.size(); ++blk) {
    for (size_t i = 0; i < b.weights[blk].size(); ++i) {
      diff = std::max(diff, std::abs(static_cast<double>(a.weights[blk][i]) - b.weights[blk][i]));
      scale = std::max(scale, std::abs(static_cast<double>(b.weights[blk][i])));
    }
  }
  return diff / scale;
}

const RankResult& reference(DType dtype) {
  static std::mutex mutex;
  static std::map<DType, RankResult> cache;
  std::lock_guard lock(mutex);
  if (!cache.contains(dtype)) {
    MlpRun run;
    run.dtype = dtype;
    cache[dtype] = run_ranks(1, run)[0];
  }
  return cache[dtype];
}

struct Case {
  int stage, dp, gas;
  DType dtype;
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "stage " << c.stage << ", dp " << c.dp << ", gas " << c.gas << ", " << dtype_name(c.dtype);
}

class Equivalence : public ::testing::TestWithParam<Case> {};

// f32: the only differences are the order of float sums (the batch split across ranks and
// micro-steps, the bucketed reduction): 1e-6 of the largest weight after 4 Adam steps.
// bf16: gradients are rounded to bf16 per micro-batch before they are summed, so a different
// split rounds differently; one bf16 ulp (2^-8) of the largest weight.
TEST_P(Equivalence, TrainsLikeOneRankStageZero) {
  const auto c = GetParam();
  MlpRun run;
  run.stage = c.stage;
  run.gas = c.gas;
  run.dtype = c.dtype;
  const auto ranks = run_ranks(c.dp, run);
  const auto& ref = reference(c.dtype);
  const double bound = c.dtype == DType::f32 ? 1e-6 : 0x1.0p-8;
  const auto losses = global_losses(ranks);
  for (size_t k = 0; k < losses.size(); ++k) {
    EXPECT_NEAR(losses[k], ref.losses[k], bound * std::abs(ref.losses[k])) << "step " << k;
  }
  for (int r = 0; r < c.dp; ++r) {
    const double err = weight_error(ranks[r], ref);
    EXPECT_LE(err, bound) << "rank " << r;
    if (r == 0)
      std::printf("stage %d dp %d gas %d %s: weights %.3g, loss %.3g -> %.3g\n", c.stage, c.dp, c.gas,
                  std::string(dtype_name(c.dtype)).c_str(), err, losses.front(), losses.back());
    EXPECT_EQ(ranks[r].steps.size(), 4u);
  }
  EXPECT_LT(losses.back(), losses.front()) << "training must make progress";
}

std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (int stage : {0, 1, 2, 3}) {
    for (int dp : {1, 2, 4}) {
      for (int gas : {1, 3}) out.push_back({stage, dp, gas, DType::f32});
    }
    out.push_back({stage, 4, 1, DType::bf16});
    out.push_back({stage, 2, 3, DType::bf16});
  }
  return out;
}

INSTANTIATE_TEST_SUITE_P(Stages, Equivalence, ::testing::ValuesIn(all_cases()), [](const auto& info) {
  const auto& c = info.param;
  return "stage" + std::to_string(c.stage) + "_dp" + std::to_string(c.dp) + "_gas" + std::to_string(c.gas) + "_" +
         std::string(dtype_name(c.dtype));
});

size_t tag(const std::array<size_t, kMemTagCount>& a, MemTag t) { return a[static_cast<size_t>(t)]; }

TEST(EngineMemory, MeasuredPeakPerTagIsThePlansPredictionAndStage3HoldsAQuarter) {
  std::map<int, size_t> state_bytes, arena_bytes;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int stage : {0, 1, 2, 3}) {
      MlpRun run;
      run.stage = stage;
      run.dtype = dtype;
      run.steps = 2;
      run.widths = std::vector<int>(9, 64);
      run.global_batch = 8;
      const auto ranks = run_ranks(4, run);
      for (const auto& r : ranks) {
        for (MemTag t : {MemTag::params, MemTag::grads, MemTag::optimizer}) {
          EXPECT_EQ(tag(r.peak, t), tag(r.planned, t)) << "stage " << stage << " " << dtype_name(dtype) << " " << mem_tag_name(t);
        }
      }
      if (dtype == DType::f32) {
        const auto& p = ranks[0].planned;
        state_bytes[stage] = tag(p, MemTag::params) + tag(p, MemTag::grads) + tag(p, MemTag::optimizer);
      }
    }
  }
  // Stage 3 at dp=4 keeps a quarter of stage 0's state plus its transient gather/gradient arenas.
  MlpRun run;
  run.stage = 3;
  run.widths = std::vector<int>(9, 64);
  EngineConfig c = testing::mlp_config(run);
  const auto specs = Mlp::block_specs({run.widths});
  const auto plan = make_plan(specs, default_schedule(specs.size()), c, 4, 0);
  const size_t arenas = (plan.buffer_numel(plan.param_arena) + plan.buffer_numel(plan.grad_arena)) * 4;
  std::printf("stage 0: %zu B, stage 3: %zu B (arenas %zu B)\n", state_bytes[0], state_bytes[3], arenas);
  EXPECT_LE(state_bytes[3], state_bytes[0] / 4 + arenas);
  EXPECT_LT(state_bytes[3], state_bytes[0] / 2);
}

// What the allocators hand out at finalize is the plan's bytes, tier by tier and tag by tag, for
// every stage, world size and model (the GPT allocates its own memory only when it first runs).
TEST(EngineMemory, AllocatorsHandOutThePlannedBytesPerTierAndTag) {
  GptConfig g;
  g.vocab_size = 61, g.seq_len = 16, g.n_layer = 2, g.n_head = 2, g.n_embd = 24;
  for (DType dtype : {DType::f32, DType::bf16}) {
    for (int stage : {0, 1, 2, 3}) {
      for (int dp = 1; dp <= 4; ++dp) {
        for (const char* model : {"gpt", "mlp"}) {
          MlpRun run;
          run.stage = stage;
          run.dtype = dtype;
          EngineConfig c = testing::mlp_config(run);
          c.zero.stage3_param_persistence_threshold = 100;
          run_local_ranks(dp, [&](Communicator& comm) {
            auto device = make_device("cpu");
            Engine engine(*device, comm, c);
            std::unique_ptr<Gpt> gpt;
            std::unique_ptr<Mlp> mlp;
            if (model[0] == 'g') gpt = std::make_unique<Gpt>(engine, g);
            else mlp = std::make_unique<Mlp>(engine, MlpConfig{run.widths});
            engine.finalize();
            for (size_t t = 0; t < kTierCount; ++t) {
              const auto stats = engine.tier_stats(static_cast<Tier>(t));
              for (size_t tag = 0; tag < kMemTagCount; ++tag) {
                EXPECT_EQ(stats.in_use[tag], engine.plan().bytes[t][tag])
                    << model << " " << dtype_name(dtype) << " stage " << stage << " dp " << dp << " "
                    << tier_name(static_cast<Tier>(t)) << " " << mem_tag_name(static_cast<MemTag>(tag));
              }
            }
          });
        }
      }
    }
  }
}

// The engine checks every block use against its program and says what it expected instead.
TEST(EngineProgram, UsesOutOfThePlannedOrderAreRefusedNamingTheExpectedUse) {
  MlpRun run;
  run.stage = 3;
  run.gas = 2;
  EngineConfig c = testing::mlp_config(run);
  run_local_ranks(1, [&](Communicator& comm) {
    auto device = make_device("cpu");
    Engine engine(*device, comm, c);
    Mlp mlp(engine, {run.widths});
    engine.set_pass_order(one_f_one_b_passes(2, 2));
    engine.finalize();
    // Every rank computes its initial values itself: no collective at start.
    EXPECT_EQ(engine.comm_stats().total_bytes(), 0u);
    auto message = [](auto&& fn) {
      try {
        fn();
      } catch (const InvalidArgument& e) {
        return std::string(e.what());
      }
      return std::string("accepted");
    };
    EXPECT_NE(message([&] { engine.end_forward(0, 0); }).find("before its begin_forward"), std::string::npos);
    EXPECT_NE(message([&] {
                engine.begin_backward(0, 0);
              }).find("out of order: the program's next use is the forward of block layer0 for micro-batch 0"),
              std::string::npos);
    engine.begin_forward(0, 0);
    EXPECT_NE(message([&] { engine.end_forward(0, 1); }).find("out of order"), std::string::npos);
    engine.end_forward(0, 0);
    EXPECT_NE(message([&] { engine.step(); }).find("not at the end of a backward pass"), std::string::npos);
    // The MLP keeps one micro-batch of activations; a pass order with two in flight is refused.
    EXPECT_NE(message([&] {
                float loss;
                std::vector<float> x(64), t(64);
                mlp.forward_backward(x.data(), t.data(), 1, &loss, 0);
              }).find("2 in flight"),
              std::string::npos);
    engine.compute_stream().synchronize();
  });
}

// On a process grid the engine partitions over the grid's data-parallel group: with dp 2 x tp 2,
// each tensor-parallel pair (the same data) holds what a plain dp-2 run holds, bit for bit.
TEST(EngineGrid, PartitionsOverTheGridsDataParallelGroup) {
  MlpRun run;
  run.stage = 3;
  run.gas = 2;
  const auto plain = run_ranks(2, run);
  std::vector<RankResult> grid_results(4);
  run_local_ranks(4, [&](Communicator& world) {
    const ProcessGrid grid(2, 1, 2);
    auto groups = grid.split(world);
    grid_results[world.rank()] = testing::train_mlp(*groups.dp, run, &groups);
  });
  for (int r = 0; r < 4; ++r) {
    const int dp_index = ProcessGrid(2, 1, 2).coords(r).dp;
    EXPECT_EQ(grid_results[r].weights, plain[dp_index].weights) << "rank " << r;
    EXPECT_EQ(grid_results[r].losses, plain[dp_index].losses) << "rank " << r;
  }
}

// The next cycle's gathers read the parameter shards the step just wrote; the engine orders
// them itself, with no host synchronisation between the step and the next forward.
TEST(EngineStreams, Stage3GathersAfterAStepSeeTheUpdateWithoutAHostSync) {
  MlpRun run;
  run.stage = 3;
  run.synchronize_steps = false;
  const auto ranks = run_ranks(2, run);
  const auto& ref = reference(DType::f32);
  for (const auto& r : ranks) EXPECT_LE(weight_error(r, ref), 1e-6);
  const auto losses = global_losses(ranks);
  for (size_t k = 0; k < losses.size(); ++k) EXPECT_NEAR(losses[k], ref.losses[k], 1e-6 * ref.losses[k]) << "step " << k;
}

// overlap_comm = false runs the same collectives in the same order on the compute stream: the
// numbers are bit for bit those of the overlapped run (and both those of one rank, to 1e-6).
TEST(EngineStreams, OverlapCommOffTrainsBitIdenticallyToOverlapOn) {
  const auto& ref = reference(DType::f32);
  for (int stage : {0, 1, 2, 3}) {
    MlpRun run;
    run.stage = stage;
    run.gas = 2;
    const auto overlapped = run_ranks(2, run);
    run.tweak = [](EngineConfig& c) { c.zero.overlap_comm = false; };
    const auto serial = run_ranks(2, run);
    for (int r = 0; r < 2; ++r) {
      EXPECT_EQ(serial[r].losses, overlapped[r].losses) << "stage " << stage << " rank " << r;
      EXPECT_EQ(serial[r].weights, overlapped[r].weights) << "stage " << stage << " rank " << r;
      EXPECT_EQ(serial[r].comm_bytes_per_step, overlapped[r].comm_bytes_per_step) << "stage " << stage << " rank " << r;
      EXPECT_LE(weight_error(serial[r], ref), 1e-6) << "stage " << stage << " rank " << r;
    }
  }
}

TEST(EngineTraffic, BytesPerStepAreTwoPsiForStages0To2AndThreePsiForStage3) {
  for (int stage : {0, 1, 2, 3}) {
    MlpRun run;
    run.stage = stage;
    run.steps = 2;
    const auto ranks = run_ranks(4, run);
    // Psi: every block's padded size, in f32 bytes; the norm's all-reduce adds 8 bytes for 1-3.
    EngineConfig c = testing::mlp_config(run);
    const auto specs = Mlp::block_specs({run.widths});
    const auto plan = make_plan(specs, default_schedule(specs.size()), c, 4, 0);
    const uint64_t psi = plan.total_padded * 4;
    uint64_t expected = 2 * psi;
    if (stage >= 1) expected += 8;
    // Stage 3 gathers every block for forward and again for backward, except the last one, which
    // backward uses right away (reuse distance 0 keeps it).
    if (stage == 3) expected += psi - plan.blocks.back().padded * 4;
    for (const auto& r : ranks) EXPECT_EQ(r.comm_bytes_per_step, expected) << "stage " << stage;
    std::printf("stage %d: %.3f Psi per step\n", stage, static_cast<double>(ranks[0].comm_bytes_per_step) / psi);
  }
}

TEST(EngineOverflow, AnInfOnOneRankSkipsTheStepEverywhereAndLowersTheScale) {
  for (int stage : {0, 2, 3}) {
    MlpRun clean;
    clean.stage = stage;
    clean.dtype = DType::f16;
    clean.steps = 1;
    MlpRun poisoned = clean;
    poisoned.steps = 2;
    poisoned.poison_rank = 1;
    poisoned.poison_step = 1;
    const auto a = run_ranks(2, clean);
    const auto b = run_ranks(2, poisoned);
    for (int r = 0; r < 2; ++r) {
      ASSERT_EQ(b[r].steps.size(), 2u);
      EXPECT_FALSE(b[r].steps[0].skipped);
      EXPECT_TRUE(b[r].steps[1].skipped) << "stage " << stage << " rank " << r;
      EXPECT_EQ(b[r].final_loss_scale, a[r].final_loss_scale / 2) << "rank " << r;
      EXPECT_EQ(b[r].steps[1].step, 1);
      // No rank moved: the weights are bit for bit those after the first step.
      EXPECT_EQ(b[r].weights, a[r].weights) << "stage " << stage << " rank " << r;
    }
  }
}

// DeepSpeed steps its scheduler after applied steps only: step k of those applied runs the lr of
// iteration k - 2 (WarmupLR linear, W = 3, 1e-3 -> 1e-2: 1e-3 from the constructor, 1e-3 at
// iteration 0, then 1e-3 + 9e-3 / 3), whatever was skipped in between.
TEST(EngineSchedule, ASkippedStepDoesNotAdvanceTheSchedule) {
  MlpRun run;
  run.dtype = DType::f16;
  run.steps = 5;
  run.poison_rank = 0;
  run.poison_step = 1;
  const auto ranks = run_ranks(1, run);
  const auto& steps = ranks[0].steps;
  ASSERT_EQ(steps.size(), 5u);
  EXPECT_TRUE(steps[1].skipped);
  const double want[] = {1e-3, 1e-3, 1e-3 + 9e-3 / 3, 1e-3 + 9e-3 * 2 / 3};
  int applied = 0;
  for (const auto& s : steps) {
    if (s.skipped) continue;
    EXPECT_DOUBLE_EQ(s.lr, want[applied]) << "applied step " << applied + 1;
    EXPECT_EQ(s.step, ++applied);
  }
}

// OneCycle's cycle_momentum writes (beta1, 0.99) into the optimizer: a flat cycle (lr and momentum
// bounds equal) must train exactly as a constant lr with those betas, at a stage that shards.
TEST(EngineSchedule, OneCycleMomentumReachesTheOptimizer) {
  auto run_with = [](std::function<void(EngineConfig&)> tweak) {
    MlpRun run;
    run.stage = 2;
    run.tweak = std::move(tweak);
    return run_ranks(2, run)[0].weights;
  };
  auto one_cycle = [](bool momentum) {
    return [momentum](EngineConfig& c) {
      c.schedule = LrSchedule::from_deepspeed(nlohmann::json{{"type", "OneCycle"},
                                                             {"params",
                                                              {{"cycle_min_lr", 1e-2},
                                                               {"cycle_max_lr", 1e-2},
                                                               {"cycle_min_mom", 0.5},
                                                               {"cycle_max_mom", 0.5},
                                                               {"cycle_momentum", momentum}}}},
                                              c.optimizer.lr);
    };
  };
  const auto constant = run_with([](EngineConfig& c) {
    c.schedule = LrSchedule{};
    c.schedule.base_lr = 1e-2;
    c.optimizer.beta1 = 0.5;
    c.optimizer.beta2 = 0.99;
  });
  EXPECT_EQ(run_with(one_cycle(true)), constant);
  EXPECT_NE(run_with(one_cycle(false)), constant) << "without cycle_momentum the optimizer's own betas (0.9, 0.999) apply";
}

// DeepSpeed divides each micro-batch's loss by the accumulation count before backward, so an
// f16 gradient overflows at a loss scale gas times larger than without accumulation. With every
// micro-batch holding the same rows, the smallest overflowing scale moves by exactly log2(4) = 2
// powers of two.
TEST(EngineLossScale, AccumulatedMicroBatchesSeeTheLossScaleOverTheAccumulationCount) {
  auto first_overflowing_power = [](int gas) {
    for (int power = 0; power <= 40; ++power) {
      MlpRun run;
      run.dtype = DType::f16;
      run.steps = 1;
      run.gas = gas;
      run.global_batch = 6 * gas;
      run.repeat_first_micro = true;
      run.tweak = [power](EngineConfig& c) { c.loss_scaler.initial_scale_power = power; };
      if (run_ranks(1, run)[0].steps[0].skipped) return power;
    }
    return -1;
  };
  const int single = first_overflowing_power(1);
  ASSERT_GT(single, 0) << "no loss scale up to 2^40 overflowed the f16 gradients";
  EXPECT_EQ(first_overflowing_power(4), single + 2);
}

TEST(EngineMemory, APlanOverTheDeviceBudgetFailsBeforeTheFirstStepWithItsNumbers) {
  MlpRun run;
  run.stage = 1;
  run.memory_budget = 16 * 1024;
  try {
    run_ranks(2, run);
    FAIL() << "a plan over budget was accepted";
  } catch (const OutOfMemory& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the ZeRO stage 1 plan needs"), std::string::npos) << what;
    EXPECT_NE(what.find("optimizer"), std::string::npos) << what;
    EXPECT_NE(what.find("raise zero_optimization.stage"), std::string::npos) << what;
    EXPECT_NE(what.find("nothing was allocated"), std::string::npos) << what;
  }
}

TEST(EngineGloo, Stage3InProcessesTrainsLikeOneRankStageZero) {
  const int port = testing::free_port();
  std::vector<testing::Child> ranks;
  std::vector<std::string> outputs;
  for (int r = 0; r < 2; ++r) {
    outputs.push_back(::testing::TempDir() + "engine_gloo_" + std::to_string(r) + ".json");
    std::remove(outputs.back().c_str());
    ranks.push_back(testing::spawn({std::string(ZEROTH_TEST_BIN_DIR) + "/engine_gloo_worker", outputs.back()},
                                   {"RANK=" + std::to_string(r), "WORLD_SIZE=2", "LOCAL_RANK=" + std::to_string(r),
                                    "LOCAL_WORLD_SIZE=2", "MASTER_ADDR=127.0.0.1", "MASTER_PORT=" + std::to_string(port)},
                                   outputs.back() + ".log"));
  }
  for (auto& child : ranks) ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(120)), 0) << child.output();
  const auto& ref = reference(DType::f32);
  std::vector<RankResult> results(2);
  for (int r = 0; r < 2; ++r) {
    std::ifstream in(outputs[r]);
    const auto j = nlohmann::json::parse(in);
    results[r].losses = j["losses"].get<std::vector<double>>();
    results[r].weights = j["weights"].get<std::vector<std::vector<float>>>();
    const double err = weight_error(results[r], ref);
    std::printf("gloo stage 3 rank %d: weights %.3g\n", r, err);
    EXPECT_LE(err, 1e-6);
  }
  const auto losses = global_losses(results);
  for (size_t k = 0; k < losses.size(); ++k) EXPECT_NEAR(losses[k], ref.losses[k], 1e-6 * ref.losses[k]) << "step " << k;
}

}  // namespace
}  // namespace zeroth
