// `zeroth estimate --config` against the run itself: for the tiny GPT at every stage, with the
// optimizer offloaded to host memory, and with offload_optimizer.ratio 0.5 (which zeroth train
// resets to 1 below stage 3, as DeepSpeed does), the row of the config's own choice counts the
// device peak the run's accounting measures to within the loop's 8 bytes of flags (which the stated
// allowance covers), and its host bytes exactly;
// and its "fits" is the engine's own start-up check, to the byte.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using json = nlohmann::json;
using testing::estimate_with;
using testing::run;
using testing::temp;
using testing::tiny;
using testing::write_config;

json estimate_rows(const std::string& config, const std::string& name) {
  json mine;
  return estimate_with(config, {}, name, mine).at("rows");
}

struct Case {
  int stage;
  const char* optimizer;
  double ratio = 1;  // offload_optimizer.ratio as written (zeroth train resets it to 1 below stage 3)
};

TEST(Estimate, TheConfigsRowPredictsTheRunsPeaks) {
  for (const Case c : {Case{0, "none"}, Case{1, "none"}, Case{2, "none"}, Case{3, "none"}, Case{2, "cpu"}, Case{3, "cpu"},
                       Case{1, "cpu", 0.5}, Case{3, "cpu", 0.5}}) {
    const std::string name = "estimate_" + std::to_string(c.stage) + c.optimizer + (c.ratio < 1 ? "_ratio" : "");
    json j = tiny(name);
    j["run"]["steps"] = 2;
    j["run"]["checkpoint_interval"] = -1;
    j["zero_optimization"]["stage"] = c.stage;
    j["zero_optimization"]["offload_optimizer"] = {{"device", c.optimizer}};
    if (c.ratio < 1) {
      j["zero_optimization"]["offload_optimizer"]["ratio"] = c.ratio;
      j["zero_optimization"]["reduce_bucket_size"] = 2000;  // several buckets, so a ratio can keep some
    }
    const std::string config = write_config(name, j);
    const json rows = estimate_rows(config, name);
    // stage 0: 1 row; 1 and 2: 3 each; 3: none, cpu, nvme for the optimizer, and with one of them
    // parameters on cpu or nvme: 7.
    ASSERT_EQ(rows.size(), 14u);
    json mine;
    for (const auto& r : rows) {
      if (r["config"].get<bool>()) mine = r;
      // With a ratio below 1, parameter offload is refused (it moves every shard off the device).
      const bool refusable = c.ratio < 1 && r["offload_param"] != "none";
      EXPECT_EQ(r.contains("refused"), refusable) << r.dump();
    }
    ASSERT_FALSE(mine.is_null()) << "no row is the config's";
    EXPECT_EQ(mine["stage"], c.stage);
    EXPECT_EQ(mine["offload_optimizer"], c.optimizer);
    const auto r = run({ZEROTH_BIN, "train", config}, name);
    ASSERT_EQ(r.code, 0) << r.output;
    const json summary = r.metrics.back()["summary"];
    const double device = summary["peak_bytes"].get<double>(), predicted = mine["device_bytes"].get<double>();
    std::printf("stage %d, optimizer on %s, ratio %g: device peak %.0f, estimate %.0f (%.0f bytes over, %.0f under without the "
                "allowance)\n",
                c.stage, c.optimizer, c.ratio, device, predicted, predicted - device,
                device - (predicted - mine["device_allowance_bytes"].get<double>()));
    // The estimate holds a stated allowance (64 KiB) for small allocations on top of what it
    // counts; what it counts is within 5% of the measured peak, and with the allowance above it.
    // What it counts is the peak but for the run loop's own flags (the loss and the stop flag, 8
    // bytes), which the allowance stands for.
    const double counted = predicted - mine["device_allowance_bytes"].get<double>();
    EXPECT_GE(device, counted) << "stage " << c.stage << ", optimizer on " << c.optimizer;
    EXPECT_LE(device - counted, 64) << "stage " << c.stage << ", optimizer on " << c.optimizer;
    const double host = summary["host_peak_bytes"].get<double>(),
                 host_predicted = mine["host_bytes"].get<double>() + mine["pinned_host_bytes"].get<double>();
    EXPECT_EQ(host_predicted, host) << "stage " << c.stage << ", optimizer on " << c.optimizer;
    if (std::string(c.optimizer) == "cpu") {
      EXPECT_GT(host, 0.0);
    }
  }
}

