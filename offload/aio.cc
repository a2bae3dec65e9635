#include "offload/aio.h"

#include <fcntl.h>     // open, O_DIRECT
#include <liburing.h>  // io_uring_*
#include <unistd.h>    // close, pread, pwrite

#include <algorithm>  // std::max, std::min
#include <cerrno>     // EINVAL, EINTR, EAGAIN
#include <optional>   // std::optional
#include <utility>    // std::pair
#include <vector>     // std::vector

#include "core/error.h"              // ZEROTH_CHECK, ZEROTH_THROW
#include "core/log.h"                // ZLOG_WARN
#include "offload/aligned_buffer.h"  // kIoAlignment

namespace zeroth::offload {

namespace detail {
struct Request {
  std::mutex mutex;
  std::condition_variable finished;
  std::size_t outstanding = 0;  // pieces not yet completed
  std::string error;            // the first failure, empty when none
};
}  // namespace detail

struct AsyncFile::Piece {
  std::shared_ptr<detail::Request> request;
  bool is_write = false;
  std::byte* buffer = nullptr;
  std::uint64_t offset = 0;
  std::size_t length = 0;
};

struct AsyncFile::Ring {
  ::io_uring ring{};
  bool initialised = false;
  ~Ring() {
    if (initialised) io_uring_queue_exit(&ring);
  }
};

void IoHandle::wait() const {
  if (request_ == nullptr) return;
  std::unique_lock lock(request_->mutex);
  request_->finished.wait(lock, [&] { return request_->outstanding == 0; });
  if (!request_->error.empty()) throw IoError(request_->error);
}

bool IoHandle::done() const {
  if (request_ == nullptr) return true;
  std::lock_guard lock(request_->mutex);
  return request_->outstanding == 0;
}

namespace {

std::once_flag buffered_warning, sync_warning;
constexpr std::size_t kMaxBlockSize = std::size_t{1} << 30;

bool failed(detail::Request& request) {
  std::lock_guard lock(request.mutex);
  return !request.error.empty();
}

void fail(detail::Request& request, std::string message) {
  std::lock_guard lock(request.mutex);
  if (request.error.empty()) request.error = std::move(message);
}

}  // namespace

AsyncFile::AsyncFile(std::string path, Mode mode, IoOptions options) : path_(std::move(path)), options_(options) {
  // A piece's length travels in the 32-bit length field of a submission entry.
  ZEROTH_CHECK(options_.block_size >= kIoAlignment && options_.block_size % kIoAlignment == 0 && options_.block_size <= kMaxBlockSize,
               "AsyncFile {}: block_size {} must be a multiple of {} in [{}, {}]", path_, options_.block_size, kIoAlignment,
               kIoAlignment, kMaxBlockSize);
  ZEROTH_CHECK(options_.queue_depth >= 1 && options_.queue_depth <= 4096, "AsyncFile {}: queue_depth {} must be in [1, 4096]", path_,
               options_.queue_depth);
  const int flags = (mode == Mode::read_write ? O_RDWR | O_CREAT : O_RDONLY) | O_CLOEXEC;
  const char* flag_text = mode == Mode::read_write ? "O_RDWR|O_CREAT|O_CLOEXEC" : "O_RDONLY|O_CLOEXEC";
  fd_ = ::open(path_.c_str(), flags | O_DIRECT, 0644);
  direct_ = true;
  if (fd_ == -1 && errno == EINVAL) {
    direct_ = false;
    // tmpfs and some FUSE file systems have no direct I/O; the page cache is the only way in.
    fd_ = ::open(path_.c_str(), flags, 0644);
    if (fd_ != -1)
      std::call_once(buffered_warning,
                     [&] { ZLOG_WARN("{}: the file system refuses O_DIRECT; offload files there use buffered I/O", path_); });
  }
  if (fd_ == -1)
    ZEROTH_THROW(IoError, "open(\"{}\", {}{}) failed: {}", path_, flag_text, direct_ ? "|O_DIRECT" : "",
                 zeroth::detail::errno_text(errno));

  if (options_.use_io_uring) {
    ring_ = std::make_unique<Ring>();
    const int rc = io_uring_queue_init(options_.queue_depth, &ring_->ring, 0);
    if (rc == -ENOSYS || rc == -EPERM) {
      // Containers often block io_uring with seccomp; one worker doing pread/pwrite still overlaps
      // the transfers with compute, only without queue depth.
      ring_.reset();
      std::call_once(sync_warning, [&] {
        ZLOG_WARN("io_uring_queue_init({}) refused: {}; file offload runs pread/pwrite on a worker thread", options_.queue_depth,
                  zeroth::detail::errno_text(-rc));
      });
    } else if (rc < 0) {
      ::close(fd_);
      ZEROTH_THROW(IoError, "io_uring_queue_init({}, ring, 0) for {} failed: {}", options_.queue_depth, path_,
                   zeroth::detail::errno_text(-rc));
    } else {
      ring_->initialised = true;
    }
  }
  worker_ = std::thread([this] { run(); });
}

AsyncFile::~AsyncFile() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  worker_.join();
  ring_.reset();
  ::close(fd_);
}

