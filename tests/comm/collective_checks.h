// Collective correctness checks every backend runs: each rank regenerates every rank's input
// from a seed, so it can verify its own results against a serial reference without gathering.
#pragma once

#include <gtest/gtest.h>

#include <malloc.h>

#include <chrono>
#include <cmath>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>

#include "comm/communicator.h"
#include "core/cpu/kernels.h"
#include "core/device.h"

namespace zeroth::testing {

// The checks allocate and free host vectors of up to 64 MiB many times; keeping freed memory in
// the heap (instead of unmapping it) spares the first-touch page faults that would dominate.
inline const bool kHeapTuned = [] {
  mallopt(M_MMAP_THRESHOLD, 32 << 20);  // glibc's maximum
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  return true;
}();

inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Rank r's input for test `salt`: values in [-2, 2), rounded to `type`, as f32.
inline std::vector<float> rank_input(int rank, size_t n, DType type, uint64_t salt) {
  std::vector<float> v(n);
  const uint64_t base = splitmix(salt * 1000003 + rank);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<float>(splitmix(base + i) >> 40) * 0x1p-22f - 2.0f;
  std::vector<uint16_t> narrow(n);
  if (type != DType::f32) {
    cpu::cast(v.data(), DType::f32, narrow.data(), type, n);
    cpu::cast(narrow.data(), type, v.data(), DType::f32, n);
  }
  return v;
}

inline std::vector<uint8_t> to_bytes(const std::vector<float>& v, DType type) {
  std::vector<uint8_t> bytes(v.size() * dtype_size(type));
  cpu::cast(v.data(), DType::f32, bytes.data(), type, v.size());
  return bytes;
}

inline std::vector<float> from_bytes(const std::vector<uint8_t>& bytes, DType type) {
  std::vector<float> v(bytes.size() / dtype_size(type));
  cpu::cast(bytes.data(), type, v.data(), DType::f32, v.size());
  return v;
}

// A device buffer with host upload/download through one stream.
struct Tensor {
  Device& device;
  Stream& stream;
  Buffer buffer;
  TensorView view;

  Tensor(Device& d, Stream& s, size_t n, DType type)
      : device(d),
        stream(s),
        buffer(d.allocate(std::max<size_t>(n * dtype_size(type), 1), MemTag::buffers)),
        view{buffer.data(), n, type} {}
  void upload(const std::vector<float>& v) {
    auto bytes = to_bytes(v, view.dtype);
    device.copy(stream, view.data, bytes.data(), bytes.size());
    stream.synchronize();
  }
  std::vector<float> download() {
    std::vector<uint8_t> bytes(view.bytes());
    device.copy(stream, bytes.data(), view.data, bytes.size());
    stream.synchronize();
    return from_bytes(bytes, view.dtype);
  }
};

// How results are compared: `exact` backends reduce in rank order with f32 accumulation, so
// they equal the serial f32 reference bit for bit; others (ring order) must be within
// n * u_f32 * sum|x| + u_type * |ref| of it.
struct CheckOptions {
  bool exact = true;
  std::vector<size_t> counts = {0, 1, 7, 13, 1000};
  size_t large_bytes = size_t{64} << 20;  // one f32 case of this many bytes per op; 0 skips
};

inline float reduce_reference(const std::vector<std::vector<float>>& inputs, size_t i, ReduceOp op, int n) {
  float acc = inputs[0][i];
  for (int p = 1; p < n; ++p) acc = op == ReduceOp::max ? std::max(acc, inputs[p][i]) : acc + inputs[p][i];
  if (op == ReduceOp::avg) acc *= 1.0f / static_cast<float>(n);
  return acc;
}

inline double unit(DType t) { return t == DType::f32 ? 0x1p-24 : t == DType::bf16 ? 0x1p-8 : 0x1p-11; }

// Compares got against the reference rounded to `type`; returns the number of mismatches.
inline size_t compare_reduced(const std::vector<float>& got, const std::vector<std::vector<float>>& inputs, size_t offset, ReduceOp op,
                              DType type, int n, bool exact, const std::string& what) {
  std::vector<float> refs(got.size());
  for (size_t i = 0; i < got.size(); ++i) refs[i] = reduce_reference(inputs, offset + i, op, n);
  const auto rounded = from_bytes(to_bytes(refs, type), type);
  size_t bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    bool ok = got[i] == rounded[i];
    if (!ok && !exact && op != ReduceOp::max) {
      double mag = 0;
      for (int p = 0; p < n; ++p) mag += std::fabs(inputs[p][offset + i]);
      if (op == ReduceOp::avg) mag /= n;
      ok = std::fabs(got[i] - refs[i]) <= (n + 1) * 0x1p-24 * mag + unit(type) * std::fabs(refs[i]) + 1e-30;
    }
    if (!ok && ++bad <= 3) ADD_FAILURE() << what << ": element " << i << " is " << got[i] << ", reference " << rounded[i];
  }
  return bad;
}

