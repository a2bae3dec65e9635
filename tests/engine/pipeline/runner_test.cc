// Pipelines on the engine: a tiny GPT split over p stages (and over dp data-parallel ranks per
// stage) with GPipe, 1F1B and interleaved 1F1B trains to what one rank computes for the same
// global batches, at every ZeRO stage; the tied embedding's two copies stay identical; the order the
// runner runs its passes in has the formula's bubble on a model clock; a stage that dies ends every
// rank with an error naming it.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <filesystem>
#include <cmath>
#include <map>
#include <mutex>
#include <string>
#include <thread>
#include <tuple>

#include <unistd.h>
#include <vector>

#include "comm/local/local_comm.h"
#include "comm/process_grid.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/engine.h"
#include "engine/pipeline/runner.h"
#include "models/decoder/gpt.h"
#include "tests/engine/gpt_grid.h"
#include "train/data.h"

namespace zeroth {
namespace {

using testing::GridCase;
using testing::GridResult;
using testing::kGlobalBatch;
using testing::kSteps;
using testing::train_grid;

GptConfig tiny() { return testing::tiny_gpt(); }
const GridResult& reference(int micro) { return testing::whole_reference(tiny(), micro); }

class PipelineEquivalence : public ::testing::TestWithParam<GridCase> {};

// Against one rank running the same micro-batches in turn, in f32: only the order of float sums
// differs (the batch split over dp, the bucketed reductions, the tied embedding's gradient added
// over the stage pair instead of in one buffer), so the bounds are those of the data-parallel
// equivalence (gpt_equivalence_test.cc): weights 2e-6 of each tensor's largest value, gradient
// norms 5e-7 and losses 3e-7 relative.
TEST_P(PipelineEquivalence, TrainsLikeOneRank) {
  const auto k = GetParam();
  const auto got = train_grid(k);
  const auto& ref = reference(k.micro);
  const testing::TensorError worst = testing::expect_weights(got, ref, 2e-6);
  // The last stage's copy of the tied embedding: the same gradients, the same update, bit for bit.
  if (k.pp > 1) {
    EXPECT_EQ(got.head_copy, got.weights.at("embed")) << "the two copies of the tied embedding differ";
  }
  const auto [norm_err, loss_err] = testing::expect_steps(got, ref);
  std::printf("dp %d pp %d %s stage %d: worst weight error %.3g (%s), gradient norm %.3g, loss %.3g; loss %.6f -> %.6f\n", k.dp, k.pp,
              pipe_kind_name(k.kind).data(), k.stage, worst.rel(), worst.name.c_str(), norm_err, loss_err, got.losses.front(),
              got.losses.back());
}

std::vector<GridCase> cases() {
  std::vector<GridCase> out;
  for (auto [dp, pp] : {std::pair{1, 2}, std::pair{1, 4}, std::pair{2, 2}}) {
    for (PipeKind kind : {PipeKind::gpipe, PipeKind::one_f_one_b, PipeKind::interleaved}) {
      for (int stage : {0, 1, 2, 3}) out.push_back({dp, pp, kind, stage, 4});
    }
  }
  // Offload composes (the tied embedding's gradients summed through the device from host memory
  // or the swap file), and activation checkpointing recomputes each stage's layers.
  out.push_back({1, 2, PipeKind::one_f_one_b, 2, 4, OffloadDevice::cpu});
  out.push_back({2, 2, PipeKind::interleaved, 2, 4, OffloadDevice::nvme});
  out.push_back({2, 2, PipeKind::gpipe, 1, 4, OffloadDevice::cpu});
  out.push_back({2, 2, PipeKind::gpipe, 3, 4, OffloadDevice::cpu});
  out.push_back({2, 2, PipeKind::interleaved, 3, 4, OffloadDevice::nvme});
  out.push_back({1, 4, PipeKind::one_f_one_b, 1, 4, OffloadDevice::none, true});
  // Buckets of many blocks (DeepSpeed's default size): a rank's two interleaved chunks reduce apart.
  for (int stage : {1, 2, 3}) out.push_back({2, 2, PipeKind::interleaved, stage, 4, OffloadDevice::none, false, 500'000'000});
  return out;
}

std::string name(const ::testing::TestParamInfo<GridCase>& info) {
  const auto& k = info.param;
  const char* kinds[] = {"GPipe", "OneFOneB", "Interleaved"};
  const char* offload[] = {"", "OffloadCpu", "OffloadNvme"};
  return "Dp" + std::to_string(k.dp) + "Pp" + std::to_string(k.pp) + kinds[static_cast<int>(k.kind)] + "Zero" +
         std::to_string(k.stage) + offload[static_cast<int>(k.offload)] + (k.checkpointing ? "Ckpt" : "") +
         (k.bucket > 6000 ? "BigBuckets" : "");
}

INSTANTIATE_TEST_SUITE_P(Cases, PipelineEquivalence, ::testing::ValuesIn(cases()), name);

// Sub-groups updated during the backward pass compose with a pipeline whose stages tie the token
// embedding to the LM head: the tied copies' gradients are summed over the stage pair only at the
// step, so their sub-groups stay in the step (tie_block takes them out of the backward pass).
// Against the same pipeline with the optimizer after the backward pass, with clipping that never
// bites so every step's speculation is kept: losses, norms, weights and both copies of the tied
// embedding bit for bit.
TEST(PipelineOverlap, UpdatesInTheBackwardPassLeaveTheTiedEmbeddingToTheStep) {
  for (int stage : {1, 2, 3}) {
    GridCase k{2, 2, PipeKind::interleaved, stage, 4, OffloadDevice::nvme};
    k.clipping = 1e9;
    const auto overlapped = train_grid(k);
    k.overlap_backward = false;
    const auto serial = train_grid(k);
    SCOPED_TRACE("stage " + std::to_string(stage));
    EXPECT_EQ(overlapped.losses, serial.losses);
    EXPECT_EQ(overlapped.grad_norms, serial.grad_norms);
    EXPECT_EQ(overlapped.weights, serial.weights);
    EXPECT_EQ(overlapped.head_copy, serial.head_copy);
    EXPECT_EQ(overlapped.head_copy, overlapped.weights.at("embed"));
  }
}

// A bf16 reduction at stage 1 keeps the offloaded gradients in bf16 in their swap file, but the
// tied embedding's are summed over the stage pair in f32 at the step: the plan widens that file
// again (tie_block) on the first and last of four stages, and the middle two keep bf16. The same
// pipeline with the optimizer in host memory, where the gradients are f32 throughout, gives the
// same losses and weights bit for bit; read as bf16, the summed gradients would not (NaN from the
// second step). Clipping never bites: the norms may differ in their last bits (below).
TEST(PipelineOffload, TheTiedEmbeddingsSwappedGradientsStayF32UnderANarrowReduction) {
  GridCase k{1, 4, PipeKind::gpipe, 1, 4, OffloadDevice::nvme};
  k.clipping = 1e9;
  k.compute = DType::bf16;
  k.reduction = DType::bf16;
  const auto nvme = train_grid(k);
  k.offload = OffloadDevice::cpu;
  const auto cpu = train_grid(k);
  EXPECT_EQ(nvme.losses, cpu.losses);
  // The norm's f32 partial sums run over chunks whose bounds follow each block's padding, which the
  // swap file's 4 KiB alignment changes: equal to f32's rounding, not bit for bit.
  ASSERT_EQ(nvme.grad_norms.size(), cpu.grad_norms.size());
  for (size_t i = 0; i < cpu.grad_norms.size(); ++i) EXPECT_NEAR(nvme.grad_norms[i], cpu.grad_norms[i], 1e-6 * cpu.grad_norms[i]) << i;
  EXPECT_EQ(nvme.weights, cpu.weights);
  EXPECT_EQ(nvme.head_copy, cpu.head_copy);
  EXPECT_NE(nvme.losses.front(), nvme.losses.back());
}

// A checkpoint saved by a 2-stage pipeline loads into 1, 2 and 4 stages (and 2 data-parallel
// ranks with 2 stages), which go on to train like one rank that never stopped: the manifest names
// tensors, not a layout, so each stage reads its own blocks (the tied embedding's copy from the
// first stage's tensor).
TEST(PipelineCheckpoint, SavedAtTwoStagesLoadsAtOneTwoAndFour) {
  const std::string dir = ::testing::TempDir() + "zeroth-pipeline-ckpt-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const int saved_at = kSteps - 1;  // the warm-up's steps 1 and 2 have lr 0: step 3 is the first that moves the weights
  train_grid({1, 2, PipeKind::one_f_one_b, 1, 4}, nullptr, {0, saved_at, "", dir});
  EXPECT_TRUE(std::filesystem::exists(dir + "/step-" + std::to_string(saved_at) + "/manifest.json"));
  const auto& ref = reference(4);
  for (auto [dp, pp] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{1, 4}, std::pair{2, 2}}) {
    const auto got = train_grid({dp, pp, PipeKind::gpipe, 2, 4}, nullptr, {saved_at, kSteps, dir, ""});
    SCOPED_TRACE("resumed at dp " + std::to_string(dp) + " x pp " + std::to_string(pp));
    const auto worst = testing::expect_weights(got, ref, 2e-6);
    for (int s = saved_at; s < kSteps; ++s) EXPECT_NEAR(got.losses[s - saved_at], ref.losses[s], 3e-7 * ref.losses[s]) << "step " << s;
    std::printf("resumed at dp %d pp %d: worst weight error %.3g (%s)\n", dp, pp, worst.rel(), worst.name.c_str());
  }
  std::filesystem::remove_all(dir);
}

// The passes of a measured run replayed on a model clock: each rank's passes in the order they ran,
// forward 1 / v units and backward 2 / v, each starting when its rank is free and what it needs has
// ended (the forward of the virtual stage before, or the backward of the one after; the last
// virtual stage's backward its own forward). Fails the test when that order cannot run.
PipeMeasure replay_on_model_clock(const PipeMeasure& measured, int v) {
  const int p = static_cast<int>(measured.spans.size());
  PipeMeasure model;
  model.spans.resize(p);
  std::vector<std::vector<PipeSpan>> order(p);
  for (int r = 0; r < p; ++r) {
    for (const auto& s : measured.spans[r])
      if (s.kind == SpanKind::forward || s.kind == SpanKind::backward) order[r].push_back(s);
    std::sort(order[r].begin(), order[r].end(), [](const PipeSpan& a, const PipeSpan& b) { return a.start < b.start; });
  }
  // End time of (kind, micro, virtual stage) once replayed.
  std::map<std::tuple<SpanKind, int, int>, double> ended;
  std::vector<size_t> next(p, 0);
  std::vector<double> free_at(p, 0.0);
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < p; ++r) {
      if (next[r] == order[r].size()) continue;
      const PipeSpan& s = order[r][next[r]];
      const int stage = s.chunk * p + r, last = p * v - 1;
      const bool fwd = s.kind == SpanKind::forward;
      const auto need = fwd ? std::tuple{SpanKind::forward, s.micro, stage - 1}
                            : std::tuple{stage == last ? SpanKind::forward : SpanKind::backward, s.micro,
                                         stage == last ? stage : stage + 1};
      double ready = 0;
      if (fwd ? stage > 0 : true) {
        const auto it = ended.find(need);
        if (it == ended.end()) continue;
        ready = it->second;
      }
      PipeSpan replayed = s;
      replayed.start = std::max(free_at[r], ready);
      replayed.end = replayed.start + (fwd ? 1.0 : 2.0) / v;
      free_at[r] = replayed.end;
      ended[{s.kind, s.micro, stage}] = replayed.end;
      model.spans[r].push_back(replayed);
      ++next[r];
      progress = true;
    }
  }
  for (int r = 0; r < p; ++r) EXPECT_EQ(next[r], order[r].size()) << "rank " << r << "'s passes ran in an order that cannot finish";
  summarize(model);
  return model;
}

