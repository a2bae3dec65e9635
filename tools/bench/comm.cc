// `zeroth bench comm`: nccl-tests' table (size, count, type, time, algbw, busbw) for all_gather,
// reduce_scatter, all_reduce and all_to_all (equal splits, and as all_to_allv) on one backend, next to the ceiling measured in the
// same run: memcpy of the same bytes for `local`, a plain TCP stream over loopback for `gloo`.
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "comm/gloo/gloo_comm.h"
#include "comm/local/local_comm.h"
#include "comm/nccl/nccl_comm.h"
#include "comm/rendezvous.h"
#include "core/error.h"
#include "core/memory.h"
#include "tools/bench/bench.h"
#include "tools/launch/launcher.h"

namespace zeroth::tools {
namespace bench_comm {

using clock = std::chrono::steady_clock;

struct Options {
  std::string backend = "local";
  int ranks = 4;
  std::string min_bytes = "1KiB";
  std::string max_bytes = "256MiB";
  std::string dtype = "f32";
  bool json = false;
};

struct Row {
  std::string op;
  bool in_place = false;
  size_t bytes = 0;
  size_t count = 0;
  double time_us = 0, algbw = 0, busbw = 0;
};

double seconds_since(clock::time_point t0) { return std::chrono::duration<double>(clock::now() - t0).count(); }

double concurrent_memcpy_gbps(int threads, size_t collective_bytes);

// memcpy GB/s (bytes copied per second) of `bytes` on one thread, median of 5 after a warm-up.
double memcpy_gbps(size_t bytes) { return concurrent_memcpy_gbps(1, bytes); }

// The local ceiling, in busbw's units (bytes each rank receives per second): `threads` threads
// (one per rank, sharing the memory system as the ranks do) each memcpy the bytes a rank
// receives in a collective of `collective_bytes`, all at once. Median of 5 after a warm-up.
double concurrent_memcpy_gbps(int threads, size_t collective_bytes) {
  const size_t bytes = threads > 1 ? collective_bytes / threads * (threads - 1) : collective_bytes;
  std::vector<std::vector<char>> src(threads, std::vector<char>(bytes, 1)), dst(threads, std::vector<char>(bytes, 2));
  std::vector<double> times;
  for (int rep = 0; rep < 6; ++rep) {
    const auto t0 = clock::now();
    std::vector<std::thread> pool;
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { std::memcpy(dst[t].data(), src[t].data(), bytes); });
    for (auto& th : pool) th.join();
    if (rep > 0) times.push_back(seconds_since(t0));
  }
  std::sort(times.begin(), times.end());
  return bytes / times[times.size() / 2] / 1e9;
}

// `streams` TCP connections over loopback at once, each with a writer and a reader thread, each
// carrying `bytes`: with one stream, the most a byte stream between two processes on this host
// can carry; with one stream per rank, what each rank's link gets when all ranks send at once
// (as in a ring step). Returns GB/s per stream.
double loopback_tcp_gbps(int streams, size_t bytes) {
  struct Pair {
    int listener = -1, writer = -1, reader = -1;
  };
  std::vector<Pair> pairs(streams);
  for (auto& p : pairs) {
    p.listener = SYSCALL_CHECK(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    SYSCALL_CHECK(::bind(p.listener, reinterpret_cast<sockaddr*>(&addr), sizeof addr));
    socklen_t len = sizeof addr;
    SYSCALL_CHECK(::getsockname(p.listener, reinterpret_cast<sockaddr*>(&addr), &len));
    SYSCALL_CHECK(::listen(p.listener, 1));
    p.writer = SYSCALL_CHECK(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    SYSCALL_CHECK(::connect(p.writer, reinterpret_cast<sockaddr*>(&addr), sizeof addr));
    p.reader = SYSCALL_CHECK(::accept(p.listener, nullptr, nullptr));
  }
  std::vector<std::thread> threads;
  const auto t0 = clock::now();
  for (auto& p : pairs) {
    threads.emplace_back([&p, bytes] {
      std::vector<char> buf(size_t{1} << 20, 7);
      for (size_t sent = 0; sent < bytes;) {
        const ssize_t n = ::send(p.writer, buf.data(), std::min(buf.size(), bytes - sent), MSG_NOSIGNAL);
        if (n <= 0) break;
        sent += static_cast<size_t>(n);
      }
    });
    threads.emplace_back([&p, bytes] {
      std::vector<char> buf(size_t{1} << 20);
      for (size_t got = 0; got < bytes;) {
        const ssize_t n = ::recv(p.reader, buf.data(), buf.size(), 0);
        if (n <= 0) break;
        got += static_cast<size_t>(n);
      }
    });
  }
  for (auto& t : threads) t.join();
  const double gbps = bytes / seconds_since(t0) / 1e9;
  for (auto& p : pairs) ::close(p.writer), ::close(p.reader), ::close(p.listener);
  return gbps;
}

// Runs every op and size on this rank; every rank returns the same rows (times are the maximum
// over ranks, as the slowest rank decides when a collective is done).
std::vector<Row> run_rank(Communicator& comm, Device& device, const Options& o) {
  auto stream = device.create_stream();
  const DType type = parse_dtype(o.dtype);
  const size_t esize = dtype_size(type), n = comm.size();
  const size_t min_bytes = std::max(parse_bytes(o.min_bytes), esize * n);
  const size_t max_bytes = parse_bytes(o.max_bytes);
  Buffer timing = device.allocate(sizeof(float), MemTag::buffers);
  std::vector<Row> rows;
  // As nccl-tests: out of place, then in place (the send buffer is this rank's slice of the
  // receive buffer for all_gather, the receive buffer is its slice of the input for
  // reduce_scatter; ZeRO's gathers and scatters are in place). all_reduce is always in place,
  // all_to_all always out of place; all_to_allv sends the same equal splits, so its row against
  // all_to_all's is the price of exchanging the counts first.
  struct Variant {
    const char* op;
    bool in_place;
  };
  for (const auto [op, in_place] :
       {Variant{"all_gather", false}, Variant{"all_gather", true}, Variant{"reduce_scatter", false}, Variant{"reduce_scatter", true},
        Variant{"all_reduce", true}, Variant{"all_to_all", false}, Variant{"all_to_allv", false}}) {
    const bool to_all = std::string_view(op).starts_with("all_to_all");
    for (size_t bytes = min_bytes; bytes <= max_bytes; bytes *= 2) {
      // nccl-tests' sizes: the gathered buffer, the scattered input, the reduced buffer, the
      // all-to-all's send buffer.
      const size_t count = bytes / esize / n * n;
      if (count == 0) continue;
      Buffer big = device.allocate(count * esize, MemTag::buffers);
      const size_t small_count = to_all ? count : count / n;
      Buffer small = device.allocate(small_count * esize, MemTag::buffers);
      device.fill(*stream, {big.data(), count, type}, 1.0f);
      device.fill(*stream, {small.data(), small_count, type}, 1.0f);
      const std::vector<size_t> splits(n, count / n);
      const TensorView whole{big.data(), count, type};
      const TensorView part = in_place && std::string_view(op) != "all_reduce" ? whole.slice(comm.rank() * (count / n), count / n)
                                                                               : TensorView{small.data(), count / n, type};
      auto once = [&] {
        if (std::string_view(op) == "all_gather") comm.all_gather(*stream, part, whole);
        else if (std::string_view(op) == "reduce_scatter") comm.reduce_scatter(*stream, whole, part, ReduceOp::sum);
        else if (std::string_view(op) == "all_to_all") comm.all_to_all(*stream, whole, {small.data(), count, type});
        else if (std::string_view(op) == "all_to_allv") comm.all_to_allv(*stream, whole, splits, {small.data(), count, type});
        else comm.all_reduce(*stream, whole, ReduceOp::sum);
      };
      const int iters = static_cast<int>(std::clamp<size_t>((size_t{64} << 20) / (count * esize), 3, 50));
      once();
      comm.barrier(*stream);
      stream->synchronize();
      const auto t0 = clock::now();
      for (int i = 0; i < iters; ++i) once();
      stream->synchronize();
      float elapsed = static_cast<float>(seconds_since(t0) / iters);
      device.copy(*stream, timing.data(), &elapsed, sizeof elapsed);
      comm.all_reduce(*stream, timing.view(DType::f32), ReduceOp::max);
      device.copy(*stream, &elapsed, timing.data(), sizeof elapsed);
      stream->synchronize();
      const double algbw = count * esize / static_cast<double>(elapsed) / 1e9;
      const double factor = std::string_view(op) == "all_reduce" ? 2.0 * (n - 1) / n : (n - 1.0) / n;
      rows.push_back({op, in_place, count * esize, count, elapsed * 1e6, algbw, algbw * factor});
    }
  }
  return rows;
}

struct Ceiling {
  std::string name;
  double gbps = 0;
};

// ceilings[0] is the backend's ceiling (memcpy / loopback TCP); a second one, when present, is
// reported beside it.
void print(const Options& o, int ranks, const std::vector<Ceiling>& ceilings, const std::vector<Row>& rows) {
  const double ceiling = ceilings.empty() ? 0 : ceilings[0].gbps;
  if (o.json) {
    nlohmann::json out;
    out["backend"] = o.backend;
    out["ranks"] = ranks;
    out["ceiling_gbps"] = ceiling > 0 ? nlohmann::json(ceiling) : nlohmann::json(nullptr);
    out["ceilings"] = nlohmann::json::array();
    for (const auto& c : ceilings) out["ceilings"].push_back({{"name", c.name}, {"gbps", c.gbps}});
    out["results"] = nlohmann::json::array();
    for (const auto& r : rows) {
      out["results"].push_back({{"op", r.op},
                                {"in_place", r.in_place},
                                {"bytes", r.bytes},
                                {"dtype", o.dtype},
                                {"time_us", r.time_us},
                                {"algbw", r.algbw},
                                {"busbw", r.busbw}});
    }
    std::printf("%s\n", out.dump(2).c_str());
    return;
  }
  std::printf("# zeroth bench comm: backend %s, %d ranks, %s\n", o.backend.c_str(), ranks, o.dtype.c_str());
  for (size_t i = 0; i < ceilings.size(); ++i) {
    std::printf("# ceiling %zu: %s: %.2f GB/s (same run)\n", i + 1, ceilings[i].name.c_str(), ceilings[i].gbps);
  }
  std::printf("#%14s %12s %6s %16s %8s %12s %12s %12s", "size(B)", "count", "type", "op", "place", "time(us)", "algbw(GB/s)",
              "busbw(GB/s)");
  for (size_t i = 0; i < ceilings.size(); ++i) std::printf(" %9s%zu", "vs ceil", i + 1);
  std::printf("\n");
  for (const auto& r : rows) {
    std::printf(" %14zu %12zu %6s %16s %8s %12.1f %12.3f %12.3f", r.bytes, r.count, o.dtype.c_str(), r.op.c_str(),
                r.in_place ? "in" : "out", r.time_us, r.algbw, r.busbw);
    for (const auto& c : ceilings) std::printf(" %9.0f%%", 100 * r.busbw / c.gbps);
    std::printf("\n");
  }
}

void run(const Options& o) {
  ZEROTH_CHECK(o.ranks >= 1, "--ranks must be at least 1");
  const size_t max_bytes = parse_bytes(o.max_bytes);
  if (o.backend == "local") {
    const size_t probe = std::min(max_bytes, size_t{64} << 20);
    const std::vector<Ceiling> ceilings = {{fmt::format("memcpy of {} on one thread", format_bytes(probe)), memcpy_gbps(probe)},
                                           {fmt::format("memcpy of the bytes a rank receives, {} threads at once (per thread)",
                                                        o.ranks),
                                            concurrent_memcpy_gbps(o.ranks, probe)}};
    auto device = make_device("cpu");
    std::vector<Row> rows;
    run_local_ranks(o.ranks, [&](Communicator& comm) {
      auto mine = run_rank(comm, *device, o);
      if (comm.rank() == 0) rows = std::move(mine);
    });
    print(o, o.ranks, ceilings, rows);
    return;
  }
  ZEROTH_CHECK(o.backend == "gloo" || o.backend == "nccl", "unknown backend '{}' (use local, gloo or nccl)", o.backend);
  auto info = rendezvous_from_env();
  if (!info) {
    // Not started by a launcher: start --ranks copies of this command and let rank 0 print.
    LaunchOptions launch;
    launch.nproc_per_node = o.ranks;
    launch.prefix_output = false;
    launch.command = {"/proc/self/exe", "bench",       "comm",      "--backend", o.backend, "--min-bytes",
                      o.min_bytes,      "--max-bytes", o.max_bytes, "--dtype",   o.dtype};
    if (o.json) launch.command.push_back("--json");
    const int code = run_launch(launch);
    if (code != 0) ZEROTH_THROW(CommError, "bench comm: a rank exited with code {}", code);
    return;
  }
  const bool gloo = o.backend == "gloo";
  std::vector<Ceiling> ceilings;
  if (gloo && info->rank == 0) {
    const size_t probe = std::max<size_t>(max_bytes, size_t{256} << 20);
    ceilings.push_back({fmt::format("one loopback TCP stream, {}", format_bytes(probe)), loopback_tcp_gbps(1, probe)});
    const size_t per_rank = std::min(max_bytes, size_t{64} << 20) / info->world_size * (info->world_size - 1);
    ceilings.push_back({fmt::format("{} loopback TCP streams at once, {} each (per stream)", info->world_size, format_bytes(per_rank)),
                        loopback_tcp_gbps(info->world_size, per_rank)});
  }
  auto comm = gloo ? make_gloo_communicator(*info) : make_nccl_communicator(*info, info->local_rank);
  auto device = make_device(gloo ? "cpu" : fmt::format("cuda:{}", info->local_rank));
  auto rows = run_rank(*comm, *device, o);
  if (info->rank == 0) print(o, info->world_size, ceilings, rows);
}

}  // namespace bench_comm

void add_bench_comm_command(CLI::App& bench) {
  using namespace bench_comm;
  auto options = std::make_shared<Options>();
  auto* cmd = bench.add_subcommand("comm", "all_gather / reduce_scatter / all_reduce / all_to_all bandwidth (nccl-tests format)");
  cmd->add_option("--backend", options->backend, "local, gloo or nccl (default local)");
  cmd->add_option("--ranks", options->ranks, "Ranks: threads for local, processes for gloo/nccl (default 4)");
  cmd->add_option("--min-bytes", options->min_bytes, "Smallest message (default 1KiB)");
  cmd->add_option("--max-bytes", options->max_bytes, "Largest message (default 256MiB)");
  cmd->add_option("--dtype", options->dtype, "f32, bf16 or f16 (default f32)");
  cmd->add_flag("--json", options->json, "Print JSON");
  cmd->callback([options] { run(*options); });
}

}  // namespace zeroth::tools
