// The end-to-end half of `zeroth bench offload`: the optimizer swapper of a ZeRO-Infinity step
// (stage 3, optimizer state and parameters in swap files), run by the engine itself on an MLP
// of the requested state size, timed from the end of the gradient reductions until the last
// write-back reached its file.
#include <algorithm>  // std::max
#include <random>     // std::mt19937
#include <vector>     // std::vector

#include "comm/local/local_comm.h"  // make_local_communicators
#include "core/error.h"             // ZEROTH_CHECK
#include "engine/engine.h"          // Engine
#include "models/mlp/mlp.h"         // Mlp
#include "tools/bench_offload.h"

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

}  // namespace zeroth::tools
