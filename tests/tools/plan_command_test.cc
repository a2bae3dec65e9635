// `zeroth plan` through the binary: a trillion-parameter search answers with plans that fit, the
// written config is one `zeroth train` runs, and bad input is refused with what to do.
#include <gtest/gtest.h>

#include <chrono>
#include <cctype>
#include <fstream>
#include <sstream>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using json = nlohmann::json;
using testing::temp;

struct Output {
  int code;
  std::string text;
};

Output zeroth(const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> all = {ZEROTH_BIN};
  all.insert(all.end(), args.begin(), args.end());
  auto child = testing::spawn(all, {}, temp(name) + ".out");
  const int code = testing::wait_exit(child, std::chrono::seconds(300));
  return {code, child.output()};
}

TEST(Plan, ATrillionParametersOn4096GpusFitsEveryPrintedPlan) {
  const Output o = zeroth({"plan", "--params", "1T", "--gpus", "4096", "--global-batch", "4096", "--json"}, "plan_1t");
  ASSERT_EQ(o.code, 0) << o.text;
  const json j = json::parse(o.text);
  EXPECT_EQ(j["model"]["layers"], 128);
  EXPECT_GT(j["considered"].get<int>(), 1000);
  const json plans = j["plans"];
  ASSERT_EQ(plans.size(), 10u);
  for (const auto& p : plans) {
    EXPECT_EQ(p["dp"].get<int>() * p["tp"].get<int>() * p["pp"].get<int>(), 4096);
    EXPECT_LE(p["tp"].get<int>(), 8);
    EXPECT_EQ(p["dp"].get<int>() * p["micro_batch"].get<int>() * p["micro_batches"].get<int>(), 4096);
    EXPECT_LE(p["device_bytes"].get<uint64_t>(), 80ull << 30);
    EXPECT_GT(p["mfu"].get<double>(), 0.0);
  }
}

// --model: Llama 3 70B's published shape (70,553,706,496 parameters, 8 key/value heads) on 512
// GPUs at Llama 3's context and Megatron-Bridge's 512-GPU batch; with 16 GPUs a node, tensor
// parallelism still divides the key/value heads. A Llama preset's written config names the preset.
TEST(Plan, APresetsLlamaShape) {
  const Output o = zeroth({"plan", "--model", "llama-3-70b", "--gpus", "512", "--gpus-per-node", "16", "--seq", "8192",
                           "--global-batch", "1024", "--json"},
                          "plan_llama");
  ASSERT_EQ(o.code, 0) << o.text;
  const json j = json::parse(o.text);
  EXPECT_EQ(j["model"]["architecture"], "llama");
  EXPECT_EQ(j["model"]["params"], 70'553'706'496u);
  EXPECT_EQ(j["model"]["kv_heads"], 8);
  EXPECT_EQ(j["model"]["ffn"], 28672);
  ASSERT_EQ(j["plans"].size(), 10u);
  for (const auto& p : j["plans"]) {
    EXPECT_EQ(8 % p["tp"].get<int>(), 0) << p.dump();
    EXPECT_LE(p["device_bytes"].get<uint64_t>(), 80ull << 30);
  }
  const std::string config = temp("plan_llama_emitted") + ".json";
  const Output small = zeroth({"plan", "--model", "smollm-135m", "--seq", "256", "--gpus", "2", "--gpus-per-node", "2",
                               "--global-batch", "8", "--device-memory", "8GiB", "--host-memory", "64GiB", "--emit-config", config,
                               "--emit-device", "cpu"},
                              "plan_llama_emit");
  ASSERT_EQ(small.code, 0) << small.text;
  json c;
  std::ifstream(config) >> c;
  EXPECT_EQ(c["model"]["preset"], "smollm-135m");
  EXPECT_EQ(c["model"]["seq_len"], 256);
}

TEST(Plan, TheWrittenConfigTrains) {
  const std::string config = temp("plan_emitted") + ".json";
  const Output o = zeroth({"plan",  "--layers",         "2",  "--hidden",       "32",   "--heads",         "2",    "--seq",
                           "16",    "--vocab",          "64", "--global-batch", "8",    "--gpus-per-node", "2",    "--device-memory",
                           "64MiB", "--runtime-memory", "0",  "--host-memory",  "1GiB", "--emit-config",   config, "--emit-device",
                           "cpu"},
                          "plan_emit");
  ASSERT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("wrote " + config), std::string::npos) << o.text;
  json j;
  std::ifstream(config) >> j;
  EXPECT_EQ(j["run"]["world_size"], 2);
  EXPECT_EQ(j["train_batch_size"], 8);
  EXPECT_EQ(j["model"]["n_layer"], 2);
  const Output train = zeroth({"train", config, "--set", "run.steps=2", "--set", "run.output_dir=" + temp("plan_emitted_run")},
                              "plan_emitted_train");
  EXPECT_EQ(train.code, 0) << train.text;
  // The engine's own estimate of the written config fits the budget the plan was made for.
  const Output est = zeroth({"estimate", "--config", config, "--json"}, "plan_emitted_estimate");
  ASSERT_EQ(est.code, 0) << est.text;
  bool found = false;
  const json rows = json::parse(est.text)["rows"];
  for (const auto& row : rows) {
    if (!row["config"].get<bool>()) continue;
    found = true;
    EXPECT_TRUE(row["fits"].get<bool>()) << row.dump();
  }
  EXPECT_TRUE(found);
}

