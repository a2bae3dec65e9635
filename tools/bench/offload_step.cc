// `zeroth bench offload-step`: one GPT trained at ZeRO stage 3 in bf16 with its state in memory,
// with the optimizer offloaded to host memory, and with optimizer and parameters in swap files
// (serial: the optimizer phase after the backward pass, as DeepSpeed runs it, the next forward
// pass starting beside its rest as each sub-group is published; overlapped: each sub-group updated
// during the backward pass as soon as its gradients are final; delayed: each step's update run
// under the next step, one step stale, offload_optimizer.delayed_update), in one run. Each row: the
// median step of a run without wall_clock_breakdown, and from a second run with it the step and
// its parts, the swap bytes at the disk's raw rates measured at the start of the same run, and the
// practicality (the in-memory step over the row's step, both untimed: ZenFlow's measure).
#include <unistd.h>  // getpid

#include <algorithm>   // std::max
#include <cstdio>      // std::printf
#include <filesystem>  // std::filesystem
#include <map>         // std::map
#include <memory>      // std::make_shared
#include <string>      // std::string
#include <vector>      // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "comm/local/local_comm.h"  // run_local_ranks
#include "core/error.h"             // ZEROTH_THROW
#include "core/log.h"               // log::set_level
#include "core/stats.h"             // median
#include "models/decoder/gpt.h"     // GptConfig
#include "tools/bench/offload.h"    // measure_raw_rates
#include "tools/bench/bench.h"
#include "train/trainer.h"  // train, TrainObserver

