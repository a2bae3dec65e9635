// Gloo collectives as rings over unbound buffers. Slots are taken on the calling thread, in
// program order, so every rank numbers the same op the same way even when several streams run
// ops concurrently.
#include "comm/gloo/gloo_comm.h"

#include <csignal>  // signal, SIGPIPE

#include <gloo/common/error.h>
#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>
#include <gloo/transport/unbound_buffer.h>

#include <algorithm>           // std::max
#include <exception>           // std::uncaught_exceptions
#include <cstring>             // memcpy
#include <condition_variable>  // std::condition_variable
#include <map>                 // std::map
#include <mutex>               // std::mutex

#include "comm/gloo/gloo_support.h"
#include "comm/tcp_store.h"
#include "core/cpu/kernels.h"
#include "core/error.h"
#include "core/log.h"

namespace zeroth {

namespace {

using namespace gloo_detail;  // PrefixedStore, Shared, ScratchPool, abandon_scratch, transport_attr

using Buf = std::unique_ptr<gloo::transport::UnboundBuffer>;
constexpr uint64_t kP2pSlotBase = uint64_t{1} << 62;

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
  void do_all_gather(Stream& s, TensorView send, TensorView recv, const Descriptor& d) override {
    const size_t c = send.bytes();
    std::vector<size_t> offsets, lengths;
    for (int p = 0; p < size(); ++p) {
      offsets.push_back(p * c);
      lengths.push_back(c);
    }
    enqueue(s, d, [=, this](uint64_t slot) {
      char* base = static_cast<char*>(recv.data);
      if (base + rank() * c != send.data && c > 0) std::memcpy(base + rank() * c, send.data, c);
      ring_all_gather(base, offsets, lengths, slot, d);
    });
  }

  void do_reduce_scatter(Stream& s, TensorView send, TensorView recv, const Descriptor& d) override {
    std::vector<size_t> offsets, lengths;
    for (int p = 0; p < size(); ++p) {
      offsets.push_back(p * recv.numel);
      lengths.push_back(recv.numel);
    }
    enqueue(s, d, [=, this](uint64_t slot) {
      auto reduced = reduce_to_chunk(send, offsets, lengths, d, slot);
      finish(reduced.data(), recv, d);
    });
  }

  void do_all_reduce(Stream& s, TensorView data, const Descriptor& d) override {
    const size_t n = size(), chunk = (data.numel + n - 1) / n;
    std::vector<size_t> offsets, lengths, byte_offsets, byte_lengths;
    for (size_t p = 0; p < n; ++p) {
      const size_t begin = std::min(data.numel, p * chunk);
      offsets.push_back(begin);
      lengths.push_back(std::min(data.numel, begin + chunk) - begin);
      byte_offsets.push_back(begin * dtype_size(data.dtype));
      byte_lengths.push_back(lengths.back() * dtype_size(data.dtype));
    }
    enqueue(
        s, d,
        [=, this](uint64_t slot) {
      auto reduced = reduce_to_chunk(data, offsets, lengths, d, slot);
      finish(reduced.data(), data.slice(offsets[rank()], lengths[rank()]), d);
      ring_all_gather(static_cast<char*>(data.data), byte_offsets, byte_lengths, slot + 1, d);
        },
        true, 2);
  }

  // A chain from the root, pipelined in segments so every link carries data at once.
  void do_broadcast(Stream& s, TensorView data, const Descriptor& d) override {
    enqueue(s, d, [=, this](uint64_t slot) {
      const int n = size(), pos = (rank() - d.root + n) % n;
      const int prev = (rank() - 1 + n) % n, next = (rank() + 1) % n;
      const size_t bytes = data.bytes(), segment = size_t{4} << 20;
      if (n == 1 || bytes == 0) return;
      BufferKeeper keep(*this);
      auto* buf = &keep.make(data.data, bytes);
      size_t sends = 0;
      for (size_t off = 0; off < bytes; off += segment) {
        const size_t len = std::min(segment, bytes - off);
        if (pos > 0) {
          post_recv(*buf, prev, slot, off, len, d);
          wait_recv(*buf, prev, d);
        }
        if (pos < n - 1) {
          post_send(*buf, next, slot, off, len, d);
          ++sends;
        }
      }
      for (size_t i = 0; i < sends; ++i) wait_send(*buf, next, d);
    });
  }

