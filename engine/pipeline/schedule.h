// Pipeline schedules as programs: for every rank of a p-stage pipeline, the ordered list of what it
// does with m micro-batches (forward, backward, and the sends and receives of activations and
// their gradients between neighbours), for GPipe (Huang et al. 2019), 1F1B (PipeDream-Flush,
// Narayanan et al. 2019) and Megatron-LM's interleaved 1F1B (Narayanan et al. 2021, v model chunks
// per rank). Decisions as data: check_schedule() proves a schedule deadlock free before anything
// runs, and simulate_schedule() gives its timeline, bubble and activation memory.
#pragma once

#include <cstdint>  // uint8_t
#include <string>   // std::string
#include <vector>   // std::vector

namespace zeroth {

enum class PipeKind : uint8_t { gpipe, one_f_one_b, interleaved };
std::string_view pipe_kind_name(PipeKind kind);

enum class PipeOp : uint8_t { forward, backward, send_activation, recv_activation, send_gradient, recv_gradient };
std::string_view pipe_op_name(PipeOp op);

struct PipeAction {
  PipeOp op = PipeOp::forward;
  int micro_batch = 0;
  int chunk = 0;  // the model chunk on this rank (0 without interleaving)
  int peer = -1;  // the neighbour rank of a send or receive
  bool operator==(const PipeAction&) const = default;
};

struct PipeSchedule {
  PipeKind kind = PipeKind::one_f_one_b;
  int stages = 1, micro_batches = 1, chunks = 1;  // p, m, v
  std::vector<std::vector<PipeAction>> ranks;     // ranks[r]: rank r's program, in order

  // Virtual stage of (rank, chunk): chunk x p + rank; the model's layers run in that order.
  int virtual_stage(int rank, int chunk) const { return chunk * stages + rank; }
  std::string describe(int rank) const;  // "F0 >a0 | <g0 B0 ..." one line per rank, for --dry-run
};

// InvalidArgument when p, m or v is out of range (interleaving needs v >= 2 and m a multiple of p,
// as Megatron-LM's does; GPipe and 1F1B take v = 1).
PipeSchedule make_pipe_schedule(PipeKind kind, int stages, int micro_batches, int chunks = 1);

// Empty when the schedule is sound, else the first problem found, naming the rank and action:
// every (micro-batch, chunk) runs forward and backward exactly once on its rank, each after what
// it needs (the forward after its activation arrived, the backward after its forward and its
// gradient); every send has its receive on the neighbour, in the same order per direction; and
// running it with receives that wait and sends that do not finishes (no cycle of waits).
std::string check_schedule(const PipeSchedule& schedule);

struct PipeTimeline {
  double makespan = 0;              // when the last rank finishes
  std::vector<double> busy;         // per rank: time in forward and backward
  std::vector<int> peak_in_flight;  // per rank: most micro-batch activations alive at once
  double bubble() const;            // 1 - sum(busy) / (ranks x makespan)
};

// Runs the schedule with forward taking `forward` and backward `backward` time units per chunk
// (sends instantaneous): the bubble and activation memory the schedule itself implies.
PipeTimeline simulate_schedule(const PipeSchedule& schedule, double forward = 1.0, double backward = 2.0);

// The bubble fraction of the papers: (p - 1) / (m + p - 1) for GPipe and 1F1B, (p - 1) / (v m + p - 1)
// with v interleaved chunks.
double pipe_bubble_formula(PipeKind kind, int stages, int micro_batches, int chunks = 1);

}  // namespace zeroth
