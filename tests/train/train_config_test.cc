// The training config: valid configs (real-world DeepSpeed files with "auto", aliases, missing
// batch keys) against what they resolve to. Invalid ones are in invalid_config_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "tests/train/config_fixture.h"
#include "engine/config/deepspeed_keys.h"
#include "engine/plan/plan.h"
#include "train/config/train_config.h"
#include "train/trainer.h"  // check_data

namespace zeroth {
namespace {

using namespace config_fixture;

// The Hugging Face integration's typical ds_config, verbatim apart from the model/data/run sections.
TEST(TrainConfig, HuggingFaceAutoConfigResolves) {
  const json j = json::parse(R"({
    "fp16": {"enabled": "auto", "loss_scale": 0, "loss_scale_window": 1000, "initial_scale_power": 16, "hysteresis": 2, "min_loss_scale": 1},
    "bf16": {"enabled": "auto"},
    "optimizer": {"type": "AdamW", "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"}},
    "scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": "auto", "warmup_max_lr": "auto", "warmup_num_steps": "auto", "total_num_steps": "auto"}},
    "zero_optimization": {"stage": 3, "overlap_comm": true, "contiguous_gradients": true, "sub_group_size": 1e9,
      "reduce_bucket_size": "auto", "stage3_prefetch_bucket_size": "auto", "stage3_param_persistence_threshold": "auto",
      "stage3_max_live_parameters": 1e9, "stage3_max_reuse_distance": 1e9, "stage3_gather_16bit_weights_on_model_save": false},
    "gradient_accumulation_steps": "auto", "gradient_clipping": "auto", "steps_per_print": 2000,
    "train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto", "wall_clock_breakdown": false,
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "seq_len": 8}, "run": {"steps": 50, "world_size": 2}})");
  const auto c = TrainConfig::from_json(j);
  EXPECT_EQ(c.micro_batch_size, 8);  // HF per_device_train_batch_size
  EXPECT_EQ(c.engine.gradient_accumulation_steps, 1);
  EXPECT_EQ(c.train_batch_size, 16);
  EXPECT_EQ(c.engine.gradient_clipping, 1.0);
  EXPECT_EQ(c.engine.compute_dtype, DType::f32);  // fp16/bf16 "auto" follow the trainer's flags: off
  EXPECT_DOUBLE_EQ(c.engine.optimizer.lr, 5e-5);
  EXPECT_DOUBLE_EQ(c.engine.optimizer.beta2, 0.999);
  EXPECT_EQ(c.engine.schedule.kind, ScheduleKind::warmup_decay);
  EXPECT_EQ(c.engine.schedule.total_num_steps, 50);
  EXPECT_DOUBLE_EQ(c.engine.schedule.warmup_max_lr, 5e-5);
  EXPECT_EQ(c.engine.schedule.warmup_num_steps, 0);  // HF's default warmup_steps; DeepSpeed raises it to 2
  EXPECT_EQ(c.engine.schedule.warmup_min_lr, 0.0);
  EXPECT_EQ(c.engine.zero.stage, 3);
  EXPECT_EQ(c.engine.zero.reduce_bucket_size, 256u);                  // hidden^2
  EXPECT_EQ(c.engine.zero.stage3_prefetch_bucket_size, 230u);         // 0.9 hidden^2
  EXPECT_EQ(c.engine.zero.stage3_param_persistence_threshold, 160u);  // 10 hidden
  EXPECT_EQ(c.steps_per_print, 2000);
  // "auto" left in DeepSpeed's own sections takes DeepSpeed's default, as its config models drop it.
  const auto dropped = TrainConfig::from_json(with(
      j,
      R"({"zero_optimization": {"allgather_bucket_size": "auto", "overlap_comm": "auto", "stage3_gather_16bit_weights_on_model_save": "auto"}, "fp16": {"loss_scale_window": "auto"}})"));
  EXPECT_EQ(dropped.engine.zero.allgather_bucket_size, 500'000'000u);
  EXPECT_TRUE(dropped.engine.zero.overlap_comm);  // stage 3's default
  EXPECT_EQ(dropped.engine.loss_scaler.loss_scale_window, 1000);
  // reduce_bucket_size 0 is DeepSpeed's "each gradient on its own": here one bucket per block.
  EXPECT_EQ(TrainConfig::from_json(with(j, R"({"zero_optimization": {"reduce_bucket_size": 0}})")).engine.zero.reduce_bucket_size, 0u);
  EXPECT_EQ(c.resolved["train_batch_size"], 16);
  EXPECT_EQ(c.resolved["optimizer"]["params"]["lr"], 5e-5);
  // contiguous_gradients asks for what zeroth always does: accepted, and named once at start.
  ASSERT_EQ(c.no_effect.size(), 1u);
  EXPECT_EQ(c.no_effect[0], "zero_optimization.contiguous_gradients: zeroth's gradients always live in one flat buffer per block");
}