  void do_barrier(Stream& s, const Descriptor& d) override {
    enqueue(s, d, [=, this](uint64_t slot) {
      std::vector<char> marks(size());
      std::vector<size_t> offsets(size()), lengths(size(), 1);
      for (int p = 0; p < size(); ++p) offsets[p] = p;
      ring_all_gather(marks.data(), offsets, lengths, slot, d);
    });
  }

  // Every pair exchanges its pieces directly, each rank starting with its right neighbour so that
  // no rank is everyone's first.
  void do_all_to_all(Stream& s, TensorView send, TensorView recv, const AllToAllSplits& splits, const Descriptor& d) override {
    enqueue(s, d, [=, this](uint64_t slot) {
      const int n = size(), r = rank();
      const size_t esize = dtype_size(send.dtype);
      auto at = [esize](TensorView v, size_t offset) { return static_cast<char*>(v.data) + offset * esize; };
      if (splits.send_counts[r] > 0) {
        std::memcpy(at(recv, splits.recv_offsets[r]), at(send, splits.send_offsets[r]), splits.send_counts[r] * esize);
      }
      BufferKeeper keep(*this);
      std::vector<gloo::transport::UnboundBuffer*> from(n, nullptr), to(n, nullptr);
      for (int k = 1; k < n; ++k) {
        const int p = (r + k) % n;
        if (splits.recv_counts[p] > 0) {
          from[p] = &keep.make(at(recv, splits.recv_offsets[p]), splits.recv_counts[p] * esize);
          post_recv(*from[p], p, slot, 0, splits.recv_counts[p] * esize, d);
        }
        if (splits.send_counts[p] > 0) {
          to[p] = &keep.make(at(send, splits.send_offsets[p]), splits.send_counts[p] * esize);
          post_send(*to[p], p, slot, 0, splits.send_counts[p] * esize, d);
        }
      }
      for (int k = 1; k < n; ++k) {
        const int p = (r + k) % n;
        if (from[p] != nullptr) wait_recv(*from[p], p, d);
      }
      for (int k = 1; k < n; ++k) {
        const int p = (r + k) % n;
        if (to[p] != nullptr) wait_send(*to[p], p, d);
      }
    });
  }

  // Blocking on the calling thread, as a split's exchange is.
  std::vector<uint64_t> do_gather_rows(Stream&, std::span<const uint64_t> row, const Descriptor& d) override {
    const size_t n = size(), bytes = row.size() * sizeof(uint64_t);
    std::vector<uint64_t> rows(n * row.size());
    std::copy(row.begin(), row.end(), rows.begin() + rank() * row.size());
    std::vector<size_t> offsets, lengths;
    for (size_t p = 0; p < n; ++p) {
      offsets.push_back(p * bytes);
      lengths.push_back(bytes);
    }
    const uint64_t check_slot = options_.check_desync ? static_cast<uint64_t>(ctx_->nextSlot()) : 0;
    const uint64_t slot = ctx_->nextSlot();
    guarded(d, [&] {
      if (options_.check_desync) check_desync(d, check_slot);
      ring_all_gather(reinterpret_cast<char*>(rows.data()), offsets, lengths, slot, d);
    });
    return rows;
  }

  // A header (count, dtype) travels first, so a mismatched recv is reported, not corrupted.
  void do_send(Stream& s, TensorView data, const Descriptor& d) override {
    const uint64_t slot = next_p2p_slot(send_seq_, d.root);
    enqueue(
        s, d,
        [=, this](uint64_t) {
      uint64_t header[2] = {d.count, static_cast<uint64_t>(d.dtype)};
      BufferKeeper keep(*this);
      auto* h = &keep.make(header, sizeof header);
      post_send(*h, d.root, slot, 0, sizeof header, d);
      wait_send(*h, d.root, d);
      if (data.bytes() == 0) return;
      auto* b = &keep.make(data.data, data.bytes());
      post_send(*b, d.root, slot + 1, 0, data.bytes(), d);
      wait_send(*b, d.root, d);
        },
        false);
  }

  void do_recv(Stream& s, TensorView data, const Descriptor& d) override {
    const uint64_t slot = next_p2p_slot(recv_seq_, d.root);
    enqueue(
        s, d,
        [=, this](uint64_t) {
      uint64_t header[2] = {};
      BufferKeeper keep(*this);
      auto* h = &keep.make(header, sizeof header);
      post_recv(*h, d.root, slot, 0, sizeof header, d);
      wait_recv(*h, d.root, d);
      if (header[0] != d.count || header[1] != static_cast<uint64_t>(d.dtype)) {
        ZEROTH_THROW(CommError, "gloo send/recv mismatch: rank {} sent count={} {} but rank {} posted {}", d.root, header[0],
                     dtype_name(static_cast<DType>(header[1])), rank(), d.describe());
      }
      if (data.bytes() == 0) return;
      auto* b = &keep.make(data.data, data.bytes());
      post_recv(*b, d.root, slot + 1, 0, data.bytes(), d);
      wait_recv(*b, d.root, d);
        },
        false);
  }

