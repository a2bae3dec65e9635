// A swap file: one file per rank and kind of state, sized and preallocated when it is made (so a
// full disk shows at start, not at step 9000), unlinked right away (so it never outlives the
// process, crash or not), read and written through AsyncFile.
#pragma once

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string

#include "offload/aio.h"  // AsyncFile, IoOptions, IoHandle

namespace zeroth::offload {

class SwapFile {
 public:
  // Creates `<folder>/<name>` with `bytes` (rounded up to 4 KiB) allocated on disk. IoError naming
  // the folder, the bytes asked and the bytes free when the disk cannot hold it; a missing or
  // unwritable folder is an IoError too.
  SwapFile(const std::string& folder, const std::string& name, std::size_t bytes, const IoOptions& options);

  IoHandle read(void* buffer, std::size_t length, std::uint64_t offset) { return file_->read(buffer, length, offset); }
  IoHandle write(const void* buffer, std::size_t length, std::uint64_t offset) { return file_->write(buffer, length, offset); }
  std::size_t bytes() const { return bytes_; }
  const AsyncFile& file() const { return *file_; }
  AsyncFile& file() { return *file_; }  // to register the buffers it moves data through

 private:
  std::size_t bytes_;
  std::unique_ptr<AsyncFile> file_;
};

// Bytes free for an unprivileged writer on the file system holding `folder` (statvfs); IoError
// when it cannot be read.
std::uint64_t free_bytes(const std::string& folder);

}  // namespace zeroth::offload
