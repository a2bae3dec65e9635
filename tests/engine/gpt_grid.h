// A tiny GPT trained on a dp x pp x tp grid of local ranks (ProcessGrid), and on one rank for
// reference: the harness of the pipeline and tensor-parallel equivalence tests. Each rank holds its
// part (pipeline stage, tensor-parallel slice) and trains the same global batches; the result holds
// the whole tensors, assembled from the tensor-parallel slices.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "comm/local/local_comm.h"
#include "comm/process_grid.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/engine.h"
#include "engine/pipeline/runner.h"
#include "models/decoder/context_ring.h"
#include "models/decoder/gpt.h"
#include "tests/engine/tensor_error.h"
#include "tests/engine/tiny_gpt_engine.h"
#include "train/data.h"
#include "train/hf/export.h"

namespace zeroth::testing {

inline GptConfig tiny_gpt() {
  GptConfig c;
  c.vocab_size = 64, c.seq_len = 16, c.n_layer = 8, c.n_head = 2, c.n_embd = 32;
  return c;
}

// Models whose samples a group of ranks splits by positions (Ulysses, ring attention): 4 heads of
// 8 channels over 16 positions, and grouped-query attention, 6 query heads over 2 key/value heads,
// with Qwen's q/k/v biases and Qwen3's per-head norms.
inline GptConfig split_gpt2() {
  GptConfig c = tiny_gpt();
  c.n_head = 4, c.n_layer = 4;
  return c;
}
inline GptConfig split_llama_6_2() {
  GptConfig c = split_gpt2();
  c.architecture = Architecture::llama;
  c.n_embd = 48, c.n_head = 6, c.n_kv_head = 2, c.head_dim = 8, c.intermediate_size = 40, c.norm_eps = 1e-6;
  c.qkv_bias = c.qk_norm = true, c.tie_word_embeddings = false;
  return c;
}

struct GridCase {
  int dp = 1, pp = 1;
  PipeKind kind = PipeKind::one_f_one_b;
  int stage = 0;
  int micro = 4;                                // micro-batches per cycle
  OffloadDevice offload = OffloadDevice::none;  // offload_optimizer (and offload_param at stage 3 with nvme)
  bool checkpointing = false;                   // activation checkpointing (recompute each layer in backward)
  uint64_t bucket = 6000;                       // reduce and all-gather bucket size (elements)
  int tp = 1;
  bool sequence_parallel = false;
  GptConfig model = tiny_gpt();
  bool cpu_checkpointing = false;  // with checkpointing: the block inputs in host memory
  OptimizerKind optimizer = OptimizerKind::adamw;
  DType compute = DType::f32;
  int ep = 1;                     // expert-parallel ranks (of dp) sharing out model.moe's experts
  bool force_one_expert = false;  // every expert layer's router made to choose expert 0 first, 1 second, for every token
  bool ep_overlap = true;         // the all-to-alls on a stream of their own (GptPart::ep_overlap)
  LinkModel link = {};            // every collective made to take at least this link's time
  double clipping = 1.0;          // gradient_clipping
  bool constant_lr = false;       // the optimizer's lr every step, instead of tiny_gpt_engine's warm-up
  bool overlap_backward = true;   // offload_optimizer.overlap_backward (nvme)
  DType reduction = DType::f32;   // communication_data_type
  int seq = 1;                    // Ulysses ranks per sample group (of the dp x seq data-parallel ranks ZeRO shards over)
  bool ring = false;              // the sample groups run ring attention (GptPart::cp_ranks = seq) instead of Ulysses
  bool masked = false;            // masked_target's targets do not count: the loss is the mean over the rest
  bool packed = false;            // packed_positions: each row holds several samples (Gpt::forward's positions)
};

// Samples of 5, 7 and 4 positions in turn packed into each row of T (positions restarting at 0 where
// one starts), the same in every row: with T = 16 the second crosses from a Ulysses rank's positions
// to the next one's at U = 2 and U = 4.
inline std::vector<int32_t> packed_positions(int B, int T) {
  static constexpr int kLengths[] = {5, 7, 4};
  std::vector<int32_t> out(static_cast<size_t>(B) * T);
  for (int b = 0; b < B; ++b) {
    int sample = 0, at = 0;
    for (int t = 0; t < T; ++t) {
      if (at == kLengths[sample % 3]) ++sample, at = 0;
      out[static_cast<size_t>(b) * T + t] = at++;
    }
  }
  return out;
}

// A loss mask that leaves the Ulysses ranks unequal counts: the last 3/8 of every row's positions
// and every fourth of the rest do not count.
inline bool masked_target(int t, int T) { return t >= T - 3 * T / 8 || t % 4 == 3; }
inline int64_t counted_targets(int T) {
  int64_t n = 0;
  for (int t = 0; t < T; ++t) n += masked_target(t, T) ? 0 : 1;
  return n;
}
inline void mask_targets(int32_t* targets, int B, int T) {
  for (int b = 0; b < B; ++b) {
    for (int t = 0; t < T; ++t) {
      if (masked_target(t, T)) targets[static_cast<size_t>(b) * T + t] = -1;
    }
  }
}
inline void PrintTo(const GridCase& k, std::ostream* os) {
  *os << "dp " << k.dp << " x pp " << k.pp << " x tp " << k.tp << (k.sequence_parallel ? " (sequence parallel)" : "") << ", "
      << pipe_kind_name(k.kind) << ", ZeRO stage " << k.stage << ", m " << k.micro << ", offload " << offload_device_name(k.offload)
      << (k.checkpointing ? ", checkpointing" : "") << (k.cpu_checkpointing ? " in host memory" : "") << ", "
      << optimizer_name(k.optimizer) << ", " << dtype_name(k.compute) << (k.ep > 1 ? ", expert parallel " + std::to_string(k.ep) : "")
      << (k.force_one_expert ? ", one expert forced" : "")
      << (k.model.loss_chunk_rows > 0 ? ", loss by chunks of " + std::to_string(k.model.loss_chunk_rows) : "")
      << (k.seq > 1 ? (k.ring ? ", ring " : ", Ulysses ") + std::to_string(k.seq) : "") << (k.masked ? ", masked" : "")
      << (k.packed ? ", packed" : "");
}

struct GridResult {
  std::vector<double> losses, grad_norms;             // per step
  std::map<std::string, std::vector<float>> weights;  // per block name, whole tensors end to end
  std::vector<float> head_copy;                       // the last stage's copy of the tied embedding
  std::vector<int> in_flight;                         // per stage: micro-batches of activations held (per chunk)
  std::vector<std::string> replica_mismatches;        // replicated parameters that differ between tensor-parallel ranks
  CommStats model_tp_traffic;                         // what the model's collectives moved in rank 0's tensor-parallel group
  MoeStats moe;                                       // rank 0's routing over the run (expert layers)
};

inline constexpr int kGlobalBatch = 8, kSteps = 4;

inline EngineConfig grid_engine_config(int stage, int micro, OffloadDevice offload = OffloadDevice::none,
                                       OptimizerKind optimizer = OptimizerKind::adamw, DType compute = DType::f32) {
  EngineConfig ec = tiny_gpt_engine(stage, micro, compute);
  ec.optimizer.kind = optimizer;
  ec.zero.offload_optimizer.device = offload;
  if (offload == OffloadDevice::nvme) {
    ec.zero.offload_optimizer.nvme_path = ::testing::TempDir() + "zeroth-grid-swap";
    if (stage == 3) {
      ec.zero.offload_param.device = OffloadDevice::nvme;
      ec.zero.offload_param.nvme_path = ec.zero.offload_optimizer.nvme_path;
    }
  }
  return ec;
}

// A block's parameters as the whole tensors, end to end: this rank's master values of the block
// placed at their elements of each unsplit tensor (`into`, sized by the unsplit block), or, for a
// replicated parameter, compared with what `into` holds already (`mismatches`) when `check` is set.
inline void place_block(const Engine& engine, int block, const std::vector<float>& values, std::vector<float>& into, bool check,
                        std::vector<std::string>& mismatches) {
  const auto& spec = engine.block_spec(block);
  const auto& blk = engine.plan().blocks[block];
  size_t full_at = 0;
  for (size_t i = 0; i < spec.params.size(); ++i) {
    const auto& p = spec.params[i];
    size_t full_numel = 1;
    for (int64_t d : p.tp.split() ? p.tp.full_shape : p.shape) full_numel *= static_cast<size_t>(d);
    const float* local = values.data() + blk.param_offsets[i];
    if (!p.tp.split() && check) {
      if (!std::equal(local, local + p.numel(), into.begin() + full_at)) mismatches.push_back(spec.name + "." + p.name);
    } else {
      p.tp.put(local, into.data() + full_at, p.numel());
    }
    full_at += full_numel;
  }
}

// Every GPT-2 expert layer's router made to send every token to expert 0 first and expert 1 second:
// its second LayerNorm outputs its bias (ones) whatever the token, and the router's rows for experts
// 0 and 1 make their logits 32 and 16 against 0. Collective over the data-parallel group.
inline void force_one_expert(Engine& engine) {
  for (size_t b = 0; b < engine.plan().blocks.size(); ++b) {
    const auto& spec = engine.block_spec(static_cast<int>(b));
    const auto& blk = engine.plan().blocks[b];
    std::vector<float> values = engine.master_values(static_cast<int>(b));
    bool changed = false;
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const std::string& name = spec.params[i].name;
      float* v = values.data() + blk.param_offsets[i];
      const size_t n = spec.params[i].numel();
      if (name == "ln_2.weight") std::fill(v, v + n, 0.0f);
      if (name == "ln_2.bias") std::fill(v, v + n, 1.0f);
      if (name == "mlp.router.weight") {
        const size_t C = static_cast<size_t>(spec.params[i].shape[1]);
        std::fill(v, v + n, 0.0f);
        std::fill(v, v + C, 1.0f);
        std::fill(v + C, v + 2 * C, 0.5f);
        changed = true;
      }
    }
    if (changed) engine.set_master_values(static_cast<int>(b), values);
  }
}

