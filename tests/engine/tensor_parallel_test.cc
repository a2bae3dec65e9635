// Tensor parallelism on the engine: a tiny GPT split Megatron-style over tp ranks (its heads, MLP
// and vocabulary, the vocabulary not a multiple of tp), composed with data parallelism, ZeRO and
// pipelines, trains to what one rank computes for the same global batches, with and without
// sequence parallelism; the replicated parameters stay identical on every tensor-parallel rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <string>
#include <tuple>
#include <vector>

#include <unistd.h>

#include "engine/checkpoint/format.h"
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

// The Llama family's switches all on: 4 query heads over 2 key/value heads of 8 channels, q/k/v and
// output biases (the output's added on tensor-parallel rank 0 only), per-head q/k norms, an MLP
// width (40) that is not 4 C, an untied head.
GptConfig llama_model() {
  GptConfig c = model();
  c.architecture = Architecture::llama;
  c.n_kv_head = 2, c.head_dim = 8, c.intermediate_size = 40, c.norm_eps = 1e-6;
  c.qkv_bias = c.o_bias = c.qk_norm = true, c.tie_word_embeddings = false;
  return c;
}

class TensorParallelEquivalence : public ::testing::TestWithParam<GridCase> {};

// Against one rank in f32. Only the order of float sums differs: the row-parallel products sum
// their inner dimension in tp pieces, the loss's denominators in tp pieces, the batch over dp.
TEST_P(TensorParallelEquivalence, TrainsLikeOneRank) {
  const GridCase k = GetParam();
  const auto got = testing::train_grid(k);
  const auto& ref = testing::whole_reference(k.model, k.micro, k.optimizer, k.compute);
  EXPECT_TRUE(got.replica_mismatches.empty()) << "replicated parameters differ between tensor-parallel ranks: "
                                              << got.replica_mismatches.front();
  // Lamb scales each tensor's step by ||w|| / ||u||, summed here over the slices in another order;
  // its worst tensor (a LayerNorm bias near zero) moves 3.3e-6 of its largest value. Norms left
  // unsummed over the group move it 1e-4.
  // bf16: gradients and activations round to 8 bits in another order, as in the data-parallel
  // equivalence (gpt_equivalence_test.cc): weights 2e-2 (measured up to 1.2e-2), norms 1.5e-3,
  // losses 2e-5. The Llama model's weights 1e-1: since attention's operands round too, a weight
  // whose gradient sits near zero and flips sign takes Adam's steps the other way, measured up to
  // 4.1e-2 of the largest value (embed.wte, sequence parallel: 3.5e-3 against 0.085) with that
  // case's loss 4.1e-7 and norm 3.2e-4 off.
  const bool narrow = k.compute != DType::f32;
  // The Llama family's q/k/v biases start at zero and move 4 Adam steps (largest value 0.014): the
  // same order-of-sums noise is 2.1e-6 of that.
  const double bound = narrow                               ? (k.model.llama() ? 1e-1 : 2e-2)
                       : k.optimizer == OptimizerKind::lamb ? 5e-6
                       : k.model.llama()                    ? 3e-6
                                                            : 2e-6;
  const testing::TensorError worst = testing::expect_weights(got, ref, bound, k.model);
  if (k.pp > 1 && k.model.tie_word_embeddings) {
    EXPECT_EQ(got.head_copy, got.weights.at("embed")) << "the two copies of the tied embedding differ";
  }
  const auto [norm_err, loss_err] = narrow ? testing::expect_steps(got, ref, 1.5e-3, 2e-5) : testing::expect_steps(got, ref);
  std::printf("dp %d tp %d pp %d%s stage %d: worst weight error %.3g (%s), gradient norm %.3g, loss %.3g; loss %.6f -> %.6f\n", k.dp,
              k.tp, k.pp, k.sequence_parallel ? " sp" : "", k.stage, worst.rel(), worst.name.c_str(), norm_err, loss_err,
              got.losses.front(), got.losses.back());
}

