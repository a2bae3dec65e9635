// Hugging Face model folders through the binary, against the single file and against their own
// bytes: `zeroth ckpt export --format hf` shards hold exactly the single file's tensor bytes, in
// save_pretrained's layout (index, shard names, state-dict order); importing the folder and
// exporting it again gives the same files byte for byte; run.init_from reads the folder into a
// 3D layout (pipeline 2 x tensor 2) that evaluates the weights as one rank reading the single
// file does; and a load streams: its peak RSS is a fresh start's plus no more than a shard.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using json = nlohmann::json;
using testing::bytes_of;
using testing::run;
using testing::temp;
using testing::write_config;
namespace fs = std::filesystem;

// A small untied GQA Llama on synthetic tokens: 2 ranks, ZeRO-3, a checkpoint at the end.
json llama(const std::string& name, int n_layer = 2, int n_embd = 32, int ffn = 48, int vocab = 64) {
  fs::remove_all(temp(name));
  json j = testing::tiny(name);
  j["model"] = {{"architecture", "llama"}, {"n_layer", n_layer},       {"n_head", 4},   {"n_kv_head", 2},
                {"n_embd", n_embd},        {"intermediate_size", ffn}, {"seq_len", 16}, {"tie_word_embeddings", false}};
  j["data"]["vocab_size"] = vocab;
  j["run"]["steps"] = 3;
  return j;
}

// Every file of a folder, by name, as bytes.
std::map<std::string, std::string> files_of(const std::string& dir) {
  std::map<std::string, std::string> out;
  for (const auto& e : fs::directory_iterator(dir)) out[e.path().filename().string()] = bytes_of(e.path().string());
  return out;
}

double first_val_loss(const testing::Run& r) {
  for (const auto& m : r.metrics)
    if (m.contains("val_loss")) return m["val_loss"].get<double>();
  return -1;
}

TEST(HfFolder, ShardsHoldTheSingleFilesBytesAndImportExportIsByteIdentical) {
  const json j = llama("hf_src");
  const auto trained = run({ZEROTH_BIN, "train", write_config("hf_src", j)}, "hf_src");
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::string dir = temp("hf_src"), ckpt = dir + "/checkpoints";
  auto hf_export = [&](const std::string& from, const std::string& out, std::vector<std::string> extra) {
    std::vector<std::string> args = {ZEROTH_BIN, "ckpt", "export", from, "--format", "hf", "--dtype", "bf16", "--out", out};
    args.insert(args.end(), extra.begin(), extra.end());
    const auto r = run(args, "hf_export");
    EXPECT_EQ(r.code, 0) << r.output;
  };
  hf_export(ckpt, dir + "/one", {});
  // bf16 tensors: the embedding and head 4096 bytes (alone, over the limit), the projections 1-3 KB.
  hf_export(ckpt, dir + "/sharded", {"--max-shard-size", "3KB"});
  ASSERT_TRUE(fs::exists(dir + "/one/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/one/model.safetensors.index.json"));
  const SafeTensors one = read_safetensors(dir + "/one/model.safetensors");

  std::ifstream index_file(dir + "/sharded/model.safetensors.index.json");
  ASSERT_TRUE(index_file) << "no index in the sharded folder";
  const json index = json::parse(index_file);
  const auto& map = index.at("weight_map");
  ASSERT_EQ(map.size(), one.tensors.size());
  std::set<std::string> shard_files;
  uint64_t total = 0;
  for (const auto& [name, t] : one.tensors) {
    ASSERT_TRUE(map.contains(name)) << name << " is not in the index";
    const std::string shard = map[name].get<std::string>();
    shard_files.insert(shard);
    const SafeTensors s = read_safetensors(dir + "/sharded/" + shard);
    ASSERT_TRUE(s.tensors.count(name)) << name << " is not in " << shard;
    EXPECT_EQ(s.tensors.at(name).data, t.data) << name;
    EXPECT_EQ(s.tensors.at(name).shape, t.shape) << name;
    total += t.data.size();
  }
  EXPECT_EQ(index.at("metadata").at("total_size").get<uint64_t>(), total);
  // Shards fill in the state dict's order: the embedding first, the head last, each shard within
  // 3000 bytes unless it is one tensor.
  const size_t n = shard_files.size();
  ASSERT_GE(n, 5u);
  EXPECT_EQ(map["model.embed_tokens.weight"], fmt::format("model-00001-of-{:05d}.safetensors", n));
  EXPECT_EQ(map["lm_head.weight"], fmt::format("model-{:05d}-of-{:05d}.safetensors", n, n));
  EXPECT_EQ(map["model.layers.0.self_attn.q_proj.weight"], fmt::format("model-00002-of-{:05d}.safetensors", n));
  for (const auto& f : shard_files) {
    const SafeTensors s = read_safetensors(dir + "/sharded/" + f);
    uint64_t bytes = 0;
    for (const auto& [name, t] : s.tensors) bytes += t.data.size();
    EXPECT_TRUE(bytes <= 3000 || s.tensors.size() == 1) << f << " holds " << bytes << " bytes in " << s.tensors.size() << " tensors";
  }
  const json config = json::parse(std::ifstream(dir + "/sharded/config.json"));
  EXPECT_EQ(config["architectures"], json::array({"LlamaForCausalLM"}));
  EXPECT_EQ(config["num_key_value_heads"], 2);
  EXPECT_EQ(config["tie_word_embeddings"], false);
  EXPECT_EQ(config["torch_dtype"], "bfloat16");

  // Import the sharded folder, export it again: the same files, byte for byte.
  const auto imported = run({ZEROTH_BIN, "ckpt", "import", dir + "/sharded", "--config", write_config("hf_src", j), "--out",
                             dir + "/imported"},
                            "hf_import");
  ASSERT_EQ(imported.code, 0) << imported.output;
  hf_export(dir + "/imported", dir + "/again", {"--max-shard-size", "3KB"});
  const auto a = files_of(dir + "/sharded"), b = files_of(dir + "/again");
  ASSERT_EQ(a.size(), b.size());
  for (const auto& [name, bytes] : a) {
    ASSERT_TRUE(b.count(name)) << name << " is missing from the second export";
    EXPECT_TRUE(b.at(name) == bytes) << name << " differs after import and export";
  }

  // run.init_from: the sharded folder into pipeline 2 x tensor 2 evaluates the weights as one rank
  // reading the single file does (to reduction order), and not as a fresh start.
  auto evaluate = [&](const std::string& name, const std::string& from, int world, int pp, int tp) {
    json e = llama(name);
    e["run"]["steps"] = 1;
    e["run"]["world_size"] = world;
    e["run"]["checkpoint_interval"] = -1;
    e["zero_optimization"]["stage"] = 1;
    e["parallel"] = {{"pipeline", pp}, {"tensor", tp}};
    if (!from.empty()) e["run"]["init_from"] = from;
    const auto r = run({ZEROTH_BIN, "train", write_config(name, e)}, name);
    EXPECT_EQ(r.code, 0) << r.output;
    return first_val_loss(r);
  };
  const double single = evaluate("hf_eval_single", dir + "/one/model.safetensors", 1, 1, 1);
  const double sharded = evaluate("hf_eval_3d", dir + "/sharded", 4, 2, 2);
  const double fresh = evaluate("hf_eval_fresh", "", 1, 1, 1);
  ASSERT_GT(single, 0);
  EXPECT_NEAR(sharded, single, 1e-5 * single);
  EXPECT_GT(std::abs(single - fresh), 1e-3) << "the first validation loss is a fresh start's: the weights were not read";
}