// A mixture of experts: the table shows the expert-parallel size, and the written config (its
// experts over ep ranks, model.moe) trains; the engine's estimate of it names the all-to-all buffers.
TEST(Plan, ExpertsAreSplitInTheWrittenConfigWhichTrains) {
  const std::string config = temp("plan_moe") + ".json";
  const Output o = zeroth({"plan", "--layers",        "2",  "--hidden",        "32",    "--heads",          "2",  "--seq",
                           "16",   "--vocab",         "64", "--experts",       "4",     "--expert-ffn",     "64", "--global-batch",
                           "8",    "--gpus-per-node", "4",  "--device-memory", "64MiB", "--runtime-memory", "0",  "--host-memory",
                           "1GiB", "--stage",         "2",  "--emit-config",   config,  "--emit-device",    "cpu"},
                          "plan_moe");
  ASSERT_EQ(o.code, 0) << o.text;
  EXPECT_NE(o.text.find("active per token"), std::string::npos) << o.text;
  EXPECT_NE(o.text.find("   ep "), std::string::npos) << o.text;
  json j;
  std::ifstream(config) >> j;
  EXPECT_EQ(j["model"]["moe"]["num_experts"], 4);
  EXPECT_EQ(j["model"]["moe"]["intermediate_size"], 64);
  ASSERT_TRUE(j.contains("parallel")) << j.dump();
  // Split over all 4 ranks an expert's gradient is whole on its one rank (no reduction) and the
  // all-to-alls of this tiny model cost less than the reductions they save.
  EXPECT_GT(j["parallel"]["expert"].get<int>(), 1) << o.text;
  const Output train = zeroth({"train", config, "--set", "run.steps=2", "--set", "run.output_dir=" + temp("plan_moe_run")},
                              "plan_moe_train");
  EXPECT_EQ(train.code, 0) << train.text;
  const Output est = zeroth({"estimate", "--config", config}, "plan_moe_estimate");
  ASSERT_EQ(est.code, 0) << est.text;
  EXPECT_NE(est.text.find("rows for the experts (every layer's set holds them) (all-to-all buffers "), std::string::npos) << est.text;
  const Output alone = zeroth({"plan", "--params", "1B", "--top-k", "1", "--global-batch", "8"}, "plan_top_k_alone");
  EXPECT_NE(alone.code, 0);
  EXPECT_NE(alone.text.find("give --experts too"), std::string::npos) << alone.text;
  const Output many = zeroth({"plan", "--layers", "2", "--hidden", "32", "--heads", "2", "--experts", "4", "--top-k", "5",
                              "--global-batch", "8"},
                             "plan_top_k_many");
  EXPECT_NE(many.code, 0);
  EXPECT_NE(many.text.find("top_k 5 must be within 1 and the 4 experts"), std::string::npos) << many.text;
  const Output counted = zeroth({"plan", "--params", "1B", "--experts", "4", "--global-batch", "8"}, "plan_params_experts");
  EXPECT_NE(counted.code, 0);
  EXPECT_NE(counted.text.find("--params picks a dense shape"), std::string::npos) << counted.text;
}

// At a budget where the layout model (16-bit activations by Korthikanti's count) and the engine's
// own plan differ, the written config is one the engine's estimate fits.
TEST(Plan, TheWrittenConfigFitsTheEnginesOwnEstimate) {
  const std::string config = temp("plan_edge") + ".json";
  const Output o = zeroth({"plan", "--params", "7.5B", "--gpus", "8", "--global-batch", "64", "--device-memory", "56GiB",
                           "--emit-config", config},
                          "plan_edge");
  ASSERT_EQ(o.code, 0) << o.text;
  // The budget less the runtime allowance (1 GiB) the plan keeps for the CUDA context.
  const Output est = zeroth({"estimate", "--config", config, "--device-memory", "55GiB", "--json"}, "plan_edge_estimate");
  ASSERT_EQ(est.code, 0) << est.text;
  const json rows = json::parse(est.text)["rows"];
  int mine = 0;
  for (const auto& row : rows) {
    if (!row["config"].get<bool>()) continue;
    ++mine;
    EXPECT_TRUE(row["fits"].get<bool>()) << row.dump();
  }
  EXPECT_EQ(mine, 1);
}