// One rank, the whole model, the cycle's micro-batches one after another.
inline GridResult train_whole(const GptConfig& gc, int micro, OptimizerKind optimizer = OptimizerKind::adamw,
                              DType compute = DType::f32, bool masked = false, bool packed = false) {
  const TokenData data = TokenData::synthetic(gc.vocab_size, 1 << 14, 3);
  const int mb = kGlobalBatch / micro, T = gc.seq_len;
  GridResult out;
  auto device = make_device("cpu");
  auto comms = make_local_communicators(1);
  Engine engine(*device, *comms[0], grid_engine_config(0, micro, OffloadDevice::none, optimizer, compute));
  Gpt gpt(engine, gc);
  engine.finalize();
  if (masked) gpt.set_loss_divisor(static_cast<double>(kGlobalBatch * counted_targets(T)) / micro);
  Loader loader(data, T, mb, micro, 1, 0, 11);
  std::vector<int32_t> tokens(static_cast<size_t>(mb) * T), targets(tokens.size());
  std::vector<float> losses(micro);
  for (int s = 0; s < kSteps; ++s) {
    for (int m = 0; m < micro; ++m) {
      loader.batch(s, m, tokens.data(), targets.data());
      if (masked) mask_targets(targets.data(), mb, T);
      const std::vector<int32_t> positions = packed ? packed_positions(mb, T) : std::vector<int32_t>{};
      gpt.forward(m, tokens.data(), targets.data(), mb, T, &losses[m], packed ? positions.data() : nullptr);
      gpt.backward(m);
      engine.compute_stream().synchronize();
    }
    const auto r = engine.step();
    engine.compute_stream().synchronize();
    out.grad_norms.push_back(r.grad_norm);
    double sum = 0;
    for (float l : losses) sum += l;
    out.losses.push_back(sum / micro);
  }
  for (size_t b = 0; b < engine.plan().blocks.size(); ++b) {
    auto w = engine.master_values(static_cast<int>(b));
    w.resize(engine.plan().blocks[b].numel);
    out.weights[engine.plan().blocks[b].name] = std::move(w);
  }
  return out;
}

