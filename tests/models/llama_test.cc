// The Llama family (models/decoder with architecture llama) against an independent PyTorch Llama
// (tests/reference/llama_reference.py, written from the papers and Hugging Face's conventions):
// the logits, the loss and every parameter's gradient of one micro-batch, under Hugging Face's
// names, for grouped-query attention with Llama 3's rope scaling and an untied head ("llama"),
// Llama's attention_bias ("llama_bias"), q/k/v biases with a tied head ("qwen2"), and per-head q/k norms with a head wider than
// n_embd / n_head ("qwen3"); and mixtures of experts: Mixtral's top-2 renormalised dropless layers
// ("mixtral") and a Switch layer that drops what is past its experts' capacity ("switch"), their
// auxiliary losses' values and gradients included.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <utility>

#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "core/safetensors.h"
#include "models/decoder/gpt.h"
#include "tests/models/direct_host.h"
#include "tests/models/llama_case.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

const SafeTensors& reference() {
  static const SafeTensors ref = read_safetensors(testing::test_data_dir() + "/reference/llama_torch.safetensors");
  return ref;
}

GptConfig case_config(const std::string& name) {
  return testing::llama_case_config(nlohmann::json::parse(reference().metadata.at(name)));
}

using testing::rel_error;

struct Loaded {
  std::string name;
  GptConfig config;
  std::unique_ptr<Device> device;
  testing::DirectHost host;
  Gpt model;
  Loaded(const std::string& case_name, const std::string& spec, bool checkpointing = false, DType dtype = DType::f32,
         int loss_chunk_rows = 0)
      : name(case_name),
        config([&] {
          GptConfig c = case_config(case_name);
          c.activation_checkpointing = checkpointing;
          c.loss_chunk_rows = loss_chunk_rows;
          return c;
        }()),
        device(make_device(spec)),
        host(*device, dtype),
        model(host, config) {
    for (const auto& p : Gpt::hf_params(config)) host.set_param(p.block, p.param, reference().at(name + ".init." + p.name).as_f32());
  }
  float forward_backward() {
    const auto tokens = reference().at("batch.tokens").as_i32(), targets = reference().at("batch.targets").as_i32();
    const auto& shape = reference().at("batch.tokens").shape;
    float loss = 0;
    model.forward_backward(tokens.data(), targets.data(), static_cast<int>(shape[0]), static_cast<int>(shape[1]), &loss);
    host.compute_stream().synchronize();
    return loss;
  }
};

class LlamaOnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ZEROTH_SKIP_WITHOUT(GetParam()); }
};

// f32: zeroth's kernels differ from PyTorch's in summation order and the exp polynomial only
// (1.1e-6 to 1.6e-6 of each tensor's largest value measured; 5e-6 allowed). Two cases again with
// the LM head and loss by chunks of 5 tokens.
TEST_P(LlamaOnDevice, ForwardBackwardMatchesPyTorchF32) {
  const std::pair<const char*, int> cases[] = {{"llama", 0},   {"llama_bias", 0}, {"qwen2", 0}, {"qwen3", 0},
                                               {"mixtral", 0}, {"switch", 0},     {"llama", 5}, {"mixtral", 5}};
  for (const auto& [name, loss_chunk] : cases) {
    SCOPED_TRACE(fmt::format("{}, loss chunk {}", name, loss_chunk));
    Loaded m(name, GetParam(), false, DType::f32, loss_chunk);
    const float loss = m.forward_backward();
    if (m.config.moe.enabled()) {
      // Each expert layer's losses, summed over the layers, against PyTorch's.
      const MoeStats st = m.model.take_moe_stats();
      const auto aux = reference().at(std::string(name) + ".moe_aux").as_f32(),
                 z = reference().at(std::string(name) + ".moe_z").as_f32();
      EXPECT_EQ(st.passes, static_cast<int>(aux.size()));
      double aux_sum = 0, z_sum = 0;
      for (size_t i = 0; i < aux.size(); ++i) aux_sum += aux[i], z_sum += z[i];
      EXPECT_NEAR(st.aux_loss, aux_sum, 4e-6 * aux_sum);
      EXPECT_NEAR(st.z_loss, z_sum, 4e-6 * z_sum);
      std::printf("%s: aux loss %.7f torch %.7f, z loss %.6f torch %.6f, %zu of %zu choices dropped, busiest expert %.2f x the mean\n",
                  name, st.aux_loss, aux_sum, st.z_loss, z_sum, st.dropped, st.choices, st.max_load);
      if (std::string(name) == "switch") EXPECT_GT(st.dropped, 0u) << "the capacity must bite in this case";
      else EXPECT_EQ(st.dropped, 0u);
    }
    const float ref = reference().at(std::string(name) + ".loss").as_f32()[0];
    std::printf("%s: loss %.7f torch %.7f\n", name, loss, ref);
    EXPECT_NEAR(loss, ref, 2e-6 * ref);
    double worst = 0;
    std::string worst_name;
    for (const auto& p : Gpt::hf_params(m.config)) {
      const double e = rel_error(m.host.values(p.block, p.param, true),
                                 reference().at(std::string(name) + ".grad." + p.name).as_f32());
      if (e > worst) worst = e, worst_name = p.name;
      EXPECT_LT(e, 5e-6) << "gradient of " << p.name;
    }
    std::printf("%s: worst gradient error %.3g (%s)\n", name, worst, worst_name.c_str());
  }
}

