// A byte pattern whose every word is known from its file offset, and the file as plain pread sees
// it: what the asynchronous file tests check their bytes against.
#pragma once

#include <fcntl.h>     // open
#include <sys/stat.h>  // stat
#include <unistd.h>    // pread, close

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <gtest/gtest.h>  // EXPECT_*

#include "offload/aligned_buffer.h"  // AlignedBuffer

namespace zeroth::offload::byte_pattern {

inline constexpr std::size_t kKiB = 1024, kMiB = 1024 * kKiB;

// splitmix64 keyed by the absolute file offset of each 8-byte word, so any byte's expected
// value is known from its position alone.
inline std::uint64_t pattern_word(std::uint64_t file_offset, std::uint64_t seed) {
  std::uint64_t z = file_offset / 8 + seed * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

inline void fill_pattern(AlignedBuffer& buffer, std::size_t length, std::uint64_t file_offset, std::uint64_t seed) {
  auto* words = reinterpret_cast<std::uint64_t*>(buffer.data());
  for (std::size_t i = 0; i < length / 8; ++i) words[i] = pattern_word(file_offset + 8 * i, seed);
}

// Number of 8-byte words of `data` that differ from the pattern at `file_offset`.
inline std::size_t pattern_mismatches(const std::byte* data, std::size_t length, std::uint64_t file_offset, std::uint64_t seed) {
  const auto* words = reinterpret_cast<const std::uint64_t*>(data);
  std::size_t bad = 0;
  for (std::size_t i = 0; i < length / 8; ++i) bad += words[i] != pattern_word(file_offset + 8 * i, seed);
  return bad;
}

// The file's bytes as plain pread sees them: the reference the asynchronous path is checked against.
inline std::vector<std::byte> pread_all(const std::string& path, std::size_t length, std::uint64_t offset) {
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

inline std::uint64_t file_size(const std::string& path) {
  struct stat st {};
  EXPECT_EQ(::stat(path.c_str(), &st), 0) << path;
  return static_cast<std::uint64_t>(st.st_size);
}

}  // namespace zeroth::offload::byte_pattern
