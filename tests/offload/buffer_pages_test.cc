// The pages of zeroth's I/O buffers against the kernel's own account of them (/proc/self/smaps):
// huge-page alignment and advice for large buffers, and registered regions kept out of forked
// children while a file has them registered.
#include <unistd.h>  // getpid, unlink

#include <cstdint>     // std::uintptr_t
#include <cstdio>      // std::sscanf
#include <cstring>     // std::memset
#include <filesystem>  // std::filesystem::exists
#include <fstream>     // std::ifstream
#include <string>      // std::string

#include <fmt/format.h>   // fmt::format
#include <gtest/gtest.h>  // TEST, EXPECT_*

#include "core/error_types.h"        // InvalidArgument
#include "offload/aio.h"             // AsyncFile
#include "offload/aligned_buffer.h"  // AlignedBuffer, kIoAlignment, kHugePageBytes

namespace zeroth::offload {
namespace {

constexpr std::size_t kKiB = 1024, kMiB = 1024 * kKiB;

// The VmFlags of the mapping that holds `address` in /proc/self/smaps ("rd wr mr ... hg").
std::string vm_flags_at(const void* address) {
  std::ifstream smaps("/proc/self/smaps");
  const auto at = reinterpret_cast<std::uintptr_t>(address);
  bool inside = false;
  for (std::string line; std::getline(smaps, line);) {
    std::uintptr_t begin = 0, end = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx ", &begin, &end) == 2 && line.find(':') > line.find(' ')) inside = begin <= at && at < end;
    if (inside && line.rfind("VmFlags:", 0) == 0) return line;
  }
  return "";
}

// Registered pages are pinned for the device; a fork would copy them for the child at once and
// split the parent's huge-page mappings of them to do it (the `dc` flag keeps them out). The
// flag comes off with the last file that registered them: freed memory goes back to malloc.
TEST(AsyncFileRegisterTest, RegisteredPagesStayOutOfChildProcessesWhileRegistered) {
  const std::string path = fmt::format("{}zeroth_aio_dontfork_{}", ::testing::TempDir(), ::getpid());
  auto marked = [](const void* address) { return (vm_flags_at(address) + " ").find(" dc ") != std::string::npos; };
  AlignedBuffer pool(4 * kMiB), plain(4 * kMiB);
  {
    AsyncFile file(path, AsyncFile::Mode::read_write, IoOptions{256 * kKiB, 4, true});
    ASSERT_TRUE(file.io_uring()) << "io_uring is refused here (zeroth report says why); these cases need it";
    ASSERT_TRUE(file.register_buffer(pool.data(), pool.size())) << "needs a kernel with a sparse buffer table (Linux 5.19+)";
    EXPECT_TRUE(marked(pool.data())) << vm_flags_at(pool.data());
    EXPECT_TRUE(marked(pool.data() + pool.size() - 1));
    EXPECT_FALSE(marked(plain.data())) << vm_flags_at(plain.data());
    {
      AsyncFile second(path, AsyncFile::Mode::read_write, IoOptions{256 * kKiB, 4, true});
      ASSERT_TRUE(second.register_buffer(pool.data(), pool.size()));
    }
    EXPECT_TRUE(marked(pool.data())) << "the first file still has the pages registered";
  }
  EXPECT_FALSE(marked(pool.data())) << vm_flags_at(pool.data());
  ::unlink(path.c_str());
}

TEST(AlignedBufferTest, RoundsUpAndAligns) {
  AlignedBuffer buffer(5000);
  EXPECT_EQ(buffer.size(), 8192u);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(buffer.data()) % kIoAlignment, 0u);
  AlignedBuffer wide(1, 1 << 16);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(wide.data()) % (1 << 16), 0u);
  EXPECT_THROW(AlignedBuffer(4096, 3000), InvalidArgument);
}

// A buffer of 2 MiB or more starts on a 2 MiB boundary, keeps the size it was asked for, and
// its mapping carries the kernel's huge-page advice ("hg").
TEST(AlignedBufferTest, LargeBufferIsHugePageAlignedAndAdvised) {
  AlignedBuffer large(3 * kMiB + 12 * kKiB);
  EXPECT_EQ(large.size(), 3 * kMiB + 12 * kKiB);
  EXPECT_EQ(reinterpret_cast<std::uintptr_t>(large.data()) % kHugePageBytes, 0u);
  std::memset(large.data(), 1, large.size());
  ASSERT_TRUE(std::filesystem::exists("/sys/kernel/mm/transparent_hugepage/enabled")) << "this kernel has no transparent huge pages";
  const std::string flags = vm_flags_at(large.data());
  EXPECT_NE((flags + " ").find(" hg "), std::string::npos) << flags;
  AlignedBuffer small(1 * kMiB);
  EXPECT_EQ((vm_flags_at(small.data()) + " ").find(" hg "), std::string::npos) << vm_flags_at(small.data());
}

}  // namespace
}  // namespace zeroth::offload
