// `zeroth train` end to end: local ranks (threads) and gloo processes started by `zeroth launch`
// train the same losses; text and llm.c .bin data; metrics files; Ctrl-C; config errors; dry run.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using testing::losses;
using testing::run;
using testing::temp;
using testing::tiny;
using testing::write_config;

TEST(Train, LocalRanksTrainAndWriteMetrics) {
  json j = tiny("local");
  const auto r = run({ZEROTH_BIN, "train", write_config("local", j)}, "local");
  ASSERT_EQ(r.code, 0) << r.output;
  for (const char* text : {"zeroth train: train_local", "ZeRO stage 3", "step 6/6",
                           "validation at step 3:", "validation at step 6:", "done after 6 steps"}) {
    EXPECT_NE(r.output.find(text), std::string::npos) << text << " missing in\n" << r.output;
  }
  const auto l = losses(r);
  ASSERT_EQ(l.size(), 6u);
  EXPECT_LT(l.back(), l.front());
  int val = 0;
  for (const auto& m : r.metrics) val += m.contains("val_loss");
  EXPECT_EQ(val, 3);  // before training, at 3 and at 6
  EXPECT_TRUE(r.metrics.back().contains("summary"));
  EXPECT_TRUE(std::filesystem::exists(temp("local") + "/config.json"));
}

TEST(Train, ProgressBarRedrawsInPlace) {
  json j = tiny("bar");
  j["run"]["progress"] = "bar";
  const auto r = run({ZEROTH_BIN, "train", write_config("bar", j)}, "bar");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("[##########"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("\r\033[K"), std::string::npos) << "the bar is not cleared before a line";
  EXPECT_NE(r.output.find("step 6/6"), std::string::npos) << r.output;
}

TEST(Train, GlooProcessesTrainTheSameLossesAsLocalThreads) {
  json j = tiny("gloo_local");
  const auto local = run({ZEROTH_BIN, "train", write_config("gloo_local", j)}, "gloo_local");
  ASSERT_EQ(local.code, 0) << local.output;
  j["run"]["output_dir"] = temp("gloo");
  j["run"]["backend"] = "gloo";
  const auto gloo = run({ZEROTH_BIN, "launch", "-n", "2", "--", ZEROTH_BIN, "train", write_config("gloo", j)}, "gloo");
  ASSERT_EQ(gloo.code, 0) << gloo.output;
  EXPECT_NE(gloo.output.find("gloo processes"), std::string::npos) << gloo.output;
  const auto a = losses(local), b = losses(gloo);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;
}

// A mixture of experts (top-2 of 4, capacity drops, every other layer) trains the same losses on one
// rank and on two at every ZeRO stage: each micro-batch is routed alone, and the ranks' micro-batches
// are the one rank's. Each step line and metrics record carries the routing's figures.
TEST(Train, MixtureOfExpertsTrainsAlikeOnOneAndTwoRanksAtEveryStage) {
  auto moe = [](const std::string& name, int world, int stage) {
    json j = tiny(name);
    j["model"]["n_layer"] = 4;
    j["model"]["moe"] = {{"num_experts", 4}, {"top_k", 2}, {"every", 2}, {"capacity_factor", 1.0}, {"z_loss_coef", 1e-3}};
    j["run"]["world_size"] = world;
    j["gradient_accumulation_steps"] = 4 / world;
    j["zero_optimization"]["stage"] = stage;
    return run({ZEROTH_BIN, "train", write_config(name, j)}, name);
  };
  const auto one = moe("moe_1", 1, 0);
  ASSERT_EQ(one.code, 0) << one.output;
  EXPECT_NE(one.output.find("(top 2) in 1 of every 2 layers"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find("active per token"), std::string::npos) << one.output;
  EXPECT_NE(one.output.find(" | aux "), std::string::npos) << one.output;
  const auto a = losses(one);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_LT(a.back(), a.front());
  bool dropped = false;
  for (const auto& m : one.metrics) {
    if (!m.contains("loss") || m.contains("summary")) continue;
    ASSERT_TRUE(m.contains("moe_aux_loss")) << m.dump();
    EXPECT_GT(m["moe_aux_loss"].get<double>(), 0.0);
    EXPECT_GE(m["moe_max_load"].get<double>(), 1.0);
    dropped = dropped || m["moe_dropped"].get<double>() > 0;
  }
  EXPECT_TRUE(dropped) << "no step dropped a choice: the capacity is not exercised";
  for (int stage : {0, 1, 2, 3}) {
    const std::string name = "moe_2_z" + std::to_string(stage);
    const auto two = moe(name, 2, stage);
    ASSERT_EQ(two.code, 0) << two.output;
    const auto b = losses(two);
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-5 * a[i]) << "stage " << stage << ", step " << i + 1;
  }
}

