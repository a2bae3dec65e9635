// The config box of a run's start (train/report/box.h).
#include "train/report/box.h"

#include <cstdint>  // int64_t

#include <fmt/format.h>  // fmt::format
#include <fmt/ranges.h>  // fmt::join

#include "core/cpu/kernels.h"        // cpu::num_threads
#include "core/memory.h"             // format_bytes
#include "engine/pipeline/runner.h"  // pipe_kind_name

namespace zeroth::tools {

std::string tensor_line(const TrainConfig& c) {
  const int t = c.parallel.tensor;
  const int v_min = c.model.vocab_size / t, v_max = (c.model.vocab_size + t - 1) / t, heads = c.model.n_head / t;
  const int kv = c.model.kv_heads() / t, f_min = c.model.ffn() / t, f_max = (c.model.ffn() + t - 1) / t;
  const double act = static_cast<double>(c.micro_batch_size) * c.model.seq_len * c.model.n_embd * 4;
  return fmt::format("{} ranks (Megatron's split: {} head{}{}, {} MLP units, {} vocabulary rows each){}; per layer and micro-batch, "
                     "collectives of {}: "
                     "{}",
                     t, heads, heads == 1 ? "" : "s", c.model.llama() ? fmt::format(" over {} key/value", kv) : std::string(),
                     f_min == f_max ? std::to_string(f_min) : fmt::format("{} or {}", f_max, f_min),
                     v_min == v_max ? std::to_string(v_min) : fmt::format("{} or {}", v_min, v_max),
                     c.parallel.sequence_parallel ? ", sequence parallel" : "", format_bytes(act),
                     c.parallel.sequence_parallel
                         ? "2 reduce-scatters and 2 all-gathers forward, 2 and 4 backward (the norms' outputs gathered again)"
                         : "2 all-reduces forward, 2 backward");
}

std::string si(double v) {
  if (v >= 1e9) return fmt::format("{:.2f}G", v / 1e9);
  if (v >= 1e6) return fmt::format("{:.2f}M", v / 1e6);
  if (v >= 1e3) return fmt::format("{:.1f}k", v / 1e3);
  return fmt::format("{:.0f}", v);
}

namespace {

const char* dtype_label(DType t) { return t == DType::bf16 ? "bf16" : t == DType::f16 ? "fp16" : "fp32"; }

std::string optimizer_line(const OptimizerParams& o) {
  std::string s = fmt::format("{} lr {:g}", optimizer_name(o.kind), o.lr);
  if (o.kind != OptimizerKind::sgd) s += fmt::format(", betas ({:g}, {:g})", o.beta1, o.beta2);
  if (o.weight_decay > 0) s += fmt::format(", weight decay {:g}", o.weight_decay);
  if (o.kind == OptimizerKind::lamb) s += fmt::format(", trust ratio in [{:g}, {:g}]", o.min_coeff, o.max_coeff);
  return s;
}

// Per rank, per tier that holds anything: "params 7.77 MiB, grads ..., activations ...".
std::string memory_line(const MemoryNeed& need) {
  std::string out = "per rank:";
  for (size_t t = 0; t < kTierCount; ++t) {
    const Tier tier = static_cast<Tier>(t);
    if (tier_total(need.bytes, tier) == 0) continue;
    std::string parts;
    for (MemTag tag : {MemTag::params, MemTag::grads, MemTag::optimizer, MemTag::buffers, MemTag::activations}) {
      parts += fmt::format("{}{} {}", parts.empty() ? "" : ", ", mem_tag_name(tag), format_bytes(at(need.bytes, tier, tag)));
    }
    out += fmt::format("{} {}", t == 0 ? "" : ";", tier == Tier::device ? parts : fmt::format("{}: {}", tier_name(tier), parts));
  }
  return out;
}

// Which windows (samples) of the validation data a run's validation measures, and how `zeroth eval`
// measures the same ones.
std::string validation_scope(const TrainConfig& c, int64_t of) {
  const int64_t asked = c.run.eval_batches * c.micro_batch_size * c.sample_parallel();
  const std::string rows = c.data.format != DataFormat::jsonl ? fmt::format("windows of {} tokens", c.model.seq_len)
                           : c.data.packing                   ? "packed rows"
                                                              : "samples";
  if (c.run.eval_batches == 0 || asked >= of) return fmt::format("all {} {} (as zeroth eval measures them)", of, rows);
  return fmt::format("the first {} of {} {} (run.eval_batches {} x {} sequences x {} data-parallel ranks; zeroth eval measures all, "
                     "zeroth eval --windows {} these)",
                     asked, of, rows, c.run.eval_batches, c.micro_batch_size, c.sample_parallel(), asked);
}

// JSON Lines data: the samples, what the loss counts, and what reading skipped or cut.
std::string samples_line(const TrainConfig& c, const RunFacts& f) {
  const corpus::SampleStats& s = *f.samples;
  std::string out = fmt::format("{}: {} samples train ({} tokens, {} counted: loss on {}), validation {} {}", c.data.train, s.samples,
                                si(static_cast<double>(s.tokens)), si(static_cast<double>(s.counted)),
                                c.data.loss_on == corpus::LossOn::automatic ? "the assistant's turns or completions"
                                                                            : corpus::loss_on_name(c.data.loss_on),
                                f.val_rows, c.data.packing ? "packed rows" : "samples");
  std::vector<std::string> dropped;
  if (s.skipped.empty_conversations > 0) dropped.push_back(fmt::format("{} empty conversations", s.skipped.empty_conversations));
  if (s.skipped.without_assistant > 0) dropped.push_back(fmt::format("{} without an assistant turn", s.skipped.without_assistant));
  if (s.nothing_trained > 0) dropped.push_back(fmt::format("{} with nothing counted within the window", s.nothing_trained));
  if (!dropped.empty()) out += fmt::format("; skipped {}", fmt::join(dropped, ", "));
  if (s.truncated > 0) out += fmt::format("; {} cut to model.seq_len{} tokens", s.truncated, c.data.packing ? "" : " + 1");
  if (c.data.packing)
    out += fmt::format("; packed into {} rows of {} tokens, {:.1f}% filled", f.train_rows, c.model.seq_len, 100 * f.packing_fill);
  return out;
}

// model.tiled_mlp as a micro-batch of `rows` rows sees it (a tile that holds them all is the whole MLP).
std::string mlp_tiles(const GptConfig& m, int64_t rows) {
  if (m.mlp_tile_rows <= 0) return "";
  if (m.mlp_tile_rows >= rows) return fmt::format(", MLP whole (a tile of {} rows holds a micro-batch's {})", m.mlp_tile_rows, rows);
  return fmt::format(", MLP by tiles of {} rows", m.mlp_tile_rows);
}

}  // namespace

// Long: the run's box row by row, in the order printed; each row is one line of the box.
std::vector<std::pair<std::string, std::string>> box_rows(const TrainConfig& c, const Plan& plan, const RunFacts& f,
                                                          const std::string& peak_how) {
  const auto& m = c.model;
  const int64_t gas = c.engine.gradient_accumulation_steps;
  std::vector<std::pair<std::string, std::string>> rows;
  rows.reserve(16);  // also keeps GCC 12's -Warray-bounds from misreading the first emplace_back
  const std::string active = m.moe.enabled() ? fmt::format(" ({} active per token)", si(static_cast<double>(m.active_parameters())))
                                             : std::string();
  rows.emplace_back("model", fmt::format("{}{}, seq {}, vocab {}: {} parameters{}{}{}{}", m.describe(),
                                         c.model_preset.empty() ? "" : " (" + c.model_preset + ")", m.seq_len, m.vocab_size,
                                         si(static_cast<double>(f.parameters)), active,
                                         m.activation_checkpointing ? ", activation checkpointing" : "",
                                         m.loss_chunk_rows > 0 ? fmt::format(", loss by chunks of {} tokens", m.loss_chunk_rows) : "",
                                         mlp_tiles(m, static_cast<int64_t>(c.micro_batch_size) * m.seq_len)));
  if (!m.frozen_blocks.empty() || m.lora.enabled()) {
    size_t all = 0, trained = 0;
    for (const auto& spec : Gpt::block_specs(m)) {
      for (const auto& p : spec.params) all += p.numel(), trained += spec.frozen ? 0 : p.numel();
    }
    const std::string what = m.lora.enabled()
                                 ? fmt::format("LoRA r {}, alpha {:g} (scale {:g}) on {}; the base model's {} frozen", m.lora.r,
                                               m.lora.alpha, m.lora.scale(), fmt::join(m.lora.target_modules, ", "),
                                               si(static_cast<double>(all - trained)))
                                 : fmt::format("{} block(s) frozen (model.trainable / model.frozen)", m.frozen_blocks.size());
    rows.emplace_back("trainable", fmt::format("{} of {} parameters ({:.2f}%); {}: no gradients, reduction or optimizer state for the "
                                               "frozen ones",
                                               si(static_cast<double>(trained)), si(static_cast<double>(all)),
                                               100.0 * static_cast<double>(trained) / static_cast<double>(all), what));
  }
  if (m.moe.enabled()) {
    const auto& e = m.moe;
    rows.emplace_back("experts",
                      fmt::format("top {} of {}, {}, aux loss x {:g}{}", e.top_k, e.num_experts,
                                  e.drop_tokens ? fmt::format("capacity factor {:g} (eval {:g}), at least {}", e.capacity_factor,
                                                              e.eval_capacity_factor, e.min_capacity)
                                                : std::string("dropless"),
                                  e.aux_loss_coef, e.z_loss_coef > 0 ? fmt::format(", z loss x {:g}", e.z_loss_coef) : std::string()));
    if (c.parallel.expert > 1) {
      // What parallel.expert took: each rank's share, and where the exchanges run.
      rows.back().second += fmt::format("; over runs of {} ranks, {} per rank, all-to-alls {}", c.parallel.expert,
                                        e.num_experts / c.parallel.expert,
                                        c.parallel.expert_overlap ? "under the products" : "in turn");
    }
  }
  const std::string source = c.data.format == DataFormat::synthetic ? "synthetic" : c.data.train;
  if (f.samples) {
    rows.emplace_back("data", samples_line(c, f));
  } else {
    rows.emplace_back("data", fmt::format("{}: {} tokens train, {} validation", source, si(static_cast<double>(f.train_tokens)),
                                          si(static_cast<double>(f.val_tokens))));
  }
  rows.emplace_back(
      "parallel",
      fmt::format("{} rank{} ({}, {} kernel thread{} each), ZeRO stage {}, {} compute, fp32 master weights{}, {} reduction",
                  c.run.world_size, c.run.world_size == 1 ? "" : "s",
                  c.run.backend == "local" ? "threads" : c.run.backend + " processes", cpu::num_threads(),
                  cpu::num_threads() == 1 ? "" : "s", c.engine.zero.stage, dtype_label(c.engine.compute_dtype),
                  // A frozen parameter has none: it is held in the compute dtype alone.
                  c.model.lora.enabled() || !c.model.frozen_blocks.empty() ? " of the trainable parameters" : "",
                  dtype_label(c.engine.communication_dtype)));
  if (c.parallel.pipeline > 1) {
    const auto layers = c.layers_per_virtual_stage();
    rows.emplace_back("pipeline",
                      fmt::format("{} stages x {} data-parallel, {}{}, {} micro-batches; layers per {}stage: {}", c.parallel.pipeline,
                                  c.data_parallel(), pipe_kind_name(c.parallel.schedule),
                                  c.parallel.virtual_stages > 1 ? fmt::format(" ({} chunks per stage)", c.parallel.virtual_stages)
                                                                : "",
                                  gas, c.parallel.virtual_stages > 1 ? "virtual " : "", fmt::join(layers, " ")));
  }
  if (c.parallel.tensor > 1) rows.emplace_back("tensor", tensor_line(c));
  if (c.parallel.sequence > 1) {
    const int U = c.parallel.sequence, heads = c.model.n_head / c.parallel.tensor, kv = c.model.kv_heads() / c.parallel.tensor;
    rows.emplace_back("sequence", fmt::format("Ulysses over runs of {} ranks: {} positions of each sample per rank; attention on {} "
                                              "query head{} and {} key/value head{} per rank over all {}{}",
                                              U, c.model.seq_len / U, heads / U, heads / U == 1 ? "" : "s", kv % U == 0 ? kv / U : 1,
                                              kv % U == 0 && kv / U != 1 ? "s" : "", c.model.seq_len,
                                              kv % U == 0 ? "" : " (key/value heads replicated)"));
  }
  if (c.parallel.context > 1) {
    const int C = c.parallel.context;
    const int64_t chunk = c.model.seq_len / (2 * C);
    rows.emplace_back("context", fmt::format("ring attention over runs of {} ranks: each sample in {} chunks of {} positions, rank r "
                                             "holding chunks r and {} - r ({} positions); keys and values go round the ring",
                                             C, 2 * C, chunk, 2 * C - 1, 2 * chunk));
  }
  const int samples = c.sample_parallel();
  rows.emplace_back("batch",
                    fmt::format("{} seq/rank x {} {} x {} data-parallel rank{}{} = {} sequences = {} tokens/step", c.micro_batch_size,
                                gas, c.parallel.pipeline > 1 ? "micro-batches" : "accumulation", samples, samples == 1 ? "" : "s",
                                c.parallel.sequence > 1  ? fmt::format(" (groups of {} Ulysses ranks)", c.parallel.sequence)
                                : c.parallel.context > 1 ? fmt::format(" (groups of {} ring attention ranks)", c.parallel.context)
                                                         : "",
                                c.train_batch_size, si(static_cast<double>(c.tokens_per_step()))));
  rows.emplace_back("optimizer",
                    optimizer_line(c.engine.optimizer) +
                        (c.engine.gradient_clipping > 0 ? fmt::format(", clip {:g}", c.engine.gradient_clipping) : "") +
                        (c.resolved.contains("optimizer") ? "" : " (zeroth's default: the config has no optimizer section)"));
  rows.emplace_back("schedule", c.engine.schedule.describe());
  rows.emplace_back("steps", fmt::format("{}, print every {}, validation {}", c.run.steps, c.steps_per_print,
                                         c.run.eval_interval > 0 ? fmt::format("every {} steps", c.run.eval_interval) : "at the end"));
  if (f.val_rows > 0) rows.emplace_back("validation", validation_scope(c, f.val_rows));
  rows.emplace_back("memory", memory_line(f.need));
  rows.emplace_back("mfu", fmt::format("model FLOPs {} per token (6 N + 12 L H Q T, PaLM's) against {}", si(c.model.flops_per_token()),
                                       peak_how));
  if (const auto& o = c.engine.zero.offload_optimizer; o.enabled() && o.ratio < 1) {
    const int buckets = static_cast<int>(plan.reduce_buckets.size());
    rows.emplace_back("offload",
                      fmt::format("ratio {:g}: the optimizer state of {} of {} reduce bucket(s) stays on the device ({:.1f}% "
                                  "of the shard){}",
                                  o.ratio, plan.device_buckets, buckets,
                                  100.0 * static_cast<double>(plan.device_owned) / static_cast<double>(plan.shard_numel),
                                  plan.device_buckets == 0 ? "; lower zero_optimization.reduce_bucket_size to keep some" : ""));
  }
  // DeepSpeed keys that change nothing here, named once (the README's table says why for each).
  for (const auto& n : c.no_effect) rows.emplace_back("no effect", n);
  // Where the weights start: a resume says so when it loads; run.init_from here.
  if (c.run.resume.empty() && !c.run.init_from.empty()) rows.emplace_back("weights", "from " + c.run.init_from + " (run.init_from)");
  rows.emplace_back("output", c.run.output_dir + "/metrics.jsonl");
  if (c.monitors.tensorboard.enabled) rows.emplace_back("monitor", "tensorboard: " + c.monitors.tensorboard.dir());
  if (c.monitors.csv.enabled) rows.emplace_back("monitor", "csv_monitor: " + c.monitors.csv.dir() + " (a file per tag)");
  if (c.run.checkpoint_interval < 0) rows.emplace_back("checkpoint", "none (run.checkpoint_interval = -1)");
  else
    rows.emplace_back("checkpoint",
                      fmt::format("{}: {}{}{}", c.run.checkpoint_dir,
                                  c.run.checkpoint_interval > 0
                                      ? fmt::format("every {} steps and at the end", c.run.checkpoint_interval)
                                      : std::string("at the end"),
                                  c.run.keep_last > 0 ? fmt::format(", the newest {} kept", c.run.keep_last) : std::string(),
                                  c.run.checkpoint_async ? ", written in the background" : ""));
  return rows;
}

}  // namespace zeroth::tools
