// The gloo backend in real processes: every collective against the serial reference on 2-4
// ranks, split, desync detection, and a peer killed mid-collective (an all-reduce, an all-to-all).
#include <gtest/gtest.h>

#include <chrono>
#include <csignal>
#include <string>
#include <thread>
#include <vector>

#include "tests/process_util.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using testing::Child;

std::string worker_path() { return std::string(ZEROTH_TEST_BIN_DIR) + "/comm_gloo_worker"; }

std::vector<Child> start_ranks(int n, const std::string& test, const std::vector<std::string>& env = {}) {
  const int port = testing::free_port();
  std::vector<Child> ranks;
  for (int r = 0; r < n; ++r) {
    std::vector<std::string> vars = {"RANK=" + std::to_string(r),       "WORLD_SIZE=" + std::to_string(n),
                                     "LOCAL_RANK=" + std::to_string(r), "LOCAL_WORLD_SIZE=" + std::to_string(n),
                                     "MASTER_ADDR=127.0.0.1",           "MASTER_PORT=" + std::to_string(port)};
    vars.insert(vars.end(), env.begin(), env.end());
    const std::string out = ::testing::TempDir() + "gloo_" + test + "_" + std::to_string(n) + "_" + std::to_string(r) + ".log";
    ranks.push_back(testing::spawn({worker_path(), "--gtest_filter=GlooWorker." + test}, vars, out));
    EXPECT_GT(ranks.back().pid, 0) << "could not start " << worker_path();
  }
  return ranks;
}

class GlooCollectives : public ::testing::TestWithParam<int> {};

TEST_P(GlooCollectives, EveryCollectiveMatchesTheSerialReference) {
  auto ranks = start_ranks(GetParam(), "Collectives");
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_EQ(testing::wait_exit(ranks[r], 600s), 0) << "rank " << r << " output:\n" << ranks[r].output();
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, GlooCollectives, ::testing::Values(1, 2, 3, 4),
                         [](const auto& info) { return std::to_string(info.param) + "ranks"; });

TEST(Gloo, SplitGroupsWork) {
  auto ranks = start_ranks(4, "Split");
  for (size_t r = 0; r < ranks.size(); ++r) EXPECT_EQ(testing::wait_exit(ranks[r], 120s), 0) << ranks[r].output();
}

TEST(Gloo, DestroyingACommunicatorWaitsForItsQueuedOps) {
  auto ranks = start_ranks(3, "DestroyWhileInFlight");
  for (size_t r = 0; r < ranks.size(); ++r) EXPECT_EQ(testing::wait_exit(ranks[r], 120s), 0) << ranks[r].output();
}

TEST(Gloo, DesyncIsReportedWithBothSidesWhenChecked) {
  auto ranks = start_ranks(2, "Desync", {"ZEROTH_COMM_CHECK=1", "ZEROTH_COMM_TIMEOUT=20"});
  for (size_t r = 0; r < ranks.size(); ++r) {
    EXPECT_NE(testing::wait_exit(ranks[r], 60s), 0);
    const auto out = ranks[r].output();
    EXPECT_NE(out.find("collective desync"), std::string::npos) << out;
    EXPECT_NE(out.find("all_reduce(count=1024, f32, sum)"), std::string::npos) << out;
    EXPECT_NE(out.find("broadcast(count=2048, bf16, root=0)"), std::string::npos) << out;
  }
}

class GlooPeerDeath : public ::testing::TestWithParam<std::string> {};

TEST_P(GlooPeerDeath, KillingAPeerEndsTheOthersWithACommErrorNamingIt) {
  constexpr int kTimeoutSeconds = 5;
  auto ranks = start_ranks(3, GetParam(), {"ZEROTH_COMM_TIMEOUT=" + std::to_string(kTimeoutSeconds)});
  // Wait until the ranks are inside the collective loop, then kill rank 1.
  const auto deadline = std::chrono::steady_clock::now() + 60s;
  while (ranks[0].output().find("ready") == std::string::npos && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_NE(ranks[0].output().find("ready"), std::string::npos) << ranks[0].output();
  const auto killed_at = std::chrono::steady_clock::now();
  kill(ranks[1].pid, SIGKILL);
  testing::wait_exit(ranks[1], 10s);
  for (int r : {0, 2}) {
    const int code = testing::wait_exit(ranks[r], std::chrono::seconds(kTimeoutSeconds + 10));
    const auto out = ranks[r].output();
    EXPECT_NE(code, -1) << "rank " << r << " hung after its peer died";
    EXPECT_NE(code, 0) << out;
    EXPECT_NE(out.find("rank 1"), std::string::npos) << "rank " << r << " did not name the dead peer:\n" << out;
    if (GetParam() == "RunAllToAllsUntilAPeerDies") {
      EXPECT_NE(out.find("all_to_all"), std::string::npos) << "rank " << r << "'s error is not the all-to-all's:\n" << out;
    }
  }
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, std::chrono::seconds(kTimeoutSeconds + 10));
}

INSTANTIATE_TEST_SUITE_P(Loops, GlooPeerDeath, ::testing::Values("RunUntilAPeerDies", "RunAllToAllsUntilAPeerDies"),
                         [](const auto& info) { return info.param == "RunUntilAPeerDies" ? "AllReduce" : "AllToAll"; });

}  // namespace
}  // namespace zeroth
