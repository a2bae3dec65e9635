// A run's folder and its figures against the commands that take them: `zeroth eval` over the
// windows a run's validation measured gives the run's figure (the same forward over the same
// windows); a run folder is a config, weights and a checkpoint to eval, run.init_from and --resume;
// exporting into a run's or a checkpoint's folder is refused with both left as they were; a resume
// with another run.steps keeps the learning rates of the schedule it started on; the messages a
// user meets name the key, not zeroth's sources.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using json = nlohmann::json;
using testing::run;
using testing::temp;
using testing::tiny_config;
namespace fs = std::filesystem;

// The last line of a command's output as JSON.
json last_json(const std::string& output) {
  const auto end = output.find_last_not_of('\n');
  const auto start = output.rfind('\n', end);
  return json::parse(output.substr(start == std::string::npos ? 0 : start + 1, end + 1), nullptr, false);
}

json eval_json(const std::vector<std::string>& args, const std::string& name) {
  std::vector<std::string> all = {ZEROTH_BIN, "eval"};
  all.insert(all.end(), args.begin(), args.end());
  all.push_back("--json");
  const auto r = run(all, name);
  EXPECT_EQ(r.code, 0) << r.output;
  return last_json(r.output);
}

// The validation records of a run: step -> the record.
std::map<int, json> validations(const std::vector<json>& metrics) {
  std::map<int, json> out;
  for (const auto& m : metrics)
    if (m.contains("val_loss") && m.contains("step")) out[m.at("step").get<int>()] = m;
  return out;
}

// The peak a CPU run's MFU is taken against is measured once per machine and kept: a second run
// reads it (the same figure, "kept in" the cache file) instead of timing a GEMM again.
TEST(RunFolder, TheMfuPeakIsMeasuredOncePerMachine) {
  const std::string cache = temp("folder_mfu_cache");
  fs::remove_all(cache);
  auto peak_line = [&](const std::string& name) {
    const std::string config = tiny_config(name, 1, "local");
    auto child = testing::spawn({ZEROTH_BIN, "train", config}, {"XDG_CACHE_HOME=" + cache}, temp(name) + ".out");
    EXPECT_EQ(testing::wait_exit(child, 120s), 0) << child.output();
    const std::string out = child.output();
    const size_t at = out.find("  mfu ");
    return at == std::string::npos ? std::string() : out.substr(at, out.find('\n', at) - at);
  };
  const std::string first = peak_line("folder_mfu_1"), second = peak_line("folder_mfu_2");
  EXPECT_NE(first.find("measured now, the best of 3, kept in " + cache + "/zeroth/mfu-peak.json"), std::string::npos) << first;
  EXPECT_NE(second.find("kept in " + cache + "/zeroth/mfu-peak.json"), std::string::npos) << second;
  EXPECT_EQ(second.find("measured now"), std::string::npos) << second;
  // The same GFLOP/s: the text up to the parenthesis that says where it came from.
  EXPECT_EQ(first.substr(0, first.find(" (")), second.substr(0, second.find(" ("))) << first << "\n" << second;
}

