// `zeroth train` with a pipeline: the example config trains, measures its bubble, writes its
// Chrome trace and a checkpoint that resumes without the pipeline; GPipe holds every micro-batch's
// activations where 1F1B holds at most the stages'; Gloo processes train what local threads do.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth::testing {
namespace {

const std::string kConfig = std::string(ZEROTH_SOURCE_DIR) + "/configs/gpt-pipeline-1f1b.json";

Run train_config(const std::string& name, const std::vector<std::string>& sets) { return train_example(kConfig, name, sets); }

// The configs table's pipeline run, shortened to 3 steps: it trains, its summary has the bubble
// next to the formula and each stage's activations, and its trace has both stages' passes.
TEST(PipelineTrain, TheExampleConfigTrainsMeasuresItsBubbleAndWritesATrace) {
  const auto r = train_config("pipe_1f1b", {"run.steps=3"});
  ASSERT_EQ(r.code, 0) << r.output;
  ASSERT_EQ(losses(r).size(), 3u);
  // Validation at the end, below an untrained model's ln(256) = 5.545 over its 256 byte values.
  EXPECT_LT(r.metrics.back()["summary"]["val_loss"].get<double>(), 5.3) << r.output;
  const json p = r.metrics.back()["summary"]["pipeline"];
  ASSERT_TRUE(p.is_object()) << r.output;
  EXPECT_DOUBLE_EQ(p["bubble_formula"].get<double>(), 1.0 / 9.0);  // (p - 1) / (m + p - 1), p = 2, m = 8
  // Measured on the wall clock of shared cores, so only what it is: a fraction of the makespan
  // (how it compares with the formula is `zeroth bench pipeline`'s figure).
  EXPECT_GE(p["bubble"].get<double>(), 0.0);
  EXPECT_LT(p["bubble"].get<double>(), 1.0);
  ASSERT_EQ(p["stage_activation_peak_bytes"].size(), 2u);
  std::ifstream in(temp("pipe_1f1b") + "/trace.json");
  const json trace = json::parse(in);
  std::map<int, int> passes;
  for (const auto& e : trace["traceEvents"]) {
    if (e["ph"] == "X" && e["tid"] == 0 && (e["name"].get<std::string>()[0] == 'F' || e["name"].get<std::string>()[0] == 'B'))
      ++passes[e["pid"].get<int>()];
  }
  EXPECT_EQ(passes[0], 16);  // the last step's 8 forwards and 8 backwards on each stage
  EXPECT_EQ(passes[1], 16);
  EXPECT_NEAR(trace["otherData"]["bubble_formula"].get<double>(), 1.0 / 9.0, 1e-12);
}

// The same model and batches with GPipe, 4 steps at a constant learning rate: the same losses and
// weights bit for bit (a schedule changes when, not what), and GPipe's stages hold all 8
// micro-batches' activations where 1F1B's hold 2 and 1.
TEST(PipelineTrain, GPipeTrainsTheSameLossesHoldingEveryMicroBatchsActivations) {
  const auto a = train_config("pipe_a", {"run.steps=4", kConstantLr, "run.checkpoint_interval=-1", "run.trace=false"});
  const auto g = train_config("pipe_g", {"run.steps=4", kConstantLr, "run.checkpoint_interval=-1", "run.trace=false",
                                         "parallel.schedule=gpipe"});
  ASSERT_EQ(a.code, 0) << a.output;
  ASSERT_EQ(g.code, 0) << g.output;
  ASSERT_EQ(losses(a).size(), 4u);
  EXPECT_EQ(losses(a), losses(g));
  expect_same_weights(weights_of("pipe_g"), weights_of("pipe_a"), 0.0);
  const json pa = a.metrics.back()["summary"]["pipeline"]["stage_activation_peak_bytes"];
  const json pg = g.metrics.back()["summary"]["pipeline"]["stage_activation_peak_bytes"];
  for (int s = 0; s < 2; ++s) EXPECT_GT(pg[s].get<double>(), 3 * pa[s].get<double>()) << "stage " << s;
}

// The pipeline's checkpoint resumes on one rank without a pipeline, continuing from its step with
// the losses and weights the pipeline itself has: saved after step 2 of 4 at a constant learning
// rate, so steps 3 and 4 read the saved weights and optimizer state and move them again.
TEST(PipelineTrain, ACheckpointOfTwoStagesResumesOnOneRank) {
  const auto whole = train_config("pipe_whole", {"run.steps=4", kConstantLr, "run.trace=false", "run.checkpoint_interval=-1"});
  ASSERT_EQ(whole.code, 0) << whole.output;
  const auto first = train_config("pipe_ckpt", {"run.steps=2", kConstantLr});
  ASSERT_EQ(first.code, 0) << first.output;
  const auto resumed = resume_example(kConfig, "pipe_ckpt",
                                      {"run.steps=4", kConstantLr, "run.world_size=1", "parallel.pipeline=1", "run.trace=false"});
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("from the checkpoint at step 2"), std::string::npos) << resumed.output;
  // The same weights, optimizer state and batches; f32 sums in another order on one rank.
  const auto a = losses(whole), b = losses(resumed);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_GE(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(b[b.size() - 2 + i], a[2 + i], 1e-5 * a[2 + i]) << "step " << 3 + i;
  expect_same_weights(weights_of("pipe_ckpt"), weights_of("pipe_whole"), 1e-5);
}

// Stages as Gloo processes: the same losses and weights as stages as threads, 4 steps at a
// constant learning rate.
TEST(PipelineTrain, GlooProcessesTrainTheSameLossesAsLocalThreads) {
  const std::vector<std::string> sets = {"run.steps=4", kConstantLr, "run.checkpoint_interval=-1", "run.trace=false"};
  const auto local = train_config("pipe_local", sets);
  ASSERT_EQ(local.code, 0) << local.output;
  const auto gloo = gloo_example(kConfig, "pipe_gloo", 2, sets);
  ASSERT_EQ(gloo.code, 0) << gloo.output;
  const auto a = losses(local), b = losses(gloo);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;
  // One rank per stage: no sum changes order between the backends.
  expect_same_weights(weights_of("pipe_gloo"), weights_of("pipe_local"), 0.0);
}

}  // namespace
}  // namespace zeroth::testing
