// The nccl backend on a machine with a GPU: every collective on one rank per GPU (world size 1
// on a single-GPU machine), through the same checks as the other backends.
#include <gtest/gtest.h>

#include "comm/nccl/nccl_comm.h"
#include "core/error_types.h"
#include "tests/comm/collective_checks.h"
#include "tests/process_util.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

// One rank on one GPU: every op's calls, arguments and results, but no traffic between GPUs (an
// all-to-all only sends to itself). On a machine with more GPUs, tools/gpu-check.sh's bench comm
// runs one rank per GPU, timing the ops without checking their values.
TEST(Nccl, EveryCollectiveMatchesTheSerialReferenceOnOneGpu) {
  ZEROTH_SKIP_WITHOUT("cuda");
  RendezvousInfo info;
  info.master_port = testing::free_port();
  auto comm = make_nccl_communicator(info, 0);
  auto device = make_device("cuda:0");
  auto stream = device->create_stream();
  testing::CheckOptions options;
  options.exact = false;
  testing::check_all_gather(*comm, *device, *stream, options);
  testing::check_reduce_scatter(*comm, *device, *stream, options);
  testing::check_all_reduce(*comm, *device, *stream, options);
  testing::check_broadcast(*comm, *device, *stream, options);
  testing::check_all_to_all(*comm, *device, *stream, options);
  testing::check_all_to_allv(*comm, *device, *stream, options);
  testing::check_barrier(*comm, *device, *stream);
  auto sub = comm->split(0, 0);
  ASSERT_TRUE(sub);
  testing::check_all_reduce(*sub, *device, *stream, {.exact = false, .counts = {1, 1000}, .large_bytes = 0});
}

TEST(Nccl, WithoutAGpuTheErrorSaysWhy) {
  if (cuda_device_count() > 0) {
    RendezvousInfo info;
    info.master_port = testing::free_port();
    EXPECT_THROW(make_nccl_communicator(info, 99), CommError) << "GPU 99 does not exist";
    return;
  }
  RendezvousInfo info;
  try {
    make_nccl_communicator(info, 0);
    FAIL() << "an nccl communicator without a GPU";
  } catch (const CommError& e) {
    const std::string msg = e.what();
    EXPECT_TRUE(msg.find("usable GPU") != std::string::npos || msg.find("CUDA backend") != std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace zeroth