// The configs table's expert-parallel run (8 experts over 4 ranks, ZeRO-2), 4 steps in f32 at a
// constant learning rate, against the same run with every expert on every rank: the same losses and
// exported weights up to f32 summation order; and the exported weights loaded back at E = 4
// (run.init_from, the experts' names read by each rank for its slice) start where the E = 1 run
// ended.
TEST(Train, TheExpertParallelExampleTrainsWhatItTrainsWithoutExpertParallelism) {
  const std::string config = std::string(ZEROTH_SOURCE_DIR) + "/configs/gpt-moe-ep.json";
  // Micro-batches of 2 (the config's are 4) keep the case short and give evaluation's last round below.
  const std::vector<std::string> sets = {"run.steps=4",         testing::kConstantLr,  "bf16.enabled=false",
                                         "run.eval_interval=0", "run.sample_tokens=0", "train_micro_batch_size_per_gpu=2"};
  auto with = [&](std::vector<std::string> more) {
    more.insert(more.begin(), sets.begin(), sets.end());
    return more;
  };
  const auto ep = testing::train_example(config, "moe_ep4", sets);
  ASSERT_EQ(ep.code, 0) << ep.output;
  EXPECT_NE(ep.output.find("over runs of 4 ranks, 2 per rank, all-to-alls under the products"), std::string::npos) << ep.output;
  const auto one = testing::train_example(config, "moe_ep1", with({"parallel.expert=1"}));
  ASSERT_EQ(one.code, 0) << one.output;
  const auto a = losses(ep), b = losses(one);
  ASSERT_EQ(a.size(), 4u);
  ASSERT_EQ(b.size(), 4u);
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-6 * b[i]) << "step " << i + 1;
  // Adam's steps from rounding-level gradient differences: 2.3e-4 of a tensor's largest value measured.
  testing::expect_same_weights(testing::weights_of("moe_ep4"), testing::weights_of("moe_ep1"), 1e-3);
  // Validation of the same weights on the same batches: at E = 1's end and at E = 4's start.
  auto val_loss = [](const testing::Run& r, int step) {
    for (const auto& m : r.metrics)
      if (m.contains("val_loss") && !m.contains("summary") && m["step"] == step) return m["val_loss"].get<double>();
    return -1.0;
  };
  const auto from = testing::train_example(config, "moe_ep4_from",
                                           with({"run.steps=1", "run.eval_interval=1",
                                                 "run.init_from=" + testing::weights_of("moe_ep1")}));
  ASSERT_EQ(from.code, 0) << from.output;
  const double ended = val_loss(one, 4), started = val_loss(from, 0);
  ASSERT_GT(ended, 0) << one.output;
  EXPECT_NEAR(started, ended, 2e-6 * ended) << "the loaded weights do not evaluate where the E = 1 run ended";
  // `zeroth eval` over 221 windows: its last round gives the ranks 2, 2, 1 and 0 (run as 1, weighted
  // zero) sequences, and the ranks with 2 may send those with 1 more rows than their own micro-batch
  // makes (without room for the group's largest, this fails with the receive buffer too small).
  auto eval = [&](const std::string& name, const std::string& experts) {
    const auto r = testing::run({ZEROTH_BIN, "eval", config, "--json", "--set", "data.val_fraction=0.011", "--set",
                                 "bf16.enabled=false", "--set", "train_micro_batch_size_per_gpu=2", "--set",
                                 "run.init_from=" + testing::weights_of("moe_ep1"), "--set", "parallel.expert=" + experts},
                                name);
    EXPECT_EQ(r.code, 0) << r.output;
    const size_t at = r.output.rfind('{');
    const json out = json::parse(at == std::string::npos ? std::string() : r.output.substr(at), nullptr, false);
    EXPECT_FALSE(out.is_discarded()) << r.output;
    return out.is_discarded() ? -1.0 : out["loss"].get<double>();
  };
  const double at4 = eval("moe_eval4", "4"), at1 = eval("moe_eval1", "1");
  EXPECT_GT(at1, 0);
  EXPECT_NEAR(at4, at1, 2e-6 * at1);
}