// Every example config in configs/ that trains on this machine's fortunes, GPT-2 and Llama (the GPT-2 124M one
// needs FineWeb token files, the 2B one 35 GiB of swap and minutes per step: docs/PERFORMANCE.md
// gives their figures), and the chat fine-tunings of the fortunes' riddles (tools/riddles-chat.sh's
// conversations, from the Llama run's 2-step weights), run for 2 steps as `zeroth train` runs it,
// against `zeroth estimate --config` of the same config:
// - the engine's own device accounting: its peak lies between what the estimate counts and that
//   plus its stated 64 KiB allowance (80 bytes above the count at most, measured); its host peak
//   is the estimate's pinned + pageable bytes;
// - independently of zeroth's accounting, the kernel's: the process's peak resident set above its
//   resident set at start (VmHWM - VmRSS) is the estimate of all its ranks (the CPU device's
//   memory is the process's; with the end-of-run save's host copies and the run's own: tokens,
//   loader, threads) within 2% plus 16 MiB either way. Above: what no rank counts (the program's
//   pages first run, the main thread, BLAS). Below: the estimate counts the checkpoint's and the
//   weights file's host buffers as held together, which they are only where the allocator keeps
//   the first after its free;
// - the disk the swap files take (fstat's st_blocks) is the estimate's NVMe bytes.
TEST(Estimate, EveryConfigsRunStaysWithinItsEstimate) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  constexpr bool sanitized = true;
#else
  constexpr bool sanitized = false;
