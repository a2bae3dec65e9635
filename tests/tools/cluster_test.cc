// Nodes as network namespaces (tools/cluster.sh) against one host: a job of 2 nodes x 2 Gloo
// ranks trains the losses of 4 ranks on one host, started by `zeroth launch` across nodes and by
// Slurm's and Open MPI's variables; a node killed mid-run, a node whose link goes down and a node
// that never arrives end the job within ZEROTH_COMM_TIMEOUT and a margin, naming who was lost;
// restarts across nodes end with the uninterrupted run's losses, on fewer nodes when one is lost;
// a node that comes too late, or is launched for another job, is told so. Skipped, saying why,
// where namespaces cannot be made (not root, no iproute2).
#include <gtest/gtest.h>

#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using testing::json;
using testing::losses;
using testing::temp;

constexpr int kCommTimeoutSeconds = 5;
const std::string kMaster = "198.18.0.1";  // node 0's address (tools/cluster.sh)
const std::string kPort = "29400";         // each cluster has its own namespaces, so any port is free

class Cluster : public ::testing::Test {
 protected:
  void SetUp() override {
    // Unique per test process: ctest runs the cases side by side.
    name_ = "zt" + std::to_string(::getpid());
    const auto up = script({"up", "2", name_}, "up");
    if (up.first == 3) GTEST_SKIP() << "no network namespaces here: " << up.second;
    ASSERT_EQ(up.first, 0) << up.second;
    token_file_ = temp(name_ + ".token");
    std::ofstream(token_file_) << "cluster-test-secret-" << name_ << "\n";
    ::chmod(token_file_.c_str(), 0600);
  }
  void TearDown() override {
    if (name_.empty()) return;
    script({"down", name_}, "down");
    // The runs' folders, configs, logs and token: every name this test made starts so.
    const std::string prefix = "train_" + name_;
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(::testing::TempDir(), ec))
      if (entry.path().filename().string().starts_with(prefix)) std::filesystem::remove_all(entry.path(), ec);
  }

  // tools/cluster.sh ARGS: its exit code and output.
  std::pair<int, std::string> script(const std::vector<std::string>& args, const std::string& what) {
    std::vector<std::string> argv = {"/bin/bash", std::string(ZEROTH_SOURCE_DIR) + "/tools/cluster.sh"};
    argv.insert(argv.end(), args.begin(), args.end());
    auto c = testing::spawn(argv, {"CLUSTER_NAME=" + name_}, temp(name_ + "_" + what + ".out"));
    const int code = testing::wait_exit(c, 60s);
    return {code, c.output()};
  }

  // ARGS run inside node `node`, with `env` added: a started child.
  testing::Child on_node(int node, const std::vector<std::string>& args, const std::vector<std::string>& env,
                         const std::string& what) {
    std::vector<std::string> argv = {"/bin/bash", std::string(ZEROTH_SOURCE_DIR) + "/tools/cluster.sh", "run", std::to_string(node)};
    argv.insert(argv.end(), args.begin(), args.end());
    std::vector<std::string> vars = {"CLUSTER_NAME=" + name_, "ZEROTH_COMM_TIMEOUT=" + std::to_string(kCommTimeoutSeconds)};
    vars.insert(vars.end(), env.begin(), env.end());
    return testing::spawn(argv, vars, temp(name_ + "_" + what + ".out"));
  }

  // `zeroth launch` on `node` with the job's shape and restart rules `options` (2 ranks on each
  // of 2 nodes), training `config`.
  testing::Child launch_node(int node, const std::string& config, const std::string& what,
                             const std::vector<std::string>& options = {"-n", "2", "--nnodes", "2"}) {
    std::vector<std::string> args = {ZEROTH_BIN, "launch",        "--node-rank", std::to_string(node), "--master-addr",
                                     kMaster,    "--master-port", kPort,         "--token-file",       token_file_};
    args.insert(args.end(), options.begin(), options.end());
    args.insert(args.end(), {"--", ZEROTH_BIN, "train", config});
    return on_node(node, args, {}, what);
  }

  // The processes running in `node`.
  std::vector<pid_t> node_pids(int node = 1) {
    const std::string netns = name_ + "-n" + std::to_string(node);
    auto list = testing::spawn({"/bin/sh", "-c", "ip netns pids " + netns}, {}, temp(name_ + "_pids.out"));
    EXPECT_EQ(testing::wait_exit(list, 30s), 0) << list.output();
    std::vector<pid_t> pids;
    std::istringstream in(list.output());
    for (pid_t p; in >> p;) pids.push_back(p);
    return pids;
  }

  // The ranks running in node 1: its processes but the launcher.
  std::vector<pid_t> node_1_ranks() {
    std::vector<pid_t> ranks;
    for (pid_t p : node_pids()) {
      std::string argv = testing::bytes_of("/proc/" + std::to_string(p) + "/cmdline");
      std::replace(argv.begin(), argv.end(), '\0', ' ');
      if (argv.find(" train ") != std::string::npos && argv.find(" launch ") == std::string::npos) ranks.push_back(p);
    }
    return ranks;
  }

  // Every process of `node` killed at once (`pids`, looked up beforehand so the kill lands at
  // once): the node is gone.
  void kill_node(int node, const std::vector<pid_t>& pids = {}) {
    for (pid_t p : pids.empty() ? node_pids(node) : pids) ::kill(p, SIGKILL);
  }

  std::string name_;
  std::string token_file_;
};