// The runner on real streams and channels, with balanced sleeping stages: every rank ran each of
// its passes once, each after what it needed on the steady clock (an ordering of stamps, which load
// on the machine cannot reverse), and the order it ran them in, replayed on a model clock, has the
// papers' bubble (p - 1) / (m + p - 1), or (p - 1) / (v m + p - 1) interleaved, to rounding. The
// wall-clock bubble beside the formula is `zeroth bench pipeline`'s figure, not a test's.
TEST(PipelineBubble, ThePassOrderTheRunnerRanHasTheFormulasBubble) {
  for (PipeKind kind : {PipeKind::gpipe, PipeKind::one_f_one_b, PipeKind::interleaved}) {
    for (int m : {4, 8, 16}) {
      const int p = 4, v = kind == PipeKind::interleaved ? 2 : 1;
      SCOPED_TRACE(std::string(pipe_kind_name(kind)) + " m " + std::to_string(m));
      const auto got = measure_sleeping_pipeline(kind, p, m, std::chrono::milliseconds(2));
      const double formula = pipe_bubble_formula(kind, p, m, v);
      EXPECT_DOUBLE_EQ(got.formula, formula);
      ASSERT_EQ(got.spans.size(), static_cast<size_t>(p));
      std::map<std::tuple<SpanKind, int, int>, PipeSpan> pass;  // (kind, micro, virtual stage)
      for (int r = 0; r < p; ++r) {
        size_t passes = 0;
        for (const auto& s : got.spans[r]) {
          if (s.kind != SpanKind::forward && s.kind != SpanKind::backward) continue;
          ++passes;
          EXPECT_TRUE(pass.emplace(std::tuple{s.kind, s.micro, s.chunk * p + r}, s).second)
              << "rank " << r << " ran " << s.name() << " twice";
        }
        EXPECT_EQ(passes, static_cast<size_t>(2 * m * v)) << "rank " << r;
      }
      for (const auto& [key, s] : pass) {
        const auto [k, micro, stage] = key;
        if (k == SpanKind::forward && stage > 0) {
          EXPECT_GE(s.start, pass.at({SpanKind::forward, micro, stage - 1}).end) << s.name() << " at virtual stage " << stage;
        }
        if (k == SpanKind::backward) {
          const bool last = stage == p * v - 1;
          EXPECT_GE(s.start, pass.at({last ? SpanKind::forward : SpanKind::backward, micro, last ? stage : stage + 1}).end)
              << s.name() << " at virtual stage " << stage;
        }
      }
      const auto model = replay_on_model_clock(got, v);
      std::printf("%s p %d m %2d: bubble %.4f on the model clock, %.4f by the formula; %.3f on the wall clock\n",
                  pipe_kind_name(kind).data(), p, m, model.bubble, formula, got.bubble);
      EXPECT_NEAR(model.bubble, formula, 1e-9);
    }
  }
}

