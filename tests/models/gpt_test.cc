// The GPT model against PyTorch: forward and backward of one micro-batch tensor by tensor (f32
// and bf16), activation checkpointing, the loss by chunks, evaluation, mixture-of-experts MLPs, and 10 AdamW steps
// through the engine, all on
// tests/reference/gpt_torch.safetensors (written by tests/reference/gpt_reference.py).
#include <gtest/gtest.h>

#include <functional>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "comm/local/local_comm.h"
#include "core/error.h"
#include "core/safetensors.h"
#include "engine/engine.h"
#include "tests/engine/reference_init.h"
#include "models/decoder/gpt.h"
#include "tests/models/direct_host.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

const SafeTensors& reference() {
  static const SafeTensors ref = read_safetensors(testing::test_data_dir() + "/reference/gpt_torch.safetensors");
  return ref;
}

GptConfig reference_config() {
  const auto j = nlohmann::json::parse(reference().metadata.at("config"));
  GptConfig c;
  c.vocab_size = j["vocab_size"], c.seq_len = j["seq_len"], c.n_layer = j["n_layer"], c.n_head = j["n_head"], c.n_embd = j["n_embd"];
  return c;
}

using testing::rel_error;

struct Loaded {
  std::unique_ptr<Device> device;
  testing::DirectHost host;
  Gpt gpt;
  Loaded(DType dtype, bool checkpointing, const std::string& spec = "cpu", int loss_chunk_rows = 0)
      : device(make_device(spec)), host(*device, dtype), gpt(host, [&] {
          auto c = reference_config();
          c.activation_checkpointing = checkpointing;
          c.loss_chunk_rows = loss_chunk_rows;
          return c;
        }()) {
    for (size_t b = 0; b < host.blocks(); ++b) {
      const auto& spec = host.spec(static_cast<int>(b));
      for (size_t i = 0; i < spec.params.size(); ++i) {
        host.set_param(static_cast<int>(b), i, reference().at("init." + spec.name + "." + spec.params[i].name).as_f32());
      }
    }
  }
};

// Runs forward and backward on the reference batch; returns the loss.
float forward_backward(Loaded& m) {
  const auto tokens = reference().at("batch.tokens").as_i32(), targets = reference().at("batch.targets").as_i32();
  const auto& shape = reference().at("batch.tokens").shape;
  float loss = 0;
  m.gpt.forward_backward(tokens.data(), targets.data(), static_cast<int>(shape[0]), static_cast<int>(shape[1]), &loss);
  m.host.compute_stream().synchronize();
  return loss;
}

// Every gradient within `tol` of PyTorch's (relative to the tensor's largest value).
void expect_gradients(Loaded& m, double tol) {
  double worst = 0;
  for (size_t b = 0; b < m.host.blocks(); ++b) {
    const auto& spec = m.host.spec(static_cast<int>(b));
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const std::string name = spec.name + "." + spec.params[i].name;
      const double e = rel_error(m.host.values(static_cast<int>(b), i, true), reference().at("grad." + name).as_f32());
      worst = std::max(worst, e);
      EXPECT_LT(e, tol) << "gradient of " << name;
    }
  }
  std::printf("worst gradient error %.3g (bound %.3g)\n", worst, tol);
}

// Each case runs on every device (GPU cases skip without a GPU).
class GptOnDevice : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ZEROTH_SKIP_WITHOUT(GetParam()); }
};

// f32: the kernels differ from PyTorch's only in summation order and exp/GELU polynomials.
TEST_P(GptOnDevice, ForwardBackwardMatchesPyTorchF32) {
  Loaded m(DType::f32, false, GetParam());
  const float loss = forward_backward(m);
  const float ref = reference().at("loss").as_f32()[0];
  std::printf("loss %.7f torch %.7f\n", loss, ref);
  EXPECT_NEAR(loss, ref, 2e-6 * ref);
  expect_gradients(m, 2e-5);
}