inline const GridResult& whole_reference(const GptConfig& gc, int micro, OptimizerKind optimizer = OptimizerKind::adamw,
                                         DType compute = DType::f32, bool masked = false, bool packed = false) {
  static std::mutex mutex;
  static std::map<std::string, GridResult> cache;
  const std::string key = std::to_string(micro) + "/" + std::to_string(gc.vocab_size) + "/" + std::to_string(gc.n_head) + "/" +
                          std::to_string(gc.n_layer) + "/" + std::to_string(gc.n_embd) + "/" + std::string(optimizer_name(optimizer)) +
                          "/" + std::string(dtype_name(compute)) + "/" + std::to_string(static_cast<int>(gc.architecture)) + "/" +
                          std::to_string(gc.kv_heads()) + "/" + std::to_string(gc.head_size()) + "/" + std::to_string(gc.ffn()) + "/" +
                          std::to_string(gc.qkv_bias) + std::to_string(gc.o_bias) + std::to_string(gc.qk_norm) +
                          std::to_string(gc.tie_word_embeddings) + "/" + std::to_string(gc.norm_eps) + "/" +
                          std::to_string(gc.rope_theta) + "/" + std::to_string(static_cast<int>(gc.rope_scaling.type)) + "/" +
                          std::to_string(gc.rope_scaling.factor) + "/" + std::to_string(masked) + "/" + std::to_string(gc.seq_len) +
                          "/" + std::to_string(packed);
  std::lock_guard lock(mutex);
  // The reference keeps its logits whole: a grid that runs the loss by chunks is checked against it.
  GptConfig whole = gc;
  whole.loss_chunk_rows = 0;
  if (!cache.contains(key)) cache[key] = train_whole(whole, micro, optimizer, compute, masked, packed);
  return cache[key];
}

