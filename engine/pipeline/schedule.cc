// The three schedules, their check and their simulation.
#include "engine/pipeline/schedule.h"

#include <algorithm>  // std::max, std::min
#include <deque>      // std::deque
#include <map>        // std::map
#include <set>        // std::set
#include <tuple>      // std::tuple
#include <utility>    // std::pair

#include <fmt/format.h>  // fmt::format

#include "core/error.h"  // ZEROTH_THROW

namespace zeroth {
namespace {

// Emits a chunk's forward or backward with the receive before it and the send after it.
struct Emitter {
  const PipeSchedule& s;
  int last_virtual() const { return s.stages * s.chunks - 1; }
  int prev(int r) const { return (r - 1 + s.stages) % s.stages; }
  int next(int r) const { return (r + 1) % s.stages; }

  void forward(std::vector<PipeAction>& out, int r, int mb, int c) const {
    const int vs = s.virtual_stage(r, c);
    if (vs > 0) out.push_back({PipeOp::recv_activation, mb, c, prev(r)});
    out.push_back({PipeOp::forward, mb, c, -1});
    if (vs < last_virtual()) out.push_back({PipeOp::send_activation, mb, c, next(r)});
  }
  void backward(std::vector<PipeAction>& out, int r, int mb, int c) const {
    const int vs = s.virtual_stage(r, c);
    if (vs < last_virtual()) out.push_back({PipeOp::recv_gradient, mb, c, next(r)});
    out.push_back({PipeOp::backward, mb, c, -1});
    if (vs > 0) out.push_back({PipeOp::send_gradient, mb, c, prev(r)});
  }
};

// A message on the wire: which micro-batch, the virtual stage that sent it, activation or gradient.
struct Message {
  int micro_batch, from_virtual;
  bool gradient;
  auto operator<=>(const Message&) const = default;
};

// The message a send puts on the wire, or a receive takes from it.
Message message_of(const PipeSchedule& s, int rank, const PipeAction& a) {
  const int vs = s.virtual_stage(rank, a.chunk);
  switch (a.op) {
    case PipeOp::send_activation: return {a.micro_batch, vs, false};
    case PipeOp::recv_activation: return {a.micro_batch, vs - 1, false};
    case PipeOp::send_gradient: return {a.micro_batch, vs, true};
    case PipeOp::recv_gradient: return {a.micro_batch, vs + 1, true};
    default: break;
  }
  ZEROTH_THROW(InvalidArgument, "{} carries no message", pipe_op_name(a.op));
}

bool is_send(PipeOp op) { return op == PipeOp::send_activation || op == PipeOp::send_gradient; }
bool is_recv(PipeOp op) { return op == PipeOp::recv_activation || op == PipeOp::recv_gradient; }

// Runs every rank's program with receives that wait for their message and sends that do not;
// `on_action(rank, action, start)` sees each action with the time it starts. Returns "" when every
// program finished, else which ranks wait for what.
template <typename OnAction>
std::string run_schedule(const PipeSchedule& s, double forward, double backward, OnAction on_action) {
  const int p = s.stages;
  std::vector<size_t> pc(static_cast<size_t>(p), 0);
  std::vector<double> clock(static_cast<size_t>(p), 0.0);
  // Per (from, to, gradient) channel: messages in flight with the time they were sent.
  std::map<std::tuple<int, int, bool>, std::deque<std::pair<Message, double>>> wire;
  bool moved = true;
  while (moved) {
    moved = false;
    for (int r = 0; r < p; ++r) {
      const auto& prog = s.ranks[static_cast<size_t>(r)];
      while (pc[r] < prog.size()) {
        const PipeAction& a = prog[pc[r]];
        double& t = clock[static_cast<size_t>(r)];
        if (is_recv(a.op)) {
          auto& q = wire[{a.peer, r, a.op == PipeOp::recv_gradient}];
          if (q.empty()) break;
          const Message want = message_of(s, r, a);
          if (q.front().first != want) {
            return fmt::format("rank {} receives {} of micro-batch {} (chunk {}) from rank {}, but the next message from it is "
                               "micro-batch {} of virtual stage {}: the sends and receives are in different orders",
                               r, pipe_op_name(a.op), a.micro_batch, a.chunk, a.peer, q.front().first.micro_batch,
                               q.front().first.from_virtual);
          }
          t = std::max(t, q.front().second);
          q.pop_front();
          on_action(r, a, t);
        } else if (is_send(a.op)) {
          on_action(r, a, t);
          wire[{r, a.peer, a.op == PipeOp::send_gradient}].push_back({message_of(s, r, a), t});
        } else {
          on_action(r, a, t);
          t += a.op == PipeOp::forward ? forward : backward;
        }
        ++pc[r];
        moved = true;
      }
    }
  }
  std::string stuck;
  for (int r = 0; r < p; ++r) {
    const auto& prog = s.ranks[static_cast<size_t>(r)];
    if (pc[r] == prog.size()) continue;
    const PipeAction& a = prog[pc[r]];
    stuck += fmt::format("{}rank {} waits at action {} ({} micro-batch {} chunk {} from rank {})", stuck.empty() ? "" : "; ", r, pc[r],
                         pipe_op_name(a.op), a.micro_batch, a.chunk, a.peer);
  }
  return stuck.empty() ? "" : "deadlock: " + stuck;
}

}  // namespace

std::string_view pipe_kind_name(PipeKind kind) {
  switch (kind) {
    case PipeKind::gpipe: return "gpipe";
    case PipeKind::one_f_one_b: return "1f1b";
    case PipeKind::interleaved: return "interleaved";
  }
  return "?";
}

std::string_view pipe_op_name(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return "forward";
    case PipeOp::backward: return "backward";
    case PipeOp::send_activation: return "send_activation";
    case PipeOp::recv_activation: return "recv_activation";
    case PipeOp::send_gradient: return "send_gradient";
    case PipeOp::recv_gradient: return "recv_gradient";
  }
  return "?";
}

