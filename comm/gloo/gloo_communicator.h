// The Gloo communicator: collectives as rings (or direct exchanges below kDirectMaxRanks) over
// unbound buffers. Slots are taken on the calling thread, in program order, so every rank numbers
// the same op the same way even when several streams run ops concurrently. Internal to comm/gloo:
// gloo_comm.cc holds the ops, gloo_transfer.cc how bytes move and reduce.
#pragma once

#include <gloo/common/error.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>           // std::min
#include <condition_variable>  // std::condition_variable
#include <cstdint>             // uint64_t
#include <exception>           // std::uncaught_exceptions
#include <functional>          // std::function
#include <map>                 // std::map
#include <memory>              // std::unique_ptr, std::shared_ptr
#include <mutex>               // std::mutex
#include <span>                // std::span
#include <string>              // std::string
#include <utility>             // std::pair
#include <vector>              // std::vector

#include <fmt/format.h>

#include "comm/communicator.h"
#include "comm/gloo/gloo_support.h"
#include "core/log.h"

namespace zeroth::gloo_detail {

using Buf = std::unique_ptr<gloo::transport::UnboundBuffer>;
inline constexpr uint64_t kP2pSlotBase = uint64_t{1} << 62;

// The fixed-size image of a Descriptor that ranks exchange for the desync check.
struct WireDescriptor {
  uint64_t sequence, count;
  int32_t root;
  uint8_t op, dtype, reduce, pad;
};

class GlooCommunicator final : public Communicator {
 public:
  GlooCommunicator(std::shared_ptr<Shared> shared, std::shared_ptr<gloo::Context> context, std::string name, CommOptions options)
      : Communicator(std::move(options)), shared_(std::move(shared)), ctx_(std::move(context)), name_(std::move(name)) {}

  // Ops still queued on streams run against this object: wait for them before it goes.
  ~GlooCommunicator() override {
    std::unique_lock lock(in_flight_mutex_);
    if (!in_flight_done_.wait_for(lock, options_.timeout, [&] { return in_flight_ == 0; })) {
      ZLOG_ERROR("gloo communicator destroyed with {} op(s) still queued after {} s; their streams will fail", in_flight_,
                 options_.timeout.count() / 1000.0);
    }
  }

  int rank() const override { return ctx_->rank; }
  int size() const override { return ctx_->size; }
  std::string_view backend() const override { return "gloo"; }

 protected:
  void do_all_gather(Stream& s, TensorView send, TensorView recv, const Descriptor& d) override;

  void do_reduce_scatter(Stream& s, TensorView send, TensorView recv, const Descriptor& d) override;

  void do_all_reduce(Stream& s, TensorView data, const Descriptor& d) override;

  void do_broadcast(Stream& s, TensorView data, const Descriptor& d) override;

  void do_barrier(Stream& s, const Descriptor& d) override;

  void do_all_to_all(Stream& s, TensorView send, TensorView recv, const AllToAllSplits& splits, const Descriptor& d) override;

  std::vector<uint64_t> do_gather_rows(Stream&, std::span<const uint64_t> row, const Descriptor& d) override;

  void do_send(Stream& s, TensorView data, const Descriptor& d) override;

  void do_recv(Stream& s, TensorView data, const Descriptor& d) override;

  std::unique_ptr<Communicator> do_split(int color, int key, const Descriptor& d) override;

 private:
  // Creates an op's unbound buffers and, when the op fails, hands them to the job's shared state,
  // which outlives Gloo's I/O thread: that thread may still signal a buffer whose wait has thrown.
  class BufferKeeper {
   public:
    explicit BufferKeeper(GlooCommunicator& comm) : comm_(comm) {}
    ~BufferKeeper() {
      if (std::uncaught_exceptions() > exceptions_) {
        std::lock_guard lock(comm_.shared_->abandoned_mutex);
        for (auto& b : buffers_) comm_.shared_->abandoned.push_back(std::move(b));
      }
    }
    gloo::transport::UnboundBuffer& make(void* data, size_t bytes) {
      buffers_.push_back(comm_.ctx_->createUnboundBuffer(data, bytes));
      return *buffers_.back();
    }

   private:
    GlooCommunicator& comm_;
    int exceptions_ = std::uncaught_exceptions();
    std::vector<Buf> buffers_;
  };

  template <class Fn>
  void guarded(const Descriptor& d, Fn&& fn) {
    try {
      fn();
    } catch (const gloo::Exception& e) {
      fail(-1, fmt::format("gloo {} on rank {} of {}: {}", d.describe(), rank(), size(), e.what()));
    }
  }

  [[noreturn]] void fail(int peer, const std::string& what);

  void check_not_failed(const Descriptor& d);

  void post_send(gloo::transport::UnboundBuffer& b, int peer, uint64_t slot, size_t offset, size_t bytes, const Descriptor& d);

  void post_recv(gloo::transport::UnboundBuffer& b, int peer, uint64_t slot, size_t offset, size_t bytes, const Descriptor& d);

  void enqueue(Stream& s, const Descriptor& d, std::function<void(uint64_t)> body, bool collective = true, int slots = 1);

  uint64_t next_p2p_slot(std::map<int, uint64_t>& counters, int peer);

  void wait_recv(gloo::transport::UnboundBuffer& b, int peer, const Descriptor& d);

  void wait_send(gloo::transport::UnboundBuffer& b, int peer, const Descriptor& d);

  // Pieces of a chunk that travel separately, so that a rank forwards (or reduces) the first
  // piece while the next is still on the wire: the ring becomes a pipeline.
  static constexpr size_t kSegmentBytes = size_t{1} << 20;
  static std::vector<std::pair<size_t, size_t>> segments(size_t offset, size_t length) {
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t done = 0; done < length; done += kSegmentBytes) out.push_back({offset + done, std::min(kSegmentBytes, length - done)});
    return out;
  }

  void ring_all_gather(char* base, const std::vector<size_t>& offsets, const std::vector<size_t>& lengths, uint64_t slot,
                       const Descriptor& d);

  // A rank's reduced chunk, unscaled, in f32.
  struct Reduced {
    ScratchPool::Lease lease;
    float* data() { return lease.data(); }
  };
  Reduced ring_reduce(TensorView in, const std::vector<size_t>& offsets, const std::vector<size_t>& lengths, const Descriptor& d,
                      uint64_t slot);

  // Below this many ranks, reductions exchange chunks directly (every rank sends each peer its
  // slice) instead of passing partial sums around a ring: the same bytes on the wire, no
  // store-and-forward, the original dtype on the wire (bf16 travels as bf16), and one pass that
  // sums all n slices in rank order, so the result equals the local backend's bit for bit.
  static constexpr int kDirectMaxRanks = 8;

  Reduced direct_reduce(TensorView in, const std::vector<size_t>& offsets, const std::vector<size_t>& lengths, const Descriptor& d,
                        uint64_t slot);

  Reduced reduce_to_chunk(TensorView in, const std::vector<size_t>& offsets, const std::vector<size_t>& lengths, const Descriptor& d,
                          uint64_t slot);

  void finish(float* reduced, TensorView out, const Descriptor& d);

  void check_desync(const Descriptor& d, uint64_t slot);

  std::shared_ptr<Shared> shared_;
  ScratchPool pool_;
  std::shared_ptr<gloo::Context> ctx_;
  std::string name_;
  std::mutex p2p_mutex_;
  std::map<int, uint64_t> send_seq_, recv_seq_;
  std::mutex in_flight_mutex_;
  std::condition_variable in_flight_done_;
  int in_flight_ = 0;
};

}  // namespace zeroth::gloo_detail
