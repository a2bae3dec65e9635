// The CLI's machine-readable outputs: `zeroth report --json` and every bench's `--json` parse and
// carry the fields the issues specify, with positive figures.
#include <gtest/gtest.h>

#include <signal.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <set>
#include <string>
#include <thread>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cpu/blas_info.h"
#include "core/cuda/cuda_info.h"
#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"  // testing::bytes_of

namespace zeroth {
namespace {

using namespace std::chrono_literals;

nlohmann::json run_json(const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> argv = {ZEROTH_BIN};
  argv.insert(argv.end(), args.begin(), args.end());
  auto child = testing::spawn(argv, {"ZEROTH_LOG_LEVEL=error"}, ::testing::TempDir() + "cli_" + name + ".json");
  const int code = testing::wait_exit(child, 300s);
  EXPECT_EQ(code, 0) << child.output();
  try {
    return nlohmann::json::parse(child.output());
  } catch (const std::exception& e) {
    ADD_FAILURE() << name << ": not JSON (" << e.what() << "):\n" << child.output();
    return {};
  }
}

TEST(Cli, ReportJsonNamesEveryComponent) {
  const auto r = run_json({"report", "--json"}, "report");
  for (const char* key :
       {"zeroth", "cpu", "cpu kernels", "threads", "memory", "cuda", "nccl", "io_uring", "gloo", "gpus", "environment"}) {
    EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
  }
  EXPECT_TRUE(r["environment"].contains("ZEROTH_COMM_TIMEOUT"));
  // The BLAS core is the one this process's OpenBLAS runs (same library, same environment).
  const auto& blas = r["blas"];
  EXPECT_EQ(blas["core"], cpu::blas_info().core) << blas.dump();
  EXPECT_EQ(blas["threads"], cpu::blas_info().threads) << blas.dump();
  EXPECT_GT(blas["sgemm"]["gflops"].get<double>(), 0.0) << blas.dump();
  EXPECT_EQ(blas["below_cpu"].get<bool>(), !blas["note"].get<std::string>().empty()) << blas.dump();
}

TEST(Cli, ReportTextNamesTheBlasCoreAndItsGemmRate) {
  const auto core = cpu::blas_info().core;
  auto child = testing::spawn({ZEROTH_BIN, "report"}, {"ZEROTH_LOG_LEVEL=error"}, ::testing::TempDir() + "cli_report.txt");
  ASSERT_EQ(testing::wait_exit(child, 300s), 0) << child.output();
  const std::string text = child.output();
  EXPECT_NE(text.find("core " + core + " ("), std::string::npos) << text;
  EXPECT_NE(text.find(" GFLOP/s (2048x2048x2048 f32"), std::string::npos) << text;
}

TEST(Cli, BenchKernelsJson) {
  const auto r = run_json({"bench", "kernels", "--size", "4MiB", "--reps", "3", "--json"}, "kernels");
  EXPECT_GT(r["memcpy_gbps"].get<double>(), 0.0);
  std::set<std::string> names;
  for (const auto& k : r["kernels"]) {
    names.insert(k["name"].get<std::string>());
    EXPECT_GT(k["gbps"].get<double>(), 0.0) << k.dump();
  }
  for (const char* n : {"cast_f32_bf16", "axpy", "sumsq"}) EXPECT_TRUE(names.count(n)) << n;
}

// The model's FLOPs of causal attention: 4 B NH hs T (T + 1) / 2 forward and twice that backward.
TEST(Cli, BenchAttentionJsonCountsTheModelsFlops) {
  const auto r = run_json({"bench", "attention", "--batch", "2", "--heads", "4", "--kv-heads", "2", "--head-size", "16", "--seq",
                           "1,65", "--reps", "1", "--json"},
                          "attention");
  EXPECT_EQ(r["kv_heads"], 2);
  ASSERT_EQ(r["rows"].size(), 2u);
  for (const auto& row : r["rows"]) {
    const double T = row["seq"].get<double>(), flops = 4.0 * 2 * 4 * 16 * T * (T + 1) / 2;
    EXPECT_EQ(row["forward_flops"].get<double>(), flops) << row.dump();
    EXPECT_EQ(row["backward_flops"].get<double>(), 2 * flops) << row.dump();
    EXPECT_GT(row["gemm_forward_gflops"].get<double>(), 0.0);
    EXPECT_DOUBLE_EQ(row["forward_of_gemm"].get<double>(),
                     row["forward_gflops"].get<double>() / row["gemm_forward_gflops"].get<double>());
  }
  EXPECT_EQ(r["rows"][0]["seq"], 1);
  EXPECT_EQ(r["rows"][1]["seq"], 65);
}

TEST(Cli, BenchCommJsonLocalAndGloo) {
  for (const char* backend : {"local", "gloo"}) {
    const auto r = run_json({"bench", "comm", "--backend", backend, "--ranks", "2", "--max-bytes", "64KiB", "--json"},
                            std::string("comm_") + backend);
    EXPECT_EQ(r["backend"], backend);
    EXPECT_EQ(r["ranks"], 2);
    EXPECT_GT(r["ceiling_gbps"].get<double>(), 0.0);
    ASSERT_EQ(r["results"].size(), 7u * 7);  // seven op variants x 1 KiB .. 64 KiB
    for (const auto& row : r["results"]) {
      for (const char* key : {"op", "in_place", "bytes", "dtype", "time_us", "algbw", "busbw"}) EXPECT_TRUE(row.contains(key)) << key;
      EXPECT_GT(row["time_us"].get<double>(), 0.0);
    }
  }
}

TEST(Cli, BenchEngineJsonLabelsEachRowsTransportAndItsBounds) {
  // A model this small steps in about a millisecond: no room for a link latency per collective.
  const auto r = run_json({"bench", "engine", "--layers", "2", "--width", "32", "--batch", "4", "--warmup", "1", "--steps", "5",
                           "--rounds", "1", "--latency-us", "0", "--json"},
                          "engine");
  EXPECT_EQ(r["ranks"], 2);
  EXPECT_GT(r["link_gbps"].get<double>(), 0.0);
  std::vector<std::string> rows;
  for (const auto& row : r["rows"]) {
    rows.push_back(row["transport"].get<std::string>() + ": " + row["name"].get<std::string>());
    EXPECT_EQ(row["steps_s"].size(), 5u) << row.dump();
    EXPECT_GT(row["median_s"].get<double>(), 0.0) << row.dump();
    EXPECT_EQ(row["full_overlap_s"], std::max(row["compute_s"].get<double>(), row["comm_s"].get<double>())) << row.dump();
    EXPECT_EQ(row["serial_s"], row["compute_s"].get<double>() + row["comm_s"].get<double>()) << row.dump();
  }
  EXPECT_EQ(rows, (std::vector<std::string>{"link model: stage 3, prefetch", "link model: stage 3, no prefetch",
                                            "link model: stage 3, prefetch, overlap_comm false",
                                            "gloo: stage 3, overlap_comm false, 1 row per rank", "gloo: stage 3, prefetch",
                                            "gloo: stage 3, no prefetch", "gloo: stage 3, prefetch, overlap_comm false"}));
}

// The smallest step of the smallest preset, in JSON (what `plan --calibrate` reads); the run the
// bench trains writes into a folder of its own, which it removes: nothing lands in runs/ where it
// was started (the test's working folder).
TEST(Cli, BenchTrainJsonLeavesNoRunBehind) {
  std::filesystem::remove_all("runs/run");
  const auto r = run_json({"bench", "train", "--seq", "16", "--batch", "1", "--steps", "1", "--threads", "1", "--json",
                           "--no-reference"},
                          "train");
  EXPECT_EQ(r["preset"], "gpt2-124m");
  EXPECT_FALSE(r.contains("torch")) << "--no-reference: zeroth alone";
  EXPECT_EQ(r["seq"], 16);
  EXPECT_EQ(r["batch"], 1);
  for (const char* key : {"step_s", "tokens_per_s"}) EXPECT_TRUE(r[key].is_number()) << key << ": " << r.dump();
  // GPT-2 124M's FLOPs per token as the planner counts them: 72 l h^2 + 12 l s h + 6 V h.
  EXPECT_DOUBLE_EQ(r["model_flops_per_token"].get<double>(), 72.0 * 12 * 768 * 768 + 12.0 * 12 * 16 * 768 + 6.0 * 50257 * 768);
  EXPECT_FALSE(std::filesystem::exists("runs/run")) << "the bench's run was written into runs/";
}

TEST(Cli, BenchOptimJson) {
  const auto r = run_json({"bench", "optim", "--params", "1e5", "--threads", "1", "--reps", "3", "--no-torch", "--json"}, "optim");
  EXPECT_GT(r["ceiling_gbps"].get<double>(), 0.0);
  ASSERT_EQ(r["results"].size(), 8u);  // AdamW and Lamb x f32/bf16 grads x with/without copy-out
  for (const auto& row : r["results"]) {
    for (const char* key : {"optimizer", "params", "threads", "grad_dtype", "copy_out", "bytes_per_param", "params_per_s", "gbps"}) {
      EXPECT_TRUE(row.contains(key)) << key;
    }
    EXPECT_GT(row["params_per_s"].get<double>(), 0.0);
    // Lamb's second pass reads the weights and both moments again: 12 bytes more than AdamW.
    const size_t adamw = 8 + (row["grad_dtype"] == "f32" ? 4 : 2) + 16 + (row["copy_out"].get<bool>() ? 2 : 0);
    EXPECT_EQ(row["bytes_per_param"].get<size_t>(), row["optimizer"] == "Lamb" ? adamw + 12 : adamw) << row.dump();
  }
  EXPECT_TRUE(r["torch"].is_array());
}

// A fresh, empty directory for one bench offload run; the bench must leave it empty.
std::string offload_dir(const std::string& name) {
  const std::string dir = fmt::format("{}zeroth_bench_offload_{}_{}", ::testing::TempDir(), name, ::getpid());
  std::filesystem::remove_all(dir);
  std::filesystem::create_directory(dir);
  return dir;
}

std::vector<std::string> files_in(const std::string& dir) {
  std::vector<std::string> names;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) names.push_back(entry.path().filename().string());
  return names;
}

bool fio_on_path() { return std::system("command -v fio >/dev/null 2>&1") == 0; }

TEST(Cli, BenchOffloadJsonCarriesBestFioSweepAndRemovesItsFile) {
  const std::string dir = offload_dir("json");
  const auto r = run_json({"bench", "offload", "--path", dir, "--size", "8MiB", "--reps", "1", "--json"}, "offload");
  const auto& best = r["best"];
  EXPECT_GT(best["read_gbps"].get<double>(), 0.0) << best.dump();
  EXPECT_GT(best["write_gbps"].get<double>(), 0.0) << best.dump();
  EXPECT_TRUE(std::set<size_t>({128 << 10, 256 << 10, 1 << 20, 4 << 20}).count(best["block_size"].get<size_t>())) << best.dump();
  EXPECT_TRUE(std::set<unsigned>({1, 4, 8, 16, 32, 64}).count(best["queue_depth"].get<unsigned>())) << best.dump();
  EXPECT_TRUE(std::set<unsigned>({1, 2, 4}).count(best["threads"].get<unsigned>())) << best.dump();
  // The DeepSpeed section carries the best setting under DeepSpeed's names.
  EXPECT_EQ(r["aio"]["block_size"], best["block_size"]);
  EXPECT_EQ(r["aio"]["queue_depth"], best["queue_depth"]);
  EXPECT_EQ(r["aio"]["intra_op_parallelism"], best["threads"]);
  EXPECT_EQ(r["aio"]["single_submit"], false);
  EXPECT_EQ(r["aio"]["overlap_events"], true);
  // The swapper's step moves, per parameter (padded: blocks end on the files' 4 KiB), its f32
  // master, moments and gradient in (16 bytes) and master, moments and bf16 parameter out (14).
  const auto& swapper = r["swapper"];
  const uint64_t params = swapper["params"], padded = swapper["padded_params"];
  EXPECT_GE(padded, params);
  EXPECT_LT(padded, params + params / 10) << swapper.dump();
  EXPECT_EQ(swapper["read_bytes"].get<uint64_t>(), 16 * padded) << swapper.dump();
  EXPECT_EQ(swapper["write_bytes"].get<uint64_t>(), 14 * padded) << swapper.dump();
  EXPECT_GT(params * 18, 6u << 20) << "about --size (8 MiB) of state";
  EXPECT_LT(params * 18, 10u << 20) << "about --size (8 MiB) of state";
  EXPECT_EQ(swapper["seconds"].size(), 1u);
  EXPECT_GT(r["swapper_gbps"].get<double>(), 0.0);
  EXPECT_EQ(r["swapper_gbps"].get<double>(), swapper["gbps_runs"][0].get<double>());
  EXPECT_GT(swapper["ratio_paired"].get<double>(), 0.0);
  EXPECT_TRUE(r["cuda"].is_null());
  if (fio_on_path()) {
    EXPECT_GT(r["fio"]["read_gbps"].get<double>(), 0.0) << r["fio"].dump();
    EXPECT_GT(r["fio"]["write_gbps"].get<double>(), 0.0) << r["fio"].dump();
    EXPECT_EQ(r["ratio"]["read"].get<double>(), r["max"]["read_gbps"].get<double>() / r["fio"]["read_gbps"].get<double>());
    // fio runs at every point zeroth reports; zeroth over fio per point, one repetition each: the
    // upper median.
    std::vector<double> ratios;
    for (const auto& point : r["sweep"]) {
      ASSERT_TRUE(point.contains("fio_write_gbps") && point.contains("fio_read_gbps")) << point.dump();
      ratios.push_back(point["write_gbps"].get<double>() / point["fio_write_gbps"].get<double>());
    }
    std::sort(ratios.begin(), ratios.end());
    EXPECT_EQ(r["ratio"]["paired_write"].get<double>(), ratios[ratios.size() / 2]);
  } else {
    EXPECT_TRUE(r["fio"].is_null());
  }
  // Depths at 1 MiB (6), then the other block sizes up to half the file (3), then threads 2 and
  // 4 where each thread still gets two blocks of the best single-thread point (fio's jobs take
  // slices of the file, and fio refuses a slice below its block), then SQPOLL and unregistered
  // buffers at the best of those (where io_uring is allowed).
  const size_t tail = r["io_uring"].get<bool>() ? 2 : 0, points = r["sweep"].size();
  ASSERT_GE(points, 9 + tail) << r["sweep"].dump();
  size_t threaded = 0;
  for (size_t i = 0; i < points; ++i) {
    const auto& p = r["sweep"][i];
    const uint64_t threads = p["threads"], block = p["block_size"];
    if (i < points - tail) threaded += threads > 1;
    EXPECT_LE(2 * block * threads, 8u << 20) << p.dump();
  }
  EXPECT_LE(threaded, 2u);
  ASSERT_EQ(points, 9 + threaded + tail) << r["sweep"].dump();
  double max_read = 0;
  for (const auto& p : r["sweep"]) {
    EXPECT_GT(p["write_gbps"].get<double>(), 0.0) << p.dump();
    EXPECT_EQ(p["read_runs"].size(), 1u) << p.dump();
    max_read = std::max(max_read, p["read_gbps"].get<double>());
  }
  EXPECT_EQ(r["max"]["read_gbps"].get<double>(), max_read);
  EXPECT_EQ(files_in(dir), std::vector<std::string>{});
  std::filesystem::remove_all(dir);
}

TEST(Cli, BenchOffloadInterruptedRemovesItsFile) {
  const std::string dir = offload_dir("interrupted");
  auto child = testing::spawn({ZEROTH_BIN, "bench", "offload", "--path", dir, "--size", "256MiB"}, {},
                              ::testing::TempDir() + "cli_offload_interrupted.log");
  // Long enough to be inside the sweep (the file is created within the first second).
  for (int i = 0; i < 100 && files_in(dir).empty(); ++i) std::this_thread::sleep_for(50ms);
  std::this_thread::sleep_for(500ms);
  ::kill(child.pid, SIGINT);
  EXPECT_EQ(testing::wait_exit(child, 60s), 128 + SIGINT) << child.output();
  EXPECT_EQ(files_in(dir), std::vector<std::string>{});
  std::filesystem::remove_all(dir);
}

// Each bad option is an error naming it, before any file is made (a size beyond the free space
// included).
TEST(Cli, BenchOffloadOptionsAreCheckedBeforeAnyFile) {
  struct Case {
    std::vector<std::string> args;
    std::string message;
  };
  const std::string dir = offload_dir("options");
  const std::vector<Case> cases = {
      {{"bench", "offload"}, "--path is required"},
      {{"bench", "offload", "--path", dir + "/missing"}, "zeroth: error: --path " + dir + "/missing: not a directory"},
      {{"bench", "offload", "--path", dir, "--size", "6.5MiB"}, "zeroth: error: --size 6.5MiB: must be a whole number of MiB"},
      {{"bench", "offload", "--path", dir, "--size", "2MiB"},
       "zeroth: error: --size 2MiB: must be a whole number of MiB, at least 4 MiB"},
      {{"bench", "offload", "--path", dir, "--size", "1000TiB"}, "zeroth: error: --size 1000.00 TiB does not fit in " + dir},
      {{"bench", "offload", "--path", dir, "--reps", "0"}, "zeroth: error: --reps 0: must be at least 1"},
      {{"bench", "offload", "--path", dir, "--device", "tpu"}, "zeroth: error: --device tpu: use cpu, cuda or cuda:N"},
  };
  for (const auto& c : cases) {
    std::vector<std::string> argv = {ZEROTH_BIN};
    argv.insert(argv.end(), c.args.begin(), c.args.end());
    auto child = testing::spawn(argv, {}, ::testing::TempDir() + "cli_offload_options.log");
    EXPECT_NE(testing::wait_exit(child, 60s), 0) << c.message;
    EXPECT_NE(child.output().find(c.message), std::string::npos) << child.output();
  }
  EXPECT_EQ(files_in(dir), std::vector<std::string>{});
  std::filesystem::remove_all(dir);
}

// Without a GPU (or a CUDA build) --device cuda says why before any disk work; with one, the
// copy rates come back.
TEST(Cli, BenchOffloadDeviceCudaCopiesOrSaysWhyNot) {
  const std::string dir = offload_dir("cuda");
  if (cuda_device_count() > 0) {
    const auto r = run_json({"bench", "offload", "--path", dir, "--size", "8MiB", "--reps", "1", "--device", "cuda", "--json"},
                            "offload_cuda");
    for (const char* key : {"h2d_pinned_gbps", "d2h_pinned_gbps", "h2d_pageable_gbps", "d2h_pageable_gbps"})
      EXPECT_GT(r["cuda"][key].get<double>(), 0.0) << r["cuda"].dump();
  } else {
    auto child = testing::spawn({ZEROTH_BIN, "bench", "offload", "--path", dir, "--size", "8MiB", "--device", "cuda"}, {},
                                ::testing::TempDir() + "cli_offload_cuda.log");
    EXPECT_EQ(testing::wait_exit(child, 60s), 1);
    const std::string why = cuda_info().compiled ? "zeroth: error: --device cuda: no usable GPU here"
                                                 : "zeroth: error: --device cuda: this zeroth was built without the CUDA backend";
    EXPECT_NE(child.output().find(why), std::string::npos) << child.output();
  }
  EXPECT_EQ(files_in(dir), std::vector<std::string>{});
  std::filesystem::remove_all(dir);
}

TEST(Cli, BadArgumentsGiveOneLineErrors) {
  auto child = testing::spawn({ZEROTH_BIN, "bench", "kernels", "--size", "12 parsecs"}, {}, ::testing::TempDir() + "cli_bad.log");
  EXPECT_EQ(testing::wait_exit(child, 60s), 1);
  EXPECT_NE(child.output().find("zeroth: error: '12 parsecs' has an unknown unit"), std::string::npos) << child.output();
}

// docs/cli.md is `zeroth help --markdown`'s output: the reference cannot say what the binary does
// not take. The help is read from the binary's own registered options, so a new or reworded
// option fails here until the file is regenerated.
TEST(Cli, TheReferenceInDocsIsTheBinarysHelp) {
  const std::string path = ::testing::TempDir() + "cli_help.md";
  auto child = testing::spawn({ZEROTH_BIN, "help", "--markdown"}, {"ZEROTH_LOG_LEVEL=error"}, path);
  ASSERT_EQ(testing::wait_exit(child, 60s), 0) << child.output();
  const std::string help = child.output(), file = testing::bytes_of(std::string(ZEROTH_SOURCE_DIR) + "/docs/cli.md");
  for (const char* command : {"## zeroth train\n", "## zeroth eval\n", "## zeroth estimate\n", "## zeroth plan\n",
                              "## zeroth bench offload\n", "## zeroth ckpt export\n", "| `--set TEXT ...` |"})
    EXPECT_NE(help.find(command), std::string::npos) << command;
  if (help == file) return;
  size_t line = 1, at = 0;
  for (; at < help.size() && at < file.size() && help[at] == file[at]; ++at) line += help[at] == '\n';
  ADD_FAILURE() << "docs/cli.md differs from `zeroth help --markdown` from its line " << line
                << ":\n  binary: " << help.substr(at, help.find('\n', at) - at)
                << "\n  file:   " << file.substr(at, file.find('\n', at) - at)
                << "\nregenerate it with build/tools/zeroth help --markdown > docs/cli.md";
}

// The zeroth binary names no cuBLAS library among what the loader must open at its start (a CUDA
// build opens it on the first product: core/cuda/cublas_lazy.cc); the dynamic section as readelf,
// binutils' reader, prints it.
TEST(Cli, TheBinaryLeavesCublasToItsFirstUse) {
  auto child = testing::spawn({"/usr/bin/readelf", "-d", ZEROTH_BIN}, {}, ::testing::TempDir() + "cli_readelf.txt");
  ASSERT_EQ(testing::wait_exit(child, 60s), 0) << child.output();
  const std::string dynamic = child.output();
  ASSERT_NE(dynamic.find("(NEEDED)"), std::string::npos) << dynamic;
  EXPECT_EQ(dynamic.find("libcublas"), std::string::npos) << dynamic;
}

}  // namespace
}  // namespace zeroth