// The tiny GPT at 4 ranks (ZeRO-3), `steps` steps at a constant learning rate, into temp(name).
std::string config(const std::string& name, int steps, const std::string& backend) {
  return testing::tiny_config(name, steps, backend, {{"world_size", 4}});
}

std::vector<double> losses_in(const std::string& name) { return losses(testing::Run{0, "", testing::metrics_in(name)}); }

// Every loss of `b` within f32 reduction order of `a`'s.
void expect_same_losses(const std::vector<double>& a, const std::vector<double>& b) {
  ASSERT_EQ(a.size(), 6u);
  ASSERT_EQ(a.size(), b.size());
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 1e-5 * a[i]) << "step " << i + 1;
}

// The single-host reference: 4 ranks as threads.
std::vector<double> one_host_losses(const std::string& name) {
  const std::string cfg = config(name, 6, "local");
  const auto r = testing::run({ZEROTH_BIN, "train", cfg}, name);
  EXPECT_EQ(r.code, 0) << r.output;
  return losses(r);
}

// Waits until `child`'s output holds `text` (false after `timeout`).
bool wait_for_output(const testing::Child& child, const std::string& text, std::chrono::seconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (child.output().find(text) == std::string::npos) {
    if (std::chrono::steady_clock::now() > deadline) return false;
    std::this_thread::sleep_for(50ms);
  }
  return true;
}

TEST_F(Cluster, TwoNodesOfTwoRanksTrainTheLossesOfFourRanksOnOneHost) {
  const auto reference = one_host_losses(name_ + "_ref");
  const std::string cfg = config(name_ + "_launch", 6, "gloo");
  auto node0 = launch_node(0, cfg, "launch0");
  auto node1 = launch_node(1, cfg, "launch1");
  ASSERT_EQ(testing::wait_exit(node1, 120s), 0) << node1.output();
  ASSERT_EQ(testing::wait_exit(node0, 60s), 0) << node0.output();
  EXPECT_NE(node0.output().find("4 ranks (gloo processes"), std::string::npos) << node0.output();
  expect_same_losses(reference, losses_in(name_ + "_launch"));
}

// Schedulers' variables instead of torchrun's: each rank started on its own, as srun and mpirun do.
TEST_F(Cluster, SlurmAndOpenMpiVariablesStartTheSameJob) {
  const auto reference = one_host_losses(name_ + "_ref");
  std::string token;
  std::getline(std::ifstream(token_file_), token);
  for (const std::string scheduler : {"slurm", "openmpi"}) {
    const std::string run = name_ + "_" + scheduler;
    const std::string cfg = config(run, 6, "gloo");
    std::vector<testing::Child> ranks;
    for (int rank = 0; rank < 4; ++rank) {
      const std::string r = std::to_string(rank), local = std::to_string(rank % 2);
      std::vector<std::string> env = {"MASTER_ADDR=" + kMaster, "MASTER_PORT=" + kPort, "ZEROTH_JOB_TOKEN=" + token,
                                      "ZEROTH_NUM_THREADS=1"};
      if (scheduler == "slurm") {
        env.insert(env.end(), {"SLURM_PROCID=" + r, "SLURM_NTASKS=4", "SLURM_LOCALID=" + local, "SLURM_NNODES=2"});
      } else {
        env.insert(env.end(), {"OMPI_COMM_WORLD_RANK=" + r, "OMPI_COMM_WORLD_SIZE=4", "OMPI_COMM_WORLD_LOCAL_RANK=" + local,
                               "OMPI_COMM_WORLD_LOCAL_SIZE=2"});
      }
      ranks.push_back(on_node(rank / 2, {ZEROTH_BIN, "train", cfg}, env, scheduler + "_rank" + r));
    }
    for (auto& rank : ranks) EXPECT_EQ(testing::wait_exit(rank, 60s), 0) << scheduler << ":\n" << rank.output();
    SCOPED_TRACE(scheduler);
    expect_same_losses(reference, losses_in(run));
  }
}