  std::unique_ptr<Communicator> do_split(int color, int key, const Descriptor& d) override {
    // Blocking on the calling thread: everyone learns everyone's (color, key).
    std::vector<int32_t> all(2 * size());
    all[2 * rank()] = color;
    all[2 * rank() + 1] = key;
    std::vector<size_t> offsets, lengths;
    for (int p = 0; p < size(); ++p) {
      offsets.push_back(p * 8);
      lengths.push_back(8);
    }
    const uint64_t slot = ctx_->nextSlot();
    guarded(d, [&] { ring_all_gather(reinterpret_cast<char*>(all.data()), offsets, lengths, slot, d); });
    if (color < 0) return nullptr;
    std::vector<int> members;
    for (int p = 0; p < size(); ++p) {
      if (all[2 * p] == color) members.push_back(p);
    }
    std::stable_sort(members.begin(), members.end(), [&](int a, int b) { return all[2 * a + 1] < all[2 * b + 1]; });
    const int new_rank = static_cast<int>(std::find(members.begin(), members.end(), rank()) - members.begin());
    const std::string name = fmt::format("{}s{}c{}/", name_, d.sequence, color);
    auto ctx = std::make_shared<gloo::rendezvous::Context>(new_rank, static_cast<int>(members.size()));
    ctx->setTimeout(options_.timeout);
    PrefixedStore store(*shared_->store, name);
    guarded(d, [&] { ctx->connectFullMesh(store, shared_->device); });
    return std::make_unique<GlooCommunicator>(shared_, std::move(ctx), name, options_);
  }

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

  [[noreturn]] void fail(int peer, const std::string& what) {
    const std::string message = what + name_lost_ranks(*shared_->store, name_, rank(), size(), peer, what);
    shared_->note_failure(message);
    throw CommError(message);
  }

  // CommError when an op of this job failed already: the job is on its way out.
  void check_not_failed(const Descriptor& d) {
    if (const std::string first = shared_->first_failure(); !first.empty())
      ZEROTH_THROW(CommError, "gloo {} on rank {} of {} not started: an earlier op failed: {}", d.describe(), rank(), size(), first);
  }

  void post_send(gloo::transport::UnboundBuffer& b, int peer, uint64_t slot, size_t offset, size_t bytes, const Descriptor& d) {
    try {
      b.send(peer, slot, offset, bytes);
    } catch (const gloo::Exception& e) {
      fail(peer, fmt::format("gloo {} on rank {} of {}: sending to rank {} failed: {}", d.describe(), rank(), size(), peer, e.what()));
    }
  }

  void post_recv(gloo::transport::UnboundBuffer& b, int peer, uint64_t slot, size_t offset, size_t bytes, const Descriptor& d) {
    try {
      b.recv(peer, slot, offset, bytes);
    } catch (const gloo::Exception& e) {
      fail(peer,
           fmt::format("gloo {} on rank {} of {}: receiving from rank {} failed: {}", d.describe(), rank(), size(), peer, e.what()));
    }
  }

  // Runs body(slot) on the stream. Collectives take their slot (and the desync check's) now, on
  // the calling thread; point-to-point ops number themselves per peer instead.
  void enqueue(Stream& s, const Descriptor& d, std::function<void(uint64_t)> body, bool collective = true, int slots = 1) {
    ZEROTH_CHECK(s.device().kind() == DeviceKind::cpu,
                 "the gloo backend moves host memory: use it with the CPU device (for GPUs use the nccl backend); "
                 "got a stream of {}",
                 s.device().name());
    // The check's slot comes first: ops that differ in their own slot count still agree on it.
    const bool check = collective && options_.check_desync;
    const uint64_t check_slot = check ? static_cast<uint64_t>(ctx_->nextSlot()) : 0;
    const uint64_t slot = collective ? static_cast<uint64_t>(ctx_->nextSlot(slots)) : 0;
    {
      std::lock_guard lock(in_flight_mutex_);
      ++in_flight_;
    }
    // Counted down when the stream lets go of the op, run or not: a stream that failed earlier
    // drops what follows unrun.
    struct InFlight {
      explicit InFlight(GlooCommunicator& c) : comm(c) {}
      GlooCommunicator& comm;
      ~InFlight() {
        std::lock_guard lock(comm.in_flight_mutex_);
        if (--comm.in_flight_ == 0) comm.in_flight_done_.notify_all();
      }
    };
    auto in_flight = std::make_shared<InFlight>(*this);
    s.enqueue_host([=, this, in_flight = std::move(in_flight), body = std::move(body)] {
      check_not_failed(d);
      guarded(d, [&] {
        if (check) check_desync(d, check_slot);
        body(slot);
      });
    });
  }

