// The pipeline runner: one rank's program of a pipeline schedule (engine/pipeline/schedule.h) run
// over real streams and communicators. The model's chunk passes go on the compute stream; each
// send and receive goes on one of four channels (activations to the next stage and from the
// previous one, gradients to the previous and from the next), each its own stream and its own
// two-rank communicator, issued by its own thread, so a send that waits for its receiver never
// holds up this rank's compute: the sends do not wait and the receives do, which is what
// check_schedule() proves deadlock free. Events order compute against the channels: a forward
// waits for its activation, a backward for its gradient, and a buffer is written again only once
// its last send has left and its last reader is done.
//
// With a trace, the compute stream and the channels stamp when each pass and transfer starts and
// ends; measure() turns the stamps of every rank into the bubble and a Chrome trace.
#pragma once

#include <atomic>      // std::atomic
#include <chrono>      // std::chrono::microseconds
#include <functional>  // std::function
#include <memory>      // std::unique_ptr
#include <string>      // std::string
#include <vector>      // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "comm/communicator.h"         // Communicator
#include "core/device.h"               // Device, Stream, TensorView
#include "engine/pipeline/schedule.h"  // PipeSchedule
#include "engine/plan/plan.h"          // PassRef

namespace zeroth {

// A rank's forward and backward passes in its program's order: the engine's pass order.
std::vector<PassRef> pipe_passes(const PipeSchedule& schedule, int rank);

// Where a chunk's messages live, for micro-batch `micro` (-1: evaluation).
enum class PipePort : uint8_t { input, output, input_grad, output_grad };

// What the runner asks of the stage's model: enqueue a chunk's pass on the compute stream, and the
// device buffer of a port (the same for every call with the same arguments).
struct PipeModel {
  std::function<void(int micro, int chunk)> forward, backward;
  std::function<void(int chunk)> evaluate;  // the evaluation slot's forward of a chunk
  std::function<TensorView(PipePort port, int micro, int chunk)> port;
};

// One interval of a rank's timeline: a pass or the optimizer on the compute stream, a transfer on
// its channel (from when the channel reached it, so a receive's span includes its wait).
enum class SpanKind : uint8_t { forward, backward, send_activation, recv_activation, send_gradient, recv_gradient, optimizer };
struct PipeSpan {
  SpanKind kind = SpanKind::forward;
  int micro = 0, chunk = 0;
  double start = 0, end = 0;      // seconds on the steady clock
  std::string name() const;       // "F3", "B3.1" (chunk 1), "recv a3", "send g2", "optimizer"
  std::string_view lane() const;  // "compute", "activations in", "activations out", "gradients in", "gradients out"
};

// What measure() finds over every rank of the pipeline.
struct PipeMeasure {
  double makespan = 0;                       // first pass start to last pass end, over all ranks
  std::vector<double> busy;                  // per rank: seconds in forward and backward passes
  double bubble = 0;                         // 1 - mean(busy) / makespan
  double formula = 0;                        // pipe_bubble_formula of the schedule
  std::vector<std::vector<PipeSpan>> spans;  // per rank (rank 0 gets every rank's; the others their own)
};

class PipelineRunner {
 public:
  // Collective over `stages` (the pipeline group; this rank is stage stages.rank()), whose size is
  // the schedule's stage count: splits the channels' communicators.
  PipelineRunner(Device& device, Communicator& stages, PipeSchedule schedule);
  ~PipelineRunner();
  PipelineRunner(const PipelineRunner&) = delete;
  PipelineRunner& operator=(const PipelineRunner&) = delete;

  const PipeSchedule& schedule() const { return schedule_; }
  int stage() const { return rank_; }
  // The rank's forward and backward passes in program order: the engine's pass order.
  std::vector<PassRef> passes() const;

  // Enqueues one cycle of the rank's program; returns once everything is issued (the compute
  // stream holds the passes). A channel's failure (a peer gone) is raised here or by the next call.
  void run_cycle(const PipeModel& model);
  // A forward-only pass of the evaluation slot through every chunk in pipeline order.
  void run_evaluation(const PipeModel& model);
  // Waits for every channel's transfers (the end of a cycle, before the next step's buffers move).
  void drain();

  // Stamps while on: the next cycles' spans are kept until measure() takes them.
  void set_tracing(bool on) { tracing_ = on; }
  // Opens a span of the caller's (the optimizer step) where `stream` is now; the returned function,
  // called after the span's work is enqueued, closes it there. Nothing while not tracing.
  std::function<void()> open_span(Stream& stream, SpanKind kind, int micro = 0, int chunk = 0);
  // Collective over the pipeline group: every rank's spans since the last measure(), drained and
  // synchronized, to rank 0 (the others get theirs only); the bubble of the last traced cycle.
  PipeMeasure measure(Stream& stream);

 private:
  struct Channel;
  struct PortState;
  // The state of the port buffer the model gives for (port, micro, chunk), made on first use.
  std::pair<TensorView, PortState*> port_state(const PipeModel& model, PipePort port, int micro, int chunk);
  void walk_cycle(const PipeModel& model);
  void wait_all();
  PipeMeasure gather_measure(Stream& stream);
  void walk_evaluation(const PipeModel& model);
  // Runs `work`; on an error, aborts the pipeline group (naming this stage; the channels, and the
  // engine's groups split from it, with it) before raising it.
  void guarded(const std::function<void()>& work);
  Channel& channel(PipeOp op);

  Device& device_;
  PipeSchedule schedule_;
  int rank_ = 0;
  std::vector<std::unique_ptr<Channel>> channels_;  // act out, act in, grad out, grad in
  std::unique_ptr<Communicator> stats_comm_;
  std::vector<std::unique_ptr<PortState>> ports_;
  Communicator& stages_;
  std::atomic<bool> tracing_{false};
  struct Stamps;
  std::shared_ptr<Stamps> stamps_;
};

// The wire form of a rank's spans for measure()'s all-gather: packed_floats(n) floats for n spans.
size_t packed_floats(size_t spans);
void pack_spans(const std::vector<PipeSpan>& spans, float* out);
std::vector<PipeSpan> unpack_spans(const float* in, size_t count);
// Busy time per rank, makespan and bubble from every rank's spans.
void summarize(PipeMeasure& measure);

// A p-stage pipeline whose passes sleep on each stage's compute stream (forward `unit`, backward
// twice that, each of the chunks its share; 1 KiB messages), on local ranks: a model of balanced
// work, so p stages run side by side on any number of cores and the runner's own cost is what
// separates the measured bubble from the formula. Rank 0's measure of one traced cycle.
PipeMeasure measure_sleeping_pipeline(PipeKind kind, int stages, int micro_batches, std::chrono::microseconds unit);

// A measured bubble and its trace as JSON: Chrome's trace event format (Perfetto reads it), one
// process per rank, one thread per lane.
nlohmann::json chrome_trace(const PipeMeasure& measure);

}  // namespace zeroth
