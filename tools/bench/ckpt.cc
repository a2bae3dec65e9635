// `zeroth bench ckpt`: a checkpoint of an engine's state saved and loaded, each beside a raw write
// and read of the same number of bytes through the same I/O engine in the same run (a fresh file,
// O_DIRECT, requests of the aio section's block x depth, flushed), so a rate is compared with the
// disk's rate at that moment (a virtual disk's rate wanders from minute to minute). And the time an
// asynchronous save holds training, beside one memcpy of the rank's state.
#include <unistd.h>  // getpid

#include <algorithm>   // std::min, std::minmax_element
#include <chrono>      // std::chrono::steady_clock
#include <cstdio>      // std::printf
#include <cstring>     // std::memcpy, std::memset
#include <filesystem>  // std::filesystem
#include <memory>      // std::make_shared
#include <random>      // std::mt19937
#include <string>      // std::string
#include <vector>      // std::vector

#include <CLI/CLI.hpp>        // CLI::App
#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "comm/local/local_comm.h"         // make_local_communicators
#include "core/error.h"                    // ZEROTH_THROW
#include "core/log.h"                      // log::set_level
#include "core/stats.h"                    // median
#include "engine/checkpoint/checkpoint.h"  // ckpt::Saver, ckpt::load
#include "engine/engine.h"                 // Engine
#include "models/mlp/mlp.h"                // Mlp
#include "offload/aligned_buffer.h"        // offload::AlignedBuffer
#include "tools/bench/offload.h"           // measure_raw_rates
#include "tools/bench/bench.h"