  uint64_t next_p2p_slot(std::map<int, uint64_t>& counters, int peer) {
    std::lock_guard lock(p2p_mutex_);
    return kP2pSlotBase + 2 * counters[peer]++;
  }

  void wait_recv(gloo::transport::UnboundBuffer& b, int peer, const Descriptor& d) {
    bool completed = false;
    try {
      completed = b.waitRecv(nullptr, options_.timeout);
    } catch (const gloo::Exception& e) {
      fail(peer,
           fmt::format("gloo {} on rank {} of {}: receiving from rank {} failed: {}", d.describe(), rank(), size(), peer, e.what()));
    }
    if (!completed)
      fail(peer, fmt::format("gloo {} on rank {} of {}: receive from rank {} aborted", d.describe(), rank(), size(), peer));
  }

  void wait_send(gloo::transport::UnboundBuffer& b, int peer, const Descriptor& d) {
    bool completed = false;
    try {
      completed = b.waitSend(nullptr, options_.timeout);
    } catch (const gloo::Exception& e) {
      fail(peer, fmt::format("gloo {} on rank {} of {}: sending to rank {} failed: {}", d.describe(), rank(), size(), peer, e.what()));
    }
    if (!completed) fail(peer, fmt::format("gloo {} on rank {} of {}: send to rank {} aborted", d.describe(), rank(), size(), peer));
  }

  // Pieces of a chunk that travel separately, so that a rank forwards (or reduces) the first
  // piece while the next is still on the wire: the ring becomes a pipeline.
  static constexpr size_t kSegmentBytes = size_t{1} << 20;
  static std::vector<std::pair<size_t, size_t>> segments(size_t offset, size_t length) {
    std::vector<std::pair<size_t, size_t>> out;
    for (size_t done = 0; done < length; done += kSegmentBytes) out.push_back({offset + done, std::min(kSegmentBytes, length - done)});
    return out;
  }

  // Ring all-gather of byte ranges: this rank's chunk goes right, and every chunk arriving from
  // the left is forwarded right piece by piece as it lands, until it reaches its origin's left
  // neighbour.
  void ring_all_gather(char* base, const std::vector<size_t>& offsets, const std::vector<size_t>& lengths, uint64_t slot,
                       const Descriptor& d) {
    const int n = size(), r = rank();
    if (n == 1) return;
    const int left = (r - 1 + n) % n, right = (r + 1) % n;
    BufferKeeper keep(*this);
    auto* buf = &keep.make(base, offsets.back() + lengths.back());
    size_t sends = 0;
    for (auto [off, len] : segments(offsets[r], lengths[r])) post_send(*buf, right, slot, off, len, d), ++sends;
    for (int step = 0; step < n - 1; ++step) {
      const int recv_idx = (r - step - 1 + n) % n;
      const auto pieces = segments(offsets[recv_idx], lengths[recv_idx]);
      for (auto [off, len] : pieces) post_recv(*buf, left, slot, off, len, d);
      for (auto [off, len] : pieces) {
        wait_recv(*buf, left, d);
        if (step < n - 2) post_send(*buf, right, slot, off, len, d), ++sends;
      }
    }
    for (size_t i = 0; i < sends; ++i) wait_send(*buf, right, d);
  }

