// The pipeline runner: channels with their own thread, stream and communicator; the rank's
// program walked in order, with the events that keep buffers safe; the timeline's stamps.
#include "engine/pipeline/runner.h"

#include <algorithm>           // std::min, std::max
#include <chrono>              // std::chrono::steady_clock
#include <condition_variable>  // std::condition_variable
#include <deque>               // std::deque
#include <future>              // std::promise, std::shared_future
#include <mutex>               // std::mutex
#include <optional>            // std::optional
#include <thread>              // std::thread

#include <fmt/format.h>       // fmt::format
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"  // ZEROTH_CHECK

namespace zeroth {
namespace {

double now_seconds() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

using Done = std::shared_future<std::shared_ptr<Event>>;

SpanKind span_of(PipeOp op) {
  switch (op) {
    case PipeOp::forward: return SpanKind::forward;
    case PipeOp::backward: return SpanKind::backward;
    case PipeOp::send_activation: return SpanKind::send_activation;
    case PipeOp::recv_activation: return SpanKind::recv_activation;
    case PipeOp::send_gradient: return SpanKind::send_gradient;
    case PipeOp::recv_gradient: return SpanKind::recv_gradient;
  }
  return SpanKind::optimizer;
}

}  // namespace

// The spans stamped so far; stream threads add to it.
struct PipelineRunner::Stamps {
  std::mutex mutex;
  std::vector<PipeSpan> spans;
  void add(const PipeSpan& s) {
    std::lock_guard lock(mutex);
    spans.push_back(s);
  }
};

// One direction of traffic with one neighbour: its thread issues the transfers in program order.
// See [Note: pipeline channels] in docs/ARCHITECTURE.md.
struct PipelineRunner::Channel {
  struct Job {
    TensorView data;
    std::shared_ptr<Event> after;  // the stream waits for it before the transfer
    SpanKind kind;
    int micro, chunk;
    std::shared_ptr<std::promise<std::shared_ptr<Event>>> done;
  };

  Channel(Device& device, std::unique_ptr<Communicator> c, int p, bool s, std::shared_ptr<Stamps> st, const std::atomic<bool>* trace)
      : comm(std::move(c)), peer(p), sends(s), stream(device.create_stream()), stamps(std::move(st)), tracing(trace) {
    worker = std::thread([this] { loop(); });
  }
  ~Channel() {
    {
      std::lock_guard lock(mutex);
      stop = true;
    }
    changed.notify_all();
    worker.join();
  }

  Done push(TensorView data, std::shared_ptr<Event> after, SpanKind kind, int micro, int chunk) {
    Job job{data, std::move(after), kind, micro, chunk, std::make_shared<std::promise<std::shared_ptr<Event>>>()};
    Done done = job.done->get_future().share();
    {
      std::lock_guard lock(mutex);
      jobs.push_back(std::move(job));
    }
    changed.notify_all();
    return done;
  }

  bool stopping() {
    std::lock_guard lock(mutex);
    return stop;
  }

  void loop() {
    for (;;) {
      Job job;
      {
        std::unique_lock lock(mutex);
        changed.wait(lock, [&] { return stop || !jobs.empty(); });
        if (jobs.empty()) return;
        job = std::move(jobs.front());
        jobs.pop_front();
      }
      if (!failed && stopping()) {
        failed = std::make_exception_ptr(CommError("the pipeline runner was shut down with this transfer still queued"));
      }
      if (failed) {
        job.done->set_exception(failed);
        continue;
      }
      try {
        if (job.after) stream->wait(*job.after);
        std::shared_ptr<PipeSpan> span;
        if (tracing->load() && job.micro >= 0) {  // evaluation's transfers are not a step's
          span = std::make_shared<PipeSpan>(PipeSpan{job.kind, job.micro, job.chunk});
          stream->enqueue_host([span] { span->start = now_seconds(); });
        }
        if (sends) comm->send(*stream, job.data, peer);
        else comm->recv(*stream, job.data, peer);
        if (span) {
          stream->enqueue_host([span, stamps = stamps] {
            span->end = now_seconds();
            stamps->add(*span);
          });
        }
        auto event = std::shared_ptr<Event>(stream->device().create_event());
        event->record(*stream);
        job.done->set_value(std::move(event));
      } catch (...) {
        failed = std::current_exception();
        job.done->set_exception(failed);
      }
    }
  }

