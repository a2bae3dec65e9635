// LoRA against PyTorch (tests/reference/lora_reference.py, written from LoRA's and the
// architectures' definitions, not from zeroth's code): a GPT-2, a Llama and a Mixtral (each
// expert's MLP adapted, with the auxiliary losses) with adapters on every linear layer of their
// blocks train 10 steps of AdamW at every ZeRO stage and data-parallel size, with offload, tensor,
// pipeline and expert parallelism, in f32 and in bf16; each step's loss and the final adapters meet
// the reference's, and every base weight stays bit for bit as it started.
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "tests/engine/gpt_grid.h"
#include "tests/test_util.h"
#include "train/data.h"

namespace zeroth {
namespace {

using testing::GridCase;
using testing::GridResult;

constexpr int kLoraSteps = 10;

GptConfig lora_model(const std::string& arch) {
  GptConfig c;
  c.vocab_size = 64, c.seq_len = 16, c.n_layer = 2;
  if (arch == "gpt2") {
    c.n_head = 2, c.n_embd = 32;
  } else {
    c.architecture = Architecture::llama;
    c.n_head = 4, c.n_kv_head = 2, c.n_embd = 32, c.intermediate_size = 48, c.tie_word_embeddings = false;
  }
  if (arch == "mixtral") {
    // Every layer's MLP 4 SwiGLU experts, top 2 renormalised, dropless, with the load-balancing and
    // z losses in the gradient: the experts' adapters meet the router's gradient path too.
    c.moe.num_experts = 4, c.moe.top_k = 2, c.moe.drop_tokens = false, c.moe.min_capacity = 0, c.moe.normalize_top_k = true;
    c.moe.aux_loss_coef = 0.02, c.moe.z_loss_coef = 1e-3, c.moe.intermediate_size = 24;
  }
  c.lora.r = 4, c.lora.alpha = 8, c.lora.target_modules = {"all-linear"};
  return c;
}

GridCase lora_case(const std::string& arch, int stage, int dp, bool rslora = false, double clipping = 0, DType compute = DType::f32) {
  GridCase k;
  k.model = lora_model(arch);
  k.model.lora.use_rslora = rslora;
  k.stage = stage, k.dp = dp, k.micro = 2;
  k.clipping = clipping;
  k.compute = compute;
  k.constant_lr = true;
  return k;
}

struct Reference {
  GridResult start;                                    // every block's starting values
  std::vector<float> losses;                           // per step
  std::vector<double> grad_norms;                      // per step, the adapters' gradients' before clipping
  std::map<std::string, std::vector<float>> adapters;  // "<block>.<param>" after the last step
};

// The reference's run of `arch` from the engine's own starting values (the seed and the names make
// them) over the global batches every layout trains on; in bf16, micro-batches of `micro_rows` rows
// round their gradients (the engine's start then holds the base weights in bf16).
const Reference& reference(const std::string& arch, bool rslora, double clipping, DType compute, int micro_rows) {
  static std::map<std::string, Reference> cache;
  const bool narrow = compute == DType::bf16;
  // The micro-batches matter where they round (bf16) or make their own auxiliary losses (experts).
  const bool split = narrow || lora_model(arch).moe.enabled();
  const std::string key = arch + (rslora ? "+rslora" : "") + "/" + std::to_string(clipping) + (narrow ? "/bf16" : "") +
                          (split ? "/rows " + std::to_string(micro_rows) : "");
  if (cache.contains(key)) return cache[key];
  Reference& ref = cache[key];
  GridCase k = lora_case(arch, 0, 1, rslora, clipping, compute);
  ref.start = testing::train_grid(k, nullptr, {.first = 0, .last = 0, .load = {}, .save = {}});
  // PEFT's start: B zero, A within Kaiming-uniform's +-1/sqrt(in) (and not all zero).
  for (const auto& spec : Gpt::block_specs(k.model)) {
    if (!spec.name.ends_with(".lora")) continue;
    const auto& values = ref.start.weights.at(spec.name);
    size_t at = 0;
    for (const auto& p : spec.params) {
      double largest = 0;
      for (size_t i = at; i < at + p.numel(); ++i) largest = std::max(largest, std::abs(static_cast<double>(values[i])));
      const double bound = 1.0 / std::sqrt(static_cast<double>(p.shape[1]));
      if (p.name.ends_with("lora_B.weight")) {
        EXPECT_EQ(largest, 0.0) << spec.name << "." << p.name;
      } else {
        EXPECT_LE(largest, bound) << spec.name << "." << p.name;
        EXPECT_GT(largest, bound / 2) << spec.name << "." << p.name;
      }
      at += p.numel();
    }
  }
  const std::string dir = fmt::format("{}/zeroth-lora-{}-{}", ::testing::TempDir(), arch, ::getpid());
  std::filesystem::create_directories(dir);
  SafeTensors weights;
  weights.metadata["format"] = "pt";
  for (const auto& spec : Gpt::block_specs(k.model)) {
    const auto& values = ref.start.weights.at(spec.name);
    size_t at = 0;
    for (const auto& p : spec.params) {
      SafeTensor t{"F32", p.shape, std::vector<char>(p.numel() * sizeof(float))};
      std::memcpy(t.data.data(), values.data() + at, t.data.size());
      weights.tensors[spec.name + "." + p.name] = std::move(t);
      at += p.numel();
    }
  }
  write_safetensors(dir + "/weights.safetensors", weights);
  const GptConfig& gc = k.model;
  const TokenData data = TokenData::synthetic(gc.vocab_size, 1 << 14, 3);
  Loader loader(data, gc.seq_len, testing::kGlobalBatch, 1, 1, 0, 11);
  std::vector<int32_t> tokens(static_cast<size_t>(testing::kGlobalBatch) * gc.seq_len), targets(tokens.size());
  nlohmann::json steps = nlohmann::json::array();
  auto rows = [&](const std::vector<int32_t>& v) {
    nlohmann::json j = nlohmann::json::array();
    for (int b = 0; b < testing::kGlobalBatch; ++b)
      j.push_back(std::vector<int32_t>(v.begin() + b * gc.seq_len, v.begin() + (b + 1) * gc.seq_len));
    return j;
  };
  for (int s = 0; s < kLoraSteps; ++s) {
    loader.batch(s, 0, tokens.data(), targets.data());
    steps.push_back({{"tokens", rows(tokens)}, {"targets", rows(targets)}});
  }
  const EngineConfig ec = testing::grid_engine_config(0, 1);
  nlohmann::json job = {{"config",
                         {{"architecture", gc.llama() ? "llama" : "gpt2"},
                          {"n_head", gc.n_head},
                          {"n_kv_head", gc.kv_heads()},
                          {"head_dim", gc.head_size()},
                          {"rope_theta", gc.rope_theta},
                          {"rms_norm_eps", gc.norm_eps},
                          {"tie_word_embeddings", gc.tie_word_embeddings}}},
                        {"lora", {{"r", gc.lora.r}, {"alpha", gc.lora.alpha}, {"use_rslora", gc.lora.use_rslora}}},
                        {"optimizer",
                         {{"lr", ec.optimizer.lr},
                          {"betas", {ec.optimizer.beta1, ec.optimizer.beta2}},
                          {"eps", ec.optimizer.eps},
                          {"weight_decay", ec.optimizer.weight_decay}}},
                        {"clipping", clipping},
                        {"steps", steps}};
  if (gc.moe.enabled()) {
    const MoeConfig& m = gc.moe;
    job["config"]["moe"] = {{"num_experts", m.num_experts},
                            {"top_k", m.top_k},
                            {"capacity_factor", m.capacity_factor},
                            {"min_capacity", m.min_capacity},
                            {"drop_tokens", m.drop_tokens},
                            {"normalize_top_k", m.normalize_top_k},
                            {"aux_loss_coef", m.aux_loss_coef},
                            {"z_loss_coef", m.z_loss_coef},
                            {"every", m.every}};
  }
  job["bf16"] = narrow;
  job["rows"] = micro_rows;
  std::ofstream(dir + "/job.json") << job.dump();
  const std::string cmd =
      fmt::format("cd {0}/reference && /usr/bin/python3 lora_reference.py {1}/weights.safetensors {1}/job.json {1}/out.safetensors",
                  testing::test_data_dir(), dir);
  EXPECT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const SafeTensors out = read_safetensors(dir + "/out.safetensors");
  ref.losses = out.at("loss").as_f32();
  for (float v : out.at("grad_norm").as_f32()) ref.grad_norms.push_back(v);
  for (const auto& [name, t] : out.tensors)
    if (name.starts_with("final.")) ref.adapters[name.substr(6)] = t.as_f32();
  std::filesystem::remove_all(dir);
  return ref;
}

// Bounds on the largest relative difference: of a step's loss, of a step's gradient norm, and of
// each adapter tensor after the last step (relative to its largest value).
struct Bounds {
  double loss, grad_norm, adapters;
};

void expect_reference(const GridCase& k, const std::string& arch, const Bounds& bound) {
  const Reference& ref = reference(arch, k.model.lora.use_rslora, k.clipping, k.compute, testing::kGlobalBatch / (k.dp * k.micro));
  const GridResult got = testing::train_grid(k, nullptr, {.first = 0, .last = kLoraSteps, .load = {}, .save = {}});
  ASSERT_EQ(got.losses.size(), ref.losses.size());
  double loss_err = 0, norm_err = 0, worst = 0;
  for (size_t s = 0; s < ref.losses.size(); ++s) {
    loss_err = std::max(loss_err, std::abs(got.losses[s] - ref.losses[s]) / ref.losses[s]);
    EXPECT_NEAR(got.losses[s], ref.losses[s], bound.loss * ref.losses[s]) << "step " << s;
  }
  EXPECT_LT(ref.losses.back(), ref.losses.front());
  // The global norm is the adapters' alone: the frozen base's gradients are not made.
  ASSERT_EQ(got.grad_norms.size(), ref.grad_norms.size());
  size_t clipped = 0;
  for (size_t s = 0; s < ref.grad_norms.size(); ++s) {
    norm_err = std::max(norm_err, std::abs(got.grad_norms[s] - ref.grad_norms[s]) / ref.grad_norms[s]);
    EXPECT_NEAR(got.grad_norms[s], ref.grad_norms[s], bound.grad_norm * ref.grad_norms[s]) << "step " << s;
    clipped += k.clipping > 0 && ref.grad_norms[s] > k.clipping;
  }
  if (k.clipping > 0) {
    EXPECT_GT(clipped, 0u) << "no step was clipped: the case checks nothing of clipping";
  }
  size_t adapters = 0;
  for (const auto& spec : Gpt::block_specs(k.model)) {
    const auto& w = got.weights.at(spec.name);
    if (spec.frozen) {
      EXPECT_EQ(w, ref.start.weights.at(spec.name)) << spec.name << " is a base block but changed";
      continue;
    }
    size_t at = 0;
    for (const auto& p : spec.params) {
      const std::string name = spec.name + "." + p.name;
      const auto e = testing::compare(name, std::vector<float>(w.begin() + at, w.begin() + at + p.numel()), ref.adapters.at(name));
      EXPECT_LT(e.rel(), bound.adapters) << name << ": max |difference| " << e.max_abs << " of max |value| " << e.scale;
      worst = std::max(worst, e.rel());
      at += p.numel(), ++adapters;
    }
  }
  EXPECT_EQ(adapters, ref.adapters.size());
  std::printf("%s %s stage %d dp %d tp %d pp %d offload %s: loss %.4f -> %.4f (worst %.2g of the reference's), gradient norm worst "
              "%.2g, worst adapter %.3g\n",
              arch.c_str(), dtype_name(k.compute).data(), k.stage, k.dp, k.tp, k.pp,
              std::string(offload_device_name(k.offload)).c_str(), got.losses.front(), got.losses.back(), loss_err, norm_err, worst);
}

// The largest difference of a merged weight `got` (Hugging Face's layout: [out, in], or GPT-2's
// Conv1D [in, out] when `conv1d`) from W + scale B A in float64, W [out, in] at `start`.
double merge_error(const float* start, const std::vector<float>& A, const std::vector<float>& B, size_t out, size_t in, size_t r,
                   double scale, const std::vector<float>& got, bool conv1d) {
  double worst = 0;
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) {
      double w = start[o * in + i];
      for (size_t j = 0; j < r; ++j) w += scale * B[o * r + j] * A[j * in + i];
      worst = std::max(worst, std::abs(got[conv1d ? i * out + o : o * in + i] - w));
    }
  }
  return worst;
}