// What the table says agrees with the engine and the help: fewer GPUs than the default node are one
// node of them; a plan with selective recomputation (the planner's alone) is marked as one zeroth
// does not run, with the fastest that it runs named; --runnable says what it leaves out; nothing
// says ZeRO-3 is kept from pipelines (the engine runs them together).
TEST(Plan, TheTableSaysWhatTheEngineRuns) {
  const Output two = zeroth({"plan", "--params", "1B", "--gpus", "2", "--global-batch", "16"}, "plan_two_gpus");
  ASSERT_EQ(two.code, 0) << two.text;
  EXPECT_NE(two.text.find("cluster: 2 GPUs (2 per node x 1 nodes)"), std::string::npos) << two.text;
  const Output odd = zeroth({"plan", "--params", "1B", "--gpus", "12", "--gpus-per-node", "8", "--global-batch", "24"}, "plan_odd");
  EXPECT_NE(odd.code, 0);
  EXPECT_NE(odd.text.find("--gpus 12 is not a multiple of --gpus-per-node 8: give whole nodes"), std::string::npos) << odd.text;
  const Output big = zeroth({"plan", "--params", "7B", "--gpus", "64", "--global-batch", "512", "--top", "200"}, "plan_7b");
  ASSERT_EQ(big.code, 0) << big.text;
  EXPECT_EQ(big.text.find("not combined with pipelines"), std::string::npos) << big.text;
  // The first row of the table, and whether the note after it names a plan zeroth runs.
  const size_t row = big.text.find("\n  1 ");
  ASSERT_NE(row, std::string::npos) << big.text;
  const std::string first = big.text.substr(row + 1, big.text.find('\n', row + 1) - row - 1);
  const bool noted = big.text.find("selective recomputation is the planner's alone") != std::string::npos;
  EXPECT_EQ(noted, first.find("selective*") != std::string::npos) << big.text;
  // Every row of the table with selective recomputation carries the mark (200 rows hold some).
  int selective = 0;
  std::istringstream lines(big.text);
  for (std::string line; std::getline(lines, line);) {
    const bool row = line.size() > 4 && std::isdigit(static_cast<unsigned char>(line[2])) && line[3] == ' ';
    if (!row || line.find("selective") == std::string::npos) continue;
    ++selective;
    EXPECT_NE(line.find("selective*"), std::string::npos) << line;
  }
  EXPECT_GT(selective, 0) << big.text;
  EXPECT_NE(big.text.find("selective*: Korthikanti et al.'s selective recomputation, which the planner models and zeroth's engine "
                          "does not run"),
            std::string::npos)
      << big.text;
  const Output help = zeroth({"plan", "--help"}, "plan_help");
  EXPECT_EQ(help.text.find("no tensor or pipeline parallelism yet"), std::string::npos) << help.text;
  EXPECT_NE(help.text.find("without selective recomputation"), std::string::npos) << help.text;
}

// --max-seq for Llama 3 8B on 8 GPUs of 80 GiB and 1 TiB of host memory: the host checkpoints are
// the limit, 32 layers x 2 bytes x 4096 channels = 256 KiB per position, so 1 TiB holds 4,194,304
// positions (the ALST paper trained 3.7M on 8 H100s), with the MLP tiled. On two such nodes tensor
// parallelism stays inside a node and Ulysses shares each sample over the two, its all-to-alls in
// the step.
TEST(Plan, MaxSeqAnswersTheLongestWindowAndItsLayout) {
  const Output o = zeroth({"plan", "--model", "llama-3-8b", "--gpus", "8", "--max-seq", "--json"}, "plan_max_seq");
  ASSERT_EQ(o.code, 0) << o.text;
  const json j = json::parse(o.text);
  EXPECT_EQ(j["max_seq"], 4194304);
  EXPECT_EQ(j["model"]["seq_len"], 4194304);
  EXPECT_EQ(j["global_batch"], 1);
  const json& best = j["plans"][0];
  EXPECT_EQ(best["tiled_mlp"], true);
  EXPECT_EQ(best["host_checkpoints"], true);
  EXPECT_EQ(best["host_bytes_per_gpu"].get<uint64_t>() * 8, uint64_t{1} << 40);
  const Output two = zeroth({"plan", "--model", "llama-3-8b", "--gpus", "16", "--max-seq", "--json"}, "plan_max_seq_nodes");
  ASSERT_EQ(two.code, 0) << two.text;
  const json m = json::parse(two.text);
  EXPECT_GT(m["max_seq"].get<uint64_t>(), 4194304u);
  const json& across = m["plans"][0];
  EXPECT_EQ(across["tp"], 8);
  EXPECT_EQ(across["sequence"], 2);
  EXPECT_GT(across["parts_s"]["sequence"].get<double>(), 0);
  EXPECT_LE(across["device_bytes"].get<uint64_t>(), uint64_t{80} << 30);
}