std::string PipeSchedule::describe(int rank) const {
  std::string out;
  for (const auto& a : ranks[static_cast<size_t>(rank)]) {
    const char* tag = a.op == PipeOp::forward           ? "F"
                      : a.op == PipeOp::backward        ? "B"
                      : a.op == PipeOp::send_activation ? ">a"
                      : a.op == PipeOp::recv_activation ? "<a"
                      : a.op == PipeOp::send_gradient   ? ">g"
                                                        : "<g";
    out += fmt::format("{}{}{}{}", out.empty() ? "" : " ", tag, a.micro_batch, chunks > 1 ? fmt::format(".{}", a.chunk) : "");
  }
  return out;
}

PipeSchedule make_pipe_schedule(PipeKind kind, int p, int m, int v) {
  if (p < 1 || p > 4096) ZEROTH_THROW(InvalidArgument, "pipeline stages must be 1 to 4096, got {}", p);
  if (m < 1) ZEROTH_THROW(InvalidArgument, "pipeline micro-batches must be at least 1, got {}", m);
  if (kind != PipeKind::interleaved && v != 1)
    ZEROTH_THROW(InvalidArgument, "{} runs one model chunk per rank (virtual stages 1), got {}", pipe_kind_name(kind), v);
  if (kind == PipeKind::interleaved) {
    if (v < 2) ZEROTH_THROW(InvalidArgument, "the interleaved schedule needs 2 or more virtual stages per rank, got {}", v);
    if (p < 2) ZEROTH_THROW(InvalidArgument, "the interleaved schedule needs 2 or more pipeline stages, got {}", p);
    if (m % p != 0)
      ZEROTH_THROW(InvalidArgument,
                   "the interleaved schedule runs micro-batches in groups of the {} stages: {} is not a multiple of {}", p, m, p);
  }
  PipeSchedule s;
  s.kind = kind, s.stages = p, s.micro_batches = m, s.chunks = v;
  s.ranks.resize(static_cast<size_t>(p));
  const Emitter e{s};
  for (int r = 0; r < p; ++r) {
    auto& out = s.ranks[static_cast<size_t>(r)];
    if (kind == PipeKind::gpipe) {
      for (int mb = 0; mb < m; ++mb) e.forward(out, r, mb, 0);
      for (int mb = 0; mb < m; ++mb) e.backward(out, r, mb, 0);
    } else if (kind == PipeKind::one_f_one_b) {
      // Warm-up: the forwards that fill the pipeline below this rank; then one forward, one
      // backward; then the backwards left.
      const int warmup = std::min(p - r - 1, m);
      for (int mb = 0; mb < warmup; ++mb) e.forward(out, r, mb, 0);
      for (int i = 0; i < m - warmup; ++i) {
        e.forward(out, r, warmup + i, 0);
        e.backward(out, r, i, 0);
      }
      for (int mb = m - warmup; mb < m; ++mb) e.backward(out, r, mb, 0);
    } else {
      // Megatron-LM's order: forward k runs chunk (k mod p v) / p on micro-batch (k / p v) p + k mod p;
      // backward k the same micro-batch on the chunks in reverse.
      const int total = m * v, group = p * v;
      auto micro_batch = [&](int k) { return (k / group) * p + k % p; };
      auto chunk = [&](int k, bool fwd) {
        const int c = (k % group) / p;
        return fwd ? c : v - 1 - c;
      };
      const int warmup = m == p ? total : std::min((p - r - 1) * 2 + (v - 1) * p, total);
      for (int k = 0; k < warmup; ++k) e.forward(out, r, micro_batch(k), chunk(k, true));
      for (int k = 0; k < total - warmup; ++k) {
        e.forward(out, r, micro_batch(k + warmup), chunk(k + warmup, true));
        e.backward(out, r, micro_batch(k), chunk(k, false));
      }
      for (int k = total - warmup; k < total; ++k) e.backward(out, r, micro_batch(k), chunk(k, false));
    }
  }
  return s;
}

