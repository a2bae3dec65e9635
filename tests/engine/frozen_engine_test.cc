// Frozen blocks against the whole model trained with those blocks written back to their starting
// values after every step, on one rank at stage 0: the trainable blocks' gradients and updates are
// the same there, so every ZeRO stage, world size, offload, pipeline and tensor-parallel layout of
// the frozen run must reach the same trainable weights and losses, and leave the frozen blocks'
// values bit for bit as they started. The plans hold no gradient, reduction or optimizer state for
// a frozen block; a checkpoint saves its weights only and resumes to the uninterrupted run.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "comm/local/local_comm.h"
#include "engine/engine.h"
#include "engine/plan/plan.h"
#include "models/decoder/gpt.h"
#include "tests/engine/gpt_grid.h"
#include "train/data.h"

namespace zeroth {
namespace {

using testing::GridCase;
using testing::GridResult;

const std::vector<std::string> kFrozen = {"embed", "h.2", "h.5"};

GptConfig frozen_gpt() {
  GptConfig c = testing::tiny_gpt();
  c.frozen_blocks = kFrozen;
  return c;
}

bool is_frozen(const std::string& block) { return std::find(kFrozen.begin(), kFrozen.end(), block) != kFrozen.end(); }

// The oracle: one rank, stage 0, nothing frozen, no clipping (the global norm would count the
// frozen blocks' gradients); after each step the frozen blocks get their starting values back.
GridResult held_reference(int micro, DType compute, const std::vector<std::string>& frozen) {
  const GptConfig gc = testing::tiny_gpt();
  const TokenData data = TokenData::synthetic(gc.vocab_size, 1 << 14, 3);
  const int mb = testing::kGlobalBatch / micro, T = gc.seq_len;
  GridResult out;
  auto device = make_device("cpu");
  auto comms = make_local_communicators(1);
  EngineConfig ec = testing::grid_engine_config(0, micro, OffloadDevice::none, OptimizerKind::adamw, compute);
  ec.gradient_clipping = 0;
  Engine engine(*device, *comms[0], ec);
  Gpt gpt(engine, gc);
  engine.finalize();
  std::vector<std::vector<float>> start;
  for (size_t b = 0; b < engine.plan().blocks.size(); ++b) start.push_back(engine.master_values(static_cast<int>(b)));
  Loader loader(data, T, mb, micro, 1, 0, 11);
  std::vector<int32_t> tokens(static_cast<size_t>(mb) * T), targets(tokens.size());
  std::vector<float> losses(micro);
  for (int s = 0; s < testing::kSteps; ++s) {
    for (int m = 0; m < micro; ++m) {
      loader.batch(s, m, tokens.data(), targets.data());
      gpt.forward(m, tokens.data(), targets.data(), mb, T, &losses[m]);
      gpt.backward(m);
      engine.compute_stream().synchronize();
    }
    engine.step();
    engine.compute_stream().synchronize();
    for (size_t b = 0; b < start.size(); ++b)
      if (std::find(frozen.begin(), frozen.end(), engine.plan().blocks[b].name) != frozen.end())
        engine.set_master_values(static_cast<int>(b), start[b]);
    double sum = 0;
    for (float l : losses) sum += l;
    out.losses.push_back(sum / micro);
  }
  for (size_t b = 0; b < start.size(); ++b) {
    auto w = engine.master_values(static_cast<int>(b));
    w.resize(engine.plan().blocks[b].numel);
    out.weights[engine.plan().blocks[b].name] = std::move(w);
  }
  return out;
}

const GridResult& reference(int micro, DType compute = DType::f32, const std::vector<std::string>& frozen = kFrozen) {
  static std::map<std::tuple<int, DType, std::vector<std::string>>, GridResult> cache;
  const auto key = std::tuple(micro, compute, frozen);
  if (!cache.contains(key)) cache[key] = held_reference(micro, compute, frozen);
  return cache[key];
}

// The starting values of every block (the seed and the names decide them, not the layout); with
// bf16, a frozen block's are its bf16 parameters (it has no f32 master).
const GridResult& start_values(DType compute = DType::f32, const std::vector<std::string>& frozen = kFrozen) {
  static std::map<std::pair<DType, std::vector<std::string>>, GridResult> cache;
  const auto key = std::pair(compute, frozen);
  if (!cache.contains(key)) {
    GridCase k;
    k.model = frozen_gpt();
    k.model.frozen_blocks = frozen;
    k.compute = compute;
    cache[key] = testing::train_grid(k, nullptr, {.first = 0, .last = 0, .load = {}, .save = {}});
  }
  return cache[key];
}

GridCase frozen_case(int stage, int dp, OffloadDevice offload = OffloadDevice::none, DType compute = DType::f32) {
  GridCase k;
  k.model = frozen_gpt();
  k.compute = compute;
  k.stage = stage, k.dp = dp, k.offload = offload;
  k.micro = 2;
  k.clipping = 0;
  return k;
}

// bound: the trainable weights' largest difference from the reference's, relative to the tensor's
// largest value (f32 sums in another order; tensor_parallel_test.cc and runner_test.cc use 2e-6).
void expect_frozen_run(const GridCase& k, double bound = 2e-6, double loss_bound = 3e-7) {
  const GridResult got = testing::train_grid(k);
  const GridResult& ref = reference(k.micro, k.compute, k.model.frozen_blocks);
  const GridResult& start = start_values(k.compute, k.model.frozen_blocks);
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < ref.losses.size(); ++s) EXPECT_NEAR(got.losses[s], ref.losses[s], loss_bound * ref.losses[s]) << "step " << s;
  EXPECT_LT(got.losses.back(), got.losses.front());
  size_t frozen = 0;
  double worst = 0;
  for (const auto& spec : Gpt::block_specs(k.model)) {
    const auto& g = got.weights.at(spec.name);
    if (spec.frozen) {
      ++frozen;
      EXPECT_EQ(g, start.weights.at(spec.name)) << spec.name << " is frozen but its values changed";
      continue;
    }
    const auto e = testing::compare(spec.name, g, ref.weights.at(spec.name));
    EXPECT_LT(e.rel(), bound) << spec.name << ": max |difference| " << e.max_abs << " of max |value| " << e.scale;
    worst = std::max(worst, e.rel());
    EXPECT_NE(g, start.weights.at(spec.name)) << spec.name << " trains but did not move";
  }
  EXPECT_EQ(frozen, k.model.frozen_blocks.size());
  std::printf("stage %d dp %d pp %d tp %d offload %s %s: worst trainable weight error %.3g\n", k.stage, k.dp, k.pp, k.tp,
              std::string(offload_device_name(k.offload)).c_str(), std::string(dtype_name(k.compute)).c_str(), worst);
}

TEST(FrozenBlocks, ReferenceMovesOnlyTheTrainableBlocks) {
  const GridResult& ref = reference(2);
  for (const auto& [name, w] : ref.weights) {
    if (is_frozen(name)) {
      EXPECT_EQ(w, start_values().weights.at(name)) << name;
    } else {
      EXPECT_NE(w, start_values().weights.at(name)) << name;
    }
  }
}

struct Layout {
  int stage, dp;
  OffloadDevice offload;
};
void PrintTo(const Layout& l, std::ostream* os) {
  *os << "ZeRO " << l.stage << ", dp " << l.dp << ", offload " << offload_device_name(l.offload);
}

class FrozenLayouts : public ::testing::TestWithParam<Layout> {};

TEST_P(FrozenLayouts, TrainsAsTheHeldReference) {
  const Layout l = GetParam();
  expect_frozen_run(frozen_case(l.stage, l.dp, l.offload));
}

INSTANTIATE_TEST_SUITE_P(Stages, FrozenLayouts,
                         ::testing::Values(Layout{0, 1, OffloadDevice::none}, Layout{0, 2, OffloadDevice::none},
                                           Layout{1, 1, OffloadDevice::none}, Layout{1, 2, OffloadDevice::none},
                                           Layout{2, 1, OffloadDevice::none}, Layout{2, 2, OffloadDevice::none},
                                           Layout{3, 1, OffloadDevice::none}, Layout{3, 2, OffloadDevice::none},
                                           Layout{2, 2, OffloadDevice::cpu}, Layout{3, 2, OffloadDevice::cpu},
                                           Layout{3, 2, OffloadDevice::nvme}));

TEST(FrozenBlocks, PipelineWithTheTiedEmbeddingFrozenOnBothStages) {
  GridCase k = frozen_case(1, 1);
  k.pp = 2;
  expect_frozen_run(k);
}

// bf16: the frozen blocks live as bf16 parameters only (no f32 master), read widened when saved or
// inspected. Against the held reference in bf16, whose activations and gradients round alike: the
// trainable weights within bf16's order-of-sums noise (gpt_equivalence_test.cc's 2e-2), the frozen
// ones bit for bit their bf16 start.
TEST(FrozenBlocks, Bf16HoldsTheFrozenWeightsInBf16Only) {
  for (const auto& [stage, offload] : {std::pair{1, OffloadDevice::none}, std::pair{3, OffloadDevice::cpu}}) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    expect_frozen_run(frozen_case(stage, 2, offload, DType::bf16), 2e-2, 2e-5);
  }
}

