// The CLI's machine-readable outputs: `zeroth report --json` and every bench's `--json` parse and
// carry the fields the issues specify, with positive figures.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "core/cpu/blas_info.h"
#include "tests/process_util.h"

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

TEST(Cli, ReportTextNamesTheBlasCoreAndItsSgemmRate) {
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

TEST(Cli, BenchCommJsonLocalAndGloo) {
  for (const char* backend : {"local", "gloo"}) {
    const auto r = run_json({"bench", "comm", "--backend", backend, "--ranks", "2", "--max-bytes", "64KiB", "--json"},
                            std::string("comm_") + backend);
    EXPECT_EQ(r["backend"], backend);
    EXPECT_EQ(r["ranks"], 2);
    EXPECT_GT(r["ceiling_gbps"].get<double>(), 0.0);
    ASSERT_EQ(r["results"].size(), 5u * 7);  // five op variants x 1 KiB .. 64 KiB
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

TEST(Cli, BadArgumentsGiveOneLineErrors) {
  auto child = testing::spawn({ZEROTH_BIN, "bench", "kernels", "--size", "12 parsecs"}, {}, ::testing::TempDir() + "cli_bad.log");
  EXPECT_EQ(testing::wait_exit(child, 60s), 1);
  EXPECT_NE(child.output().find("zeroth: error: '12 parsecs' has an unknown unit"), std::string::npos) << child.output();
}

}  // namespace
}  // namespace zeroth
