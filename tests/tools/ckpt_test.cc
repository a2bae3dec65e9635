// Checkpoints end to end through the binary: `zeroth train --resume` continues a run's losses bit
// for bit (threads; gloo processes to their reduction order); a process killed with SIGKILL at random moments, saves
// included, always leaves a `latest` that verifies and resumes to the uninterrupted losses;
// `zeroth ckpt inspect` fails naming a damaged file; export gives the run's own weights (and
// PyTorch reads them); import and reshard round-trip.
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

#include <nlohmann/json.hpp>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using testing::bytes_of;
using testing::losses;
using testing::run;
using testing::temp;
using testing::tiny;
using testing::write_config;
namespace fs = std::filesystem;

// tiny(name) with nothing left in its folder from an earlier run of the test.
json fresh(const std::string& name) {
  fs::remove_all(temp(name));
  return tiny(name);
}

// The losses from step `from` on of a run's metrics (1-based step numbers).
std::vector<double> losses_of_steps(const testing::Run& r, int from) {
  std::vector<double> out;
  for (const auto& m : r.metrics)
    if (m.contains("loss") && m.contains("lr") && m["step"].get<int>() >= from) out.push_back(m["loss"]);
  return out;
}

// A run of 6 steps saving every 2; resumed from step-2 (threads), the remaining steps' losses are
// the uninterrupted run's exactly; resumed from step-4 by gloo processes, to the reduction order
// of processes (the gloo equivalence test's 1e-5), and their checkpoint verifies.
TEST(Ckpt, ResumeContinuesTheLossesBitForBit) {
  json j = fresh("ckpt_whole");
  j["run"]["checkpoint_interval"] = 2;
  const auto whole = run({ZEROTH_BIN, "train", write_config("ckpt_whole", j)}, "ckpt_whole");
  ASSERT_EQ(whole.code, 0) << whole.output;
  const auto ref = losses(whole);
  ASSERT_EQ(ref.size(), 6u);
  const std::string ckpt = temp("ckpt_whole") + "/checkpoints";
  for (const char* step : {"step-2", "step-4", "step-6"}) EXPECT_TRUE(fs::exists(ckpt + "/" + step + "/manifest.json")) << step;
  EXPECT_EQ(bytes_of(ckpt + "/latest"), "step-6\n");

  json k = fresh("ckpt_resumed");
  const auto resumed = run({ZEROTH_BIN, "train", write_config("ckpt_resumed", k), "--resume", ckpt + "/step-2"}, "ckpt_resumed");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + ckpt + "/step-2 at step 2"), std::string::npos) << resumed.output;
  const auto got = losses(resumed);
  ASSERT_EQ(got.size(), 4u) << resumed.output;
  for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], ref[i + 2]) << "step " << i + 3;

  json g = fresh("ckpt_gloo");
  g["run"]["backend"] = "gloo";
  const auto gloo = run({ZEROTH_BIN, "launch", "-n", "2", "--", ZEROTH_BIN, "train", write_config("ckpt_gloo", g), "--resume",
                         ckpt + "/step-4"},
                        "ckpt_gloo");
  ASSERT_EQ(gloo.code, 0) << gloo.output;
  const auto two = losses(gloo);
  ASSERT_EQ(two.size(), 2u) << gloo.output;
  // Processes reduce in another order than threads (the gloo equivalence test's bound).
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(two[i], ref[i + 4], 1e-5 * ref[i + 4]) << "step " << i + 5;
  // The processes wrote a checkpoint the threads can read.
  EXPECT_EQ(run({ZEROTH_BIN, "ckpt", "inspect", temp("ckpt_gloo") + "/checkpoints"}, "ckpt_gloo_inspect").code, 0);
}

// run.checkpoint_async: the state is copied at the save and written while the next step runs; the
// files are byte for byte those of the synchronous saves (so the copy was taken before the next
// step changed anything), and the losses are unchanged.
TEST(Ckpt, AsyncSavesWriteTheSameCheckpoints) {
  json j = fresh("ckpt_sync");
  j["run"]["checkpoint_interval"] = 2;
  const auto sync = run({ZEROTH_BIN, "train", write_config("ckpt_sync", j)}, "ckpt_sync");
  ASSERT_EQ(sync.code, 0) << sync.output;
  json a = fresh("ckpt_async");
  a["run"]["checkpoint_interval"] = 2;
  a["run"]["checkpoint_async"] = true;
  const auto async = run({ZEROTH_BIN, "train", write_config("ckpt_async", a)}, "ckpt_async");
  ASSERT_EQ(async.code, 0) << async.output;
  EXPECT_EQ(losses(async), losses(sync));
  EXPECT_NE(async.output.find("written in the background"), std::string::npos) << async.output;
  for (const char* step : {"step-2", "step-4", "step-6"}) {
    for (const char* file : {"rank-00000.bin", "rank-00001.bin"}) {
      const std::string s = temp("ckpt_sync") + "/checkpoints/" + step + "/" + file,
                        x = temp("ckpt_async") + "/checkpoints/" + step + "/" + file;
      ASSERT_TRUE(fs::exists(x)) << x;
      EXPECT_EQ(bytes_of(x), bytes_of(s)) << step << "/" << file;
    }
  }
  EXPECT_EQ(bytes_of(temp("ckpt_async") + "/checkpoints/latest"), "step-6\n");
}

