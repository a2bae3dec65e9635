// `zeroth eval` and `zeroth generate` against PyTorch and a closed form: the validation loss of a trained Llama's
// exported weights is the independent PyTorch Llama's (tests/reference/hf_llama_eval.py) over the
// same windows; with the LM head zeroed every logit is 0 and the loss is ln V exactly; the
// checkpoint evaluates as its export does; and every world layout (3 data-parallel ranks sharing
// a window count that is not a multiple of them, pipeline 2 x tensor 2) gives the same loss; greedy
// generation through the key/value cache gives PyTorch's tokens.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using json = nlohmann::json;
using testing::run;
using testing::temp;
using testing::write_config;
namespace fs = std::filesystem;

std::string shell(const std::string& cmd) {
  std::string out;
  FILE* pipe = ::popen((cmd + " 2>&1").c_str(), "r");
  char buf[4096];
  while (pipe != nullptr && std::fgets(buf, sizeof buf, pipe) != nullptr) out += buf;
  EXPECT_EQ(pipe != nullptr ? ::pclose(pipe) : -1, 0) << cmd << ": " << out;
  return out;
}

// The last line of a command's output as JSON.
json last_json(const std::string& output) {
  const auto end = output.find_last_not_of('\n');
  const auto start = output.rfind('\n', end);
  return json::parse(output.substr(start == std::string::npos ? 0 : start + 1, end + 1), nullptr, false);
}