#endif
  const std::filesystem::path dir = std::filesystem::path(ZEROTH_SOURCE_DIR) / "configs";
  // Each config as it is, and one with asynchronous saves (a host snapshot of each rank's file).
  std::vector<std::pair<std::filesystem::path, std::string>> cases, riddles;
  auto is_chat = [](const std::filesystem::path& path) {
    const json config = json::parse(std::ifstream(path));
    return config.contains("data") && config["data"].value("format", "") == "jsonl";
  };
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    const bool fortunes = file.rfind("gpt-fortunes-", 0) == 0 || file.rfind("llama-fortunes-", 0) == 0;
    if (entry.path().extension() != ".json") continue;
    if (is_chat(entry.path()) && (fortunes || file.rfind("llama-riddles-", 0) == 0)) riddles.emplace_back(entry.path(), "");
    else if (fortunes) cases.emplace_back(entry.path(), "");
  }
  cases.emplace_back(dir / "gpt-fortunes-zero3-bf16.json", "run.checkpoint_async=true");
  // The chat fine-tunings start from llama-fortunes-zero3's weights: the 2-step run's above, after it.
  std::sort(riddles.begin(), riddles.end());
  cases.insert(cases.end(), riddles.begin(), riddles.end());
  const std::string conversations = temp("truth_riddles") + ".jsonl";
  ASSERT_EQ(std::system(("'" + std::string(ZEROTH_SOURCE_DIR) + "/tools/riddles-chat.sh' '" + conversations + "'").c_str()), 0);
  int checked = 0;
  for (const auto& [path, extra] : cases) {
    const std::string file = path.filename().string() + (extra.empty() ? "" : " " + extra);
    const std::string name = "truth_" + path.stem().string() + (extra.empty() ? "" : "_async");
    std::vector<std::string> sets = {"--set", "run.steps=2",
                                     "--set", "run.eval_interval=100",
                                     "--set", "run.output_dir=" + temp(name)};
    if (!extra.empty()) sets.insert(sets.end(), {"--set", extra});
    if (is_chat(path))
      sets.insert(sets.end(), {"--set", "data.train=" + conversations, "--set",
                               "run.init_from=" + temp("truth_llama-fortunes-zero3") + "/model.safetensors"});
    // A vocabulary the README's setup trains (tools/fortunes-vocab.sh) is named from the config's
    // folder, where its relative path points from.
    const json config = json::parse(std::ifstream(path));
    if (config.contains("data") && config["data"].contains("tokenizer")) {
      const std::filesystem::path vocab = path.parent_path() / config["data"]["tokenizer"].get<std::string>();
      ASSERT_TRUE(std::filesystem::exists(vocab)) << vocab << " is missing: run tools/fortunes-vocab.sh (tools/dev.sh does)";
      sets.insert(sets.end(), {"--set", "data.tokenizer=" + vocab.string()});
    }
    json mine;
    const json estimate = estimate_with(path.string(), sets, name, mine);
    ASSERT_FALSE(mine.is_null()) << file;
    std::vector<std::string> train_args = {ZEROTH_BIN, "train", path.string()};
    train_args.insert(train_args.end(), sets.begin(), sets.end());
    std::filesystem::remove_all(temp(name));
    const auto r = run(train_args, name);
    ASSERT_EQ(r.code, 0) << r.output;
    const json s = r.metrics.back()["summary"];
    const double ranks = estimate["world_size"].get<double>();
    const double counted = mine["device_bytes"].get<double>() - mine["device_allowance_bytes"].get<double>();
    const double peak = s["peak_bytes"].get<double>();
    EXPECT_GE(peak, counted) << file;
    EXPECT_LE(peak, mine["device_bytes"].get<double>()) << file;  // within the stated allowance
    const double host = mine["host_bytes"].get<double>() + mine["pinned_host_bytes"].get<double>();
    EXPECT_EQ(s["host_peak_bytes"].get<double>(), host) << file;
    const double all_ranks = ranks * (mine["device_bytes"].get<double>() + host + mine["save_host_bytes"].get<double>() +
                                      mine["run_host_bytes"].get<double>());
    const double grown = s["peak_rss_bytes"].get<double>() - s["rss_baseline_bytes"].get<double>();
    const double MiB = 1024 * 1024;
    std::printf(
        "%-72s %g ranks: estimate %8.2f MiB, resident set grew %8.2f MiB (%+.2f); swap files %.2f MiB on disk, estimate %.2f\n",
        file.c_str(), ranks, all_ranks / MiB, grown / MiB, (grown - all_ranks) / MiB, s["swap_disk_bytes"].get<double>() / MiB,
        mine["nvme_bytes"].get<double>() / MiB);
    // A sanitizer's shadow memory and quarantine are resident too (zeroth is built with it).
    if (!sanitized) {
      // Beyond 2% and 16 MiB, 3 MiB a rank for where glibc leaves the packing buffers oneDNN's
      // sgemm allocates on every call: its dynamic mmap threshold keeps them in the heap or maps
      // them afresh depending on the order of the run's other allocations. When attention's
      // products left oneDNN, the configs' growth moved by -10 to +9 MiB against the estimate
      // (means of 3 runs; gpt-fortunes-zero0-fp32 from 12-20 MiB past it to 19-25), and a run's
      // growth fell by 15-30 MiB with the threshold pinned (MALLOC_MMAP_THRESHOLD_=131072, which
      // slows the products by a fifth, so zeroth leaves glibc's default). The CPU device keeps a
      // freed block for a request of its size, so a pass at another shape would stack its blocks on
      // the cached ones unseen by the peak: the evaluation's last round keeps the training's batch and
      // the end's gathers one size (+46.6 and +34.3 MiB past the estimate for the chat configs, +19.1
      // for llama-fortunes-zero3, before they did).
      const double allowance = 0.02 * all_ranks + 16 * MiB + ranks * 3 * MiB;
      EXPECT_LE(grown - all_ranks, allowance) << file;
      EXPECT_GE(grown - all_ranks, -allowance) << file;
    }
    EXPECT_EQ(s["swap_disk_bytes"].get<double>(), mine["nvme_bytes"].get<double>()) << file;
    ++checked;
  }
  EXPECT_GE(checked, 16);
}

