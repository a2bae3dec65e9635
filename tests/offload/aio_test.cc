// AsyncFile against pread/pwrite and a known byte pattern, on a disk file (O_DIRECT where the
// file system has it) and on tmpfs (buffered fallback), through io_uring and through the worker.
#include <linux/filter.h>   // sock_filter, BPF_*
#include <linux/seccomp.h>  // SECCOMP_RET_*, seccomp_data
#include <sys/prctl.h>      // prctl
#include <sys/stat.h>       // stat
#include <sys/syscall.h>    // __NR_io_uring_setup
#include <fcntl.h>          // open
#include <unistd.h>         // pread, unlink, close

#include <cstddef>     // offsetof
#include <cstdint>     // std::uint64_t
#include <cstdlib>     // std::exit
#include <cstring>     // std::memcmp
#include <filesystem>  // std::filesystem::exists
#include <numeric>     // std::accumulate
#include <random>      // std::mt19937_64
#include <string>      // std::string
#include <vector>      // std::vector

#include <liburing.h>  // io_uring_queue_init_params: what this kernel allows, asked directly

#include <fmt/format.h>   // fmt::format
#include <gtest/gtest.h>  // TEST_P, EXPECT_*

#include "core/error_types.h"        // IoError, InvalidArgument
#include "offload/aio.h"             // AsyncFile, IoHandle
#include "offload/aligned_buffer.h"  // AlignedBuffer, kIoAlignment

namespace zeroth::offload {
namespace {

constexpr std::size_t kKiB = 1024, kMiB = 1024 * kKiB;

// splitmix64 keyed by the absolute file offset of each 8-byte word, so any byte's expected
// value is known from its position alone.
std::uint64_t pattern_word(std::uint64_t file_offset, std::uint64_t seed) {
  std::uint64_t z = file_offset / 8 + seed * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void fill_pattern(AlignedBuffer& buffer, std::size_t length, std::uint64_t file_offset, std::uint64_t seed) {
  auto* words = reinterpret_cast<std::uint64_t*>(buffer.data());
  for (std::size_t i = 0; i < length / 8; ++i) words[i] = pattern_word(file_offset + 8 * i, seed);
}

// Number of 8-byte words of `data` that differ from the pattern at `file_offset`.
std::size_t pattern_mismatches(const std::byte* data, std::size_t length, std::uint64_t file_offset, std::uint64_t seed) {
  const auto* words = reinterpret_cast<const std::uint64_t*>(data);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < length / 8; ++i) bad += words[i] != pattern_word(file_offset + 8 * i, seed);
  return bad;
}

// The file's bytes as plain pread sees them: the reference the asynchronous path is checked against.
std::vector<std::byte> pread_all(const std::string& path, std::size_t length, std::uint64_t offset) {
  std::vector<std::byte> bytes(length);
  const int fd = ::open(path.c_str(), O_RDONLY);
  EXPECT_NE(fd, -1) << path;
  std::size_t got = 0;
  while (got < length) {
    const ssize_t rc = ::pread(fd, bytes.data() + got, length - got, static_cast<off_t>(offset + got));
    if (rc <= 0) break;
    got += static_cast<std::size_t>(rc);
  }
  ::close(fd);
  EXPECT_EQ(got, length) << path;
  return bytes;
}

std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<std::uint64_t>(st.st_size);
}

struct Place {
  std::string dir;
  bool use_io_uring;
};
void PrintTo(const Place& p, std::ostream* os) { *os << p.dir << (p.use_io_uring ? " io_uring" : " worker"); }

std::vector<Place> places() {
  std::vector<Place> out;
  std::vector<std::string> dirs{::testing::TempDir()};
  if (std::filesystem::is_directory("/dev/shm")) dirs.push_back("/dev/shm/");
  for (const auto& dir : dirs)
    for (bool uring : {true, false}) out.push_back({dir, uring});
  return out;
}

class AsyncFileTest : public ::testing::TestWithParam<Place> {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = info->name();  // "Case/place": no slash in a file name
    for (auto& c : name)
      if (c == '/') c = '_';
    path_ = fmt::format("{}zeroth_aio_{}_{}", GetParam().dir, name, ::getpid());
    ::unlink(path_.c_str());
  }
  void TearDown() override { ::unlink(path_.c_str()); }
  IoOptions options(std::size_t block_size, unsigned queue_depth, unsigned threads = 1, bool sqpoll = false) const {
    return IoOptions{block_size, queue_depth, GetParam().use_io_uring, threads, sqpoll};
  }
  std::string path_;
};

