// One io_uring instance bound to one open file: its setup (with a kernel polling thread when
// asked and allowed), the file registered as fixed file 0, a table of registered buffers, and
// the read/write entries that use them. AsyncFile's callers and its worker fill the submission
// queue under the worker's lock; the worker alone reaps the completion queue. So the ring takes
// none of the single-submitter flags (SINGLE_ISSUER, DEFER_TASKRUN, COOP_TASKRUN): the kernel posts
// each completion as task work of the thread that submitted it, and must be free to interrupt it.
#pragma once

#include <liburing.h>  // io_uring, io_uring_sqe

#include <cstddef>  // std::size_t
#include <cstdint>  // std::uint64_t
#include <memory>   // std::unique_ptr
#include <string>   // std::string

namespace zeroth::offload {

class IoRing {
 public:
  // The kernel registers at most 1 GiB per buffer; larger regions take several table slots.
  static constexpr std::size_t kMaxBufferBytes = std::size_t{1} << 30;
  static constexpr unsigned kBufferSlots = 1024;

  // nullptr when the kernel refuses io_uring itself (ENOSYS, EPERM: seccomp, io_uring_disabled);
  // IoError for any other failure. With `sqpoll`, a kernel thread consumes the submission queue;
  // `share` is a ring whose polling thread this one joins (nullptr: its own). A kernel that
  // refuses SQPOLL gets a ring without it, said once in the log.
  static std::unique_ptr<IoRing> open(int fd, const std::string& path, unsigned entries, bool sqpoll, const IoRing* share);
  ~IoRing();
  IoRing(const IoRing&) = delete;
  IoRing& operator=(const IoRing&) = delete;

  ::io_uring* get() { return &ring_; }
  bool sqpoll() const { return (ring_.flags & IORING_SETUP_SQPOLL) != 0; }
  bool fixed_file() const { return fixed_file_; }
  // A sparse buffer table exists (Linux 5.19+), so register_buffer() can fill its slots.
  bool buffer_table() const { return buffer_table_; }

  // Fills table slot `slot` with [data, data + bytes), bytes <= kMaxBufferBytes. The kernel pins
  // the pages; IoError when it refuses (the locked-memory limit, usually). The kernel orders this
  // against submissions, so another thread than the ring's worker may call it.
  void register_buffer(unsigned slot, void* data, std::size_t bytes);

  // A read or write of the file; `buffer_slot` >= 0 names the registered slot the whole
  // transfer lies in (READ_FIXED / WRITE_FIXED), -1 none.
  void prepare(io_uring_sqe* sqe, bool is_write, void* buffer, unsigned length, std::uint64_t offset, int buffer_slot) const;

 private:
  IoRing() = default;
  ::io_uring ring_{};
  bool initialised_ = false;
  int fd_ = -1;
  bool fixed_file_ = false;
  bool buffer_table_ = false;
  std::string path_;
};

}  // namespace zeroth::offload
