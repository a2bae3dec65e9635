// zeroth's training runs that `zeroth bench train` times (tools/bench/train.cc prints them).
#pragma once

#include <cstddef>  // size_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "comm/communicator.h"          // LinkModel
#include "models/decoder/gpt.h"         // GptConfig
#include "train/config/train_config.h"  // TrainConfig
#include "train/trainer.h"              // TrainObserver

namespace zeroth::tools {

struct TrainBenchOptions {
  std::string preset = "gpt2-124m";
  int seq = 256;
  int batch = 4;
  int steps = 5;
  int threads = 0;  // 0: every core
  std::string dtype = "fp32";
  int stage = 0;
  std::string offload = "none";  // offload_optimizer.device: none or cpu (pinned host memory)
  // Mixture of experts: the preset's MLP made `experts` experts of ffn / top_k each (the FLOPs a
  // token meets stay the dense model's), timed next to the dense model on `ranks` local ranks with
  // the experts shared over `expert_parallel` of them.
  int experts = 0, top_k = 2, ranks = 1, expert_parallel = 1;
  double capacity_factor = 1.0;
  // A modeled link under the all-to-alls (comm/communicator.h's LinkModel): the expert runs are
  // timed with them in turn and overlapped, next to the free (memcpy) exchange.
  double link_gbps = 0, link_latency_us = 0;
  // The LM head and loss by chunks of this many tokens (model.chunked_loss), timed next to the
  // whole logits; 0: not timed.
  int loss_chunk = 0;
  int tiled_mlp = 0;
  // Ulysses over this many of the ranks (parallel.sequence), timed next to one rank a sample at the
  // longest window the same device memory holds; 1: not timed.
  int sequence = 1;
  // Ring attention over this many of the ranks (parallel.context), timed alike; 1: not timed.
  int context = 1;
  // The ranks that share a sample (Ulysses' or the ring's).
  int group() const { return sequence * context; }
  // The preset's shape changed (0: the preset's): layers, width, heads, key/value heads, MLP width.
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0;
  // Activation checkpointing, and its checkpoints in host memory.
  bool checkpointing = false, host_checkpoints = false;
  // The preset with the shape options applied.
  GptConfig model() const;
  // LoRA of this rank on `lora_targets` (alpha 2 r), the base frozen, timed next to the full
  // fine-tune with both runs' peak device memory and its estimate; 0: not timed.
  int lora_r = 0;
  std::vector<std::string> lora_targets{"all-linear"};  // lora.target_modules
  bool reference = true;
  bool json = false;
  std::string device = "cpu";
  // A GPU's dense bf16 (f32 with --dtype fp32) peak for MFU; 0: the known GPUs' data-sheet figure.
  std::string peak_flops;
  std::string python = "/usr/bin/python3";
  std::string script = std::string(ZEROTH_SOURCE_DIR) + "/tools/bench/train_torch.py";
};

// What rank 0 saw of a timed run: each step's seconds (the warm-up dropped), the device bytes its
// estimate holds and the measured peak, and with Ulysses the exchanges' time within the passes.
class StepTimes final : public TrainObserver {
 public:
  void on_start(const TrainConfig&, const Plan&, const RunFacts& facts) override { estimate = facts.need.total(Tier::device); }
  void on_step(const StepMetrics& s) override {
    seconds.push_back(s.step_seconds);
    exchange_seconds.push_back(s.sequence_exchange_seconds);
    pass_seconds.push_back(s.forward_seconds + s.backward_seconds);
  }
  void on_end(const TrainSummary& s) override { peak = s.peak_total; }
  std::vector<double> seconds, exchange_seconds, pass_seconds;
  size_t estimate = 0, peak = 0;  // rank 0's device bytes: the run's estimate, the measured peak
};

// The variant a run times: the dense model, or (moe) the experts with their all-to-alls overlapped
// or in turn under `link`; LoRA of rank lora_r on every linear layer instead of the full
// fine-tune; Ulysses over `sequence` of the ranks, or ring attention over `context` of them.
struct RunShape {
  bool moe = false, overlap = true;
  LinkModel link = {};
  int lora_r = 0;
  int sequence = 1, context = 1;  // Ulysses' or the ring's group
};
// The run's training config (model.seq_len is `model`'s), and the run on o.ranks local ranks.
nlohmann::json run_config(const TrainBenchOptions& o, const GptConfig& model, const RunShape& r);
StepTimes run_zeroth(const TrainBenchOptions& o, const GptConfig& model, const RunShape& r = {});
// The longest window, in steps of `step` positions, whose run (the engine's own estimate of its
// rank that holds the most) fits `budget` device bytes; 0 when not even `step` does.
int longest_window(const TrainBenchOptions& o, GptConfig model, const RunShape& r, size_t budget, int step);

}  // namespace zeroth::tools
