// Packed micro-batches against PyTorch with an explicit block-diagonal causal mask
// (tests/reference/packed_reference.py, written from the architectures, not from zeroth): two rows
// holding five samples, their positions restarting at each, their prompts' and last tokens' targets
// not counted. GPT-2 (learned positions) and a Llama (rotary positions, grouped-query attention,
// untied head), the Llama also with activation checkpointing (whose recomputation keeps the
// samples), and both on the GPU where there is one (whose attention keeps each row's
// probabilities): the loss and every gradient at f32 bounds; and shown to fail when one boundary is
// ignored (the same batch with two samples run as one).
#include <gtest/gtest.h>

#include <unistd.h>  // getpid

#include <cstdlib>     // std::system
#include <cstring>     // std::memcpy
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ofstream
#include <random>      // std::mt19937
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "core/error.h"
#include "core/safetensors.h"
#include "models/decoder/gpt.h"
#include "tests/models/direct_host.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

using testing::rel_error;

constexpr int B = 2, T = 24;
const std::vector<std::vector<int>> kSamples = {{7, 11, 6}, {15, 9}};  // each row's samples' lengths

// "llama+checkpointing": the layers recomputed before their backward, within the same samples;
// "gpt2@cuda": on the GPU (skipped without one), whose attention keeps probabilities per row.
std::string arch_of(const std::string& name) { return name.substr(0, name.find_first_of("+@")); }
std::string device_of(const std::string& name) { return name.ends_with("@cuda") ? "cuda" : "cpu"; }

GptConfig config_of(const std::string& name) {
  const std::string arch = arch_of(name);
  GptConfig c;
  c.activation_checkpointing = name.ends_with("+checkpointing");
  c.vocab_size = 61, c.seq_len = T, c.n_layer = 2;
  if (arch == "gpt2") {
    c.n_head = 2, c.n_embd = 16;
  } else {
    c.architecture = Architecture::llama;
    c.n_head = 4, c.n_kv_head = 2, c.n_embd = 32, c.intermediate_size = 48, c.tie_word_embeddings = false;
  }
  return c;
}

struct Batch {
  std::vector<int32_t> tokens, targets, positions;
  int counted = 0;
};

// Positions restart at each sample; a sample's targets are its next tokens, but for its first two
// (a prompt) and its last (nothing of the sample follows it).
Batch make_batch(std::mt19937& rng, int vocab) {
  Batch b;
  for (const auto& row : kSamples) {
    for (const int n : row) {
      for (int t = 0; t < n; ++t) b.tokens.push_back(static_cast<int32_t>(rng() % vocab)), b.positions.push_back(t);
    }
  }
  size_t at = 0;
  for (const auto& row : kSamples) {
    for (const int n : row) {
      for (int t = 0; t < n; ++t, ++at) {
        const bool counts = t >= 2 && t + 1 < n;
        b.targets.push_back(counts ? b.tokens[at + 1] : -1);
        b.counted += counts;
      }
    }
  }
  return b;
}

class Packing : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override { ZEROTH_SKIP_WITHOUT(device_of(GetParam())); }
};

