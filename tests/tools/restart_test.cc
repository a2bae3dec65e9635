// `zeroth launch --max-restarts` against the same run uninterrupted: a rank killed at a random step
// (its number printed) is restarted with the rest from the latest checkpoint, and the run ends
// with the uninterrupted run's losses at every step: bit for bit with ranks as threads of one
// process, within f32 reduction order with ranks as Gloo processes.
#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using testing::json;
using testing::temp;

// The tiny GPT at 2 ranks, 8 steps at a constant learning rate, a checkpoint every 2 steps, a
// line every step.
std::string config(const std::string& name, const std::string& backend) {
  const std::string path = testing::tiny_config(name, 8, backend, {{"checkpoint_interval", 2}});
  json j = json::parse(testing::bytes_of(path));
  j["steps_per_print"] = 1;
  return testing::write_config(name, j);
}

// The processes `pid` started.
std::vector<pid_t> children_of(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) + "/children");
  std::vector<pid_t> out;
  for (pid_t c; in >> c;) out.push_back(c);
  return out;
}

struct Case {
  const char* name;
  const char* backend;
  int processes;  // ranks as processes under zeroth launch; the rest of 2 as threads in each
  double bound;   // relative difference allowed per loss
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class Restart : public ::testing::TestWithParam<Case> {};

TEST_P(Restart, ARankKilledAtARandomStepIsRestartedAndTheRunEndsWithTheSameLosses) {
  const Case c = GetParam();
  const std::string base = std::string("restart_") + c.name;
  const auto launch = [&](const std::string& name, const std::vector<std::string>& extra) {
    std::vector<std::string> args = {ZEROTH_BIN, "launch", "-n", std::to_string(c.processes)};
    args.insert(args.end(), extra.begin(), extra.end());
    args.insert(args.end(), {"--", ZEROTH_BIN, "train", config(name, c.backend)});
    return args;
  };
  const auto whole = testing::run(launch(base + "_whole", {}), base + "_whole");
  ASSERT_EQ(whole.code, 0) << whole.output;

  std::random_device seed;
  const int kill_step = 3 + static_cast<int>(seed() % 5);  // 3 .. 7
  std::printf("killing a rank once step %d is done\n", kill_step);
  const std::string name = base + "_killed";
  auto job = testing::spawn(launch(name, {"--max-restarts", "2"}), {}, temp(name) + ".out");
  const auto deadline = std::chrono::steady_clock::now() + 120s;
  const std::string line = "step " + std::to_string(kill_step) + "/8";
  while (job.output().find(line) == std::string::npos && std::chrono::steady_clock::now() < deadline)
    std::this_thread::sleep_for(10ms);
  ASSERT_NE(job.output().find(line), std::string::npos) << job.output();
  const auto ranks = children_of(job.pid);
  ASSERT_EQ(ranks.size(), static_cast<size_t>(c.processes));
  ::kill(ranks.back(), SIGKILL);
  const int code = testing::wait_exit(job, 120s);
  const std::string out = job.output();
  ASSERT_EQ(code, 0) << out;
  const int killed = c.processes - 1;
  EXPECT_NE(out.find("restart 1 of 2 after rank " + std::to_string(killed) + " was killed by signal 9"), std::string::npos) << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;

  const auto killed_metrics = testing::metrics_in(name);
  // Only the steps after the latest checkpoint are trained twice, not the whole run.
  size_t records = 0;
  for (const auto& m : killed_metrics) records += m.contains("loss") && m.contains("lr");
  EXPECT_LT(records, static_cast<size_t>(8 + kill_step)) << "the restart trained again from step 0";
  const auto a = testing::losses_by_step(whole.metrics), b = testing::losses_by_step(killed_metrics);
  ASSERT_EQ(a.size(), 8u);
  ASSERT_EQ(b.size(), 8u);
  for (const auto& [step, loss] : a) {
    if (c.bound == 0) EXPECT_EQ(b.at(step), loss) << "step " << step;
    else EXPECT_NEAR(b.at(step), loss, c.bound * loss) << "step " << step;
  }
  testing::expect_same_weights(testing::weights_of(name), testing::weights_of(base + "_whole"), c.bound);
}

INSTANTIATE_TEST_SUITE_P(Ranks, Restart, ::testing::Values(Case{"Threads", "local", 1, 0.0}, Case{"GlooProcesses", "gloo", 2, 1e-5}),
                         [](const auto& info) { return std::string(info.param.name); });

// A restart resumes only from what this job saved: an earlier run's checkpoint in the same folder
// is left alone, and the run starts again from step 0.
TEST(Restart, ARestartNeverResumesAnEarlierRunsCheckpoint) {
  const std::string cfg = config("restart_earlier", "local");
  const auto earlier = testing::run({ZEROTH_BIN, "train", cfg}, "restart_earlier");
  ASSERT_EQ(earlier.code, 0) << earlier.output;
  std::this_thread::sleep_for(1100ms);  // the job starts a second after that checkpoint
  // The first attempt fails before it saves anything; the second trains.
  const auto r = testing::run({ZEROTH_BIN, "launch", "-n", "1", "--max-restarts", "1", "--", "sh", "-c",
                               std::string("[ $ZEROTH_RESTART_COUNT = 0 ] && exit 3; exec ") + ZEROTH_BIN + " train " + cfg},
                              "restart_earlier");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1 after rank 0 exited with code 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("this job saved no checkpoint"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("resumed from"), std::string::npos) << r.output;
}

// A job lost between its last checkpoint and its end (the weights not yet written) is restarted:
// the restart resumes at run.steps and only finishes, writing the weights the run would have.
TEST(Restart, ARestartAfterTheLastCheckpointFinishesTheRun) {
  const std::string cfg = config("restart_at_end", "local");
  const std::string weights = temp("restart_at_end") + "/model.safetensors";
  std::filesystem::remove_all(temp("restart_at_end"));
  // The first attempt trains to the end, then loses its weights and fails; the second resumes.
  const auto r = testing::run({ZEROTH_BIN, "launch", "-n", "1", "--max-restarts", "1", "--", "sh", "-c",
                               std::string(ZEROTH_BIN) + " train " + cfg + " && [ $ZEROTH_RESTART_COUNT = 0 ] && rm " + weights +
                                   " && exit 3; exec " + ZEROTH_BIN + " train " + cfg},
                              "restart_at_end");
  ASSERT_EQ(r.code, 0) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1 after rank 0 exited with code 3"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("resumed from"), std::string::npos) << r.output;
  EXPECT_TRUE(std::filesystem::exists(weights)) << r.output;
}

// Rank 1 fails a second after its start, so rank 0 has said which attempt it is in before the
// launcher stops it.
TEST(Restart, WithoutRestartsLeftTheJobEndsWithTheFailingRanksCode) {
  const auto r = testing::run({ZEROTH_BIN, "launch", "-n", "2", "--max-restarts", "1", "--", "sh", "-c",
                               "echo attempt $ZEROTH_RESTART_COUNT; [ $RANK = 1 ] && { sleep 1; exit 7; }; sleep 60"},
                              "restart_exhausted", 60s);
  EXPECT_EQ(r.code, 7) << r.output;
  EXPECT_NE(r.output.find("restart 1 of 1 after rank 1 exited with code 7"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0] attempt 0"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("[rank 0] attempt 1"), std::string::npos) << r.output;
  EXPECT_EQ(r.output.find("restart 2"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zeroth
