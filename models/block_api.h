// The block API: the contract between a model and the engine that owns its parameters. A model is
// an ordered list of blocks; each declares its parameters once and, per micro-step, runs its
// forward and backward between the host's begin_/end_ calls on the views the host hands out.
// The engine implements BlockHost; models never see how parameters are sharded or gathered.
#pragma once

#include <array>       // std::array
#include <cstddef>     // size_t
#include <functional>  // std::function
#include <cstdint>     // int64_t, uint8_t
#include <string>      // std::string
#include <vector>      // std::vector

#include "core/device.h"  // Device, Stream, TensorView

namespace zeroth {

// How a parameter starts: its values depend on the run's seed and the parameter's name only,
// never on the world size or the shard layout.
struct InitRule {
  enum class Kind : uint8_t { zeros, constant, normal, uniform };
  Kind kind = Kind::zeros;
  double a = 0, b = 0;  // constant: a; normal: mean a, std b; uniform: [a, b)
  static InitRule zeros() { return {}; }
  static InitRule constant(double v) { return {Kind::constant, v, 0}; }
  static InitRule normal(double std, double mean = 0) { return {Kind::normal, mean, std}; }
  static InitRule uniform(double lo, double hi) { return {Kind::uniform, lo, hi}; }
};

// What a parameter is, for rules that treat kinds differently (weight decay exclusions).
enum class ParamRole : uint8_t { weight, bias, norm, embedding };

// How a parameter is split over a tensor-parallel group of `ranks`: the rank holds a slice of the
// tensor the unsplit model declares (same name, the same seeded values element for element), cut
// along `axis` of `full_shape`. The axis is `groups` equal segments (a fused QKV matrix: 3), each cut
// into `ranks` contiguous parts, the first (segment length mod ranks) of them one longer; the rank's
// part of every segment, in segment order, makes its tensor. axis -1: every rank holds the whole
// tensor (replicated), whose gradient counts once in the global norm (on rank 0).
struct TensorSplit {
  int axis = -1;
  int groups = 1;
  int rank = 0, ranks = 1;
  std::vector<int64_t> full_shape;  // the unsplit shape (set when axis >= 0)
  bool split() const { return axis >= 0 && ranks > 1; }
  bool replicated() const { return !split() && ranks > 1; }
  // [begin, end) of part `rank` of `ranks` of a segment of `length`.
  static std::array<int64_t, 2> part(int64_t length, int rank, int ranks);
  // The local shape of `full` cut this way (InvalidArgument when a segment does not divide).
  std::vector<int64_t> local_shape(const std::vector<int64_t>& full) const;
  // Local flat elements [lo, hi) as runs of the full tensor's flat elements: f(full_begin, count,
  // local_begin) per run, in local order. A replicated tensor is one run.
  void for_each_run(size_t lo, size_t hi, const std::function<void(size_t, size_t, size_t)>& f) const;
  // The `count` local elements from the whole tensor `full` into `local`, and back (`full` keeps its
  // other elements).
  void take(const float* full, float* local, size_t count) const;
  void put(const float* local, float* full, size_t count) const;
};

struct ParamSpec {
  std::string name;
  std::vector<int64_t> shape;  // what this rank holds (its slice, when split)
  InitRule init;
  ParamRole role = ParamRole::weight;
  TensorSplit tp = {};
  // Each tensor-parallel rank's gradient is a partial sum (a replicated parameter applied to its
  // shard of the sequence): the host sums it over the group before the data-parallel reduction.
  bool tp_partial_grad = false;
  // The host places the next parameter of the block right after this one, in the views and the
  // gradients, so the model may use the run as one tensor (q/k/v projections as one matrix).
  bool fused_with_next = false;
  size_t numel() const;
  // This parameter cut for rank `rank` of `ranks` along `axis` (-1: replicated) in `groups` segments.
  ParamSpec cut(int axis, int groups, int rank, int ranks, bool partial_grad = false) const;
};

struct BlockSpec {
  std::string name;
  std::vector<ParamSpec> params;
  // > 1: the block holds this rank's experts, which differ between the data-parallel ranks of each
  // run of `expert_parallel` consecutive ones (rank r holds slice r mod expert_parallel). The host
  // partitions it over the data-parallel ranks that hold the same slice, and reduces its gradients
  // there; its gradients are averaged over the whole data-parallel group all the same (every rank's
  // tokens reach the experts).
  int expert_parallel = 1;
  // Frozen: the host hands its backward no gradient views and keeps no gradients, no reduction and
  // no optimizer state for it; its parameters are still partitioned, gathered and placed as any.
  bool frozen = false;
};

// Where a model uses its blocks in one micro-step: forward uses, then backward uses. A block may
// appear more than once (tied weights); its gradients are complete after its last backward use.
struct BlockSchedule {
  std::vector<int> forward;
  std::vector<int> backward;
};

// Default schedule: forward in registration order, backward in reverse.
BlockSchedule default_schedule(size_t blocks);

enum class Pass : uint8_t { forward, backward };

// What a model allocates besides the parameters the host owns, per rank: the estimate adds it to
// the host's plan, and budgets are checked against the sum before anything is allocated.
struct ModelFootprint {
  size_t activations = 0;       // every activation slot, token ids, backward scratch (tag activations)
  size_t scratch = 0;           // f32 copies of narrow parameters and gradients (tag buffers)
  size_t host_activations = 0;  // activations the model keeps in host memory (checkpoints; tag activations)
  std::string note;             // what the activations are, for messages ("2 slots of a 4 x 128 micro-batch")
};

struct BlockViews {
  std::vector<TensorView> params;  // full parameters in the compute dtype, in the block's order
  std::vector<TensorView> grads;   // after begin_backward: where the backward ADDS its gradients
};

// Each call names the micro-batch of the accumulation cycle (0 .. gradient_accumulation - 1) it
// belongs to: a schedule may interleave micro-batches (1F1B runs the forward of micro-batch m + 1
// before the backward of m), and the host checks every call against its program.
class BlockHost {
 public:
  virtual ~BlockHost() = default;
  virtual int add_block(BlockSpec spec) = 0;
  virtual void set_schedule(BlockSchedule schedule) = 0;
  // A model in chunks (a pipeline rank's virtual stages): chunk c's forward and backward uses; every
  // block belongs to one chunk. A host that runs whole models only takes one.
  virtual void set_chunk_schedules(std::vector<BlockSchedule> chunks);
  virtual const BlockViews& begin_forward(int block, int micro) = 0;
  virtual void end_forward(int block, int micro) = 0;
  virtual const BlockViews& begin_backward(int block, int micro) = 0;
  virtual void end_backward(int block, int micro) = 0;
  // Micro-batches forwarded but not yet backwarded, at most: the activation slots a model keeps
  // (micro-batch m uses slot m mod this). Known once the host has planned.
  virtual int micro_batches_in_flight() const = 0;
  // The same for one model chunk (chunk c of micro-batch m in slot m mod this).
  virtual int chunk_micro_batches_in_flight(int /*chunk*/) const { return micro_batches_in_flight(); }
  // A forward-only pass (validation) between cycles: the forward uses of the schedule as
  // micro-batch 0, with begin_/end_forward, and no backward. Gradients and optimizer state are
  // left alone.
  virtual void begin_evaluation() = 0;
  virtual void end_evaluation() = 0;
  // The model enqueues its work here; the host orders its own work against it with events.
  virtual Stream& compute_stream() = 0;
  virtual Device& device() = 0;
  // Host memory for what the model keeps off the device (activation checkpoints), page-locked
  // where the host can, counted against the host's budget; the device's copies reach it.
  virtual Buffer allocate_host(size_t bytes, MemTag tag) = 0;
  virtual DType compute_dtype() const = 0;
  // The model multiplies the gradient of its mean loss by this: the f16 loss scale (1 otherwise)
  // divided by the number of micro-batches accumulated per step, as DeepSpeed divides each
  // micro-batch's loss before backward, so scaled gradients have DeepSpeed's magnitudes.
  virtual double loss_gradient_scale() const = 0;
};

}  // namespace zeroth
