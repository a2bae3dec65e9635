// Offloaded optimizer state against the in-device run. The host runs the same optimizer kernel
// on the same numbers; only where the bytes live changes (host memory, or swap files read and
// written through io_uring in sub-groups). So at stages 1-3, one and two ranks, one and two
// micro-batches, f32 and bf16, the losses and the master weights must be bit-identical.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "comm/local/local_comm.h"
#include "core/error.h"
#include "engine/executor/param_init.h"
#include "tests/engine/executor/swap_folder.h"
#include "tests/engine/mlp_harness.h"

namespace zeroth {
namespace {

using testing::MlpRun;
using testing::RankResult;
using testing::run_ranks;

using testing::swap_dir;

// A sanitizer's shadow memory and quarantine are resident too (freed memory stays, on purpose):
// bounds on the process's resident memory hold only without one.
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
constexpr bool sanitized = true;
#else
constexpr bool sanitized = false;
#endif

struct Case {
  int stage, dp, gas;
  DType dtype;
  OffloadDevice device;
  bool pipeline;
  OffloadDevice params = OffloadDevice::none;  // offload_param (stage 3)
  double ratio = 1.0;                          // offload_optimizer.ratio
  bool small_pieces = false;                   // gradients leave the device in pieces of 4 KiB
  DType reduction = DType::f32;                // communication_data_type
};
void PrintTo(const Case& c, std::ostream* os) {
  *os << "stage " << c.stage << ", dp " << c.dp << ", gas " << c.gas << ", " << dtype_name(c.dtype) << ", optimizer on "
      << offload_device_name(c.device) << (c.pipeline ? "" : ", no pipelining") << ", parameters on " << offload_device_name(c.params)
      << ", ratio " << c.ratio << (c.small_pieces ? ", gradients in pieces of 4 KiB" : "") << ", reduced in "
      << dtype_name(c.reduction);
}

MlpRun offload_run(const Case& c, bool offload) {
  MlpRun run;
  run.stage = c.stage;
  run.gas = c.gas;
  run.dtype = c.dtype;
  run.steps = 5;
  if (c.small_pieces) run.widths = {16, 64, 64, 8};  // 5768 parameters, so a rank's shard spans several pieces
  run.tweak = [c, offload](EngineConfig& e) {
    e.communication_dtype = c.reduction;
    // Several sub-groups per rank, some across blocks, so swaps pipeline and slots are reused.
    e.zero.sub_group_size = 1000;
    if (c.small_pieces) e.zero.reduce_bucket_size = 100000;  // one bucket, several pieces
    // A bucket per layer, so a ratio below 1 keeps some of them on the device.
    if (c.ratio < 1) e.zero.reduce_bucket_size = 0;
    if (!offload) {
      // The same padding as the swapped plan (4 KiB of each swapped kind), so the two runs hold
      // the same elements. The gradients' file keeps a narrow reduction's dtype where nothing adds
      // micro-batches into it.
      const bool narrow_grads = c.reduction != DType::f32 && (c.stage == 1 || c.gas == 1);
      if (c.device == OffloadDevice::nvme) e.alignment = narrow_grads ? 4096 / dtype_size(c.reduction) : 1024;
      if (c.params == OffloadDevice::nvme) e.alignment = std::max<uint64_t>(e.alignment, 4096 / dtype_size(c.dtype));
      return;
    }
    e.zero.offload_optimizer.device = c.device;
    e.zero.offload_optimizer.nvme_path = swap_dir();
    e.zero.offload_optimizer.pipeline_read = e.zero.offload_optimizer.pipeline_write = c.pipeline;
    e.zero.offload_optimizer.ratio = c.ratio;
    e.zero.offload_param.device = c.params;
    e.zero.offload_param.nvme_path = swap_dir();
    if (c.small_pieces) {
      // A gradient piece is what aio keeps in flight: 4 KiB x 1 = 1024 f32 (2048 bf16 in a narrow
      // file), so every bucket leaves in several pieces and its counted ranges are cut between them.
      e.aio.block_size = 4096;
      e.aio.queue_depth = 1;
    }
  };
  return run;
}

class Offload : public ::testing::TestWithParam<Case> {};

TEST_P(Offload, TrainsBitIdenticallyToTheInDeviceRun) {
  const Case& c = GetParam();
  const auto ref = run_ranks(c.dp, offload_run(c, false));
  const auto off = run_ranks(c.dp, offload_run(c, true));
  for (int r = 0; r < c.dp; ++r) {
    ASSERT_EQ(off[r].losses.size(), ref[r].losses.size());
    for (size_t k = 0; k < ref[r].losses.size(); ++k) EXPECT_EQ(off[r].losses[k], ref[r].losses[k]) << "rank " << r << " step " << k;
    for (size_t k = 0; k < ref[r].steps.size(); ++k) {
      EXPECT_EQ(off[r].steps[k].grad_norm, ref[r].steps[k].grad_norm) << "rank " << r << " step " << k;
    }
    for (size_t b = 0; b < ref[r].weights.size(); ++b) {
      ASSERT_EQ(off[r].weights[b].size(), ref[r].weights[b].size());
      size_t differ = 0;
      for (size_t i = 0; i < ref[r].weights[b].size(); ++i) differ += off[r].weights[b][i] != ref[r].weights[b][i];
      EXPECT_EQ(differ, 0u) << "rank " << r << " block " << b << ": " << differ << " weights differ";
    }
  }
  // The state really left the device: less of it there, the optimizer's (and with offload_param
  // the parameters') bytes on the host or on disk, and swap files really read and written.
  const auto tier = [&](Tier t) { return off[0].tier_bytes[static_cast<size_t>(t)]; };
  EXPECT_LT(tier(Tier::device), ref[0].tier_bytes[static_cast<size_t>(Tier::device)]);
  EXPECT_EQ(ref[0].tier_bytes[static_cast<size_t>(Tier::nvme)] + ref[0].tier_bytes[static_cast<size_t>(Tier::host)], 0u);
  const bool any_nvme = c.device == OffloadDevice::nvme || c.params == OffloadDevice::nvme;
  EXPECT_EQ(tier(Tier::nvme) > 0, any_nvme);
  EXPECT_GT(tier(Tier::host), 0u);
  // Below ratio 1, some buckets' state stays on the device and the rest leaves.
  EXPECT_EQ(ref[0].device_buckets, ref[0].reduce_buckets);
  if (c.ratio < 1) {
    EXPECT_GT(off[0].device_buckets, 0);
    EXPECT_LT(off[0].device_buckets, off[0].reduce_buckets);
  } else {
    EXPECT_EQ(off[0].device_buckets, 0);
  }
  if (any_nvme) {
    // Every step reads and writes at least the optimizer's or the parameters' share again.
    EXPECT_GE(off[0].swap_io.read_bytes, 5u * 4096u);
    EXPECT_GE(off[0].swap_io.write_bytes, 5u * 4096u);
  } else {
    EXPECT_EQ(off[0].swap_io.read_bytes + off[0].swap_io.write_bytes, 0u);
  }
  // The weights moved: the comparison is not between two untouched initializations.
  const auto init = run_ranks(1, [&] {
    MlpRun r = offload_run(c, false);
    r.steps = 0;
    return r;
  }());
  size_t moved = 0;
  for (size_t b = 0; b < init[0].weights.size(); ++b) {
    for (size_t i = 0; i < init[0].weights[b].size(); ++i) moved += init[0].weights[b][i] != off[0].weights[b][i];
  }
  EXPECT_GT(moved, 1000u);
}

std::vector<Case> offload_cases() {
  std::vector<Case> out;
  for (OffloadDevice device : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    for (int stage : {1, 2, 3}) {
      for (int dp : {1, 2}) {
        for (int gas : {1, 2}) {
          for (DType dtype : {DType::f32, DType::bf16}) out.push_back({stage, dp, gas, dtype, device, true});
        }
      }
    }
  }
  // Swaps without read-ahead or write-behind: one slot, each sub-group in turn.
  out.push_back({2, 2, 2, DType::bf16, OffloadDevice::nvme, false});
  out.push_back({3, 1, 1, DType::f32, OffloadDevice::nvme, false});
  // Stage 3 with the parameter shards off the device too (ZeRO-Infinity), gathered from there.
  for (OffloadDevice device : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    for (int dp : {1, 2}) {
      for (int gas : {1, 2}) {
        for (DType dtype : {DType::f32, DType::bf16}) out.push_back({3, dp, gas, dtype, device, true, device});
      }
    }
  }
  out.push_back({3, 2, 1, DType::bf16, OffloadDevice::cpu, true, OffloadDevice::nvme});
  out.push_back({3, 2, 2, DType::bf16, OffloadDevice::nvme, false, OffloadDevice::cpu});
  // Part of the shard kept on the device (offload_optimizer.ratio, ZeRO-Offload++).
  for (OffloadDevice device : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    for (int stage : {1, 2, 3}) {
      out.push_back({stage, 2, 2, DType::bf16, device, true, OffloadDevice::none, 0.5});
      out.push_back({stage, 1, 1, DType::f32, device, true, OffloadDevice::none, 0.5});
    }
  }
  // Buckets larger than a gradient piece (Plan::grad_piece_numel).
  for (OffloadDevice device : {OffloadDevice::cpu, OffloadDevice::nvme}) {
    out.push_back({2, 2, 2, DType::bf16, device, true, OffloadDevice::none, 1.0, true});
    out.push_back({3, 1, 1, DType::f32, device, true, device, 1.0, true});
  }
  // A narrow reduction: its values kept in their own dtype in the gradients' file where nothing
  // adds into them (stage 1, or one micro-batch), in f32 where micro-batches add up.
  for (int stage : {1, 2, 3}) {
    for (int gas : {1, 2})
      out.push_back({stage, 2, gas, DType::bf16, OffloadDevice::nvme, true, OffloadDevice::none, 1.0, false, DType::bf16});
  }
  out.push_back({3, 2, 1, DType::bf16, OffloadDevice::nvme, false, OffloadDevice::nvme, 1.0, false, DType::bf16});
  out.push_back({3, 2, 1, DType::bf16, OffloadDevice::nvme, true, OffloadDevice::none, 0.5, false, DType::bf16});
  out.push_back({2, 2, 1, DType::bf16, OffloadDevice::nvme, true, OffloadDevice::none, 1.0, true, DType::bf16});
  out.push_back({2, 1, 1, DType::f16, OffloadDevice::nvme, true, OffloadDevice::none, 1.0, false, DType::f16});
  return out;
}

INSTANTIATE_TEST_SUITE_P(All, Offload, ::testing::ValuesIn(offload_cases()), [](const auto& info) {
  const Case& c = info.param;
  return fmt::format("{}_stage{}_dp{}_gas{}_{}{}{}{}{}{}", offload_device_name(c.device), c.stage, c.dp, c.gas, dtype_name(c.dtype),
                     c.pipeline ? "" : "_serial",
                     c.params == OffloadDevice::none ? "" : fmt::format("_params_{}", offload_device_name(c.params)),
                     c.ratio < 1 ? fmt::format("_ratio{}", static_cast<int>(c.ratio * 100)) : "", c.small_pieces ? "_pieces" : "",
                     c.reduction == DType::f32 ? "" : fmt::format("_reduced_{}", dtype_name(c.reduction)));
});

// ZeRO-Infinity's promise: with parameters and optimizer state in swap files, the process holds
// the device's working set and the bounded host pool, not the model states. Here the states take
// 16 bytes x 33.6M parameters = 538 MB on disk; the host pool is capped at 32 MiB (the host
// allocator refuses to go past it). The process's resident memory (the kernel's count,
// independent of zeroth's accounting) must grow by no more than the device's and the host's
// peaks plus a stated 48 MiB: what neither counts (initialization's chunks of values,
// allocator arenas of the stream and I/O threads, 2 MiB huge-page rounding of large buffers).
TEST(OffloadMemory, WithEverythingInSwapFilesTheProcessHoldsTheHostPoolNotTheModelStates) {
  const size_t pool = 32u << 20;
  MlpRun run;
  run.stage = 3;
  run.dtype = DType::bf16;
  run.widths.assign(sanitized ? 65 : 33, 1024);  // layers of 1M parameters
  run.global_batch = 8;
  run.steps = 2;
  run.tweak = [&](EngineConfig& e) {
    e.zero.reduce_bucket_size = 0;
    e.zero.sub_group_size = 1u << 18;
    e.zero.stage3_prefetch_bucket_size = 0;
    e.zero.stage3_max_live_parameters = 1;
    for (auto* o : {&e.zero.offload_optimizer, &e.zero.offload_param}) {
      o->device = OffloadDevice::nvme;
      o->nvme_path = swap_dir();
    }
    e.host_memory = pool;
  };
  // The kernel's peak starts again from here (clear_refs 5 resets VmHWM), so earlier tests in
  // this process do not count.
  std::ofstream("/proc/self/clear_refs") << "5";
  const size_t before = process_rss();
  std::unique_ptr<Device> device = make_device("cpu");
  auto comms = make_local_communicators(1);
  size_t host_peak = 0, device_peak = 0, on_disk = 0;
  {
    Engine engine(*device, *comms[0], testing::mlp_config(run));
    Mlp mlp(engine, {run.widths});
    engine.finalize();
    std::vector<float> x, t;
    for (int k = 0; k < run.steps; ++k) {
      testing::mlp_batch(k, run.global_batch, run.widths.front(), run.widths.back(), x, t);
      float loss = 0;
      mlp.forward_backward(x.data(), t.data(), run.global_batch, &loss, 0);
      const auto r = engine.step();
      engine.compute_stream().synchronize();
      ASSERT_TRUE(std::isfinite(loss));
      ASSERT_TRUE(r.boundary);
    }
    host_peak = engine.tier_stats(Tier::host).total_peak;
    device_peak = device->memory().stats().total_peak;
    on_disk = tier_total(engine.plan().bytes, Tier::nvme);
  }
  const size_t grown = process_peak_rss() - std::min(before, process_peak_rss());
  std::printf("states on disk %.1f MiB; host pool peak %.1f MiB of %.1f; device peak %.1f MiB; resident growth %.1f MiB\n",
              on_disk / 1048576.0, host_peak / 1048576.0, pool / 1048576.0, device_peak / 1048576.0, grown / 1048576.0);
  EXPECT_GE(on_disk, 530'000'000u);
  if (!sanitized) {
    EXPECT_LE(grown, device_peak + host_peak + (48u << 20));
  }
  EXPECT_LT(grown, on_disk / (sanitized ? 2 : 4)) << "the model states are resident";
}

// Writing the initial values to the swap files goes through scratch (a chunk of fp32 values, their
// bf16 cast, the O_DIRECT bounce buffers); finalize() returns it to the system, so a run does not
// carry it to its end.
TEST(OffloadMemory, FinalizeReturnsItsInitialisationScratch) {
  MlpRun run;
  run.stage = 3;
  run.dtype = DType::bf16;
  run.widths = {4096, 4096};  // one block of 16.8M parameters
  run.global_batch = 2;
  run.tweak = [&](EngineConfig& e) {
    e.zero.sub_group_size = 1u << 20;
    for (auto* o : {&e.zero.offload_optimizer, &e.zero.offload_param}) {
      o->device = OffloadDevice::nvme;
      o->nvme_path = swap_dir();
    }
  };
  std::unique_ptr<Device> device = make_device("cpu");
  auto comms = make_local_communicators(1);
  const size_t before = process_rss();
  Engine engine(*device, *comms[0], testing::mlp_config(run));
  Mlp mlp(engine, {run.widths});
  engine.finalize();
  const size_t held = tier_total(engine.plan().bytes, Tier::device) + tier_total(engine.plan().bytes, Tier::pinned_host) +
                      tier_total(engine.plan().bytes, Tier::host);
  const size_t now = process_rss() - std::min(before, process_rss());
  std::printf("after finalize: resident %.1f MiB more, the plan's pools %.1f MiB\n", now / 1048576.0, held / 1048576.0);
  EXPECT_EQ(engine.transfer_buffer_bytes(), 0u);
  if (!sanitized) {
    EXPECT_LE(now, held + (24u << 20));
  }
}

// Initial values reach the swap files in chunks of kTransferChunkNumel through bounce buffers of
// kTransferBounceBytes, not through a block's worth of scratch. One block of 16.8M parameters: its
// master values go to a two-copy file in pieces of one sub-group (5M elements, 21 MB: larger than a
// bounce buffer, and not a multiple of a chunk, so pieces are written in several parts and chunks
// cross from piece to piece), its bf16 shard to a one-copy file in one piece of 32 MiB. The master
// values read back (through a bounce buffer, several reads a piece) equal init_values' own, bit for
// bit, and the process's peak while finalize() runs stays within the plan's pools, the stated chunk
// scratch (values, their bf16 cast, two bounce buffers: 56 MiB) and 24 MiB, and what it held only
// while it ran within the chunk scratch and 8 MiB; the block-sized scratch this replaced took 201 MB.
TEST(OffloadMemory, InitializationStreamsABlockInChunks) {
  MlpRun run;
  run.stage = 3;
  run.dtype = DType::bf16;
  run.widths = {4096, 4096};
  EngineConfig config = testing::mlp_config(run);
  config.zero.sub_group_size = (5u << 20) + 1024;
  for (auto* o : {&config.zero.offload_optimizer, &config.zero.offload_param}) {
    o->device = OffloadDevice::nvme;
    o->nvme_path = swap_dir();
  }
  std::unique_ptr<Device> device = make_device("cpu");
  auto comms = make_local_communicators(1);
  std::ofstream("/proc/self/clear_refs") << "5";  // the peak starts again from here
  const size_t before = process_rss();
  Engine engine(*device, *comms[0], config);
  Mlp mlp(engine, {run.widths});
  engine.finalize();
  const size_t peak = process_peak_rss(), after = process_rss();
  const size_t grown = peak - std::min(before, peak);
  const auto& bytes = engine.plan().bytes;
  const size_t held = tier_total(bytes, Tier::device) + tier_total(bytes, Tier::pinned_host) + tier_total(bytes, Tier::host);
  const size_t chunk = kTransferChunkNumel * (sizeof(float) + 2) + 2 * kTransferBounceBytes;
  std::printf("finalize: resident peak %.1f MiB more, %.1f MiB above what stays; the plan's pools %.1f MiB, chunk scratch %.1f MiB\n",
              grown / 1048576.0, (peak - std::min(after, peak)) / 1048576.0, held / 1048576.0, chunk / 1048576.0);
  if (!sanitized) {
    EXPECT_LE(grown, held + chunk + (24u << 20));
    // What finalize() held only while it ran (released after): the chunk scratch.
    EXPECT_LE(peak - std::min(after, peak), chunk + (8u << 20));
  }
  const auto& blk = engine.plan().blocks[0];
  ASSERT_GT(blk.padded, 4 * kTransferChunkNumel);
  ASSERT_GT(config.zero.sub_group_size * sizeof(float), kTransferBounceBytes);
  // The reference: each parameter's values straight from init_values, independent of write_block.
  const BlockSpec& spec = engine.block_spec(0);
  std::vector<float> expected(blk.padded, 0.0f);
  for (size_t i = 0; i < spec.params.size(); ++i) {
    init_values(spec.params[i].init, config.seed, spec.name + "." + spec.params[i].name, 0, spec.params[i].numel(),
                expected.data() + blk.param_offsets[i]);
  }
  const std::vector<float> got = engine.master_values(0);
  ASSERT_EQ(got.size(), expected.size());
  size_t differ = 0;
  for (size_t i = 0; i < got.size(); ++i) differ += got[i] != expected[i];
  EXPECT_EQ(differ, 0u) << "of " << got.size() << " master values";
}

// Values set on every block (set_master_values, with each parameter's values only) against the
// same values with zeros in the alignment gaps between parameters and the padding after: through
// the transfer scratch (bf16, stage 3), whose earlier block's values must not leak into the gaps,
// and in place (f32 at stages 0-2).
TEST(SetValues, LeaveTheGapsBetweenParametersZero) {
  for (const auto& [stage, dtype] : {std::pair{0, DType::f32}, std::pair{1, DType::f32}, std::pair{1, DType::bf16},
                                     std::pair{3, DType::f32}, std::pair{3, DType::bf16}}) {
    SCOPED_TRACE(fmt::format("stage {}, {}", stage, dtype_name(dtype)));
    MlpRun run;
    run.stage = stage;
    run.dtype = dtype;
    const std::vector<int> widths = {5, 7, 3, 9};  // weights of 35, 21 and 27 elements: gaps after each
    auto device = make_device("cpu");
    auto comms = make_local_communicators(1);
    Engine engine(*device, *comms[0], testing::mlp_config(run));
    Mlp mlp(engine, {widths});
    engine.finalize();
    const size_t blocks = engine.plan().blocks.size();
    for (size_t b = 0; b < blocks; ++b) {
      size_t n = 0;  // the parameters unpadded
      for (const auto& p : engine.block_spec(static_cast<int>(b)).params) n += p.numel();
      std::vector<float> values(n);
      for (size_t i = 0; i < n; ++i) values[i] = 1.0f + static_cast<float>(b * 100 + i);
      engine.set_master_values(static_cast<int>(b), values);
    }
    size_t gaps = 0;
    for (size_t b = 0; b < blocks; ++b) {
      const auto& blk = engine.plan().blocks[b];
      const auto& spec = engine.block_spec(static_cast<int>(b));
      std::vector<float> expected(blk.padded, 0.0f);
      size_t src = 0;
      for (size_t i = 0; i < spec.params.size(); ++i)
        for (size_t e = 0; e < spec.params[i].numel(); ++e)
          expected[blk.param_offsets[i] + e] = 1.0f + static_cast<float>(b * 100 + src++);
      for (float v : expected) gaps += v == 0.0f;
      EXPECT_EQ(engine.master_values(static_cast<int>(b)), expected) << "block " << b;
    }
    EXPECT_GT(gaps, 0u);
  }
}

// A swap file that loses its bytes (here: truncated through the process's own descriptor, as a
// failing disk or a careless `truncate` would) ends the run with an IoError naming the file; the
// step does not go on with what a failed read left in the slot.
TEST(OffloadErrors, ASwapFileThatLostItsBytesEndsTheRunNamingIt) {
  MlpRun run;
  run.stage = 2;
  run.tweak = [](EngineConfig& e) {
    e.zero.sub_group_size = 1000;
    e.zero.offload_optimizer.device = OffloadDevice::nvme;
    e.zero.offload_optimizer.nvme_path = swap_dir();
  };
  auto device = make_device("cpu");
  auto comms = make_local_communicators(1);
  Engine engine(*device, *comms[0], testing::mlp_config(run));
  Mlp mlp(engine, {run.widths});
  engine.finalize();
  std::vector<float> x, t;
  auto step = [&](int k) {
    testing::mlp_batch(k, run.global_batch, run.widths.front(), run.widths.back(), x, t);
    float loss = 0;
    mlp.forward_backward(x.data(), t.data(), run.global_batch, &loss, 0);
    engine.step();
    engine.compute_stream().synchronize();
  };
  step(0);
  device->synchronize();  // the step's write-backs are on the file before it is cut
  int truncated = 0;
  for (const auto& entry : std::filesystem::directory_iterator("/proc/self/fd")) {
    std::error_code ec;
    const auto target = std::filesystem::read_symlink(entry.path(), ec).string();
    if (ec || target.find("-master.swap") == std::string::npos) continue;
    const int fd = ::open(entry.path().c_str(), O_WRONLY);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, 0), 0);
    ::close(fd);
    ++truncated;
  }
  ASSERT_EQ(truncated, 1);
  try {
    for (int k = 1; k <= 3; ++k) step(k);
    FAIL() << "three steps ran on a truncated swap file";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("master.swap"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace zeroth