// bf16 parameters and gradients against the f32 reference: weights round to 8 mantissa bits
// (2^-9 relative), gradients too, and the errors compound through two layers; 3% of each
// tensor's largest value bounds it, and the loss moves by less than 0.2%.
TEST_P(GptOnDevice, ForwardBackwardMatchesPyTorchBf16) {
  Loaded m(DType::bf16, false, GetParam());
  const float loss = forward_backward(m);
  const float ref = reference().at("loss").as_f32()[0];
  std::printf("bf16 loss %.7f torch %.7f\n", loss, ref);
  EXPECT_NEAR(loss, ref, 2e-3 * ref);
  expect_gradients(m, 3e-2);
}

// Recomputing a block in its backward runs the same kernels on the same inputs: identical bits.
TEST_P(GptOnDevice, ActivationCheckpointingGivesIdenticalGradients) {
  Loaded plain(DType::f32, false, GetParam()), ckpt(DType::f32, true, GetParam());
  EXPECT_EQ(forward_backward(plain), forward_backward(ckpt));
  for (size_t b = 0; b < plain.host.blocks(); ++b) {
    for (size_t i = 0; i < plain.host.spec(static_cast<int>(b)).params.size(); ++i) {
      EXPECT_EQ(plain.host.values(static_cast<int>(b), i, true), ckpt.host.values(static_cast<int>(b), i, true))
          << plain.host.spec(static_cast<int>(b)).name;
    }
  }
  EXPECT_LT(Gpt::activation_bytes(ckpt.gpt.config(), 3, 20), Gpt::activation_bytes(plain.gpt.config(), 3, 20));
}

// The LM head and loss by chunks of 16 of the batch's 60 tokens (the last chunk 12): no logits
// kept, backward makes each chunk's again. Against PyTorch at the whole-logits bounds, f32 and
// bf16, and evaluation's logits come out whole from chunks of 7.
TEST_P(GptOnDevice, LossByChunksMatchesPyTorch) {
  const float ref = reference().at("loss").as_f32()[0];
  {
    Loaded m(DType::f32, false, GetParam(), 16);
    const float loss = forward_backward(m);
    std::printf("loss by chunks %.7f torch %.7f\n", loss, ref);
    EXPECT_NEAR(loss, ref, 2e-6 * ref);
    expect_gradients(m, 2e-5);
  }
  {
    Loaded m(DType::bf16, false, GetParam(), 16);
    const float loss = forward_backward(m);
    EXPECT_NEAR(loss, ref, 2e-3 * ref);
    expect_gradients(m, 3e-2);
  }
  Loaded m(DType::f32, false, GetParam(), 7);
  const auto tokens = reference().at("batch.tokens").as_i32(), targets = reference().at("batch.targets").as_i32();
  const auto& ref_logits = reference().at("logits");
  std::vector<float> logits(ref_logits.numel(), -1.0f);
  float loss = 0;
  m.gpt.evaluate(tokens.data(), targets.data(), 3, 20, &loss, logits.data());
  m.host.compute_stream().synchronize();
  EXPECT_LT(rel_error(logits, ref_logits.as_f32()), 1e-5);
  EXPECT_NEAR(loss, ref, 2e-6 * ref);
  // One chunk's logits in scratch instead of every token's in the slot.
  GptConfig whole = m.gpt.config();  // as the device plans it (CUDA keeps attention's probabilities)
  whole.loss_chunk_rows = 0;
  const size_t V = whole.vocab_size;
  EXPECT_EQ(Gpt::activation_bytes(whole, 3, 20) - Gpt::activation_bytes(m.gpt.config(), 3, 20), (60 - 7) * V * sizeof(float));
}

TEST_P(GptOnDevice, EvaluateGivesPyTorchLogitsAndLoss) {
  Loaded m(DType::f32, false, GetParam());
  const auto tokens = reference().at("batch.tokens").as_i32(), targets = reference().at("batch.targets").as_i32();
  const auto& ref_logits = reference().at("logits");
  std::vector<float> logits(ref_logits.numel());
  float loss = 0;
  m.gpt.evaluate(tokens.data(), targets.data(), 3, 20, &loss, logits.data());
  m.host.compute_stream().synchronize();
  const double e = rel_error(logits, ref_logits.as_f32());
  std::printf("logits error %.3g\n", e);
  EXPECT_LT(e, 1e-5);
  EXPECT_NEAR(loss, reference().at("loss").as_f32()[0], 2e-6 * loss);
}