TEST(Train, TextAndBinData) {
  // Text: every byte a token.
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the quick brown fox jumps over the lazy dog. ";
  std::ofstream(temp("corpus.txt")) << text;
  json j = tiny("text");
  j["data"] = {{"format", "text"}, {"train", temp("corpus.txt")}};
  j["model"].erase("vocab_size");
  j["run"]["steps"] = 3;
  auto r = run({ZEROTH_BIN, "train", write_config("text", j)}, "text");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("vocab 256"), std::string::npos) << r.output;
  // llm.c .bin: 256 int32 header (magic, version, count), then uint16 tokens.
  std::vector<int32_t> header(256, 0);
  header[0] = 20240520, header[1] = 1, header[2] = 20000;
  std::vector<uint16_t> tokens(20000);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = static_cast<uint16_t>((i * 7) % 50);
  {
    std::ofstream out(temp("tokens.bin"), std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), 1024);
    out.write(reinterpret_cast<const char*>(tokens.data()), 40000);
  }
  j["data"] = {{"format", "bin"}, {"train", temp("tokens.bin")}};
  j["model"]["vocab_size"] = 64;
  j["run"]["output_dir"] = temp("bin");
  r = run({ZEROTH_BIN, "train", write_config("bin", j)}, "bin");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("done after 3 steps"), std::string::npos) << r.output;
  // A truncated .bin file is named with what is wrong.
  std::filesystem::resize_file(temp("tokens.bin"), 2000);
  r = run({ZEROTH_BIN, "train", write_config("bin", j)}, "bin");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("the header says 20000 tokens"), std::string::npos) << r.output;
}

TEST(Train, CtrlCStopsCleanlyAfterTheCurrentStep) {
  json j = tiny("interrupt");
  j["run"]["steps"] = 100000;
  j["run"]["eval_interval"] = 0;
  std::filesystem::remove_all(temp("interrupt"));  // no metrics of an earlier run
  auto child = testing::spawn({ZEROTH_BIN, "train", write_config("interrupt", j)}, {}, temp("interrupt") + ".out");
  // Wait for the first step's line in the metrics, then interrupt.
  for (int i = 0; i < 3000; ++i) {
    std::ifstream in(temp("interrupt") + "/metrics.jsonl");
    std::string line;
    if (std::getline(in, line) && std::getline(in, line)) break;
    std::this_thread::sleep_for(20ms);
  }
  kill(child.pid, SIGINT);
  EXPECT_EQ(testing::wait_exit(child, 60s), 130) << child.output();
  EXPECT_NE(child.output().find("stopped (interrupted) after"), std::string::npos) << child.output();
  // The checkpoint it stopped at is named, whether or not its step was a printed one, and the only
  // validation said as one.
  EXPECT_NE(child.output().find("  checkpoint: " + temp("interrupt") + "/checkpoints/step-"), std::string::npos) << child.output();
  EXPECT_NE(child.output().find("(at step 0 only)"), std::string::npos) << child.output();
}

TEST(Train, ConfigErrorsExitWithTheMessage) {
  json j = tiny("bad");
  j["zero_optimization"]["stag"] = 2;
  const auto r = run({ZEROTH_BIN, "train", write_config("bad", j)}, "bad");
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.output.find("zeroth: error: zero_optimization.stag is not a known key (did you mean 'stage'?)\n"), std::string::npos)
      << r.output << "\n(the message ends there: where in zeroth's sources it was raised is for ZEROTH_LOG_LEVEL=debug)";
  const auto located = testing::spawn({ZEROTH_BIN, "train", write_config("bad", j)}, {"ZEROTH_LOG_LEVEL=debug"},
                                      temp("bad_debug") + ".out");
  EXPECT_EQ(testing::wait_exit(located, 60s), 1);
  EXPECT_NE(located.output().find("(did you mean 'stage'?) [engine/config/deepspeed_keys.cc:"), std::string::npos) << located.output();
  // A budget too small for the whole need: refused before anything is allocated, with the parts,
  // and what an earlier run left in the output folder is kept.
  j = tiny("budget");
  std::filesystem::create_directories(temp("budget"));
  const std::string earlier = "{\"step\": 1, \"loss\": 4.2}\n";
  std::ofstream(temp("budget") + "/metrics.jsonl") << earlier;
  const auto budget = run({ZEROTH_BIN, "train", write_config("budget", j), "--set", "run.device_memory=\"300KiB\""}, "budget");
  EXPECT_EQ(budget.code, 1);
  EXPECT_NE(budget.output.find("but run.device_memory is 300.00 KiB; nothing was allocated"), std::string::npos) << budget.output;
  std::ifstream kept(temp("budget") + "/metrics.jsonl");
  EXPECT_EQ(std::string(std::istreambuf_iterator<char>(kept), {}), earlier);
  const auto missing = run({ZEROTH_BIN, "train", temp("no-such-config.json")}, "missing");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("cannot read config"), std::string::npos) << missing.output;
}