// The model's traffic in its tensor-parallel group, per rank and step, from the communicator's own
// byte counts, against Megatron-LM's count: per layer and micro-batch, two all-reduces of the B x T x C
// activations forward (after the attention and the MLP outputs) and two backward (their inputs'
// gradients); the vocabulary-parallel embedding adds one forward, the LM head one backward, and the
// loss two of B x T and 2 B x T floats (the row max; the softmax's denominators and the targets'
// logits). Sequence parallelism turns each all-reduce of the layers, the embedding and the head into a
// reduce-scatter and an all-gather of the same rows (ln_f's output gathered forward, its gradient
// scattered backward), and its backward gathers each layer's two LayerNorm outputs again (kept as
// rows; Korthikanti et al. 2022, section 4.2.2): 10 buffers per layer instead of 8. Logical bytes
// as CommStats counts them: an all-reduce twice its buffer.
TEST(TensorParallelTraffic, PerLayerCollectivesMatchMegatronsCount) {
  for (bool sp : {false, true}) {
    GridCase k;
    k.tp = 2, k.stage = 1, k.sequence_parallel = sp, k.model = model();
    const auto got = testing::train_grid(k);
    const auto& c = k.model;
    const uint64_t micro = static_cast<uint64_t>(k.micro) * testing::kSteps, L = c.n_layer;
    const uint64_t BT = static_cast<uint64_t>(testing::kGlobalBatch / k.micro) * c.seq_len, act = BT * c.n_embd * sizeof(float);
    const CommStats& s = got.model_tp_traffic;
    const auto op = [](CollectiveOp o) { return static_cast<size_t>(o); };
    const uint64_t loss_bytes = 2 * (BT + 2 * BT) * sizeof(float);  // max, then the two sums
    if (!sp) {
      EXPECT_EQ(s.calls[op(CollectiveOp::all_reduce)], micro * (4 * L + 2 + 2));
      EXPECT_EQ(s.bytes[op(CollectiveOp::all_reduce)], micro * (2 * act * (4 * L + 2) + loss_bytes));
      EXPECT_EQ(s.calls[op(CollectiveOp::reduce_scatter)] + s.calls[op(CollectiveOp::all_gather)], 0u);
    } else {
      // Per layer: forward 2 gathers (the LayerNorms' outputs) and 2 scatters, backward 4 gathers (the
      // row-parallel outputs' gradients, the LayerNorms' outputs again) and 2 scatters; the embedding a
      // scatter forward and a gather backward; ln_f a gather forward, the head a scatter backward.
      EXPECT_EQ(s.calls[op(CollectiveOp::all_gather)], micro * (6 * L + 2));
      EXPECT_EQ(s.calls[op(CollectiveOp::reduce_scatter)], micro * (4 * L + 2));
      EXPECT_EQ(s.bytes[op(CollectiveOp::all_gather)], micro * act * (6 * L + 2));
      EXPECT_EQ(s.bytes[op(CollectiveOp::reduce_scatter)], micro * act * (4 * L + 2));
      EXPECT_EQ(s.calls[op(CollectiveOp::all_reduce)], micro * 2);
      EXPECT_EQ(s.bytes[op(CollectiveOp::all_reduce)], micro * loss_bytes);
    }
    const uint64_t layer_bytes = sp ? (s.bytes[op(CollectiveOp::all_gather)] + s.bytes[op(CollectiveOp::reduce_scatter)] -
                                       micro * 4 * act) /
                                          (micro * L)
                                    : (s.bytes[op(CollectiveOp::all_reduce)] - micro * (4 * act + loss_bytes)) / (micro * L);
    const uint64_t formula = (sp ? 10 : 8) * act;
    std::printf("tp 2%s: %llu bytes per layer and micro-batch of %llu x %d floats (formula: %s of %llu bytes: %llu)\n",
                sp ? " sequence parallel" : "", static_cast<unsigned long long>(layer_bytes), static_cast<unsigned long long>(BT),
                c.n_embd, sp ? "4 reduce-scatters and 6 all-gathers" : "4 all-reduces, counted twice",
                static_cast<unsigned long long>(act), static_cast<unsigned long long>(formula));
    EXPECT_EQ(layer_bytes, formula);
  }
}