TEST_P(Packing, LossAndGradientsAreTorchsWithABlockDiagonalCausalMask) {
  const GptConfig cfg = config_of(GetParam());
  auto device = make_device(device_of(GetParam()));
  testing::DirectHost host(*device, DType::f32);
  Gpt gpt(host, cfg);
  std::mt19937 rng(7);
  const std::string dir = fmt::format("{}/zeroth-packing-{}-{}", ::testing::TempDir(), arch_of(GetParam()) + device_of(GetParam()),
                                      ::getpid());
  std::filesystem::create_directories(dir);
  // Random weights (norms' around 1), written under Hugging Face's names for the reference.
  SafeTensors weights;
  weights.metadata["format"] = "pt";
  const auto hf = Gpt::hf_params(cfg);
  for (const auto& p : hf) {
    const ParamSpec& spec = host.spec(p.block).params[p.param];
    const bool norm = p.name.find("norm") != std::string::npos || p.name.find("ln_") != std::string::npos;
    std::vector<float> v = testing::random_vec(spec.numel(), rng, norm ? 0.1f : 0.2f);
    if (norm && p.name.ends_with("weight"))
      for (auto& x : v) x += 1.0f;
    host.set_param(p.block, p.param, v);
    SafeTensor t;
    t.dtype = "F32";
    t.shape.assign(spec.shape.begin(), spec.shape.end());
    if (p.transposed) {
      // Hugging Face's Conv1D keeps [in, out].
      std::vector<float> tr(v.size());
      const size_t rows = spec.shape[0], cols = spec.shape[1];
      for (size_t r = 0; r < rows; ++r)
        for (size_t c = 0; c < cols; ++c) tr[c * rows + r] = v[r * cols + c];
      v = tr;
      std::swap(t.shape[0], t.shape[1]);
    }
    t.data.resize(v.size() * sizeof(float));
    std::memcpy(t.data.data(), v.data(), t.data.size());
    weights.tensors[p.name] = std::move(t);
  }
  write_safetensors(dir + "/weights.safetensors", weights);
  const Batch batch = make_batch(rng, cfg.vocab_size);
  ASSERT_EQ(batch.tokens.size(), static_cast<size_t>(B * T));
  auto rows = [](const std::vector<int32_t>& v) {
    nlohmann::json j = nlohmann::json::array();
    for (int b = 0; b < B; ++b) j.push_back(std::vector<int32_t>(v.begin() + b * T, v.begin() + (b + 1) * T));
    return j;
  };
  const nlohmann::json job = {{"config",
                               {{"architecture", arch_of(GetParam())},
                                {"n_head", cfg.n_head},
                                {"n_kv_head", cfg.kv_heads()},
                                {"head_dim", cfg.head_size()},
                                {"rope_theta", cfg.rope_theta},
                                {"rms_norm_eps", cfg.norm_eps},
                                {"tie_word_embeddings", cfg.tie_word_embeddings}}},
                              {"tokens", rows(batch.tokens)},
                              {"targets", rows(batch.targets)},
                              {"positions", rows(batch.positions)},
                              {"divisor", batch.counted}};
  std::ofstream(dir + "/batch.json") << job.dump();
  const std::string cmd =
      fmt::format("cd {0}/reference && /usr/bin/python3 packed_reference.py {1}/weights.safetensors {1}/batch.json "
                  "{1}/out.safetensors",
                  testing::test_data_dir(), dir);
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  const SafeTensors ref = read_safetensors(dir + "/out.safetensors");

  // zeroth's loss and gradients for `positions`, and the worst gradient error against the reference.
  auto run = [&](const std::vector<int32_t>& positions, float* loss) {
    host.zero_grads();
    gpt.set_loss_divisor(batch.counted);
    gpt.forward_backward(batch.tokens.data(), batch.targets.data(), B, T, loss, 0, positions.data());
    host.compute_stream().synchronize();
    double worst = 0;
    for (const auto& p : hf) {
      std::vector<float> want = ref.at("grad." + p.name).as_f32();
      if (p.transposed) {
        const auto& shape = host.spec(p.block).params[p.param].shape;
        std::vector<float> back(want.size());
        for (size_t r = 0; r < static_cast<size_t>(shape[0]); ++r)
          for (size_t c = 0; c < static_cast<size_t>(shape[1]); ++c) back[r * shape[1] + c] = want[c * shape[0] + r];
        want = back;
      }
      const double e = rel_error(host.values(p.block, p.param, true), want);
      worst = std::max(worst, e);
      if (positions == batch.positions) {
        EXPECT_LT(e, 2e-5) << "gradient of " << p.name;
      }
    }
    return worst;
  };
  float loss = 0;
  const double worst = run(batch.positions, &loss);
  const float want = ref.at("loss").as_f32()[0];
  std::printf("%s: loss %.7f, PyTorch %.7f; worst gradient error %.3g\n", GetParam().c_str(), loss, want, worst);
  EXPECT_NEAR(loss, want, 2e-6 * want);
  // The same batch with row 0's second and third samples run as one: the mask and the positions
  // are wrong from its eighteenth token on, and the reference says so.
  std::vector<int32_t> joined = batch.positions;
  for (int t = 18; t < 24; ++t) joined[t] = t - 7;
  float joined_loss = 0;
  const double joined_worst = run(joined, &joined_loss);
  std::printf("%s, one boundary ignored: loss %.7f, worst gradient error %.3g\n", GetParam().c_str(), joined_loss, joined_worst);
  EXPECT_GT(joined_worst, 100 * 2e-5);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Architectures, Packing, ::testing::Values("gpt2", "llama", "llama+checkpointing", "gpt2@cuda", "llama@cuda"),
                         [](const auto& info) {
  std::string name = info.param;
  for (char& c : name)
    if (c == '+' || c == '@') c = '_';
  return name;
});

TEST(Packing, PositionsThatDoNotRestartOrCountUpAreRefused) {
  const GptConfig cfg = config_of("gpt2");
  auto device = make_device("cpu");
  testing::DirectHost host(*device, DType::f32);
  Gpt gpt(host, cfg);
  std::vector<int32_t> tokens(B * T, 1), targets(B * T, 2), positions(B * T);
  for (int i = 0; i < B * T; ++i) positions[i] = i % T;
  positions[T + 5] = 7;
  float loss = 0;
  try {
    gpt.forward_backward(tokens.data(), targets.data(), B, T, &loss, 0, positions.data());
    FAIL() << "no error";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("position 7 at row 1, column 5"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zeroth
