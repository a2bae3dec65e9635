// AsyncFile's workers: each serves its queue through pread/pwrite or through its own io_uring ring,
// batching submissions and completing pieces into their requests.
#include <liburing.h>  // io_uring_*
#include <unistd.h>    // pread, pwrite

#include <algorithm>  // std::min
#include <cerrno>     // EINTR, EAGAIN
#include <cstring>    // std::strerror

#include "core/error.h"  // ZEROTH_THROW
#include "core/log.h"    // ZLOG_WARN
#include "offload/aio_parts.h"
#include "offload/io_ring.h"  // IoRing

namespace zeroth::offload {

using detail::fail;
using detail::failed;

void AsyncFile::finish(Piece& piece) {
  std::lock_guard lock(piece.request->mutex);
  if (--piece.request->outstanding == 0) piece.request->finished.notify_all();
}

bool AsyncFile::complete(Piece& piece, long long result) {
  if (fault_) result = fault_->result(piece.is_write, piece.offset, piece.length, result);
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

void AsyncFile::run_sync(Worker& worker) {
  for (;;) {
    Piece piece;
    {
      std::unique_lock lock(worker.mutex);
      worker.wake.wait(lock, [&] { return worker.stopping || !worker.queue.empty(); });
      if (worker.queue.empty()) return;  // stopping with nothing left
      piece = std::move(worker.queue.front());
      worker.queue.pop_front();
    }
    if (failed(*piece.request)) {
      finish(piece);
      continue;
    }
    bool again = true;
    while (again) {
      {
        std::lock_guard lock(mutex_);
        stats_.peak_in_flight = std::max(stats_.peak_in_flight, ++in_flight_);
      }
      const std::size_t length = fault_ ? fault_->transfer_length(piece.is_write, piece.offset, piece.length) : piece.length;
      const ssize_t rc = piece.is_write ? ::pwrite(fd_, piece.buffer, length, static_cast<off_t>(piece.offset))
                                        : ::pread(fd_, piece.buffer, length, static_cast<off_t>(piece.offset));
      const long long result = rc == -1 ? -static_cast<long long>(errno) : rc;
      {
        // Counted before complete() wakes the waiter, so stats() after wait() includes it.
        std::lock_guard lock(mutex_);
        ++stats_.pieces;
        ++worker.pieces;
        --in_flight_;
      }
      again = complete(piece, result);
    }
  }
}

int AsyncFile::submit_queued(Worker& worker) {
  ::io_uring* ring = worker.ring->get();
  unsigned prepared = 0, fixed = 0;
  while (!worker.queue.empty() && !worker.free_slots.empty()) {
    Piece piece = std::move(worker.queue.front());
    worker.queue.pop_front();
    if (failed(*piece.request)) {
      finish(piece);
      continue;
    }
    io_uring_sqe* sqe = io_uring_get_sqe(ring);
    if (sqe == nullptr) {  // cannot happen with depth slots on a ring of depth entries
      worker.queue.push_front(std::move(piece));
      break;
    }
    const unsigned slot = worker.free_slots.back();
    worker.free_slots.pop_back();
    const std::size_t length = fault_ ? fault_->transfer_length(piece.is_write, piece.offset, piece.length) : piece.length;
    worker.ring->prepare(sqe, piece.is_write, piece.buffer, static_cast<unsigned>(length), piece.offset, piece.buffer_slot);
    io_uring_sqe_set_data64(sqe, slot);
    fixed += piece.buffer_slot >= 0;
    worker.slots[slot] = std::move(piece);
    ++prepared;
  }
  if (prepared > 0) {
    worker.in_flight += prepared;
    worker.unsubmitted = true;
    std::lock_guard lock(mutex_);
    in_flight_ += prepared;
    stats_.peak_in_flight = std::max(stats_.peak_in_flight, in_flight_);
    stats_.fixed_pieces += fixed;
  }
  if (!worker.unsubmitted) return 0;
  const int rc = io_uring_submit(ring);
  {
    std::lock_guard lock(mutex_);
    ++stats_.submit_calls;
  }
  if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) return 0;  // the worker tries again
  if (rc < 0) return rc;
  // The kernel stops at an entry it cannot take; the rest go with a later call. (A polling
  // thread takes them in its own time.)
  worker.unsubmitted = !worker.ring->sqpoll() && io_uring_sq_ready(ring) > 0;
  return 0;
}

void AsyncFile::fail_worker(Worker& worker, const std::string& message) {
  std::vector<Piece> failed_pieces;
  {
    std::lock_guard lock(worker.mutex);
    worker.broken = message;
    for (auto& slot : worker.slots)
      if (slot) {
        failed_pieces.push_back(std::move(*slot));
        slot.reset();
      }
    for (auto& piece : worker.queue) failed_pieces.push_back(std::move(piece));
    worker.queue.clear();
    std::lock_guard stats_lock(mutex_);
    in_flight_ -= worker.in_flight;
    worker.in_flight = 0;
  }
  for (auto& piece : failed_pieces) {
    fail(*piece.request, message);
    finish(piece);
  }
}

// Long: one worker's loop (submit under the lock, wait for `want` completions, reap, requeue the retries); each step's count
// comes from the step before it, which one loop keeps in view.
void AsyncFile::run_ring(Worker& worker) {
  IoRing& io_ring = *worker.ring;
  ::io_uring* ring = io_ring.get();
  const unsigned depth = options_.queue_depth;
  // While pieces wait for a slot, the ring is refilled once this many of its slots are free, so
  // one submission carries a batch while three quarters of the ring keep the device busy.
  // (Refilling on every completion costs a system call per piece; waiting for half the ring to
  // drain halves the depth the device sees at small depths.)
  const unsigned batch = std::max(1u, depth / 4);
  std::vector<std::pair<unsigned, int>> completions;  // (slot, result) of one reaping round

  for (;;) {
    unsigned want = 1;
    {
      std::unique_lock lock(worker.mutex);
      worker.wake.wait(lock, [&] { return worker.stopping || worker.in_flight > 0 || !worker.queue.empty(); });
      if (!worker.broken.empty()) {
        // Pieces still on the ring were failed with it; wait for the end.
        worker.wake.wait(lock, [&] { return worker.stopping; });
        return;
      }
      if (const int rc = submit_queued(worker); rc < 0) {
        lock.unlock();
        fail_worker(worker, fmt::format("io_uring_submit(ring of {}) failed: {}", path_, zeroth::detail::errno_text(-rc)));
        continue;
      }
      if (worker.in_flight == 0) {
        if (worker.queue.empty() && worker.stopping) return;
        continue;  // every piece taken belonged to a failed request
      }
      // Entries the kernel has not taken yet (it refused them for now) complete only after a
      // later submission: wait for those it has, or try again.
      const unsigned waiting = worker.unsubmitted ? io_uring_sq_ready(ring) : 0;
      const unsigned submitted = worker.in_flight - waiting;
      if (submitted == 0) {
        lock.unlock();
        std::this_thread::yield();
        continue;
      }
      // With pieces waiting for slots, wait until `batch` slots are free. Otherwise wait for
      // each completion: the caller of the request it ends is waiting for it, and is who puts
      // the next pieces on the ring.
      if (!worker.queue.empty()) {
        const unsigned busy_floor = depth - batch;
        want = worker.in_flight > busy_floor ? worker.in_flight - busy_floor : 1;
      }
      want = std::min(want, submitted);
    }
    io_uring_cqe* first = nullptr;
    const int rc = io_uring_wait_cqe_nr(ring, &first, want);
    if (rc == -EINTR || rc == -EAGAIN || rc == -EBUSY) continue;
    if (rc < 0) {
      fail_worker(worker,
                  fmt::format("io_uring_wait_cqe_nr(ring of {}, {}) failed: {}", path_, want, zeroth::detail::errno_text(-rc)));
      continue;
    }

    // Collected first and counted before complete() wakes any waiter, so stats() after wait()
    // includes the pieces of that request.
    completions.clear();
    unsigned head;
    io_uring_cqe* cqe;
    io_uring_for_each_cqe(ring, head, cqe) { completions.emplace_back(static_cast<unsigned>(io_uring_cqe_get_data64(cqe)), cqe->res); }
    io_uring_cq_advance(ring, static_cast<unsigned>(completions.size()));
    std::vector<Piece> done;
    {
      std::lock_guard lock(worker.mutex);
      for (const auto& [slot, result] : completions) {
        done.push_back(std::move(*worker.slots[slot]));
        worker.slots[slot].reset();
        worker.free_slots.push_back(slot);
      }
      worker.in_flight -= static_cast<unsigned>(completions.size());
      std::lock_guard stats_lock(mutex_);
      stats_.pieces += completions.size();
      worker.pieces += completions.size();
      in_flight_ -= static_cast<unsigned>(completions.size());
    }
    std::vector<Piece> again;
    for (std::size_t i = 0; i < done.size(); ++i)
      if (complete(done[i], completions[i].second)) again.push_back(std::move(done[i]));
    if (!again.empty()) {
      std::lock_guard lock(worker.mutex);
      for (auto it = again.rbegin(); it != again.rend(); ++it) worker.queue.push_front(std::move(*it));
    }
  }
}

}  // namespace zeroth::offload
