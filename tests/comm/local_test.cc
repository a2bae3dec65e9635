// The local backend: every collective against the serial reference (bit for bit) on world sizes
// 1-4 and every device, desync and timeout errors, abort, split, the link model, byte counts.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <thread>

#include "comm/local/local_comm.h"
#include "core/error_types.h"
#include "tests/comm/collective_checks.h"
#include "tests/test_util.h"

namespace zeroth {
namespace {

using namespace std::chrono_literals;
using testing::CheckOptions;

struct WorldCase {
  std::string device;
  int ranks;
};
void PrintTo(const WorldCase& w, std::ostream* os) { *os << w.ranks << " ranks on " << w.device; }

class LocalCollectives : public ::testing::TestWithParam<WorldCase> {};

TEST_P(LocalCollectives, EveryCollectiveMatchesTheSerialReferenceBitForBit) {
  const auto [spec, n] = GetParam();
  ZEROTH_SKIP_WITHOUT(spec);
  auto device = make_device(spec);
  CheckOptions options;
  options.exact = true;
  run_local_ranks(n, [&](Communicator& comm) {
    auto stream = device->create_stream();
    testing::check_everything(comm, *device, *stream, options);
  });
  EXPECT_EQ(device->memory().stats().total_in_use, 0u) << "collectives leaked scratch memory";
}

std::vector<WorldCase> world_cases() {
  std::vector<WorldCase> cases;
  for (const auto& spec : testing::device_specs()) {
    for (int n = 1; n <= 4; ++n) cases.push_back({spec, n});
  }
  return cases;
}

INSTANTIATE_TEST_SUITE_P(Worlds, LocalCollectives, ::testing::ValuesIn(world_cases()),
                         [](const auto& info) { return info.param.device + "_" + std::to_string(info.param.ranks) + "ranks"; });

CommOptions short_timeout(std::chrono::milliseconds timeout = 500ms) {
  CommOptions o;
  o.timeout = timeout;
  return o;
}

TEST(LocalComm, DifferentCollectivesOnDifferentRanksRaiseADesyncNamingBoth) {
  auto device = make_device("cpu");
  std::atomic<int> errors{0};
  auto comms = make_local_communicators(2, short_timeout());
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto stream = device->create_stream();
      Buffer a = device->allocate(64 * 4, MemTag::buffers);
      try {
        if (r == 0) comms[r]->all_gather(*stream, a.view(DType::f32).slice(0, 32), a.view(DType::f32));
        else comms[r]->all_reduce(*stream, a.view(DType::bf16), ReduceOp::sum);
      } catch (const CommError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("desync"), std::string::npos) << msg;
        EXPECT_NE(msg.find("#1 all_gather(count=32, f32)"), std::string::npos) << msg;
        EXPECT_NE(msg.find("#1 all_reduce(count=128, bf16, sum)"), std::string::npos) << msg;
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 2) << "both ranks must see the desync";
}

TEST(LocalComm, ARankThatNeverArrivesIsNamedWithinTheTimeout) {
  auto device = make_device("cpu");
  auto comms = make_local_communicators(3, short_timeout(400ms));
  std::vector<std::thread> threads;
  std::atomic<int> named{0};
  for (int r = 0; r < 2; ++r) {  // rank 2 never calls
    threads.emplace_back([&, r] {
      auto stream = device->create_stream();
      const auto start = std::chrono::steady_clock::now();
      try {
        comms[r]->barrier(*stream);
        ADD_FAILURE() << "barrier completed without rank 2";
      } catch (const CommError& e) {
        const auto waited = std::chrono::steady_clock::now() - start;
        EXPECT_LT(waited, 400ms + 10s);
        EXPECT_NE(std::string(e.what()).find("waiting for rank(s) 2"), std::string::npos) << e.what();
        ++named;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(named.load(), 2);
}

TEST(LocalComm, AFailingRankAbortsTheOthersAndItsErrorIsRethrown) {
  auto device = make_device("cpu");
  const auto start = std::chrono::steady_clock::now();
  try {
    run_local_ranks(
        4,
        [&](Communicator& comm) {
      auto stream = device->create_stream();
      if (comm.rank() == 2) throw IoError("rank 2's disk is full");
      comm.barrier(*stream);
      stream->synchronize();
        },
        short_timeout(60s));
    FAIL() << "no error";
  } catch (const IoError& e) {
    EXPECT_STREQ(e.what(), "rank 2's disk is full");
  }
  EXPECT_LT(std::chrono::steady_clock::now() - start, 10s) << "the others waited for the timeout instead of aborting";
}

TEST(LocalComm, SplitFormsGroupsByColorOrderedByKey) {
  auto device = make_device("cpu");
  run_local_ranks(4, [&](Communicator& comm) {
    auto stream = device->create_stream();
    // Even and odd ranks, with keys that reverse the order inside each group.
    auto sub = comm.split(comm.rank() % 2, -comm.rank());
    ASSERT_TRUE(sub);
    EXPECT_EQ(sub->size(), 2);
    EXPECT_EQ(sub->rank(), comm.rank() < 2 ? 1 : 0);
    Buffer b = device->allocate(4, MemTag::buffers);
    const float mine = static_cast<float>(comm.rank());
    device->copy(*stream, b.data(), &mine, 4);
    sub->all_reduce(*stream, b.view(DType::f32), ReduceOp::sum);
    float sum = 0;
    device->copy(*stream, &sum, b.data(), 4);
    stream->synchronize();
    EXPECT_EQ(sum, comm.rank() % 2 == 0 ? 0.0f + 2.0f : 1.0f + 3.0f);
    auto none = comm.split(comm.rank() == 0 ? -1 : 0, 0);
    EXPECT_EQ(none == nullptr, comm.rank() == 0);
    if (none) {
      EXPECT_EQ(none->size(), 3);
    }
  });
}

TEST(LocalComm, ByteCountsFollowTheZeroVolumeConvention) {
  auto device = make_device("cpu");
  run_local_ranks(4, [&](Communicator& comm) {
    auto stream = device->create_stream();
    Buffer big = device->allocate(4096 * 4, MemTag::buffers);
    auto all = big.view(DType::f32);
    comm.all_gather(*stream, all.slice(comm.rank() * 1024, 1024), all);
    comm.reduce_scatter(*stream, all, all.slice(comm.rank() * 1024, 1024), ReduceOp::sum);
    comm.all_reduce(*stream, all, ReduceOp::sum);
    stream->synchronize();
    const auto stats = comm.stats();
    EXPECT_EQ(stats.bytes[static_cast<size_t>(CollectiveOp::all_gather)], 16384u);
    EXPECT_EQ(stats.bytes[static_cast<size_t>(CollectiveOp::reduce_scatter)], 16384u);
    EXPECT_EQ(stats.bytes[static_cast<size_t>(CollectiveOp::all_reduce)], 2 * 16384u);
    EXPECT_EQ(stats.bus_bytes[static_cast<size_t>(CollectiveOp::all_gather)], 16384u * 3 / 4);
    EXPECT_EQ(stats.total_bytes(), 4 * 16384u);
  });
}

TEST(LocalComm, AllToAllCountsWhatEachRankSends) {
  auto device = make_device("cpu");
  run_local_ranks(4, [&](Communicator& comm) {
    auto stream = device->create_stream();
    Buffer send = device->allocate(4096 * 4, MemTag::buffers), recv = device->allocate(4096 * 4, MemTag::buffers);
    comm.all_to_all(*stream, send.view(DType::f32), recv.view(DType::f32));
    const std::vector<size_t> counts = {100, 200, 300, 400};  // every rank sends the same: rank p gets 4 x counts[p]
    comm.all_to_allv(*stream, send.view(DType::f32), counts, recv.view(DType::f32));
    stream->synchronize();
    const auto stats = comm.stats();
    EXPECT_EQ(stats.bytes[static_cast<size_t>(CollectiveOp::all_to_all)], 16384u);
    EXPECT_EQ(stats.bus_bytes[static_cast<size_t>(CollectiveOp::all_to_all)], 16384u * 3 / 4);
    EXPECT_EQ(stats.bytes[static_cast<size_t>(CollectiveOp::all_to_allv)], 1000u * 4);
    EXPECT_EQ(stats.bus_bytes[static_cast<size_t>(CollectiveOp::all_to_allv)], (1000u - counts[comm.rank()]) * 4);
  });
}

// Rank 2 has room for 10 elements; 3 x 4 are sent to it. Every rank must learn it before any
// data moves, and say the same thing.
TEST(LocalComm, AllToAllvIntoTooSmallARecvFailsOnEveryRankNamingIt) {
  auto device = make_device("cpu");
  std::atomic<int> named{0};
  auto comms = make_local_communicators(3, short_timeout(5s));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto stream = device->create_stream();
      Buffer send = device->allocate(64 * 4, MemTag::buffers), recv = device->allocate(64 * 4, MemTag::buffers);
      const std::vector<size_t> counts = {1, 2, 4};
      try {
        comms[r]->all_to_allv(*stream, send.view(DType::f32), counts, recv.view(DType::f32).slice(0, r == 2 ? 10 : 64));
        ADD_FAILURE() << "rank " << r << " went on";
      } catch (const CommError& e) {
        const std::string msg = e.what();
        EXPECT_NE(msg.find("rank 2 has room for 10 elements but 12 are sent to it (4 from rank 0, 4 from rank 1, 4 from rank 2)"),
                  std::string::npos)
            << msg;
        ++named;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(named.load(), 3);
}

// Rank 1 passes counts that add up to more than its send buffer: it says so, and the others learn
// at the count exchange that it refused, instead of waiting for it until the timeout.
TEST(LocalComm, AllToAllvArgumentsOneRankRefusesEndEveryRank) {
  auto device = make_device("cpu");
  std::atomic<int> ended{0};
  // A peer that waited for rank 1 would end by its timeout with another message than the refusal.
  auto comms = make_local_communicators(3, short_timeout(60s));
  std::vector<std::thread> threads;
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      auto stream = device->create_stream();
      Buffer send = device->allocate(64 * 4, MemTag::buffers), recv = device->allocate(64 * 4, MemTag::buffers);
      const std::vector<size_t> counts = {1, r == 1 ? 100u : 2u, 4};
      try {
        comms[r]->all_to_allv(*stream, send.view(DType::f32), counts, recv.view(DType::f32));
        ADD_FAILURE() << "rank " << r << " went on";
      } catch (const Error& e) {
        const std::string msg = e.what();
        if (r == 1)
          EXPECT_NE(msg.find("on rank 1: the send counts add up to 105 elements but send holds 64"), std::string::npos) << msg;
        else EXPECT_NE(msg.find("rank 1 refused its arguments"), std::string::npos) << msg;
        ++ended;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(ended.load(), 3);
}

TEST(LocalComm, MismatchedSendAndRecvAreAnErrorOnBothSides) {
  auto device = make_device("cpu");
  std::atomic<int> errors{0};
  auto comms = make_local_communicators(2, short_timeout(2s));
  std::vector<std::thread> threads;
  for (int r = 0; r < 2; ++r) {
    threads.emplace_back([&, r] {
      auto stream = device->create_stream();
      Buffer b = device->allocate(64, MemTag::buffers);
      try {
        if (r == 0) comms[0]->send(*stream, b.view(DType::f32), 1);
        else comms[1]->recv(*stream, b.view(DType::f32).slice(0, 8), 0);
      } catch (const CommError& e) {
        EXPECT_NE(std::string(e.what()).find("send/recv mismatch"), std::string::npos) << e.what();
        ++errors;
      }
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(errors.load(), 2);
}

// With a modeled link, a collective takes the link's time; compute on another stream overlaps
// it, so both together take about the longer of the two, not their sum.
TEST(LocalComm, LinkModelMakesCollectivesTakeLinkTimeAndOverlapIsReal) {
  using clock = std::chrono::steady_clock;
  auto device = make_device("cpu");
  CommOptions o;
  o.link = {.latency_us = 100, .bandwidth_gbps = 0.01};  // 10 MB/s: 1.5 MB of bus bytes = 150 ms
  const size_t count = 500'000;                          // f32 per rank; all_gather of 2 MB total
  std::vector<double> comm_only(2), overlapped(2);
  run_local_ranks(
      2,
      [&](Communicator& comm) {
    auto comm_stream = device->create_stream(), compute = device->create_stream();
    Buffer buf = device->allocate(2 * count * 4, MemTag::buffers);
    auto all = buf.view(DType::f32);
    auto t0 = clock::now();
    comm.all_gather(*comm_stream, all.slice(comm.rank() * count, count), all);
    comm_stream->synchronize();
    comm_only[comm.rank()] = std::chrono::duration<double>(clock::now() - t0).count();
    t0 = clock::now();
    comm.all_gather(*comm_stream, all.slice(comm.rank() * count, count), all);
    compute->enqueue_host([] { std::this_thread::sleep_for(150ms); });
    comm_stream->synchronize();
    compute->synchronize();
    overlapped[comm.rank()] = std::chrono::duration<double>(clock::now() - t0).count();
      },
      o);
  const double modeled = 100e-6 + (2.0 * count * 4 / 2) / (0.01e9);  // bus bytes = (n-1)/n of 4 MB
  for (int r = 0; r < 2; ++r) {
    std::printf("[link model] rank %d: collective %.3f s (modeled %.3f s), with 0.150 s compute overlapped %.3f s\n", r, comm_only[r],
                modeled, overlapped[r]);
    EXPECT_GE(comm_only[r], modeled * 0.99);
    EXPECT_LT(overlapped[r], modeled + 0.150 * 0.6) << "compute did not overlap the collective";
  }
}

}  // namespace
}  // namespace zeroth
