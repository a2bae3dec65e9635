// The planner's memory and step-time model (planner/gpt_layout.h, planner/planner.h) against
// numbers worked out by hand from the papers' formulas and against published measurements, and
// the search's sanity: what it picks for GPT-3 on 1024 GPUs, for a model too big for one GPU,
// and that more device memory never makes the best plan slower.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>

#include <nlohmann/json.hpp>

#include "core/error.h"
#include "planner/planner.h"
#include "models/decoder/gpt.h"

namespace zeroth {
namespace {

constexpr uint64_t GiB = 1ull << 30;

TEST(GptShape, CountsTheParametersTheModelHas) {
  for (const char* preset : {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m"}) {
    const GptConfig g = GptConfig::preset(preset);
    const GptShape s{static_cast<uint64_t>(g.n_layer), static_cast<uint64_t>(g.n_embd), static_cast<uint64_t>(g.n_head),
                     static_cast<uint64_t>(g.seq_len), static_cast<uint64_t>(g.vocab_size)};
    EXPECT_EQ(s.params(), g.num_parameters()) << preset;
  }
  EXPECT_EQ((GptShape{12, 768, 12, 1024, 50257}).params(), 124'439'808u);
}

TEST(GptShape, FromAParameterCountTakesMegatronsPublishedShapes) {
  // GPT-3 175B (Brown et al. 2020): 96 layers, hidden 12288, 96 heads.
  const GptShape gpt3 = GptShape::from_params(175'000'000'000ull);
  EXPECT_EQ(gpt3.layers, 96u);
  EXPECT_EQ(gpt3.hidden, 12288u);
  EXPECT_EQ(gpt3.heads, 96u);
  // Megatron-LM's 1T: 128 layers, hidden 25600, 160 heads: 1.008T with its vocabulary.
  const GptShape t = GptShape::from_params(1'000'000'000'000ull);
  EXPECT_EQ(t.layers, 128u);
  EXPECT_EQ(t.hidden, 25600u);
  EXPECT_EQ(t.heads, 160u);
  EXPECT_NEAR(static_cast<double>(t.params()), 1.008e12, 0.001e12);
  const GptShape small = GptShape::from_params(7'500'000'000ull);
  EXPECT_EQ(small.layers, 36u);
  EXPECT_EQ(small.hidden, 4096u);
}

TEST(Activations, KorthikantisFormulasForGpt3) {
  // s = 2048, b = 1, h = 12288, a = 96: s b h = 25,165,824 and 5 a s^2 b = 2,013,265,920.
  const GptShape gpt3{96, 12288, 96, 2048, 51200};
  // 34 s b h + 5 a s^2 b
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 1, false, Checkpointing::none, true), 2'868'903'936u);
  // tensor parallel 8: s b h (10 + 24 / 8) + 5 a s^2 b / 8
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 8, false, Checkpointing::none, true), 578'813'952u);
  // sequence parallel: all of it / 8
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 8, true, Checkpointing::none, true), 358'612'992u);
  // selective recomputation drops the attention term: 34 s b h / 8 with sequence parallelism
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 8, true, Checkpointing::selective, true), 106'954'752u);
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 8, false, Checkpointing::selective, true), 327'155'712u);
  // full recomputation keeps the layer's input, 2 s b h (sharded by sequence parallelism)
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 8, false, Checkpointing::full, true), 50'331'648u);
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 8, true, Checkpointing::full, true), 6'291'456u);
  // linear in the micro-batch
  EXPECT_EQ(layer_activation_bytes(gpt3, 4, 8, true, Checkpointing::none, true), 4 * 358'612'992u);
}