// The saved adapter holds the gathered tensors under PEFT's names: under ZeRO-3 at dp 4 it is the
// dp 1 run's adapter (within the f32 rounding of the reductions' order: 1e-5 of a tensor's largest
// value after 3 Adam steps), never a rank's shard; and
// the weights written beside it are the base plus scale B A, in Hugging Face's layout (GPT-2's
// Conv1D transposed), against a float64 merge made here from the adapter file.
TEST(LoraExport, AdapterUnderZero3AtDp4IsTheDp1AdapterAndTheMergeIsBasePlusScaleBA) {
  const std::string dir = fmt::format("{}/zeroth-lora-export-{}", ::testing::TempDir(), ::getpid());
  std::filesystem::remove_all(dir);
  auto run = [&](int stage, int dp, const std::string& out) {
    GridCase k = lora_case("gpt2", stage, dp);
    k.micro = 1;
    testing::train_grid(k, nullptr, {.first = 0, .last = 3, .load = {}, .save = {}}, [&](Engine& engine, const StageExport& groups) {
      save_lora_adapter(engine, k.model, out, DType::f32, groups, "base-model");
      save_gpt_weights(engine, k.model, out + "/model.safetensors", DType::f32, groups);
    });
  };
  run(3, 4, dir + "/dp4");
  run(0, 1, dir + "/dp1");
  const SafeTensors four = read_safetensors(dir + "/dp4/adapter_model.safetensors");
  const SafeTensors one = read_safetensors(dir + "/dp1/adapter_model.safetensors");
  const GptConfig gc = lora_model("gpt2");
  const auto names = Gpt::peft_params(gc);
  ASSERT_EQ(four.tensors.size(), names.size());
  EXPECT_TRUE(four.tensors.contains("base_model.model.transformer.h.0.attn.c_attn.lora_A.weight"));
  EXPECT_TRUE(four.tensors.contains("base_model.model.transformer.h.1.mlp.c_proj.lora_B.weight"));
  for (const auto& h : names) {
    const auto& t = four.at(h.name);
    EXPECT_EQ(t.shape, one.at(h.name).shape) << h.name;
    const auto e = testing::compare(h.name, t.as_f32(), one.at(h.name).as_f32());
    EXPECT_LT(e.rel(), 2e-5) << h.name << ": max |difference| " << e.max_abs;
    EXPECT_GT(e.scale, 0) << h.name << " is all zeros";
  }
  std::ifstream in(dir + "/dp4/adapter_config.json");
  const auto config = nlohmann::json::parse(in);
  EXPECT_EQ(config.at("peft_type"), "LORA");
  EXPECT_EQ(config.at("r"), gc.lora.r);
  EXPECT_EQ(config.at("lora_alpha"), gc.lora.alpha);
  EXPECT_EQ(config.at("base_model_name_or_path"), "base-model");
  EXPECT_EQ(config.at("target_modules"), (std::vector<std::string>{"attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj"}));
  // The merge: transformer.h.l.<module>.weight (Conv1D: [in, out]) = start + scale B A.
  const GridResult start = testing::train_grid(lora_case("gpt2", 0, 1), nullptr, {.first = 0, .last = 0, .load = {}, .save = {}});
  const SafeTensors merged = read_safetensors(dir + "/dp4/model.safetensors");
  const auto specs = Gpt::block_specs(gc);
  size_t checked = 0;
  for (const auto& spec : specs) {
    if (!spec.frozen || !spec.name.starts_with("h.")) continue;
    size_t at = 0;
    for (const auto& p : spec.params) {
      const std::string module = p.name.substr(0, p.name.size() - 7);  // "<module>.weight"
      const std::string a = "base_model.model.transformer." + spec.name + "." + module + ".lora_A.weight";
      if (!p.name.ends_with(".weight") || !four.tensors.contains(a)) {
        at += p.numel();
        continue;
      }
      const auto A = four.at(a).as_f32(), B = four.at(a.substr(0, a.size() - 13) + "lora_B.weight").as_f32();
      const size_t out = static_cast<size_t>(p.shape[0]), in = static_cast<size_t>(p.shape[1]), r = static_cast<size_t>(gc.lora.r);
      const auto got = merged.at("transformer." + spec.name + "." + p.name).as_f32();
      ASSERT_EQ(got.size(), out * in);
      const double worst = merge_error(start.weights.at(spec.name).data() + at, A, B, out, in, r, gc.lora.scale(), got, true);
      EXPECT_LT(worst, 1e-6) << spec.name << "." << p.name;
      ++checked, at += p.numel();
    }
  }
  EXPECT_EQ(checked, 8u);  // 4 modules x 2 layers
  std::filesystem::remove_all(dir);
}

