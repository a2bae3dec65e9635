// Asynchronous reads and writes of byte ranges of one file: io_uring with O_DIRECT, split into
// blocks, a bounded number in flight per ring. The caller's thread puts a request's pieces on the
// rings; one worker thread per ring reaps the completions and refills the ring with pieces that
// waited for a slot (or, without io_uring, runs pread/pwrite). The kernel finishes a transfer in
// the thread that submitted it (io_uring's task work, run when that thread next enters the kernel
// or is woken for it: a caller asleep in wait() at once): a thread must not exit while its
// requests are in flight. On a buffered file (tmpfs) a read from the page cache is copied during
// the call itself.
#pragma once

#include <cstddef>  // std::byte, std::size_t
#include <cstdint>  // std::uint64_t
#include <memory>   // std::shared_ptr, std::unique_ptr
#include <mutex>    // std::mutex
#include <string>   // std::string
#include <vector>   // std::vector

#include "offload/io_fault.h"  // IoFault

namespace zeroth::offload {

struct IoOptions {
  // Each request is cut into pieces of at most this many bytes (a multiple of 4 KiB, at most 1 GiB).
  std::size_t block_size = std::size_t{1} << 20;
  // Pieces in flight on each ring at once; the rest wait in the worker's queue.
  unsigned queue_depth = 32;
  // false: the workers run the pieces with pread/pwrite, the path taken when the kernel refuses
  // io_uring (seccomp, old kernels). Exposed so that path can be exercised where io_uring works.
  bool use_io_uring = true;
  // Worker threads, each with its own ring (DeepSpeed's aio.intra_op_parallelism, formerly
  // thread_count). The pieces of every request are dealt to the rings in turn.
  unsigned threads = 1;
  // A kernel thread, shared by the file's rings, polls the submission queues
  // (IORING_SETUP_SQPOLL), so submitting costs no system call. A kernel that refuses it gets
  // rings without, said once in the log.
  bool sqpoll = false;
};

// What the workers have done so far; read after the requests of interest have been waited on.
struct IoStats {
  std::uint64_t pieces = 0;                      // pieces completed, resumed remainders included
  std::uint64_t submit_calls = 0;                // io_uring_submit calls (one per batch)
  unsigned peak_in_flight = 0;                   // most pieces on the rings (or in pread/pwrite) at once, all workers together
  std::uint64_t fixed_pieces = 0;                // pieces submitted as READ_FIXED/WRITE_FIXED (inside a registered buffer)
  std::vector<std::uint64_t> pieces_per_thread;  // `pieces`, by worker
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
  // Waits for every request still queued or in flight, then closes the rings and the file.
  ~AsyncFile();
  AsyncFile(const AsyncFile&) = delete;
  AsyncFile& operator=(const AsyncFile&) = delete;

  // Buffer address, offset and length must be multiples of 4 KiB (InvalidArgument otherwise,
  // raised before anything is queued). The buffer must stay alive and untouched until the
  // handle is done. A read that reaches the end of the file fails with IoError: the offload
  // tier only reads back what it wrote, so a short file means a lost or truncated swap file.
  IoHandle read(void* buffer, std::size_t length, std::uint64_t offset);
  IoHandle write(const void* buffer, std::size_t length, std::uint64_t offset);

  // Registers [data, data + bytes) with every ring (io_uring_register_buffers), typically a
  // pinned host pool that outlives the file: pieces inside it then run as READ_FIXED /
  // WRITE_FIXED and the kernel does not map and pin their pages on every transfer. The region
  // stays registered until the file closes; it must not overlap one registered before
  // (InvalidArgument). Returns false, changing nothing, where there is no ring to register with
  // (pread/pwrite workers, a kernel before 5.19). IoError when the kernel refuses to pin the
  // pages (the locked-memory limit).
  bool register_buffer(void* data, std::size_t bytes);

  const std::string& path() const { return path_; }
  bool direct() const { return direct_; }  // opened with O_DIRECT
  bool io_uring() const;                   // false: pread/pwrite on the workers
  bool sqpoll() const;                     // the rings are polled by a kernel thread
  bool fixed_file() const;                 // the file is registered with the rings
  unsigned threads() const { return options_.threads; }
  IoStats stats() const;
  // Bytes the file system has allocated to the file (fstat's st_blocks x 512): the disk it takes,
  // as the kernel counts it. IoError when fstat fails.
  std::uint64_t allocated_bytes() const;

 private:
  struct Piece;
  struct Worker;
  struct Region {
    std::byte* begin;
    std::size_t bytes;
    unsigned first_slot;  // slots of IoRing::kMaxBufferBytes each, from here on
  };
  IoHandle enqueue(bool is_write, void* buffer, std::size_t length, std::uint64_t offset);
  // Lets the workers finish what is queued, joins them, closes the rings and the file.
  void stop_workers();
  // The registered slot [buffer, buffer + length) lies in, -1 for none; called under mutex_.
  int buffer_slot(const std::byte* buffer, std::size_t length) const;
  void run_ring(Worker& worker);
  void run_sync(Worker& worker);
  // Puts the worker's queued pieces on free slots of its ring and submits what is prepared;
  // called with worker.mutex held, from the worker or from a caller's enqueue. Returns 0, or the
  // negative errno of a submission that failed for good.
  int submit_queued(Worker& worker);
  // The ring failed for good: its pieces, queued and on the ring, fail with `message`, and so
  // does every piece dealt to it later.
  void fail_worker(Worker& worker, const std::string& message);
  // Applies a piece's result (bytes moved or -errno); returns true when the piece must run again.
  bool complete(Piece& piece, long long result);
  void finish(Piece& piece);

  std::string path_;
  IoOptions options_;
  std::unique_ptr<IoFault> fault_;  // ZEROTH_IO_FAULT's, when it names this file
  int fd_ = -1;
  bool direct_ = false;

  std::vector<std::unique_ptr<Worker>> workers_;  // each with its own lock; a worker's lock comes before mutex_
  mutable std::mutex mutex_;                      // guards everything below and each worker's piece count
  std::size_t next_worker_ = 0;                   // the worker that gets the next piece
  unsigned in_flight_ = 0;                        // pieces on the rings or in pread/pwrite, all workers together
  std::vector<Region> regions_;
  unsigned next_slot_ = 0;
  IoStats stats_;
};

}  // namespace zeroth::offload