// Saved after step 3 at (dp, tp, pp) = (2, 2, 2), then resumed at each of `splits` (dp, tp, pp,
// micro-batches) to train on like one rank that never stopped. The warm-up gives steps 1 and 2 a
// learning rate of 0, so step 3 is the first to move the weights.
void saved_at_two_two_two_resumes_at(const GptConfig& model, std::initializer_list<std::array<int, 4>> splits,
                                     const std::function<void(const ckpt::Manifest&)>& check_manifest = nullptr) {
  const std::string dir = ::testing::TempDir() + "zeroth-tp-ckpt-" + std::to_string(::getpid());
  std::filesystem::remove_all(dir);
  const int saved_at = testing::kSteps - 1;
  GridCase saved;
  saved.dp = 2, saved.tp = 2, saved.pp = 2, saved.stage = 1, saved.sequence_parallel = true, saved.model = model;
  testing::train_grid(saved, nullptr, {0, saved_at, "", dir});
  const auto manifest = ckpt::read_manifest(ckpt::resolve(dir));
  EXPECT_EQ(manifest.world.at("tp"), 2);
  if (check_manifest) check_manifest(manifest);
  for (auto [dp, tp, pp, micro] : splits) {
    GridCase k;
    k.dp = dp, k.tp = tp, k.pp = pp, k.micro = micro, k.stage = 2, k.model = model;
    const auto got = testing::train_grid(k, nullptr, {saved_at, testing::kSteps, dir, ""});
    const auto& ref = testing::whole_reference(k.model, 4);
    SCOPED_TRACE("resumed at dp " + std::to_string(dp) + " x tp " + std::to_string(tp) + " x pp " + std::to_string(pp));
    const auto worst = testing::expect_weights(got, ref, model.llama() ? 3e-6 : 2e-6, k.model);
    for (int s = saved_at; s < testing::kSteps; ++s)
      EXPECT_NEAR(got.losses[s - saved_at], ref.losses[s], 3e-7 * ref.losses[s]) << "step " << s;
    std::printf("resumed at dp %d tp %d pp %d: worst weight error %.3g (%s)\n", dp, tp, pp, worst.rel(), worst.name.c_str());
  }
  std::filesystem::remove_all(dir);
}

// A checkpoint saved at (dp, tp, pp) = (2, 2, 2) loads at another split, none, and the same one
// (whose slices are read as they were stored): the manifest records each tensor's split, and a
// reader at another tensor-parallel size takes its elements through it.
TEST(TensorParallelCheckpoint, SavedAtTwoTwoTwoLoadsAtOtherSplitsAndTheSame) {
  saved_at_two_two_two_resumes_at(model(),
                                  {std::array{1, 1, 1, 4}, std::array{4, 1, 2, 2}, std::array{1, 4, 1, 4}, std::array{2, 2, 2, 4},
                                   std::array{1, 2, 1, 4}},
                                  [](const ckpt::Manifest& manifest) {
    const ckpt::TensorEntry* qkv = manifest.find("h.0.attn.c_attn.weight");
    ASSERT_NE(qkv, nullptr);
    EXPECT_EQ(qkv->split.axis, 0);
    EXPECT_EQ(qkv->split.groups, 3);
    EXPECT_EQ(qkv->split.ranks, 2);
    EXPECT_EQ(qkv->shape, (std::vector<int64_t>{3 * model().n_embd, model().n_embd}));
  });
}

// The same for the Llama family's switches (its key/value heads split with their query heads,
// gate and up by columns, the untied head's vocabulary slices): to one rank, to tp 1 over a
// pipeline, to the same split.
TEST(TensorParallelCheckpoint, ALlamaSavedAtTwoTwoTwoLoadsAtOtherSplits) {
  saved_at_two_two_two_resumes_at(llama_model(), {std::array{1, 1, 1, 4}, std::array{4, 1, 2, 2}, std::array{2, 2, 2, 4}});
}

// The vocabulary-parallel loss combines the ranks' row maxima with a max before the exponentials:
// with the token embedding scaled 2000 times the logits reach the hundreds, and a shift that is
// not the global max (a rank's own, or a sum of them) over- or underflows exp.
TEST(TensorParallelLoss, LogitsInTheHundredsGiveTheUnsplitLoss) {
  const GptConfig gc = model();
  const int B = 2, T = gc.seq_len;
  std::vector<int32_t> tokens(B * T), targets(B * T);
  for (int i = 0; i < B * T; ++i) tokens[i] = (i * 7 + 1) % gc.vocab_size, targets[i] = (i * 11 + 5) % gc.vocab_size;
  auto loss_at = [&](int tp) {
    float loss = 0;
    run_local_ranks(tp, [&](Communicator& world) {
      auto groups = ProcessGrid(1, 1, tp).split(world);
      auto device = make_device("cpu");
      Engine engine(*device, *groups.dp, testing::grid_engine_config(0, 1));
      if (tp > 1) engine.set_tensor_parallel(*groups.tp);
      GptPart part;
      part.tp_rank = groups.tp->rank(), part.tp_ranks = tp;
      Gpt gpt(engine, gc, part, tp > 1 ? groups.tp.get() : nullptr);
      engine.finalize();
      const int embed = Gpt::embedding_block(gc, part);
      auto values = engine.master_values(embed);
      for (size_t i = 0; i < engine.block_spec(embed).params[0].numel(); ++i) values[i] *= 2000;  // wte, this rank's rows
      engine.set_master_values(embed, values);
      float mine = 0;
      gpt.evaluate(tokens.data(), targets.data(), B, T, &mine);
      engine.compute_stream().synchronize();
      if (world.rank() == 0) loss = mine;
    });
    return loss;
  };
  const float whole = loss_at(1);
  ASSERT_TRUE(std::isfinite(whole));
  EXPECT_GT(whole, 50.0f) << "the logits are not large enough to test the shift";
  for (int tp : {2, 4}) EXPECT_NEAR(loss_at(tp), whole, 1e-5 * whole) << "tp " << tp;
  std::printf("loss with logits in the hundreds: %.4f at tp 1\n", whole);
}

