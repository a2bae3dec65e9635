// A failing disk on demand, for tests of what a run does when its I/O fails: ZEROTH_IO_FAULT
// names one transfer of one file to fail, and how. AsyncFile (offload/aio.h) applies it to the
// first piece that matches, so swap files and checkpoints see what a full disk, a bad sector or a
// short transfer would give them.
//   ZEROTH_IO_FAULT=OP:ERROR:OFFSET[:FILE]
//     OP      read | write
//     ERROR   EIO | ENOSPC (the piece fails with that errno) | short (only its first half,
//             rounded down to the I/O alignment, goes to the kernel: a short transfer, as a
//             device may make, which the rest must follow)
//     OFFSET  a byte offset: the first piece whose range holds it
//     FILE    a part of the file's path (default: any file)
#pragma once

#include <atomic>   // std::atomic
#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string

namespace zeroth::offload {

class IoFault {
 public:
  // The fault ZEROTH_IO_FAULT sets for the file at `path`; nullptr when unset or for another
  // file. ConfigError naming the variable when it cannot be read.
  static std::unique_ptr<IoFault> for_file(const std::string& path);
  explicit IoFault(std::string path) : path_(std::move(path)) {}

  // How many of a piece's `length` bytes at `offset` go to the kernel: half (rounded down to the
  // I/O alignment) for the first piece a short fault matches, said in the log; `length` otherwise.
  std::size_t transfer_length(bool is_write, std::uint64_t offset, std::size_t length);
  // The result a piece reports, given the kernel's `result`: an error fault's errno for the first
  // piece it matches, said in the log; `result` otherwise. Thread-safe, as is transfer_length.
  long long result(bool is_write, std::uint64_t offset, std::size_t length, long long result);

 private:
  bool matches(bool is_write, std::uint64_t offset, std::size_t length) const;

  bool is_write_ = false;
  int error_ = 0;  // errno to report; 0: a short transfer
  std::uint64_t offset_ = 0;
  std::atomic<bool> fired_{false};
  std::string path_;
};

}  // namespace zeroth::offload