// The large case runs one variant of each op (f32, sum, out of place, root 0): it checks the
// bulk path, the small cases check the variants.
inline bool is_large(size_t count) { return count * 4 >= (size_t{1} << 20); }

inline std::vector<size_t> counts_for(const CheckOptions& o, DType type, int n) {
  auto counts = o.counts;
  if (o.large_bytes > 0 && type == DType::f32) counts.push_back(o.large_bytes / 4 / n);
  return counts;
}

inline void check_all_gather(Communicator& comm, Device& dev, Stream& s, const CheckOptions& o) {
  const int n = comm.size(), r = comm.rank();
  uint64_t salt = 1;
  for (DType type : {DType::f32, DType::bf16, DType::f16}) {
    for (size_t count : counts_for(o, type, n)) {
      for (bool in_place : {false, true}) {
        ++salt;
        if (in_place && is_large(count)) continue;
        Tensor recv(dev, s, count * n, type);
        Tensor send(dev, s, count, type);
        TensorView send_view = in_place ? recv.view.slice(r * count, count) : send.view;
        auto mine = rank_input(r, count, type, salt);
        auto bytes = to_bytes(mine, type);
        dev.copy(s, send_view.data, bytes.data(), bytes.size());
        comm.all_gather(s, send_view, recv.view);
        const auto got = recv.download();
        size_t bad = 0;
        for (int p = 0; p < n && bad == 0; ++p) {
          const auto want = rank_input(p, count, type, salt);
          for (size_t i = 0; i < count; ++i) {
            if (got[p * count + i] != want[i] && ++bad <= 3) {
              ADD_FAILURE() << "all_gather " << dtype_name(type) << " count " << count << (in_place ? " in place" : "") << ": rank "
                            << r << " has " << got[p * count + i] << " at [" << p << "][" << i << "], rank " << p << " sent "
                            << want[i];
            }
          }
        }
        ASSERT_EQ(bad, 0u);
      }
    }
  }
}

inline void check_reduce_scatter(Communicator& comm, Device& dev, Stream& s, const CheckOptions& o) {
  const int n = comm.size(), r = comm.rank();
  uint64_t salt = 100;
  for (DType type : {DType::f32, DType::bf16, DType::f16}) {
    for (size_t count : counts_for(o, type, n)) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        ++salt;
        if (op != ReduceOp::sum && is_large(count)) continue;
        Tensor send(dev, s, count * n, type), recv(dev, s, count, type);
        send.upload(rank_input(r, count * n, type, salt));
        comm.reduce_scatter(s, send.view, recv.view, op);
        std::vector<std::vector<float>> inputs;
        for (int p = 0; p < n; ++p) inputs.push_back(rank_input(p, count * n, type, salt));
        const auto what = fmt::format("reduce_scatter {} {} count {} rank {}", reduce_op_name(op), dtype_name(type), count, r);
        ASSERT_EQ(compare_reduced(recv.download(), inputs, r * count, op, type, n, o.exact, what), 0u) << what;
      }
    }
  }
}

