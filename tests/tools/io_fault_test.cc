// A failing disk (ZEROTH_IO_FAULT, offload/io_fault.h) under `zeroth train`: a swap file's read
// that fails ends the run naming the file and the transfer; a short write of a swap file is taken
// up where it stopped, the run's losses unchanged bit for bit; a checkpoint whose write fails
// (a full disk) ends the run and is never published, the one before it staying `latest`.
#include <gtest/gtest.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using testing::json;
using testing::temp;

// The tiny GPT in bf16 with its optimizer state and parameters in swap files under temp(name)-swap.
std::string swapped(const std::string& name) {
  json j = testing::tiny(name);
  j["bf16"] = {{"enabled", true}};
  const std::string swap = temp(name) + "-swap";
  std::filesystem::remove_all(swap);
  j["zero_optimization"]["offload_optimizer"] = {{"device", "nvme"}, {"nvme_path", swap}};
  j["zero_optimization"]["offload_param"] = {{"device", "nvme"}, {"nvme_path", swap}};
  std::filesystem::remove_all(temp(name));
  return testing::write_config(name, j);
}

testing::Run train(const std::string& config, const std::string& name, const std::string& fault) {
  auto child = testing::spawn({ZEROTH_BIN, "train", config}, {"ZEROTH_IO_FAULT=" + fault}, temp(name) + ".out");
  const int code = testing::wait_exit(child, 120s);
  return {code, child.output(), testing::metrics_in(name)};
}

TEST(FailingDisk, AFailedReadOfASwapFileEndsTheRunNamingItAndTheTransfer) {
  const std::string swap = temp("eio") + "-swap";
  const auto r = train(swapped("eio"), "eio", "read:EIO:0:" + swap);
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("bytes at offset 0 of " + swap), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("failed: Input/output error"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("read of "), std::string::npos) << r.output;
}

TEST(FailingDisk, ShortWritesOfSwapFilesAreTakenUpWhereTheyStopped) {
  const auto whole = train(swapped("short_ref"), "short_ref", "");
  ASSERT_EQ(whole.code, 0) << whole.output;
  // Every swap file's first write from its start moves only half its bytes.
  const auto cut = train(swapped("short"), "short", "write:short:0:" + temp("short") + "-swap");
  ASSERT_EQ(cut.code, 0) << cut.output;
  EXPECT_NE(cut.output.find("goes to the kernel as"), std::string::npos) << "no write was cut short:\n" << cut.output;
  const auto a = testing::losses(whole), b = testing::losses(cut);
  ASSERT_EQ(a.size(), 6u);
  EXPECT_EQ(a, b);
}

TEST(FailingDisk, ACheckpointWhoseWriteFailsIsNeverPublished) {
  const std::string cfg = testing::tiny_config("enospc", 6, "local", {{"checkpoint_interval", 2}});
  const auto r = train(cfg, "enospc", "write:ENOSPC:0:.tmp-step-4/rank-00001.bin");
  EXPECT_EQ(r.code, 1) << r.output;
  EXPECT_NE(r.output.find("write of "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find(".tmp-step-4/rank-00001.bin failed: No space left on device"), std::string::npos) << r.output;
  const std::string dir = temp("enospc") + "/checkpoints";
  std::string latest;
  std::getline(std::ifstream(dir + "/latest"), latest);
  EXPECT_EQ(latest, "step-2");
  EXPECT_FALSE(std::filesystem::exists(dir + "/step-4"));
  auto inspect = testing::spawn({ZEROTH_BIN, "ckpt", "inspect", dir}, {}, temp("enospc") + "_inspect.out");
  EXPECT_EQ(testing::wait_exit(inspect, 60s), 0) << inspect.output();
}

TEST(FailingDisk, AFaultThatCannotBeReadIsAClearError) {
  const std::string cfg = testing::tiny_config("badfault", 2, "local", {{"checkpoint_interval", 1}});
  const auto r = train(cfg, "badfault", "write:EBADF:0");
  EXPECT_NE(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("ZEROTH_IO_FAULT=write:EBADF:0: ERROR must be EIO, ENOSPC or short"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zeroth