// tiny's synthetic data holds 65,536 tokens; its held-out tenth, 6,553 of them, is 409 windows of
// 16 tokens. run.eval_batches 2 x micro-batch 2 x 2 ranks: a validation measures the first 8.
TEST(RunFolder, TheRunsValidationIsEvalOverTheSameWindows) {
  const std::string config = tiny_config("folder_val", 4, "local");
  const auto r = run({ZEROTH_BIN, "train", config}, "folder_val");
  ASSERT_EQ(r.code, 0) << r.output;
  const auto val = validations(r.metrics);
  ASSERT_TRUE(val.count(4)) << r.output;
  EXPECT_EQ(val.at(4).at("val_windows"), 8);
  EXPECT_EQ(val.at(4).at("val_windows_of"), 409);
  EXPECT_NE(r.output.find("validation at step 4: loss "), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("(the first 8 of 409 windows)"), std::string::npos) << r.output;
  EXPECT_NE(r.output.find("zeroth eval --windows 8 these"), std::string::npos) << r.output;
  const double run_figure = val.at(4).at("val_loss").get<double>();
  // The run's folder, its trained weights, the same 8 windows on the same layout: the same forward
  // passes and sums, so the same figure (printed to 4 places, recorded to the float's).
  const json same = eval_json({temp("folder_val"), "--windows", "8"}, "folder_val_eval8");
  EXPECT_EQ(same.at("windows"), 8);
  EXPECT_EQ(same.at("of"), 409);
  EXPECT_NEAR(same.at("loss").get<double>(), run_figure, 1e-6 * run_figure);
  // Every window: another figure, and what a run with run.eval_batches "all" reports.
  const json all = eval_json({temp("folder_val")}, "folder_val_eval_all");
  EXPECT_EQ(all.at("windows"), 409);
  EXPECT_GT(std::abs(all.at("loss").get<double>() - run_figure), 1e-4 * run_figure) << "8 windows of 409 gave the mean of all";
  const std::string every = tiny_config("folder_val_all", 4, "local", {{"eval_batches", "all"}});
  const auto r_all = run({ZEROTH_BIN, "train", every}, "folder_val_all");
  ASSERT_EQ(r_all.code, 0) << r_all.output;
  const auto val_all = validations(r_all.metrics);
  ASSERT_TRUE(val_all.count(4));
  EXPECT_EQ(val_all.at(4).at("val_windows"), 409);
  EXPECT_NEAR(val_all.at(4).at("val_loss").get<double>(), all.at("loss").get<double>(), 1e-6 * all.at("loss").get<double>());
  // More batches than the validation data holds: every window, in the run and in eval, where a
  // round of that size used to be refused as repeating sequences.
  const std::string many = tiny_config("folder_val_many", 1, "local", {{"eval_batches", 1000}});
  const auto r_many = run({ZEROTH_BIN, "train", many}, "folder_val_many");
  ASSERT_EQ(r_many.code, 0) << r_many.output;
  EXPECT_EQ(validations(r_many.metrics).at(1).at("val_windows"), 409);
  EXPECT_EQ(eval_json({many}, "folder_val_many_eval").at("windows"), 409);
}

TEST(RunFolder, IsAConfigWeightsAndACheckpoint) {
  const std::string config = tiny_config("folder", 4, "local");
  ASSERT_EQ(run({ZEROTH_BIN, "train", config}, "folder").code, 0);
  const std::string dir = temp("folder");
  // eval: the folder's config and trained weights, as the weights file given by hand.
  const json by_folder = eval_json({dir, "--windows", "8"}, "folder_eval");
  const json by_file = eval_json({config, "--set", "run.init_from=" + dir + "/model.safetensors", "--windows", "8"},
                                 "folder_eval_file");
  EXPECT_EQ(by_folder.at("loss"), by_file.at("loss"));
  // run.init_from: the folder's trained weights start another run (its validation at step 0 is
  // the trained weights', not a fresh start's).
  const std::string second = tiny_config("folder_init", 1, "local", {{"init_from", dir}});
  const auto init = run({ZEROTH_BIN, "train", second}, "folder_init");
  ASSERT_EQ(init.code, 0) << init.output;
  const auto val = validations(init.metrics);
  ASSERT_TRUE(val.count(0)) << init.output;
  EXPECT_NEAR(val.at(0).at("val_loss").get<double>(), by_folder.at("loss").get<double>(), 1e-6 * by_folder.at("loss").get<double>());
  // --resume: the folder's checkpoints.
  const auto resumed = run({ZEROTH_BIN, "train", config, "--set", "run.steps=5", "--resume", dir}, "folder");
  ASSERT_EQ(resumed.code, 0) << resumed.output;
  EXPECT_NE(resumed.output.find("resumed from " + dir + "/checkpoints/step-4 at step 4"), std::string::npos) << resumed.output;
  // --resume before the config: the config is the config, the checkpoint the config's own.
  const auto swapped = run({ZEROTH_BIN, "train", "--set", "run.steps=6", "--resume", config}, "folder");
  ASSERT_EQ(swapped.code, 0) << swapped.output;
  EXPECT_NE(swapped.output.find("resumed from " + dir + "/checkpoints/step-5 at step 5"), std::string::npos) << swapped.output;
  // A folder that is not a run's is named as such.
  const auto not_run = run({ZEROTH_BIN, "eval", dir + "/checkpoints"}, "folder_not_run");
  EXPECT_EQ(not_run.code, 1);
  EXPECT_NE(not_run.output.find("is a folder, not a config file: give a JSON config, or the folder of a run"), std::string::npos)
      << not_run.output;
}

