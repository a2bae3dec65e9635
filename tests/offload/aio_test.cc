// AsyncFile against pread/pwrite and a known byte pattern, on a disk file (O_DIRECT where the
// file system has it) and on tmpfs (buffered fallback), through io_uring and through the worker.
// How requests reach the ring is in aio_submission_test.cc.
#include <sys/stat.h>  // stat
#include <fcntl.h>     // open
#include <unistd.h>    // pread, unlink, close

#include <cstdint>     // std::uint64_t
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
#include "tests/offload/byte_pattern.h"

namespace zeroth::offload {
namespace {

using namespace byte_pattern;

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

}  // namespace
}  // namespace zeroth::offload
