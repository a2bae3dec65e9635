// A LoRA run's optimizer state against its closed form: 12 bytes for each adapter parameter (the
// fp32 master copy and Adam's two moments), r (in + out) parameters for each adapted linear of each
// layer, split over the data-parallel ranks. `zeroth estimate --config` says it for the published
// SmolLM-135M shape, where PEFT's default targets (q_proj, v_proj) at r 16 hold 0.69% of the full
// fine-tune's optimizer state; and a run's optimizer state is what its estimate says, to the byte.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/process_util.h"
#include "tests/tools/cli_runs.h"

namespace zeroth {
namespace {

using json = nlohmann::json;
using testing::run;
using testing::temp;
using testing::tiny;
using testing::write_config;

// The config's own row of `zeroth estimate --config CONFIG --json`.
json config_row(const std::string& config, const std::string& name) {
  json mine;
  testing::estimate_with(config, {}, name, mine);
  EXPECT_FALSE(mine.is_null()) << "no config row for " << config;
  return mine;
}

// A rank's optimizer bytes, wherever the row places them.
double optimizer_bytes(const json& row) {
  double sum = 0;
  for (const auto& [tier, tags] : row["tiers"].items()) sum += tags["optimizer"].get<double>();
  return sum;
}

// SmolLM-135M as published: 30 layers, hidden 576, 9 query heads and 3 key/value heads of 64,
// intermediate 1536; 134,515,008 parameters.
TEST(LoraMemory, TheOptimizerStateIsTwelveBytesAnAdapterParameter) {
  constexpr double kLayers = 30, kHidden = 576, kKv = 3 * 64, kMlp = 1536, kParams = 134515008, kRanks = 2, kR = 16;
  json j = json::parse(R"({
    "train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": true},
    "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}},
    "zero_optimization": {"stage": 1},
    "model": {"preset": "smollm-135m", "seq_len": 256},
    "run": {"world_size": 2, "steps": 1}})");
  const double full = optimizer_bytes(config_row(write_config("lora_memory_full", j), "lora_memory_full"));
  // The full fine-tune's state, the shard padded to the ranks' alignment (64 elements here).
  EXPECT_GE(full, 12 * kParams / kRanks);
  EXPECT_LE(full, 12 * (kParams / kRanks + 64));
  j["lora"] = {{"r", kR}, {"alpha", 32}};  // PEFT's default targets for Llama: q_proj, v_proj
  const double defaults = optimizer_bytes(config_row(write_config("lora_memory_qv", j), "lora_memory_qv"));
  const double qv = kLayers * kR * ((kHidden + kHidden) + (kHidden + kKv));
  EXPECT_EQ(defaults, 12 * qv / kRanks);
  j["lora"]["target_modules"] = {"all-linear"};
  const double all = optimizer_bytes(config_row(write_config("lora_memory_all", j), "lora_memory_all"));
  const double linear = kLayers * kR *
                        (2 * (kHidden + kHidden) + 2 * (kHidden + kKv) + 2 * (kHidden + kMlp) +
                         (kMlp + kHidden));  // q o, k v, gate up, down
  EXPECT_EQ(all, 12 * linear / kRanks);
  std::printf("optimizer state a rank: full fine-tune %.2f MiB; LoRA r 16 on q_proj, v_proj %.3f MiB (%.2f%%), on every linear %.2f "
              "MiB (%.2f%%)\n",
              full / (1 << 20), defaults / (1 << 20), 100 * defaults / full, all / (1 << 20), 100 * all / full);
  EXPECT_LE(defaults, 0.03 * full);
}

// The tiny GPT-2 with LoRA on c_attn (C -> 3C) at r 4, bf16 (so the adapters have fp32 master
// copies), ZeRO-2 over 2 ranks, the optimizer on the device: the run's optimizer peak is its
// estimate's, and that is the closed form.
TEST(LoraMemory, ARunAllocatesTheOptimizerStateItsEstimateSays) {
  const std::string name = "lora_memory_run";
  json j = tiny(name);
  j["zero_optimization"] = {{"stage", 2}};
  j["bf16"] = {{"enabled", true}};
  j["run"]["steps"] = 2;
  j["lora"] = {{"r", 4}, {"alpha", 8}};
  const std::string config = write_config(name, j);
  const json row = config_row(config, name);
  const auto r = run({ZEROTH_BIN, "train", config}, name);
  ASSERT_EQ(r.code, 0) << r.output;
  const json peak = r.metrics.back()["summary"]["device_peak_bytes"];
  const double C = j["model"]["n_embd"].get<double>(), layers = j["model"]["n_layer"].get<double>();
  EXPECT_EQ(row["tiers"]["device"]["optimizer"].get<double>(), 12 * layers * 4 * (C + 3 * C) / 2);
  EXPECT_EQ(peak["optimizer"].get<double>(), row["tiers"]["device"]["optimizer"].get<double>());
}

}  // namespace
}  // namespace zeroth
