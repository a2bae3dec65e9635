// One rank of a multi-process Gloo test: started by gloo_test.cc with the launcher environment,
// it runs the case its first argument names and exits non-zero on any failure.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "comm/gloo/gloo_comm.h"
#include "comm/rendezvous.h"
#include "tests/comm/collective_checks.h"

namespace zeroth {
namespace {

std::unique_ptr<Communicator> connect() {
  auto info = rendezvous_from_env();
  if (!info) {
    std::fprintf(stderr, "gloo_worker: no RANK/WORLD_SIZE in the environment\n");
    std::exit(2);
  }
  return make_gloo_communicator(*info);
}

TEST(GlooWorker, Collectives) {
  auto comm = connect();
  auto device = make_device("cpu");
  auto stream = device->create_stream();
  testing::CheckOptions options;
  options.exact = false;  // rings sum in a rotated order
  testing::check_everything(*comm, *device, *stream, options);
  // Two streams issuing collectives concurrently must not cross their messages.
  auto other = device->create_stream();
  testing::check_all_reduce(*comm, *device, *other, {.exact = false, .counts = {999}, .large_bytes = 0});
}

TEST(GlooWorker, Split) {
  auto comm = connect();
  auto device = make_device("cpu");
  auto stream = device->create_stream();
  auto sub = comm->split(comm->rank() % 2, -comm->rank());
  ASSERT_TRUE(sub);
  testing::check_all_reduce(*sub, *device, *stream, {.exact = false, .counts = {1, 1000}, .large_bytes = 0});
  testing::check_all_gather(*sub, *device, *stream, {.exact = false, .counts = {5}, .large_bytes = 0});
}

// Runs all-reduces until the test driver kills a peer; must end in a CommError naming it.
TEST(GlooWorker, RunUntilAPeerDies) {
  auto comm = connect();
  auto device = make_device("cpu");
  auto stream = device->create_stream();
  Buffer b = device->allocate(1 << 20, MemTag::buffers);
  for (int i = 0;; ++i) {
    comm->all_reduce(*stream, b.view(DType::f32), ReduceOp::sum);
    stream->synchronize();
    if (i == 0) std::printf("ready\n"), std::fflush(stdout);
  }
}

// The same with all-to-alls, uneven ones among them: the pattern of mixture-of-experts layers.
TEST(GlooWorker, RunAllToAllsUntilAPeerDies) {
  auto comm = connect();
  auto device = make_device("cpu");
  auto stream = device->create_stream();
  const size_t n = comm->size(), each = (size_t{1} << 18) / n;
  Buffer send = device->allocate(n * each * 4, MemTag::buffers), recv = device->allocate(n * n * each * 4, MemTag::buffers);
  std::vector<size_t> counts(n);
  for (size_t p = 0; p < n; ++p) counts[p] = (p + comm->rank()) % n * each / n;
  for (int i = 0;; ++i) {
    comm->all_to_all(*stream, send.view(DType::f32), recv.view(DType::f32).slice(0, n * each));
    comm->all_to_allv(*stream, send.view(DType::f32), counts, recv.view(DType::f32));
    stream->synchronize();
    if (i == 0) std::printf("ready\n"), std::fflush(stdout);
  }
}

// The communicator goes out of scope while its op is still queued: destruction waits for it.
TEST(GlooWorker, DestroyWhileInFlight) {
  auto device = make_device("cpu");
  auto stream = device->create_stream();
  Buffer b = device->allocate(4 << 20, MemTag::buffers);
  device->fill(*stream, b.view(DType::f32), 1.0f);
  {
    auto comm = connect();
    stream->enqueue_host([] { std::this_thread::sleep_for(std::chrono::milliseconds(200)); });
    comm->all_reduce(*stream, b.view(DType::f32), ReduceOp::sum);
    const int n = comm->size();
    stream->enqueue_host([&b, n] {
      if (b.as<float>()[12345] != static_cast<float>(n)) throw std::runtime_error("wrong all_reduce result");
    });
  }
  stream->synchronize();
}

TEST(GlooWorker, Desync) {
  auto comm = connect();
  auto device = make_device("cpu");
  auto stream = device->create_stream();
  Buffer b = device->allocate(4096, MemTag::buffers);
  if (comm->rank() == 0) comm->all_reduce(*stream, b.view(DType::f32), ReduceOp::sum);
  else comm->broadcast(*stream, b.view(DType::bf16), 0);
  stream->synchronize();
}

}  // namespace
}  // namespace zeroth