// How a node is lost mid-run: every process on it killed (its kernel still resets the
// connections), or its link set down (nothing more arrives from it, as when it loses power).
enum class Loss { kKilled, kLinkDown };
void PrintTo(Loss loss, std::ostream* os) { *os << (loss == Loss::kKilled ? "killed" : "link down"); }

class ClusterLoss : public Cluster, public ::testing::WithParamInterface<Loss> {};

TEST_P(ClusterLoss, ANodeLostMidRunEndsTheJobNamingItsRanks) {
  const std::string cfg = config(name_ + "_lost", 2000, "gloo");
  auto node0 = launch_node(0, cfg, "lost0");
  auto node1 = launch_node(1, cfg, "lost1");
  // Step lines pad the step number: "step    4/2000".
  ASSERT_TRUE(wait_for_output(node0, " 4/2000", 120s)) << node0.output() << node1.output();
  const auto lost_at = std::chrono::steady_clock::now();
  if (GetParam() == Loss::kKilled) {
    kill_node(1);
  } else {
    ASSERT_EQ(script({"link", "1", "down"}, "link").first, 0);
  }
  // A collective waits ZEROTH_COMM_TIMEOUT for a peer, then the ranks spend up to as long again
  // agreeing in the store on who failed; the margin covers the launcher's stop and a slow host.
  const auto bound = std::chrono::seconds(3 * kCommTimeoutSeconds + 20);
  const int code0 = testing::wait_exit(node0, bound);
  const auto took = std::chrono::steady_clock::now() - lost_at;
  EXPECT_NE(code0, -1) << "node 0 hung after node 1 was lost:\n" << node0.output();
  EXPECT_NE(code0, 0) << node0.output();
  EXPECT_LT(took, bound);
  std::printf("node 0 ended %.1f s after node 1 was lost\n", std::chrono::duration<double>(took).count());
  // Node 0's ranks name a rank of node 1 as the one that died or stalled.
  const auto out0 = node0.output();
  EXPECT_TRUE(out0.find("rank 2 (seen failing") != std::string::npos || out0.find("rank 3 (seen failing") != std::string::npos)
      << out0;
  if (GetParam() == Loss::kLinkDown) {
    // Node 1's ranks, cut off, end as well and say that rank 0's host is out of reach.
    const int code1 = testing::wait_exit(node1, bound);
    EXPECT_NE(code1, -1) << "node 1 hung after its link went down:\n" << node1.output();
    EXPECT_NE(code1, 0) << node1.output();
    EXPECT_NE(node1.output().find("unreachable"), std::string::npos) << node1.output();
  } else {
    testing::wait_exit(node1, 30s);
  }
}

INSTANTIATE_TEST_SUITE_P(Ways, ClusterLoss, ::testing::Values(Loss::kKilled, Loss::kLinkDown),
                         [](const auto& info) { return info.param == Loss::kKilled ? "Killed" : "LinkDown"; });

TEST_F(Cluster, ANodeThatNeverArrivesEndsTheRendezvousNamingItsRanks) {
  const std::string cfg = config(name_ + "_alone", 6, "gloo");
  const auto started = std::chrono::steady_clock::now();
  auto node0 = launch_node(0, cfg, "alone0");
  const auto bound = std::chrono::seconds(2 * kCommTimeoutSeconds + 20);
  const int code = testing::wait_exit(node0, bound);
  const auto took = std::chrono::steady_clock::now() - started;
  EXPECT_NE(code, -1) << "node 0 waited past the rendezvous timeout:\n" << node0.output();
  EXPECT_NE(code, 0) << node0.output();
  std::printf("node 0 gave up %.1f s after it started\n", std::chrono::duration<double>(took).count());
  EXPECT_NE(node0.output().find("ranks 2, 3 never arrived"), std::string::npos) << node0.output();
}