// DeepSpeed ignores top-level keys it does not know and reads its bf16 section by hand (public
// configs carry `cuda_visible_devices`, `comms_config`, bf16's `hysteresis`): accepted and named
// once as ignored (in the keys' sorted order); a key within a typo of a known one is refused (Invalid
// below).
TEST(TrainConfig, KeysDeepSpeedIgnoresAreNamedOnceAsIgnored) {
  const auto c = TrainConfig::from_json(
      with(base(),
           R"({"cuda_visible_devices": "0,1", "comms_config": {"verbose": false}, "bf16": {"enabled": true, "hysteresis": 2}})"));
  EXPECT_EQ(c.engine.compute_dtype, DType::bf16);
  const std::vector<std::string> want = {
      "comms_config: neither DeepSpeed nor zeroth reads it; ignored, as DeepSpeed ignores it",
      "cuda_visible_devices: neither DeepSpeed nor zeroth reads it; ignored, as DeepSpeed ignores it",
      "bf16.hysteresis: neither DeepSpeed nor zeroth reads it; ignored, as DeepSpeed ignores it"};
  EXPECT_EQ(c.no_effect, want);
}

struct BatchCase {
  const char* patch;
  int world;
  int64_t tbs, mb, gas;
};
void PrintTo(const BatchCase& c, std::ostream* os) { *os << c.patch << " on " << c.world << " ranks"; }

class BatchRule : public ::testing::TestWithParam<BatchCase> {};

TEST_P(BatchRule, AnyTwoGiveTheThird) {
  const auto& p = GetParam();
  json j = json::parse(R"({"model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "seq_len": 8}})");
  j.merge_patch(json::parse(p.patch));
  j["run"]["world_size"] = p.world;
  const auto c = TrainConfig::from_json(j);
  EXPECT_EQ(c.train_batch_size, p.tbs);
  EXPECT_EQ(c.micro_batch_size, p.mb);
  EXPECT_EQ(c.engine.gradient_accumulation_steps, p.gas);
}

INSTANTIATE_TEST_SUITE_P(
    Table, BatchRule,
    ::testing::Values(BatchCase{R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})",
                                4, 32, 4, 2},
                      BatchCase{R"({"train_batch_size": 32, "train_micro_batch_size_per_gpu": 4})", 4, 32, 4, 2},
                      BatchCase{R"({"train_batch_size": 32, "gradient_accumulation_steps": 4})", 4, 32, 2, 4},
                      BatchCase{R"({"train_micro_batch_size_per_gpu": 3, "gradient_accumulation_steps": 5})", 2, 30, 3, 5},
                      BatchCase{R"({"train_batch_size": 12})", 3, 12, 4, 1},
                      BatchCase{R"({"train_micro_batch_size_per_gpu": 6})", 2, 12, 6, 1}));