  // Ring reduce-scatter with f32 partial sums on the wire: after n-1 steps this rank holds the
  // reduction of its own chunk, unscaled, in f32. Pieces are reduced and forwarded as they land.
  struct Reduced {
    ScratchPool::Lease lease;
    float* data() { return lease.data(); }
  };
  Reduced ring_reduce(TensorView in, const std::vector<size_t>& offsets, const std::vector<size_t>& lengths, const Descriptor& d,
                      uint64_t slot) {
    const int n = size(), r = rank();
    const size_t longest = *std::max_element(lengths.begin(), lengths.end());
    // Two partial-sum buffers that alternate, and the landing zone for the left neighbour's.
    ScratchPool::Lease part_leases[2] = {pool_.take(longest), pool_.take(longest)};
    auto landing = pool_.take(longest);
    float* const part[2] = {part_leases[0].data(), part_leases[1].data()};
    const auto kind = d.reduce == ReduceOp::max ? ReduceKind::max : ReduceKind::sum;
    // Serial kernels: the ranks of one host already keep every core busy with the transport, and
    // a parallel kernel's spinning workers would take cycles from it.
    const auto& kernels = cpu::kernel_table(cpu::active_simd_level());
    auto widen = [&](int chunk, size_t begin, size_t count, float* out) {
      kernels.cast(in.slice(offsets[chunk] + begin, count).data, in.dtype, out + begin, DType::f32, count, false);
    };
    if (n == 1) {
      widen(0, 0, lengths[0], part[0]);
      return {std::move(part_leases[0])};
    }
    const int left = (r - 1 + n) % n, right = (r + 1) % n;
    BufferKeeper keep(*this);
    gloo::transport::UnboundBuffer* ub_part[2] = {&keep.make(part[0], longest * 4), &keep.make(part[1], longest * 4)};
    auto* ub_landing = &keep.make(landing.data(), longest * 4);
    // part[cur] holds what was sent last step (its sends may be in flight); part[1 - cur] takes
    // the next partial sum once its sends from two steps ago have completed.
    int cur = 0;
    size_t sends[2] = {0, 0};
    // The first chunk goes out as it is: straight from the caller's buffer when it is f32.
    const int first = (r - 1 + n) % n;
    gloo::transport::UnboundBuffer* ub_first = ub_part[cur];
    if (in.dtype == DType::f32 && lengths[first] > 0)
      ub_first = &keep.make(in.slice(offsets[first], lengths[first]).data, lengths[first] * 4);
    size_t first_sends = 0;
    for (auto [off, len] : segments(0, lengths[first] * 4)) {
      if (in.dtype != DType::f32) widen(first, off / 4, len / 4, part[cur]);
      post_send(*ub_first, right, slot, off, len, d);
      ++first_sends;
    }
    if (ub_first == ub_part[cur]) sends[cur] += first_sends;
    for (int step = 0; step < n - 1; ++step) {
      const int next = 1 - cur;
      const int recv_idx = (r - step - 2 + 2 * n) % n;
      const auto pieces = segments(0, lengths[recv_idx] * 4);
      for (auto [off, len] : pieces) post_recv(*ub_landing, left, slot, off, len, d);
      for (; sends[next] > 0; --sends[next]) wait_send(*ub_part[next], right, d);
      for (auto [off, len] : pieces) {
        wait_recv(*ub_landing, left, d);
        const size_t begin = off / 4, count = len / 4;
        // f32 input is reduced straight from the caller's buffer; narrower input is widened first.
        const float* own = static_cast<const float*>(in.slice(offsets[recv_idx] + begin, count).data);
        if (in.dtype != DType::f32) {
          widen(recv_idx, begin, count, part[next]);
          own = part[next] + begin;
        }
        const float* inputs[] = {own, landing.data() + begin};
        kernels.reduce(reinterpret_cast<const void* const*>(inputs), 2, DType::f32, part[next] + begin, DType::f32, kind, 1.0f, count,
                       false);
        if (step < n - 2) post_send(*ub_part[next], right, slot, off, len, d), ++sends[next];
      }
      cur = next;
    }
    for (int k : {0, 1}) {
      for (; sends[k] > 0; --sends[k]) wait_send(*ub_part[k], right, d);
    }
    if (ub_first != ub_part[0]) {
      for (; first_sends > 0; --first_sends) wait_send(*ub_first, right, d);
    }
    return {std::move(part_leases[cur])};
  }

  // Below this many ranks, reductions exchange chunks directly (every rank sends each peer its
  // slice) instead of passing partial sums around a ring: the same bytes on the wire, no
  // store-and-forward, the original dtype on the wire (bf16 travels as bf16), and one pass that
  // sums all n slices in rank order, so the result equals the local backend's bit for bit.
  static constexpr int kDirectMaxRanks = 8;