// A 10M-parameter Llama's bf16 weights (20 MB) in 2 MB shards: a run starting from them peaks at a
// fresh start's resident set plus what a block's load holds: the engine's transfer buffer (the
// largest block, the 4 MiB f32 embedding), the reader's bf16 staging of one tensor (2 MiB), and
// 4 MiB of allocator slack. A read of the whole model would add 20 MB in bf16, 40 MB as f32.
// Under ASan the runs go without its quarantine (which keeps every freed byte resident, on
// purpose) and its shadow adds an eighth of what is touched: the bound is 10 MiB x 9 / 8.
TEST(HfFolder, LoadingStreamsAShardAtATime) {
#if defined(__SANITIZE_ADDRESS__)
  const std::vector<std::string> env = {"ASAN_OPTIONS=quarantine_size_mb=0:thread_local_quarantine_size_kb=0:detect_leaks=1"};
  const int64_t bound = (int64_t{10} << 20) * 9 / 8;
#else
  const std::vector<std::string> env;
  const int64_t bound = int64_t{10} << 20;
#endif
  json j = llama("hf_big", 8, 256, 1024, 4096);
  j["run"]["steps"] = 1;
  j["run"]["world_size"] = 1;
  j["run"]["eval_batches"] = 1;
  j["zero_optimization"]["stage"] = 0;
  const auto trained = run({ZEROTH_BIN, "train", write_config("hf_big", j)}, "hf_big");
  ASSERT_EQ(trained.code, 0) << trained.output;
  const std::string dir = temp("hf_big");
  const auto exported = run({ZEROTH_BIN, "ckpt", "export", dir + "/checkpoints", "--format", "hf", "--dtype", "bf16", "--out",
                             dir + "/hf", "--max-shard-size", "2MB"},
                            "hf_big_export");
  ASSERT_EQ(exported.code, 0) << exported.output;
  auto peak = [&](const std::string& name, const std::string& from) -> int64_t {
    json e = llama(name, 8, 256, 1024, 4096);
    e["run"]["steps"] = 1;
    e["run"]["world_size"] = 1;
    e["run"]["eval_batches"] = 1;
    e["run"]["checkpoint_interval"] = -1;
    e["zero_optimization"]["stage"] = 0;
    if (!from.empty()) e["run"]["init_from"] = from;
    auto child = testing::spawn({ZEROTH_BIN, "train", write_config(name, e)}, env, temp(name) + ".out");
    EXPECT_EQ(testing::wait_exit(child, std::chrono::seconds(300)), 0) << child.output();
    for (const auto& m : testing::metrics_in(name))
      if (m.contains("summary")) return m.at("summary").at("peak_rss_before_weights_bytes").get<int64_t>();
    ADD_FAILURE() << name << " wrote no summary";
    return 0;
  };
  const int64_t fresh = peak("hf_big_fresh", ""), loaded = peak("hf_big_loaded", dir + "/hf");
  std::printf("peak RSS before the final save: fresh %.1f MiB, from the folder %.1f MiB\n", fresh / 1048576.0, loaded / 1048576.0);
  EXPECT_LT(loaded - fresh, bound);
}

}  // namespace
}  // namespace zeroth