// Generation's key/value cache against PyTorch's whole-sequence logits: the batch's first sequence
// decoded as a prompt of 7 tokens and then a token at a time; each pass's next-token logits are
// PyTorch's at that position (the learned positions from the cache's offset).
TEST_P(GptOnDevice, DecodingWithTheCacheGivesPyTorchLogitsAtEveryPosition) {
  Loaded m(DType::f32, false, GetParam());
  const auto tokens = reference().at("batch.tokens").as_i32();
  const auto ref = reference().at("logits").as_f32();
  const int T = 20, V = m.gpt.config().vocab_size;
  m.gpt.begin_decoding(T);
  std::vector<float> got(V);
  double worst = 0;
  for (int pos = 0; pos < T;) {
    const int n = pos == 0 ? 7 : 1;
    m.gpt.decode(tokens.data() + pos, n, got.data());
    pos += n;
    const std::vector<float> want(ref.begin() + static_cast<size_t>(pos - 1) * V, ref.begin() + static_cast<size_t>(pos) * V);
    const double e = rel_error(got, want);
    worst = std::max(worst, e);
    EXPECT_LT(e, 1e-5) << "position " << pos - 1;
  }
  m.gpt.end_decoding();
  std::printf("decoding's worst logits error %.3g over %d positions\n", worst, T);
}

// GPT-2 with mixtures of GELU experts as its MLPs (the reference's MOE_CFG: top-2, capacity drops)
// against PyTorch: the loss, every gradient (the auxiliary losses' terms in them), each layer's
// auxiliary and z losses, the logits of an evaluation, and recomputation's identical bits.
TEST_P(GptOnDevice, MixtureOfExpertsMatchesPyTorch) {
  const auto j = nlohmann::json::parse(reference().metadata.at("moe_config"));
  const auto& mj = j["moe"];
  const auto config = [&](bool checkpointing) {
    GptConfig c = reference_config();
    c.moe.num_experts = mj["num_experts"], c.moe.top_k = mj["top_k"], c.moe.capacity_factor = mj["capacity_factor"];
    c.moe.eval_capacity_factor = mj["eval_capacity_factor"], c.moe.min_capacity = mj["min_capacity"];
    c.moe.drop_tokens = mj["drop_tokens"], c.moe.normalize_top_k = mj["normalize_top_k"], c.moe.aux_loss_coef = mj["aux_loss_coef"];
    c.moe.z_loss_coef = mj["z_loss_coef"], c.moe.every = mj["every"], c.moe.intermediate_size = mj["intermediate_size"];
    c.activation_checkpointing = checkpointing;
    return c;
  };
  // The reference names a layer's experts as the layer's parameters; zeroth keeps them in a block
  // of their own (<layer>.experts).
  auto torch_name = [](const BlockSpec& sp, size_t i) {
    const std::string block = sp.name.ends_with(".experts") ? sp.name.substr(0, sp.name.size() - 8) : sp.name;
    return block + "." + sp.params[i].name;
  };
  struct Moe {
    std::unique_ptr<Device> device;
    testing::DirectHost host;
    Gpt gpt;
    Moe(const GptConfig& c, const std::string& spec, const std::function<std::string(const BlockSpec&, size_t)>& torch_name)
        : device(make_device(spec)), host(*device, DType::f32), gpt(host, c) {
      for (size_t b = 0; b < host.blocks(); ++b) {
        const auto& sp = host.spec(static_cast<int>(b));
        for (size_t i = 0; i < sp.params.size(); ++i)
          host.set_param(static_cast<int>(b), i, reference().at("moe.init." + torch_name(sp, i)).as_f32());
      }
    }
  };
  const auto tokens = reference().at("batch.tokens").as_i32(), targets = reference().at("batch.targets").as_i32();
  Moe m(config(false), GetParam(), torch_name), ckpt(config(true), GetParam(), torch_name);
  float loss = 0, ckpt_loss = 0;
  m.gpt.forward_backward(tokens.data(), targets.data(), 3, 20, &loss);
  ckpt.gpt.forward_backward(tokens.data(), targets.data(), 3, 20, &ckpt_loss);
  m.host.compute_stream().synchronize();
  ckpt.host.compute_stream().synchronize();
  const float ref = reference().at("moe.loss").as_f32()[0];
  EXPECT_NEAR(loss, ref, 2e-6 * ref);
  EXPECT_EQ(loss, ckpt_loss);
  const MoeStats st = m.gpt.take_moe_stats();
  const auto aux = reference().at("moe.aux").as_f32(), z = reference().at("moe.z").as_f32();
  EXPECT_EQ(st.passes, 2);
  EXPECT_NEAR(st.aux_loss, aux[0] + aux[1], 4e-6 * (aux[0] + aux[1]));
  EXPECT_NEAR(st.z_loss, z[0] + z[1], 4e-6 * (z[0] + z[1]));
  EXPECT_GT(st.dropped, 0u) << "the capacity must bite in this case";
  EXPECT_EQ(ckpt.gpt.take_moe_stats().passes, 2) << "a recomputation counts nothing again";
  std::printf("moe: loss %.7f torch %.7f; aux %.7f torch %.7f; %zu of %zu choices dropped, busiest expert %.2f x the mean\n", loss,
              ref, st.aux_loss, aux[0] + aux[1], st.dropped, st.choices, st.max_load);
  double worst = 0;
  for (size_t b = 0; b < m.host.blocks(); ++b) {
    const auto& sp = m.host.spec(static_cast<int>(b));
    for (size_t i = 0; i < sp.params.size(); ++i) {
      const std::string name = torch_name(sp, i);
      const auto got = m.host.values(static_cast<int>(b), i, true);
      const double e = rel_error(got, reference().at("moe.grad." + name).as_f32());
      worst = std::max(worst, e);
      EXPECT_LT(e, 2e-5) << "gradient of " << name;
      EXPECT_EQ(got, ckpt.host.values(static_cast<int>(b), i, true)) << "recomputed gradient of " << name;
    }
  }
  std::printf("moe: worst gradient error %.3g\n", worst);
  std::vector<float> logits(reference().at("moe.logits").numel());
  m.gpt.evaluate(tokens.data(), targets.data(), 3, 20, &loss, logits.data());
  m.host.compute_stream().synchronize();
  EXPECT_LT(rel_error(logits, reference().at("moe.logits").as_f32()), 1e-5);
}

