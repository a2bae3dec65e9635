// What AsyncFile's request side and its workers share: a request's completion count, a piece and a
// worker's queue and ring slots. Internal to offload/aio*.cc.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "offload/aio.h"
#include "offload/io_ring.h"  // IoRing

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
  int buffer_slot = -1;  // the registered buffer slot it lies in, -1 for none
};

struct AsyncFile::Worker {
  std::unique_ptr<IoRing> ring;  // nullptr: pread/pwrite
  std::mutex mutex;              // guards everything below but `thread`
  std::condition_variable wake;  // pieces queued or put on the ring, or stopping
  std::deque<Piece> queue;       // dealt to this worker, waiting for a ring slot (or for pread/pwrite)
  // Ring workers: the pieces on the ring by slot (a piece's user_data is its slot), the free
  // slots, and how many pieces are on the ring, prepared entries not yet submitted included.
  std::vector<std::optional<Piece>> slots;
  std::vector<unsigned> free_slots;
  unsigned in_flight = 0;
  bool unsubmitted = false;  // entries prepared that the kernel has not taken yet
  std::string broken;        // the ring failed for good: every later piece fails with this
  bool stopping = false;
  std::uint64_t pieces = 0;  // completed by this worker; guarded by AsyncFile::mutex_, with the stats
  std::thread thread;
};

namespace detail {

inline bool failed(detail::Request& request) {
  std::lock_guard lock(request.mutex);
  return !request.error.empty();
}

inline void fail(detail::Request& request, std::string message) {
  std::lock_guard lock(request.mutex);
  if (request.error.empty()) request.error = std::move(message);
}

}  // namespace detail

}  // namespace zeroth::offload
