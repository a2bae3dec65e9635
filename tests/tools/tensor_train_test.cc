// `zeroth train` in 3D: the example config (dp 2 x tp 2 x pp 2 on 8 local ranks) trains the losses
// and weights of the same run without tensor parallelism, with and without sequence parallelism;
// its model's traffic in the tensor-parallel group is Megatron's count; its checkpoint resumes
// without tensor parallelism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth::testing {
namespace {

const std::string kConfig = std::string(ZEROTH_SOURCE_DIR) + "/configs/gpt-3d.json";

Run train_3d(const std::string& name, const std::vector<std::string>& sets) { return train_example(kConfig, name, sets); }

// The configs table's 3D run, 4 steps at a constant learning rate, against the same run with its
// tensor-parallel pairs made single ranks (dp 2 x pp 2 on 4 ranks): the same losses and exported
// weights up to f32 summation order, with and without sequence parallelism; its trace has both
// stages' passes.
TEST(TensorTrain, The3dExampleConfigTrainsWhatItsPipelineAloneTrains) {
  const auto tp = train_3d("tp_3d", {"run.steps=4", kConstantLr});
  ASSERT_EQ(tp.code, 0) << tp.output;
  const auto sp = train_3d("tp_3d_sp", {"run.steps=4", kConstantLr, "run.trace=false", "parallel.sequence_parallel=true"});
  ASSERT_EQ(sp.code, 0) << sp.output;
  const auto one = train_3d("tp_3d_one", {"run.steps=4", kConstantLr, "run.trace=false", "parallel.tensor=1", "run.world_size=4"});
  ASSERT_EQ(one.code, 0) << one.output;
  const auto a = losses(tp), b = losses(sp), c = losses(one);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  ASSERT_EQ(c.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_NEAR(a[i], c[i], 2e-6 * c[i]) << "step " << i + 1;
    EXPECT_NEAR(b[i], c[i], 2e-6 * c[i]) << "step " << i + 1;
  }
  // Splitting the matmuls over tp sums their partial products in another order: gradients differ
  // by rounding (the losses by 2e-6), and Adam turns the rounding of near-zero gradients into
  // steps of up to lr either way, so an element may differ by a small part of the 4 x lr = 8e-3 it
  // moved: 2.7e-4 of a tensor's largest value measured. A slice's gradient lost leaves its 8e-3
  // undone, 0.08-0.25 of the largest values, far outside.
  expect_same_weights(weights_of("tp_3d"), weights_of("tp_3d_one"), 1e-3);
  expect_same_weights(weights_of("tp_3d_sp"), weights_of("tp_3d_one"), 1e-3);
  std::ifstream in(temp("tp_3d") + "/trace.json");
  const json trace = json::parse(in);
  int passes = 0;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["tid"] == 0 && (e["name"].get<std::string>()[0] == 'F' || e["name"].get<std::string>()[0] == 'B'))
      ++passes;
  }
  EXPECT_EQ(passes, 16);  // the last step's 4 forwards and 4 backwards on each of the 2 stages
}

// Rank 0 is stage 0 (the embedding and layers 0-1) at tensor-parallel rank 0. Its model's traffic
// in its tensor-parallel group, from the communicator's counts, is Megatron's: per micro-batch an
// all-reduce of the B x T x C activations after the vocabulary-parallel embedding and two per layer
// forward, two per layer backward; each validation batch the forward's. CommStats counts an
// all-reduce as twice its buffer.
TEST(TensorTrain, TheModelsTensorParallelTrafficIsMegatronsCount) {
  const auto r = train_3d("tp_traffic", {"run.steps=2", "run.trace=false", "run.checkpoint_interval=-1"});
  ASSERT_EQ(r.code, 0) << r.output;
  const json t = r.metrics.back()["summary"]["tensor"];
  ASSERT_TRUE(t.is_object()) << r.output;
  const uint64_t act = 4ull * 128 * 256 * sizeof(float);  // micro-batch 4 x seq 128 x 256 channels
  const uint64_t steps = 2, micro = 4, evals = 2, eval_batches = 4, layers = 2;
  const uint64_t forward = 1 + 2 * layers, backward = 2 * layers;
  EXPECT_EQ(t["all_reduce_bytes"].get<uint64_t>(), 2 * act * (steps * micro * (forward + backward) + evals * eval_batches * forward));
  EXPECT_EQ(t["reduce_scatter_bytes"].get<uint64_t>(), 0u);
  EXPECT_EQ(t["all_gather_bytes"].get<uint64_t>(), 0u);
}