// --nnodes 1:2 with restarts: node 1 lost mid-run, node 0's launcher starts the job again on its
// own once the last call has passed, from the latest checkpoint (the 4 ranks' state taken up by
// 2), and the run reaches its last step.
TEST_F(Cluster, AnElasticJobFinishesOnTheNodeLeft) {
  const std::string run = name_ + "_elastic";
  json j = json::parse(testing::bytes_of(testing::tiny_config(run, 40, "gloo", {{"checkpoint_interval", 2}})));
  j["run"].erase("world_size");  // the launcher's, at every start
  const std::string cfg = testing::write_config(run, j);
  const std::vector<std::string> elastic = {"-n", "2", "--nnodes", "1:2", "--max-restarts", "2", "--last-call", "2"};
  auto node0 = launch_node(0, cfg, "elastic0", elastic);
  auto node1 = launch_node(1, cfg, "elastic1", elastic);
  ASSERT_TRUE(wait_for_output(node0, " 4/40", 120s)) << node0.output() << node1.output();
  const auto lost_at = std::chrono::steady_clock::now();
  kill_node(1);
  const int code = testing::wait_exit(node0, 180s);
  const auto out = node0.output();
  ASSERT_EQ(code, 0) << out;
  std::printf("node 0 finished alone %.1f s after node 1 was lost\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - lost_at).count());
  EXPECT_NE(out.find("start 1 with node(s) 0, 1: 4 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("restart 1 of 2 after"), std::string::npos) << out;
  EXPECT_NE(out.find("start 2 with node(s) 0: 2 rank(s)"), std::string::npos) << out;
  EXPECT_NE(out.find("resumed from"), std::string::npos) << out;
  EXPECT_NE(out.find("2 ranks (gloo processes"), std::string::npos) << out;
  const auto by_step = testing::losses_by_step(testing::metrics_in(run));
  ASSERT_FALSE(by_step.empty());
  EXPECT_EQ(by_step.rbegin()->first, 40);
}

// Node 0 hosts the stores: an elastic job does not outlive it. The launcher of the node left
// ends within the timeout, saying why, rather than waiting for a node 0 that will not return.
TEST_F(Cluster, AJobEndsWhenNodeZeroIsLost) {
  const std::string run = name_ + "_node0";
  json j = json::parse(testing::bytes_of(testing::tiny_config(run, 2000, "gloo", {{"checkpoint_interval", 2}})));
  j["run"].erase("world_size");
  const std::string cfg = testing::write_config(run, j);
  const std::vector<std::string> elastic = {"-n", "2", "--nnodes", "1:2", "--max-restarts", "2", "--last-call", "2"};
  auto node0 = launch_node(0, cfg, "node0_0", elastic);
  auto node1 = launch_node(1, cfg, "node0_1", elastic);
  ASSERT_TRUE(wait_for_output(node0, " 4/2000", 120s)) << node0.output() << node1.output();
  const auto pids = node_pids(0);
  const auto lost_at = std::chrono::steady_clock::now();
  kill_node(0, pids);
  const auto bound = std::chrono::seconds(3 * kCommTimeoutSeconds + 20);
  const int code = testing::wait_exit(node1, bound);
  EXPECT_NE(code, -1) << "node 1 waited on after node 0 was lost:\n" << node1.output();
  EXPECT_NE(code, 0) << node1.output();
  std::printf("node 1 ended %.1f s after node 0 was lost\n",
              std::chrono::duration<double>(std::chrono::steady_clock::now() - lost_at).count());
  EXPECT_NE(node1.output().find("node 0's launcher is out of reach, and the job cannot go on without it"), std::string::npos)
      << node1.output();
  testing::wait_exit(node0, 30s);
}

// A node that comes after the first start closed (its MIN nodes there and the last call passed)
// takes no part and says so; the job goes on without it.
TEST_F(Cluster, ANodeThatComesAfterTheStartClosedTakesNoPart) {
  const std::string run = name_ + "_late";
  json j = json::parse(testing::bytes_of(testing::tiny_config(run, 6, "gloo")));
  j["run"].erase("world_size");
  const std::string cfg = testing::write_config(run, j);
  const std::vector<std::string> elastic = {"-n", "2", "--nnodes", "1:2", "--max-restarts", "1", "--last-call", "1"};
  auto node0 = launch_node(0, cfg, "late0", elastic);
  ASSERT_TRUE(wait_for_output(node0, "start 1 with node(s) 0: 2 rank(s)", 60s)) << node0.output();
  auto node1 = launch_node(1, cfg, "late1", elastic);
  EXPECT_EQ(testing::wait_exit(node1, 60s), 1) << node1.output();
  EXPECT_NE(node1.output().find("node 1 came after start 1 of the job closed; it takes no part"), std::string::npos) << node1.output();
  EXPECT_EQ(testing::wait_exit(node0, 120s), 0) << node0.output();
  EXPECT_EQ(node0.output().find("restart"), std::string::npos) << node0.output();
}

// Same world size across nodes: a rank of node 1 killed at a random step restarts the ranks of
// both nodes from the latest checkpoint, and the run ends with the losses of 4 ranks on one host
// uninterrupted, step by step.
TEST_F(Cluster, ARankKilledOnOneNodeRestartsEveryNodeAndTheLossesStayTheSame) {
  const json run_keys = {{"world_size", 4}, {"checkpoint_interval", 2}};
  const auto with_every_step = [&](const std::string& run, const std::string& backend) {
    json j = json::parse(testing::bytes_of(testing::tiny_config(run, 12, backend, run_keys)));
    j["steps_per_print"] = 1;
    return testing::write_config(run, j);
  };
  const std::string ref = name_ + "_whole";
  const auto whole = testing::run({ZEROTH_BIN, "train", with_every_step(ref, "local")}, ref);
  ASSERT_EQ(whole.code, 0) << whole.output;

  std::random_device seed;
  const int kill_step = 3 + static_cast<int>(seed() % 6);  // 3 .. 8
  std::printf("killing a rank of node 1 once step %d is done\n", kill_step);
  const std::string run = name_ + "_restart";
  const std::string cfg = with_every_step(run, "gloo");
  const std::vector<std::string> restarts = {"-n", "2", "--nnodes", "2", "--max-restarts", "2"};
  auto node0 = launch_node(0, cfg, "restart0", restarts);
  auto node1 = launch_node(1, cfg, "restart1", restarts);
  // Step lines pad the step number: "step    4/12". (Built by appending: gcc 12 misreads " " + s.)
  std::string step_line = " ";
  step_line += std::to_string(kill_step) + "/12";
  ASSERT_TRUE(wait_for_output(node0, step_line, 120s)) << node0.output() << node1.output();
  const auto ranks = node_1_ranks();
  ASSERT_EQ(ranks.size(), 2u);
  ::kill(ranks.back(), SIGKILL);
  ASSERT_EQ(testing::wait_exit(node0, 180s), 0) << node0.output() << node1.output();
  ASSERT_EQ(testing::wait_exit(node1, 60s), 0) << node1.output();
  const auto out0 = node0.output();
  const auto restart = out0.find("restart 1 of 2 after");
  ASSERT_NE(restart, std::string::npos) << out0;
  std::printf("node 0: %s\n", out0.substr(restart, out0.find('\n', restart) - restart).c_str());
  EXPECT_NE(out0.find("start 2 with node(s) 0, 1: 4 rank(s)"), std::string::npos) << out0;
  EXPECT_NE(out0.find("resumed from"), std::string::npos) << out0;
  const auto a = testing::losses_by_step(whole.metrics), b = testing::losses_by_step(testing::metrics_in(run));
  ASSERT_EQ(a.size(), 12u);
  ASSERT_EQ(b.size(), 12u);
  for (const auto& [step, loss] : a) EXPECT_NEAR(b.at(step), loss, 1e-5 * loss) << "step " << step;
}

// Nodes launched for different jobs (node 1 told of 3 nodes, node 0 of 2): the ranks say so when
// they check in, rather than waiting for ranks that will never come.
TEST_F(Cluster, NodesLaunchedForDifferentJobsEndSayingSo) {
  const std::string run = name_ + "_shapes";
  json j = json::parse(testing::bytes_of(testing::tiny_config(run, 6, "gloo")));
  j["run"].erase("world_size");
  const std::string cfg = testing::write_config(run, j);
  auto node0 = launch_node(0, cfg, "shapes0", {"-n", "2", "--nnodes", "2"});
  auto node1 = launch_node(1, cfg, "shapes1", {"-n", "2", "--nnodes", "3"});
  const auto bound = std::chrono::seconds(2 * kCommTimeoutSeconds + 20);
  const int code1 = testing::wait_exit(node1, bound), code0 = testing::wait_exit(node0, bound);
  EXPECT_NE(code0, -1) << node0.output();
  EXPECT_NE(code1, -1) << node1.output();
  EXPECT_NE(code0, 0) << node0.output();
  EXPECT_NE(code1, 0) << node1.output();
  const std::string both = node0.output() + node1.output();
  const auto said = both.find("was started for a job of");
  if (said != std::string::npos) {
    const auto from = both.rfind('\n', said) + 1;
    std::printf("%s\n", both.substr(from, both.find('\n', said) - from).c_str());
  }
  EXPECT_TRUE(both.find("was started for a job of 6 ranks, rank") != std::string::npos ||
              both.find("was started for a job of 4 ranks, rank") != std::string::npos)
      << both;
  EXPECT_NE(both.find("--nnodes"), std::string::npos) << both;
}

// A checkpoint every step, and node 1 killed as soon as a save after the fourth has begun (its
// .tmp folder is there): every published step folder verifies, `latest` names one of them, and
// the save the node's death cut short is never published.
TEST_F(Cluster, ACheckpointSavedWhileANodeDiesIsNeverPublished) {
  const std::string run = name_ + "_ckpt";
  const std::string cfg = testing::tiny_config(run, 400, "gloo", {{"world_size", 4}, {"checkpoint_interval", 1}, {"keep_last", 3}});
  auto node0 = launch_node(0, cfg, "ckpt0");
  auto node1 = launch_node(1, cfg, "ckpt1");
  ASSERT_TRUE(wait_for_output(node0, "checkpoints/step-4:", 120s)) << node0.output() << node1.output();
  const std::string dir = temp(run) + "/checkpoints";
  const auto pids = node_pids(1);
  ASSERT_EQ(pids.size(), 3u) << "node 1 runs its launcher and 2 ranks";
  std::string saving;
  for (const auto deadline = std::chrono::steady_clock::now() + 30s; saving.empty() && std::chrono::steady_clock::now() < deadline;) {
    std::error_code ec;
    for (const auto& entry : std::filesystem::directory_iterator(dir, ec))
      if (std::string name = entry.path().filename(); name.starts_with(".tmp-step-")) saving = name;
    if (saving.empty()) std::this_thread::sleep_for(1ms);
  }
  ASSERT_FALSE(saving.empty()) << "no save began after step 4";
  kill_node(1, pids);
  EXPECT_NE(testing::wait_exit(node0, 60s), 0) << node0.output();
  int published = 0, cut_short = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string name = entry.path().filename();
    cut_short += name.starts_with(".tmp-step-");
    if (!name.starts_with("step-")) continue;
    ++published;
    auto inspect = testing::spawn({ZEROTH_BIN, "ckpt", "inspect", entry.path()}, {}, temp(name_ + "_inspect.out"));
    EXPECT_EQ(testing::wait_exit(inspect, 60s), 0) << name << ":\n" << inspect.output();
  }
  EXPECT_EQ(published, 3);  // run.keep_last
  std::string latest;
  std::getline(std::ifstream(dir + "/latest"), latest);
  EXPECT_TRUE(std::filesystem::is_directory(dir + "/" + latest)) << "latest names '" << latest << "'";
  std::printf("node 1 killed during the save into %s; %d step folder(s) published, latest %s, %d save(s) cut short\n", saving.c_str(),
              published, latest.c_str(), cut_short);
  // The save cut short was not published (unless it had finished before the kill landed).
  const std::string saved_step = saving.substr(std::string(".tmp-").size());
  if (std::filesystem::exists(dir + "/" + saving)) {
    EXPECT_FALSE(std::filesystem::exists(dir + "/" + saved_step)) << saved_step;
  }
}

}  // namespace
}  // namespace zeroth