namespace zeroth::tools {
namespace bench_offload_step {

struct Options {
  std::string preset = "gpt2-350m";
  int seq = 128, batch = 1, steps = 4;
  std::string path;  // swap files' folder
  // Sub-groups become ready as their reduce bucket completes: buckets of a few layers let the
  // updates start early in the backward pass (DeepSpeed's default, 5e8, makes the model one bucket).
  uint64_t sub_group_size = 25'000'000, reduce_bucket_size = 25'000'000;
  double clipping = 1.0;
  bool json = false;
};

struct Placement {
  std::string placement, mode;
  std::string optimizer = "none", params = "none";
  bool overlap = false, delayed = false;
};

class Steps final : public TrainObserver {
 public:
  void on_step(const StepMetrics& s) override { steps.push_back(s); }
  std::vector<StepMetrics> steps;
};

// timed: wall_clock_breakdown on, for the parts (its waits hold the next cycle behind the whole
// update, as DeepSpeed's timers do); off, the step as a run without it takes.
std::vector<StepMetrics> run_placement(const Options& o, const GptConfig& m, const Placement& p, bool timed) {
  const std::filesystem::path out = std::filesystem::temp_directory_path() / fmt::format("zeroth-bench-offload-step-{}", ::getpid());
  const RemovedOnExit remove{out};
  // The delayed rows skip the warm-up of serial steps: the first step, discarded, is the only one.
  nlohmann::json offload_optimizer = {{"device", p.optimizer},
                                      {"pin_memory", true},
                                      {"overlap_backward", p.overlap},
                                      {"delayed_update", p.delayed},
                                      {"delayed_update_warmup", 0}};
  nlohmann::json offload_param = {{"device", p.params}, {"pin_memory", true}};
  if (p.optimizer == "nvme") offload_optimizer["nvme_path"] = o.path;
  if (p.params == "nvme") offload_param["nvme_path"] = o.path;
  const nlohmann::json j = {
      {"train_micro_batch_size_per_gpu", o.batch},
      {"gradient_clipping", o.clipping},
      {"wall_clock_breakdown", timed},
      {"bf16", {{"enabled", true}}},
      {"optimizer", {{"type", "AdamW"}, {"params", {{"lr", 6e-5}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}}}}},
      {"zero_optimization",
       {{"stage", 3},
        {"sub_group_size", o.sub_group_size},
        {"reduce_bucket_size", o.reduce_bucket_size},
        {"stage3_param_persistence_threshold", 100000},
        {"offload_optimizer", offload_optimizer},
        {"offload_param", offload_param}}},
      {"aio", {{"block_size", 1 << 20}, {"queue_depth", 32}}},
      {"model", {{"preset", o.preset}, {"seq_len", o.seq}}},
      {"data",
       {{"format", "synthetic"},
        {"vocab_size", m.vocab_size},
        {"tokens", std::max<int64_t>(1024, static_cast<int64_t>(o.steps + 2) * o.batch * o.seq + 1)},
        {"val_fraction", 0.0}}},
      {"run",
       {{"steps", o.steps + 1},
        {"output_dir", out.string()},
        {"sample_tokens", 0},
        {"device_memory", "1TiB"},
        {"host_memory", "1TiB"},
        {"checkpoint_interval", 0}}}};
  const TrainConfig c = TrainConfig::from_json(j);
  Steps steps;
  run_local_ranks(1, [&](Communicator& comm) {
    auto device = make_device("cpu");
    train(c, comm, *device, &steps);
  });
  steps.steps.erase(steps.steps.begin());  // warm-up: the first reads of never-written extents
  return steps.steps;
}

// Long: the raw disk rate, then one row per placement and the bound; each row is printed, kept for the JSON and held
// against the in-memory row measured first.
void run(const Options& o) {
  if (o.path.empty() || !std::filesystem::is_directory(o.path))
    ZEROTH_THROW(InvalidArgument, "--path {}: name an existing folder on the disk to put the swap files in", o.path);
  if (o.steps < 1 || o.seq < 1 || o.batch < 1) ZEROTH_THROW(InvalidArgument, "--steps, --seq and --batch must be at least 1");
  GptConfig m = GptConfig::preset(o.preset);
  m.seq_len = o.seq;
  log::set_level(log::Level::warn);
  auto say = [&](const char* format, auto... args) {
    if (!o.json) std::printf(format, args...);
    std::fflush(stdout);
  };
  say("bench offload-step: GPT %s (%.1fM parameters), %d x %d tokens per step, ZeRO-3 bf16, AdamW, clipping %g, reduce buckets and "
      "sub-groups of %.0fM and %.0fM elements; %d timed steps after 1 warm-up; swap files in %s\n",
      o.preset.c_str(), static_cast<double>(m.num_parameters()) / 1e6, o.batch, o.seq, o.clipping,
      static_cast<double>(o.reduce_bucket_size) / 1e6, static_cast<double>(o.sub_group_size) / 1e6, o.steps, o.path.c_str());
  // The disk before the runs, at their aio setting: what the swap bytes cost at its raw rate (a
  // virtual disk's rate wanders; the rows' own rates may differ).
  SwapperSetting setting;
  setting.queue_depth = 32;
  const RawRates raw = measure_raw_rates(o.path, std::size_t{1} << 30, setting);
  say("  disk before the runs: raw write %.2f GB/s, read %.2f GB/s (1 GiB, 1 MiB pieces at depth 32, O_DIRECT)\n", raw.write_gbps,
      raw.read_gbps);
  const std::vector<Placement> placements = {{"memory", "-"},
                                             {"cpu", "serial", "cpu"},
                                             {"cpu", "delayed", "cpu", "none", false, true},
                                             {"nvme", "serial", "nvme", "nvme", false},
                                             {"nvme", "overlapped", "nvme", "nvme", true},
                                             {"nvme", "delayed", "nvme", "nvme", false, true}};
  say("  %-8s %-11s %9s %9s %11s %10s %11s %13s %8s %13s  %s\n", "placement", "mode", "step ms", "timed ms", "compute ms", "update ms",
      "exposed ms", "swap GiB r/w", "I/O ms", "practicality", "in backward");
  nlohmann::json rows = nlohmann::json::array();
  double memory_step = 0, serial_io = 0, overlapped_step = 0, delayed_step = 0;
  for (const auto& p : placements) {
    const auto steps = run_placement(o, m, p, true);
    std::vector<double> step, timed, compute, update, exposed, io;
    for (const auto& s : run_placement(o, m, p, false)) step.push_back(s.step_seconds * 1e3);
    std::map<Speculation, int> outcomes;
    std::vector<double> read, written;
    for (const auto& s : steps) {
      timed.push_back(s.step_seconds * 1e3);
      compute.push_back((s.forward_seconds + s.backward_seconds) * 1e3);
      update.push_back(s.optimizer_seconds * 1e3);
      // What the step spends after the backward pass: not hidden behind compute.
      exposed.push_back((s.step_seconds - s.forward_seconds - s.backward_seconds) * 1e3);
      // The swap bytes at the raw rates, reads then writes: the I/O a step cannot do faster.
      io.push_back(
          (static_cast<double>(s.swap_read_bytes) / raw.read_gbps + static_cast<double>(s.swap_write_bytes) / raw.write_gbps) * 1e-6);
      read.push_back(static_cast<double>(s.swap_read_bytes));
      written.push_back(static_cast<double>(s.swap_write_bytes));
      ++outcomes[s.speculation];
    }
    const double step_ms = median(step);
    if (p.placement == "memory") memory_step = step_ms;
    // The serial row's: what a step must move (a redone speculation moves more).
    if (p.placement == "nvme" && p.mode == "serial") serial_io = median(io);
    if (p.placement == "nvme" && p.overlap) overlapped_step = step_ms;
    if (p.placement == "nvme" && p.delayed) delayed_step = step_ms;
    const double practicality = memory_step / step_ms;
    std::string in_backward = "-";
    if (p.overlap) {
      in_backward.clear();
      for (auto [outcome, count] : outcomes)
        in_backward += fmt::format("{}{} {}", in_backward.empty() ? "" : ", ", count, speculation_name(outcome));
    }
    say("  %-9s %-11s %9.0f %9.0f %11.0f %10.0f %11.0f %6.2f/%-6.2f %8.0f %13.2f  %s\n", p.placement.c_str(), p.mode.c_str(), step_ms,
        median(timed), median(compute), median(update), median(exposed), median(read) / (1 << 30), median(written) / (1 << 30),
        median(io), practicality, in_backward.c_str());
    rows.push_back({{"placement", p.placement},
                    {"mode", p.mode},
                    {"step_ms", step_ms},
                    {"step_ms_range", {*std::min_element(step.begin(), step.end()), *std::max_element(step.begin(), step.end())}},
                    {"timed_step_ms", median(timed)},
                    {"compute_ms", median(compute)},
                    {"update_ms", median(update)},
                    {"exposed_ms", median(exposed)},
                    {"io_ms", median(io)},
                    {"swap_read_bytes", median(read)},
                    {"swap_write_bytes", median(written)},
                    {"practicality", practicality},
                    {"in_backward", in_backward}});
  }
  // The floor an offloaded step cannot beat: the in-memory step's compute, or the swap bytes at
  // the disk's raw rate, whichever is longer.
  const double bound = std::max(memory_step, serial_io);
  say("  bound: max(in-memory step %.0f ms, swap I/O %.0f ms) = %.0f ms; on nvme the overlapped step is %.2fx it, the delayed "
      "one %.2fx\n",
      memory_step, serial_io, bound, overlapped_step / bound, delayed_step / bound);
  if (o.json) {
    std::printf("%s\n", nlohmann::json{{"preset", o.preset},
                                       {"seq", o.seq},
                                       {"batch", o.batch},
                                       {"parameters", m.num_parameters()},
                                       {"raw_write_gbps", raw.write_gbps},
                                       {"raw_read_gbps", raw.read_gbps},
                                       {"bound_ms", bound},
                                       {"rows", rows}}
                            .dump(2)
                            .c_str());
  }
}

}  // namespace bench_offload_step

void add_bench_offload_step_command(CLI::App& bench) {
  using namespace bench_offload_step;
  auto o = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand(
      "offload-step",
      "A GPT's step in memory, with the optimizer on cpu, and in swap files; serial, overlapped and delayed: practicality");
  cmd->add_option("--path", o->path, "Folder on the disk for the swap files (and a 1 GiB raw-rate file)")->required();
  cmd->add_option("--preset", o->preset, "Model shape: gpt2-350m (default), gpt2-124m, gpt2-774m, ...");
  cmd->add_option("--seq", o->seq, "Sequence length (default 128)");
  cmd->add_option("--batch", o->batch, "Sequences per step (default 1)");
  cmd->add_option("--steps", o->steps, "Timed steps per placement, after one warm-up step (default 4)");
  cmd->add_option("--sub-group-size", o->sub_group_size, "zero_optimization.sub_group_size (default 25000000)");
  cmd->add_option("--reduce-bucket-size", o->reduce_bucket_size, "zero_optimization.reduce_bucket_size (default 25000000)");
  cmd->add_option("--clipping", o->clipping, "gradient_clipping (default 1.0; 0: none)");
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace zeroth::tools
