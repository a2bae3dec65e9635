// `zeroth launch`: the environment each rank sees, rank-prefixed output, exit codes, one failing
// rank stopping the others, signal forwarding, and a real Gloo job started through it.
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <fstream>
#include <set>
#include <string>
#include <thread>

#include "tests/process_util.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;

testing::Child launch(const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> argv = {ZEROTH_BIN, "launch"};
  argv.insert(argv.end(), args.begin(), args.end());
  return testing::spawn(argv, {}, ::testing::TempDir() + "launch_" + name + ".log");
}

TEST(Launch, EveryRankGetsTorchrunsEnvironmentAndPrefixedOutput) {
  auto job = launch({"-n", "3", "--", "sh", "-c",
                     "echo env $RANK $WORLD_SIZE $LOCAL_RANK $LOCAL_WORLD_SIZE $MASTER_ADDR ${MASTER_PORT:+port}; echo oops >&2"},
                    "env");
  ASSERT_EQ(testing::wait_exit(job, 30s), 0) << job.output();
  const auto out = job.output();
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(out.find("[rank " + std::to_string(r) + "] env " + std::to_string(r) + " 3 " + std::to_string(r) + " 3 127.0.0.1 port"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("[rank " + std::to_string(r) + "] oops"), std::string::npos) << out;
  }
}

// zeroth's OpenMP threads (oneDNN's products) sleep between products unless the environment says
// otherwise (core/cpu/openmp_wait.cc): libgomp reports the policy it read, and a spin count of 0 is
// PASSIVE's (its default spins 300000 times; ACTIVE's is unbounded). What zeroth starts that is not
// zeroth sees the caller's environment, not zeroth's default; a zeroth child defaults itself.
TEST(Launch, ZerothsOpenMpThreadsSleepUnlessTheEnvironmentSaysAndOnlyZerothSeesItsDefault) {
  ::unsetenv("OMP_WAIT_POLICY");
  ::unsetenv("ZEROTH_OMP_WAIT_DEFAULT");
  const std::string passive = "GOMP_SPINCOUNT = '0'";
  auto shown = [](const std::vector<std::string>& extra, const std::string& name) {
    auto child = testing::spawn({ZEROTH_BIN, "--version"}, extra, ::testing::TempDir() + "omp_" + name + ".log");
    EXPECT_EQ(testing::wait_exit(child, 30s), 0) << child.output();
    return child.output();
  };
  const std::string by_default = shown({"OMP_DISPLAY_ENV=verbose"}, "default");
  EXPECT_NE(by_default.find(passive), std::string::npos) << by_default;
  const std::string active = shown({"OMP_DISPLAY_ENV=verbose", "OMP_WAIT_POLICY=ACTIVE"}, "active");
  EXPECT_NE(active.find("OMP_WAIT_POLICY = 'ACTIVE'"), std::string::npos) << active;
  EXPECT_EQ(active.find(passive), std::string::npos) << active;

  const std::string echo = "echo policy=${OMP_WAIT_POLICY-unset} mark=${ZEROTH_OMP_WAIT_DEFAULT-unset}";
  auto job = launch({"-n", "1", "--", "sh", "-c", echo}, "omp_child");
  ASSERT_EQ(testing::wait_exit(job, 30s), 0) << job.output();
  EXPECT_NE(job.output().find("[rank 0] policy=unset mark=unset"), std::string::npos) << job.output();
  std::vector<std::string> argv = {ZEROTH_BIN, "launch", "-n", "1", "--", "sh", "-c", echo};
  auto kept = testing::spawn(argv, {"OMP_WAIT_POLICY=ACTIVE"}, ::testing::TempDir() + "launch_omp_kept.log");
  ASSERT_EQ(testing::wait_exit(kept, 30s), 0) << kept.output();
  EXPECT_NE(kept.output().find("[rank 0] policy=ACTIVE mark=unset"), std::string::npos) << kept.output();
  // PASSIVE set by the caller is the caller's: children keep it.
  auto own = testing::spawn(argv, {"OMP_WAIT_POLICY=PASSIVE"}, ::testing::TempDir() + "launch_omp_own.log");
  ASSERT_EQ(testing::wait_exit(own, 30s), 0) << own.output();
  EXPECT_NE(own.output().find("[rank 0] policy=PASSIVE mark=unset"), std::string::npos) << own.output();
  argv = {ZEROTH_BIN, "launch", "-n", "1", "--", ZEROTH_BIN, "--version"};
  auto zeroth_child = testing::spawn(argv, {"OMP_DISPLAY_ENV=verbose"}, ::testing::TempDir() + "launch_omp_zeroth.log");
  ASSERT_EQ(testing::wait_exit(zeroth_child, 30s), 0) << zeroth_child.output();
  EXPECT_NE(zeroth_child.output().find("[rank 0]   " + passive), std::string::npos) << zeroth_child.output();
}