// Regions of several MiB at offsets that are 4 KiB-aligned but not block-aligned, so pieces
// start mid-block and the last piece of each request is short.
TEST_P(AsyncFileTest, RoundTripAtBlockUnalignedOffsetsMatchesPattern) {
  constexpr std::uint64_t kSeed = 7;
  const std::size_t block = 64 * kKiB;
  struct Region {
    std::uint64_t offset;
    std::size_t length;
  };
  const std::vector<Region> regions{{5 * 4 * kKiB, 3 * kMiB + 12 * kKiB},
                                    {4 * kMiB + 4 * kKiB, 2 * kMiB + 4 * kKiB},
                                    {7 * kMiB + 60 * kKiB, 68 * kKiB}};
  std::vector<AlignedBuffer> out, in;
  {
    AsyncFile file(path_, AsyncFile::Mode::read_write, options(block, 8));
    std::vector<IoHandle> writes;
    for (const auto& r : regions) {
      out.emplace_back(r.length);
      fill_pattern(out.back(), r.length, r.offset, kSeed);
      writes.push_back(file.write(out.back().data(), r.length, r.offset));
    }
    for (auto& h : writes) h.wait();
    for (const auto& h : writes) EXPECT_TRUE(h.done());

    std::vector<IoHandle> reads;
    for (const auto& r : regions) {
      in.emplace_back(r.length);
      std::memset(in.back().data(), 0xA5, r.length);
      reads.push_back(file.read(in.back().data(), r.length, r.offset));
    }
    for (auto& h : reads) h.wait();
    const IoStats stats = file.stats();
    std::size_t expected_pieces = 0;
    for (const auto& r : regions) expected_pieces += 2 * ((r.length + block - 1) / block);
    // Resumed short transfers add pieces; none are expected on a local file.
    EXPECT_GE(stats.pieces, expected_pieces);
    std::printf("%s: direct=%d io_uring=%d pieces=%llu submit_calls=%llu peak_in_flight=%u\n", path_.c_str(), file.direct(),
                file.io_uring(), static_cast<unsigned long long>(stats.pieces), static_cast<unsigned long long>(stats.submit_calls),
                stats.peak_in_flight);
  }
  for (std::size_t i = 0; i < regions.size(); ++i) {
    EXPECT_EQ(pattern_mismatches(in[i].data(), regions[i].length, regions[i].offset, kSeed), 0u) << "region " << i;
    const auto on_disk = pread_all(path_, regions[i].length, regions[i].offset);
    EXPECT_EQ(pattern_mismatches(on_disk.data(), regions[i].length, regions[i].offset, kSeed), 0u) << "region " << i;
  }
  EXPECT_EQ(file_size(path_), regions.back().offset + regions.back().length);
}

// 64 requests of 4 pieces each, all issued before the first wait, through a ring of depth 4.
TEST_P(AsyncFileTest, ManyRequestsBeyondQueueDepthAllComplete) {
  constexpr std::uint64_t kSeed = 11;
  constexpr unsigned kDepth = 4;
  constexpr std::size_t kRequests = 64, kLength = 16 * kKiB;
  AlignedBuffer out(kRequests * kLength), in(kRequests * kLength);
  fill_pattern(out, out.size(), 0, kSeed);
  std::memset(in.data(), 0, in.size());
  AsyncFile file(path_, AsyncFile::Mode::read_write, options(4 * kKiB, kDepth));
  std::vector<IoHandle> handles;
  // Reverse order, so the file grows from the end first.
  for (std::size_t i = kRequests; i-- > 0;) handles.push_back(file.write(out.data() + i * kLength, kLength, i * kLength));
  for (auto& h : handles) h.wait();
  handles.clear();
  for (std::size_t i = 0; i < kRequests; ++i) handles.push_back(file.read(in.data() + i * kLength, kLength, i * kLength));
  for (auto& h : handles) h.wait();
  EXPECT_EQ(pattern_mismatches(in.data(), in.size(), 0, kSeed), 0u);
  const IoStats stats = file.stats();
  EXPECT_EQ(stats.pieces, 2 * kRequests * kLength / (4 * kKiB));
  // A request's pieces are queued together, so the first batch alone fills the ring.
  EXPECT_EQ(stats.peak_in_flight, GetParam().use_io_uring && file.io_uring() ? kDepth : 1u);
}

