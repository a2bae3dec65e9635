#include "offload/aio.h"

#include <fcntl.h>     // open, O_DIRECT
#include <sys/mman.h>  // madvise, MADV_DONTFORK
#include <sys/stat.h>  // fstat
#include <liburing.h>  // io_uring_*
#include <unistd.h>    // close, pread, pwrite

#include <algorithm>           // std::max, std::min
#include <cerrno>              // EINVAL, EINTR, EAGAIN
#include <cstring>             // std::strerror
#include <condition_variable>  // std::condition_variable
#include <deque>               // std::deque
#include <map>                 // std::map
#include <optional>            // std::optional
#include <thread>              // std::thread
#include <utility>             // std::pair

#include "core/error.h"  // ZEROTH_CHECK, ZEROTH_THROW
#include "core/log.h"    // ZLOG_WARN
#include "offload/aio_parts.h"
#include "offload/aligned_buffer.h"  // kIoAlignment
#include "offload/io_ring.h"         // IoRing

namespace zeroth::offload {

using detail::fail;
using detail::failed;

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

std::once_flag buffered_warning, sync_warning, dontfork_warning;
constexpr std::size_t kMaxBlockSize = std::size_t{1} << 30;
constexpr unsigned kMaxThreads = 64;

// A fork while pages are pinned makes the kernel copy them for the child at once (the parent's
// pages must stay where the device writes them), and it splits the huge-page mappings of the
// parent's pinned memory to do so: buffers in 2 MiB pages became 4 KiB ones, and every transfer
// after that went out in more segments (bench offload, which starts fio between its points, read
// at half the rate after a few). zeroth's children only exec, so while a region is registered its
// whole pages are kept out of them (MADV_DONTFORK). The mark comes off when the last file that
// registered the region closes: freed memory goes back to malloc, and a child between fork and
// exec reads its arguments from the heap. (Counted by exact region: the engine registers its swap
// buffers with every swap file. Of two different regions that overlap, the first to close takes
// the mark off the overlap; its pages then split again on a fork, which costs speed, not data.)
struct ForkMarks {
  std::mutex mutex;
  std::map<std::pair<std::uintptr_t, std::uintptr_t>, int> count;  // [first, last) page range -> files
};
ForkMarks& fork_marks() {
  static ForkMarks marks;
  return marks;
}

std::pair<std::uintptr_t, std::uintptr_t> whole_pages(const std::byte* begin, std::size_t bytes) {
  const auto page = static_cast<std::uintptr_t>(kIoAlignment);
  return {(reinterpret_cast<std::uintptr_t>(begin) + page - 1) / page * page,
          (reinterpret_cast<std::uintptr_t>(begin) + bytes) / page * page};
}

void mark_for_children(std::pair<std::uintptr_t, std::uintptr_t> pages, int advice) {
  // Plain names, not a structured binding: the lambda below captures them (clang 14 refuses a
  // binding's capture).
  const std::uintptr_t first = pages.first, last = pages.second;
  if (::madvise(reinterpret_cast<void*>(first), last - first, advice) != 0) {
    std::call_once(dontfork_warning, [&] {
      ZLOG_WARN("madvise({:#x}, {}, {}) failed: {}; a child process started while buffers are registered may split their huge pages",
                first, last - first, advice == MADV_DONTFORK ? "MADV_DONTFORK" : "MADV_DOFORK", zeroth::detail::errno_text(errno));
    });
  }
}

void keep_from_children(const std::byte* begin, std::size_t bytes) {
  const auto pages = whole_pages(begin, bytes);
  if (pages.second <= pages.first) return;
  std::lock_guard lock(fork_marks().mutex);
  if (++fork_marks().count[pages] == 1) mark_for_children(pages, MADV_DONTFORK);
}

void return_to_children(const std::byte* begin, std::size_t bytes) {
  const auto pages = whole_pages(begin, bytes);
  std::lock_guard lock(fork_marks().mutex);
  const auto it = fork_marks().count.find(pages);
  if (it == fork_marks().count.end() || --it->second > 0) return;
  fork_marks().count.erase(it);
  mark_for_children(pages, MADV_DOFORK);
}

}  // namespace

