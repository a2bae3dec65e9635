// Tensor parallelism on the engine: a tiny GPT split Megatron-style over tp ranks (its heads, MLP
// and vocabulary, the vocabulary not a multiple of tp), composed with data parallelism, ZeRO and
// pipelines, trains to what one rank computes for the same global batches, with and without
// sequence parallelism; the replicated parameters stay identical on every tensor-parallel rank.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "tests/engine/gpt_grid.h"

namespace zeroth {
namespace {

using testing::GridCase;

// 63 tokens: not a multiple of 2 or 4, so the vocabulary's slices differ by a row; 4 heads, so
// that tp = 4 holds one each.
GptConfig model() {
  GptConfig c = testing::tiny_gpt();
  c.vocab_size = 63, c.n_head = 4, c.n_layer = 4;
  return c;
}

class TensorParallelEquivalence : public ::testing::TestWithParam<GridCase> {};

// Against one rank in f32. Only the order of float sums differs: the row-parallel products sum
// their inner dimension in tp pieces, the loss's denominators in tp pieces, the batch over dp.
TEST_P(TensorParallelEquivalence, TrainsLikeOneRank) {
  const GridCase k = GetParam();
  const auto got = testing::train_grid(k);
  const auto& ref = testing::whole_reference(k.model, k.micro);
  EXPECT_TRUE(got.replica_mismatches.empty()) << "replicated parameters differ between tensor-parallel ranks: "
                                              << got.replica_mismatches.front();
  const testing::TensorError worst = testing::expect_weights(got, ref, 2e-6, k.model);
  if (k.pp > 1) EXPECT_EQ(got.head_copy, got.weights.at("embed")) << "the two copies of the tied embedding differ";
  const auto [norm_err, loss_err] = testing::expect_steps(got, ref);
  std::printf("dp %d tp %d pp %d%s stage %d: worst weight error %.3g (%s), gradient norm %.3g, loss %.3g; loss %.6f -> %.6f\n", k.dp,
              k.tp, k.pp, k.sequence_parallel ? " sp" : "", k.stage, worst.rel(), worst.name.c_str(), norm_err, loss_err,
              got.losses.front(), got.losses.back());
}

std::vector<GridCase> cases() {
  std::vector<GridCase> out;
  struct Shape {
    int dp, tp, pp;
  };
  for (Shape g : {Shape{1, 2, 1}, Shape{2, 2, 1}, Shape{1, 2, 2}, Shape{2, 2, 2}, Shape{1, 4, 1}}) {
    for (int stage : {0, 1, 2, 3}) {
      if (stage == 0 && g.dp > 1) continue;
      for (bool sp : {false, true}) {
        GridCase k;
        k.dp = g.dp, k.tp = g.tp, k.pp = g.pp, k.stage = stage, k.sequence_parallel = sp, k.model = model();
        out.push_back(k);
      }
    }
  }
  // Recomputation repeats the forward's collectives in backward; offload moves the slices' state.
  GridCase k;
  k.tp = 2, k.stage = 2, k.checkpointing = true, k.sequence_parallel = true, k.model = model();
  out.push_back(k);
  k.checkpointing = false, k.dp = 2, k.offload = OffloadDevice::cpu;
  out.push_back(k);
  return out;
}

std::string name(const ::testing::TestParamInfo<GridCase>& info) {
  const auto& k = info.param;
  const char* offload[] = {"", "OffloadCpu", "OffloadNvme"};
  return "Dp" + std::to_string(k.dp) + "Tp" + std::to_string(k.tp) + "Pp" + std::to_string(k.pp) + "Zero" + std::to_string(k.stage) +
         (k.sequence_parallel ? "Sp" : "") + offload[static_cast<int>(k.offload)] + (k.checkpointing ? "Ckpt" : "");
}

INSTANTIATE_TEST_SUITE_P(Cases, TensorParallelEquivalence, ::testing::ValuesIn(cases()), name);

}  // namespace
}  // namespace zeroth
