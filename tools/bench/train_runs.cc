// zeroth's training runs that `zeroth bench train` times: the config of each variant (the dense
// model, experts, LoRA, Ulysses), run on local ranks, and the longest window a budget holds.
#include "tools/bench/train_runs.h"

#include <unistd.h>  // getpid

#include <algorithm>   // std::max
#include <filesystem>  // std::filesystem::temp_directory_path

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "comm/local/local_comm.h"  // run_local_ranks
#include "tools/bench/bench.h"      // RemovedOnExit
#include "train/trainer.h"          // train, largest_stage

namespace zeroth::tools {


GptConfig TrainBenchOptions::model() const {
  GptConfig m = GptConfig::preset(preset);
  m.seq_len = seq;
  if (layers > 0) m.n_layer = layers;
  if (hidden > 0) m.n_embd = hidden;
  if (heads > 0) m.n_head = heads;
  if (hidden > 0 || heads > 0) m.head_dim = 0;  // hidden / heads
  if (kv_heads > 0) m.n_kv_head = kv_heads;
  if (ffn > 0) m.intermediate_size = ffn;
  if (vocab > 0) m.vocab_size = vocab;
  m.activation_checkpointing = checkpointing || host_checkpoints;
  m.cpu_checkpointing = host_checkpoints;
  return m;
}

nlohmann::json run_config(const TrainBenchOptions& o, const GptConfig& model, const RunShape& r) {
  const bool moe = r.moe;
  const int lora_r = r.lora_r;
  nlohmann::json j = {{"train_micro_batch_size_per_gpu", o.batch},
                      {"gradient_clipping", 1.0},
                      {"optimizer",
                       {{"type", "AdamW"}, {"params", {{"lr", 6e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}}},
                      {"zero_optimization", {{"stage", o.stage}}},
                      {"model", {{"preset", o.preset}, {"seq_len", model.seq_len}}},
                      {"data",
                       {{"format", "synthetic"},
                        {"vocab_size", model.vocab_size},
                        {"tokens", std::max<int64_t>(1024, static_cast<int64_t>(o.steps + 2) * o.batch * model.seq_len * o.ranks + 1)},
                        {"val_fraction", 0.0}}},
                      {"run", {{"steps", o.steps + 1}, {"world_size", o.ranks}}}};
  if (o.dtype == "bf16") j["bf16"] = {{"enabled", true}};
  if (o.offload != "none") j["zero_optimization"]["offload_optimizer"] = {{"device", o.offload}, {"pin_memory", true}};
  if (model.loss_chunk_rows > 0) j["model"]["chunked_loss"] = model.loss_chunk_rows;
  // The shape options, as the model section's keys over the preset's.
  if (o.layers > 0) j["model"]["n_layer"] = model.n_layer;
  if (o.hidden > 0 || o.heads > 0) j["model"]["n_embd"] = model.n_embd, j["model"]["n_head"] = model.n_head;
  if (model.llama() && (o.hidden > 0 || o.heads > 0)) j["model"]["head_dim"] = model.n_embd / model.n_head;
  if (o.kv_heads > 0) j["model"]["n_kv_head"] = model.n_kv_head;
  if (o.ffn > 0) j["model"]["intermediate_size"] = model.intermediate_size;
  if (o.vocab > 0) j["model"]["vocab_size"] = model.vocab_size;
  if (model.activation_checkpointing) j["model"]["activation_checkpointing"] = true;
  if (model.cpu_checkpointing) j["activation_checkpointing"] = {{"cpu_checkpointing", true}};
  if (model.mlp_tile_rows > 0) j["model"]["tiled_mlp"] = model.mlp_tile_rows;
  if (lora_r > 0) j["lora"] = {{"r", lora_r}, {"alpha", 2 * lora_r}, {"target_modules", o.lora_targets}};
  if (moe) {
    j["model"]["moe"] = {{"num_experts", o.experts},
                         {"top_k", o.top_k},
                         {"intermediate_size", model.ffn() / o.top_k},
                         {"capacity_factor", o.capacity_factor > 0 ? o.capacity_factor : 1.0},
                         {"drop_tokens", o.capacity_factor > 0}};
    if (o.expert_parallel > 1) j["parallel"] = {{"expert", o.expert_parallel}, {"expert_overlap", r.overlap}};
  }
  if (r.sequence > 1) {
    // Ulysses: its samples shared over runs of `sequence` ranks; wall_clock_breakdown times the exchanges.
    j["parallel"]["sequence"] = r.sequence;
    j["wall_clock_breakdown"] = true;
  }
  if (r.context > 1) {
    // Ring attention alike; wall_clock_breakdown times the compute stream's waits for the sends.
    j["parallel"]["context"] = r.context;
    j["wall_clock_breakdown"] = true;
  }
  j["run"]["sample_tokens"] = 0;
  j["run"]["device"] = o.device;
  return j;
}

StepTimes run_zeroth(const TrainBenchOptions& o, const GptConfig& model, const RunShape& r) {
  nlohmann::json j = run_config(o, model, r);
  // What a run writes (checkpoint, weights, metrics) goes to a folder of its own, removed after:
  // a benchmark leaves nothing in runs/.
  const std::filesystem::path out = std::filesystem::temp_directory_path() / fmt::format("zeroth-bench-train-{}", ::getpid());
  j["run"]["output_dir"] = out.string();
  const RemovedOnExit remove{out};
  const TrainConfig c = TrainConfig::from_json(j);
  StepTimes times;
  CommOptions options = CommOptions::from_env();
  options.link = r.link;
  run_local_ranks(
      o.ranks,
      [&](Communicator& comm) {
    auto device = make_device(o.device);
    train(c, comm, *device, comm.rank() == 0 ? &times : nullptr);
      },
      options);
  times.seconds.erase(times.seconds.begin());  // warm-up
  return times;
}

int longest_window(const TrainBenchOptions& o, GptConfig model, const RunShape& r, size_t budget, int step) {
  auto need = [&](int seq) {
    model.seq_len = seq;
    return largest_stage(TrainConfig::from_json(run_config(o, model, r))).need.total(Tier::device);
  };
  int lo = 0, hi = step;  // windows (multiples of `step`) that fit, and that do not once found
  while (need(hi) <= budget) lo = hi, hi *= 2;
  while (hi - lo > step) {
    const int mid = lo + (hi - lo) / 2 / step * step;
    (need(mid) <= budget ? lo : hi) = mid;
  }
  return lo;
}

}  // namespace zeroth::tools