TEST(Launch, MultiNodeRanksAreOffsetByTheNodeRankAndShareTheTokenFile) {
  const std::string token_file = ::testing::TempDir() + "launch_token";
  std::ofstream(token_file) << "shared-by-every-node\n";
  ::chmod(token_file.c_str(), 0600);
  auto job = launch({"-n", "2", "--nnodes", "3", "--node-rank", "2", "--master-addr", "10.1.2.3", "--master-port", "4321",
                     "--token-file", token_file, "--", "sh", "-c",
                     "echo at $RANK of $WORLD_SIZE via $MASTER_ADDR:$MASTER_PORT with $ZEROTH_JOB_TOKEN"},
                    "nodes");
  ASSERT_EQ(testing::wait_exit(job, 30s), 0) << job.output();
  const auto out = job.output();
  EXPECT_NE(out.find("[rank 4] at 4 of 6 via 10.1.2.3:4321 with shared-by-every-node"), std::string::npos) << out;
  EXPECT_NE(out.find("[rank 5] at 5 of 6 via 10.1.2.3:4321 with shared-by-every-node"), std::string::npos) << out;

  // Without a shared secret the nodes' stores would be open: refused before a rank starts.
  auto open_job = launch({"-n", "2", "--nnodes", "2", "--node-rank", "1", "--master-addr", "10.1.2.3", "--", "sh", "-c",
                          "echo started"},
                         "nodes_no_token");
  EXPECT_NE(testing::wait_exit(open_job, 30s), 0) << open_job.output();
  EXPECT_NE(open_job.output().find("--token-file"), std::string::npos) << open_job.output();
  EXPECT_EQ(open_job.output().find("started"), std::string::npos) << open_job.output();
}

TEST(Launch, EachSingleNodeJobGetsItsOwnToken) {
  std::set<std::string> tokens;
  for (int job_index = 0; job_index < 2; ++job_index) {
    auto job = launch({"-n", "2", "--", "sh", "-c", "echo token=$ZEROTH_JOB_TOKEN="}, "token" + std::to_string(job_index));
    ASSERT_EQ(testing::wait_exit(job, 30s), 0) << job.output();
    const auto out = job.output();
    std::set<std::string> in_job;
    for (std::size_t at = 0; (at = out.find("token=", at)) != std::string::npos; at += 6) {
      const auto end = out.find('=', at + 6);
      in_job.insert(out.substr(at + 6, end - at - 6));
    }
    ASSERT_EQ(in_job.size(), 1u) << "the ranks of one job hold different tokens:\n" << out;
    EXPECT_EQ(in_job.begin()->size(), 64u) << out;
    tokens.insert(*in_job.begin());
  }
  EXPECT_EQ(tokens.size(), 2u) << "two jobs got the same token";
}

TEST(Launch, AFailingRankStopsTheOthersAndItsCodeIsTheJobsCode) {
  const auto start = std::chrono::steady_clock::now();
  auto job = launch({"-n", "4", "--", "sh", "-c", "if [ $RANK = 2 ]; then sleep 0.3; exit 7; fi; sleep 60"}, "fail");
  EXPECT_EQ(testing::wait_exit(job, 30s), 7) << job.output();
  EXPECT_LT(std::chrono::steady_clock::now() - start, 15s) << "the other ranks were not stopped";
  EXPECT_NE(job.output().find("rank 2 exited with code 7"), std::string::npos) << job.output();
}