// `ckpt export --format hf` into a checkpoint folder or a run's folder would replace what makes
// them what they are (config.json, model.safetensors beside `latest`): refused, every byte kept.
TEST(RunFolder, ExportIntoARunsOrACheckpointsFolderIsRefused) {
  const std::string config = tiny_config("folder_export", 2, "local");
  ASSERT_EQ(run({ZEROTH_BIN, "train", config}, "folder_export").code, 0);
  const std::string dir = temp("folder_export"), checkpoints = dir + "/checkpoints";
  const std::string run_config = testing::bytes_of(dir + "/config.json"), weights = testing::bytes_of(dir + "/model.safetensors");
  const std::string latest = testing::bytes_of(checkpoints + "/latest");
  const auto into_checkpoints = run({ZEROTH_BIN, "ckpt", "export", checkpoints, "--format", "hf", "--out", checkpoints}, "folder_x1");
  EXPECT_EQ(into_checkpoints.code, 1);
  EXPECT_NE(into_checkpoints.output.find(checkpoints + " holds a zeroth checkpoint (latest); export the weights into another folder"),
            std::string::npos)
      << into_checkpoints.output;
  EXPECT_FALSE(fs::exists(checkpoints + "/config.json"));
  EXPECT_EQ(testing::bytes_of(checkpoints + "/latest"), latest);
  const auto into_run = run({ZEROTH_BIN, "ckpt", "export", checkpoints, "--format", "hf", "--out", dir}, "folder_x2");
  EXPECT_EQ(into_run.code, 1);
  EXPECT_NE(into_run.output.find(dir + " is a training run's folder"), std::string::npos) << into_run.output;
  EXPECT_EQ(testing::bytes_of(dir + "/config.json"), run_config);
  EXPECT_EQ(testing::bytes_of(dir + "/model.safetensors"), weights);
}