// A device budget of exactly the config row's device_bytes fits (estimate and run agree); one byte
// less does not fit, and the run is refused at start with nothing allocated.
TEST(Estimate, FitsIsTheEnginesOwnCheck) {
  json j = tiny("estimate_fits");
  j["run"]["steps"] = 1;
  j["run"]["checkpoint_interval"] = -1;
  const std::string config = write_config("estimate_fits", j);
  double bytes = 0;
  for (const auto& r : estimate_rows(config, "estimate_fits"))
    if (r["config"].get<bool>()) bytes = r["device_bytes"].get<double>();
  ASSERT_GT(bytes, 0);
  for (const double budget : {bytes, bytes - 1}) {
    const std::string b = std::to_string(static_cast<uint64_t>(budget));
    auto child = testing::spawn({ZEROTH_BIN, "estimate", "--config", config, "--json", "--device-memory", b}, {},
                                temp("estimate_fits") + ".estimate");
    ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(60)), 0);
    bool fits = false;
    const json out = json::parse(child.output());
    for (const auto& r : out["rows"])
      if (r["config"].get<bool>()) fits = r["fits"].get<bool>();
    json k = j;
    k["run"]["device_memory"] = static_cast<uint64_t>(budget);
    const auto run_result = run({ZEROTH_BIN, "train", write_config("estimate_fits_run", k)}, "estimate_fits_run");
    EXPECT_EQ(fits, budget == bytes) << "budget " << b;
    EXPECT_EQ(run_result.code == 0, fits) << "budget " << b << ": the run and the estimate disagree\n" << run_result.output;
    if (!fits) {
      EXPECT_NE(run_result.output.find("nothing was allocated"), std::string::npos) << run_result.output;
    }
  }
}

// configs/gpt-moe-ep.json (8 experts over 4 ranks) with run.device_memory at its own row of
// `zeroth estimate --config` plus 1 MiB: the run trains, validates, saves its checkpoint, gathers
// its weights (the experts' from every rank) into model.safetensors and samples from them, every
// part of it inside the estimate, which the measured peak meets to within the stated allowance.
TEST(Estimate, TheExpertParallelExampleRunsToItsEndAtItsEstimate) {
  const std::string config = std::string(ZEROTH_SOURCE_DIR) + "/configs/gpt-moe-ep.json";
  const std::string name = "estimate_moe";
  std::filesystem::remove_all(temp(name));
  const std::vector<std::string> sets = {"--set", "run.steps=2",
                                         "--set", "run.eval_interval=1",
                                         "--set", "run.output_dir=" + temp(name)};
  json mine;
  estimate_with(config, sets, name, mine);
  ASSERT_FALSE(mine.is_null());
  const auto device = mine.at("device_bytes").get<uint64_t>();
  std::vector<std::string> train_args = {ZEROTH_BIN, "train", config, "--set",
                                         "run.device_memory=" + std::to_string(device + (1 << 20))};
  train_args.insert(train_args.end(), sets.begin(), sets.end());
  const auto r = run(train_args, name);
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_TRUE(std::filesystem::exists(temp(name) + "/model.safetensors")) << r.output;
  EXPECT_NE(r.output.find("sample ("), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("(not taken:"), std::string::npos) << r.output;
  ASSERT_TRUE(r.metrics.back().contains("summary")) << r.output;
  const json s = r.metrics.back().at("summary");
  std::printf("gpt-moe-ep: estimate %llu bytes, measured peak %.0f\n", static_cast<unsigned long long>(device),
              s.at("peak_bytes").get<double>());
  EXPECT_LE(s.at("peak_bytes").get<double>(), static_cast<double>(device));
  EXPECT_GE(s.at("peak_bytes").get<double>(), static_cast<double>(device - mine.at("device_allowance_bytes").get<uint64_t>()));
}

