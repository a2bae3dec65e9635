// Tagged accounting: exact in-use and peak per tag, a budget whose overrun names everything
// needed to act on it, and byte sizes parsed and printed.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/cpu/cpu_device.h"
#include "core/device.h"
#include "core/error.h"
#include "core/memory.h"

namespace zeroth {
namespace {

TEST(Memory, AccountingIsExactPerTagAndReturnsToZero) {
  auto device = make_device("cpu");
  {
    Buffer p = device->allocate(1000, MemTag::params);
    Buffer g = device->allocate(333, MemTag::grads);
    Buffer o1 = device->allocate(4096, MemTag::optimizer);
    {
      Buffer o2 = device->allocate(5000, MemTag::optimizer);
      const auto s = device->memory().stats();
      EXPECT_EQ(s.in_use[static_cast<size_t>(MemTag::optimizer)], 9096u);
      EXPECT_EQ(s.total_in_use, 1000u + 333 + 4096 + 5000);
    }
    Buffer a = device->allocate(7, MemTag::activations);
    const auto s = device->memory().stats();
    EXPECT_EQ(s.in_use[static_cast<size_t>(MemTag::params)], 1000u);
    EXPECT_EQ(s.in_use[static_cast<size_t>(MemTag::grads)], 333u);
    EXPECT_EQ(s.in_use[static_cast<size_t>(MemTag::optimizer)], 4096u);
    EXPECT_EQ(s.in_use[static_cast<size_t>(MemTag::activations)], 7u);
    EXPECT_EQ(s.peak[static_cast<size_t>(MemTag::optimizer)], 9096u);
    EXPECT_EQ(s.total_peak, 1000u + 333 + 4096 + 5000);  // the peak of the sum, exactly
  }
  const auto s = device->memory().stats();
  EXPECT_EQ(s.total_in_use, 0u);
  for (size_t t = 0; t < kMemTagCount; ++t) EXPECT_EQ(s.in_use[t], 0u) << mem_tag_name(static_cast<MemTag>(t));
  device->memory().reset_peak();
  EXPECT_EQ(device->memory().stats().total_peak, 0u);
}

TEST(Memory, OverrunThrowsOutOfMemoryNamingTagRequestUseBudgetAndPeak) {
  auto device = make_device("cpu", {.memory_budget = 10 << 20});
  Buffer held = device->allocate(6 << 20, MemTag::params);
  { Buffer transient = device->allocate(3 << 20, MemTag::activations); }
  try {
    Buffer too_much = device->allocate(5 << 20, MemTag::optimizer);
    FAIL() << "allocation past the budget succeeded";
  } catch (const OutOfMemory& e) {
    const std::string msg = e.what();
    for (const char* needle : {"cpu out of memory", "requested 5.00 MiB", "'optimizer'", "in use 6.00 MiB", "budget 10.00 MiB",
                               "peak 9.00 MiB", "params 6.00 MiB"}) {
      EXPECT_NE(msg.find(needle), std::string::npos) << "missing '" << needle << "' in: " << msg;
    }
  }
  // the failed request left no trace
  EXPECT_EQ(device->memory().stats().total_in_use, size_t{6} << 20);
  Buffer fits = device->allocate(4 << 20, MemTag::optimizer);
  EXPECT_EQ(device->memory().stats().total_in_use, size_t{10} << 20);
}

TEST(Memory, FreedBlocksAreReusedWithoutNewReservations) {
  CpuDevice device;
  for (int i = 0; i < 5; ++i) {
    Buffer a = device.allocate(8 << 20, MemTag::buffers);
    Buffer b = device.allocate(100, MemTag::buffers);
  }
  const size_t reserved = device.reserved_bytes();
  for (int i = 0; i < 5; ++i) Buffer a = device.allocate(8 << 20, MemTag::buffers);
  EXPECT_EQ(device.reserved_bytes(), reserved);
  device.release_cached_memory();
  EXPECT_EQ(device.reserved_bytes(), 0u);
}

TEST(Memory, BuffersMoveAndReleaseOnce) {
  auto device = make_device("cpu");
  Buffer a = device->allocate(100, MemTag::grads);
  Buffer b = std::move(a);
  EXPECT_FALSE(a);
  EXPECT_TRUE(b);
  std::vector<Buffer> many;
  for (int i = 0; i < 10; ++i) many.push_back(device->allocate(10, MemTag::grads));
  EXPECT_EQ(device->memory().stats().total_in_use, 200u);
  many.clear();
  b.reset();
  EXPECT_EQ(device->memory().stats().total_in_use, 0u);
}

TEST(Memory, ByteSizesParseAndFormat) {
  EXPECT_EQ(parse_bytes("4096"), 4096u);
  EXPECT_EQ(parse_bytes("2GiB"), size_t{2} << 30);
  EXPECT_EQ(parse_bytes("512 MiB"), size_t{512} << 20);
  EXPECT_EQ(parse_bytes("1.5GB"), 1'500'000'000u);
  EXPECT_EQ(parse_bytes("3k"), 3072u);
  EXPECT_EQ(format_bytes(512), "512 B");
  EXPECT_EQ(format_bytes(size_t{3} << 29), "1.50 GiB");
  for (const char* bad : {"", "GiB", "12 parsecs", "-1", "1e999GB"}) {
    EXPECT_THROW(parse_bytes(bad), InvalidArgument) << bad;
  }
}

}  // namespace
}  // namespace zeroth