// A split tensor's stored order: each part's elements (TensorSplit::for_each_run of its rank) end to
// end, parts in rank order; stored_position is that map, one to one, for uneven parts and segments.
TEST(TensorParallelCheckpoint, StoredOrderIsThePartsEndToEnd) {
  struct Shape {
    std::vector<int64_t> shape;
    int axis, groups;
  };
  for (const auto& [shape, axis, groups] :
       {Shape{{12, 5}, 0, 3}, Shape{{7, 9}, 1, 1}, Shape{{6, 4, 3}, 1, 2}, Shape{{63, 4}, 0, 1}, Shape{{5}, 0, 1}}) {
    const int64_t seg = shape[axis] / groups;
    for (int parts = 1; parts <= std::min<int64_t>(seg, 5); ++parts) {
      ckpt::TensorEntry t{"w", shape, {}, TensorSplit{axis, groups, 0, parts, shape}};
      std::vector<int> seen(t.numel(), 0);
      uint64_t next = 0;
      for (int r = 0; r < parts; ++r) {
        const TensorSplit part{axis, groups, r, parts, shape};
        ASSERT_EQ(t.part_offset(r), next) << "part " << r << " of " << parts;
        const ParamSpec local = ParamSpec{"w", shape, {}}.cut(axis, groups, r, parts);
        part.for_each_run(0, local.numel(), [&](size_t full, size_t count, size_t at) {
          for (size_t k = 0; k < count; ++k) {
            ASSERT_EQ(t.stored_position(full + k), next + at + k) << "element " << full + k << ", part " << r << " of " << parts;
            ++seen[full + k];
          }
        });
        next += local.numel();
      }
      EXPECT_EQ(next, t.numel());
      EXPECT_TRUE(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; })) << "each element in one part";
    }
  }
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
  k.cpu_checkpointing = true;  // the block inputs (each rank's rows) in host memory
  out.push_back(k);
  k.checkpointing = k.cpu_checkpointing = false, k.dp = 2, k.offload = OffloadDevice::cpu;
  out.push_back(k);
  // Lamb's trust ratios over whole tensors: the slices' norms summed over the group (at stage 0 with
  // one data-parallel rank, over the group alone).
  for (auto [dp, stage, sp] : {std::tuple{2, 2, false}, std::tuple{2, 2, true}, std::tuple{1, 0, false}}) {
    GridCase lamb;
    lamb.dp = dp, lamb.tp = 2, lamb.stage = stage, lamb.sequence_parallel = sp, lamb.model = model(),
    lamb.optimizer = OptimizerKind::lamb;
    out.push_back(lamb);
  }
  // bf16: narrow gradients, their partial sums (sequence parallelism) summed over tp in bf16.
  for (bool sp : {false, true}) {
    GridCase narrow;
    narrow.dp = 2, narrow.tp = 2, narrow.stage = 2, narrow.sequence_parallel = sp, narrow.model = model(),
    narrow.compute = DType::bf16;
    out.push_back(narrow);
  }
  // Checkpointing in host memory without sequence parallelism: whole block inputs there.
  GridCase host;
  host.tp = 2, host.stage = 1, host.checkpointing = host.cpu_checkpointing = true, host.model = model();
  out.push_back(host);
  // The Llama family on every axis: its key/value heads split with their query heads, the per-head
  // norms' gradients summed over the group, the untied head on the last stage; and tied (Qwen2's
  // small models) across a pipeline, whose two copies of the embedding are kept equal.
  for (auto [dp, tp, pp, stage, sp] : {std::tuple{1, 2, 1, 0, false}, std::tuple{2, 2, 1, 3, true}, std::tuple{1, 2, 2, 1, false},
                                       std::tuple{2, 2, 2, 2, true}, std::tuple{2, 1, 2, 3, false}}) {
    GridCase llama;
    llama.dp = dp, llama.tp = tp, llama.pp = pp, llama.stage = stage, llama.sequence_parallel = sp, llama.model = llama_model();
    out.push_back(llama);
  }
  GridCase tied;
  tied.tp = 2, tied.pp = 2, tied.stage = 2, tied.model = llama_model(), tied.model.tie_word_embeddings = true;
  out.push_back(tied);
  GridCase ckpt;
  ckpt.tp = 2, ckpt.dp = 2, ckpt.stage = 3, ckpt.checkpointing = true, ckpt.sequence_parallel = true, ckpt.model = llama_model();
  out.push_back(ckpt);
  // Its slices' state on NVMe (optimizer and, at stage 3, parameters), and its block inputs
  // checkpointed in host memory.
  GridCase nvme;
  nvme.tp = 2, nvme.dp = 2, nvme.stage = 3, nvme.offload = OffloadDevice::nvme, nvme.model = llama_model();
  out.push_back(nvme);
  GridCase host_ckpt;
  host_ckpt.tp = 2, host_ckpt.stage = 2, host_ckpt.checkpointing = host_ckpt.cpu_checkpointing = true,
  host_ckpt.sequence_parallel = true;
  host_ckpt.model = llama_model();
  out.push_back(host_ckpt);
  // The other pipeline schedules across a tensor-parallel pair: GPipe, interleaved (a layer a chunk).
  GridCase gpipe;
  gpipe.tp = 2, gpipe.pp = 2, gpipe.stage = 1, gpipe.kind = PipeKind::gpipe, gpipe.model = llama_model();
  out.push_back(gpipe);
  GridCase interleaved;
  interleaved.tp = 2, interleaved.pp = 2, interleaved.stage = 2, interleaved.kind = PipeKind::interleaved,
  interleaved.model = llama_model();
  out.push_back(interleaved);
  // The loss by chunks of 5 tokens (a micro-batch is 32 on one data-parallel rank, the last chunk
  // 2; 16 on two, the last 1): each chunk's statistics all-reduced over the vocabulary slices, the
  // rows' gradients reduce-scattered (sequence parallel), 1F1B's slots each keeping their
  // statistics while one chunk's scratch serves them all, and bf16.
  for (auto [dp, tp, pp, sp, compute] :
       {std::tuple{1, 2, 1, true, DType::f32}, std::tuple{1, 2, 2, false, DType::f32}, std::tuple{2, 2, 1, true, DType::bf16}}) {
    GridCase chunked;
    chunked.dp = dp, chunked.tp = tp, chunked.pp = pp, chunked.stage = 2, chunked.sequence_parallel = sp, chunked.compute = compute;
    chunked.model = llama_model(), chunked.model.loss_chunk_rows = 5;
    out.push_back(chunked);
  }
  return out;
}

std::string name(const ::testing::TestParamInfo<GridCase>& info) {
  const auto& k = info.param;
  const char* offload[] = {"", "OffloadCpu", "OffloadNvme"};
  return "Dp" + std::to_string(k.dp) + "Tp" + std::to_string(k.tp) + "Pp" + std::to_string(k.pp) + "Zero" + std::to_string(k.stage) +
         (k.sequence_parallel ? "Sp" : "") + offload[static_cast<int>(k.offload)] + (k.checkpointing ? "Ckpt" : "") +
         (k.cpu_checkpointing ? "Cpu" : "") + (k.optimizer == OptimizerKind::lamb ? "Lamb" : "") +
         (k.compute == DType::bf16 ? "Bf16" : "") + (k.model.llama() ? (k.model.tie_word_embeddings ? "LlamaTied" : "Llama") : "") +
         (k.kind == PipeKind::gpipe         ? "GPipe"
          : k.kind == PipeKind::interleaved ? "Interleaved"
                                            : "") +
         (k.model.loss_chunk_rows > 0 ? "LossByChunks" : "");
}

INSTANTIATE_TEST_SUITE_P(Cases, TensorParallelEquivalence, ::testing::ValuesIn(cases()), name);

}  // namespace
}  // namespace zeroth
