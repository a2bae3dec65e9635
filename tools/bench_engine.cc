// `zeroth bench engine`: step time of the ZeRO stages on the local backend with a link model,
// so that overlap of communication with compute shows on CPUs. The link's bandwidth is chosen
// so that stage 3's communication per step takes a given fraction of the compute time; stage 3
// with prefetch should then cost about max(compute, communication), without it their sum.
#include <cblas.h>  // openblas_set_num_threads

#include <chrono>     // std::chrono::steady_clock
#include <cstdio>     // std::printf
#include <memory>     // std::make_shared
#include <random>     // std::mt19937
#include <string>     // std::string
#include <vector>     // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/stats.h"  // median
#include "comm/local/local_comm.h"  // run_local_ranks
#include "core/error.h"             // ZEROTH_CHECK
#include "engine/engine.h"          // Engine
#include "models/mlp/mlp.h"         // Mlp
#include "tools/commands.h"

namespace zeroth::tools {
namespace {

struct Options {
  // One rank per core: with more ranks than cores, a rank waiting on the link frees its core for
  // another rank's compute, and exposed communication would not show in the step time.
  int ranks = 2;
  int layers = 6;
  int width = 768;
  int batch = 64;  // rows per rank
  int steps = 10;
  double ratio = 0.5;       // stage 3's communication time / compute time
  double latency_us = 20;
  bool json = false;
};

struct Timing {
  double step_s = 0;
  uint64_t bus_bytes = 0;  // per step, rank 0
  uint64_t ops = 0;        // collectives per step, rank 0
};

Timing time_stage(const Options& o, int stage, bool prefetch, const LinkModel& link) {
  EngineConfig c;
  c.zero.stage = stage;
  c.zero.overlap_comm = true;
  const uint64_t block = static_cast<uint64_t>(o.width) * (o.width + 1);
  c.zero.reduce_bucket_size = block;          // one block per bucket: reductions start during backward
  c.zero.allgather_bucket_size = block;
  c.zero.stage3_prefetch_bucket_size = prefetch ? 2 * block : 0;
  c.zero.stage3_max_reuse_distance = 0;
  c.zero.stage3_param_persistence_threshold = 0;
  c.optimizer.lr = 1e-3;
  c.schedule.base_lr = 1e-3;
  CommOptions comm_options = CommOptions::from_env();
  comm_options.link = link;
  Timing timing;
  run_local_ranks(o.ranks, [&](Communicator& comm) {
    auto device = make_device("cpu");
    Engine engine(*device, comm, c);
    Mlp mlp(engine, {std::vector<int>(o.layers + 1, o.width)});
    engine.finalize();
    std::vector<float> x(static_cast<size_t>(o.batch) * o.width), t(x.size());
    std::mt19937 gen(comm.rank());
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : x) v = u(gen);
    for (auto& v : t) v = u(gen);
    float loss = 0;
    std::vector<double> times;
    CommStats before{};
    for (int s = 0; s < o.steps + 2; ++s) {
      if (s == 2) before = engine.comm_stats();
      const auto start = std::chrono::steady_clock::now();
      mlp.forward_backward(x.data(), t.data(), o.batch, &loss);
      engine.step();
      if (s >= 2) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    }
    if (comm.rank() != 0) return;
    const auto after = engine.comm_stats();
    for (size_t op = 0; op < kCollectiveOpCount; ++op) {
      timing.bus_bytes += (after.bus_bytes[op] - before.bus_bytes[op]) / o.steps;
      timing.ops += (after.calls[op] - before.calls[op]) / o.steps;
    }
    timing.step_s = median(times);
  }, comm_options);
  return timing;
}

void run(const Options& o) {
  ZEROTH_CHECK(o.ranks >= 1 && o.layers >= 1 && o.width >= 1 && o.batch >= 1 && o.steps >= 1, "bench engine: sizes must be positive");
  ZEROTH_CHECK(o.ratio > 0, "bench engine: --ratio must be positive");
  // Ranks are threads here; BLAS threads on top would oversubscribe the cores.
  openblas_set_num_threads(1);
  const LinkModel free_link{};
  const Timing compute = time_stage(o, 0, false, free_link);
  const Timing calib = time_stage(o, 3, true, free_link);
  // Stage 3's communication takes ratio * compute: bus bytes / bandwidth + ops * latency.
  const double target = o.ratio * compute.step_s;
  const double transfer = target - calib.ops * o.latency_us * 1e-6;
  ZEROTH_CHECK(transfer > 0, "bench engine: {} collectives at {} us latency already exceed the communication budget of {:.3f} ms; lower --latency-us",
               calib.ops, o.latency_us, target * 1e3);
  const LinkModel link{o.latency_us, calib.bus_bytes / transfer / 1e9};
  struct Row {
    std::string name;
    Timing t;
  };
  std::vector<Row> rows = {{"stage0", time_stage(o, 0, false, link)},
                           {"stage1", time_stage(o, 1, false, link)},
                           {"stage2", time_stage(o, 2, false, link)},
                           {"stage3", time_stage(o, 3, false, link)},
                           {"stage3_prefetch", time_stage(o, 3, true, link)}};
  const double params = static_cast<double>(o.layers) * o.width * (o.width + 1);
  if (o.json) {
    nlohmann::json j{{"ranks", o.ranks}, {"params", params}, {"compute_s", compute.step_s}, {"comm_s", target},
                     {"link_gbps", link.bandwidth_gbps}, {"latency_us", link.latency_us}};
    for (const auto& r : rows) j[r.name + "_step_s"] = r.t.step_s;
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("# zeroth bench engine: local backend, %d ranks, MLP %d x %d (%.2f M params), %d rows per rank, f32, median of %d steps\n",
              o.ranks, o.layers, o.width, params / 1e6, o.batch, o.steps);
  std::printf("# compute: %.2f ms per step (stage 0 with free communication)\n", compute.step_s * 1e3);
  std::printf("# link model: %.3f GB/s, %.0f us per op: stage 3 moves %.2f MB per rank per step in %llu ops = %.2f ms (%.2f x compute)\n",
              link.bandwidth_gbps, link.latency_us, calib.bus_bytes / 1e6, static_cast<unsigned long long>(calib.ops),
              target * 1e3, o.ratio);
  std::printf("%-18s %12s %12s %14s\n", "config", "step(ms)", "vs stage0", "vs compute");
  for (const auto& r : rows) {
    std::printf("%-18s %12.2f %11.2fx %13.2fx\n", r.name.c_str(), r.t.step_s * 1e3, r.t.step_s / rows[0].t.step_s,
                r.t.step_s / compute.step_s);
  }
}

}  // namespace

void add_bench_engine_command(CLI::App& bench) {
  auto options = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("engine", "ZeRO stage step times with a link model (overlap of communication and compute)");
  cmd->add_option("--ranks", options->ranks, "Local ranks (default 2: one per core on the 2-core machines)");
  cmd->add_option("--layers", options->layers, "MLP layers (default 6)");
  cmd->add_option("--width", options->width, "MLP width (default 768)");
  cmd->add_option("--batch", options->batch, "Rows per rank per step (default 64)");
  cmd->add_option("--steps", options->steps, "Timed steps per configuration, after 2 warm-up steps (default 10)");
  cmd->add_option("--ratio", options->ratio, "Stage 3's communication time as a fraction of compute (default 0.5)");
  cmd->add_option("--latency-us", options->latency_us, "Link latency per collective (default 20)");
  cmd->add_flag("--json", options->json, "Print JSON");
  cmd->callback([options] { run(*options); });
}

}  // namespace zeroth::tools