struct Steps {
  int first = 0, last = kSteps;  // the steps run: [first, last)
  std::string load, save;        // a checkpoint to start from, a folder to save one in at the end
};

// What every rank does after its steps (collective work such as an export): its engine, and its
// groups as the exporters take them.
using AtEnd = std::function<void(Engine&, const StageExport&)>;

// dp x pp x tp local ranks laid out as ProcessGrid(dp, pp, tp): each runs its part, through a
// PipelineRunner when pp > 1. `measures`: each step's measured timeline (rank 0's).
inline GridResult train_grid(const GridCase& k, std::vector<PipeMeasure>* measures = nullptr, const Steps& steps = {},
                             const AtEnd& at_end = {}) {
  GptConfig gc = k.model;
  gc.activation_checkpointing = k.checkpointing;
  gc.cpu_checkpointing = k.cpu_checkpointing;
  const TokenData data = TokenData::synthetic(gc.vocab_size, 1 << 14, 3);
  const int chunks = k.kind == PipeKind::interleaved ? 2 : 1;
  const int mb = kGlobalBatch / (k.dp * k.micro), T = gc.seq_len, Tl = T / k.seq;
  // The Ulysses groups are runs of seq consecutive data-parallel ranks, reading the same samples.
  const ProcessGrid grid(k.dp * k.seq, k.pp, k.tp);
  const std::vector<int> layers = partition_layers(gc, k.pp * chunks, "uniform");
  GridResult out;
  out.in_flight.assign(k.pp, 0);
  std::mutex mutex;
  std::vector<std::vector<double>> losses(k.dp * k.seq);
  // The whole blocks by name, assembled by the ranks of dp index 0 in tensor-parallel rank order.
  std::vector<std::map<std::string, std::vector<float>>> blocks_by_stage(k.pp);
  std::vector<std::map<std::string, std::vector<float>>> head_copy_by_stage(k.pp);
  std::mutex order;
  CommOptions options = CommOptions::from_env();
  options.link = k.link;
  run_local_ranks(
      grid.world_size(),
      [&](Communicator& world) {
    auto groups = grid.split(world);
    const int stage = groups.pp->rank(), dp_rank = groups.dp->rank(), tp_rank = groups.tp->rank();
    GptPart part = GptPart::of_rank(layers, k.pp, stage);
    part.tp_rank = tp_rank, part.tp_ranks = k.tp, part.sequence_parallel = k.sequence_parallel;
    part.ep_rank = dp_rank % k.ep, part.ep_ranks = k.ep, part.ep_overlap = k.ep_overlap;
    // The expert-parallel group: runs of ep consecutive data-parallel ranks.
    auto experts = k.ep > 1 ? groups.dp->split(dp_rank / k.ep, dp_rank) : nullptr;
    auto sequence = k.seq > 1 ? groups.dp->split(dp_rank / k.seq, dp_rank) : nullptr;
    (k.ring ? part.cp_rank : part.sq_rank) = dp_rank % k.seq;
    (k.ring ? part.cp_ranks : part.sq_ranks) = k.seq;
    auto device = make_device("cpu");
    std::unique_ptr<PipelineRunner> runner;
    if (k.pp > 1) runner = std::make_unique<PipelineRunner>(*device, *groups.pp, make_pipe_schedule(k.kind, k.pp, k.micro, chunks));
    EngineConfig ec = grid_engine_config(k.stage, k.micro, k.offload, k.optimizer, k.compute);
    ec.zero.reduce_bucket_size = ec.zero.allgather_bucket_size = k.bucket;
    ec.gradient_clipping = k.clipping;
    if (k.constant_lr) ec.schedule.kind = ScheduleKind::constant, ec.schedule.base_lr = ec.optimizer.lr;
    ec.communication_dtype = k.reduction;
    ec.zero.offload_optimizer.overlap_backward = k.overlap_backward;
    Engine engine(*device, *groups.dp, ec);
    if (k.pp > 1) {
      const int tied = gc.tie_word_embeddings && (stage == 0 || stage == k.pp - 1) ? Gpt::embedding_block(gc, part) : -1;
      engine.set_pipeline(*groups.pp, tied);
      engine.set_pass_order(runner->passes());
    }
    if (k.tp > 1) engine.set_tensor_parallel(*groups.tp);
    Gpt gpt(engine, gc, part, k.tp > 1 ? groups.tp.get() : nullptr, experts.get(), sequence.get());
    engine.finalize();
    // Each rank's loss is its share of the global batch's mean over the targets that count.
    if (k.masked) gpt.set_loss_divisor(static_cast<double>(kGlobalBatch * counted_targets(T)) / (k.micro * k.dp * k.seq));
    if (!steps.load.empty()) ckpt::load(engine, steps.load);
    if (k.force_one_expert && steps.load.empty()) force_one_expert(engine);
    Loader loader(data, T, mb, k.micro, k.dp, dp_rank / k.seq, 11);
    const size_t n = static_cast<size_t>(mb) * Tl;
    std::vector<int32_t> tokens(n * k.micro), targets(n * k.micro), row_tokens(mb * T), row_targets(mb * T);
    // This rank's positions of each row of a micro-batch's whole rows.
    auto load = [&](int s, int m) {
      loader.batch(s, m, row_tokens.data(), row_targets.data());
      if (k.masked) mask_targets(row_targets.data(), mb, T);
      // A ring rank's two chunks of Tl / 2: its own and its mirror's (context_ring.h).
      const int pieces = k.ring ? 2 : 1, piece = Tl / pieces;
      for (int b = 0; b < mb; ++b) {
        for (int slot = 0; slot < pieces; ++slot) {
          const int first = k.ring ? gpt::ring_chunk(k.seq, part.cp_rank, slot) * piece : part.sq_rank * Tl;
          const size_t from = static_cast<size_t>(b) * T + static_cast<size_t>(first),
                       to = m * n + static_cast<size_t>(b) * Tl + static_cast<size_t>(slot) * piece;
          std::copy_n(row_tokens.begin() + from, piece, tokens.begin() + to);
          std::copy_n(row_targets.begin() + from, piece, targets.begin() + to);
        }
      }
    };
    std::vector<float> micro_losses(k.micro);
    // Packed: the whole rows' positions, on every rank of a Ulysses group.
    const std::vector<int32_t> positions = k.packed ? packed_positions(mb, T) : std::vector<int32_t>{};
    PipeModel model;
    model.forward = [&](int m, int c) {
      gpt.forward_chunk(m, c, tokens.data() + m * n, targets.data() + m * n, mb, Tl, &micro_losses[m],
                        k.packed ? positions.data() : nullptr);
    };
    model.backward = [&](int m, int c) { gpt.backward_chunk(m, c); };
    model.port = [&](PipePort p, int m, int c) {
      const Gpt::Port ports[] = {Gpt::Port::input, Gpt::Port::output, Gpt::Port::input_grad, Gpt::Port::output_grad};
      return gpt.port(ports[static_cast<int>(p)], m, c);
    };
    if (runner) runner->set_tracing(measures != nullptr);
    std::vector<double> norms, mine;
    for (int s = steps.first; s < steps.last; ++s) {
      for (int m = 0; m < k.micro; ++m) load(s, m);
      gpt.prepare(mb, Tl);
      if (runner) {
        runner->run_cycle(model);
      } else {
        for (int m = 0; m < k.micro; ++m) {
          model.forward(m, 0);
          model.backward(m, 0);
        }
      }
      const auto r = engine.step();
      EXPECT_TRUE(r.boundary);
      engine.compute_stream().synchronize();
      norms.push_back(r.grad_norm);
      double sum = 0;
      for (float l : micro_losses) sum += l;
      mine.push_back(sum / k.micro);
      if (measures != nullptr && runner) {
        auto measured = runner->measure(engine.compute_stream());
        if (world.rank() == 0) measures->push_back(std::move(measured));
      }
    }
    if (runner) runner->drain();                   // its channels use the model's buffers, which go first
    const CommStats traffic = groups.tp->stats();  // the model's own: the engine splits its communicators off it
    if (!steps.save.empty()) ckpt::save(engine, {.dir = steps.save});
    if (at_end) at_end(engine, {k.pp > 1 ? groups.pp.get() : nullptr, part, k.tp > 1 ? groups.tp.get() : nullptr, experts.get()});
    // Tensor-parallel ranks place their slices in turn (rank 0 first: the replicas are checked
    // against its copy).
    const auto full_specs = Gpt::block_specs(gc, GptPart::of_rank(layers, k.pp, stage));
    std::vector<std::vector<float>> values;  // master_values is collective over the data-parallel group
    for (size_t b = 0; b < engine.plan().blocks.size(); ++b) values.push_back(engine.master_values(static_cast<int>(b)));
    for (int turn = 0; turn < k.tp; ++turn) {
      groups.tp->barrier(engine.compute_stream());
      engine.compute_stream().synchronize();
      // Dense blocks from data-parallel rank 0; each slice of the experts from the first rank holding it.
      if (turn != tp_rank || dp_rank >= k.ep) continue;
      std::lock_guard lock(order);
      for (size_t b = 0; b < engine.plan().blocks.size(); ++b) {
        const bool expert = engine.plan().blocks[b].expert;
        if (!expert && dp_rank != 0) continue;
        const std::string& name = engine.plan().blocks[b].name;
        const bool copy = name == "embed" && stage != 0;
        auto& dest = (copy ? head_copy_by_stage : blocks_by_stage)[stage][name];
        size_t full = 0;
        for (const auto& p : full_specs[b].params) full += p.numel();
        if (dest.empty()) dest.assign(full, 0.0f);
        if (expert) {
          // The slices hold consecutive experts, which the whole block lists in order.
          const size_t slice = full / static_cast<size_t>(k.ep);
          std::vector<float> mine(slice, 0.0f);
          place_block(engine, static_cast<int>(b), values[b], mine, false, out.replica_mismatches);
          const auto at = dest.begin() + static_cast<std::ptrdiff_t>(dp_rank * slice);
          // Replicated over the tensor-parallel group: the other ranks' copies against rank 0's.
          if (tp_rank != 0 && !std::equal(mine.begin(), mine.end(), at)) out.replica_mismatches.push_back(name);
          std::copy(mine.begin(), mine.end(), at);
          continue;
        }
        place_block(engine, static_cast<int>(b), values[b], dest, tp_rank != 0, out.replica_mismatches);
      }
    }
    std::lock_guard lock(mutex);
    if (part.has_head(gc) && tp_rank == 0) losses[dp_rank] = mine;
    if (dp_rank != 0 || tp_rank != 0) return;
    out.in_flight[stage] = engine.micro_batches_in_flight();
    if (world.rank() == 0) out.model_tp_traffic = traffic, out.moe = gpt.take_moe_stats();
    if (stage == 0) out.grad_norms = norms;
      },
      options);
  for (int s = 0; s < k.pp; ++s) {
    for (auto& [name, w] : blocks_by_stage[s]) out.weights[name] = std::move(w);
    for (auto& [name, w] : head_copy_by_stage[s]) out.head_copy = std::move(w);
  }
  out.losses.assign(steps.last - steps.first, 0.0);
  // The ranks' losses are shares of the mean where targets are masked (their sum), means otherwise.
  for (int r = 0; r < k.dp * k.seq; ++r) {
    for (size_t s = 0; s < out.losses.size(); ++s) out.losses[s] += losses[r][s] / (k.dp * k.seq);
  }
  return out;
}

