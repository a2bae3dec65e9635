// The pipeline runner's timelines: span names and lanes, their wire form for gathering over the
// stages, the bubble they give, the Chrome trace, and the sleeping stages that measure them.
#include <algorithm>  // std::min, std::max, std::find
#include <thread>     // std::this_thread::sleep_for

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "comm/local/local_comm.h"  // run_local_ranks
#include "engine/pipeline/runner.h"

namespace zeroth {
namespace {

constexpr size_t kRow = 8;  // floats per span

// A double as two floats whose sum keeps its precision.
void split(double v, float* at) {
  at[0] = static_cast<float>(v);
  at[1] = static_cast<float>(v - static_cast<double>(at[0]));
}
double joined(const float* at) { return static_cast<double>(at[0]) + static_cast<double>(at[1]); }

bool is_compute(SpanKind k) { return k == SpanKind::forward || k == SpanKind::backward; }

}  // namespace

std::string PipeSpan::name() const {
  const std::string chunk_part = chunk > 0 ? fmt::format(".{}", chunk) : "";
  switch (kind) {
    case SpanKind::forward: return fmt::format("F{}{}", micro, chunk_part);
    case SpanKind::backward: return fmt::format("B{}{}", micro, chunk_part);
    case SpanKind::send_activation: return fmt::format("send a{}{}", micro, chunk_part);
    case SpanKind::recv_activation: return fmt::format("recv a{}{}", micro, chunk_part);
    case SpanKind::send_gradient: return fmt::format("send g{}{}", micro, chunk_part);
    case SpanKind::recv_gradient: return fmt::format("recv g{}{}", micro, chunk_part);
    case SpanKind::optimizer: return "optimizer";
  }
  return "?";
}

std::string_view PipeSpan::lane() const {
  switch (kind) {
    case SpanKind::send_activation: return "activations out";
    case SpanKind::recv_activation: return "activations in";
    case SpanKind::send_gradient: return "gradients out";
    case SpanKind::recv_gradient: return "gradients in";
    default: return "compute";
  }
}

size_t packed_floats(size_t spans) { return 2 + spans * kRow; }

// The rank's earliest start once, then per span: kind, micro, chunk, a spare, and start and end as
// offsets from that base (so every rank's times are on the one steady clock the ranks of a host
// share, without losing precision in floats).
void pack_spans(const std::vector<PipeSpan>& spans, float* out) {
  double base = spans.empty() ? 0 : spans.front().start;
  for (const auto& s : spans) base = std::min(base, s.start);
  split(base, out);
  for (size_t i = 0; i < spans.size(); ++i) {
    float* r = out + 2 + i * kRow;
    r[0] = static_cast<float>(spans[i].kind);
    r[1] = static_cast<float>(spans[i].micro);
    r[2] = static_cast<float>(spans[i].chunk);
    split(spans[i].start - base, r + 4);
    split(spans[i].end - base, r + 6);
  }
}

std::vector<PipeSpan> unpack_spans(const float* in, size_t count) {
  const double base = joined(in);
  std::vector<PipeSpan> out;
  for (size_t i = 0; i < count; ++i) {
    const float* x = in + 2 + i * kRow;
    out.push_back({static_cast<SpanKind>(static_cast<int>(x[0])), static_cast<int>(x[1]), static_cast<int>(x[2]), base + joined(x + 4),
                   base + joined(x + 6)});
  }
  return out;
}

void summarize(PipeMeasure& m) {
  const size_t p = m.spans.size();
  m.busy.assign(p, 0.0);
  double first = 0, last = 0;
  bool any = false;
  for (size_t r = 0; r < p; ++r) {
    for (const auto& s : m.spans[r]) {
      if (!is_compute(s.kind)) continue;
      m.busy[r] += s.end - s.start;
      first = any ? std::min(first, s.start) : s.start;
      last = any ? std::max(last, s.end) : s.end;
      any = true;
    }
  }
  m.makespan = last - first;
  double busy = 0;
  for (double b : m.busy) busy += b;
  m.bubble = m.makespan > 0 ? 1.0 - busy / (static_cast<double>(p) * m.makespan) : 0.0;
}

nlohmann::json chrome_trace(const PipeMeasure& measure) {
  nlohmann::json events = nlohmann::json::array();
  double origin = -1;
  for (const auto& rank : measure.spans) {
    for (const auto& s : rank) origin = origin < 0 ? s.start : std::min(origin, s.start);
  }
  const std::string_view lanes[] = {"compute", "activations in", "activations out", "gradients in", "gradients out"};
  for (size_t r = 0; r < measure.spans.size(); ++r) {
    events.push_back({{"ph", "M"}, {"name", "process_name"}, {"pid", r}, {"args", {{"name", fmt::format("stage {}", r)}}}});
    for (size_t t = 0; t < std::size(lanes); ++t)
      events.push_back({{"ph", "M"}, {"name", "thread_name"}, {"pid", r}, {"tid", t}, {"args", {{"name", lanes[t]}}}});
    for (const auto& s : measure.spans[r]) {
      const size_t tid = static_cast<size_t>(std::find(std::begin(lanes), std::end(lanes), s.lane()) - std::begin(lanes));
      events.push_back({{"ph", "X"},
                        {"name", s.name()},
                        {"pid", r},
                        {"tid", tid},
                        {"ts", (s.start - origin) * 1e6},
                        {"dur", (s.end - s.start) * 1e6},
                        {"args", {{"micro_batch", s.micro}, {"chunk", s.chunk}}}});
    }
  }
  return {{"traceEvents", events},
          {"displayTimeUnit", "ms"},
          {"otherData", {{"bubble", measure.bubble}, {"bubble_formula", measure.formula}, {"makespan_seconds", measure.makespan}}}};
}

PipeMeasure measure_sleeping_pipeline(PipeKind kind, int p, int m, std::chrono::microseconds unit) {
  const int v = kind == PipeKind::interleaved ? 2 : 1;
  constexpr size_t kPortFloats = 256;  // 1 KiB messages
  PipeMeasure result;
  run_local_ranks(p, [&](Communicator& world) {
    auto device = make_device("cpu");
    // One buffer per (micro-batch, chunk, port): nothing is reused within the cycle. Before the
    // runner, whose channels may still write into it while it winds down after a failure.
    Buffer ports = device->allocate(static_cast<size_t>(m) * v * 4 * kPortFloats * sizeof(float), MemTag::activations);
    PipelineRunner runner(*device, world, make_pipe_schedule(kind, p, m, v));
    Stream& cs = device->default_stream();
    PipeModel model;
    auto sleep_for = [&cs, unit, v](int units) {
      const auto d = unit * units / v;
      cs.enqueue_host([d] { std::this_thread::sleep_for(d); });
    };
    model.forward = [&](int, int) { sleep_for(1); };
    model.backward = [&](int, int) { sleep_for(2); };
    model.port = [&](PipePort port, int micro, int chunk) {
      const size_t at = ((static_cast<size_t>(micro) * v + chunk) * 4 + static_cast<size_t>(port)) * kPortFloats;
      return TensorView{ports.as<float>() + at, kPortFloats, DType::f32};
    };
    runner.set_tracing(true);
    runner.run_cycle(model);
    auto measured = runner.measure(cs);
    if (world.rank() == 0) result = std::move(measured);
  });
  return result;
}

}  // namespace zeroth