IoHandle AsyncFile::read(void* buffer, std::size_t length, std::uint64_t offset) { return enqueue(false, buffer, length, offset); }

IoHandle AsyncFile::write(const void* buffer, std::size_t length, std::uint64_t offset) {
  return enqueue(true, const_cast<void*>(buffer), length, offset);
}

IoStats AsyncFile::stats() const {
  std::lock_guard lock(mutex_);
  return stats_;
}

IoHandle AsyncFile::enqueue(bool is_write, void* buffer, std::size_t length, std::uint64_t offset) {
  // Checked on every path, buffered ones included, so code that works on tmpfs works on NVMe.
  const char* op = is_write ? "write" : "read";
  ZEROTH_CHECK(reinterpret_cast<std::uintptr_t>(buffer) % kIoAlignment == 0,
               "{} of {}: buffer {} is not {}-byte aligned (use AlignedBuffer)", op, path_, buffer, kIoAlignment);
  ZEROTH_CHECK(offset % kIoAlignment == 0, "{} of {}: offset {} is not a multiple of {}", op, path_, offset, kIoAlignment);
  ZEROTH_CHECK(length % kIoAlignment == 0, "{} of {}: length {} is not a multiple of {}", op, path_, length, kIoAlignment);

  auto request = std::make_shared<detail::Request>();
  request->outstanding = (length + options_.block_size - 1) / options_.block_size;
  if (request->outstanding == 0) return IoHandle(std::move(request));
  {
    std::lock_guard lock(mutex_);
    for (std::size_t done = 0; done < length; done += options_.block_size)
      queue_.push_back(Piece{request, is_write, static_cast<std::byte*>(buffer) + done, offset + done,
                             std::min(options_.block_size, length - done)});
  }
  wake_.notify_one();
  return IoHandle(std::move(request));
}

void AsyncFile::finish(Piece& piece) {
  std::lock_guard lock(piece.request->mutex);
  if (--piece.request->outstanding == 0) piece.request->finished.notify_all();
}

bool AsyncFile::complete(Piece& piece, long long result) {
  if (result == -EINTR || result == -EAGAIN) return true;
  const char* op = piece.is_write ? "write" : "read";
  if (result < 0) {
    fail(*piece.request, fmt::format("{} of {} bytes at offset {} of {} failed: {}", op, piece.length, piece.offset, path_,
                                     zeroth::detail::errno_text(static_cast<int>(-result))));
  } else if (result == 0) {
    fail(*piece.request,
         piece.is_write
             ? fmt::format("write of {} bytes at offset {} of {} wrote nothing", piece.length, piece.offset, path_)
             : fmt::format("read of {} bytes at offset {} of {} is past the end of the file", piece.length, piece.offset, path_));
  } else if (static_cast<std::size_t>(result) < piece.length) {
    // Short transfer (signal, end of a buffered file, device limits): carry on from where it stopped.
    piece.buffer += result;
    piece.offset += static_cast<std::uint64_t>(result);
    piece.length -= static_cast<std::size_t>(result);
    return true;
  }
  finish(piece);
  return false;
}

void AsyncFile::run() {
  if (ring_ != nullptr) run_ring();
  else run_sync();
}