// The short read that reaches end of file is resumed, and the resumed piece (0 bytes) fails.
TEST_P(AsyncFileTest, ReadPastEndOfFileRaisesIoErrorNamingFileAndRange) {
  constexpr std::uint64_t kSeed = 3;
  AlignedBuffer out(8 * kKiB), in(16 * kKiB);
  fill_pattern(out, out.size(), 0, kSeed);
  std::memset(in.data(), 0, in.size());
  AsyncFile file(path_, AsyncFile::Mode::read_write, options(64 * kKiB, 4));
  file.write(out.data(), out.size(), 0).wait();
  IoHandle read = file.read(in.data(), in.size(), 0);
  try {
    read.wait();
    FAIL() << "a read past the end of the file completed";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(path_), std::string::npos) << what;
    EXPECT_NE(what.find("past the end of the file"), std::string::npos) << what;
    EXPECT_NE(what.find("at offset 8192"), std::string::npos) << what;
  }
  EXPECT_TRUE(read.done());
  // The part that exists was read before the end was reached.
  EXPECT_EQ(pattern_mismatches(in.data(), out.size(), 0, kSeed), 0u);
  EXPECT_EQ(file_size(path_), out.size());
}

// Nothing is queued for a refused request: the file stays empty and the worker sees no piece.
TEST_P(AsyncFileTest, MisalignedArgumentsRefusedBeforeSubmission) {
  AlignedBuffer buffer(64 * kKiB);
  AsyncFile file(path_, AsyncFile::Mode::read_write, options(64 * kKiB, 4));
  auto expect_refused = [&](auto&& call, const char* word) {
    try {
      call();
      ADD_FAILURE() << "accepted a misaligned " << word;
    } catch (const InvalidArgument& e) {
      EXPECT_NE(std::string(e.what()).find(word), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(path_), std::string::npos) << e.what();
    }
  };
  expect_refused([&] { file.write(buffer.data() + 512, 4 * kKiB, 0); }, "buffer");
  expect_refused([&] { file.write(buffer.data(), 4 * kKiB, 100); }, "offset");
  expect_refused([&] { file.write(buffer.data(), 4 * kKiB + 512, 0); }, "length");
  expect_refused([&] { file.read(buffer.data() + 8, 4 * kKiB, 0); }, "buffer");
  EXPECT_EQ(file.stats().pieces, 0u);
  EXPECT_EQ(file_size(path_), 0u);
}

// Random lengths (4 KiB to 1 MiB) at random gaps, issued in shuffled order before the first
// wait, through 3 rings of depth 4: pieces of every request land on several rings.
TEST_P(AsyncFileTest, ThreeThreadsRoundTripRandomRegionsByteExactly) {
  constexpr std::uint64_t kSeed = 19;
  constexpr unsigned kThreads = 3;
  const std::size_t block = 64 * kKiB;
  struct Region {
    std::uint64_t offset;
    std::size_t length;
  };
  std::mt19937_64 rng(kSeed);
  std::vector<Region> regions;
  std::uint64_t end = 0;
  for (int i = 0; i < 40; ++i) {
    end += 4 * kKiB * (rng() % 17);  // a gap of 0 to 64 KiB
    const std::size_t length = 4 * kKiB * (1 + rng() % 256);
    regions.push_back({end, length});
    end += length;
  }
  std::vector<std::size_t> order(regions.size());
  std::iota(order.begin(), order.end(), 0);
  std::shuffle(order.begin(), order.end(), rng);

  std::vector<AlignedBuffer> out(regions.size()), in(regions.size());
  std::size_t expected_pieces = 0;
  {
    AsyncFile file(path_, AsyncFile::Mode::read_write, options(block, 4, kThreads));
    EXPECT_EQ(file.threads(), kThreads);
    std::vector<IoHandle> handles;
    for (std::size_t i : order) {
      out[i] = AlignedBuffer(regions[i].length);
      fill_pattern(out[i], regions[i].length, regions[i].offset, kSeed);
      handles.push_back(file.write(out[i].data(), regions[i].length, regions[i].offset));
      expected_pieces += (regions[i].length + block - 1) / block;
    }
    for (auto& h : handles) h.wait();
    handles.clear();
    for (std::size_t i : order) {
      in[i] = AlignedBuffer(regions[i].length);
      std::memset(in[i].data(), 0xA5, regions[i].length);
      handles.push_back(file.read(in[i].data(), regions[i].length, regions[i].offset));
    }
    for (auto& h : handles) h.wait();
    expected_pieces *= 2;
    const IoStats stats = file.stats();
    ASSERT_EQ(stats.pieces_per_thread.size(), kThreads);
    EXPECT_EQ(std::accumulate(stats.pieces_per_thread.begin(), stats.pieces_per_thread.end(), std::uint64_t{0}), stats.pieces);
    // Dealt in turn: each worker ran a third of the pieces, rounded down (resumed remainders add).
    for (unsigned t = 0; t < kThreads; ++t) EXPECT_GE(stats.pieces_per_thread[t], expected_pieces / kThreads) << "thread " << t;
    EXPECT_LE(stats.peak_in_flight, GetParam().use_io_uring ? 4 * kThreads : kThreads);
  }
  for (std::size_t i = 0; i < regions.size(); ++i) {
    EXPECT_EQ(pattern_mismatches(in[i].data(), regions[i].length, regions[i].offset, kSeed), 0u) << "region " << i;
    const auto on_disk = pread_all(path_, regions[i].length, regions[i].offset);
    EXPECT_EQ(pattern_mismatches(on_disk.data(), regions[i].length, regions[i].offset, kSeed), 0u) << "region " << i;
  }
  EXPECT_EQ(file_size(path_), regions.back().offset + regions.back().length);
}