INSTANTIATE_TEST_SUITE_P(Devices, GptOnDevice, ::testing::ValuesIn(testing::device_specs()));

TEST(GptReference, TokensOutsideTheVocabularyAreErrors) {
  Loaded m(DType::f32, false);
  std::vector<int32_t> tokens(20, 3), targets(20, 4);
  tokens[7] = 97;
  float loss = 0;
  // Checked on the caller's thread before anything is enqueued, so the host's schedule is untouched.
  try {
    m.gpt.forward_backward(tokens.data(), targets.data(), 1, 20, &loss);
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("token id 97 at position 7 is outside the model's vocabulary [0, 97)"), std::string::npos)
        << e.what();
  }
  EXPECT_THROW(m.gpt.forward_backward(tokens.data(), targets.data(), 1, 25, &loss), InvalidArgument);  // T > seq_len
}

// 10 AdamW steps through the engine (dp 1 and ZeRO-3 on 2 local ranks) against PyTorch's losses,
// gradient norms and final weights.
void train_like_pytorch(int dp, int stage, int loss_chunk_rows = 0) {
  const auto opt = nlohmann::json::parse(reference().metadata.at("optimizer"));
  EngineConfig ec;
  ec.zero.stage = stage;
  ec.zero.stage3_param_persistence_threshold = 0;
  ec.optimizer = testing::adamw_from_reference(opt);
  ec.schedule.base_lr = ec.optimizer.lr;
  ec.gradient_clipping = std::stod(reference().metadata.at("clip"));
  const auto tokens = reference().at("train.tokens").as_i32(), targets = reference().at("train.targets").as_i32();
  const auto ref_losses = reference().at("train.losses").as_f32(), ref_norms = reference().at("train.grad_norms").as_f32();
  const int B = 3, T = 20, mb = B / (dp == 1 ? 1 : 3);
  ASSERT_TRUE(dp == 1 || dp == 3);
  std::vector<std::vector<double>> losses(dp);
  std::vector<std::vector<float>> final_errors(dp);
  run_local_ranks(dp, [&](Communicator& comm) {
    auto device = make_device("cpu");
    Engine engine(*device, comm, ec);
    GptConfig config = reference_config();
    config.loss_chunk_rows = loss_chunk_rows;
    Gpt gpt(engine, config);
    engine.finalize();
    testing::set_master_from_reference(engine, reference());
    for (int s = 0; s < static_cast<int>(ref_losses.size()); ++s) {
      const size_t at = static_cast<size_t>(s % 2) * B * T + static_cast<size_t>(comm.rank()) * mb * T;
      float loss = 0;
      gpt.forward_backward(tokens.data() + at, targets.data() + at, mb, T, &loss);
      const auto r = engine.step();
      engine.compute_stream().synchronize();
      losses[comm.rank()].push_back(loss);
      if (comm.rank() == 0) {
        EXPECT_NEAR(r.grad_norm, ref_norms[s], 1e-4 * ref_norms[s]) << "step " << s;
      }
    }
    for (size_t b = 0; b < engine.plan().blocks.size(); ++b) {
      const auto& spec = engine.block_spec(static_cast<int>(b));
      const auto values = engine.master_values(static_cast<int>(b));
      for (size_t i = 0; i < spec.params.size(); ++i) {
        const auto& blk = engine.plan().blocks[b];
        std::vector<float> v(values.begin() + blk.param_offsets[i], values.begin() + blk.param_offsets[i] + spec.params[i].numel());
        auto ref = reference().at("final." + spec.name + "." + spec.params[i].name).as_f32();
        if (spec.params[i].name == "attn.c_attn.bias") {
          // The key bias adds the same q.b to every score of a row, which softmax ignores: its
          // gradient is zero up to rounding, and Adam turns that rounding noise into full-size
          // steps of either sign, in PyTorch as here. Only the query and value biases are compared.
          const size_t C = spec.params[i].numel() / 3;
          std::fill(v.begin() + C, v.begin() + 2 * C, 0.0f);
          std::fill(ref.begin() + C, ref.begin() + 2 * C, 0.0f);
        }
        final_errors[comm.rank()].push_back(static_cast<float>(rel_error(v, ref)));
      }
    }
  });
  for (size_t s = 0; s < ref_losses.size(); ++s) {
    double mean = 0;
    for (int r = 0; r < dp; ++r) mean += losses[r][s] / dp;
    std::printf("step %zu loss %.6f torch %.6f\n", s, mean, ref_losses[s]);
    EXPECT_NEAR(mean, ref_losses[s], 2e-5 * ref_losses[s]);
  }
  const float worst = *std::max_element(final_errors[0].begin(), final_errors[0].end());
  std::printf("worst final weight error %.3g\n", worst);
  // Adam divides by sqrt(v): elements with tiny gradients turn relative rounding differences into
  // visible weight differences, so the bound is 5e-4 of the largest weight, not float epsilon.
  EXPECT_LT(worst, 5e-4);
}