void AsyncFile::run_sync() {
  for (;;) {
    Piece piece;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      piece = std::move(queue_.front());
      queue_.pop_front();
      stats_.peak_in_flight = 1;
    }
    if (failed(*piece.request)) {
      finish(piece);
      continue;
    }
    bool again = true;
    while (again) {
      const ssize_t rc = piece.is_write ? ::pwrite(fd_, piece.buffer, piece.length, static_cast<off_t>(piece.offset))
                                        : ::pread(fd_, piece.buffer, piece.length, static_cast<off_t>(piece.offset));
      const long long result = rc == -1 ? -static_cast<long long>(errno) : rc;
      {
        // Counted before complete() wakes the waiter, so stats() after wait() includes it.
        std::lock_guard lock(mutex_);
        ++stats_.pieces;
      }
      again = complete(piece, result);
    }
  }
}

void AsyncFile::run_ring() {
  ::io_uring* ring = &ring_->ring;
  const unsigned depth = options_.queue_depth;
  std::vector<std::optional<Piece>> slots(depth);  // user_data is the slot index
  std::vector<unsigned> free_slots;
  for (unsigned s = depth; s-- > 0;) free_slots.push_back(s);
  std::deque<Piece> local;  // taken from queue_, waiting for a free slot
  unsigned in_flight = 0;
  std::vector<std::pair<unsigned, int>> completions;  // (slot, result) of one reaping round

  // A broken ring (submission or wait failing for good) fails every request it still holds.
  auto fail_all = [&](const std::string& message) {
    for (auto& slot : slots)
      if (slot) {
        fail(*slot->request, message);
        finish(*slot);
        slot.reset();
      }
    std::unique_lock lock(mutex_);
    for (;;) {
      while (!queue_.empty()) {
        local.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      lock.unlock();
      for (auto& piece : local) {
        fail(*piece.request, message);
        finish(piece);
      }
      local.clear();
      lock.lock();
      wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;
    }
  };

  for (;;) {
    {
      std::unique_lock lock(mutex_);
      if (in_flight == 0 && local.empty()) wake_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      while (!queue_.empty()) {
        local.push_back(std::move(queue_.front()));
        queue_.pop_front();
      }
      if (in_flight == 0 && local.empty()) return;  // stopping with nothing left
    }
    while (!local.empty() && !free_slots.empty()) {
      Piece piece = std::move(local.front());
      local.pop_front();
      if (failed(*piece.request)) {
        finish(piece);
        continue;
      }
      io_uring_sqe* sqe = io_uring_get_sqe(ring);
      if (sqe == nullptr) {  // cannot happen with depth slots on a ring of depth entries
        local.push_front(std::move(piece));
        break;
      }
      const unsigned slot = free_slots.back();
      free_slots.pop_back();
      if (piece.is_write) io_uring_prep_write(sqe, fd_, piece.buffer, static_cast<unsigned>(piece.length), piece.offset);
      else io_uring_prep_read(sqe, fd_, piece.buffer, static_cast<unsigned>(piece.length), piece.offset);
      io_uring_sqe_set_data64(sqe, slot);
      slots[slot] = std::move(piece);
      ++in_flight;
    }
    if (in_flight == 0) continue;
    {
      std::lock_guard lock(mutex_);
      stats_.peak_in_flight = std::max(stats_.peak_in_flight, in_flight);
    }

    // One call submits the whole batch and waits for the first completion.
    int rc;
    if (io_uring_sq_ready(ring) > 0) {
      rc = io_uring_submit_and_wait(ring, 1);
      std::lock_guard lock(mutex_);
      ++stats_.submit_calls;
    } else {
      io_uring_cqe* first = nullptr;
      rc = io_uring_wait_cqe(ring, &first);
    }
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
    if (rc < 0) {
      fail_all(fmt::format("io_uring_submit_and_wait(ring of {}, 1) failed: {}", path_, zeroth::detail::errno_text(-rc)));
      return;
    }

    // Collected first and counted before complete() wakes any waiter, so stats() after wait()
    // includes the pieces of that request.
    completions.clear();
    unsigned head;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(ring, head, cqe) { completions.emplace_back(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)), cqe->res); }
    io_uring_cq_advance(ring, static_cast<unsigned>(completions.size()));
    {
      std::lock_guard lock(mutex_);
      stats_.pieces += completions.size();
    }
    for (const auto& [slot, result] : completions) {
      Piece piece = std::move(*slots[slot]);
      slots[slot].reset();
      free_slots.push_back(slot);
      --in_flight;
      if (complete(piece, result)) local.push_front(std::move(piece));
    }
  }
}

}  // namespace zeroth::offload
