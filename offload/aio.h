// Asynchronous reads and writes of byte ranges of one file: io_uring with O_DIRECT, split into
// blocks, a bounded number in flight, one worker thread that owns the ring.
#pragma once

#include <condition_variable>  // std::condition_variable
#include <cstddef>             // std::size_t
#include <cstdint>             // std::uint64_t
#include <deque>               // std::deque
#include <memory>              // std::shared_ptr
#include <mutex>               // std::mutex
#include <string>              // std::string
#include <thread>              // std::thread

namespace zeroth::offload {

struct IoOptions {
  // Each request is cut into pieces of at most this many bytes (a multiple of 4 KiB, at most 1 GiB).
  std::size_t block_size = std::size_t{1} << 20;
  // Pieces in flight on the ring at once; the rest wait in the worker's queue.
  unsigned queue_depth = 32;
  // false: the worker runs the pieces with pread/pwrite, the path taken when the kernel refuses
  // io_uring (seccomp, old kernels). Exposed so that path can be exercised where io_uring works.
  bool use_io_uring = true;
};

// What the worker has done so far; read after the requests of interest have been waited on.
struct IoStats {
  std::uint64_t pieces = 0;        // pieces completed, resumed remainders included
  std::uint64_t submit_calls = 0;  // io_uring_submit calls (one per batch)
  unsigned peak_in_flight = 0;     // most pieces on the ring at once
};

namespace detail {
struct Request;
}

// Completion handle of one read or write. wait() blocks until every piece has completed and
// raises the request's IoError if one failed; done() polls.
class IoHandle {
 public:
  IoHandle() = default;
  void wait() const;
  bool done() const;

 private:
  friend class AsyncFile;
  explicit IoHandle(std::shared_ptr<detail::Request> request) : request_(std::move(request)) {}
  std::shared_ptr<detail::Request> request_;
};

class AsyncFile {
 public:
  enum class Mode { read_only, read_write };  // read_write creates the file when missing

  // Opens with O_DIRECT; where the file system refuses it (tmpfs) falls back to buffered I/O.
  AsyncFile(std::string path, Mode mode, IoOptions options = {});
  // Waits for every request still queued or in flight, then closes the ring and the file.
  ~AsyncFile();
  AsyncFile(const AsyncFile&) = delete;
  AsyncFile& operator=(const AsyncFile&) = delete;

  // Buffer address, offset and length must be multiples of 4 KiB (InvalidArgument otherwise,
  // raised before anything is queued). The buffer must stay alive and untouched until the
  // handle is done. A read that reaches the end of the file fails with IoError: the offload
  // tier only reads back what it wrote, so a short file means a lost or truncated swap file.
  IoHandle read(void* buffer, std::size_t length, std::uint64_t offset);
  IoHandle write(const void* buffer, std::size_t length, std::uint64_t offset);

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }             // opened with O_DIRECT
  bool io_uring() const { return ring_ != nullptr; }  // false: pread/pwrite on the worker
  IoStats stats() const;

 private:
  struct Piece;
  struct Ring;
  IoHandle enqueue(bool is_write, void* buffer, std::size_t length, std::uint64_t offset);
  void run();
  void run_ring();
  void run_sync();
  // Applies a piece's result (bytes moved or -errno); returns true when the piece must run again.
  bool complete(Piece& piece, long long result);
  void finish(Piece& piece);

  std::string path_;
  IoOptions options_;
  int fd_ = -1;
  bool direct_ = false;
  std::unique_ptr<Ring> ring_;

  mutable std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Piece> queue_;  // pieces not yet handed to the worker
  bool stopping_ = false;
  IoStats stats_;
  std::thread worker_;
};

}  // namespace zeroth::offload
