// Streams and events: order within a stream, concurrency across streams, cross-stream waits,
// errors surfacing at the next sync point (and travelling through events), and destruction with
// work still queued. Runs on every device; host callbacks make the behaviour observable.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <future>
#include <mutex>
#include <stdexcept>
#include <thread>
#include <vector>

#include "core/device.h"
#include "core/error_types.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;

using Streams = testing::DeviceTest;

TEST_P(Streams, WorkOnOneStreamRunsInOrder) {
  auto stream = device_->create_stream();
  std::vector<int> seen;
  for (int i = 0; i < 1000; ++i) stream->enqueue_host([&seen, i] { seen.push_back(i); });
  stream->synchronize();
  ASSERT_EQ(seen.size(), 1000u);
  for (int i = 0; i < 1000; ++i) ASSERT_EQ(seen[i], i);
}

TEST_P(Streams, WaitOnAnEventOrdersWorkAcrossStreams) {
  auto producer = device_->create_stream(), consumer = device_->create_stream();
  auto ready = device_->create_event();
  for (int round = 0; round < 20; ++round) {
    std::atomic<int> value{0};
    int observed = -1;
    producer->enqueue_host([&] {
      std::this_thread::sleep_for(2ms);
      value = round + 1;
    });
    ready->record(*producer);
    consumer->wait(*ready);
    consumer->enqueue_host([&] { observed = value.load(); });
    consumer->synchronize();
    ASSERT_EQ(observed, round + 1) << "round " << round;
    producer->synchronize();
  }
}

TEST_P(Streams, EventSynchronizeAndQueryFollowTheRecordedWork) {
  auto stream = device_->create_stream();
  auto event = device_->create_event();
  EXPECT_TRUE(event->query()) << "an event never recorded is complete";
  event->synchronize();
  std::promise<void> release;
  auto released = release.get_future().share();
  stream->enqueue_host([released] { released.wait_for(10s); });
  event->record(*stream);
  EXPECT_FALSE(event->query());
  release.set_value();
  event->synchronize();
  EXPECT_TRUE(event->query());
}

TEST_P(Streams, DeviceKernelsFollowStreamOrder) {
  auto stream = device_->create_stream();
  Buffer buf = device_->allocate(1024 * sizeof(float), MemTag::other);
  auto view = buf.view(DType::f32);
  device_->fill(*stream, view, 1.0f);
  for (int i = 0; i < 10; ++i) device_->scale(*stream, view, 2.0f);
  std::vector<float> host(1024);
  device_->copy(*stream, host.data(), buf.data(), buf.bytes());
  stream->synchronize();
  for (float v : host) ASSERT_EQ(v, 1024.0f);
}

INSTANTIATE_TEST_SUITE_P(Devices, Streams, ::testing::ValuesIn(testing::device_specs()), [](const auto& info) { return info.param; });

// CPU only: CUDA may run host callbacks of all streams on one driver thread; kernel concurrency
// on a GPU is the driver's business.
TEST(CpuStreams, TwoStreamsRunConcurrently) {
  auto device_ = make_device("cpu");
  // Stream A blocks until stream B has run: only possible if they execute concurrently.
  auto a = device_->create_stream(), b = device_->create_stream();
  std::promise<void> b_ran;
  auto b_ran_future = b_ran.get_future();
  std::atomic<bool> a_saw_b{false};
  a->enqueue_host([&] { a_saw_b = b_ran_future.wait_for(10s) == std::future_status::ready; });
  b->enqueue_host([&] { b_ran.set_value(); });
  a->synchronize();
  b->synchronize();
  EXPECT_TRUE(a_saw_b.load());
}