TEST(Eval, MatchesPyTorchAClosedFormAndEveryLayout) {
  const std::string dir = temp("eval");
  fs::remove_all(dir);
  fs::create_directories(dir);
  // Text whose bytes are the tokens: 2,417 of them, 151 windows of 16: 3 ranks of micro-batch 2
  // take 6 a round, so the last round gives one rank a window and the others none.
  std::string text;
  uint32_t seed = 3;
  const std::string words[] = {"the ", "cat ", "sat ", "on ", "a ", "mat. ", "Why? ", "because\n", "it ", "was ", "warm, "};
  while (text.size() < 2417) text += words[((seed = seed * 1664525u + 1013904223u) >> 16) % 11];
  text.resize(2417);
  std::ofstream(dir + "/val.txt") << text;
  std::ofstream(dir + "/train.txt") << text + text;
  json j = testing::tiny("eval");
  j["model"] = {{"architecture", "llama"},
                {"n_layer", 2},
                {"n_head", 4},
                {"n_kv_head", 2},
                {"n_embd", 32},
                {"intermediate_size", 48},
                {"seq_len", 16},
                {"tie_word_embeddings", false}};
  j["data"] = {{"format", "text"}, {"train", dir + "/train.txt"}, {"val", dir + "/val.txt"}};
  j["run"]["steps"] = 40;
  j["run"]["output_dir"] = dir + "/run";
  const std::string config = write_config("eval", j);
  const auto trained = run({ZEROTH_BIN, "train", config}, "eval_train");
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::string ckpt = dir + "/run/checkpoints";
  const auto exported = run({ZEROTH_BIN, "ckpt", "export", ckpt, "--format", "hf", "--out", dir + "/hf"}, "eval_export");
  ASSERT_EQ(exported.code, 0) << exported.output;

  auto eval = [&](const std::string& name, std::vector<std::string> extra) {
    std::vector<std::string> args = {ZEROTH_BIN, "eval", config, "--json", "--set", "run.checkpoint_interval=-1"};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = run(args, name);
    EXPECT_EQ(r.code, 0) << r.output;
    const json out = last_json(r.output);
    EXPECT_FALSE(out.is_discarded()) << r.output;
    return out.is_discarded() ? json{{"loss", -1.0}} : out;
  };
  const json one = eval("eval_one", {"--set", "run.init_from=" + dir + "/hf", "--set", "run.world_size=1"});
  EXPECT_EQ(one["windows"], 151);
  EXPECT_EQ(one["tokens"], 151 * 16);
  const double loss = one["loss"].get<double>();
  EXPECT_NEAR(one["perplexity"].get<double>(), std::exp(loss), 1e-9 * std::exp(loss));

  const json torch = json::parse(shell("/usr/bin/python3 " + std::string(ZEROTH_SOURCE_DIR) + "/tests/reference/hf_llama_eval.py " +
                                       dir + "/hf " + dir + "/val.txt 16"));
  std::printf("zeroth eval %.7f, PyTorch %.7f over %d windows\n", loss, torch["loss"].get<double>(), torch["windows"].get<int>());
  EXPECT_EQ(torch["windows"], one["windows"]);
  // f32 throughout, sums in different orders: a few ulps of the loss per token, averaged.
  EXPECT_NEAR(loss, torch["loss"].get<double>(), 2e-6 * loss);

  const json resumed = eval("eval_resume", {"--resume", ckpt, "--set", "run.world_size=1"});
  EXPECT_EQ(resumed["loss"].get<double>(), loss) << "the checkpoint's f32 weights are the export's";
  const json dp3 = eval("eval_dp3", {"--set", "run.init_from=" + dir + "/hf", "--set", "run.world_size=3"});
  EXPECT_NEAR(dp3["loss"].get<double>(), loss, 1e-6 * loss);
  const json grid = eval("eval_3d", {"--set", "run.init_from=" + dir + "/hf", "--set", "run.world_size=4", "--set",
                                     "parallel.pipeline=2", "--set", "parallel.tensor=2", "--set", "zero_optimization.stage=1"});
  EXPECT_NEAR(grid["loss"].get<double>(), loss, 1e-6 * loss);

  // Greedy generation with the key/value cache gives the tokens of PyTorch recomputing the whole
  // sequence each step.
  const auto gen = run({ZEROTH_BIN, "generate", config, "--set", "run.init_from=" + dir + "/hf", "--prompt", "the cat ",
                        "--max-new-tokens", "8", "--temperature", "0", "--ids"},
                       "eval_generate");
  ASSERT_EQ(gen.code, 0) << gen.output;
  const auto at = gen.output.find("\nids:");
  ASSERT_NE(at, std::string::npos) << gen.output;
  std::vector<int> ids;
  std::istringstream in(gen.output.substr(at + 5, gen.output.find('\n', at + 1) - at - 5));
  for (int id; in >> id;) ids.push_back(id);
  std::string prompt_ids;
  for (const char c : std::string("the cat ")) prompt_ids += fmt::format(" {}", static_cast<unsigned char>(c));
  const json greedy = json::parse(shell("/usr/bin/python3 " + std::string(ZEROTH_SOURCE_DIR) +
                                        "/tests/reference/hf_llama_generate.py " + dir + "/hf 8" + prompt_ids));
  std::printf("greedy after \"the cat \": %s\n", json(ids).dump().c_str());
  EXPECT_EQ(json(ids), greedy["ids"]) << gen.output;

  // The LM head zeroed in place: every logit 0, every token's cross-entropy ln 256.
  const SafeTensors header = read_safetensors(dir + "/hf/model.safetensors", false);
  const SafeTensor& head = header.at("lm_head.weight");
  {
    std::fstream f(dir + "/hf/model.safetensors", std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(static_cast<std::streamoff>(head.file_offset));
    const std::vector<char> zeros(head.numel() * 4, 0);
    f.write(zeros.data(), static_cast<std::streamsize>(zeros.size()));
  }
  const json uniform = eval("eval_uniform", {"--set", "run.init_from=" + dir + "/hf", "--set", "run.world_size=2"});
  EXPECT_NEAR(uniform["loss"].get<double>(), std::log(256.0), 1e-6);
}

// Without validation data there is nothing to measure: a clear error.
TEST(Eval, WithoutValidationDataIsAnError) {
  json j = testing::tiny("eval_noval");
  j["data"]["val_fraction"] = 0;
  const auto r = run({ZEROTH_BIN, "eval", write_config("eval_noval", j)}, "eval_noval");
  EXPECT_NE(r.code, 0);
  EXPECT_NE(r.output.find("zeroth eval measures the validation data"), std::string::npos) << r.output;
}

}  // namespace
}  // namespace zeroth