AsyncFile::AsyncFile(std::string path, Mode mode, IoOptions options)
    : path_(std::move(path)), options_(options), fault_(IoFault::for_file(path_)) {
  // A piece's length travels in the 32-bit length field of a submission entry.
  ZEROTH_CHECK(options_.block_size >= kIoAlignment && options_.block_size % kIoAlignment == 0 && options_.block_size <= kMaxBlockSize,
               "AsyncFile {}: block_size {} must be a multiple of {} in [{}, {}]", path_, options_.block_size, kIoAlignment,
               kIoAlignment, kMaxBlockSize);
  ZEROTH_CHECK(options_.queue_depth >= 1 && options_.queue_depth <= 4096, "AsyncFile {}: queue_depth {} must be in [1, 4096]", path_,
               options_.queue_depth);
  ZEROTH_CHECK(options_.threads >= 1 && options_.threads <= kMaxThreads, "AsyncFile {}: threads {} must be in [1, {}]", path_,
               options_.threads, kMaxThreads);
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

  workers_.resize(options_.threads);
  for (auto& worker : workers_) worker = std::make_unique<Worker>();
  try {
    for (unsigned t = 0; t < options_.threads && options_.use_io_uring; ++t) {
      workers_[t]->ring = IoRing::open(fd_, path_, options_.queue_depth, options_.sqpoll, t > 0 ? workers_[0]->ring.get() : nullptr);
      if (workers_[t]->ring == nullptr) {
        // Containers often block io_uring with seccomp; workers doing pread/pwrite still overlap
        // the transfers with compute, only without queue depth.
        for (auto& worker : workers_) worker->ring.reset();
        std::call_once(sync_warning, [&] {
          ZLOG_WARN("io_uring_queue_init({}) refused; file offload runs pread/pwrite on {} worker thread(s)", options_.queue_depth,
                    options_.threads);
        });
        break;
      }
    }
  } catch (...) {
    workers_.clear();
    ::close(fd_);
    throw;
  }
  for (auto& worker : workers_) {
    if (worker->ring == nullptr) continue;
    worker->slots.resize(options_.queue_depth);
    for (unsigned slot = options_.queue_depth; slot-- > 0;) worker->free_slots.push_back(slot);
  }
  try {
    for (auto& worker : workers_) {
      Worker& w = *worker;
      w.thread = std::thread([this, &w] { w.ring != nullptr ? run_ring(w) : run_sync(w); });
    }
  } catch (...) {
    stop_workers();  // the ones that started (std::thread throws when the system has no more)
    throw;
  }
}

AsyncFile::~AsyncFile() {
  stop_workers();  // the rings closed: nothing of the regions is pinned for this file any more
  for (const auto& r : regions_) return_to_children(r.begin, r.bytes);
}

void AsyncFile::stop_workers() {
  for (auto& worker : workers_) {
    {
      std::lock_guard lock(worker->mutex);
      worker->stopping = true;
    }
    worker->wake.notify_one();
  }
  for (auto& worker : workers_)
    if (worker->thread.joinable()) worker->thread.join();
  workers_.clear();
  ::close(fd_);
}

IoHandle AsyncFile::read(void* buffer, std::size_t length, std::uint64_t offset) { return enqueue(false, buffer, length, offset); }

IoHandle AsyncFile::write(const void* buffer, std::size_t length, std::uint64_t offset) {
  return enqueue(true, const_cast<void*>(buffer), length, offset);
}

bool AsyncFile::io_uring() const { return workers_[0]->ring != nullptr; }
bool AsyncFile::sqpoll() const { return io_uring() && workers_[0]->ring->sqpoll(); }
bool AsyncFile::fixed_file() const { return io_uring() && workers_[0]->ring->fixed_file(); }

IoStats AsyncFile::stats() const {
  std::lock_guard lock(mutex_);
  IoStats stats = stats_;
  for (const auto& worker : workers_) stats.pieces_per_thread.push_back(worker->pieces);
  return stats;
}

