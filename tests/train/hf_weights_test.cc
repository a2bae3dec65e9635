// Hugging Face weights read against the values written into them by hand: a Llama folder in the
// bare LlamaModel's names (no "model." prefix), split over two shards through an index, one of
// them bf16, with a rotary buffer Hugging Face does not load; every parameter read whole, in
// ranges, and as a tensor-parallel rank's slice. Folders that do not fit the model are refused
// naming what is wrong.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/cpu/kernels.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "models/decoder/gpt.h"
#include "train/hf/weights.h"

namespace zeroth {
namespace {

namespace fs = std::filesystem;

GptConfig tiny_llama() {
  GptConfig c;
  c.architecture = Architecture::llama;
  c.vocab_size = 16, c.seq_len = 8, c.n_layer = 1, c.n_head = 4, c.n_kv_head = 2, c.n_embd = 16, c.intermediate_size = 12;
  c.tie_word_embeddings = false;
  return c;
}

struct Folder {
  std::string dir;
  std::map<std::string, std::vector<float>> values;  // by Hugging Face name, as stored (bf16-rounded where bf16)
};

// The model's tensors in two shards (the layer's in the second, bf16), names without "model.".
Folder write_folder(const GptConfig& c, const std::string& name) {
  Folder f{fmt::format("{}/zeroth_hf_{}_{}", ::testing::TempDir(), name, ::getpid()), {}};
  fs::remove_all(f.dir);
  fs::create_directories(f.dir);
  const auto specs = Gpt::block_specs(c);
  uint32_t seed = 7;
  auto value = [&] { return static_cast<float>((seed = seed * 1664525u + 1013904223u) >> 8) / 16777216.0f - 0.5f; };
  std::map<std::string, std::vector<SafeTensorsWriter::Entry>> shards;
  std::map<std::string, std::vector<char>> bytes;
  nlohmann::json index = {{"metadata", {{"total_size", 0}}}, {"weight_map", nlohmann::json::object()}};
  for (const auto& h : Gpt::hf_params(c)) {
    const auto& p = specs[h.block].params[h.param];
    const std::string stored = h.name.starts_with("model.") ? h.name.substr(6) : h.name;
    const bool layer = stored.starts_with("layers.");
    const std::string shard = layer ? "b.safetensors" : "a.safetensors";
    std::vector<float> v(p.numel());
    for (auto& x : v) x = value();
    std::vector<char> raw(v.size() * (layer ? 2 : 4));
    cpu::cast(v.data(), DType::f32, raw.data(), layer ? DType::bf16 : DType::f32, v.size());
    cpu::cast(raw.data(), layer ? DType::bf16 : DType::f32, v.data(), DType::f32, v.size());
    shards[shard].push_back({stored, layer ? "BF16" : "F32", p.shape});
    bytes[stored] = std::move(raw);
    f.values[h.name] = std::move(v);
    index["weight_map"][stored] = shard;
  }
  shards["b.safetensors"].push_back({"layers.0.self_attn.rotary_emb.inv_freq", "F32", {2}});
  bytes["layers.0.self_attn.rotary_emb.inv_freq"] = std::vector<char>(8, 0);
  index["weight_map"]["layers.0.self_attn.rotary_emb.inv_freq"] = "b.safetensors";
  for (const auto& [file, entries] : shards) {
    SafeTensorsWriter w(f.dir + "/" + file, entries);
    for (const auto& e : entries) w.write(e.name, bytes[e.name].data(), bytes[e.name].size());
    w.finish();
  }
  std::ofstream(f.dir + "/" + kHfIndexName) << index.dump(2);
  return f;
}

TEST(HfWeights, AShardedFolderInBareNamesReadsWholeInRangesAndSliced) {
  const GptConfig c = tiny_llama();
  const Folder f = write_folder(c, "bare");
  ASSERT_TRUE(is_hf_weights(f.dir));
  HfModelReader reader(c, f.dir);
  EXPECT_EQ(reader.weights().files(), 2u);
  const auto specs = Gpt::block_specs(c);
  std::vector<std::vector<BlockSpec>> sliced;
  for (int r = 0; r < 2; ++r) {
    GptPart part;
    part.chunks = {{0, c.n_layer}};
    part.tp_rank = r, part.tp_ranks = 2;
    sliced.push_back(Gpt::block_specs(c, part));
  }
  size_t seen = 0, split = 0;
  for (const auto& h : Gpt::hf_params(c)) {
    const auto& p = specs[h.block].params[h.param];
    const std::vector<float>& want = f.values.at(h.name);
    std::vector<float> got(p.numel(), -9.0f);
    const size_t cut = p.numel() / 2 + 1;
    reader.read(h.block, h.param, p, cut, p.numel(), got.data() + cut);
    reader.read(h.block, h.param, p, 0, cut, got.data());
    EXPECT_EQ(got, want) << h.name;
    // Each tensor-parallel rank of 2, one after the other through the same reader, gets its
    // slice (read in two ranges), as the spec's own take() cuts it from the whole.
    for (int r = 0; r < 2; ++r) {
      const ParamSpec* q = nullptr;
      for (const auto& b : sliced[r])
        for (const auto& s : b.params)
          if (b.name == specs[h.block].name && s.name == p.name) q = &s;
      ASSERT_NE(q, nullptr) << h.name;
      std::vector<float> slice(q->numel()), expect(q->numel());
      const size_t half = q->numel() / 2 + 1;
      reader.read(h.block, h.param, *q, 0, half, slice.data());
      reader.read(h.block, h.param, *q, half, q->numel(), slice.data() + half);
      if (q->tp.split()) {
        q->tp.take(want.data(), expect.data(), q->numel());
        split += r;
      } else {
        expect = want;
      }
      EXPECT_EQ(slice, expect) << h.name << " on tensor-parallel rank " << r;
    }
    ++seen;
  }
  EXPECT_EQ(seen, 12u);  // embed, 9 in the layer, norm, head
  EXPECT_GE(split, 7u);  // tensors split on rank 1
  fs::remove_all(f.dir);
}

// A model no Hugging Face class holds (GPT-2 with its MLP as experts) is refused as a folder before
// anything is written: not even the folder is made (its config.json, which would say the class,
// comes last).
TEST(HfWeights, AModelNoHuggingFaceClassHoldsIsRefusedBeforeAnyFile) {
  GptConfig c;
  c.vocab_size = 64, c.seq_len = 16, c.n_layer = 2, c.n_head = 2, c.n_embd = 32;
  c.moe.num_experts = 4;
  const fs::path dir = fs::path(::testing::TempDir()) / fmt::format("zeroth-hf-no-class-{}", ::getpid());
  fs::remove_all(dir);
  try {
    HfWriter(c, dir.string(), DType::f32);
    ADD_FAILURE() << "a GPT-2 with experts was written as a Hugging Face folder";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("no Hugging Face class holds this model"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(fs::exists(dir));
}

TEST(HfWeights, FoldersThatDoNotFitTheModelAreRefusedNamingWhy) {
  const GptConfig c = tiny_llama();
  auto message = [&](const GptConfig& model, const std::string& dir) {
    try {
      HfModelReader r(model, dir);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const Folder f = write_folder(c, "refused");
  GptConfig tied = c;
  tied.tie_word_embeddings = true;
  EXPECT_NE(message(tied, f.dir).find("tensor lm_head.weight has no place in the model"), std::string::npos) << message(tied, f.dir);
  GptConfig wide = c;
  wide.intermediate_size = 16;
  EXPECT_NE(message(wide, f.dir).find("tensor layers.0.mlp.gate_proj.weight is [12, 16] but the model"), std::string::npos)
      << message(wide, f.dir);
  GptConfig deeper = c;
  deeper.n_layer = 2;
  EXPECT_NE(message(deeper, f.dir).find("has no tensor model.layers.1.input_layernorm.weight (nor layers.1.input_layernorm.weight)"),
            std::string::npos)
      << message(deeper, f.dir);
  // A config.json beside the weights must describe the model they are read into.
  nlohmann::json config = {{"architectures", {"LlamaForCausalLM"}},
                           {"vocab_size", 16},
                           {"hidden_size", 16},
                           {"intermediate_size", 12},
                           {"num_hidden_layers", 1},
                           {"num_attention_heads", 4},
                           {"num_key_value_heads", 2},
                           {"rms_norm_eps", 1e-5},
                           {"rope_theta", 10000.0},
                           {"tie_word_embeddings", false}};
  std::ofstream(f.dir + "/config.json") << config.dump();
  EXPECT_NO_THROW(check_hf_config(c, f.dir));
  config["rope_theta"] = 500000.0;
  config["num_key_value_heads"] = 4;
  std::ofstream(f.dir + "/config.json") << config.dump();
  try {
    check_hf_config(c, f.dir);
    ADD_FAILURE() << "a config.json of another model was taken";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("model.n_kv_head 2 where the file has 4"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("model.rope_theta 10000 where the file has 500000"), std::string::npos) << e.what();
  }
  fs::remove(f.dir + "/config.json");
  fs::remove(f.dir + "/b.safetensors");
  EXPECT_NE(message(c, f.dir).find("names the shard b.safetensors, which is not in"), std::string::npos) << message(c, f.dir);
  fs::remove(f.dir + "/" + std::string(kHfIndexName));
  EXPECT_NE(message(c, f.dir).find("holds neither model.safetensors nor model.safetensors.index.json"), std::string::npos)
      << message(c, f.dir);
  fs::remove_all(f.dir);
}

}  // namespace
}  // namespace zeroth
