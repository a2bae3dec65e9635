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
#include <string>      // std::string
#include <vector>      // std::vector

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
  IoOptions options(std::size_t block_size, unsigned queue_depth) const {
    return IoOptions{block_size, queue_depth, GetParam().use_io_uring};
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
}

INSTANTIATE_TEST_SUITE_P(Backends, AsyncFileErrorTest, ::testing::Bool(),
                         [](const auto& info) { return std::string(info.param ? "io_uring" : "worker"); });

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

TEST(AlignedBufferTest, RoundsUpAndAligns) {
  AlignedBuffer buffer(5000);
  EXPECT_EQ(buffer.size(), 8192u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % kIoAlignment, 0u);
  AlignedBuffer wide(1, 1 << 16);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(wide.data()) % (1 << 16), 0u);
  EXPECT_THROW(AlignedBuffer(4096, 3000), InvalidArgument);
}

}  // namespace
}  // namespace zeroth::offload