// SIGKILL at random moments of a run that saves every step: whatever the moment, `latest` (or, if
// the kill came before the first save, nothing) is a checkpoint that verifies, and resuming from
// it finishes with the uninterrupted run's losses, bit for bit.
TEST(Ckpt, KilledAtRandomMomentsLatestAlwaysLoadsAndResumesExactly) {
  json j = fresh("kill_ref");
  j["run"]["steps"] = 12;
  j["run"]["eval_interval"] = 0;
  j["run"]["checkpoint_interval"] = 1;
  j["run"]["keep_last"] = 2;
  const auto reference = run({ZEROTH_BIN, "train", write_config("kill_ref", j)}, "kill_ref");
  ASSERT_EQ(reference.code, 0) << reference.output;
  const auto ref = losses(reference);
  ASSERT_EQ(ref.size(), 12u);
  const double seconds = reference.metrics.back()["summary"]["seconds"].get<double>();
  std::mt19937 gen(20261201);
  std::uniform_real_distribution<double> when(0.1, 1.0);
  int mid_save = 0, loaded = 0, resumed_trials = 0;
  for (int trial = 0; trial < 6; ++trial) {
    const std::string name = "kill_" + std::to_string(trial);
    json k = j;
    k["run"]["output_dir"] = temp(name);
    fs::remove_all(temp(name));
    const std::string config = write_config(name, k);
    const std::string ckpt = temp(name) + "/checkpoints";
    auto child = testing::spawn({ZEROTH_BIN, "train", config}, {}, temp(name) + ".out");
    if (trial % 2 == 0) {
      // Start-up (reading data, planning) comes before the steps; somewhere in the steps.
      std::this_thread::sleep_for(std::chrono::duration<double>(0.3 + when(gen) * (seconds + 0.5)));
    } else {
      // Inside a save: as soon as the temporary folder of the save after step 2 + trial exists,
      // or, should the poll miss that moment, as soon as its step folder does (still mid-run).
      const std::string target = ".tmp-step-" + std::to_string(2 + trial), saved = "step-" + std::to_string(2 + trial);
      const auto deadline = std::chrono::steady_clock::now() + 60s;
      for (bool seen = false; !seen && std::chrono::steady_clock::now() < deadline;) {
        std::error_code ec;
        seen = fs::exists(ckpt + "/" + target, ec) || fs::exists(ckpt + "/" + saved, ec);
        if (!seen) std::this_thread::sleep_for(100us);
      }
    }
    ::kill(child.pid, SIGKILL);
    testing::wait_exit(child, 30s);
    bool leftovers = false;
    if (fs::exists(ckpt))
      for (const auto& e : fs::directory_iterator(ckpt)) leftovers |= e.path().filename().string().starts_with(".tmp-");
    mid_save += leftovers;
    const bool any = fs::exists(ckpt + "/latest");
    if (!any) continue;  // killed before the first save completed
    ++loaded;
    const auto inspect = run({ZEROTH_BIN, "ckpt", "inspect", ckpt}, name + "_inspect");
    ASSERT_EQ(inspect.code, 0) << "trial " << trial << ": " << inspect.output;
    if (bytes_of(ckpt + "/latest") == "step-12\n") continue;  // killed after the last save: nothing left to resume
    const auto resumed = run({ZEROTH_BIN, "train", config, "--resume"}, name);
    ASSERT_EQ(resumed.code, 0) << "trial " << trial << ": " << resumed.output;
    const size_t at = resumed.output.find(" at step ", resumed.output.find("resumed from "));
    ASSERT_NE(at, std::string::npos) << resumed.output;
    const int from = std::stoi(resumed.output.substr(at + 9)) + 1;
    // The metrics file continues the killed run's (which may have logged steps past its last
    // checkpoint): the resumed run's records are the last ones.
    auto got = losses_of_steps(resumed, from);
    ASSERT_GE(got.size(), static_cast<size_t>(12 - from + 1)) << "trial " << trial << " resumed at step " << from - 1;
    got.erase(got.begin(), got.end() - (12 - from + 1));
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], ref[from - 1 + i]) << "trial " << trial << ", step " << from + i;
    ++resumed_trials;
  }
  std::printf("%d of 6 kills left a checkpoint, %d resumed from it and compared their losses; %d landed in the middle of a save\n",
              loaded, resumed_trials, mid_save);
  // The odd trials' kills (at the save after step 3, 5 or 7) always leave steps to resume.
  EXPECT_GE(resumed_trials, 3) << "fewer than 3 trials resumed and compared their losses";
  EXPECT_GE(mid_save, 1) << "no kill landed inside a save, so the test proved less than it says";
}