// The 3D run's checkpoint resumes with tensor parallelism off (dp 2 x pp 2), continuing with the
// losses and weights the 3D run itself has: saved after step 2 of 4 at a constant learning rate,
// so steps 3 and 4 read the saved weights and optimizer state and move them again.
TEST(TensorTrain, ACheckpointOfTheThreeDRunResumesWithoutTensorParallelism) {
  const auto whole = train_3d("tp_whole", {"run.steps=4", kConstantLr, "run.trace=false", "run.checkpoint_interval=-1"});
  ASSERT_EQ(whole.code, 0) << whole.output;
  const auto first = train_3d("tp_ckpt", {"run.steps=2", kConstantLr, "run.trace=false"});
  ASSERT_EQ(first.code, 0) << first.output;
  const auto resumed = resume_example(kConfig, "tp_ckpt",
                                      {"run.steps=4", kConstantLr, "run.world_size=4", "parallel.tensor=1", "run.trace=false"});
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("from the checkpoint at step 2"), std::string::npos) << resumed.output;
  const auto a = losses(whole), b = losses(resumed);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_GE(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(b[b.size() - 2 + i], a[2 + i], 2e-6 * a[2 + i]) << "step " << 3 + i;
  expect_same_weights(weights_of("tp_ckpt"), weights_of("tp_whole"), 1e-5);
}

// The 3D run in a device budget of exactly its estimate (`zeroth estimate --config`, the config's own
// row) trains and saves its weights: every rank's peak, the end-of-run gather of whole tensors from
// the slices and stages included, stays inside it.
TEST(TensorTrain, TheThreeDRunFitsItsOwnEstimateToTheEnd) {
  const auto est = run({ZEROTH_BIN, "estimate", "--config", kConfig, "--json"}, "tp_estimate");
  ASSERT_EQ(est.code, 0) << est.output;
  uint64_t bytes = 0;
  const json rows = json::parse(est.output.substr(est.output.find('{')))["rows"];
  for (const auto& row : rows) {
    if (row["config"].get<bool>()) bytes = row["device_bytes"].get<uint64_t>();
  }
  ASSERT_GT(bytes, 0u) << est.output;
  const auto r = train_3d("tp_budget", {"run.steps=2", "run.trace=false", "run.checkpoint_interval=-1",
                                        "run.device_memory=" + std::to_string(bytes)});
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(temp("tp_budget") + "/model.safetensors"));
  EXPECT_LE(r.metrics.back()["summary"]["peak_bytes"].get<uint64_t>(), bytes);
}

// Weights from a file (run.init_from) start a tensor-parallel run from each rank's slices of them:
// its first loss is the unsplit run's from the same file, and not a fresh start's.
TEST(TensorTrain, InitialWeightsFromAFileAreSlicedPerRank) {
  const std::vector<std::string> one = {"run.trace=false", "run.checkpoint_interval=-1", "parallel.tensor=1", "run.world_size=4"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  const auto trained = train_3d("tp_init_src", with(one, {"run.steps=3"}));
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::string weights = "run.init_from=" + temp("tp_init_src") + "/model.safetensors";
  const auto split = train_3d("tp_init_split", {"run.steps=1", "run.trace=false", "run.checkpoint_interval=-1", weights});
  const auto whole = train_3d("tp_init_whole", with(one, {"run.steps=1", weights}));
  ASSERT_EQ(split.code, 0) << split.output;
  ASSERT_EQ(whole.code, 0) << whole.output;
  const auto a = losses(split), b = losses(whole), fresh = losses(trained);
  ASSERT_EQ(a.size(), 1u);
  ASSERT_EQ(b.size(), 1u);
  EXPECT_NEAR(a[0], b[0], 2e-6 * b[0]);
  EXPECT_GT(std::abs(a[0] - fresh[0]), 1e-3) << "the first loss is a fresh start's: the file's weights were not used";
}

// Tensor-parallel ranks as Gloo processes (tp 2 with sequence parallelism, no pipeline): the same
// losses and weights as ranks as threads, 4 steps at a constant learning rate.
TEST(TensorTrain, GlooProcessesTrainTheSameLossesAsLocalThreads) {
  const std::vector<std::string> sets = {
      "run.steps=4",         kConstantLr,        "run.checkpoint_interval=-1", "run.trace=false",
      "parallel.pipeline=1", "run.world_size=2", "parallel.micro_batches=2",   "parallel.sequence_parallel=true"};
  const auto local = train_3d("tp_local", sets);
  ASSERT_EQ(local.code, 0) << local.output;
  const auto gloo = gloo_example(kConfig, "tp_gloo", 2, sets);
  ASSERT_EQ(gloo.code, 0) << gloo.output;
  const auto a = losses(local), b = losses(gloo);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;
  // Two tensor-parallel ranks: each partial sum has two terms, exact in either order.
  expect_same_weights(weights_of("tp_gloo"), weights_of("tp_local"), 0.0);
}

}  // namespace
}  // namespace zeroth::testing