// Without --device-memory a GPU has zeroth plan's 80 GiB (a DGX A100 80GB node's), stated: Llama 3
// 8B's 128 GB of model states on one GPU do not fit, its 44 GB per GPU at stage 1 over 8 do.
TEST(Estimate, GpusHaveThePlannersMemoryUnlessGiven) {
  auto child = testing::spawn({ZEROTH_BIN, "estimate", "--model", "llama-3-8b", "--gpus-per-node", "8", "--json"}, {},
                              temp("estimate_default_budget") + ".out");
  ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(60)), 0) << child.output();
  const json out = json::parse(child.output());
  EXPECT_EQ(out.at("device_memory"), uint64_t{80} << 30);
  EXPECT_EQ(out.at("host_memory_per_node"), uint64_t{1} << 40);
  for (const auto& r : out.at("rows")) {
    if (r.at("offload_optimizer") != "none") continue;
    EXPECT_EQ(r.at("fits").get<bool>(), r.at("stage").get<int>() >= 1) << r.dump();
  }
  auto text = testing::spawn({ZEROTH_BIN, "estimate", "--model", "llama-3-8b"}, {}, temp("estimate_default_budget_text") + ".out");
  ASSERT_EQ(testing::wait_exit(text, std::chrono::seconds(60)), 0) << text.output();
  EXPECT_NE(text.output().find("budgets: device 80.00 GiB per GPU, host 1.00 TiB per node (zeroth plan's defaults, a DGX A100 "
                               "80GB node's; --device-memory, --host-memory; 0 is unlimited)"),
            std::string::npos)
      << text.output();
  auto unlimited = testing::spawn({ZEROTH_BIN, "estimate", "--model", "llama-3-8b", "--device-memory", "0", "--json"}, {},
                                  temp("estimate_unlimited") + ".out");
  ASSERT_EQ(testing::wait_exit(unlimited, std::chrono::seconds(60)), 0) << unlimited.output();
  const json rows = json::parse(unlimited.output())["rows"];
  for (const auto& r : rows) EXPECT_TRUE(r.at("fits").get<bool>()) << r.dump();
}