TEST(FrozenBlocks, TensorParallel) {
  GridCase k = frozen_case(1, 1);
  k.tp = 2;
  // Unclipped steps of lr 1e-2 move the LayerNorm weights (largest value 1.01) further than the
  // clipped runs of tensor_parallel_test.cc: the split products' other order of sums shows as
  // 2.8e-6 of them.
  expect_frozen_run(k, 4e-6);
}

// The plan: no state but the parameters for a frozen block, placed after the trainable ones; the
// optimizer's bytes are the trainable share of the unfrozen plan's, exactly.
TEST(FrozenBlocks, PlanHoldsParametersOnly) {
  for (int stage = 0; stage <= 3; ++stage) {
    SCOPED_TRACE("stage " + std::to_string(stage));
    EngineConfig ec = testing::grid_engine_config(stage, 2, OffloadDevice::none, OptimizerKind::adamw, DType::bf16);
    const auto all = Gpt::block_specs(testing::tiny_gpt());
    const auto some = Gpt::block_specs(frozen_gpt());
    const Plan whole = make_plan(all, Gpt::schedule(testing::tiny_gpt()), ec, 2, 1);
    const Plan held = make_plan(some, Gpt::schedule(frozen_gpt()), ec, 2, 1);
    size_t frozen_padded = 0, frozen_shard = 0;
    bool trainable_seen_after_frozen = false, frozen_seen = false;
    for (int b : held.shard_order) {
      const auto& blk = held.blocks[b];
      if (!blk.frozen) {
        trainable_seen_after_frozen = trainable_seen_after_frozen || frozen_seen;
        continue;
      }
      frozen_seen = true;
      frozen_padded += blk.padded, frozen_shard += blk.shard;
      EXPECT_NE(held.find(StateKind::param_shard, b), nullptr);
      for (StateKind kind : {StateKind::master, StateKind::moment0, StateKind::moment1, StateKind::grad_accum, StateKind::grad_shard})
        EXPECT_EQ(held.find(kind, b), nullptr) << blk.name << " holds " << state_kind_name(kind);
      EXPECT_EQ(blk.reduce_bucket, -1) << blk.name;
      EXPECT_EQ(blk.gather_bucket, -1) << blk.name;
    }
    EXPECT_TRUE(frozen_seen);
    EXPECT_FALSE(trainable_seen_after_frozen) << "a trainable block comes after a frozen one in shard order";
    EXPECT_EQ(held.trainable_shard, whole.shard_numel - frozen_shard);
    EXPECT_EQ(held.trainable_padded, whole.total_padded - frozen_padded);
    EXPECT_EQ(held.shard_numel, whole.shard_numel);
    const auto bytes = [](const Plan& p, MemTag tag) { return at(p.bytes, Tier::device, tag); };
    // Master and both moments in f32 over the owned trainable elements.
    const size_t owned = stage == 0 ? held.trainable_padded : held.trainable_shard;
    EXPECT_EQ(bytes(held, MemTag::optimizer), owned * 12);
    EXPECT_EQ(bytes(held, MemTag::params), bytes(whole, MemTag::params));
    EXPECT_LT(bytes(held, MemTag::grads), bytes(whole, MemTag::grads));
    for (const auto& a : held.program) {
      if (const auto* p = a.as<op::PlaceGrads>()) {
        EXPECT_FALSE(held.blocks[p->block].frozen) << held.blocks[p->block].name;
      }
      if (const auto* p = a.as<op::Accumulate>()) {
        EXPECT_FALSE(held.blocks[p->block].frozen) << held.blocks[p->block].name;
      }
    }
  }
}