std::string check_schedule(const PipeSchedule& s) {
  // Each rank runs each (micro-batch, chunk) forward once, and its backward once, after it.
  for (int r = 0; r < s.stages; ++r) {
    std::set<std::pair<int, int>> forwarded, backwarded;
    for (const auto& a : s.ranks[static_cast<size_t>(r)]) {
      const std::pair<int, int> key{a.micro_batch, a.chunk};
      if (a.op == PipeOp::forward && !forwarded.insert(key).second)
        return fmt::format("rank {} runs the forward of micro-batch {} chunk {} twice", r, a.micro_batch, a.chunk);
      if (a.op == PipeOp::backward) {
        if (!forwarded.count(key))
          return fmt::format("rank {} runs the backward of micro-batch {} chunk {} before its forward", r, a.micro_batch, a.chunk);
        if (!backwarded.insert(key).second)
          return fmt::format("rank {} runs the backward of micro-batch {} chunk {} twice", r, a.micro_batch, a.chunk);
      }
    }
    const size_t expected = static_cast<size_t>(s.micro_batches) * static_cast<size_t>(s.chunks);
    if (forwarded.size() != expected || backwarded.size() != expected) {
      return fmt::format("rank {} runs {} forwards and {} backwards of the {} (micro-batch, chunk) pairs", r, forwarded.size(),
                         backwarded.size(), expected);
    }
  }
  // Per direction between two ranks, the sends and the receives list the same messages in the same order.
  std::map<std::tuple<int, int, bool>, std::vector<Message>> sent, received;
  for (int r = 0; r < s.stages; ++r) {
    for (const auto& a : s.ranks[static_cast<size_t>(r)]) {
      if (is_send(a.op)) sent[{r, a.peer, a.op == PipeOp::send_gradient}].push_back(message_of(s, r, a));
      if (is_recv(a.op)) received[{a.peer, r, a.op == PipeOp::recv_gradient}].push_back(message_of(s, r, a));
    }
  }
  for (const auto& [key, list] : sent) {
    const auto& [from, to, grad] = key;
    if (received[key] != list) {
      return fmt::format("rank {} sends {} {} to rank {}, which receives {} of them in {}", from, list.size(),
                         grad ? "gradients" : "activations", to, received[key].size(),
                         received[key].size() == list.size() ? "another order" : "total");
    }
  }
  for (const auto& [key, list] : received)
    if (!sent.count(key) && !list.empty())
      return fmt::format("rank {} waits for messages rank {} never sends", std::get<1>(key), std::get<0>(key));
  return run_schedule(s, 1.0, 2.0, [](int, const PipeAction&, double) {});
}

double PipeTimeline::bubble() const {
  double total = 0;
  for (double b : busy) total += b;
  return busy.empty() || makespan <= 0 ? 0 : 1 - total / (static_cast<double>(busy.size()) * makespan);
}

PipeTimeline simulate_schedule(const PipeSchedule& s, double forward, double backward) {
  PipeTimeline t;
  t.busy.assign(static_cast<size_t>(s.stages), 0.0);
  t.peak_in_flight.assign(static_cast<size_t>(s.stages), 0);
  std::vector<int> alive(static_cast<size_t>(s.stages), 0);
  const std::string problem = run_schedule(s, forward, backward, [&](int r, const PipeAction& a, double start) {
    const auto i = static_cast<size_t>(r);
    if (a.op == PipeOp::forward) {
      t.busy[i] += forward;
      t.peak_in_flight[i] = std::max(t.peak_in_flight[i], ++alive[i]);
      t.makespan = std::max(t.makespan, start + forward);
    } else if (a.op == PipeOp::backward) {
      t.busy[i] += backward;
      --alive[i];
      t.makespan = std::max(t.makespan, start + backward);
    }
  });
  if (!problem.empty()) ZEROTH_THROW(InvalidArgument, "the {} schedule does not run: {}", pipe_kind_name(s.kind), problem);
  return t;
}

double pipe_bubble_formula(PipeKind kind, int p, int m, int v) {
  const double virtual_m = static_cast<double>(m) * (kind == PipeKind::interleaved ? v : 1);
  return static_cast<double>(p - 1) / (virtual_m + p - 1);
}

}  // namespace zeroth