// bf16 parameters and gradients against the f32 reference, as GPT-2's test bounds them: weights,
// gradients and the activations entering each product round to 8 mantissa bits and the errors
// compound through two layers. With bf16 activations the worst gradient measured 4.1% of its
// tensor's largest value (Qwen2's k_proj; 2.6% while activations stayed f32): bound 6%.
TEST_P(LlamaOnDevice, ForwardBackwardMatchesPyTorchBf16) {
  for (const char* name : {"llama", "llama_bias", "qwen2", "qwen3", "mixtral"}) {
    SCOPED_TRACE(name);
    Loaded m(name, GetParam(), false, DType::bf16);
    const float loss = m.forward_backward();
    const float ref = reference().at(std::string(name) + ".loss").as_f32()[0];
    EXPECT_NEAR(loss, ref, 2e-3 * ref);
    double worst = 0;
    for (const auto& p : Gpt::hf_params(m.config)) {
      const double e = rel_error(m.host.values(p.block, p.param, true),
                                 reference().at(std::string(name) + ".grad." + p.name).as_f32());
      worst = std::max(worst, e);
      EXPECT_LT(e, 6e-2) << "gradient of " << p.name;
    }
    std::printf("%s bf16: loss %.7f torch %.7f, worst gradient error %.3g\n", name, loss, ref, worst);
  }
}

// Generation's key/value cache against PyTorch's whole-sequence logits: the batch's first sequence
// decoded as a prompt of 5 tokens and then a token at a time; each pass's next-token logits are
// PyTorch's at that position (rotary angles from the cache's offset, grouped keys and values read
// from it), within the whole forward's bound.
// Dropless experts route each token alone as in the whole sequence; a capacity would not ("switch").
TEST_P(LlamaOnDevice, DecodingWithTheCacheGivesPyTorchLogitsAtEveryPosition) {
  for (const char* name : {"llama", "llama_bias", "qwen2", "qwen3", "mixtral"}) {
    SCOPED_TRACE(name);
    Loaded m(name, GetParam());
    const auto tokens = reference().at("batch.tokens").as_i32();
    const auto ref = reference().at(std::string(name) + ".logits").as_f32();
    const int T = 12, V = m.config.vocab_size;
    m.model.begin_decoding(T);
    std::vector<float> got(V);
    int pos = 0;
    double worst = 0;
    for (const int n : {5, 1, 1, 1, 1, 1, 1, 1}) {
      m.model.decode(tokens.data() + pos, n, got.data());
      pos += n;
      EXPECT_EQ(m.model.decoded(), pos);
      const std::vector<float> want(ref.begin() + static_cast<size_t>(pos - 1) * V, ref.begin() + static_cast<size_t>(pos) * V);
      const double e = rel_error(got, want);
      worst = std::max(worst, e);
      EXPECT_LT(e, 2e-6) << "position " << pos - 1;
    }
    m.model.end_decoding();
    std::printf("%s: decoding's worst logits error %.3g over %d positions\n", name, worst, T);
  }
}

TEST_P(LlamaOnDevice, EvaluateGivesPyTorchLogits) {
  for (const char* name : {"llama", "llama_bias", "qwen2", "qwen3", "mixtral", "switch"}) {
    SCOPED_TRACE(name);
    Loaded m(name, GetParam());
    const auto tokens = reference().at("batch.tokens").as_i32(), targets = reference().at("batch.targets").as_i32();
    const auto& ref_logits = reference().at(std::string(name) + ".logits");
    std::vector<float> logits(ref_logits.numel());
    float loss = 0;
    m.model.evaluate(tokens.data(), targets.data(), 2, 12, &loss, logits.data());
    m.host.compute_stream().synchronize();
    const double e = rel_error(logits, ref_logits.as_f32());
    std::printf("%s: logits error %.3g\n", name, e);
    EXPECT_LT(e, 2e-6);
  }
}

// Recomputing a block in its backward runs the same kernels on the same inputs: identical bits.
TEST_P(LlamaOnDevice, ActivationCheckpointingGivesIdenticalGradients) {
  for (const char* name : {"llama", "qwen3", "mixtral", "switch"}) {
    Loaded plain(name, GetParam()), ckpt(name, GetParam(), true);
    EXPECT_EQ(plain.forward_backward(), ckpt.forward_backward()) << name;
    for (const auto& p : Gpt::hf_params(plain.config))
      EXPECT_EQ(plain.host.values(p.block, p.param, true), ckpt.host.values(p.block, p.param, true)) << name << " " << p.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Devices, LlamaOnDevice, ::testing::ValuesIn(testing::device_specs()));

}  // namespace
}  // namespace zeroth