// model.trainable / model.frozen resolve Hugging Face name globs to whole frozen blocks, which the
// block specs carry to the engine.
TEST(TrainConfig, FrozenPatternsFreezeWholeBlocks) {
  auto frozen_of = [](const char* patch) {
    const TrainConfig c = TrainConfig::from_json(with(base(), patch));
    std::vector<std::string> out;
    for (const auto& spec : Gpt::block_specs(c.model))
      if (spec.frozen) out.push_back(spec.name);
    EXPECT_EQ(out, c.model.frozen_blocks);
    return out;
  };
  EXPECT_EQ(frozen_of(R"({"model": {"frozen": ["transformer.w*"]}})"), std::vector<std::string>{"embed"});
  EXPECT_EQ(frozen_of(R"({"model": {"trainable": ["transformer.h.0.*"]}})"), (std::vector<std::string>{"embed", "ln_f"}));
  EXPECT_EQ(frozen_of(R"({"model": {"trainable": ["transformer.h.*", "transformer.ln_f.*"], "frozen": ["transformer.ln_f.*"]}})"),
            (std::vector<std::string>{"embed", "ln_f"}));
  EXPECT_TRUE(frozen_of(R"({"model": {"n_layer": 2}})").empty());
}

// Weight decay follows a stated rule: by default Hugging Face Trainer's (none on biases and
// LayerNorm parameters), replaced by model.no_weight_decay's roles and name globs; the plan's
// update spans carry it.
TEST(TrainConfig, WeightDecayExclusionsAreARule) {
  auto decay_of = [](const TrainConfig& c) {
    std::map<std::string, bool> out;
    for (const auto& spec : Gpt::block_specs(c.model)) {
      for (const auto& p : spec.params) out[spec.name + "." + p.name] = c.engine.no_weight_decay.decays(spec.name, p);
    }
    return out;
  };
  const auto dflt = decay_of(TrainConfig::from_json(base()));
  EXPECT_TRUE(dflt.at("embed.wte"));
  EXPECT_TRUE(dflt.at("h.0.attn.c_attn.weight"));
  EXPECT_FALSE(dflt.at("h.0.attn.c_attn.bias"));
  EXPECT_FALSE(dflt.at("h.0.ln_1.weight"));
  EXPECT_FALSE(dflt.at("ln_f.bias"));
  const auto custom = TrainConfig::from_json(with(base(), R"({"model": {"no_weight_decay": ["norm", "embedding", "h.*.attn.*"]}})"));
  const auto rule = decay_of(custom);
  EXPECT_FALSE(rule.at("embed.wpe"));
  EXPECT_FALSE(rule.at("h.0.attn.c_proj.weight"));
  EXPECT_FALSE(rule.at("h.0.ln_2.bias"));
  EXPECT_TRUE(rule.at("h.0.mlp.c_fc.bias")) << "biases decay once \"bias\" is not in the list";
  EXPECT_TRUE(rule.at("h.0.mlp.c_proj.weight"));
  // The plan's update spans follow the rule, element by element.
  const auto specs = Gpt::block_specs(custom.model);
  const Plan plan = make_plan(specs, Gpt::schedule(custom.model), custom.engine, 1, 0);
  size_t checked = 0;
  for (const auto& group : plan.sub_groups) {
    for (const auto& span : group) {
      const auto& blk = plan.blocks[span.block];
      const auto& params = specs[span.block].params;
      for (size_t i = 0; i < params.size(); ++i) {
        const size_t lo = std::max(span.lo, blk.param_offsets[i]), hi = std::min(span.hi, blk.param_offsets[i] + params[i].numel());
        if (lo >= hi) continue;
        EXPECT_EQ(span.decay, rule.at(specs[span.block].name + "." + params[i].name)) << params[i].name;
        checked += hi - lo;
      }
    }
  }
  size_t total = 0;
  for (const auto& spec : specs) {
    for (const auto& p : spec.params) total += p.numel();
  }
  EXPECT_EQ(checked, total);
}