// Error semantics are the CPU device's own (CUDA reports kernel errors through CUDA_CHECK).
TEST(CpuStreamErrors, AnErrorSurfacesAtTheNextSynchronizeAndLaterWorkIsSkipped) {
  auto device = make_device("cpu");
  auto stream = device->create_stream();
  int after = 0;
  stream->enqueue_host([] { throw IoError("disk on fire"); });
  stream->enqueue_host([&] { ++after; });
  try {
    stream->synchronize();
    FAIL() << "error was lost";
  } catch (const IoError& e) {
    EXPECT_STREQ(e.what(), "disk on fire");
  }
  EXPECT_EQ(after, 0) << "work after a failure must not run on its results";
  // surfaced once: the stream is usable again
  stream->enqueue_host([&] { ++after; });
  EXPECT_NO_THROW(stream->synchronize());
  EXPECT_EQ(after, 1);
}

TEST(CpuStreamErrors, AnErrorTravelsThroughEventsToWaitingStreams) {
  auto device = make_device("cpu");
  auto producer = device->create_stream(), consumer = device->create_stream();
  auto event = device->create_event();
  producer->enqueue_host([] { throw CommError("peer 3 vanished"); });
  event->record(*producer);
  bool consumer_ran = false;
  consumer->wait(*event);
  consumer->enqueue_host([&] { consumer_ran = true; });
  EXPECT_THROW(event->synchronize(), CommError);
  EXPECT_THROW(consumer->synchronize(), CommError);
  EXPECT_FALSE(consumer_ran);
  EXPECT_THROW(producer->synchronize(), CommError);
}

TEST(CpuStreamErrors, KernelErrorsOnAStreamSurface) {
  auto device = make_device("cpu");
  auto stream = device->create_stream();
  Buffer buf = device->allocate(64, MemTag::other);
  device->fill(*stream, buf.view(DType::f32), 1.0f);
  stream->enqueue_host([] { throw std::runtime_error("kernel failed"); });
  EXPECT_THROW(device->synchronize(), std::runtime_error);
}

TEST(CpuStreamLifetime, DestroyingAStreamRunsTheWorkStillQueued) {
  auto device = make_device("cpu");
  std::atomic<int> done{0};
  {
    auto stream = device->create_stream();
    for (int i = 0; i < 200; ++i) {
      stream->enqueue_host([&] {
        std::this_thread::sleep_for(50us);
        ++done;
      });
    }
  }
  EXPECT_EQ(done.load(), 200);
}

TEST(CpuStreamLifetime, DestroyingAStreamWithAnUnsurfacedErrorDoesNotThrow) {
  auto device = make_device("cpu");
  auto stream = device->create_stream();
  stream->enqueue_host([] { throw std::runtime_error("nobody looks"); });
  EXPECT_NO_THROW(stream.reset());
}

TEST(CpuStreamLifetime, ManyStreamsAndEventsUnderContention) {
  auto device = make_device("cpu");
  constexpr int kStreams = 6, kRounds = 200;
  std::vector<std::unique_ptr<Stream>> streams;
  std::vector<std::unique_ptr<Event>> events;
  for (int i = 0; i < kStreams; ++i) {
    streams.push_back(device->create_stream());
    events.push_back(device->create_event());
  }
  // A ring: each stream waits on its predecessor's last event, then bumps a shared counter.
  std::mutex m;
  std::vector<int> order;
  for (int r = 0; r < kRounds; ++r) {
    for (int s = 0; s < kStreams; ++s) {
      if (s > 0) streams[s]->wait(*events[s - 1]);
      else if (r > 0) streams[0]->wait(*events[kStreams - 1]);
      streams[s]->enqueue_host([&, s] {
        std::lock_guard lock(m);
        order.push_back(s);
      });
      events[s]->record(*streams[s]);
    }
  }
  device->synchronize();
  ASSERT_EQ(order.size(), static_cast<size_t>(kStreams * kRounds));
  for (size_t i = 0; i < order.size(); ++i) ASSERT_EQ(order[i], static_cast<int>(i % kStreams)) << i;
}

}  // namespace
}  // namespace zeroth