// Gradients that stay non-finite end the run, on every rank, naming the steps and the last finite
// loss, instead of skipping to the end.
TEST(Train, NonFiniteGradientsStepAfterStepEndTheRun) {
  json j = tiny("nonfinite");
  j["optimizer"]["params"]["lr"] = 1e30;  // the first update blows the weights up
  j["gradient_clipping"] = 0;
  j["run"]["steps"] = 8;
  j["run"]["max_nonfinite_steps"] = 3;
  const auto r = run({ZEROTH_BIN, "train", write_config("nonfinite", j)}, "nonfinite", 120s);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(
      r.output.find(
          "steps 2 to 4: the gradients held Inf or NaN 3 steps in a row (run.max_nonfinite_steps = 3); the last finite loss was"),
      std::string::npos)
      << r.output;
  EXPECT_NE(r.output.find("at step 1"), std::string::npos) << r.output;
  // The skip warning names the step run, not the count of applied steps (which stays 1).
  EXPECT_NE(r.output.find("step 3: the gradients hold Inf or NaN; the step is skipped"), std::string::npos) << r.output;
  // The start, validation at 0 and 3, steps 1-4, and the error that ended the run.
  ASSERT_EQ(r.metrics.size(), 8u) << r.output;
  EXPECT_TRUE(r.metrics.front().contains("start"));
  EXPECT_NE(r.metrics.back().value("error", "").find("3 steps in a row"), std::string::npos) << r.metrics.back().dump();
  const auto& last_step = r.metrics[r.metrics.size() - 2];
  EXPECT_EQ(last_step["step"], 4);
  EXPECT_TRUE(last_step["skipped"].get<bool>());
}

// DeepSpeed's DynamicLossScaler raises when an f16 overflow finds the scale at its minimum and the
// hysteresis spent. A scale of 2^40 overflows f16 at once: 2^40 -> 2^39 -> 2^38 (the minimum) ->
// the end of the run, on every rank.
TEST(Train, AnF16OverflowAtTheMinimumLossScaleEndsTheRun) {
  json j = tiny("minscale");
  j["fp16"] = {{"enabled", true}, {"initial_scale_power", 40}, {"min_loss_scale", std::ldexp(1.0, 38)}, {"hysteresis", 1}};
  const auto r = run({ZEROTH_BIN, "train", write_config("minscale", j)}, "minscale", 120s);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("f16 gradients overflow at step 3 although the loss scale is already at its minimum "
                          "(fp16.min_loss_scale = 274877906944)"),
            std::string::npos)
      << r.output;
}

// DeepSpeed's wall_clock_breakdown: forward, backward, the wait for reductions and the optimizer
// step, timed (synchronized) on every step, printed with the step lines, written to the metrics.
TEST(Train, WallClockBreakdownTimesThePartsOfEachStep) {
  json j = tiny("wallclock");
  j["wall_clock_breakdown"] = true;
  const auto r = run({ZEROTH_BIN, "train", write_config("wallclock", j)}, "wallclock", 120s);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("  time (ms) | forward: "), std::string::npos) << r.output;
  int steps = 0;
  for (const auto& m : r.metrics) {
    if (!m.contains("loss")) continue;
    ++steps;
    const double parts = m["forward_ms"].get<double>() + m["backward_ms"].get<double>() + m["reduce_wait_ms"].get<double>() +
                         m["optimizer_ms"].get<double>();
    EXPECT_GT(m["forward_ms"].get<double>(), 0) << m.dump();
    EXPECT_GT(m["backward_ms"].get<double>(), 0) << m.dump();
    EXPECT_GE(m["reduce_wait_ms"].get<double>(), 0) << m.dump();
    EXPECT_GT(m["optimizer_ms"].get<double>(), 0) << m.dump();
    // An ordering, not a rate: the parts are disjoint intervals inside the step's, however loaded
    // the machine. (What share of the step they cover is a figure, printed with the step lines.)
    EXPECT_LE(parts, m["step_ms"].get<double>()) << "the parts lie inside the step: " << m.dump();
  }
  EXPECT_EQ(steps, 6);
}