TEST(Activations, BlockedAttentionKeepsEachRowsLogSumExpNotTheScores) {
  // The same layer as attention by blocks holds it (zeroth's, FlashAttention): 34 s b h and, in the
  // place of 5 a s^2 b, 4 a s b bytes of f32 log-sum-exp (96 x 2048 x 4 = 786,432).
  const GptShape gpt3{96, 12288, 96, 2048, 51200};
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 1, false, Checkpointing::none), 34ull * 25'165'824 + 786'432);
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 8, true, Checkpointing::none), (34ull * 25'165'824 + 786'432) / 8);
  // Selective recomputation and full recomputation are as with the scores.
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 8, true, Checkpointing::selective),
            layer_activation_bytes(gpt3, 1, 8, true, Checkpointing::selective, true));
  EXPECT_EQ(layer_activation_bytes(gpt3, 1, 8, false, Checkpointing::full),
            layer_activation_bytes(gpt3, 1, 8, false, Checkpointing::full, true));
}

TEST(LayoutMemory, OneGpuHoldsTheWholeModelsStatesAndOneMicroBatch) {
  const GptShape s{24, 1024, 16, 1024, 50257};  // GPT-2 350M
  const Layout l{};                             // dp 1, stage 0
  const LayoutMemory m = layout_memory(s, l);
  EXPECT_EQ(m.stage_params, s.params());
  EXPECT_EQ(m.model_states, 16 * s.params());
  EXPECT_EQ(m.in_flight, 1u);
  const uint64_t sbh = 1024ull * 1024;
  const uint64_t acts = 24 * layer_activation_bytes(s, 1, 1, false, Checkpointing::none) + sbh + 4 * sbh + 4 * 1024ull * 50257;
  EXPECT_EQ(m.activations, acts);
  EXPECT_EQ(m.buffers, 0u);
  EXPECT_EQ(m.device, m.model_states + m.activations + m.allowance);
  EXPECT_EQ(m.allowance, kDeviceRuntimeBytes + static_cast<uint64_t>(std::llround(0.05 * static_cast<double>(m.model_states + acts))));
}

TEST(LayoutMemory, PipelineStagesHoldTheirLayersAndOneFOneBsMicroBatches) {
  const GptShape s{8, 256, 4, 128, 1000};
  const uint64_t layer = s.layer_params(), vh = 1000 * 256;
  Layout l;
  l.pp = 4;
  l.micro_batches = 16;
  const LayoutMemory m = layout_memory(s, l);
  // The first stage (embedding, 2 layers, 4 micro-batches in flight) outweighs the last (2 layers,
  // the tied head, 1 micro-batch).
  EXPECT_EQ(m.in_flight, 4u);
  EXPECT_EQ(m.stage_params, 2 * layer + vh + 128 * 256);
  l.schedule = PipeKind::gpipe;
  EXPECT_EQ(layout_memory(s, l).in_flight, 16u);
  l.micro_batches = 2;
  l.schedule = PipeKind::one_f_one_b;
  EXPECT_EQ(layout_memory(s, l).in_flight, 2u);  // never more than there are
  // Tensor parallelism slices the layers and the vocabulary; layer norms and row biases stay whole.
  Layout t;
  t.tp = 4;
  EXPECT_EQ(layout_memory(s, t).stage_params, 8 * (12 * 256 * 256 / 4 + 7 * 256 / 4 + 6 * 256) + 250 * 256 + 128 * 256 + 2 * 256);
}