// Mixtral's experts' adapters under ZeRO-3 with the experts shared out over 2 ranks: the saved
// adapter holds every expert's under PEFT's names (each rank's experts gathered, not one rank's),
// equal to the dp 1 run's within the f32 rounding of the reductions' order; and each expert's w1, w3
// and w2 written beside it are its start plus scale B A, against a float64 merge made here.
TEST(LoraExport, ExpertAdaptersUnderExpertParallelismAreEveryExpertsAndMergeIntoThem) {
  const std::string dir = fmt::format("{}/zeroth-lora-experts-{}", ::testing::TempDir(), ::getpid());
  std::filesystem::remove_all(dir);
  // Micro-batches of 4 rows in both: the auxiliary losses are each micro-batch's.
  auto run = [&](int stage, int dp, int ep, const std::string& out) {
    GridCase k = lora_case("mixtral", stage, dp);
    k.micro = 2 / dp, k.ep = ep;
    testing::train_grid(k, nullptr, {.first = 0, .last = 3, .load = {}, .save = {}}, [&](Engine& engine, const StageExport& groups) {
      save_lora_adapter(engine, k.model, out, DType::f32, groups, "base-model");
      save_gpt_weights(engine, k.model, out + "/model.safetensors", DType::f32, groups);
    });
  };
  run(3, 2, 2, dir + "/ep2");
  run(0, 1, 1, dir + "/dp1");
  const SafeTensors two = read_safetensors(dir + "/ep2/adapter_model.safetensors");
  const SafeTensors one = read_safetensors(dir + "/dp1/adapter_model.safetensors");
  const GptConfig gc = lora_model("mixtral");
  ASSERT_EQ(two.tensors.size(), Gpt::peft_params(gc).size());
  double worst = 0;
  // 2 layers x (4 attention modules and the 4 experts' 3) x (A, B).
  EXPECT_EQ(two.tensors.size(), 2u * (4 + 4 * 3) * 2);
  for (const auto& h : Gpt::peft_params(gc)) {
    ASSERT_EQ(two.at(h.name).shape, one.at(h.name).shape) << h.name;
    const auto e = testing::compare(h.name, two.at(h.name).as_f32(), one.at(h.name).as_f32());
    worst = std::max(worst, e.rel());
    EXPECT_LT(e.rel(), 5e-6) << h.name << ": max |difference| " << e.max_abs;  // 1.9e-6 measured
    EXPECT_GT(e.scale, 0) << h.name << " is all zeros";
  }
  std::printf("experts' adapters at ep 2 against dp 1: worst %.3g of a tensor's largest value\n", worst);
  const auto config = nlohmann::json::parse(std::ifstream(dir + "/ep2/adapter_config.json"));
  const auto modules = config.at("target_modules").get<std::vector<std::string>>();
  EXPECT_NE(std::find(modules.begin(), modules.end(), "block_sparse_moe.experts.3.w2"), modules.end());
  const GridResult start = testing::train_grid(lora_case("mixtral", 0, 1), nullptr, {.first = 0, .last = 0, .load = {}, .save = {}});
  const SafeTensors merged = read_safetensors(dir + "/ep2/model.safetensors");
  size_t checked = 0;
  for (const auto& spec : Gpt::block_specs(gc)) {
    if (!spec.name.ends_with(".experts")) continue;
    const std::string layer = spec.name.substr(0, spec.name.size() - 8);
    size_t at = 0;
    for (const auto& p : spec.params) {
      const std::string module = p.name.substr(0, p.name.size() - 7);  // "<module>.weight"
      const std::string a = "base_model.model.model." + layer + "." + module + ".lora_A.weight";
      const auto A = two.at(a).as_f32(), B = two.at(a.substr(0, a.size() - 13) + "lora_B.weight").as_f32();
      const size_t out = static_cast<size_t>(p.shape[0]), in = static_cast<size_t>(p.shape[1]), r = static_cast<size_t>(gc.lora.r);
      const auto got = merged.at("model." + layer + "." + p.name).as_f32();
      ASSERT_EQ(got.size(), out * in);
      const double worst = merge_error(start.weights.at(spec.name).data() + at, A, B, out, in, r, gc.lora.scale(), got, false);
      EXPECT_LT(worst, 1e-6) << spec.name << "." << p.name;
      ++checked, at += p.numel();
    }
  }
  EXPECT_EQ(checked, 24u);  // 3 modules x 4 experts x 2 layers
  if (!::testing::Test::HasFailure()) std::filesystem::remove_all(dir);
}