// WarmupDecayLR with total_num_steps "auto" over 4 steps. Resumed with run.steps 6, "auto" would
// become 6 and steps 5 and 6 take a longer decay's rates: the checkpoint's total is kept, with a
// warning, so they take the rates of one run of 6 steps on the schedule of 4; a total given on
// resuming reshapes it.
TEST(RunFolder, ResumingWithOtherStepsKeepsTheSchedule) {
  json j = testing::tiny("folder_lr");
  j["run"]["steps"] = 4;
  j["run"]["eval_interval"] = 0;
  j["scheduler"] = json::parse(
      R"({"type": "WarmupDecayLR", "params": {"warmup_min_lr": 0, "warmup_max_lr": 0.01, "warmup_num_steps": 0, "total_num_steps": "auto"}})");
  fs::remove_all(temp("folder_lr"));
  const std::string config = testing::write_config("folder_lr", j);
  ASSERT_EQ(run({ZEROTH_BIN, "train", config}, "folder_lr").code, 0);
  auto lrs = [](const std::vector<json>& metrics) {
    std::map<int, double> out;
    for (const auto& m : metrics)
      if (m.contains("lr") && m.contains("step")) out[m.at("step").get<int>()] = m.at("lr").get<double>();
    return out;
  };
  fs::remove_all(temp("folder_lr_reshaped"));
  fs::copy(temp("folder_lr"), temp("folder_lr_reshaped"), fs::copy_options::recursive);
  const auto kept = run({ZEROTH_BIN, "train", config, "--set", "run.steps=6", "--resume"}, "folder_lr");
  ASSERT_EQ(kept.code, 0) << kept.output;
  EXPECT_NE(kept.output.find("resuming with run.steps 6 where the checkpoint's run had scheduler.params.total_num_steps 4"),
            std::string::npos)
      << kept.output;
  json whole = j;
  whole["run"]["steps"] = 6;
  whole["scheduler"]["params"]["total_num_steps"] = 4;
  fs::remove_all(temp("folder_lr_whole"));
  whole["run"]["output_dir"] = temp("folder_lr_whole");
  const auto one_run = run({ZEROTH_BIN, "train", testing::write_config("folder_lr_whole", whole)}, "folder_lr_whole");
  ASSERT_EQ(one_run.code, 0) << one_run.output;
  const auto lr = lrs(kept.metrics), want = lrs(one_run.metrics);
  ASSERT_TRUE(lr.count(5) && lr.count(6) && want.count(5) && want.count(6)) << kept.output;
  EXPECT_EQ(lr.at(5), want.at(5));
  EXPECT_EQ(lr.at(6), want.at(6));
  const auto reshaped = run({ZEROTH_BIN, "train", config, "--set", "run.steps=6", "--set",
                             "run.output_dir=" + temp("folder_lr_reshaped"), "--set", "scheduler.params.total_num_steps=6",
                             "--resume"},
                            "folder_lr_reshaped");
  ASSERT_EQ(reshaped.code, 0) << reshaped.output;
  EXPECT_EQ(reshaped.output.find("the learning rate goes on along that schedule"), std::string::npos) << reshaped.output;
  EXPECT_GT(lrs(reshaped.metrics).at(5), want.at(5));
}

// A Llama trained on the fortunes with the SentencePiece vocabulary the README's setup trains,
// exported as a Hugging Face folder: the vocabulary goes with the weights, as tokenizer.model and
// a tokenizer_config.json naming LlamaTokenizer, the model's special pieces and no BOS added.
TEST(RunFolder, AnExportCarriesTheRunsTokenizer) {
  const fs::path vocab = fs::path(ZEROTH_SOURCE_DIR) / "runs/tokenizers/fortunes-4096.model";
  ASSERT_TRUE(fs::exists(vocab)) << vocab << " is missing: run tools/fortunes-vocab.sh (tools/dev.sh does)";
  json j = testing::tiny("folder_tok");
  j["model"] = {{"architecture", "llama"}, {"n_layer", 1}, {"n_head", 2}, {"n_embd", 32}, {"intermediate_size", 48}, {"seq_len", 16}};
  j["data"] = {{"format", "text"}, {"train", "/usr/share/games/fortunes/fortunes"}, {"tokenizer", vocab.string()}};
  j["run"]["steps"] = 1;
  j["run"]["sample_tokens"] = 0;
  fs::remove_all(temp("folder_tok"));
  ASSERT_EQ(run({ZEROTH_BIN, "train", testing::write_config("folder_tok", j)}, "folder_tok").code, 0);
  const std::string hf = temp("folder_tok_hf");
  fs::remove_all(hf);
  const auto exported = run({ZEROTH_BIN, "ckpt", "export", temp("folder_tok") + "/checkpoints", "--format", "hf", "--out", hf},
                            "folder_tok_x");
  ASSERT_EQ(exported.code, 0) << exported.output;
  EXPECT_EQ(testing::bytes_of(hf + "/tokenizer.model"), testing::bytes_of(vocab.string()));
  const json config = json::parse(std::ifstream(hf + "/tokenizer_config.json"));
  EXPECT_EQ(config.at("tokenizer_class"), "LlamaTokenizer");
  EXPECT_EQ(config.at("bos_token"), "<s>");
  EXPECT_EQ(config.at("eos_token"), "</s>");
  EXPECT_EQ(config.at("unk_token"), "<unk>");
  EXPECT_EQ(config.at("add_bos_token"), false);
  EXPECT_EQ(config.at("model_max_length"), 16);
  // The folder is a tokenizer zeroth reads back, with the same vocabulary.
  json k = j;
  k["data"]["tokenizer"] = hf;
  k["run"]["output_dir"] = temp("folder_tok_again");
  const auto again = run({ZEROTH_BIN, "train", testing::write_config("folder_tok_again", k), "--dry-run"}, "folder_tok_again");
  EXPECT_EQ(again.code, 0) << again.output;
}