TEST(Launch, SignalsAreForwardedToEveryRank) {
  auto job = launch({"-n", "2", "--", "sh", "-c",
                     "trap 'echo got TERM; exit 143' TERM; echo started; while true; do sleep 0.05; done"},
                    "signal");
  const auto deadline = std::chrono::steady_clock::now() + 20s;
  while ((job.output().find("[rank 0] started") == std::string::npos || job.output().find("[rank 1] started") == std::string::npos) &&
         std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(20ms);
  }
  kill(job.pid, SIGTERM);
  EXPECT_EQ(testing::wait_exit(job, 30s), 143) << job.output();
  EXPECT_NE(job.output().find("[rank 0] got TERM"), std::string::npos) << job.output();
  EXPECT_NE(job.output().find("[rank 1] got TERM"), std::string::npos) << job.output();
}

TEST(Launch, AMissingProgramIsAClearError) {
  auto job = launch({"-n", "2", "--", "/nonexistent/program"}, "missing");
  EXPECT_NE(testing::wait_exit(job, 30s), 0);
  EXPECT_NE(job.output().find("cannot start '/nonexistent/program'"), std::string::npos) << job.output();
}

TEST(Launch, NodeCountsThatCannotBeAreClearErrors) {
  const std::vector<std::pair<std::vector<std::string>, std::string>> cases = {
      {{"--nnodes", "3:2"}, "--nnodes 3:2: MIN is more than MAX"},
      {{"--nnodes", "two"}, "--nnodes two: give a node count (2) or a range MIN:MAX"},
      {{"--nnodes", "0:2"}, "--nnodes 0:2: give a node count"},
      {{"--nnodes", "1:2"}, "--max-restarts is 0: give the restarts too"},
  };
  for (const auto& [args, message] : cases) {
    std::vector<std::string> argv = {"-n", "1"};
    argv.insert(argv.end(), args.begin(), args.end());
    argv.insert(argv.end(), {"--token-file", "/nonexistent", "--", "true"});
    auto job = launch(argv, "nnodes");
    EXPECT_NE(testing::wait_exit(job, 30s), 0) << job.output();
    EXPECT_NE(job.output().find(message), std::string::npos) << job.output();
  }
}

// Two nodes' launchers on this host, given different restart rules: both end saying which
// options differ (the comparison's message, not a timeout's), before any rank starts.
TEST(Launch, NodesLaunchedWithDifferentOptionsAreAClearError) {
  const std::string token_file = ::testing::TempDir() + "launch_token_options";
  std::ofstream(token_file) << "shared-by-both-nodes\n";
  ::chmod(token_file.c_str(), 0600);
  const std::string port = std::to_string(20000 + ::getpid() % 20000);
  const auto node = [&](int rank, const std::string& restarts) {
    return launch({"-n", "1", "--nnodes", "2", "--node-rank", std::to_string(rank), "--master-addr", "127.0.0.1", "--master-port",
                   port, "--token-file", token_file, "--max-restarts", restarts, "--", "sh", "-c", "echo started"},
                  "options" + std::to_string(rank));
  };
  auto node0 = node(0, "1");
  auto node1 = node(1, "2");
  EXPECT_NE(testing::wait_exit(node1, 30s), 0) << node1.output();
  EXPECT_NE(testing::wait_exit(node0, 30s), 0) << node0.output();
  const std::string why = "node 1's launcher was given -n 1 --nnodes 2 --max-restarts 2 --last-call 30, node 0's -n 1 --nnodes 2 "
                          "--max-restarts 1 --last-call 30";
  EXPECT_NE(node1.output().find(why), std::string::npos) << node1.output();
  EXPECT_NE(node0.output().find("cannot go on: node 1: " + why), std::string::npos) << node0.output();
  EXPECT_EQ(node0.output().find("started"), std::string::npos) << node0.output();
}

TEST(Launch, StartsARealGlooJob) {
  auto job = launch({"-n", "3", "--", GLOO_WORKER, "--gtest_filter=GlooWorker.Split"}, "gloo");
  EXPECT_EQ(testing::wait_exit(job, 120s), 0) << job.output();
  EXPECT_NE(job.output().find("[rank 2] [  PASSED  ] 1 test."), std::string::npos) << job.output();
}

}  // namespace
}  // namespace zeroth
