// AsyncFile's submission against the kernel's own answers: rings with and without a polling
// thread, large requests submitted in batches of a quarter of the depth from the caller's thread,
// and the worker taking over when a seccomp filter refuses io_uring_setup.
#include <linux/filter.h>   // sock_filter, BPF_*
#include <linux/seccomp.h>  // SECCOMP_RET_*, seccomp_data
#include <sys/prctl.h>      // prctl
#include <sys/syscall.h>    // __NR_io_uring_setup
#include <unistd.h>         // unlink, getpid

#include <cerrno>   // ENOSYS, EPERM
#include <cstddef>  // offsetof
#include <cstdint>  // std::uint64_t
#include <cstdio>   // std::printf
#include <cstdlib>  // std::exit
#include <cstring>  // std::memset
#include <string>   // std::string

#include <liburing.h>  // io_uring_queue_init_params: what this kernel allows, asked directly

#include <fmt/format.h>   // fmt::format
#include <gtest/gtest.h>  // TEST_P, EXPECT_*

#include "offload/aio.h"             // AsyncFile, IoHandle
#include "offload/aligned_buffer.h"  // AlignedBuffer
#include "tests/offload/byte_pattern.h"

namespace zeroth::offload {
namespace {

using namespace byte_pattern;

// Whether this kernel sets up a ring with a polling thread, asked without zeroth.
bool kernel_allows_sqpoll() {
  ::io_uring ring{};
  io_uring_params params{};
  params.flags = IORING_SETUP_SQPOLL;
  if (io_uring_queue_init_params(4, &ring, &params) != 0) return false;
  io_uring_queue_exit(&ring);
  return true;
}

struct PollCase {
  bool sqpoll;
  unsigned threads;
};
void PrintTo(const PollCase& c, std::ostream* os) { *os << (c.sqpoll ? "sqpoll, " : "no sqpoll, ") << c.threads << " thread(s)"; }

class AsyncFileSqpollTest : public ::testing::TestWithParam<PollCase> {};

// With a polling thread (shared by two rings in the second case) and without: 8 MiB out and
// back in 128 pieces.
TEST_P(AsyncFileSqpollTest, RoundTripMatchesPattern) {
  constexpr std::uint64_t kSeed = 29;
  const auto [sqpoll, threads] = GetParam();
  const std::string path = fmt::format("{}zeroth_aio_sqpoll_{}_{}_{}", ::testing::TempDir(), sqpoll, threads, ::getpid());
  AlignedBuffer out(8 * kMiB), in(8 * kMiB);
  fill_pattern(out, out.size(), 0, kSeed);
  std::memset(in.data(), 0, in.size());
  {
    AsyncFile file(path, AsyncFile::Mode::read_write, IoOptions{64 * kKiB, 8, true, threads, sqpoll});
    ASSERT_TRUE(file.io_uring()) << "io_uring is refused here (zeroth report says why); these cases need it";
    EXPECT_EQ(file.sqpoll(), sqpoll && kernel_allows_sqpoll());
    EXPECT_TRUE(file.fixed_file());
    file.write(out.data(), out.size(), 0).wait();
    file.read(in.data(), in.size(), 0).wait();
    EXPECT_EQ(file.stats().pieces, 2 * out.size() / (64 * kKiB));
  }
  EXPECT_EQ(pattern_mismatches(in.data(), in.size(), 0, kSeed), 0u);
  const auto on_disk = pread_all(path, out.size(), 0);
  EXPECT_EQ(pattern_mismatches(on_disk.data(), on_disk.size(), 0, kSeed), 0u);
  ::unlink(path.c_str());
}

INSTANTIATE_TEST_SUITE_P(Rings, AsyncFileSqpollTest,
                         ::testing::Values(PollCase{false, 1}, PollCase{true, 1}, PollCase{false, 2}, PollCase{true, 2}),
                         [](const auto& info) {
  return fmt::format("{}_{}threads", info.param.sqpoll ? "sqpoll" : "plain", info.param.threads);
});

// One request of 512 pieces through a ring of depth 32: the first submission fills the ring,
// every later one waits until a quarter of it is free, so each carries at least 8 pieces (the
// last may carry the remainder): at most 1 + 480 / 8 + 1 calls a direction, where submitting as
// each piece completes takes hundreds.
TEST(AsyncFileBatchTest, LargeRequestIsSubmittedInBatchesOfAQuarterOfTheDepth) {
  constexpr std::uint64_t kSeed = 31;
  constexpr std::size_t kBlock = 16 * kKiB, kPieces = 512;
  constexpr unsigned kDepth = 32;
  const std::string path = fmt::format("{}zeroth_aio_batch_{}", ::testing::TempDir(), ::getpid());
  AlignedBuffer out(kPieces * kBlock), in(kPieces * kBlock);
  fill_pattern(out, out.size(), 0, kSeed);
  std::memset(in.data(), 0, in.size());
  {
    AsyncFile file(path, AsyncFile::Mode::read_write, IoOptions{kBlock, kDepth, true});
    ASSERT_TRUE(file.io_uring()) << "io_uring is refused here (zeroth report says why); these cases need it";
    file.write(out.data(), out.size(), 0).wait();
    file.read(in.data(), in.size(), 0).wait();
    const IoStats stats = file.stats();
    std::printf("pieces=%llu submit_calls=%llu peak_in_flight=%u\n", static_cast<unsigned long long>(stats.pieces),
                static_cast<unsigned long long>(stats.submit_calls), stats.peak_in_flight);
    EXPECT_EQ(stats.pieces, 2 * kPieces);
    EXPECT_EQ(stats.peak_in_flight, kDepth);
    EXPECT_GE(stats.submit_calls, 2 * kPieces / kDepth);  // no call carries more than the ring holds
    EXPECT_LE(stats.submit_calls, 2 * (1 + (kPieces - kDepth) / (kDepth / 4) + 1));
  }
  EXPECT_EQ(pattern_mismatches(in.data(), in.size(), 0, kSeed), 0u);
  ::unlink(path.c_str());
}

// A request's pieces are on the ring when read() returns: the caller's thread submits them, so
// the ring is refilled as soon as a caller has a buffer free, not when the worker next wakes.
TEST(AsyncFileBatchTest, TheCallersThreadSubmitsItsPieces) {
  constexpr std::uint64_t kSeed = 37;
  constexpr std::size_t kBlock = 64 * kKiB;
  constexpr unsigned kDepth = 4;
  const std::string path = fmt::format("{}zeroth_aio_caller_{}", ::testing::TempDir(), ::getpid());
  AlignedBuffer out(2 * kDepth * kBlock), in(out.size());
  fill_pattern(out, out.size(), 0, kSeed);
  {
    AsyncFile file(path, AsyncFile::Mode::read_write, IoOptions{kBlock, kDepth, true});
    ASSERT_TRUE(file.io_uring()) << "io_uring is refused here (zeroth report says why); these cases need it";
    file.write(out.data(), out.size(), 0).wait();
    for (int round = 0; round < 20; ++round) {
      const std::uint64_t calls = file.stats().submit_calls;
      const IoHandle first = file.read(in.data(), kDepth * kBlock, 0);
      const IoStats before_wait = file.stats();
      EXPECT_EQ(before_wait.submit_calls, calls + 1) << "round " << round;
      EXPECT_EQ(before_wait.peak_in_flight, kDepth) << "round " << round;
      const IoHandle second = file.read(in.data() + kDepth * kBlock, kDepth * kBlock, kDepth * kBlock);
      first.wait();
      second.wait();
    }
  }
  EXPECT_EQ(pattern_mismatches(in.data(), in.size(), 0, kSeed), 0u);
  ::unlink(path.c_str());
}

// A seccomp filter answering io_uring_setup with `err`, as container runtimes do; the child
// process then round-trips 1 MiB and exits 0 only when the worker took over and the bytes match.
void round_trip_with_io_uring_refused(int err, const std::string& path) {
  sock_filter filter[] = {
      BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
      BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_io_uring_setup, 0, 1),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | static_cast<unsigned>(err)),
      BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
  };
  sock_fprog program{static_cast<unsigned short>(std::size(filter)), filter};
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 || ::prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, &program) != 0) {
    std::fprintf(stderr, "seccomp filter refused\n");
    std::exit(2);
  }
  constexpr std::uint64_t kSeed = 5;
  AlignedBuffer out(1 * kMiB), in(1 * kMiB);
  fill_pattern(out, out.size(), 64 * kKiB, kSeed);
  std::memset(in.data(), 0, in.size());
  AsyncFile file(path, AsyncFile::Mode::read_write, IoOptions{64 * kKiB, 8, true});
  if (file.io_uring()) {
    std::fprintf(stderr, "io_uring in use despite the filter\n");
    std::exit(3);
  }
  file.write(out.data(), out.size(), 64 * kKiB).wait();
  file.read(in.data(), in.size(), 64 * kKiB).wait();
  const std::size_t bad = pattern_mismatches(in.data(), in.size(), 64 * kKiB, kSeed);
  ::unlink(path.c_str());  // the threadsafe death test re-runs the body: this process named the file
  std::fprintf(stderr, "mismatched words: %zu\n", bad);
  std::exit(bad == 0 ? 0 : 4);
}

TEST(AsyncFileFallbackTest, IoUringRefusedByEnosysOrEpermUsesWorker) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  for (int err : {ENOSYS, EPERM}) {
    const std::string path = fmt::format("{}zeroth_aio_refused_{}_{}", ::testing::TempDir(), err, ::getpid());
    EXPECT_EXIT(round_trip_with_io_uring_refused(err, path), ::testing::ExitedWithCode(0), "mismatched words: 0") << "errno " << err;
  }
}
}  // namespace
}  // namespace zeroth::offload