// A stage that fails mid-cycle (its backward raises) ends every rank with an error naming it, well
// before the communicators' timeout.
TEST(PipelineFailure, AStageDyingEndsEveryRankWithAnErrorNamingIt) {
  const GptConfig gc = tiny();
  const int pp = 4, micro = 4;
  CommOptions options;
  options.timeout = std::chrono::seconds(30);
  std::mutex mutex;
  std::vector<std::string> errors(pp);
  const auto start = std::chrono::steady_clock::now();
  EXPECT_THROW(run_local_ranks(
                   pp,
                   [&](Communicator& world) {
    try {
      // Before the model: its queued work reads them until its destructor has waited for it.
      std::vector<int32_t> tokens(static_cast<size_t>(2) * gc.seq_len, 1);
      std::vector<float> losses(micro);
      auto groups = ProcessGrid(1, pp, 1).split(world);
      const int stage = groups.pp->rank();
      const GptPart part = GptPart::of_rank(partition_layers(gc, pp, "uniform"), pp, stage);
      auto device = make_device("cpu");
      PipelineRunner runner(*device, *groups.pp, make_pipe_schedule(PipeKind::one_f_one_b, pp, micro));
      Engine engine(*device, *groups.dp, testing::grid_engine_config(0, micro));
      engine.set_pipeline(*groups.pp, stage == 0 || stage == pp - 1 ? Gpt::embedding_block(gc, part) : -1);
      Gpt gpt(engine, gc, part);
      engine.set_pass_order(runner.passes());
      engine.finalize();
      PipeModel model;
      model.forward = [&](int m, int c) { gpt.forward_chunk(m, c, tokens.data(), tokens.data(), 2, gc.seq_len, &losses[m]); };
      model.backward = [&](int m, int c) {
        if (world.rank() == 2 && m == 1) throw std::runtime_error("stage 2 lost its device");
        gpt.backward_chunk(m, c);
      };
      model.port = [&](PipePort p, int m, int c) {
        const Gpt::Port ports[] = {Gpt::Port::input, Gpt::Port::output, Gpt::Port::input_grad, Gpt::Port::output_grad};
        return gpt.port(ports[static_cast<int>(p)], m, c);
      };
      gpt.prepare(2, gc.seq_len);
      runner.run_cycle(model);
      engine.step();
      engine.compute_stream().synchronize();
    } catch (const std::exception& e) {
      std::lock_guard lock(mutex);
      errors[world.rank()] = e.what();
      throw;
    }
                   },
                   options),
               std::runtime_error);
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_LT(seconds, 15.0) << "the ranks waited for the timeout instead of learning of the failure";
  for (int r = 0; r < pp; ++r) {
    const std::string cause = r == 2 ? "stage 2 lost its device" : "pipeline stage 2 failed: stage 2 lost its device";
    EXPECT_NE(errors[r].find(cause), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

}  // namespace
}  // namespace zeroth