std::uint64_t AsyncFile::allocated_bytes() const {
  struct stat st {};
  if (::fstat(fd_, &st) != 0) ZEROTH_THROW(IoError, "fstat({}) of {} failed: {}", fd_, path_, std::strerror(errno));
  return static_cast<std::uint64_t>(st.st_blocks) * 512;
}

bool AsyncFile::register_buffer(void* data, std::size_t bytes) {
  auto* begin = static_cast<std::byte*>(data);
  ZEROTH_CHECK(data != nullptr && bytes > 0, "register_buffer({}, {}) for {}: needs a non-empty region", data, bytes, path_);
  std::lock_guard lock(mutex_);
  for (const auto& r : regions_) {
    ZEROTH_CHECK(begin + bytes <= r.begin || r.begin + r.bytes <= begin,
                 "register_buffer({}, {}) for {}: overlaps the region of {} bytes at {} registered before", data, bytes, path_,
                 r.bytes, static_cast<void*>(r.begin));
  }
  if (!io_uring() || !workers_[0]->ring->buffer_table()) return false;
  const auto slots = static_cast<unsigned>((bytes + IoRing::kMaxBufferBytes - 1) / IoRing::kMaxBufferBytes);
  ZEROTH_CHECK(next_slot_ + slots <= IoRing::kBufferSlots,
               "register_buffer({}, {}) for {}: needs {} more buffer slots of 1 GiB, {} of {} are taken", data, bytes, path_, slots,
               next_slot_, IoRing::kBufferSlots);
  for (auto& worker : workers_)
    for (unsigned s = 0; s < slots; ++s) {
      const std::size_t done = s * IoRing::kMaxBufferBytes;
      worker->ring->register_buffer(next_slot_ + s, begin + done, std::min(IoRing::kMaxBufferBytes, bytes - done));
    }
  keep_from_children(begin, bytes);
  regions_.push_back({begin, bytes, next_slot_});
  next_slot_ += slots;
  return true;
}

int AsyncFile::buffer_slot(const std::byte* buffer, std::size_t length) const {
  for (const auto& r : regions_) {
    if (buffer < r.begin || buffer + length > r.begin + r.bytes) continue;
    const std::size_t first = static_cast<std::size_t>(buffer - r.begin) / IoRing::kMaxBufferBytes;
    const std::size_t last = static_cast<std::size_t>(buffer + length - 1 - r.begin) / IoRing::kMaxBufferBytes;
    // A piece across a 1 GiB slot boundary is in no single registered buffer: it runs unregistered.
    return first == last ? static_cast<int>(r.first_slot + first) : -1;
  }
  return -1;
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
  std::vector<std::vector<Piece>> dealt(workers_.size());
  {
    std::lock_guard lock(mutex_);
    for (std::size_t done = 0; done < length; done += options_.block_size) {
      auto* piece_buffer = static_cast<std::byte*>(buffer) + done;
      const std::size_t piece_length = std::min(options_.block_size, length - done);
      // Dealt in turn across requests too, so requests of one piece also spread over the rings.
      dealt[next_worker_].push_back(
          Piece{request, is_write, piece_buffer, offset + done, piece_length, buffer_slot(piece_buffer, piece_length)});
      next_worker_ = (next_worker_ + 1) % workers_.size();
    }
  }
  for (std::size_t w = 0; w < workers_.size(); ++w) {
    if (dealt[w].empty()) continue;
    Worker& worker = *workers_[w];
    std::vector<Piece> refused;
    {
      std::lock_guard lock(worker.mutex);
      if (!worker.broken.empty()) {
        for (auto& piece : dealt[w]) fail(*piece.request, worker.broken);
        refused = std::move(dealt[w]);
      } else {
        for (auto& piece : dealt[w]) worker.queue.push_back(std::move(piece));
        // The caller's thread puts the pieces on the ring itself: waiting for the worker to wake
        // and do it left the ring a piece short for as long as that took (a tenth of the read
        // rate when each request is one piece, as fio's are).
        if (worker.ring != nullptr) submit_queued(worker);
      }
    }
    for (auto& piece : refused) finish(piece);
    worker.wake.notify_one();
  }
  return IoHandle(std::move(request));
}

}  // namespace zeroth::offload
