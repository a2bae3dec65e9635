// A frozen block's backward against the whole model's: with some blocks handed no gradient views
// (as the engine hands a frozen block), every other block's gradients are the same bits as when
// all are trained, and the frozen blocks' gradients are never written. GPT-2 with its tied
// embedding (used as the LM head too) and its first layer frozen; a Llama with a layer's norms and
// products and the final norm frozen; on each device the build has.
#include <gtest/gtest.h>

#include <random>  // std::mt19937
#include <set>     // std::set
#include <string>  // std::string
#include <vector>  // std::vector

#include "models/decoder/gpt.h"
#include "tests/models/direct_host.h"
#include "tests/models/model_test_util.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

struct Case {
  std::string name, device;
  GptConfig config;
  std::set<std::string> frozen;  // block names
};

GptConfig gpt2() {
  GptConfig c;
  c.vocab_size = 61, c.seq_len = 16, c.n_layer = 2, c.n_head = 2, c.n_embd = 16;
  return c;
}

GptConfig llama() {
  GptConfig c = gpt2();
  c.architecture = Architecture::llama;
  c.n_head = 4, c.n_kv_head = 2, c.n_embd = 32, c.intermediate_size = 48, c.tie_word_embeddings = false;
  return c;
}

class FrozenBlocks : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override { ZEROTH_SKIP_WITHOUT(GetParam().device); }
};

// Every block's gradients after one micro-batch's forward and backward, the named blocks frozen.
std::vector<std::vector<std::vector<float>>> gradients(const Case& c, const std::set<std::string>& frozen) {
  auto device = make_device(c.device);
  testing::DirectHost host(*device, DType::f32);
  Gpt gpt(host, c.config);
  std::mt19937 rng(5);
  for (size_t b = 0; b < host.blocks(); ++b) {
    const auto& spec = host.spec(static_cast<int>(b));
    for (size_t i = 0; i < spec.params.size(); ++i)
      host.set_param(static_cast<int>(b), i, testing::random_vec(spec.params[i].numel(), rng, 0.3f));
    if (frozen.contains(spec.name)) host.freeze(static_cast<int>(b));
  }
  const int B = 2, T = c.config.seq_len;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = static_cast<int32_t>(rng() % 61), targets[i] = static_cast<int32_t>(rng() % 61);
  float loss = 0;
  gpt.forward_backward(tokens.data(), targets.data(), B, T, &loss);
  host.compute_stream().synchronize();
  std::vector<std::vector<std::vector<float>>> out(host.blocks());
  for (size_t b = 0; b < host.blocks(); ++b)
    for (size_t i = 0; i < host.spec(static_cast<int>(b)).params.size(); ++i)
      out[b].push_back(host.values(static_cast<int>(b), i, true));
  return out;
}

TEST_P(FrozenBlocks, TheOtherBlocksGetTheSameGradientsAndTheFrozenNone) {
  const Case& c = GetParam();
  const auto all = gradients(c, {});
  const auto some = gradients(c, c.frozen);
  const auto specs = Gpt::block_specs(c.config);
  ASSERT_EQ(all.size(), specs.size());
  size_t frozen = 0;
  for (size_t b = 0; b < specs.size(); ++b) {
    const bool is_frozen = c.frozen.contains(specs[b].name);
    frozen += is_frozen;
    for (size_t i = 0; i < all[b].size(); ++i) {
      const std::string what = specs[b].name + "." + specs[b].params[i].name;
      if (is_frozen) {
        EXPECT_EQ(some[b][i], std::vector<float>(all[b][i].size(), 0.0f)) << what << ": a frozen block's gradient was written";
      } else {
        EXPECT_EQ(some[b][i], all[b][i]) << what;
      }
    }
  }
  EXPECT_EQ(frozen, c.frozen.size()) << "a frozen block's name is not the model's";
}

INSTANTIATE_TEST_SUITE_P(Models, FrozenBlocks,
                         ::testing::Values(Case{"gpt2", "cpu", gpt2(), {"embed", "h.0"}},
                                           Case{"llama", "cpu", llama(), {"layers.1", "ln_f"}},
                                           Case{"gpt2_cuda", "cuda", gpt2(), {"embed", "h.0"}},
                                           Case{"llama_cuda", "cuda", llama(), {"layers.1", "ln_f"}}),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace zeroth
