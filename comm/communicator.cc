// The validating front of every communicator: argument checks, numbering, byte counts.
#include "comm/communicator.h"

#include <iterator>  // std::size

#include "core/env.h"
#include "core/error.h"

namespace zeroth {

std::string_view collective_name(CollectiveOp op) {
  constexpr std::string_view kNames[] = {"all_gather", "reduce_scatter", "all_reduce", "broadcast",  "send",
                                         "recv",       "barrier",        "split",      "all_to_all", "all_to_allv"};
  static_assert(std::size(kNames) == kCollectiveOpCount);
  return kNames[static_cast<size_t>(op)];
}

std::string_view reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::sum: return "sum";
    case ReduceOp::avg: return "avg";
    case ReduceOp::max: return "max";
  }
  return "invalid";
}

ReduceOp parse_reduce_op(std::string_view name) {
  if (name == "sum") return ReduceOp::sum;
  if (name == "avg" || name == "mean") return ReduceOp::avg;
  if (name == "max") return ReduceOp::max;
  ZEROTH_THROW(InvalidArgument, "unknown reduction '{}' (use sum, avg or max)", name);
}

CommOptions CommOptions::from_env() {
  CommOptions o;
  if (auto seconds = env::get_int(env::kCommTimeout)) {
    if (*seconds <= 0) ZEROTH_THROW(ConfigError, "{} must be a positive number of seconds, got {}", env::kCommTimeout, *seconds);
    o.timeout = std::chrono::seconds(*seconds);
  }
  if (auto check = env::get(env::kCommCheck)) o.check_desync = *check != "0";
  return o;
}

std::string Descriptor::describe() const {
  const std::string counted = op == CollectiveOp::all_to_allv ? std::string("counts exchanged") : fmt::format("count={}", count);
  std::string text = fmt::format("#{} {}({}, {}", sequence, collective_name(op), counted, dtype_name(dtype));
  if (op == CollectiveOp::all_reduce || op == CollectiveOp::reduce_scatter) text += fmt::format(", {}", reduce_op_name(reduce));
  if (op == CollectiveOp::broadcast) text += fmt::format(", root={}", root);
  if (op == CollectiveOp::send || op == CollectiveOp::recv) text += fmt::format(", peer={}", root);
  return text + ")";
}

uint64_t CommStats::total_bytes() const {
  uint64_t total = 0;
  for (auto b : bytes) total += b;
  return total;
}

Descriptor Communicator::begin(CollectiveOp op, uint64_t count, DType dtype, ReduceOp reduce, int root, uint64_t bytes,
                               uint64_t bus_bytes) {
  std::lock_guard lock(stats_mutex_);
  const auto i = static_cast<size_t>(op);
  ++stats_.calls[i];
  stats_.bytes[i] += bytes;
  stats_.bus_bytes[i] += bus_bytes;
  return Descriptor{++sequence_, op, count, dtype, reduce, root};
}

void Communicator::abort(const std::string&) {}

CommStats Communicator::stats() const {
  std::lock_guard lock(stats_mutex_);
  return stats_;
}

namespace {
uint64_t ring_share(uint64_t bytes, int n) { return n <= 1 ? 0 : bytes * (n - 1) / n; }

bool overlap(TensorView a, TensorView b) {
  const auto* x = static_cast<const char*>(a.data);
  const auto* y = static_cast<const char*>(b.data);
  return a.numel > 0 && b.numel > 0 && x < y + b.bytes() && y < x + a.bytes();
}
}  // namespace

void Communicator::all_gather(Stream& stream, TensorView send, TensorView recv) {
  ZEROTH_CHECK(send.dtype == recv.dtype, "all_gather: send is {}, recv is {}", dtype_name(send.dtype), dtype_name(recv.dtype));
  ZEROTH_CHECK(recv.numel == send.numel * size(), "all_gather: recv has {} elements, expected size {} x send {} = {}", recv.numel,
               size(), send.numel, send.numel * size());
  const uint64_t bytes = recv.bytes();
  do_all_gather(stream, send, recv,
                begin(CollectiveOp::all_gather, send.numel, send.dtype, ReduceOp::sum, -1, bytes, ring_share(bytes, size())));
}