namespace zeroth::tools {
namespace bench_ckpt {

using Clock = std::chrono::steady_clock;

struct Options {
  std::string path;
  double gib = 2.0;  // the checkpoint's bytes
  int reps = 3;
  bool json = false;
};

double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

struct Range {
  std::vector<double> v;
  double median() const { return zeroth::median(v); }
  double lo() const { return *std::min_element(v.begin(), v.end()); }
  double hi() const { return *std::max_element(v.begin(), v.end()); }
  nlohmann::json json() const { return {lo(), hi()}; }
};

// Long: the benchmark's procedure (the two engines, each repetition's raw rates, saves, loads, async save and memcpy, then
// the medians); each repetition's figures are held against the raw rates measured in the same repetition.
void run(const Options& o) {
  if (o.path.empty() || !std::filesystem::is_directory(o.path))
    ZEROTH_THROW(InvalidArgument, "--path {}: name an existing folder on the disk to write the checkpoints in", o.path);
  if (o.reps < 1 || o.gib <= 0) ZEROTH_THROW(InvalidArgument, "--reps must be at least 1 and --gib above 0");
  log::set_level(log::Level::warn);
  auto say = [&](const char* format, auto... args) {
    if (!o.json) std::printf(format, args...);
    std::fflush(stdout);
  };
  // Square layers of 2048 x 2048 holding about --gib of checkpoint: the f32 master weights and
  // AdamW's two moments, 12 bytes per parameter.
  const double params = o.gib * double(1 << 30) / 12.0;
  const int width = 2048, layers = std::max(1, static_cast<int>(params / (width * (width + 1.0)) + 0.5));
  EngineConfig c;
  c.zero.stage = 1;
  c.compute_dtype = DType::f32;
  c.optimizer.kind = OptimizerKind::adamw;
  c.optimizer.lr = 1e-4;
  c.schedule.base_lr = 1e-4;
  SwapperSetting setting;
  setting.block_size = c.aio.block_size;
  setting.queue_depth = static_cast<unsigned>(c.aio.queue_depth);
  setting.threads = static_cast<unsigned>(c.aio.threads);
  auto device = make_device("cpu");
  auto comms = make_local_communicators(1);
  const MlpConfig shape{std::vector<int>(layers + 1, width)};
  Engine engine(*device, *comms[0], c);
  Mlp mlp(engine, shape);
  engine.finalize();
  // A run resuming: an engine as finalize() leaves it, loaded into (each file read once, into the
  // engine); the trained one, loaded into again, takes the state through a host buffer.
  Engine fresh_engine(*device, *comms[0], c);
  Mlp fresh_mlp(fresh_engine, shape);
  fresh_engine.finalize();
  {
    // One step, so that the moments hold values.
    std::vector<float> x(4 * width), t(x.size());
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : x) v = u(gen);
    for (auto& v : t) v = u(gen);
    float loss = 0;
    mlp.forward_backward(x.data(), t.data(), 4, &loss);
    engine.step();
  }
  const std::filesystem::path dir = std::filesystem::path(o.path) / fmt::format("zeroth-bench-ckpt-{}", ::getpid());
  const RemovedOnExit remove{dir};
  // Each save into an empty folder: a save's retention (removing the step folders it replaces) is
  // file system work outside the writing this compares with the disk's rate.
  ckpt::SaveOptions save{.dir = dir.string(), .keep_last = 0};
  auto clear = [&] {
    std::error_code ignored;
    std::filesystem::remove_all(dir, ignored);
  };
  ckpt::Saver sync(false), async(true);
  Range raw_write, raw_read, save_gbps, async_gbps, fresh_gbps, landing_gbps, load_gbps, save_ratio, load_ratio, blocked, memcpy_ms;
  uint64_t bytes = 0;
  offload::AlignedBuffer state, copy;  // huge pages, as the snapshot's
  say("bench ckpt: an MLP of %d x %d x %d (%.0fM parameters), f32 master weights and AdamW moments, one rank; checkpoints in %s\n",
      layers, width, width, static_cast<double>(engine.plan().total_numel) / 1e6, dir.string().c_str());
  say("  %-4s %9s %9s %9s %10s %9s %9s %9s %9s %12s %9s %9s %10s %9s\n", "rep", "raw write", "save", "save/raw", "async save",
      "async/raw", "raw read", "load", "load/raw", "load landing", "fresh mem", "async ms", "memcpy ms", "hold/copy");
  for (int rep = 0; rep < o.reps; ++rep) {
    clear();
    const ckpt::IoStats s = sync.save(engine, save);
    bytes = s.bytes;
    // The same bytes as a fresh file, written as the checkpoint's (O_DIRECT, the aio section's
    // requests, fsync'd) and read back.
    const RawRates raw = measure_raw_rates(o.path, bytes, setting, true);
    const double w = raw.write_gbps, r = raw.read_gbps;
    fresh_engine.reinitialize();
    const ckpt::IoStats l = ckpt::load(fresh_engine, dir.string());
    const ckpt::IoStats landed = ckpt::load(engine, dir.string());
    ZEROTH_CHECK(l.way != landed.way, "bench ckpt: both loads went the same way ({})", l.way);
    raw_write.v.push_back(w), raw_read.v.push_back(r);
    save_gbps.v.push_back(static_cast<double>(bytes) / s.seconds / 1e9);
    load_gbps.v.push_back(static_cast<double>(l.all_bytes) / l.seconds / 1e9);
    landing_gbps.v.push_back(static_cast<double>(landed.all_bytes) / landed.seconds / 1e9);
    save_ratio.v.push_back(save_gbps.v.back() / w), load_ratio.v.push_back(load_gbps.v.back() / r);
    // The asynchronous save's hold on training, beside one memcpy (one thread) of as many bytes
    // between two buffers whose pages are already in place (the snapshot's are, after the first save).
    clear();
    const ckpt::IoStats a = async.save(engine, save);
    const ckpt::IoStats done = async.complete(engine);
    async_gbps.v.push_back(static_cast<double>(bytes) / done.seconds / 1e9);
    if (state.size() < bytes) {
      state = offload::AlignedBuffer(bytes), copy = offload::AlignedBuffer(bytes);
      std::memset(state.data(), 1, bytes);
    }
    std::memcpy(copy.data(), state.data(), bytes);  // the pages in place (a VM's host may have taken them back)
    const auto t0 = Clock::now();
    std::memcpy(copy.data(), state.data(), bytes);
    memcpy_ms.v.push_back(seconds_since(t0) * 1e3);
    blocked.v.push_back(a.blocked_seconds * 1e3);
    // Memory never touched before, as a load's landing buffer is: the rate its first touch goes at.
    const auto f0 = Clock::now();
    {
      offload::AlignedBuffer fresh(bytes);
      std::memset(fresh.data(), 0, bytes);
    }
    fresh_gbps.v.push_back(static_cast<double>(bytes) / seconds_since(f0) / 1e9);
    say("  %-4d %9.2f %9.2f %9.2f %10.2f %9.2f %9.2f %9.2f %9.2f %12.2f %9.2f %9.0f %10.0f %9.2f\n", rep, w, save_gbps.v.back(),
        save_ratio.v.back(), async_gbps.v.back(), async_gbps.v.back() / w, r, load_gbps.v.back(), load_ratio.v.back(),
        landing_gbps.v.back(), fresh_gbps.v.back(), blocked.v.back(), memcpy_ms.v.back(), blocked.v.back() / memcpy_ms.v.back());
  }
  // The first asynchronous save also allocates its snapshot: its hold is reported apart.
  Range steady_blocked{std::vector<double>(blocked.v.begin() + (o.reps > 1 ? 1 : 0), blocked.v.end())};
  say("  medians (GB/s): save %.2f = %.2f x raw write, asynchronous save %.2f; load %.2f = %.2f x raw read (into a stepped "
      "engine, through a host buffer: %.2f); first touch of fresh memory %.2f; async hold %.0f ms = %.2f x memcpy (the first save, "
      "which allocates its snapshot: %.0f ms)\n",
      save_gbps.median(), save_ratio.median(), async_gbps.median(), load_gbps.median(), load_ratio.median(), landing_gbps.median(),
      fresh_gbps.median(), steady_blocked.median(), steady_blocked.median() / memcpy_ms.median(), blocked.v.front());
  if (o.json) {
    std::printf("%s\n", nlohmann::json{{"bytes", bytes},
                                       {"reps", o.reps},
                                       {"save_gbps", save_gbps.median()},
                                       {"async_save_gbps", async_gbps.median()},
                                       {"fresh_memory_gbps", fresh_gbps.median()},
                                       {"landing_load_gbps", landing_gbps.median()},
                                       {"load_gbps", load_gbps.median()},
                                       {"raw_write_gbps", raw_write.median()},
                                       {"raw_read_gbps", raw_read.median()},
                                       {"save_over_raw", save_ratio.median()},
                                       {"load_over_raw", load_ratio.median()},
                                       {"async_block_ms", steady_blocked.median()},
                                       {"first_async_block_ms", blocked.v.front()},
                                       {"memcpy_ms", memcpy_ms.median()},
                                       {"ranges",
                                        {{"save_gbps", save_gbps.json()},
                                         {"async_save_gbps", async_gbps.json()},
                                         {"fresh_memory_gbps", fresh_gbps.json()},
                                         {"landing_load_gbps", landing_gbps.json()},
                                         {"load_gbps", load_gbps.json()},
                                         {"raw_write_gbps", raw_write.json()},
                                         {"raw_read_gbps", raw_read.json()},
                                         {"async_block_ms", blocked.json()},
                                         {"memcpy_ms", memcpy_ms.json()}}}}
                            .dump(2)
                            .c_str());
  }
}

}  // namespace bench_ckpt

void add_bench_ckpt_command(CLI::App& bench) {
  using namespace bench_ckpt;
  auto o = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("ckpt", "Checkpoint save and load rates beside the disk's raw rates; the asynchronous save's hold");
  cmd->add_option("--path", o->path, "Folder on the disk to write the checkpoints (and a raw-rate file) in")->required();
  cmd->add_option("--gib", o->gib, "The checkpoint's size in GiB (default 2)");
  cmd->add_option("--reps", o->reps, "Rounds of save, raw write and read, load and asynchronous save (default 3)");
  cmd->add_flag("--json", o->json, "Print JSON");
  cmd->callback([o] { run(*o); });
}

}  // namespace zeroth::tools
