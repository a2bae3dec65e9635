// The Communicator: collectives enqueued on a stream that complete in stream order (NCCL
// semantics), numbered per communicator, with the bytes each op moves counted.
#pragma once

#include <array>        // std::array
#include <chrono>       // std::chrono::milliseconds
#include <cstdint>      // uint64_t
#include <memory>       // std::unique_ptr
#include <mutex>        // std::mutex
#include <string>       // std::string
#include <span>         // std::span
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "core/device.h"  // Stream, TensorView

namespace zeroth {

enum class ReduceOp : uint8_t { sum, avg, max };
enum class CollectiveOp : uint8_t {
  all_gather,
  reduce_scatter,
  all_reduce,
  broadcast,
  send,
  recv,
  barrier,
  split,
  all_to_all,
  all_to_allv
};
inline constexpr size_t kCollectiveOpCount = 10;
std::string_view collective_name(CollectiveOp op);
std::string_view reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view name);

// Makes each collective take at least the time a real link would (latency + bus bytes over
// bandwidth), so that overlap of communication with compute can be measured on CPUs.
struct LinkModel {
  double latency_us = 0;
  double bandwidth_gbps = 0;  // 0: no model
  // Only the all-to-alls held (the experts' exchanges timed apart from the gradients' collectives).
  bool all_to_all_only = false;
  bool enabled() const { return bandwidth_gbps > 0 || latency_us > 0; }
  bool holds(CollectiveOp op) const {
    return enabled() && (!all_to_all_only || op == CollectiveOp::all_to_all || op == CollectiveOp::all_to_allv);
  }
};

struct CommOptions {
  std::chrono::milliseconds timeout{300'000};  // a peer that does not arrive in time is an error
  bool check_desync = false;                   // compare (sequence, op, count, dtype) before each op
  LinkModel link;
  // Defaults overridden by ZEROTH_COMM_TIMEOUT (seconds) and ZEROTH_COMM_CHECK=1.
  static CommOptions from_env();
};

// What one collective is, as every rank must agree: compared across ranks for desync checks.
struct Descriptor {
  uint64_t sequence = 0;
  CollectiveOp op = CollectiveOp::barrier;
  // Elements per rank (send count; recv count for recv; each rank's share for all_to_all); 0 for
  // all_to_allv, whose counts differ by rank.
  uint64_t count = 0;
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int32_t root = -1;  // broadcast root, or the peer of send/recv
  bool operator==(const Descriptor&) const = default;
  std::string describe() const;  // "#12 all_gather(count=1024, bf16)"
};

struct CommStats {
  // Per op: calls, logical bytes (the ZeRO paper's volume: all_gather counts the gathered
  // buffer, reduce_scatter the input, all_reduce twice its buffer, all_to_all(v) what this rank
  // sends), and bus bytes (what this rank's link carries in a ring: (n-1)/n of the logical
  // bytes; for all_to_all(v), what it sends to other ranks).
  std::array<uint64_t, kCollectiveOpCount> calls{};
  std::array<uint64_t, kCollectiveOpCount> bytes{};
  std::array<uint64_t, kCollectiveOpCount> bus_bytes{};
  uint64_t total_bytes() const;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string_view backend() const = 0;

