// The end-to-end half of `zeroth bench offload`: the optimizer swapper of a ZeRO-Infinity step
// (stage 3, optimizer state and parameters in swap files), run by the engine itself on an MLP
// of the requested state size, timed from the end of the gradient reductions until the last
// write-back reached its file.
#include <fcntl.h>   // open
#include <unistd.h>  // getpid, fsync, close

#include <algorithm>   // std::max
#include <chrono>      // std::chrono::steady_clock
#include <cerrno>      // errno
#include <cstring>     // std::memset, std::strerror
#include <deque>       // std::deque
#include <filesystem>  // std::filesystem::remove
#include <random>      // std::mt19937
#include <vector>      // std::vector

#include <fmt/format.h>  // fmt::format

#include "comm/local/local_comm.h"   // make_local_communicators
#include "core/error.h"              // ZEROTH_CHECK
#include "engine/engine.h"           // Engine
#include "models/mlp/mlp.h"          // Mlp
#include "offload/aio.h"             // offload::AsyncFile
#include "offload/aligned_buffer.h"  // offload::AlignedBuffer
#include "tools/bench/offload.h"
#include "tools/bench/bench.h"

namespace zeroth::tools {
namespace {

constexpr int kRows = 4;
// Bytes of swapped state per parameter: f32 master, two Adam moments and the gradient, and the
// bf16 parameter shard.
constexpr std::size_t kStateBytesPerParam = 4 * 4 + 2;

EngineConfig swapper_config(const std::string& folder, const SwapperSetting& s) {
  EngineConfig c;
  c.zero.stage = 3;
  c.zero.overlap_comm = true;
  c.zero.reduce_bucket_size = 0;  // a bucket per layer
  c.zero.stage3_prefetch_bucket_size = 0;
  c.zero.stage3_max_live_parameters = 1;
  c.zero.stage3_max_reuse_distance = 0;
  c.zero.stage3_param_persistence_threshold = 0;
  c.zero.sub_group_size = s.sub_group_size;
  for (auto* o : {&c.zero.offload_optimizer, &c.zero.offload_param}) {
    o->device = OffloadDevice::nvme;
    o->nvme_path = folder;
    o->pin_memory = true;
  }
  // The optimizer phase as DeepSpeed runs it, after the backward pass: what this bench times.
  c.zero.offload_optimizer.overlap_backward = false;
  c.aio.block_size = s.block_size;
  c.aio.queue_depth = s.queue_depth;
  c.aio.threads = s.threads;
  c.compute_dtype = DType::bf16;
  c.optimizer.kind = OptimizerKind::adamw;
  c.optimizer.lr = 1e-4;
  c.schedule.base_lr = 1e-4;
  c.time_breakdown = true;
  return c;
}

// Square layers of at most 4096 x 4096 (16.8 M parameters, a few per sub-group at the default
// size), at least two of them, holding about `state_bytes` of state.
std::vector<int> widths_for(std::size_t state_bytes) {
  const std::size_t params = state_bytes / kStateBytesPerParam;
  std::size_t width = 4096;
  while (width > 64 && 2 * width * (width + 1) > params) width /= 2;
  const std::size_t layers = std::max<std::size_t>(2, params / (width * (width + 1)));
  return std::vector<int>(layers + 1, static_cast<int>(width));
}

}  // namespace

struct SwapperBench::State {
  std::unique_ptr<Device> device = make_device("cpu");
  std::vector<std::unique_ptr<Communicator>> comms = make_local_communicators(1);
  Engine engine;
  Mlp mlp;
  std::vector<float> x, t;
  int steps = 0;

  State(const std::string& folder, const std::vector<int>& widths, const SwapperSetting& setting)
      : engine(*device, *comms[0], swapper_config(folder, setting)),
        mlp(engine, {widths}),
        x(static_cast<std::size_t>(kRows) * widths.front()),
        t(x.size()) {
    engine.finalize();
    std::mt19937 gen(1);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    for (auto& v : x) v = u(gen);
    for (auto& v : t) v = u(gen);
  }

  StepResult step() {
    float loss = 0;
    mlp.forward_backward(x.data(), t.data(), kRows, &loss);
    const StepResult r = engine.step();
    ZEROTH_CHECK(r.boundary && !r.skipped, "bench offload: the swapper's step {} did not apply (loss {})", steps, loss);
    ++steps;
    return r;
  }
};

SwapperBench::SwapperBench(const std::string& folder, std::size_t state_bytes, const SwapperSetting& setting)
    : state_(std::make_unique<State>(folder, widths_for(state_bytes), setting)) {
  state_->step();
}

SwapperBench::~SwapperBench() = default;

double SwapperBench::step() {
  const StepResult r = state_->step();
  read_bytes_ = r.update_swap_read_bytes;
  write_bytes_ = r.update_swap_write_bytes;
  return r.update_seconds;
}

uint64_t SwapperBench::params() const { return state_->engine.plan().total_numel; }
uint64_t SwapperBench::padded_params() const { return state_->engine.plan().total_padded; }
std::size_t SwapperBench::sub_groups() const { return state_->engine.plan().sub_groups.size(); }

RawRates measure_raw_rates(const std::string& folder, std::size_t bytes, const SwapperSetting& setting, bool fresh_file) {
  const std::string path = fmt::format("{}/zeroth-raw-{}.bin", folder, ::getpid());
  const RemovedOnExit remove{path};
  std::error_code ignored;
  std::filesystem::remove(path, ignored);
  offload::AsyncFile file(path, offload::AsyncFile::Mode::read_write,
                          offload::IoOptions{.block_size = setting.block_size,
                                             .queue_depth = setting.queue_depth,
                                             .threads = setting.threads});
  // Requests of what the rings hold, two in flight (the engine's swaps keep its rings full the same way).
  const std::size_t request = std::min(bytes, setting.block_size * setting.queue_depth * setting.threads);
  offload::AlignedBuffer pool(2 * request);
  std::memset(pool.data(), 0x5A, pool.size());
  auto pass = [&](bool write) {
    std::deque<offload::IoHandle> pending;
    const auto t0 = std::chrono::steady_clock::now();
    std::size_t i = 0;
    for (std::size_t offset = 0; offset < bytes; offset += request, ++i) {
      if (pending.size() == 2) {
        pending.front().wait();
        pending.pop_front();
      }
      std::byte* buffer = pool.data() + (i % 2) * request;
      const std::size_t length = std::min(request, bytes - offset);
      pending.push_back(write ? file.write(buffer, length, offset) : file.read(buffer, length, offset));
    }
    for (auto& h : pending) h.wait();
    if (write && fresh_file) {
      // A new file is on the disk when fsync returns (a checkpoint's are flushed so).
      const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);
      const int rc = fd < 0 ? -1 : ::fsync(fd);
      const int err = errno;
      if (fd >= 0) ::close(fd);
      if (rc != 0) ZEROTH_THROW(IoError, "fsync({}) failed: {}", path, std::strerror(err));
    }
    return static_cast<double>(bytes) / std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / 1e9;
  };
  // Otherwise the first pass allocates the file's blocks; the measured ones overwrite them, as swaps do.
  if (!fresh_file) pass(true);
  RawRates rates;
  rates.write_gbps = pass(true);
  rates.read_gbps = pass(false);
  return rates;
}

}  // namespace zeroth::tools