struct Layout {
  std::string arch;
  int stage, dp;
  int tp = 1, pp = 1;
  OffloadDevice offload = OffloadDevice::none;
  bool rslora = false;
  double clipping = 0;
  DType compute = DType::f32;
  int ep = 1;
};
void PrintTo(const Layout& l, std::ostream* os) {
  *os << l.arch << " " << dtype_name(l.compute) << ", ZeRO " << l.stage << ", dp " << l.dp << ", tp " << l.tp << ", pp " << l.pp
      << ", offload " << offload_device_name(l.offload);
}

class LoraAgainstPyTorch : public ::testing::TestWithParam<Layout> {};

TEST_P(LoraAgainstPyTorch, AdaptersAndLossesMatchTheBaseStaysPut) {
  const Layout& l = GetParam();
  GridCase k = lora_case(l.arch, l.stage, l.dp, l.rslora, l.clipping, l.compute);
  k.tp = l.tp, k.pp = l.pp, k.offload = l.offload, k.ep = l.ep;
  // f32: losses 1.7e-7 at worst, norms 6.5e-6, adapters 1.1e-5. Tensor parallelism's split products
  // sum in another order: 1.45e-5 of a tensor's largest value unclipped, 3.6e-5 with every step
  // clipped (the clip factor carries the norm's rounding into every element, and Adam's few steps
  // scale it up where a gradient is small). An expert's adapters (Mixtral) learn from its tokens
  // alone, few here: at dp 1 8.1e-6 as the dense ones, but with their gradients summed over 2 ranks
  // in another order 6.1e-5 (losses 1.2e-7, norms 1.9e-7 still).
  const bool experts = k.model.moe.enabled();
  if (l.compute == DType::f32) return expect_reference(k, l.arch, {2e-6, 1e-5, experts && l.dp > 1 ? 1.2e-4 : l.tp > 1 ? 5e-5 : 2e-5});
  // bf16 (the reference emulating zeroth's roundings, tests/reference/lora_reference.py): losses
  // 1.3e-5 at worst, norms 1.4e-3, adapters 8.0e-3 of a tensor's largest value; against the f32
  // reference from the same bf16 start, 1.5e-4, 1.8e-2 and 0.30, which these bounds refuse. Mixtral:
  // 9.7e-6, 2.1e-3 and 3.9e-2, against the f32 reference 8.7e-5, 4.3e-3 and 0.36.
  if (experts) return expect_reference(k, l.arch, {3e-5, 3e-3, 8e-2});
  expect_reference(k, l.arch, {3e-5, 3e-3, 2e-2});
}