// With everything in swap files, each step's line and record also count the swap traffic, and
// the optimizer step's share of it: per owned element the f32 master, moments and gradient in (16
// bytes) and master, moments and bf16 parameter out (14 bytes), so read x 14 = written x 16.
TEST(Train, WallClockBreakdownCountsTheOptimizersSwapTraffic) {
  json j = tiny("wallclock_swap");
  j["wall_clock_breakdown"] = true;
  j["bf16"] = {{"enabled", true}};
  const std::string swap = temp("wallclock_swap") + "-swap";
  j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", swap}};
  j["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", swap}};
  const auto r = run({ZEROTH_BIN, "train", write_config("wallclock_swap", j)}, "wallclock_swap", 120s);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("; of them the optimizer step: read "), std::string::npos) << r.output;
  int steps = 0;
  for (const auto& m : r.metrics) {
    if (!m.contains("loss")) continue;
    ++steps;
    const uint64_t read = m["optimizer_swap_read_bytes"], written = m["optimizer_swap_write_bytes"];
    EXPECT_GT(read, 0u) << m.dump();
    EXPECT_EQ(read * 14, written * 16) << m.dump();
    // The rest is the cycle's: parameter shards read by the gathers, gradients on their way out.
    EXPECT_GT(m["swap_read_bytes"].get<uint64_t>(), read) << m.dump();
    EXPECT_GT(m["swap_write_bytes"].get<uint64_t>(), written) << m.dump();
  }
  EXPECT_EQ(steps, 6);
  std::filesystem::remove_all(swap);
}

// A static f16 loss scale never falls, so every non-finite step counts.
TEST(Train, NonFiniteStepsEndARunWithAStaticF16Scale) {
  json j = tiny("nonfinite16");
  j["optimizer"]["params"]["lr"] = 1e30;
  j["gradient_clipping"] = 0;
  j["fp16"] = {{"enabled", true}, {"loss_scale", 128}};
  j["run"]["steps"] = 8;
  j["run"]["max_nonfinite_steps"] = 3;
  const auto r = run({ZEROTH_BIN, "train", write_config("nonfinite16", j)}, "nonfinite16", 120s);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("steps 2 to 4: the gradients held Inf or NaN 3 steps in a row"), std::string::npos) << r.output;
}

// A write that fails (here: a full disk) ends the run on every rank with an error naming the file.
TEST(Train, AFailedWriteOfTheMetricsEndsTheRunNamingTheFile) {
  json j = tiny("full");
  std::filesystem::remove_all(temp("full"));
  std::filesystem::create_directories(temp("full"));
  std::filesystem::create_symlink("/dev/full", temp("full") + "/metrics.jsonl");
  auto child = testing::spawn({ZEROTH_BIN, "train", write_config("full", j)}, {}, temp("full") + ".out");
  EXPECT_EQ(testing::wait_exit(child, 120s), 1) << child.output();
  EXPECT_NE(child.output().find("metrics.jsonl failed: No space left on device"), std::string::npos) << child.output();
}