// A flipped byte, a truncated file, a deleted file: `zeroth ckpt inspect` exits non-zero and names
// the file; the whole checkpoint passes.
TEST(Ckpt, InspectFailsNamingADamagedFile) {
  json j = fresh("ckpt_damage");
  j["run"]["steps"] = 2;
  ASSERT_EQ(run({ZEROTH_BIN, "train", write_config("ckpt_damage", j)}, "ckpt_damage").code, 0);
  const std::string step = temp("ckpt_damage") + "/checkpoints/step-2", file = step + "/rank-00001.bin";
  const auto ok = run({ZEROTH_BIN, "ckpt", "inspect", step}, "ckpt_damage_ok");
  ASSERT_EQ(ok.code, 0) << ok.output;
  for (const char* text : {"step       2", "dp 2 x tp 1 x pp 1, ZeRO stage 3", "AdamW: fp32, exp_avg, exp_avg_sq", "embed.wte",
                           "every file has the manifest's size and checksum"})
    EXPECT_NE(ok.output.find(text), std::string::npos) << text << " missing in\n" << ok.output;
  const std::string pristine = bytes_of(file);
  auto expect_bad = [&](const char* what, const char* text) {
    const auto r = run({ZEROTH_BIN, "ckpt", "inspect", step}, "ckpt_damage_bad");
    EXPECT_NE(r.code, 0) << what << ": " << r.output;
    EXPECT_NE(r.output.find(file + " " + text), std::string::npos) << what << ": " << r.output;
    std::ofstream(file, std::ios::binary) << pristine;
  };
  {
    std::string flipped = pristine;
    flipped[flipped.size() / 3] ^= 1;
    std::ofstream(file, std::ios::binary) << flipped;
  }
  expect_bad("a flipped byte", "is corrupted");
  fs::resize_file(file, pristine.size() / 2);
  expect_bad("a truncated file", "is truncated");
  fs::remove(file);
  expect_bad("a deleted file", "is missing");
}