void Communicator::reduce_scatter(Stream& stream, TensorView send, TensorView recv, ReduceOp op) {
  ZEROTH_CHECK(send.dtype == recv.dtype, "reduce_scatter: send is {}, recv is {}", dtype_name(send.dtype), dtype_name(recv.dtype));
  ZEROTH_CHECK(send.numel == recv.numel * size(), "reduce_scatter: send has {} elements, expected size {} x recv {} = {}", send.numel,
               size(), recv.numel, recv.numel * size());
  const uint64_t bytes = send.bytes();
  do_reduce_scatter(stream, send, recv,
                    begin(CollectiveOp::reduce_scatter, recv.numel, send.dtype, op, -1, bytes, ring_share(bytes, size())));
}

void Communicator::all_reduce(Stream& stream, TensorView data, ReduceOp op) {
  const uint64_t bytes = 2 * data.bytes();
  do_all_reduce(stream, data, begin(CollectiveOp::all_reduce, data.numel, data.dtype, op, -1, bytes, ring_share(bytes, size())));
}

void Communicator::broadcast(Stream& stream, TensorView data, int root) {
  ZEROTH_CHECK(root >= 0 && root < size(), "broadcast: root {} is not a rank of this communicator (size {})", root, size());
  do_broadcast(stream, data, begin(CollectiveOp::broadcast, data.numel, data.dtype, ReduceOp::sum, root, data.bytes(), data.bytes()));
}

void Communicator::send(Stream& stream, TensorView data, int peer) {
  ZEROTH_CHECK(peer >= 0 && peer < size() && peer != rank(),
               "send: peer {} is not another rank of this communicator (rank {}, size {})", peer, rank(), size());
  do_send(stream, data, begin(CollectiveOp::send, data.numel, data.dtype, ReduceOp::sum, peer, data.bytes(), data.bytes()));
}

void Communicator::recv(Stream& stream, TensorView data, int peer) {
  ZEROTH_CHECK(peer >= 0 && peer < size() && peer != rank(),
               "recv: peer {} is not another rank of this communicator (rank {}, size {})", peer, rank(), size());
  do_recv(stream, data, begin(CollectiveOp::recv, data.numel, data.dtype, ReduceOp::sum, peer, data.bytes(), data.bytes()));
}

void Communicator::barrier(Stream& stream) {
  do_barrier(stream, begin(CollectiveOp::barrier, 0, DType::f32, ReduceOp::sum, -1, 0, 0));
}

void Communicator::all_to_all(Stream& stream, TensorView send, TensorView recv) {
  const size_t n = size();
  ZEROTH_CHECK(send.dtype == recv.dtype, "all_to_all: send is {}, recv is {}", dtype_name(send.dtype), dtype_name(recv.dtype));
  ZEROTH_CHECK(send.numel == recv.numel && send.numel % n == 0,
               "all_to_all: send has {} elements and recv {}; both must be the same multiple of the size {}", send.numel, recv.numel,
               n);
  ZEROTH_CHECK(!overlap(send, recv), "all_to_all: send ({} bytes at {}) and recv ({} bytes at {}) overlap", send.bytes(), send.data,
               recv.bytes(), recv.data);
  const size_t k = send.numel / n;
  AllToAllSplits splits;
  for (size_t p = 0; p < n; ++p) {
    splits.send_offsets.push_back(p * k);
    splits.recv_offsets.push_back(p * k);
    splits.peer_offsets.push_back(rank() * k);
  }
  splits.send_counts.assign(n, k);
  splits.recv_counts.assign(n, k);
  const uint64_t bytes = send.bytes();
  do_all_to_all(stream, send, recv, splits,
                begin(CollectiveOp::all_to_all, k, send.dtype, ReduceOp::sum, -1, bytes, ring_share(bytes, size())));
}