  Reduced direct_reduce(TensorView in, const std::vector<size_t>& offsets, const std::vector<size_t>& lengths, const Descriptor& d,
                        uint64_t slot) {
    const int n = size(), r = rank();
    const size_t len = lengths[r], esize = dtype_size(in.dtype);
    auto landing = pool_.take(((n - 1) * len * esize + 3) / 4);
    auto result = pool_.take(len);
    // One unbound buffer per peer and direction, so that a failure names the peer it came from.
    BufferKeeper keep(*this);
    std::vector<int> peers;
    for (int k = 1; k < n; ++k) peers.push_back((r + k) % n);  // staggered: no rank is everyone's first
    std::vector<gloo::transport::UnboundBuffer*> from(n, nullptr), to(n, nullptr);
    char* const landing_bytes = reinterpret_cast<char*>(landing.data());
    for (size_t k = 0; k < peers.size(); ++k) {
      const int p = peers[k];
      if (len > 0) {
        from[p] = &keep.make(landing_bytes + k * len * esize, len * esize);
        post_recv(*from[p], p, slot, 0, len * esize, d);
      }
      if (lengths[p] > 0) {
        to[p] = &keep.make(static_cast<char*>(in.data) + offsets[p] * esize, lengths[p] * esize);
        post_send(*to[p], p, slot, 0, lengths[p] * esize, d);
      }
    }
    if (len > 0) {
      std::vector<const void*> inputs(n);
      for (size_t k = 0; k < peers.size(); ++k) {
        wait_recv(*from[peers[k]], peers[k], d);
        inputs[peers[k]] = landing_bytes + k * len * esize;
      }
      inputs[r] = static_cast<const char*>(in.data) + offsets[r] * esize;
      const auto kind = d.reduce == ReduceOp::max ? ReduceKind::max : ReduceKind::sum;
      cpu::kernel_table(cpu::active_simd_level())
          .reduce(inputs.data(), n, in.dtype, result.data(), DType::f32, kind, 1.0f, len, false);
    }
    for (int p : peers) {
      if (to[p] != nullptr) wait_send(*to[p], p, d);
    }
    return {std::move(result)};
  }

  Reduced reduce_to_chunk(TensorView in, const std::vector<size_t>& offsets, const std::vector<size_t>& lengths, const Descriptor& d,
                          uint64_t slot) {
    if (size() <= kDirectMaxRanks) return direct_reduce(in, offsets, lengths, d, slot);
    return ring_reduce(in, offsets, lengths, d, slot);
  }

  // out = scale * reduced, rounded once to out's dtype.
  void finish(float* reduced, TensorView out, const Descriptor& d) {
    if (out.numel == 0) return;
    const float scale = d.reduce == ReduceOp::avg ? 1.0f / static_cast<float>(size()) : 1.0f;
    const void* inputs[] = {reduced};
    cpu::reduce(inputs, 1, DType::f32, out.data, out.dtype, ReduceKind::sum, scale, out.numel);
  }

  void check_desync(const Descriptor& d, uint64_t slot) {
    std::vector<WireDescriptor> all(size());
    all[rank()] = {
        d.sequence, d.count, d.root, static_cast<uint8_t>(d.op), static_cast<uint8_t>(d.dtype), static_cast<uint8_t>(d.reduce), 0};
    std::vector<size_t> offsets, lengths;
    for (int p = 0; p < size(); ++p) {
      offsets.push_back(p * sizeof(WireDescriptor));
      lengths.push_back(sizeof(WireDescriptor));
    }
    ring_all_gather(reinterpret_cast<char*>(all.data()), offsets, lengths, slot, d);
    for (int p = 0; p < size(); ++p) {
      const auto& w = all[p];
      const Descriptor theirs{
          w.sequence, static_cast<CollectiveOp>(w.op), w.count, static_cast<DType>(w.dtype), static_cast<ReduceOp>(w.reduce), w.root};
      check_same(d, rank(), theirs, p, "gloo");
    }
  }

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

}  // namespace

std::unique_ptr<Communicator> make_gloo_communicator(const RendezvousInfo& info, CommOptions options) {
  // Gloo writes to peer sockets without MSG_NOSIGNAL: a dead peer would kill this process with
  // SIGPIPE before the write's error could become a CommError that names it.
  ::signal(SIGPIPE, SIG_IGN);
  auto shared = std::make_shared<Shared>();
  shared->job = connect_job_store(info, options.timeout);
  shared->store = shared->job.client.get();
  auto ctx = connect_world(*shared, info, options.timeout);
  return std::make_unique<GlooCommunicator>(std::move(shared), std::move(ctx), "world/", std::move(options));
}

}  // namespace zeroth
