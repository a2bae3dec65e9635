// `zeroth bench engine`: step time of ZeRO stage 3 with prefetch, without it, and with
// overlap_comm false, against what overlap of communication with compute can give at best
// (max(compute, communication)) and what serialising them costs (compute + communication).
// Two transports, reported apart because they answer different questions:
// - the link model: ranks as threads, each collective's stream sleeps until the time a link of
//   a set latency and bandwidth would take. A model of a network whose transfers cost no CPU (as
//   a GPU's copy engines and NICs do): it shows what the engine's schedule hides.
// - gloo: ranks as processes over loopback TCP on the same cores. Real communication, whose
//   copies and protocol cost CPU time the compute also needs: what this machine gets.
#include <unistd.h>  // getpid

#include <algorithm>   // std::minmax_element, std::max
#include <chrono>      // std::chrono::steady_clock
#include <cstdio>      // std::printf, std::remove
#include <filesystem>  // std::filesystem::temp_directory_path
#include <fstream>     // std::ifstream, std::ofstream
#include <memory>      // std::make_shared
#include <random>      // std::mt19937
#include <string>      // std::string
#include <vector>      // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "comm/gloo/gloo_comm.h"    // make_gloo_communicator
#include "comm/local/local_comm.h"  // run_local_ranks
#include "comm/rendezvous.h"        // rendezvous_from_env
#include "core/cpu/gemm.h"          // cpu::set_gemm_threads
#include "core/env.h"               // env::kLogLevel
#include "core/error.h"             // ZEROTH_CHECK
#include "core/log.h"               // log::set_level
#include "core/stats.h"             // median
#include "engine/engine.h"          // Engine
#include "models/mlp/mlp.h"         // Mlp
#include "tools/bench/bench.h"
#include "tools/launch/launcher.h"  // run_launch

