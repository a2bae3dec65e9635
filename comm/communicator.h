// The Communicator: collectives enqueued on a stream that complete in stream order (NCCL
// semantics), numbered per communicator, with the bytes each op moves counted.
#pragma once

#include <array>        // std::array
#include <chrono>       // std::chrono::milliseconds
#include <cstdint>      // uint64_t
#include <memory>       // std::unique_ptr
#include <mutex>        // std::mutex
#include <string>       // std::string
#include <string_view>  // std::string_view

#include "core/device.h"  // Stream, TensorView

namespace zeroth {

enum class ReduceOp : uint8_t { sum, avg, max };
enum class CollectiveOp : uint8_t { all_gather, reduce_scatter, all_reduce, broadcast, send, recv, barrier, split };
inline constexpr size_t kCollectiveOpCount = 8;
std::string_view collective_name(CollectiveOp op);
std::string_view reduce_op_name(ReduceOp op);
ReduceOp parse_reduce_op(std::string_view name);

// Makes each collective take at least the time a real link would (latency + bus bytes over
// bandwidth), so that overlap of communication with compute can be measured on CPUs.
struct LinkModel {
  double latency_us = 0;
  double bandwidth_gbps = 0;  // 0: no model
  bool enabled() const { return bandwidth_gbps > 0 || latency_us > 0; }
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
  uint64_t count = 0;  // elements per rank (send count; recv count for recv)
  DType dtype = DType::f32;
  ReduceOp reduce = ReduceOp::sum;
  int32_t root = -1;  // broadcast root, or the peer of send/recv
  bool operator==(const Descriptor&) const = default;
  std::string describe() const;  // "#12 all_gather(count=1024, bf16)"
};

struct CommStats {
  // Per op: calls, logical bytes (the ZeRO paper's volume: all_gather counts the gathered
  // buffer, reduce_scatter the input, all_reduce twice its buffer), and bus bytes (what this
  // rank's link carries in a ring: (n-1)/n of the logical bytes).
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
