// Swap files: create, preallocate, unlink, then hand to AsyncFile.
#include "offload/swap_file.h"

#include <fcntl.h>        // open, fallocate
#include <sys/statvfs.h>  // statvfs
#include <unistd.h>       // close, unlink

#include <cerrno>      // errno
#include <cstring>     // std::strerror
#include <filesystem>  // std::filesystem::create_directories

#include "core/error.h"              // ZEROTH_THROW
#include "core/memory.h"             // format_bytes
#include "offload/aligned_buffer.h"  // kIoAlignment

namespace zeroth::offload {

std::uint64_t free_bytes(const std::string& folder) {
  struct statvfs st {};
  if (statvfs(folder.c_str(), &st) != 0) {
    ZEROTH_THROW(IoError, "statvfs(\"{}\") failed: {}; offload_*.nvme_path must name an existing folder", folder,
                 std::strerror(errno));
  }
  return static_cast<std::uint64_t>(st.f_bavail) * st.f_frsize;
}

SwapFile::SwapFile(const std::string& folder, const std::string& name, std::size_t bytes, const IoOptions& options)
    : bytes_((bytes + kIoAlignment - 1) / kIoAlignment * kIoAlignment) {
  // DeepSpeed makes the swap folder when it is missing; so does zeroth.
  std::error_code made;
  std::filesystem::create_directories(folder, made);
  if (made)
    ZEROTH_THROW(IoError, "creating the swap folder \"{}\" failed: {}; offload_*.nvme_path must be a writable folder", folder,
                 made.message());
  const std::string path = folder + "/" + name;
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    ZEROTH_THROW(IoError, "open(\"{}\", O_RDWR|O_CREAT|O_TRUNC) failed: {}; offload_*.nvme_path must be a writable folder", path,
                 std::strerror(errno));
  }
  if (bytes_ > 0 && ::fallocate(fd, 0, 0, static_cast<off_t>(bytes_)) != 0) {
    const int err = errno;
    const std::uint64_t free = [&] {
      try {
        return free_bytes(folder);
      } catch (const Error&) {
        return std::uint64_t{0};
      }
    }();
    ::close(fd);
    ::unlink(path.c_str());
    ZEROTH_THROW(IoError, "fallocate(\"{}\", 0, {}) failed: {}; the swap file needs {} and the file system has {} free", path, bytes_,
                 std::strerror(err), format_bytes(bytes_), format_bytes(free));
  }
  ::close(fd);
  try {
    file_ = std::make_unique<AsyncFile>(path, AsyncFile::Mode::read_write, options);
  } catch (...) {
    ::unlink(path.c_str());
    throw;
  }
  // The open descriptor keeps the blocks; the name goes, so nothing is left behind after exit.
  if (::unlink(path.c_str()) != 0) ZEROTH_THROW(IoError, "unlink(\"{}\") failed: {}", path, std::strerror(errno));
}

}  // namespace zeroth::offload