inline void check_all_reduce(Communicator& comm, Device& dev, Stream& s, const CheckOptions& o) {
  const int n = comm.size(), r = comm.rank();
  uint64_t salt = 200;
  for (DType type : {DType::f32, DType::bf16, DType::f16}) {
    for (size_t count : counts_for(o, type, n)) {
      for (ReduceOp op : {ReduceOp::sum, ReduceOp::avg, ReduceOp::max}) {
        ++salt;
        if (op != ReduceOp::sum && is_large(count)) continue;
        const size_t total = count * n + (count % 3);  // not divisible by the world size
        Tensor data(dev, s, total, type);
        data.upload(rank_input(r, total, type, salt));
        comm.all_reduce(s, data.view, op);
        std::vector<std::vector<float>> inputs;
        for (int p = 0; p < n; ++p) inputs.push_back(rank_input(p, total, type, salt));
        const auto what = fmt::format("all_reduce {} {} count {} rank {}", reduce_op_name(op), dtype_name(type), total, r);
        ASSERT_EQ(compare_reduced(data.download(), inputs, 0, op, type, n, o.exact, what), 0u) << what;
      }
    }
  }
}

inline void check_broadcast(Communicator& comm, Device& dev, Stream& s, const CheckOptions& o) {
  const int n = comm.size(), r = comm.rank();
  uint64_t salt = 300;
  for (DType type : {DType::f32, DType::bf16}) {
    for (size_t count : counts_for(o, type, n)) {
      for (int root = 0; root < n; ++root) {
        ++salt;
        if (root > 0 && is_large(count)) continue;
        Tensor data(dev, s, count, type);
        data.upload(r == root ? rank_input(root, count, type, salt) : std::vector<float>(count, -7.0f));
        comm.broadcast(s, data.view, root);
        ASSERT_EQ(data.download(), rank_input(root, count, type, salt)) << "broadcast from " << root << " to " << r;
      }
    }
  }
}

// Each rank sends to its right neighbour and receives from its left; even ranks send first.
inline void check_send_recv(Communicator& comm, Device& dev, Stream& s, const CheckOptions& o) {
  const int n = comm.size(), r = comm.rank();
  if (n == 1) return;
  uint64_t salt = 400;
  for (DType type : {DType::f32, DType::f16}) {
    for (size_t count : counts_for(o, type, n)) {
      ++salt;
      Tensor out(dev, s, count, type), in(dev, s, count, type);
      out.upload(rank_input(r, count, type, salt));
      const int right = (r + 1) % n, left = (r + n - 1) % n;
      if (r % 2 == 0) {
        comm.send(s, out.view, right);
        comm.recv(s, in.view, left);
      } else {
        comm.recv(s, in.view, left);
        comm.send(s, out.view, right);
      }
      ASSERT_EQ(in.download(), rank_input(left, count, type, salt)) << "rank " << r << " from " << left;
    }
  }
}

// The last rank to reach the barrier arrives 200 ms late; nobody may leave before it arrives.
inline void check_barrier(Communicator& comm, Device&, Stream& s) {
  using namespace std::chrono;
  const int late = comm.size() - 1;
  const auto start = steady_clock::now();
  if (comm.rank() == late) std::this_thread::sleep_for(200ms);
  comm.barrier(s);
  s.synchronize();
  const auto waited = duration_cast<milliseconds>(steady_clock::now() - start).count();
  if (comm.size() > 1) {
    EXPECT_GE(waited, 150) << "rank " << comm.rank() << " left the barrier before rank " << late << " arrived";
  }
}

// Equal splits: rank r's chunk p lands in rank p's chunk r, bit for bit.
inline void check_all_to_all(Communicator& comm, Device& dev, Stream& s, const CheckOptions& o) {
  const int n = comm.size(), r = comm.rank();
  uint64_t salt = 500;
  for (DType type : {DType::f32, DType::bf16, DType::f16}) {
    for (size_t count : counts_for(o, type, n)) {
      ++salt;
      Tensor send(dev, s, count * n, type), recv(dev, s, count * n, type);
      send.upload(rank_input(r, count * n, type, salt));
      recv.upload(std::vector<float>(count * n, -7.0f));
      comm.all_to_all(s, send.view, recv.view);
      const auto got = recv.download();
      for (int p = 0; p < n; ++p) {
        const auto theirs = rank_input(p, (r + 1) * count, type, salt);  // a prefix of rank p's input
        const std::vector<float> want(theirs.begin() + r * count, theirs.begin() + (r + 1) * count);
        ASSERT_EQ(std::vector<float>(got.begin() + p * count, got.begin() + (p + 1) * count), want)
            << "all_to_all " << dtype_name(type) << " count " << count << ": rank " << r << "'s chunk from rank " << p;
      }
    }
  }
}