// Whether this kernel gives a ring a sparse buffer table (Linux 5.19+), asked without zeroth.
bool kernel_has_buffer_table() {
  ::io_uring ring{};
  if (io_uring_queue_init(4, &ring, 0) != 0) return false;
  const bool ok = io_uring_register_buffers_sparse(&ring, 4) == 0;
  io_uring_queue_exit(&ring);
  return ok;
}

// Pieces inside the registered region go out as READ_FIXED/WRITE_FIXED, the ones of a buffer
// outside it as plain reads and writes; the bytes round-trip either way.
TEST_P(AsyncFileTest, RegisteredBufferPiecesRunFixedAndRoundTrip) {
  constexpr std::uint64_t kSeed = 23;
  const std::size_t block = 256 * kKiB;
  AlignedBuffer pool(4 * kMiB), plain(1 * kMiB);
  fill_pattern(pool, pool.size(), 0, kSeed);
  fill_pattern(plain, plain.size(), pool.size(), kSeed);
  AsyncFile file(path_, AsyncFile::Mode::read_write, options(block, 4, 2));
  const bool registered = file.register_buffer(pool.data(), pool.size());
  EXPECT_EQ(registered, file.io_uring() && kernel_has_buffer_table());
  // Two requests from the region (one starting mid-block), one from outside it.
  file.write(pool.data(), 3 * kMiB, 0).wait();
  file.write(pool.data() + 3 * kMiB, 1 * kMiB, 3 * kMiB).wait();
  file.write(plain.data(), plain.size(), pool.size()).wait();
  std::memset(pool.data(), 0, pool.size());
  std::memset(plain.data(), 0, plain.size());
  file.read(pool.data(), pool.size(), 0).wait();
  file.read(plain.data(), plain.size(), pool.size()).wait();
  EXPECT_EQ(pattern_mismatches(pool.data(), pool.size(), 0, kSeed), 0u);
  EXPECT_EQ(pattern_mismatches(plain.data(), plain.size(), pool.size(), kSeed), 0u);
  const IoStats stats = file.stats();
  const std::uint64_t pool_pieces = 2 * (3 * kMiB / block + 1 * kMiB / block), plain_pieces = 2 * (1 * kMiB / block);
  EXPECT_EQ(stats.pieces, pool_pieces + plain_pieces);
  EXPECT_EQ(stats.fixed_pieces, registered ? pool_pieces : 0u);
  if (registered) {
    EXPECT_THROW(file.register_buffer(pool.data() + 4 * kKiB, 8 * kKiB), InvalidArgument);  // inside the region
    EXPECT_THROW(file.register_buffer(pool.data() - 4 * kKiB, 8 * kKiB), InvalidArgument);  // straddles its start
    EXPECT_TRUE(file.register_buffer(plain.data(), plain.size()));
  }
}