  std::unique_ptr<Communicator> comm;
  int peer;
  bool sends;
  std::unique_ptr<Stream> stream;
  std::shared_ptr<Stamps> stamps;
  const std::atomic<bool>* tracing;
  std::thread worker;
  std::mutex mutex;
  std::condition_variable changed;
  std::deque<Job> jobs;
  bool stop = false;
  std::exception_ptr failed;  // the first transfer that failed: later ones fail with it
};

// A port buffer's state: the receive that fills it, the send that reads it, its last reader.
struct PipelineRunner::PortState {
  void* data = nullptr;
  std::optional<Done> filled, sent;
  std::shared_ptr<Event> read;  // the compute stream after the pass that last read it
};

PipelineRunner::PipelineRunner(Device& device, Communicator& stages, PipeSchedule schedule)
    : device_(device), schedule_(std::move(schedule)), rank_(stages.rank()), stages_(stages), stamps_(std::make_shared<Stamps>()) {
  const int p = stages.size();
  ZEROTH_CHECK(p == schedule_.stages, "a {}-stage schedule on a pipeline group of {} ranks", schedule_.stages, p);
  if (const std::string problem = check_schedule(schedule_); !problem.empty()) {
    ZEROTH_THROW(InvalidArgument, "the {} schedule for {} stages and {} micro-batches is unsound: {}", pipe_kind_name(schedule_.kind),
                 p, schedule_.micro_batches, problem);
  }
  // Edge k carries stage k's output to stage k + 1 (mod p: interleaving wraps around), one
  // communicator for activations and one for gradients; member 0 is stage k.
  std::vector<std::unique_ptr<Communicator>> act(p), grad(p);
  for (int k = 0; k < p && p > 1; ++k) {
    const int next = (k + 1) % p;
    const bool member = rank_ == k || rank_ == next;
    const int key = rank_ == k ? 0 : 1;
    act[k] = stages.split(member ? 0 : -1, key);
    grad[k] = stages.split(member ? 0 : -1, key);
  }
  stats_comm_ = stages.split(0, rank_);
  if (p > 1) {
    const int prev = (rank_ + p - 1) % p;
    const std::atomic<bool>* tracing = &tracing_;
    channels_.push_back(std::make_unique<Channel>(device_, std::move(act[rank_]), 1, true, stamps_, tracing));
    channels_.push_back(std::make_unique<Channel>(device_, std::move(act[prev]), 0, false, stamps_, tracing));
    channels_.push_back(std::make_unique<Channel>(device_, std::move(grad[prev]), 0, true, stamps_, tracing));
    channels_.push_back(std::make_unique<Channel>(device_, std::move(grad[rank_]), 1, false, stamps_, tracing));
  }
}

PipelineRunner::~PipelineRunner() {
  // The channels' streams may still be moving data the model owns; a failure here is the run's
  // error already.
  for (auto& c : channels_) {
    try {
      c->stream->synchronize();
    } catch (...) {
    }
  }
}

PipelineRunner::Channel& PipelineRunner::channel(PipeOp op) {
  switch (op) {
    case PipeOp::send_activation: return *channels_.at(0);
    case PipeOp::recv_activation: return *channels_.at(1);
    case PipeOp::send_gradient: return *channels_.at(2);
    default: return *channels_.at(3);
  }
}

std::vector<PassRef> PipelineRunner::passes() const { return pipe_passes(schedule_, rank_); }

std::vector<PassRef> pipe_passes(const PipeSchedule& schedule, int rank) {
  std::vector<PassRef> out;
  for (const auto& a : schedule.ranks.at(rank)) {
    if (a.op == PipeOp::forward) out.push_back({a.micro_batch, Pass::forward, a.chunk});
    if (a.op == PipeOp::backward) out.push_back({a.micro_batch, Pass::backward, a.chunk});
  }
  return out;
}

std::function<void()> PipelineRunner::open_span(Stream& stream, SpanKind kind, int micro, int chunk) {
  if (!tracing_) return [] {};
  auto span = std::make_shared<PipeSpan>(PipeSpan{kind, micro, chunk});
  stream.enqueue_host([span] { span->start = now_seconds(); });
  return [&stream, span, stamps = stamps_] {
    stream.enqueue_host([span, stamps] {
      span->end = now_seconds();
      stamps->add(*span);
    });
  };
}

namespace {

// The compute stream waits for a transfer (its event once the channel has issued it).
void wait_for(Stream& stream, std::optional<Done>& done) {
  if (!done) return;
  stream.wait(*done->get());
  done.reset();
}

}  // namespace

void PipelineRunner::run_cycle(const PipeModel& model) {
  guarded([&] { walk_cycle(model); });
}

void PipelineRunner::run_evaluation(const PipeModel& model) {
  guarded([&] { walk_evaluation(model); });
}

void PipelineRunner::guarded(const std::function<void()>& work) {
  try {
    work();
  } catch (const std::exception& e) {
    // The neighbours may be waiting for this stage's messages: they learn why none will come.
    const std::string reason = fmt::format("pipeline stage {} failed: {}", rank_, e.what());
    stages_.abort(reason);
    for (auto& c : channels_) c->comm->abort(reason);
    throw;
  }
}

std::pair<TensorView, PipelineRunner::PortState*> PipelineRunner::port_state(const PipeModel& model, PipePort port, int micro,
                                                                             int chunk) {
  const TensorView v = model.port(port, micro, chunk);
  for (auto& ps : ports_) {
    if (ps->data == v.data) return {v, ps.get()};
  }
  ports_.push_back(std::make_unique<PortState>());
  ports_.back()->data = v.data;
  return {v, ports_.back().get()};
}

void PipelineRunner::walk_cycle(const PipeModel& model) {
  Stream& cs = device_.default_stream();
  auto state = [&](PipePort port, int micro, int chunk) { return port_state(model, port, micro, chunk); };
  auto after_compute = [&] {
    auto e = std::shared_ptr<Event>(device_.create_event());
    e->record(cs);
    return e;
  };
  const int last_virtual = schedule_.stages * schedule_.chunks - 1;
  for (const auto& a : schedule_.ranks.at(rank_)) {
    const int m = a.micro_batch, c = a.chunk;
    const int vs = schedule_.virtual_stage(rank_, c);
    switch (a.op) {
      case PipeOp::recv_activation:
      case PipeOp::recv_gradient: {
        auto [view, ps] = state(a.op == PipeOp::recv_activation ? PipePort::input : PipePort::output_grad, m, c);
        // Written once its last reader is done.
        ps->filled = channel(a.op).push(view, ps->read, span_of(a.op), m, c);
        break;
      }
      case PipeOp::send_activation:
      case PipeOp::send_gradient: {
        auto [view, ps] = state(a.op == PipeOp::send_activation ? PipePort::output : PipePort::input_grad, m, c);
        ps->sent = channel(a.op).push(view, after_compute(), span_of(a.op), m, c);
        break;
      }
      case PipeOp::forward:
      case PipeOp::backward: {
        const bool fwd = a.op == PipeOp::forward;
        PortState* in = nullptr;   // what the pass reads from a neighbour
        PortState* out = nullptr;  // what it writes for one
        if (fwd ? vs > 0 : vs < last_virtual) in = state(fwd ? PipePort::input : PipePort::output_grad, m, c).second;
        if (fwd ? vs < last_virtual : vs > 0) out = state(fwd ? PipePort::output : PipePort::input_grad, m, c).second;
        if (in != nullptr) wait_for(cs, in->filled);
        if (out != nullptr) wait_for(cs, out->sent);  // its previous contents have left
        auto close = open_span(cs, span_of(a.op), m, c);
        if (fwd) model.forward(m, c);
        else model.backward(m, c);
        close();
        if (!fwd) {
          // The backward was the last reader of the chunk's input and of its output gradient.
          auto done = after_compute();
          if (vs > 0) state(PipePort::input, m, c).second->read = done;
          if (in != nullptr) in->read = done;
        }
        break;
      }
    }
  }
}

void PipelineRunner::walk_evaluation(const PipeModel& model) {
  Stream& cs = device_.default_stream();
  const int p = schedule_.stages, last_virtual = p * schedule_.chunks - 1;
  for (int c = 0; c < schedule_.chunks; ++c) {
    const int vs = schedule_.virtual_stage(rank_, c);
    PortState *in = nullptr, *out = nullptr;
    auto find = [&](PipePort port) { return port_state(model, port, -1, c); };
    if (vs > 0) {
      auto [view, ps] = find(PipePort::input);
      in = ps;
      in->filled = channel(PipeOp::recv_activation).push(view, in->read, SpanKind::recv_activation, -1, c);
      wait_for(cs, in->filled);
    }
    std::pair<TensorView, PortState*> output{};
    if (vs < last_virtual) {
      output = find(PipePort::output);
      out = output.second;
      wait_for(cs, out->sent);
    }
    model.evaluate(c);
    auto done = std::shared_ptr<Event>(device_.create_event());
    done->record(cs);
    if (in != nullptr) in->read = done;
    if (out != nullptr) out->sent = channel(PipeOp::send_activation).push(output.first, done, SpanKind::send_activation, -1, c);
  }
}

void PipelineRunner::drain() {
  guarded([&] { wait_all(); });
}

void PipelineRunner::wait_all() {
  for (auto& ps : ports_) {
    Stream& cs = device_.default_stream();
    wait_for(cs, ps->filled);
    wait_for(cs, ps->sent);
  }
  for (auto& c : channels_) c->stream->synchronize();
}

PipeMeasure PipelineRunner::measure(Stream& stream) {
  PipeMeasure m;
  guarded([&] { m = gather_measure(stream); });
  return m;
}

PipeMeasure PipelineRunner::gather_measure(Stream& stream) {
  wait_all();
  stream.synchronize();
  std::vector<PipeSpan> mine;
  {
    std::lock_guard lock(stamps_->mutex);
    mine.swap(stamps_->spans);
  }
  const int p = schedule_.stages;
  Buffer count_buf = device_.allocate(sizeof(float) * p, MemTag::buffers);
  float count = static_cast<float>(mine.size());
  device_.copy(stream, static_cast<float*>(count_buf.data()) + rank_, &count, sizeof count);
  stats_comm_->all_gather(stream, {static_cast<float*>(count_buf.data()) + rank_, 1, DType::f32}, count_buf.view(DType::f32));
  std::vector<float> counts(p);
  device_.copy(stream, counts.data(), count_buf.data(), sizeof(float) * p);
  stream.synchronize();
  size_t most = 0;
  for (float n : counts) most = std::max(most, static_cast<size_t>(n));
  const size_t per_rank = packed_floats(most);
  std::vector<float> packed(per_rank, 0.0f);
  pack_spans(mine, packed.data());
  Buffer all = device_.allocate(sizeof(float) * per_rank * p, MemTag::buffers);
  float* slice = static_cast<float*>(all.data()) + per_rank * rank_;
  device_.copy(stream, slice, packed.data(), sizeof(float) * per_rank);
  stats_comm_->all_gather(stream, {slice, per_rank, DType::f32}, all.view(DType::f32));
  std::vector<float> host(per_rank * p);
  device_.copy(stream, host.data(), all.data(), sizeof(float) * host.size());
  stream.synchronize();

  PipeMeasure m;
  m.formula = pipe_bubble_formula(schedule_.kind, p, schedule_.micro_batches, schedule_.chunks);
  for (int r = 0; r < p; ++r) m.spans.push_back(unpack_spans(host.data() + per_rank * r, static_cast<size_t>(counts[r])));
  summarize(m);
  // Rank 0 keeps every rank's timeline (the trace); the others their own.
  for (int r = 0; r < p; ++r) {
    if (rank_ != 0 && r != rank_) m.spans[r].clear();
  }
  return m;
}

}  // namespace zeroth