namespace zeroth::tools {
namespace bench_engine {

struct Options {
  // One rank per core: with more ranks than cores, a rank waiting on the link frees its core for
  // another rank's compute, and exposed communication would not show in the step time.
  int ranks = 2;
  // 8 x 1536 (18.9 M parameters) at 96 rows per rank: a step computes for about 0.65 s on one
  // core, and stage 3 moves 109 MB per rank, which loopback TCP takes a fair fraction of that.
  int layers = 8;
  int width = 1536;
  int batch = 96;  // rows per rank
  int warmup = 2;
  int steps = 5;
  int rounds = 2;
  double ratio = 0.5;  // the link model's stage-3 communication time / compute time
  double latency_us = 20;
  bool gloo = true;
  bool all_stages = false;
  bool json = false;
  std::string worker_out;  // set in the gloo processes the bench starts: rank 0 writes its timings here
};

// One configuration timed.
struct Row {
  std::string name;
  int stage = 3;
  bool prefetch = true;
  bool overlap = true;
  int batch = 0;  // rows per rank; 0: the options'
};

struct Timing {
  std::vector<double> steps;        // seconds, rank 0
  uint64_t bus_bytes = 0, ops = 0;  // per step, rank 0
  double median() const { return zeroth::median(steps); }
  void add(const Timing& more) {
    steps.insert(steps.end(), more.steps.begin(), more.steps.end());
    bus_bytes = more.bus_bytes;
    ops = more.ops;
  }
  double min() const { return *std::min_element(steps.begin(), steps.end()); }
  double max() const { return *std::max_element(steps.begin(), steps.end()); }
};

EngineConfig row_config(const Options& o, const Row& r) {
  EngineConfig c;
  c.zero.stage = r.stage;
  c.zero.overlap_comm = r.overlap;
  const uint64_t block = static_cast<uint64_t>(o.width) * (o.width + 1);
  c.zero.reduce_bucket_size = block;  // one block per bucket: reductions start during backward
  c.zero.allgather_bucket_size = block;
  c.zero.stage3_prefetch_bucket_size = r.prefetch ? 2 * block : 0;
  c.zero.stage3_max_reuse_distance = 0;
  c.zero.stage3_param_persistence_threshold = 0;
  c.optimizer.lr = 1e-3;
  c.schedule.base_lr = 1e-3;
  return c;
}

// This rank's run of a row: warm-up steps, then timed steps (forward, backward and the optimizer
// step, which waits for the gradient norm's all-reduce: every rank ends a step together).
Timing run_rank(Communicator& comm, const Options& o, const Row& r) {
  const int batch = r.batch > 0 ? r.batch : o.batch;
  auto device = make_device("cpu");
  Engine engine(*device, comm, row_config(o, r));
  Mlp mlp(engine, {std::vector<int>(o.layers + 1, o.width)});
  engine.finalize();
  std::vector<float> x(static_cast<size_t>(batch) * o.width), t(x.size());
  std::mt19937 gen(comm.rank());
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (auto& v : x) v = u(gen);
  for (auto& v : t) v = u(gen);
  float loss = 0;
  Timing timing;
  CommStats before{};
  for (int s = 0; s < o.warmup + o.steps; ++s) {
    if (s == o.warmup) before = engine.comm_stats();
    const auto start = std::chrono::steady_clock::now();
    mlp.forward_backward(x.data(), t.data(), batch, &loss);
    engine.step();
    if (s >= o.warmup) timing.steps.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  const auto after = engine.comm_stats();
  for (size_t op = 0; op < kCollectiveOpCount; ++op) {
    timing.bus_bytes += (after.bus_bytes[op] - before.bus_bytes[op]) / o.steps;
    timing.ops += (after.calls[op] - before.calls[op]) / o.steps;
  }
  return timing;
}

Timing run_local(const Options& o, const Row& r, const LinkModel& link) {
  CommOptions comm_options = CommOptions::from_env();
  comm_options.link = link;
  Timing timing;
  run_local_ranks(
      o.ranks,
      [&](Communicator& comm) {
    auto mine = run_rank(comm, o, r);
    if (comm.rank() == 0) timing = std::move(mine);
      },
      comm_options);
  return timing;
}

// The three ways of running stage 3 the bench compares.
std::vector<Row> stage3_rows() {
  return {{"stage 3, prefetch", 3, true, true},
          {"stage 3, no prefetch", 3, false, true},
          {"stage 3, prefetch, overlap_comm false", 3, true, false}};
}

// On gloo, first the communication by itself: a step with one row per rank has nothing to hide it
// behind, and with overlap_comm false its collectives run one at a time, so it is their sum.
std::vector<Row> gloo_rows() {
  std::vector<Row> rows = {{"stage 3, overlap_comm false, 1 row per rank", 3, true, false, 1}};
  for (const auto& r : stage3_rows()) rows.push_back(r);
  return rows;
}

nlohmann::json timing_json(const Timing& t) { return {{"steps_s", t.steps}, {"bus_bytes", t.bus_bytes}, {"ops", t.ops}}; }

Timing timing_from_json(const nlohmann::json& j) {
  return {j.at("steps_s").get<std::vector<double>>(), j.at("bus_bytes").get<uint64_t>(), j.at("ops").get<uint64_t>()};
}

// One of the gloo processes: runs gloo_rows() and, on rank 0, writes the timings.
void run_gloo_worker(const Options& o) {
  const auto info = rendezvous_from_env();
  ZEROTH_CHECK(info.has_value(), "bench engine --gloo-worker runs in processes started by the bench, with RANK and WORLD_SIZE set");
  auto comm = make_gloo_communicator(*info);
  auto out = nlohmann::json::array();
  for (const auto& r : gloo_rows()) out.push_back(timing_json(run_rank(*comm, o, r)));
  if (info->rank != 0) return;
  std::ofstream file(o.worker_out);
  file << out.dump() << "\n";
  file.flush();
  if (!file) ZEROTH_THROW(IoError, "bench engine: writing the gloo timings to {} failed", o.worker_out);
}

std::vector<Timing> run_gloo(const Options& o) {
  const std::string path = (std::filesystem::temp_directory_path() / fmt::format("zeroth-bench-engine-{}.json", getpid())).string();
  std::remove(path.c_str());
  LaunchOptions launch;
  launch.nproc_per_node = o.ranks;
  launch.command = {"/proc/self/exe",
                    "bench",
                    "engine",
                    "--gloo-worker",
                    path,
                    "--layers",
                    std::to_string(o.layers),
                    "--width",
                    std::to_string(o.width),
                    "--batch",
                    std::to_string(o.batch),
                    "--warmup",
                    std::to_string(o.warmup),
                    "--steps",
                    std::to_string(o.steps)};
  const int code = run_launch(launch);
  if (code != 0) ZEROTH_THROW(CommError, "bench engine: a gloo rank exited with code {}", code);
  std::ifstream in(path);
  if (!in) ZEROTH_THROW(IoError, "bench engine: the gloo ranks left no timings in {}", path);
  const auto j = nlohmann::json::parse(in);
  std::remove(path.c_str());
  std::vector<Timing> out;
  for (const auto& t : j) out.push_back(timing_from_json(t));
  return out;
}

// A row's step time against compute C and communication M: the best overlap can do is
// max(C, M), serialising them costs C + M; `exposed` is the share of M the step did not hide.
struct Result {
  std::string group, name;
  Timing t;
  double compute = 0, comm = 0;
};

void print_rows(const std::vector<Result>& rows) {
  std::printf("%-40s %10s %17s %12s %12s %9s\n", "row", "step ms", "(min-max)", "max(C,M) ms", "C+M ms", "exposed");
  for (const auto& r : rows) {
    std::printf("%-40s %10.1f %17s %12.1f %12.1f %8.0f%%\n", r.name.c_str(), r.t.median() * 1e3,
                fmt::format("({:.1f}-{:.1f})", r.t.min() * 1e3, r.t.max() * 1e3).c_str(), std::max(r.compute, r.comm) * 1e3,
                (r.compute + r.comm) * 1e3, 100 * (r.t.median() - r.compute) / r.comm);
  }
}

// Long: the benchmark's procedure (the free row that sizes the link model, the rounds over every row, then the JSON or the
// two tables); the link rows run on the link model the first row sizes, and every row is compared with that row.
void run(const Options& o) {
  ZEROTH_CHECK(o.ranks >= 1 && o.layers >= 1 && o.width >= 1 && o.batch >= 1 && o.warmup >= 0, "bench engine: sizes must be positive");
  ZEROTH_CHECK(o.steps >= 5, "bench engine: --steps must be at least 5 (a median and a spread need them), got {}", o.steps);
  ZEROTH_CHECK(o.ratio > 0, "bench engine: --ratio must be positive");
  ZEROTH_CHECK(o.rounds >= 1, "bench engine: --rounds must be at least 1, got {}", o.rounds);
  // Ranks are threads or single-core processes here; GEMM threads on top would oversubscribe the cores.
  cpu::set_gemm_threads(1);
  // Each row's engine logs its plan; that would bury the figures unless asked for.
  if (!env::get(env::kLogLevel)) log::set_level(log::Level::warn);
  if (!o.worker_out.empty()) return run_gloo_worker(o);

  // C: the step with collectives that cost (almost) nothing: memcpy between threads, no link model.
  // Every row is compared with it: twice the steps of a row, so one disturbed step moves it less.
  const LinkModel free_link{};
  Options twice = o;
  twice.steps = 2 * o.steps;
  std::vector<Row> free_rows = {stage3_rows().front()}, link_rows;
  const Timing first = run_local(twice, free_rows.front(), free_link);
  // The link model's bandwidth: stage 3's communication takes ratio x C, bus bytes / bandwidth
  // plus a latency per collective.
  const double target = o.ratio * first.median();
  const double transfer = target - first.ops * o.latency_us * 1e-6;
  ZEROTH_CHECK(
      transfer > 0,
      "bench engine: {} collectives at {} us latency already exceed the communication budget of {:.3f} ms; lower --latency-us",
      first.ops, o.latency_us, target * 1e3);
  const LinkModel link{o.latency_us, first.bus_bytes / transfer / 1e9};
  auto modeled = [&](const Timing& t) { return t.ops * link.latency_us * 1e-6 + t.bus_bytes / (link.bandwidth_gbps * 1e9); };

  std::vector<int> link_free;  // the free row whose median is each link row's C
  if (o.all_stages) {
    for (int stage : {0, 1, 2}) {
      free_rows.push_back({fmt::format("stage {}", stage), stage, false, true});
      link_rows.push_back(free_rows.back());
      link_rows.push_back({fmt::format("stage {}, overlap_comm false", stage), stage, false, false});
      link_free.insert(link_free.end(), 2, static_cast<int>(free_rows.size()) - 1);
    }
  }
  for (const auto& r : stage3_rows()) {
    link_rows.push_back(r);
    link_free.push_back(0);
  }
  const auto glooed = o.gloo ? gloo_rows() : std::vector<Row>{};
  if (o.gloo) free_rows.push_back(glooed.front());
  std::vector<Timing> free_t(free_rows.size());
  free_t.front() = first;
  std::vector<Timing> link_t(link_rows.size()), gloo_t(glooed.size());
  // Rounds take turns through every row, so a disturbance of the shared machine spreads over them.
  for (int round = 0; round < o.rounds; ++round) {
    for (size_t i = round == 0 ? 1 : 0; i < free_rows.size(); ++i)
      free_t[i].add(run_local(i == 0 ? twice : o, free_rows[i], free_link));
    for (size_t i = 0; i < link_rows.size(); ++i) link_t[i].add(run_local(o, link_rows[i], link));
    if (!o.gloo) continue;
    const auto timings = run_gloo(o);
    for (size_t i = 0; i < glooed.size(); ++i) gloo_t[i].add(timings[i]);
  }

  const Timing& compute = free_t.front();
  const double c = compute.median();
  std::vector<Result> results;
  for (size_t i = 0; i < link_rows.size(); ++i) {
    results.push_back({"link model", link_rows[i].name, link_t[i], free_t[link_free[i]].median(), modeled(link_t[i])});
  }
  // M on gloo: the one-row serial step there, less the same step without communication costs.
  const Timing& alone_free = free_t.back();
  const double gloo_comm = o.gloo ? gloo_t.front().median() - alone_free.median() : 0;
  for (size_t i = 0; i < glooed.size(); ++i) {
    results.push_back({"gloo", glooed[i].name, gloo_t[i], i == 0 ? alone_free.median() : c, gloo_comm});
  }

  const double params = static_cast<double>(o.layers) * o.width * (o.width + 1);
  if (o.json) {
    nlohmann::json j{{"ranks", o.ranks},
                     {"params", params},
                     {"rows_per_rank", o.batch},
                     {"warmup", o.warmup},
                     {"compute", timing_json(compute)},
                     {"link_gbps", link.bandwidth_gbps},
                     {"latency_us", link.latency_us}};
    auto& jr = j["rows"] = nlohmann::json::array();
    for (const auto& r : results) {
      auto row = timing_json(r.t);
      row["transport"] = r.group;
      row["name"] = r.name;
      row["median_s"] = r.t.median();
      row["compute_s"] = r.compute;
      row["comm_s"] = r.comm;
      row["full_overlap_s"] = std::max(r.compute, r.comm);
      row["serial_s"] = r.compute + r.comm;
      jr.push_back(row);
    }
    std::printf("%s\n", j.dump(2).c_str());
    return;
  }
  std::printf("# zeroth bench engine: %d ranks, MLP %d x %d (%.1f M params, f32), %d rows per rank; every row: %d round(s) of "
              "%d warm-up steps and %d timed steps of rank 0, median (min-max) of the timed steps\n",
              o.ranks, o.layers, o.width, params / 1e6, o.batch, o.rounds, o.warmup, o.steps);
  std::printf("# C (compute) = stage 3 with prefetch, ranks as threads, collectives as memcpy without a link model, %zu steps: %.1f "
              "ms (%.1f-%.1f)\n",
              compute.steps.size(), c * 1e3, compute.min() * 1e3, compute.max() * 1e3);
  std::printf("# max(C,M): the step if communication hid entirely behind compute; C+M: if none of it did; "
              "exposed = (step - C) / M\n#\n");
  std::printf("# [link model] A MODEL, not a network: ranks are threads; each collective copies between them, then its stream\n"
              "# sleeps until latency + bytes / bandwidth has passed, costing no CPU (as copy engines and NICs would); gathers\n"
              "# and reductions each have such a link of their own.\n"
              "# Link: %.3f GB/s, %.0f us per collective; stage 3 moves %.1f MB per rank per step in %llu collectives: "
              "M = %.1f ms (%.2f x C)\n",
              link.bandwidth_gbps, link.latency_us, compute.bus_bytes / 1e6, static_cast<unsigned long long>(compute.ops),
              modeled(compute) * 1e3, modeled(compute) / c);
  std::vector<Result> part;
  for (const auto& r : results) {
    if (r.group == "link model") part.push_back(r);
  }
  print_rows(part);
  if (!o.gloo) return;
  std::printf("#\n# [gloo] %d processes over loopback TCP: real communication, whose copies and protocol run on the cores\n"
              "# the compute needs, so max(C,M) is a bound overlap cannot reach here; C is the link model's.\n"
              "# M = the one-row step on gloo (%.1f ms) - the same on threads without a link model (%.1f ms) = %.1f ms (%.2f x C)\n",
              o.ranks, gloo_t.front().median() * 1e3, alone_free.median() * 1e3, gloo_comm * 1e3, gloo_comm / c);
  part.clear();
  for (const auto& r : results) {
    if (r.group == "gloo") part.push_back(r);
  }
  print_rows(part);
}

}  // namespace bench_engine

void add_bench_engine_command(CLI::App& bench) {
  using namespace bench_engine;
  auto options = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("engine", "ZeRO stage 3 step times, prefetch and overlap_comm, on a link model and on gloo");
  cmd->add_option("--ranks", options->ranks, "Ranks: threads, and gloo processes (default 2: one per core on the 2-core machines)");
  cmd->add_option("--layers", options->layers, "MLP layers (default 8)");
  cmd->add_option("--width", options->width, "MLP width (default 1536)");
  cmd->add_option("--batch", options->batch, "Rows per rank per step (default 96)");
  cmd->add_option("--warmup", options->warmup, "Untimed steps before each row (default 2)");
  cmd->add_option("--steps", options->steps, "Timed steps per row, at least 5 (default 5)");
  cmd->add_option("--rounds", options->rounds, "Times through every row, taking turns; steps pool per row (default 2)");
  cmd->add_option("--ratio", options->ratio, "The link model's stage-3 communication time as a fraction of compute (default 0.5)");
  cmd->add_option("--latency-us", options->latency_us, "The link model's latency per collective (default 20)");
  cmd->add_flag("!--no-gloo", options->gloo, "Skip the gloo rows");
  cmd->add_flag("--all-stages", options->all_stages, "Also stages 0-2 on the link model, with overlap_comm true and false");
  cmd->add_flag("--json", options->json, "Print JSON");
  cmd->add_option("--gloo-worker", options->worker_out, "Internal: run as one of the bench's gloo ranks, writing timings here")
      ->group("");
  cmd->callback([options] { run(*options); });
}

}  // namespace zeroth::tools