  // recv.numel == size() * send.numel; rank r's send lands at recv[r * send.numel]. send may be
  // that slice of recv (in place).
  void all_gather(Stream& stream, TensorView send, TensorView recv);
  // send.numel == size() * recv.numel; rank r receives the reduction of everyone's slice r.
  // recv may be that slice of send. bf16/f16 accumulate in f32.
  void reduce_scatter(Stream& stream, TensorView send, TensorView recv, ReduceOp op);
  void all_reduce(Stream& stream, TensorView data, ReduceOp op);
  void broadcast(Stream& stream, TensorView data, int root);
  // Point to point; a send is matched by the peer's recv with the same count and dtype.
  void send(Stream& stream, TensorView data, int peer);
  void recv(Stream& stream, TensorView data, int peer);
  // Completes in stream order once every rank's stream has reached it.
  void barrier(Stream& stream);
  // Equal splits: send.numel == recv.numel == size() * k; rank r's send[p * k, (p + 1) * k) lands
  // at rank p's recv[r * k, (r + 1) * k). send and recv must not overlap.
  void all_to_all(Stream& stream, TensorView send, TensorView recv);
  // Uneven splits, sizes exchanged first: send_counts[p] elements go to rank p, taken from send in
  // rank order; what rank q sends here lands in recv in rank order, packed from its start. The
  // counts (size() entries) are read on the calling thread, which blocks until every rank has
  // called (as torch's all_to_all_single needs its split sizes on the host); returns how many
  // elements came from each rank. The data moves in stream order. Every rank checks every rank's
  // room and arguments, so a recv too small for what is sent to it, or a rank's bad arguments,
  // end every rank with an error (naming the rank) before anything moves.
  std::vector<size_t> all_to_allv(Stream& stream, TensorView send, std::span<const size_t> send_counts, TensorView recv);
  // Collective: ranks passing the same color >= 0 form a new communicator, ordered by (key, rank);
  // a negative color joins none and gets nullptr.
  std::unique_ptr<Communicator> split(int color, int key);

  CommStats stats() const;
  const CommOptions& options() const { return options_; }
  // Fails every op waiting on this communicator, on every rank of it, with `reason`: a rank that
  // cannot go on tells its peers at once instead of leaving them to their timeout. Local groups
  // fail their waits (and those of groups split from them); gloo and NCCL ranks are processes,
  // whose peers learn of their end from the transport (closed connections, NCCL's watchdog), so
  // theirs does nothing more.
  virtual void abort(const std::string& reason);

 protected:
  explicit Communicator(CommOptions options) : options_(std::move(options)) {}

  virtual void do_all_gather(Stream& stream, TensorView send, TensorView recv, const Descriptor& d) = 0;
  virtual void do_reduce_scatter(Stream& stream, TensorView send, TensorView recv, const Descriptor& d) = 0;
  virtual void do_all_reduce(Stream& stream, TensorView data, const Descriptor& d) = 0;
  virtual void do_broadcast(Stream& stream, TensorView data, const Descriptor& d) = 0;
  virtual void do_send(Stream& stream, TensorView data, const Descriptor& d) = 0;
  virtual void do_recv(Stream& stream, TensorView data, const Descriptor& d) = 0;
  virtual void do_barrier(Stream& stream, const Descriptor& d) = 0;
  virtual std::unique_ptr<Communicator> do_split(int color, int key, const Descriptor& d) = 0;

  // Where an all_to_all(v) moves elements, for this rank: to rank p, send[send_offsets[p]] on,
  // send_counts[p] of them; from rank p, recv_counts[p] elements into recv[recv_offsets[p]] on,
  // which rank p holds at its send[peer_offsets[p]] (for backends that read peers' memory).
  struct AllToAllSplits {
    std::vector<size_t> send_offsets, send_counts, recv_offsets, recv_counts, peer_offsets;
  };
  virtual void do_all_to_all(Stream& stream, TensorView send, TensorView recv, const AllToAllSplits& splits, const Descriptor& d) = 0;
  // all_to_allv's first half: every rank's `row` (equal lengths) gathered in rank order, blocking
  // the calling thread (work already on `stream` may have to run first).
  virtual std::vector<uint64_t> do_gather_rows(Stream& stream, std::span<const uint64_t> row, const Descriptor& d) = 0;

  // Throws CommError when two ranks' descriptors differ, naming both.
  static void check_same(const Descriptor& mine, int my_rank, const Descriptor& theirs, int their_rank, std::string_view backend);
  // Wall-clock time the link model says an op of `bus_bytes` takes.
  std::chrono::nanoseconds modeled_time(uint64_t bus_bytes) const;

  CommOptions options_;

 private:
  Descriptor begin(CollectiveOp op, uint64_t count, DType dtype, ReduceOp reduce, int root, uint64_t bytes, uint64_t bus_bytes);

  mutable std::mutex stats_mutex_;
  CommStats stats_;
  uint64_t sequence_ = 0;
};

}  // namespace zeroth