TEST(LayoutMemory, ModelStatesAreTheZeroPapersOverTheDataParallelGroup) {
  // 36 layers, hidden 4096: 7,467,786,240 parameters (divisible by 64).
  const GptShape s = GptShape::from_params(7'500'000'000ull);
  const uint64_t p = s.params();
  ASSERT_EQ(p, 7'467'786'240u);
  const uint64_t paper[] = {16 * p, 4 * p + 12 * p / 64, 2 * p + 14 * p / 64, 16 * p / 64};
  for (int stage = 0; stage <= 3; ++stage) {
    Layout l;
    l.dp = 64, l.stage = stage;
    EXPECT_EQ(layout_memory(s, l).model_states, paper[stage]) << stage;
  }
  // Tensor parallelism 4 and 2 pipeline stages: the first stage's slice (18 layers of
  // 12 h^2 / 4 + 7 h / 4 + 6 h, the vocabulary's quarter, the positions) over 8 data-parallel ranks.
  Layout l;
  l.dp = 8, l.tp = 4, l.pp = 2, l.stage = 1, l.micro_batches = 8;
  const uint64_t h = 4096, slice = 18 * (12 * h * h / 4 + 7 * h / 4 + 6 * h) + 51200 / 4 * h + 2048 * h;
  const LayoutMemory m = layout_memory(s, l);
  EXPECT_EQ(m.stage_params, slice);
  EXPECT_EQ(m.model_states, 4 * slice + 12 * slice / 8);
}

TEST(StepCost, ComputeAndBubbleFollowTheirFormulas) {
  const GptShape s{32, 4096, 32, 2048, 51200};
  Cluster c;
  Layout l;
  l.pp = 4, l.micro_batches = 12, l.dp = 2;
  const LayoutMemory m = layout_memory(s, l);
  const StepCost k = step_cost(s, l, m, c);
  // 3 x the forward of a stage of 8 layers plus the head, per micro-batch: the matmuls' FLOPs at
  // 0.6 of 312 TFLOP/s, and the elementwise work over the activation bytes blocked attention keeps
  // (Korthikanti's, the row's log-sum-exp in place of the scores) at 2 TB/s.
  const double h = 4096, seq = 2048;
  const double flops = 8 * seq * (24 * h * h + 4 * seq * h) + seq * 2 * h * 51200;
  const double bytes = 8 * (seq * h * 34 + 4 * 32 * seq);
  EXPECT_NEAR(k.compute, 12 * 3 * (flops / (0.6 * 312e12) + bytes / 2e12), 1e-9 * k.compute);
  // The bubble is (p - 1) micro-batch times: (p - 1) / (m + p - 1) of compute and pipeline traffic.
  EXPECT_NEAR(k.bubble / (k.bubble + k.compute + k.tensor + k.pipeline), 3.0 / (12 + 3), 1e-9);
  // 6 P tokens + 12 l s h tokens of model FLOPs (the head counted in P)
  const double tokens = 2 * 12 * seq;
  EXPECT_NEAR(k.model_flops, tokens * (72 * 32 * h * h + 12 * 32 * seq * h + 6 * 51200 * h), 1e-9 * k.model_flops);
  EXPECT_NEAR(k.mfu, k.model_flops / (k.step * 8 * 312e12), 1e-12);
}

TEST(StepCost, CollectivesAndOffloadFollowTheirFormulas) {
  // 8 layers of hidden 1024 in one stage, 2 sequences of 1024 per micro-batch, 4 micro-batches.
  const GptShape s{8, 1024, 16, 1024, 32000};
  Cluster c;
  c.gpus_per_node = 4, c.nodes = 2;
  const double h = 1024, seq = 1024, tokens = 2 * seq;
  Layout l;
  l.micro_batch = 2, l.micro_batches = 4;
  // Tensor parallelism 4 (inside a node): 4 ring all-reduces of 2 tokens h bytes per layer and
  // micro-batch, 2 (t - 1) / t of the bytes each at 230 GB/s.
  l.tp = 4, l.dp = 2, l.stage = 1;
  LayoutMemory m = layout_memory(s, l);
  StepCost k = step_cost(s, l, m, c);
  EXPECT_NEAR(k.tensor, 4 * 8 * 4 * (2 * 0.75 * 2 * tokens * h / 230e9), 1e-12);
  // dp 2 leaves the node (tp x dp = 8 > 4): the node's 200 GB/s shared by its 4 GPUs. ZeRO-1:
  // reduce-scatter hidden under the last backward, then the all-gather of 2 P bytes, (N-1)/N of it.
  const double p = static_cast<double>(m.stage_params);
  EXPECT_NEAR(k.data, 0.5 * 2 * p / 50e9, 1e-12);
  // The optimizer on the device: 30 bytes per parameter of the shard at 2 TB/s.
  EXPECT_NEAR(k.optimizer, p / 2 * 30 / 2e12, 1e-15);
  // Offloaded to the CPU: the shard's 16-bit gradients down (not hidden at stage 1) and
  // parameters up over 24 GB/s PCIe, and CPU Adam at 5e9 parameters/s shared by the node's 4 GPUs.
  l.offload_optimizer = OffloadDevice::cpu;
  m = layout_memory(s, l);
  k = step_cost(s, l, m, c);
  EXPECT_NEAR(k.offload, 2 * (2 * p / 2 / 24e9), 1e-12);
  EXPECT_NEAR(k.optimizer, p / 2 / (5e9 / 4), 1e-12);
  // On NVMe: master and both moments read and written (24 bytes per parameter) through the node's
  // 25 GB/s by its 4 GPUs, overlapped with the CPU update: only the excess shows.
  l.offload_optimizer = OffloadDevice::nvme;
  k = step_cost(s, l, m, c);
  EXPECT_NEAR(k.offload, 2 * (2 * p / 2 / 24e9) + std::max(0.0, 24 * p / 2 * 4 / 25e9 - p / 2 / (5e9 / 4)), 1e-12);
}

TEST(StepCost, PredictsMegatronsPublishedThroughput) {
  // Narayanan et al. 2021, Table 1: (params B, heads, hidden, layers, tp, pp, GPUs, batch, TFLOP/s
  // per GPU counted with recomputation). Activation recomputation, micro-batch 1, attention that
  // keeps its s x s scores (Megatron-LM then had no blocked attention).
  struct Row {
    uint64_t heads, hidden, layers, tp, pp, gpus, batch;
    double tflops;
  };
  const Row rows[] = {{24, 2304, 24, 1, 1, 32, 512, 137},        {32, 3072, 30, 2, 1, 64, 512, 138},
                      {32, 4096, 36, 4, 1, 128, 512, 142},       {48, 6144, 40, 8, 1, 256, 1024, 135},
                      {64, 8192, 48, 8, 2, 512, 1536, 138},      {80, 10240, 60, 8, 4, 1024, 1792, 140},
                      {96, 12288, 80, 8, 8, 1536, 2304, 148},    {128, 16384, 96, 8, 16, 1920, 2160, 155},
                      {128, 20480, 105, 8, 35, 2520, 2520, 163}, {160, 25600, 128, 8, 64, 3072, 3072, 163}};
  for (const Row& r : rows) {
    const GptShape s{r.layers, r.hidden, r.heads, 2048, 51200};
    Cluster c;
    c.nodes = r.gpus / 8;
    Layout l;
    l.tp = r.tp, l.pp = r.pp, l.dp = r.gpus / (r.tp * r.pp);
    l.micro_batches = r.batch / l.dp;
    l.checkpointing = Checkpointing::full;
    l.attention_scores = true;
    const LayoutMemory m = layout_memory(s, l);
    const StepCost k = step_cost(s, l, m, c);
    // Their FLOP count with recomputation: 96 B s l h^2 (1 + s / 6h + V / 16 l h).
    const double h = static_cast<double>(r.hidden), L = static_cast<double>(r.layers);
    const double flops = 96.0 * static_cast<double>(r.batch) * 2048 * L * h * h * (1 + 2048 / (6 * h) + 51200 / (16 * L * h));
    const double per_gpu = flops / k.step / static_cast<double>(r.gpus) / 1e12;
    std::printf("%6.1fB: predicted %.0f TFLOP/s per GPU, published %.0f\n", static_cast<double>(s.params()) / 1e9, per_gpu, r.tflops);
    EXPECT_NEAR(per_gpu, r.tflops, 0.15 * r.tflops) << r.layers << " layers, hidden " << r.hidden;
    // And what they ran fits an 80 GB A100 by this estimate.
    EXPECT_LE(m.device, 80ull * 1000 * 1000 * 1000) << r.layers << " layers, hidden " << r.hidden;
  }
}

TEST(Planner, Gpt3On1024GpusPicksTensorParallelismInsideANodeAndFits) {
  Cluster c;
  c.nodes = 128;
  PlanSearch search;
  search.global_batch = 1536;
  // Attention that keeps its scores, as the Megatron-LM runs this compares with.
  search.attention_scores = true;
  const PlanResult r = search_plans(GptShape::from_params(175'000'000'000ull), c, search);
  ASSERT_FALSE(r.best.empty());
  const Candidate& best = r.best.front();
  EXPECT_LE(best.layout.tp, 8u);
  EXPECT_GE(best.layout.tp, 2u);  // 175B's activations and states need more than ZeRO alone at 80 GB
  EXPECT_EQ(best.layout.checkpointing == Checkpointing::none, false);  // nor do they fit without recomputation
  EXPECT_EQ(best.layout.gpus(), 1024u);
  EXPECT_LE(best.memory.device, 80 * GiB);
  EXPECT_GT(best.cost.mfu, 0.3);
  EXPECT_LT(best.cost.mfu, 0.6);
  for (size_t i = 1; i < r.best.size(); ++i) EXPECT_LE(r.best[i - 1].cost.step, r.best[i].cost.step);
}

TEST(Planner, FewGpusAndAModelTooBigForThemPicksOffload) {
  Cluster c;
  c.gpus_per_node = 1;
  PlanSearch search;
  search.global_batch = 16;
  const GptShape s = GptShape::from_params(13'000'000'000ull);  // 208 GB of model states
  const PlanResult r = search_plans(s, c, search);
  ASSERT_FALSE(r.best.empty());
  EXPECT_NE(r.best.front().layout.offload_optimizer, OffloadDevice::none);
  for (const auto& cand : r.best) EXPECT_NE(cand.layout.offload_optimizer, OffloadDevice::none);
  search.offload = false;
  EXPECT_TRUE(search_plans(s, c, search).best.empty());
  // With too little host memory for the optimizer, only NVMe remains.
  c.host_memory = 64 * GiB;
  search.offload = true;
  const PlanResult nvme = search_plans(s, c, search);
  ASSERT_FALSE(nvme.best.empty());
  EXPECT_EQ(nvme.best.front().layout.offload_optimizer, OffloadDevice::nvme);
}

TEST(Planner, MoreDeviceMemoryNeverMakesTheBestPlanSlower) {
  for (uint64_t params : {1'300'000'000ull, 13'000'000'000ull, 175'000'000'000ull}) {
    Cluster c;
    c.nodes = params > 100'000'000'000ull ? 16 : 1;
    PlanSearch search;
    search.global_batch = 512;
    double previous = 0;
    uint64_t fitting = 0;
    for (uint64_t gib = 8; gib <= 192; gib += 8) {
      c.device_memory = gib * GiB;
      const PlanResult r = search_plans(GptShape::from_params(params), c, search);
      EXPECT_GE(r.fitting, fitting) << params << " at " << gib << " GiB";
      fitting = r.fitting;
      if (r.best.empty()) {
        EXPECT_EQ(previous, 0) << params << " at " << gib << " GiB: a plan fitted in less";
        continue;
      }
      if (previous > 0) {
        EXPECT_LE(r.best.front().cost.step, previous) << params << " at " << gib << " GiB";
      }
      previous = r.best.front().cost.step;
    }
    EXPECT_GT(previous, 0) << params << ": nothing fits even 192 GiB";
  }
}

TEST(Planner, RunnableOnlyKeepsToWhatTheEngineRuns) {
  Cluster c;
  PlanSearch search;
  search.global_batch = 64;
  search.runnable_only = true;
  const PlanResult r = search_plans(GptShape::from_params(7'500'000'000ull), c, search);
  ASSERT_FALSE(r.best.empty());
  bool split = false;
  for (const auto& cand : r.best) {
    EXPECT_NE(cand.layout.checkpointing, Checkpointing::selective);
    split = split || cand.layout.tp > 1 || cand.layout.pp > 1;
  }
  EXPECT_TRUE(split) << "7.5B on 8 GPUs: the fastest runnable plans split the model (tensor or pipeline parallelism)";
}

// The engine runs ZeRO-3 inside pipeline stages, and the search considers it: each micro-batch
// gathers the stage's parameters again (the step model counts m gathers, hidden under compute
// where they fit), and the stage's model states are a dp-th of stage 2's.
TEST(Planner, SearchesZeroThreeWithPipelines) {
  Cluster c;
  c.nodes = 2;
  PlanSearch search;
  search.global_batch = 64;
  search.stage = 3;
  search.top = 100000;
  const PlanResult r = search_plans(GptShape::from_params(7'500'000'000ull), c, search);
  const auto piped = std::find_if(r.best.begin(), r.best.end(),
                                  [](const Candidate& k) { return k.layout.pp > 1 && k.layout.dp > 1 && k.layout.micro_batches > 1; });
  ASSERT_NE(piped, r.best.end()) << "no ZeRO-3 layout with pipeline stages (and data parallelism, several micro-batches) fits";
  ASSERT_EQ(piped->layout.stage, 3);
  Layout two = piped->layout;
  two.stage = 2;
  const GptShape s = GptShape::from_params(7'500'000'000ull);
  EXPECT_LT(piped->memory.model_states, layout_memory(s, two).model_states);
  // The link slowed until the gathers show: m micro-batches' gathers cost m times one's (of the same
  // stage's parameters: one micro-batch in flight can make another stage the largest).
  Cluster slow = c;
  slow.intra_node_bw = slow.inter_node_bw = 1e6;
  Layout once = piped->layout;
  once.micro_batches = 1;
  const double all = step_cost(s, piped->layout, piped->memory, slow).data, one = step_cost(s, once, piped->memory, slow).data;
  ASSERT_GT(one, 0.0);
  EXPECT_NEAR(all, static_cast<double>(piped->layout.micro_batches) * one, 1e-9 * all) << "the gathers of every micro-batch";
}

TEST(Planner, CalibratesFromBenchOutputs) {
  Cluster c;
  using json = nlohmann::json;
  c.calibrate(json{{"backend", "nccl"},
                   {"ranks", 8},
                   {"results",
                    {{{"op", "all_reduce"}, {"bytes", 1024}, {"busbw", 1.0}},
                     {{"op", "all_reduce"}, {"bytes", 1 << 28}, {"busbw", 180.0}},
                     {{"op", "all_gather"}, {"bytes", 1 << 28}, {"busbw", 300.0}}}}});
  EXPECT_DOUBLE_EQ(c.intra_node_bw, 180e9);
  c.calibrate(json{{"results",
                    {{{"optimizer", "AdamW"}, {"params", 1000000}, {"params_per_s", 9e9}},
                     {{"optimizer", "AdamW"}, {"params", 100000000}, {"params_per_s", 2e9}},
                     {{"optimizer", "AdamW"}, {"params", 100000000}, {"params_per_s", 3e9}},
                     {{"optimizer", "Lamb"}, {"params", 100000000}, {"params_per_s", 8e9}}}}});
  EXPECT_DOUBLE_EQ(c.cpu_optimizer_rate, 3e9);  // the largest size, the most threads' rate
  c.calibrate(json{{"path", "/mnt"}, {"best", {{"read_gbps", 6.5}, {"write_gbps", 3.0}}}, {"cuda", nullptr}});
  EXPECT_DOUBLE_EQ(c.nvme_bw, 3e9);
  c.peak_flops = 2e12;
  c.calibrate(json{{"tokens_per_s", 1000.0}, {"model_flops_per_token", 1e9}});
  EXPECT_DOUBLE_EQ(c.achieved_flops(), 1e12);
  EXPECT_DOUBLE_EQ(c.matmul_efficiency, 0.5);
  // A rate above the peak, or far below it (a CPU bench for a GPU cluster), is refused.
  EXPECT_THROW(c.calibrate(json{{"tokens_per_s", 1000.0}, {"model_flops_per_token", 1e10}}), InvalidArgument);
  EXPECT_THROW(c.calibrate(json{{"tokens_per_s", 1.0}, {"model_flops_per_token", 1e9}}), InvalidArgument);
  EXPECT_THROW(c.calibrate(json{{"something", 1}}), InvalidArgument);
}

}  // namespace
}  // namespace zeroth