INSTANTIATE_TEST_SUITE_P(
    Layouts, LoraAgainstPyTorch,
    ::testing::Values(Layout{"gpt2", 0, 1}, Layout{"gpt2", 0, 2}, Layout{"gpt2", 1, 2}, Layout{"gpt2", 2, 1}, Layout{"gpt2", 2, 2},
                      Layout{"gpt2", 3, 1}, Layout{"gpt2", 3, 2}, Layout{"gpt2", 3, 2, 1, 1, OffloadDevice::cpu},
                      Layout{"gpt2", 1, 1, 2}, Layout{"gpt2", 1, 1, 1, 2}, Layout{"llama", 0, 1}, Layout{"llama", 1, 2},
                      Layout{"llama", 2, 2}, Layout{"llama", 3, 2}, Layout{"llama", 3, 2, 1, 1, OffloadDevice::nvme},
                      Layout{"llama", 1, 1, 2}, Layout{"llama", 1, 1, 1, 2}, Layout{"llama", 2, 2, 1, 1, OffloadDevice::none, true},
                      Layout{"gpt2", 3, 2, 1, 1, OffloadDevice::none, false, 0.05},
                      Layout{"llama", 1, 2, 2, 1, OffloadDevice::none, false, 0.05},
                      Layout{"gpt2", 0, 1, 1, 1, OffloadDevice::none, false, 0, DType::bf16},
                      Layout{"gpt2", 1, 2, 1, 1, OffloadDevice::none, false, 0, DType::bf16},
                      Layout{"gpt2", 3, 2, 1, 1, OffloadDevice::cpu, false, 0, DType::bf16},
                      Layout{"llama", 0, 1, 1, 1, OffloadDevice::none, false, 0, DType::bf16},
                      Layout{"llama", 2, 2, 1, 1, OffloadDevice::none, false, 0, DType::bf16},
                      Layout{"llama", 3, 2, 1, 1, OffloadDevice::none, false, 0, DType::bf16}, Layout{"mixtral", 0, 1},
                      Layout{"mixtral", 2, 2}, Layout{"mixtral", 3, 2}, Layout{"mixtral", 1, 1, 1, 2},
                      Layout{"mixtral", 3, 2, 1, 1, OffloadDevice::none, false, 0, DType::f32, 2},
                      Layout{"mixtral", 3, 2, 1, 1, OffloadDevice::none, false, 0, DType::bf16}),
    [](const auto& info) {
  const Layout& l = info.param;
  return fmt::format("{}_zero{}_dp{}_tp{}_pp{}_{}{}{}{}{}", l.arch, l.stage, l.dp, l.tp, l.pp, offload_device_name(l.offload),
                     l.rslora ? "_rslora" : "", l.clipping > 0 ? "_clipped" : "", l.compute == DType::bf16 ? "_bf16" : "",
                     l.ep > 1 ? "_ep" + std::to_string(l.ep) : "");
    });

}  // namespace
}  // namespace zeroth