// Uneven splits, zero-sized ones among them, the extreme of routing (every rank sends everything
// to one rank), and ranks with empty buffers (the last rank sends and receives nothing, through
// 0-element tensors, while the others' buffers are exactly full). Each rank's counts come from a
// formula every rank can evaluate, and the result is the direct permutation of everyone's
// inputs; room past what arrives is untouched.
inline void check_all_to_allv(Communicator& comm, Device& dev, Stream& s, const CheckOptions& o) {
  const int n = comm.size(), r = comm.rank();
  uint64_t salt = 600;
  enum class Pattern { uneven, to_one, one_idle };
  for (DType type : {DType::f32, DType::bf16, DType::f16}) {
    for (size_t scale : o.counts) {
      for (Pattern pattern : {Pattern::uneven, Pattern::to_one, Pattern::one_idle}) {
        ++salt;
        auto counts_of = [&](int from) {
          std::vector<size_t> c(n, 0);
          for (int to = 0; to < n; ++to) {
            if (pattern == Pattern::to_one) c[to] = to == static_cast<int>(salt % n) ? scale + from : 0;
            else if (pattern == Pattern::one_idle) c[to] = from == n - 1 || to == n - 1 ? 0 : scale + from + to;
            else c[to] = (from * 3 + to * 5 + salt) % 4 == 0 ? 0 : scale * ((from + 2 * to) % 3) + to;
          }
          return c;
        };
        auto total = [](const std::vector<size_t>& c) {
          size_t t = 0;
          for (size_t x : c) t += x;
          return t;
        };
        const auto mine = counts_of(r);
        size_t arriving = 0;
        for (int p = 0; p < n; ++p) arriving += counts_of(p)[r];
        const size_t slack = pattern == Pattern::one_idle ? 0 : 3, spare = pattern == Pattern::one_idle ? 0 : 1;
        Tensor send(dev, s, total(mine) + spare, type), recv(dev, s, arriving + slack, type);
        send.upload(rank_input(r, total(mine) + spare, type, salt));
        recv.upload(std::vector<float>(arriving + slack, -7.0f));
        const auto got_counts = comm.all_to_allv(s, send.view, mine, recv.view);
        const auto got = recv.download();
        size_t at = 0;
        for (int p = 0; p < n; ++p) {
          const auto theirs = counts_of(p);
          ASSERT_EQ(got_counts[p], theirs[r]) << "all_to_allv: rank " << r << "'s count from rank " << p;
          size_t from = 0;
          for (int q = 0; q < r; ++q) from += theirs[q];
          const auto input = rank_input(p, total(theirs), type, salt);
          ASSERT_EQ(std::vector<float>(got.begin() + at, got.begin() + at + theirs[r]),
                    std::vector<float>(input.begin() + from, input.begin() + from + theirs[r]))
              << "all_to_allv " << dtype_name(type) << " scale " << scale << ": rank " << r << "'s piece from rank " << p;
          at += theirs[r];
        }
        ASSERT_EQ(std::vector<float>(got.begin() + at, got.end()), std::vector<float>(slack, -7.0f))
            << "all_to_allv wrote past what arrived on rank " << r;
      }
    }
  }
}

inline void check_everything(Communicator& comm, Device& dev, Stream& s, const CheckOptions& o) {
  check_all_gather(comm, dev, s, o);
  check_reduce_scatter(comm, dev, s, o);
  check_all_reduce(comm, dev, s, o);
  check_broadcast(comm, dev, s, o);
  check_send_recv(comm, dev, s, o);
  check_all_to_all(comm, dev, s, o);
  check_all_to_allv(comm, dev, s, o);
  check_barrier(comm, dev, s);
}

}  // namespace zeroth::testing