// Each step's gradient norm within `norm_bound` and loss within `loss_bound` of `ref`'s, relative
// (f32 defaults), and the loss falling where `falls`; the worst relative errors of both.
inline std::pair<double, double> expect_steps(const GridResult& got, const GridResult& ref, double norm_bound = 5e-7,
                                              double loss_bound = 3e-7, bool falls = true) {
  double norm_err = 0, loss_err = 0;
  EXPECT_EQ(got.grad_norms.size(), ref.grad_norms.size());
  EXPECT_EQ(got.losses.size(), ref.losses.size());
  for (size_t s = 0; s < std::min(got.losses.size(), ref.losses.size()) && s < got.grad_norms.size(); ++s) {
    norm_err = std::max(norm_err, std::abs(got.grad_norms[s] - ref.grad_norms[s]) / ref.grad_norms[s]);
    loss_err = std::max(loss_err, std::abs(got.losses[s] - ref.losses[s]) / ref.losses[s]);
    EXPECT_NEAR(got.grad_norms[s], ref.grad_norms[s], norm_bound * ref.grad_norms[s]) << "step " << s;
    EXPECT_NEAR(got.losses[s], ref.losses[s], loss_bound * ref.losses[s]) << "step " << s;
  }
  if (falls) {
    EXPECT_LT(got.losses.back(), got.losses.front());
  }
  return {norm_err, loss_err};
}

