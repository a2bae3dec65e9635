// How the Gloo communicator's bytes move: buffers posted and waited on with the peer named in every
// failure, the ring all-gather, the ring and direct reductions, and the desync check.
#include <algorithm>  // std::max_element, std::min

#include "comm/gloo/gloo_communicator.h"
#include "core/cpu/kernels.h"
#include "core/error.h"

namespace zeroth::gloo_detail {

void GlooCommunicator::fail(int peer, const std::string& what) {
  const std::string message = what + name_lost_ranks(*shared_->store, name_, rank(), size(), peer, what);
  shared_->note_failure(message);
  throw CommError(message);
}

// CommError when an op of this job failed already: the job is on its way out.
void GlooCommunicator::check_not_failed(const Descriptor& d) {
  if (const std::string first = shared_->first_failure(); !first.empty())
    ZEROTH_THROW(CommError, "gloo {} on rank {} of {} not started: an earlier op failed: {}", d.describe(), rank(), size(), first);
}

void GlooCommunicator::post_send(gloo::transport::UnboundBuffer& b, int peer, uint64_t slot, size_t offset, size_t bytes,
                                 const Descriptor& d) {
  try {
    b.send(peer, slot, offset, bytes);
  } catch (const gloo::Exception& e) {
    fail(peer, fmt::format("gloo {} on rank {} of {}: sending to rank {} failed: {}", d.describe(), rank(), size(), peer, e.what()));
  }
}

void GlooCommunicator::post_recv(gloo::transport::UnboundBuffer& b, int peer, uint64_t slot, size_t offset, size_t bytes,
                                 const Descriptor& d) {
  try {
    b.recv(peer, slot, offset, bytes);
  } catch (const gloo::Exception& e) {
    fail(peer,
         fmt::format("gloo {} on rank {} of {}: receiving from rank {} failed: {}", d.describe(), rank(), size(), peer, e.what()));
  }
}

// Runs body(slot) on the stream. Collectives take their slot (and the desync check's) now, on
// the calling thread; point-to-point ops number themselves per peer instead.
void GlooCommunicator::enqueue(Stream& s, const Descriptor& d, std::function<void(uint64_t)> body, bool collective, int slots) {
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

uint64_t GlooCommunicator::next_p2p_slot(std::map<int, uint64_t>& counters, int peer) {
  std::lock_guard lock(p2p_mutex_);
  return kP2pSlotBase + 2 * counters[peer]++;
}

void GlooCommunicator::wait_recv(gloo::transport::UnboundBuffer& b, int peer, const Descriptor& d) {
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

void GlooCommunicator::wait_send(gloo::transport::UnboundBuffer& b, int peer, const Descriptor& d) {
  bool completed = false;
  try {
    completed = b.waitSend(nullptr, options_.timeout);
  } catch (const gloo::Exception& e) {
    fail(peer, fmt::format("gloo {} on rank {} of {}: sending to rank {} failed: {}", d.describe(), rank(), size(), peer, e.what()));
  }
  if (!completed) fail(peer, fmt::format("gloo {} on rank {} of {}: send to rank {} aborted", d.describe(), rank(), size(), peer));
}

// Ring all-gather of byte ranges: this rank's chunk goes right, and every chunk arriving from
// the left is forwarded right piece by piece as it lands, until it reaches its origin's left
// neighbour.
void GlooCommunicator::ring_all_gather(char* base, const std::vector<size_t>& offsets, const std::vector<size_t>& lengths,
                                       uint64_t slot, const Descriptor& d) {
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
GlooCommunicator::Reduced GlooCommunicator::ring_reduce(TensorView in, const std::vector<size_t>& offsets,
                                                        const std::vector<size_t>& lengths, const Descriptor& d, uint64_t slot) {
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

GlooCommunicator::Reduced GlooCommunicator::direct_reduce(TensorView in, const std::vector<size_t>& offsets,
                                                          const std::vector<size_t>& lengths, const Descriptor& d, uint64_t slot) {
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
    cpu::kernel_table(cpu::active_simd_level()).reduce(inputs.data(), n, in.dtype, result.data(), DType::f32, kind, 1.0f, len, false);
  }
  for (int p : peers) {
    if (to[p] != nullptr) wait_send(*to[p], p, d);
  }
  return {std::move(result)};
}

GlooCommunicator::Reduced GlooCommunicator::reduce_to_chunk(TensorView in, const std::vector<size_t>& offsets,
                                                            const std::vector<size_t>& lengths, const Descriptor& d, uint64_t slot) {
  if (size() <= kDirectMaxRanks) return direct_reduce(in, offsets, lengths, d, slot);
  return ring_reduce(in, offsets, lengths, d, slot);
}

// out = scale * reduced, rounded once to out's dtype.
void GlooCommunicator::finish(float* reduced, TensorView out, const Descriptor& d) {
  if (out.numel == 0) return;
  const float scale = d.reduce == ReduceOp::avg ? 1.0f / static_cast<float>(size()) : 1.0f;
  const void* inputs[] = {reduced};
  cpu::reduce(inputs, 1, DType::f32, out.data, out.dtype, ReduceKind::sum, scale, out.numel);
}

void GlooCommunicator::check_desync(const Descriptor& d, uint64_t slot) {
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

}  // namespace zeroth::gloo_detail