std::vector<size_t> Communicator::all_to_allv(Stream& stream, TensorView send, std::span<const size_t> send_counts, TensorView recv) {
  const size_t n = size(), me = rank();
  // This rank's own argument errors travel with its row, so that every rank stops at the same
  // point instead of waiting for one that threw before the exchange.
  std::string refused;
  size_t total = 0;
  for (size_t c : send_counts) total += c;
  if (send.dtype != recv.dtype) {
    refused = fmt::format("send is {}, recv is {}", dtype_name(send.dtype), dtype_name(recv.dtype));
  } else if (send_counts.size() != n) {
    refused = fmt::format("{} send counts for {} ranks", send_counts.size(), n);
  } else if (total > send.numel) {
    refused = fmt::format("the send counts add up to {} elements but send holds {}", total, send.numel);
  } else if (overlap(send, recv)) {
    refused = fmt::format("send ({} bytes at {}) and recv ({} bytes at {}) overlap", send.bytes(), send.data, recv.bytes(), recv.data);
  }
  const size_t esize = dtype_size(send.dtype);
  const size_t to_others = refused.empty() ? total - send_counts[me] : 0;
  const Descriptor d = begin(CollectiveOp::all_to_allv, 0, send.dtype, ReduceOp::sum, -1, total * esize, to_others * esize);
  // Each rank's row: what it sends to every rank, the room it has, and whether it refused.
  std::vector<uint64_t> row(n + 2, 0);
  if (refused.empty()) std::copy(send_counts.begin(), send_counts.end(), row.begin());
  row[n] = recv.numel;
  row[n + 1] = refused.empty() ? 0 : 1;
  const auto rows = do_gather_rows(stream, row, d);
  ZEROTH_CHECK(rows.size() == n * (n + 2), "all_to_allv: the count exchange returned {} values, expected {}", rows.size(),
               n * (n + 2));
  if (!refused.empty()) ZEROTH_THROW(InvalidArgument, "all_to_allv (#{}) on rank {}: {}", d.sequence, me, refused);
  for (size_t q = 0; q < n; ++q) {
    if (rows[q * (n + 2) + n + 1] != 0) {
      ZEROTH_THROW(CommError, "all_to_allv (#{}): rank {} refused its arguments (its own error says why); nothing was sent",
                   d.sequence, q);
    }
  }
  auto sent = [&](size_t from, size_t to) { return static_cast<size_t>(rows[from * (n + 2) + to]); };
  for (size_t q = 0; q < n; ++q) {
    size_t arriving = 0;
    std::string senders;
    for (size_t p = 0; p < n; ++p) {
      arriving += sent(p, q);
      if (sent(p, q) > 0) senders += fmt::format("{}{} from rank {}", senders.empty() ? "" : ", ", sent(p, q), p);
    }
    if (arriving > rows[q * (n + 2) + n]) {
      ZEROTH_THROW(CommError, "all_to_allv (#{}): rank {} has room for {} elements but {} are sent to it ({}); give it a larger recv",
                   d.sequence, q, rows[q * (n + 2) + n], arriving, senders);
    }
  }
  AllToAllSplits splits;
  size_t send_at = 0, recv_at = 0;
  for (size_t p = 0; p < n; ++p) {
    splits.send_offsets.push_back(send_at);
    splits.send_counts.push_back(sent(me, p));
    send_at += sent(me, p);
    splits.recv_offsets.push_back(recv_at);
    splits.recv_counts.push_back(sent(p, me));
    recv_at += sent(p, me);
    size_t peer_at = 0;
    for (size_t q = 0; q < me; ++q) peer_at += sent(p, q);
    splits.peer_offsets.push_back(peer_at);
  }
  do_all_to_all(stream, send, recv, splits, d);
  return splits.recv_counts;
}

std::unique_ptr<Communicator> Communicator::split(int color, int key) {
  return do_split(color, key, begin(CollectiveOp::split, 0, DType::f32, ReduceOp::sum, -1, 0, 0));
}

void Communicator::check_same(const Descriptor& mine, int my_rank, const Descriptor& theirs, int their_rank,
                              std::string_view backend) {
  // Point-to-point ops are matched pairwise, not group-wide: compare only what both must agree on.
  if (mine == theirs) return;
  ZEROTH_THROW(CommError, "collective desync on the {} communicator: rank {} issued {} while rank {} issued {}", backend, my_rank,
               mine.describe(), their_rank, theirs.describe());
}

std::chrono::nanoseconds Communicator::modeled_time(uint64_t bus_bytes) const {
  const auto& link = options_.link;
  double seconds = link.latency_us * 1e-6;
  if (link.bandwidth_gbps > 0) seconds += static_cast<double>(bus_bytes) / (link.bandwidth_gbps * 1e9);
  return std::chrono::nanoseconds(static_cast<int64_t>(seconds * 1e9));
}

}  // namespace zeroth