// Every tensor of `got` against `ref`, relative to the tensor's largest value; the worst.
inline TensorError expect_weights(const GridResult& got, const GridResult& ref, double bound, const GptConfig& gc = tiny_gpt()) {
  TensorError worst;
  EXPECT_EQ(got.weights.size(), ref.weights.size());
  for (const auto& spec : Gpt::block_specs(gc)) {
    const auto& g = got.weights.at(spec.name);
    const auto& r = ref.weights.at(spec.name);
    EXPECT_EQ(g.size(), r.size()) << spec.name;
    if (g.size() != r.size()) continue;
    size_t at = 0;
    for (const auto& p : spec.params) {
      const auto slice = [&](const std::vector<float>& w) { return std::vector<float>(w.begin() + at, w.begin() + at + p.numel()); };
      const auto e = compare(spec.name + "." + p.name, slice(g), slice(r));
      EXPECT_LT(e.rel(), bound) << e.name << ": max |difference| " << e.max_abs << " of max |value| " << e.scale;
      if (e.rel() > worst.rel()) worst = e;
      at += p.numel();
    }
  }
  return worst;
}

// A run whose samples a group of ranks splits by positions (GridCase::seq: Ulysses or the ring)
// against one rank on the same global batches: the replicas agree, every weight within `bound` of
// its tensor's largest value, the losses and gradient norms as expect_steps (plain SGD's 4 small
// steps need not lower the loss of the next step's other samples). Prints the case and its errors.
inline void expect_split_trains_like_one_rank(const GridCase& k, double bound) {
  const GridResult got = train_grid(k);
  const GridResult& ref = whole_reference(k.model, k.micro, k.optimizer, DType::f32, k.masked, k.packed);
  EXPECT_TRUE(got.replica_mismatches.empty()) << got.replica_mismatches.front();
  const TensorError worst = expect_weights(got, ref, bound, k.model);
  const auto [norm_err, loss_err] = expect_steps(got, ref, 5e-7, 3e-7, k.optimizer != OptimizerKind::sgd);
  std::printf("%s: worst weight error %.3g (%s), gradient norm %.3g, loss %.3g; loss %.6f -> %.6f\n",
              ::testing::PrintToString(k).c_str(), worst.rel(), worst.name.c_str(), norm_err, loss_err, got.losses.front(),
              got.losses.back());
}

}  // namespace zeroth::testing