// Export writes the run's own weights (the f32 file byte for byte equal to the model.safetensors
// the run gathered from the engine); PyTorch reads the bf16 export and computes the loss it
// computes from the f32 one, to bf16 rounding. Import turns that file back into a checkpoint whose
// export is the same bytes again; reshard to dp 1 gives one file with the same weights.
TEST(Ckpt, ExportImportReshardRoundTrip) {
  json j = fresh("ckpt_export");
  j["run"]["steps"] = 3;
  ASSERT_EQ(run({ZEROTH_BIN, "train", write_config("ckpt_export", j)}, "ckpt_export").code, 0);
  const std::string dir = temp("ckpt_export"), ckpt = dir + "/checkpoints";
  const auto f32 = run({ZEROTH_BIN, "ckpt", "export", ckpt, "--out", dir + "/f32.safetensors"}, "ckpt_export_f32");
  ASSERT_EQ(f32.code, 0) << f32.output;
  EXPECT_EQ(bytes_of(dir + "/f32.safetensors"), bytes_of(dir + "/model.safetensors"));
  ASSERT_EQ(run({ZEROTH_BIN, "ckpt", "export", ckpt, "--out", dir + "/bf16.safetensors", "--dtype", "bf16"}, "ckpt_export_bf16").code,
            0);

  json batch = {{"n_head", 2}, {"tokens", json::array()}, {"targets", json::array()}};
  for (int b = 0; b < 2; ++b) {
    std::vector<int> t(16), u(16);
    for (int i = 0; i < 16; ++i) t[i] = (b * 7 + i * 5) % 64, u[i] = (b * 3 + i * 11 + 1) % 64;
    batch["tokens"].push_back(t);
    batch["targets"].push_back(u);
  }
  std::ofstream(dir + "/batch.json") << batch.dump();
  auto torch_loss = [&](const std::string& file) {
    const std::string cmd = "/usr/bin/python3 " + std::string(ZEROTH_SOURCE_DIR) + "/tests/reference/hf_gpt2_loss.py " + file + " " +
                            dir + "/batch.json 2>&1";
    std::string out;
    FILE* pipe = ::popen(cmd.c_str(), "r");
    char buf[4096];
    while (pipe != nullptr && std::fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
    EXPECT_EQ(pipe != nullptr ? ::pclose(pipe) : -1, 0) << out;
    return json::parse(out)["loss"].get<double>();
  };
  const double l32 = torch_loss(dir + "/f32.safetensors"), l16 = torch_loss(dir + "/bf16.safetensors");
  std::printf("PyTorch on the exports: f32 %.6f, bf16 %.6f\n", l32, l16);
  // bf16 keeps 8 bits of mantissa: a relative error of 2^-9 per weight moves this loss by far less
  // than 1%.
  EXPECT_NEAR(l16, l32, 1e-2 * l32);

  const auto imp = run({ZEROTH_BIN, "ckpt", "import", dir + "/f32.safetensors", "--config", write_config("ckpt_export", j), "--out",
                        dir + "/imported"},
                       "ckpt_import");
  ASSERT_EQ(imp.code, 0) << imp.output;
  ASSERT_EQ(run({ZEROTH_BIN, "ckpt", "export", dir + "/imported", "--out", dir + "/again.safetensors"}, "ckpt_again").code, 0);
  EXPECT_EQ(bytes_of(dir + "/again.safetensors"), bytes_of(dir + "/f32.safetensors"));

  const auto re = run({ZEROTH_BIN, "ckpt", "reshard", ckpt, "--dp", "1", "--out", dir + "/dp1"}, "ckpt_reshard");
  ASSERT_EQ(re.code, 0) << re.output;
  EXPECT_TRUE(fs::exists(dir + "/dp1/step-3/rank-00000.bin"));
  EXPECT_FALSE(fs::exists(dir + "/dp1/step-3/rank-00001.bin"));
  ASSERT_EQ(run({ZEROTH_BIN, "ckpt", "export", dir + "/dp1", "--out", dir + "/dp1.safetensors"}, "ckpt_dp1").code, 0);
  EXPECT_EQ(bytes_of(dir + "/dp1.safetensors"), bytes_of(dir + "/f32.safetensors"));
  // The moments came along too: one rank resuming the resharded checkpoint (the same global batch,
  // accumulated 4 times) trains steps 4-5 as two ranks resuming the original do, to reduction order.
  json two = fresh("ckpt_two");
  two["run"]["steps"] = 5;
  const auto on_two = run({ZEROTH_BIN, "train", write_config("ckpt_two", two), "--resume", ckpt}, "ckpt_two");
  ASSERT_EQ(on_two.code, 0) << on_two.output;
  json one = fresh("ckpt_one");
  one["run"]["steps"] = 5;
  one["run"]["world_size"] = 1;
  one["gradient_accumulation_steps"] = 4;
  const auto on_one = run({ZEROTH_BIN, "train", write_config("ckpt_one", one), "--resume", dir + "/dp1"}, "ckpt_one");
  ASSERT_EQ(on_one.code, 0) << on_one.output;
  const auto a = losses(on_two), b = losses(on_one);
  ASSERT_EQ(a.size(), 2u);
  ASSERT_EQ(b.size(), 2u);
  for (size_t i = 0; i < 2; ++i) EXPECT_NEAR(b[i], a[i], 1e-5 * a[i]) << "step " << i + 4;

  // run.init_from: a run starting from the exported weights evaluates them first: its step-0
  // validation loss is the finished run's last one.
  json from = fresh("ckpt_init");
  from["run"]["steps"] = 1;
  from["run"]["init_from"] = dir + "/f32.safetensors";
  const auto init = run({ZEROTH_BIN, "train", write_config("ckpt_init", from)}, "ckpt_init");
  ASSERT_EQ(init.code, 0) << init.output;
  double last_val = -1, first_val = -1;
  std::ifstream metrics(dir + "/metrics.jsonl");
  for (std::string line; std::getline(metrics, line);)
    if (const json m = json::parse(line); m.contains("val_loss")) last_val = m["val_loss"];
  for (const auto& m : init.metrics)
    if (m.contains("val_loss") && first_val < 0) first_val = m["val_loss"];
  ASSERT_GE(last_val, 0) << "the finished run logged no validation loss";
  EXPECT_EQ(first_val, last_val);
}

}  // namespace
}  // namespace zeroth