// A missing data file is named by its key; a relative path the working folder lacks is read from
// the config's folder (the run's config.json then names it whole); generate echoes a prompt only
// once it is taken, says what it counted, and keeps its engine's plan to itself.
TEST(RunFolder, MessagesNameTheKeyAndPathsFollowTheConfig) {
  json j = testing::tiny("folder_msgs");
  j["data"] = {{"format", "text"}, {"train", "/nonexistent/fortunes"}};
  const auto missing = run({ZEROTH_BIN, "train", testing::write_config("folder_msgs", j)}, "folder_msgs");
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.output.find("zeroth: error: data.train = /nonexistent/fortunes: "), std::string::npos) << missing.output;
  EXPECT_EQ(missing.output.find(".cc:"), std::string::npos) << missing.output;

  // A text file beside the config, named relative to the config's folder.
  const fs::path beside = fs::path(temp("folder_paths"));
  fs::remove_all(beside);
  fs::create_directories(beside / "data");
  std::string text;
  for (int i = 0; i < 400; ++i) text += "the cat sat on the mat, " + std::to_string(i) + " times.\n";
  std::ofstream(beside / "data/cats.txt") << text;
  json k = testing::tiny("folder_paths_run");
  k["model"]["vocab_size"] = 256;
  k["data"] = {{"format", "text"}, {"train", "data/cats.txt"}};
  k["run"]["steps"] = 2;
  k["run"]["sample_tokens"] = 0;
  const std::string config = (beside / "run.json").string();
  std::ofstream(config) << k.dump(2);
  const auto trained = run({ZEROTH_BIN, "train", config}, "folder_paths_run");
  ASSERT_EQ(trained.code, 0) << trained.output;
  const json resolved = json::parse(std::ifstream(temp("folder_paths_run") + "/config.json"));
  EXPECT_EQ(resolved.at("data").at("train"), (beside / "data/cats.txt").lexically_normal().string());

  const std::string run_dir = temp("folder_paths_run");
  const auto long_prompt = run({ZEROTH_BIN, "generate", run_dir, "--prompt", std::string(40, 'x')}, "folder_gen_long");
  EXPECT_EQ(long_prompt.code, 1);
  EXPECT_EQ(long_prompt.output.find("xxxxxxxxxx"), std::string::npos) << long_prompt.output;
  EXPECT_NE(long_prompt.output.find("the prompt is 40 tokens; the model knows 16 positions"), std::string::npos) << long_prompt.output;
  const auto gen = run({ZEROTH_BIN, "generate", run_dir, "--prompt", "the cat", "--max-new-tokens", "5"}, "folder_gen");
  ASSERT_EQ(gen.code, 0) << gen.output;
  EXPECT_NE(gen.output.find("5 new tokens after the prompt's 7"), std::string::npos) << gen.output;
  EXPECT_EQ(gen.output.find("optimizer"), std::string::npos) << gen.output;
}

}  // namespace
}  // namespace zeroth
