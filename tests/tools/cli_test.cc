// The CLI's machine-readable outputs: `zeroth report --json` and every bench's `--json` parse and
// carry the fields the issues specify, with positive figures.
#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

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
  for (const char* key : {"zeroth", "cpu", "cpu kernels", "threads", "memory", "cuda", "nccl", "io_uring", "gloo", "gpus", "environment"}) {
    EXPECT_TRUE(r.contains(key)) << key << " missing in " << r.dump();
  }
  EXPECT_TRUE(r["environment"].contains("ZEROTH_COMM_TIMEOUT"));
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