TEST(Train, DryRunPrintsTheResolvedConfigThePlanAndItsProgram) {
  json j = tiny("dry");
  const std::string plan_json = temp("dry") + ".plan.json";
  std::filesystem::remove(plan_json);
  auto child = testing::spawn({ZEROTH_BIN, "train", write_config("dry", j), "--dry-run", "--set", "zero_optimization.stage=2", "--set",
                               "train_batch_size=auto"},
                              {"ZEROTH_PLAN_JSON=" + plan_json}, temp("dry") + ".out");
  ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(60)), 0) << child.output();
  const std::string out = child.output();
  EXPECT_NE(out.find("\"train_batch_size\": 8"), std::string::npos) << out;
  EXPECT_NE(out.find("ZeRO stage 2 plan"), std::string::npos) << out;
  // The program, compactly: counts per action kind and the first micro-batch in full.
  EXPECT_NE(out.find("program: "), std::string::npos) << out;
  EXPECT_NE(out.find("reduce_scatter"), std::string::npos) << out;
  EXPECT_NE(out.find("B embed"), std::string::npos) << out;
  EXPECT_NE(out.find("per rank on the device: params"), std::string::npos) << out;
  EXPECT_NE(out.find("activations"), std::string::npos) << out;
  EXPECT_FALSE(std::filesystem::exists(temp("dry") + "/metrics.jsonl"));
  // ZEROTH_PLAN_JSON holds the plan with its action list, on a dry run too.
  std::ifstream in(plan_json);
  ASSERT_TRUE(in) << plan_json;
  const auto plan = json::parse(in);
  EXPECT_EQ(plan["stage"], 2);
  ASSERT_FALSE(plan["actions"].empty());
  size_t reductions = 0;
  for (const auto& a : plan["actions"]) reductions += a["op"] == "reduce_scatter";
  EXPECT_EQ(reductions, plan["reduce_buckets"].size() * plan["micro_batches"].get<size_t>());
}

// With offload and cpu_checkpointing the dry run shows what each rank holds in host memory (the
// checkpoints among it) and refuses a plan over run.host_memory as the run would, before anything
// is allocated.
TEST(Train, DryRunShowsHostMemoryAndRefusesAPlanOverTheHostBudget) {
  json j = tiny("dry_host");
  j["zero_optimization"] = {{"stage", 2}, {"offload_optimizer", {{"device", "cpu"}}}};
  j["activation_checkpointing"] = {{"cpu_checkpointing", true}};
  for (const std::string budget : {"1GiB", "64KiB"}) {
    j["run"]["host_memory"] = budget;
    auto child = testing::spawn({ZEROTH_BIN, "train", write_config("dry_host", j), "--dry-run"}, {}, temp("dry_host") + ".out");
    const int status = testing::wait_exit(child, std::chrono::seconds(60));
    const std::string out = child.output();
    const auto line = out.find("per rank in host memory: ");
    ASSERT_NE(line, std::string::npos) << out;
    EXPECT_NE(out.find("activations", line), std::string::npos) << out;
    EXPECT_NE(out.find("of the " + std::string(budget == "1GiB" ? "1.00 GiB" : "64.00 KiB") + " budget", line), std::string::npos)
        << out;
    if (budget == "1GiB") {
      EXPECT_EQ(status, 0) << out;
    } else {
      EXPECT_NE(status, 0) << out;
      EXPECT_NE(out.find("of host memory per rank"), std::string::npos) << out;
      EXPECT_NE(out.find("but run.host_memory is 64.00 KiB"), std::string::npos) << out;
      EXPECT_NE(out.find("cpu_checkpointing false"), std::string::npos) << out;
      EXPECT_NE(out.find("; pinned: activations"), std::string::npos) << out;
      EXPECT_EQ(out.find("(; "), std::string::npos) << out;
      EXPECT_EQ(out.find("sub_group_size"), std::string::npos) << "no swap slots to shrink here: " << out;
      // The refusal comes after the dry run's own lines.
      EXPECT_GT(out.find("of host memory per rank"), line) << out;
    }
  }
}

// zero_optimization.overlap_comm from the config reaches the plan: false puts the cycle's
// collectives on the compute stream, and the dry run says so.
TEST(Train, DryRunShowsOverlapCommFalseAsCollectivesSerialisedWithCompute) {
  for (const bool overlap : {true, false}) {
    const std::string name = overlap ? "overlap_on" : "overlap_off";
    auto child = testing::spawn({ZEROTH_BIN, "train", write_config(name, tiny(name)), "--dry-run", "--set",
                                 "zero_optimization.stage=3", "--set",
                                 std::string("zero_optimization.overlap_comm=") + (overlap ? "true" : "false")},
                                {}, temp(name) + ".out");
    ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(60)), 0) << child.output();
    const std::string out = child.output();
    EXPECT_NE(out.find(overlap ? "communication overlapped with compute" : "communication serialised with compute"), std::string::npos)
        << out;
    EXPECT_EQ(out.find("(serial)") != std::string::npos, !overlap) << out;
  }
}

}  // namespace
}  // namespace zeroth