INSTANTIATE_TEST_SUITE_P(Places, AsyncFileTest, ::testing::ValuesIn(places()), [](const auto& info) {
  return std::string(info.param.dir.rfind("/dev/shm", 0) == 0 ? "tmpfs" : "tempdir") +
         (info.param.use_io_uring ? "_io_uring" : "_worker");
});

class AsyncFileErrorTest : public ::testing::TestWithParam<bool> {};

// /dev/full accepts the open and fails every write with ENOSPC.
TEST_P(AsyncFileErrorTest, WriteToFullDeviceRaisesIoErrorWithStrerror) {
  ASSERT_TRUE(std::filesystem::exists("/dev/full")) << "the test needs /dev/full (every Linux has it)";
  AlignedBuffer buffer(12 * kKiB);
  std::memset(buffer.data(), 1, buffer.size());
  AsyncFile file("/dev/full", AsyncFile::Mode::read_write, IoOptions{4 * kKiB, 2, GetParam()});
  IoHandle write = file.write(buffer.data(), buffer.size(), 0);
  try {
    write.wait();
    FAIL() << "a write to /dev/full completed";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("/dev/full"), std::string::npos) << what;
    EXPECT_NE(what.find("No space left on device"), std::string::npos) << what;
    EXPECT_NE(what.find("write of 4096 bytes at offset"), std::string::npos) << what;
  }
  // The handle stays failed, and the file still serves later requests.
  EXPECT_THROW(write.wait(), IoError);
  EXPECT_THROW(file.write(buffer.data(), 4 * kKiB, 0).wait(), IoError);
}

// Character devices refuse O_DIRECT as tmpfs did before Linux 6.6: the buffered fallback must
// still move the bytes (every one zero here, the buffer starts as 0xA5).
TEST_P(AsyncFileErrorTest, DeviceWithoutDirectIoFallsBackToBufferedReads) {
  ASSERT_TRUE(std::filesystem::exists("/dev/zero")) << "the test needs /dev/zero (every Linux has it)";
  AlignedBuffer buffer(1 * kMiB + 8 * kKiB);
  std::memset(buffer.data(), 0xA5, buffer.size());
  AsyncFile file("/dev/zero", AsyncFile::Mode::read_only, IoOptions{64 * kKiB, 4, GetParam()});
  EXPECT_FALSE(file.direct());
  file.read(buffer.data(), buffer.size(), 12 * kKiB).wait();
  std::size_t nonzero = 0;
  for (std::size_t i = 0; i < buffer.size(); ++i) nonzero += buffer.data()[i] != std::byte{0};
  EXPECT_EQ(nonzero, 0u);
}

TEST_P(AsyncFileErrorTest, OpeningDirectoryForWritingRaisesIoError) {
  const std::string dir = ::testing::TempDir();
  try {
    AsyncFile file(dir, AsyncFile::Mode::read_write, IoOptions{4 * kKiB, 2, GetParam()});
    FAIL() << "opened a directory for writing";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find(dir), std::string::npos) << what;
    EXPECT_NE(what.find("Is a directory"), std::string::npos) << what;
  }
}

TEST_P(AsyncFileErrorTest, BadBlockSizeOrDepthIsInvalidArgument) {
  const std::string path = ::testing::TempDir() + "zeroth_aio_bad_options";
  EXPECT_THROW(AsyncFile(path, AsyncFile::Mode::read_write, IoOptions{1000, 2, GetParam()}), InvalidArgument);
  EXPECT_THROW(AsyncFile(path, AsyncFile::Mode::read_write, IoOptions{4 * kKiB, 0, GetParam()}), InvalidArgument);
  EXPECT_THROW(AsyncFile(path, AsyncFile::Mode::read_write, IoOptions{std::size_t{4} << 30, 2, GetParam()}), InvalidArgument);
  EXPECT_THROW(AsyncFile(path, AsyncFile::Mode::read_write, IoOptions{4 * kKiB, 2, GetParam(), 0}), InvalidArgument);
  EXPECT_THROW(AsyncFile(path, AsyncFile::Mode::read_write, IoOptions{4 * kKiB, 2, GetParam(), 65}), InvalidArgument);
}

INSTANTIATE_TEST_SUITE_P(Backends, AsyncFileErrorTest, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "io_uring" : "worker"); });

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