TEST(Plan, RefusesBadInputSayingWhatToGive) {
  const Output none = zeroth({"plan", "--global-batch", "8"}, "plan_no_model");
  EXPECT_NE(none.code, 0);
  EXPECT_NE(none.text.find("one of --model PRESET, --params COUNT, or --layers"), std::string::npos) << none.text;
  const Output preset = zeroth({"plan", "--model", "llama-4", "--global-batch", "8"}, "plan_unknown_preset");
  EXPECT_NE(preset.code, 0);
  EXPECT_NE(preset.text.find("--model llama-4 is not a known preset; use one of gpt2-124m"), std::string::npos) << preset.text;
  const Output vocab = zeroth({"plan", "--model", "llama-3-8b", "--vocab", "1000", "--global-batch", "8"}, "plan_preset_vocab");
  EXPECT_NE(vocab.code, 0);
  EXPECT_NE(vocab.text.find("--vocab goes with --layers, --hidden and --heads: --model llama-3-8b has its own vocabulary"),
            std::string::npos)
      << vocab.text;
  const Output unknown = zeroth({"estimate", "--model", "llama-4"}, "estimate_unknown_preset");
  EXPECT_NE(unknown.code, 0);
  EXPECT_NE(unknown.text.find("--model llama-4 is not a known preset"), std::string::npos) << unknown.text;
  const Output heads = zeroth({"plan", "--layers", "2", "--hidden", "30", "--heads", "4", "--global-batch", "8"}, "plan_heads");
  EXPECT_NE(heads.code, 0);
  EXPECT_NE(heads.text.find("hidden 30 is not a multiple of heads 4"), std::string::npos) << heads.text;
  const std::string bogus = temp("plan_bogus") + ".json";
  std::ofstream(bogus) << R"({"loss": 1.0})";
  const Output cal = zeroth({"plan", "--params", "1B", "--global-batch", "8", "--calibrate", bogus}, "plan_calibrate");
  EXPECT_NE(cal.code, 0);
  EXPECT_NE(cal.text.find("not the JSON output of zeroth bench"), std::string::npos) << cal.text;
  const Output big = zeroth({"plan", "--params", "1T", "--gpus-per-node", "1", "--global-batch", "8", "--no-offload"}, "plan_big");
  EXPECT_NE(big.code, 0);
  EXPECT_NE(big.text.find("no layout of this model fits"), std::string::npos) << big.text;
  const Output split = zeroth({"plan", "--params", "1T", "--gpus", "1000", "--global-batch", "3072"}, "plan_split");
  EXPECT_NE(split.code, 0);
  EXPECT_NE(split.text.find("give a --global-batch that is a multiple of"), std::string::npos) << split.text;
  const Output tiny = zeroth({"plan", "--params", "1M", "--global-batch", "8"}, "plan_tiny");
  EXPECT_NE(tiny.code, 0);
  EXPECT_NE(tiny.text.find("give the model as --layers, --hidden and --heads"), std::string::npos) << tiny.text;
  const Output json_none = zeroth({"plan", "--params", "1T", "--gpus-per-node", "1", "--global-batch", "8", "--no-offload", "--json"},
                                  "plan_json_none");
  EXPECT_NE(json_none.code, 0) << json_none.text;
  // estimate --layers: tensor parallelism inside a node, options that would be ignored refused
  const Output across = zeroth({"estimate", "--layers", "4", "--hidden", "256", "--heads", "16", "--gpus-per-node", "8", "--nodes",
                                "2", "--tp", "16"},
                               "estimate_tp_across");
  EXPECT_NE(across.code, 0);
  EXPECT_NE(across.text.find("tensor parallelism stays inside a node"), std::string::npos) << across.text;
  const Output sp = zeroth({"estimate", "--layers", "4", "--hidden", "256", "--heads", "16", "--sequence-parallel"}, "estimate_sp");
  EXPECT_NE(sp.code, 0);
  EXPECT_NE(sp.text.find("give --tp above 1"), std::string::npos) << sp.text;
}

}  // namespace
}  // namespace zeroth