// The guide's table of keys with no effect is the code's table: the same rows, with their
// reasons, in the code's order.
TEST(TrainConfig, TheGuideListsEveryKeyWithoutEffect) {
  std::ifstream in(std::string(ZEROTH_CONFIGS_DIR) + "/../docs/guide.md");
  ASSERT_TRUE(in) << "docs/guide.md not found";
  const std::string guide((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<std::string> expected;
  for (const auto& k : deepspeed_keys())
    if (k.treatment == KeyTreatment::no_effect) expected.push_back("| `" + std::string(k.path) + "` | " + std::string(k.text) + " |");
  // The table's rows: after its header and the separator, up to the first line that is not a row.
  const size_t header = guide.find("| key | why it changes nothing in zeroth |\n|---|---|\n");
  ASSERT_NE(header, std::string::npos) << "docs/guide.md has no table of keys without effect";
  std::vector<std::string> table;
  for (size_t at = guide.find("|---|---|\n", header) + 10; at < guide.size() && guide[at] == '|';) {
    const size_t end = guide.find('\n', at);
    table.push_back(guide.substr(at, end - at));
    at = end + 1;
  }
  EXPECT_EQ(table, expected) << "docs/guide.md's table of keys without effect differs from engine/config/deepspeed_keys.cc's";
}

TEST(TrainConfig, OverridesSetNestedKeysAndParseValues) {
  json j = base();
  apply_override(j, "zero_optimization.stage=2");
  apply_override(j, "bf16.enabled=true");
  apply_override(j, "run.name=demo");
  apply_override(j, "optimizer.params.betas=[0.8,0.9]");
  EXPECT_EQ(j["zero_optimization"]["stage"], 2);
  EXPECT_EQ(j["bf16"]["enabled"], true);
  EXPECT_EQ(j["run"]["name"], "demo");
  EXPECT_EQ(j["optimizer"]["params"]["betas"][1], 0.9);
  try {
    apply_override(j, "run.name.first=x");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_EQ(message(e), "--set \"run.name.first=x\": run.name is \"demo\", not an object");
  }
  EXPECT_THROW(apply_override(j, "novalue"), ConfigError);
  // Valid JSON that a double cannot hold is an error, not an exception of the JSON library's.
  try {
    apply_override(j, "optimizer.params.lr=1e999");
    FAIL();
  } catch (const ConfigError& e) {
    EXPECT_NE(message(e).find("--set \"optimizer.params.lr=1e999\": the value cannot be read"), std::string::npos) << message(e);
  }
}

// Ulysses from parallel.sequence or DeepSpeed's sequence_parallel_size; the batch counts the ranks
// that read different samples (8 ranks in groups of 4: 2), and the resolved config keeps it.
TEST(TrainConfig, SequenceParallelSizeSharesSamplesAndTheBatchCountsTheGroups) {
  for (const char* patch : {R"({"parallel": {"sequence": 4}, "run": {"world_size": 8}, "model": {"n_head": 4}})",
                            R"({"sequence_parallel_size": 4, "run": {"world_size": 8}, "model": {"n_head": 4}})"}) {
    const TrainConfig t = TrainConfig::from_json(with(base(), patch));
    EXPECT_EQ(t.parallel.sequence, 4) << patch;
    EXPECT_EQ(t.data_parallel(), 8);
    EXPECT_EQ(t.sample_parallel(), 2);
    EXPECT_EQ(t.train_batch_size, 2 * 2);  // 2 a rank's micro-batch x 2 sample groups
    EXPECT_EQ(t.part(0, 0, 6).sq_rank, 2);
    EXPECT_EQ(t.part(0, 0, 6).sq_ranks, 4);
    EXPECT_EQ(TrainConfig::from_json(t.resolved).parallel.sequence, 4);
  }
}

// model.tiled_mlp: off unless given; true takes tiles of n_embd rows, a count its rows; the
// resolved config reads back to the same tiles; anything else is refused naming the choices.
TEST(TrainConfig, TiledMlpTakesTilesOfTheHiddenWidthOrACount) {
  auto rows = [](const char* extra) { return TrainConfig::from_json(with(base(), extra)).model.mlp_tile_rows; };
  EXPECT_EQ(rows("{}"), 0);
  EXPECT_EQ(rows(R"({"model": {"n_embd": 48, "tiled_mlp": true}})"), 48);
  EXPECT_EQ(rows(R"({"model": {"tiled_mlp": 100}})"), 100);
  EXPECT_EQ(rows(R"({"model": {"tiled_mlp": false}})"), 0);
  const TrainConfig given = TrainConfig::from_json(with(base(), R"({"model": {"tiled_mlp": 100}})"));
  EXPECT_EQ(TrainConfig::from_json(given.resolved).model.mlp_tile_rows, 100);
  for (const char* bad : {R"({"model": {"tiled_mlp": 0}})", R"({"model": {"tiled_mlp": -3}})", R"({"model": {"tiled_mlp": "yes"}})"}) {
    try {
      TrainConfig::from_json(with(base(), bad));
      ADD_FAILURE() << bad << " was taken";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("model.tiled_mlp"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("rows per tile"), std::string::npos) << e.what();
    }
  }
}

// model.chunked_loss: unset, on with activation checkpointing (from either section that turns it
// on) at the vocabulary's size of chunk; true, false or a count of tokens when given.
TEST(TrainConfig, ChunkedLossFollowsCheckpointingUnlessGiven) {
  auto rows = [](const char* extra) { return TrainConfig::from_json(with(base(), extra)).model.loss_chunk_rows; };
  EXPECT_EQ(rows("{}"), 0);
  EXPECT_EQ(rows(R"({"model": {"vocab_size": 50257}, "data": {"vocab_size": 50257}, "activation_checkpointing": {}})"), 320);
  EXPECT_EQ(rows(R"({"model": {"activation_checkpointing": true, "vocab_size": 128256}, "data": {"vocab_size": 256}})"), 128);
  EXPECT_EQ(
      rows(R"({"model": {"n_layer": 2}, "pipeline": {"stages": 2, "activation_checkpoint_interval": 1}, "run": {"world_size": 2}})"),
      TrainConfig::from_json(base()).model.auto_loss_chunk_rows());
  EXPECT_EQ(rows(R"({"model": {"activation_checkpointing": true, "chunked_loss": false}})"), 0);
  EXPECT_EQ(rows(R"({"model": {"chunked_loss": 100}})"), 100);
  EXPECT_EQ(rows(R"({"model": {"vocab_size": 32000, "chunked_loss": true}, "data": {"vocab_size": 256}})"), 512);
  // Sized to a rank's slice of the vocabulary: 25129 of 50257 on each of 2 tensor-parallel ranks.
  EXPECT_EQ(rows(R"({"model": {"vocab_size": 50257, "n_head": 4, "chunked_loss": true}, "data": {"vocab_size": 256},
                     "parallel": {"tensor": 2}, "run": {"world_size": 2}})"),
            640);
  // The resolved config (what a checkpoint keeps) reads back to the same chunks.
  const TrainConfig given = TrainConfig::from_json(with(base(), R"({"model": {"chunked_loss": 100}})"));
  EXPECT_EQ(given.resolved["model"]["chunked_loss"], 100);
  EXPECT_EQ(TrainConfig::from_json(given.resolved).model.loss_chunk_rows, 100);
  EXPECT_EQ(TrainConfig::from_json(base()).resolved["model"]["chunked_loss"], false);
  for (const char* bad : {R"({"model": {"chunked_loss": 0}})", R"({"model": {"chunked_loss": -3}})",
                          R"({"model": {"chunked_loss": "yes"}})", R"({"model": {"chunked_loss": 1.5}})"}) {
    try {
      TrainConfig::from_json(with(base(), bad));
      ADD_FAILURE() << bad << " was accepted";
    } catch (const ConfigError& e) {
      EXPECT_NE(message(e).find("model.chunked_loss"), std::string::npos) << message(e);
      EXPECT_NE(message(e).find("true (chunks sized to the vocabulary), false, or a count of tokens per chunk"), std::string::npos)
          << message(e);
    }
  }
}

TEST(TrainConfig, DefaultsAndAliases) {
  const auto c = TrainConfig::from_json(
      with(base(), R"({"bfloat16": {"enabled": true}, "activation_checkpointing": {}, "communication_data_type": "bf16"})"));
  EXPECT_EQ(c.engine.compute_dtype, DType::bf16);
  EXPECT_EQ(c.engine.communication_dtype, DType::bf16);
  EXPECT_TRUE(c.model.activation_checkpointing);  // the DeepSpeed section turns it on
  EXPECT_FALSE(c.model.cpu_checkpointing);
  EXPECT_FALSE(c.engine.zero.gather_16bit_weights_on_model_save);
  EXPECT_TRUE(
      TrainConfig::from_json(with(base(), R"({"zero_optimization": {"stage": 3, "stage3_gather_fp16_weights_on_model_save": true}})"))
          .engine.zero.gather_16bit_weights_on_model_save);
  EXPECT_TRUE(
      TrainConfig::from_json(with(base(), R"({"activation_checkpointing": {"cpu_checkpointing": true}})")).model.cpu_checkpointing);
  EXPECT_EQ(c.steps_per_print, 10);
  EXPECT_EQ(c.data.format, DataFormat::synthetic);
  EXPECT_EQ(c.model.vocab_size, 256);
  EXPECT_EQ(c.run.output_dir, "runs/run");
  EXPECT_EQ(c.engine.zero.stage, 0);
  // communication_data_type defaults to the gradients' dtype, as DeepSpeed's engine resolves it.
  for (const auto& [patch, want] :
       std::vector<std::pair<const char*, DType>>{{R"({"bf16": {"enabled": true}})", DType::bf16},
                                                  {R"({"fp16": {"enabled": true}})", DType::f16},
                                                  {R"({})", DType::f32},
                                                  {R"({"bf16": {"enabled": true}, "communication_data_type": "fp32"})", DType::f32}}) {
    EXPECT_EQ(TrainConfig::from_json(with(base(), patch)).engine.communication_dtype, want) << patch;
  }
  const auto p = TrainConfig::from_json(json::parse(
      R"({"train_batch_size": 8, "model": {"preset": "gpt2-124m", "seq_len": 256}, "data": {"format": "bin", "train": "x.bin"}})"));
  EXPECT_EQ(p.model.n_layer, 12);
  EXPECT_EQ(p.model.seq_len, 256);
  EXPECT_EQ(p.model.vocab_size, 50257);
  EXPECT_NEAR(static_cast<double>(p.model.num_parameters()), 123.85e6, 0.01e6);
}

// A public DeepSpeed config's batch on the default synthetic data: its micro-batch of 256 on 4
// ranks takes 1,024 windows a step, more than the default 1 Mi tokens hold at 512 tokens a
// window, so the data grows to 8 steps of windows beside the held-out tenth, and the run's data
// opens with that batch; a config that gives data.tokens keeps them.
TEST(TrainConfig, DefaultSyntheticDataHoldsAnyBatch) {
  const json j = json::parse(R"({"train_micro_batch_size_per_gpu": 256, "fp16": {"enabled": true, "auto_cast": true},
    "model": {"n_layer": 1, "n_head": 2, "n_embd": 16, "seq_len": 512}, "run": {"world_size": 4}})");
  const auto c = TrainConfig::from_json(j);
  const int64_t window = 513, steps_of_windows = 8 * 1024 * window;
  EXPECT_EQ(c.data.synthetic_tokens, static_cast<int64_t>(std::ceil(steps_of_windows / 0.9)) + window);
  EXPECT_NO_THROW(check_data(c));
  EXPECT_EQ(TrainConfig::from_json(with(base(), R"({})")).data.synthetic_tokens, 1 << 20);
  EXPECT_EQ(TrainConfig::from_json(with(j, R"({"data": {"tokens": 4096}})")).data.synthetic_tokens, 4096);
}


// Every example in configs/ resolves (the README's table lists them).
TEST(TrainConfig, ExampleConfigsResolve) {
  int n = 0;
  for (const auto& e : std::filesystem::directory_iterator(ZEROTH_CONFIGS_DIR)) {
    if (e.path().extension() != ".json") continue;
    SCOPED_TRACE(e.path().string());
    json j = read_config_file(e.path().string());
    // A vocabulary the README's setup trains (tools/fortunes-vocab.sh), named from the config's folder.
    if (j["data"].contains("tokenizer"))
      j["data"]["tokenizer"] = std::string(ZEROTH_CONFIGS_DIR) + "/" + j["data"]["tokenizer"].get<std::string>();
    const auto c = TrainConfig::from_json(j);
    EXPECT_GT(c.run.steps, 0);
    ++n;
  }
  EXPECT_GE(n, 8);
}

}  // namespace
}  // namespace zeroth