TEST(GptReference, TenAdamWStepsMatchPyTorchOneRank) { train_like_pytorch(1, 0); }
TEST(GptReference, TenAdamWStepsMatchPyTorchZero3ThreeRanks) { train_like_pytorch(3, 3); }
// Each rank's 20 tokens in chunks of 7, 7 and 6.
TEST(GptReference, TenAdamWStepsMatchPyTorchWithTheLossByChunks) { train_like_pytorch(3, 3, 7); }

// The presets at Hugging Face's vocabulary (50257) and 1024 positions count exactly the published
// GPT-2 models' parameters (the LM head tied to wte, as there): 124,439,808 / 354,823,168 /
// 774,030,080 / 1,557,611,200.
TEST(GptPresets, CountGpt2sParametersExactly) {
  const std::pair<const char*, size_t> published[] = {{"gpt2-124m", 124439808},
                                                      {"gpt2-350m", 354823168},
                                                      {"gpt2-774m", 774030080},
                                                      {"gpt2-1558m", 1557611200}};
  for (const auto& [name, count] : published) {
    GptConfig c = GptConfig::preset(name);
    c.vocab_size = 50257;
    c.seq_len = 1024;
    EXPECT_EQ(c.num_parameters(), count) << name;
  }
}

}  // namespace
}  // namespace zeroth
