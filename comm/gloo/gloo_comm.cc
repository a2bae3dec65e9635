// The Gloo communicator's ops: each takes its slots on the calling thread and queues its transfer
// on the stream (gloo_communicator.h says why).
#include "comm/gloo/gloo_comm.h"

#include <csignal>  // signal, SIGPIPE

#include <gloo/rendezvous/context.h>
#include <gloo/rendezvous/store.h>

#include <algorithm>  // std::max
#include <cstring>    // memcpy

#include "comm/gloo/gloo_communicator.h"
#include "comm/gloo/gloo_support.h"
#include "comm/tcp_store.h"
#include "core/error.h"
#include "core/log.h"

namespace zeroth {

namespace gloo_detail {

void GlooCommunicator::do_all_gather(Stream& s, TensorView send, TensorView recv, const Descriptor& d) {
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

void GlooCommunicator::do_reduce_scatter(Stream& s, TensorView send, TensorView recv, const Descriptor& d) {
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

void GlooCommunicator::do_all_reduce(Stream& s, TensorView data, const Descriptor& d) {
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
void GlooCommunicator::do_broadcast(Stream& s, TensorView data, const Descriptor& d) {
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

void GlooCommunicator::do_barrier(Stream& s, const Descriptor& d) {
  enqueue(s, d, [=, this](uint64_t slot) {
    std::vector<char> marks(size());
    std::vector<size_t> offsets(size()), lengths(size(), 1);
    for (int p = 0; p < size(); ++p) offsets[p] = p;
    ring_all_gather(marks.data(), offsets, lengths, slot, d);
  });
}

// Every pair exchanges its pieces directly, each rank starting with its right neighbour so that
// no rank is everyone's first.
void GlooCommunicator::do_all_to_all(Stream& s, TensorView send, TensorView recv, const AllToAllSplits& splits, const Descriptor& d) {
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
std::vector<uint64_t> GlooCommunicator::do_gather_rows(Stream&, std::span<const uint64_t> row, const Descriptor& d) {
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
void GlooCommunicator::do_send(Stream& s, TensorView data, const Descriptor& d) {
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

void GlooCommunicator::do_recv(Stream& s, TensorView data, const Descriptor& d) {
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

std::unique_ptr<Communicator> GlooCommunicator::do_split(int color, int key, const Descriptor& d) {
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

}  // namespace gloo_detail

std::unique_ptr<Communicator> make_gloo_communicator(const RendezvousInfo& info, CommOptions options) {
  // Gloo writes to peer sockets without MSG_NOSIGNAL: a dead peer would kill this process with
  // SIGPIPE before the write's error could become a CommError that names it.
  ::signal(SIGPIPE, SIG_IGN);
  auto shared = std::make_shared<gloo_detail::Shared>();
  shared->job = connect_job_store(info, options.timeout);
  shared->store = shared->job.client.get();
  auto ctx = gloo_detail::connect_world(*shared, info, options.timeout);
  return std::make_unique<gloo_detail::GlooCommunicator>(std::move(shared), std::move(ctx), "world/", std::move(options));
}

}  // namespace zeroth