// A pipeline stage of frozen layers alone (the first stage: the tied embedding and layers 0-3): it
// reduces and updates nothing, joins the global norm's sum over the stages with nothing of its own,
// and the other stage trains as the held reference does.
TEST(FrozenBlocks, APipelineStageOfFrozenLayersAlone) {
  GridCase k = frozen_case(1, 2);
  k.pp = 2;
  k.model.frozen_blocks = {"embed", "h.0", "h.1", "h.2", "h.3"};
  expect_frozen_run(k);
}

// A checkpoint of the frozen run saves the frozen blocks' weights without optimizer arrays; two
// steps, a save at dp 2, and two more at dp 1 and stage 3 from it end where four steps do. In
// bf16 the frozen weights are saved from their bf16 parameters (widened) and load back bit for bit.
TEST(FrozenBlocks, CheckpointSavesWeightsOnlyAndResumes) {
  for (DType compute : {DType::f32, DType::bf16}) {
    SCOPED_TRACE(std::string(dtype_name(compute)));
    const bool narrow = compute != DType::f32;
    const std::string dir = ::testing::TempDir() + "zeroth-frozen-ckpt-" + std::to_string(::getpid());
    std::filesystem::remove_all(dir);
    GridCase first = frozen_case(2, 2, OffloadDevice::none, compute);
    testing::train_grid(first, nullptr, {.first = 0, .last = 2, .load = {}, .save = dir});
    std::ifstream in(dir + "/step-2/manifest.json");
    ASSERT_TRUE(in) << "no manifest in " << dir << "/step-2";
    const auto manifest = nlohmann::json::parse(in);
    size_t frozen_tensors = 0;
    for (const auto& t : manifest.at("tensors")) {
      const std::string name = t.at("name");
      const std::string block = name.starts_with("h.") ? name.substr(0, name.find('.', 2)) : name.substr(0, name.find('.'));
      EXPECT_EQ(t.value("frozen", false), is_frozen(block)) << name;
      if (t.value("frozen", false)) {
        ++frozen_tensors;
        EXPECT_TRUE(t.contains("fp32")) << name;
        EXPECT_FALSE(t.contains("exp_avg")) << name << " is frozen but saved a moment";
      } else {
        EXPECT_TRUE(t.contains("exp_avg")) << name;
      }
    }
    EXPECT_GT(frozen_tensors, 0u);
    GridCase second = frozen_case(3, 1, OffloadDevice::none, compute);
    const GridResult resumed = testing::train_grid(second, nullptr, {.first = 2, .last = testing::kSteps, .load = dir, .save = {}});
    const GridResult& ref = reference(2, compute);
    ASSERT_EQ(resumed.losses.size(), static_cast<size_t>(testing::kSteps - 2));
    ASSERT_EQ(resumed.weights.size(), ref.weights.size());
    for (size_t s = 0; s < resumed.losses.size(); ++s)
      EXPECT_NEAR(resumed.losses[s], ref.losses[s + 2], (narrow ? 2e-5 : 3e-7) * ref.losses[s + 2]) << "step " << s + 2;
    for (const auto& [name, w] : resumed.weights) {
      if (is_frozen(name)) {
        EXPECT_EQ(w, start_values(compute).weights.at(name)) << name;
      } else {
        const auto e = testing::compare(name, w, ref.weights.at(name));
        EXPECT_LT(e.rel(), narrow ? 2e-2 : 2e-6) << name;
      }
    }
    std::filesystem::remove_all(dir);
  }
}

}  // namespace
}  // namespace zeroth