// --model: a preset's exact count and largest block (Llama 3 8B: 8,030,261,248 parameters as
// published; its largest blocks, the embedding and the untied head, 128256 x 4096) in the ZeRO
// paper's count: 16 bytes per parameter at stage 0, 16P / 8 per GPU at stage 3 over 8 GPUs.
TEST(Estimate, ModelModeTakesAPresetsExactCount) {
  auto child = testing::spawn({ZEROTH_BIN, "estimate", "--model", "llama-3-8b", "--gpus-per-node", "8", "--json"}, {},
                              temp("estimate_model") + ".out");
  ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(60)), 0) << child.output();
  const json out = json::parse(child.output());
  EXPECT_EQ(out["model"], "llama-3-8b");
  EXPECT_EQ(out["params"], 8'030'261'248u);
  EXPECT_EQ(out["largest_layer"], 128'256u * 4096u);
  int checked = 0;
  for (const auto& r : out["rows"]) {
    if (r["offload_optimizer"] != "none" || r["offload_param"] != "none") continue;
    checked += r["stage"] == 0 || r["stage"] == 3;
    if (r["stage"] == 0) {
      EXPECT_EQ(r["device_bytes"], 16u * 8'030'261'248u);
    } else if (r["stage"] == 3) {
      EXPECT_EQ(r["device_bytes"], 16u * 8'030'261'248u / 8u);
    }
  }
  EXPECT_EQ(checked, 2);
}

// --params: the ZeRO paper's model states per GPU for 7.5B parameters on 64 GPUs (its Figure 1:
// 120 GB, 31.4, 16.6, 1.88), host and NVMe per node where offloading puts them, and "fits" against
// a 32 GB device.
TEST(Estimate, ParameterCountModeGivesTheZeroPapersModelStates) {
  auto child = testing::spawn({ZEROTH_BIN, "estimate", "--params", "7.5B", "--gpus-per-node", "8", "--nodes", "8", "--device-memory",
                               "32GB", "--json"},
                              {}, temp("estimate_params") + ".out");
  ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(60)), 0) << child.output();
  const json out = json::parse(child.output());
  EXPECT_EQ(out["params"], 7'500'000'000u);
  const auto& rows = out["rows"];
  ASSERT_EQ(rows.size(), 14u);
  auto row = [&](int stage, const char* optimizer, const char* params) {
    for (const auto& r : rows)
      if (r["stage"] == stage && r["offload_optimizer"] == optimizer && r["offload_param"] == params) return r;
    ADD_FAILURE() << "no row for stage " << stage << " " << optimizer << " " << params;
    return json();
  };
  EXPECT_EQ(row(0, "none", "none")["device_bytes"], 120'000'000'000u);
  EXPECT_EQ(row(1, "none", "none")["device_bytes"], 31'406'250'000u);  // 4P + 12P/64
  EXPECT_EQ(row(2, "none", "none")["device_bytes"], 16'640'625'000u);  // 2P + 14P/64
  EXPECT_EQ(row(3, "none", "none")["device_bytes"], 1'875'000'000u);   // 16P/64
  EXPECT_FALSE(row(0, "none", "none")["fits"].get<bool>());
  EXPECT_TRUE(row(1, "none", "none")["fits"].get<bool>());
  // The optimizer in host memory: 16P/64 per GPU, 8 GPUs per node.
  EXPECT_EQ(row(2, "cpu", "none")["host_bytes_per_node"], 8ull * 1'875'000'000ull);
  EXPECT_EQ(row(3, "nvme", "nvme")["nvme_bytes_per_node"], 8ull * (1'875'000'000ull + 234'375'000ull));
}

// --layers/--hidden/--heads: GPT-2 350M's shape (24 layers, hidden 1024, 16 heads, seq 1024,
// vocab 50257) on 8 GPUs, micro-batch 2: model states as the paper counts them for its
// 354,823,168 parameters, and activations by Korthikanti's formulas worked out here: per layer
// 34 s b h = 71,303,168 bytes and each row's log-sum-exp, 4 a s b = 131,072 (with the s x s scores
// kept instead, 5 a s^2 b = 167,772,160: the labelled alternative); plus the embedding's dropout mask
// (s b h) and the head's input and fp32 logits (4 s b h + 4 s b V); with full recomputation the
// loss runs by chunks of 320 tokens (model.chunked_loss follows it), which keep 4 x 320 x V.
TEST(Estimate, GptDimensionModeCountsActivations) {
  auto child = testing::spawn({ZEROTH_BIN, "estimate", "--layers", "24", "--hidden", "1024", "--heads", "16", "--seq", "1024",
                               "--vocab", "50257", "--micro-batch", "2", "--gpus-per-node", "8", "--runtime-memory", "0", "--json"},
                              {}, temp("estimate_shape") + ".out");
  ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(60)), 0) << child.output();
  const json out = json::parse(child.output());
  EXPECT_EQ(out["params"], 354'823'168u);
  const json rows = out["rows"];
  ASSERT_EQ(rows.size(), 14u);
  const uint64_t p = 354'823'168u, sbh = 1024ull * 2 * 1024;
  const uint64_t layer = 71'303'168ull + 131'072ull;
  const uint64_t around = sbh + 4 * sbh + 4ull * 1024 * 2 * 50257;
  for (const auto& r : rows) {
    if (r["offload_optimizer"] != "none") continue;
    const int stage = r["stage"];
    const uint64_t states = stage == 0 ? 16 * p : stage == 1 ? 4 * p + 12 * p / 8 : stage == 2 ? 2 * p + 14 * p / 8 : 16 * p / 8;
    EXPECT_EQ(r["model_states_bytes_per_gpu"].get<uint64_t>(), states) << stage;
    EXPECT_EQ(r["activations_bytes"]["none"].get<uint64_t>(), 24 * layer + around) << stage;
    EXPECT_EQ(r["activations_bytes_if_attention_keeps_scores"].get<uint64_t>(), 24 * (71'303'168ull + 167'772'160ull) + around)
        << stage;
    EXPECT_EQ(r["activations_bytes"]["selective"].get<uint64_t>(), 24 * 71'303'168ull + around) << stage;
    // full: each layer's input (2 s b h) and one layer whole while it is recomputed
    const uint64_t around_chunked = sbh + 4 * sbh + 4ull * 320 * 50257;
    EXPECT_EQ(r["activations_bytes"]["full"].get<uint64_t>(), 24 * 2 * sbh + layer + around_chunked) << stage;
  }
}

// --model with a layout option: the preset's shape, activations too. Llama 3 70B at 8192 tokens on
// one node, tp 8 with sequence parallelism: per layer, selective recomputation keeps
// (8 s b h + 4 s b h + 4 s b kv + 6 s b ffn) / 8 = 281,018,368 bytes (no dropout, softmax recomputed);
// the head's input and fp32 logits add 4 s b h / 8 (1 + V / h) = 558,891,008.
TEST(Estimate, ModelModeWithALayoutCountsTheLlamasActivations) {
  auto child = testing::spawn({ZEROTH_BIN, "estimate", "--model", "llama-3-70b", "--seq", "8192", "--tp", "8", "--sequence-parallel",
                               "--gpus-per-node", "8", "--json"},
                              {}, temp("estimate_model_layout") + ".out");
  ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(60)), 0) << child.output();
  const json out = json::parse(child.output());
  EXPECT_EQ(out["params"], 70'553'706'496u);
  for (const auto& r : out["rows"]) {
    EXPECT_EQ(r["activations_bytes"]["selective"].get<uint64_t>(), 80ull * 281'018'368ull + 558'891'008ull) << r.dump();
  }
  auto odd = testing::spawn({ZEROTH_BIN, "estimate", "--model", "llama-3-8b", "--tp", "16", "--gpus-per-node", "16"}, {},
                            temp("estimate_model_kv") + ".out");
  EXPECT_NE(testing::wait_exit(odd, std::chrono::seconds(60)), 0);
  EXPECT_NE(odd.output().find("--tp 16 does not divide the 8 key/value heads"), std::string::npos) << odd.output();
}

// --deepspeed-compatible --json: DeepSpeed's rows for t5-3b on one node of 8 GPUs, in its order,
// integers as its functions return them.
TEST(Estimate, DeepSpeedCompatibleRows) {
  auto child = testing::spawn({ZEROTH_BIN, "estimate", "--params", "2851598336", "--largest-layer", "32899072", "--gpus-per-node", "8",
                               "--deepspeed-compatible", "--json"},
                              {}, temp("estimate_ds") + ".out");
  ASSERT_EQ(testing::wait_exit(child, std::chrono::seconds(60)), 0) << child.output();
  const json out = json::parse(child.output());
  const auto& rows = out["rows"];
  ASSERT_EQ(rows.size(), 8u);
  EXPECT_EQ(rows[0]["stage"], 2);
  EXPECT_TRUE(rows[0]["zero_init"].is_null());
  EXPECT_EQ(rows[0]["offload_optimizer"], "cpu");
  EXPECT_EQ(rows[0]["gpu_bytes"], 2ull * 2'851'598'336ull);
  EXPECT_EQ(rows[0]["cpu_bytes"], 48ull * 2'851'598'336ull);  // max(4 x 8, 16) x 1.5
  EXPECT_EQ(rows[2]["stage"], 3);
  EXPECT_EQ(rows[2]["offload_param"], "cpu");
  EXPECT_EQ(rows[2]["zero_init"], true);
  EXPECT_EQ(rows[2]["gpu_bytes"], 4ull * 32'899'072ull);
  EXPECT_EQ(rows[2]["cpu_bytes"], 27ull * 2'851'598'336ull);  // 18 x 1.5
}

}  // namespace
}  // namespace zeroth
