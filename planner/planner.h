// `zeroth plan`: every dp x tp x pp layout (and expert-parallel size, for a mixture of experts),
// ZeRO stage, offload placement, micro-batch and recomputation of a GPT on a cluster, those that do not fit discarded by the memory of
// planner/gpt_layout.h, the rest ranked by a step-time model. The model counts what a step must do and
// how long the cluster's links and devices take for it: FLOPs of the matmuls at a stated fraction of
// peak and the elementwise work at memory bandwidth, ring collectives at the links' bus bandwidth, the pipeline bubble (p - 1) / (m +
// p - 1), PCIe, NVMe and the CPU optimizer for offloaded state; it overlaps what the engine overlaps (the gradient reduction with
// backward, stage-3 gathers with compute, NVMe with the CPU update).
#pragma once

#include <cstdint>  // uint64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "planner/gpt_layout.h"  // GptShape, Layout, LayoutMemory

namespace zeroth {

// Defaults: a DGX A100 80GB node, the hardware of Megatron-LM's and the ZeRO papers' published
// runs, so the planner's figures compare with theirs.
struct Cluster {
  uint64_t gpus_per_node = 8, nodes = 1;
  uint64_t device_memory = 80ull << 30;           // per GPU
  uint64_t host_memory = 1ull << 40;              // per node
  uint64_t nvme_capacity = 0;                     // per node; 0: unlimited
  uint64_t runtime_memory = kDeviceRuntimeBytes;  // per GPU: CUDA context, NCCL and cuBLAS workspaces
  double peak_flops = 312e12;                     // per GPU, dense 16-bit matmul
  // The fraction of peak the layers' matmuls reach. Their elementwise work (layer norms, softmax,
  // GeLU, dropout, residuals) is memory-bound and timed apart, at device_memory_bw over the bytes of
  // activations it writes. 0.6 puts Megatron-LM's published runs (Narayanan et al. 2021, Table 1,
  // 1.7B to 1T on A100s) within 15% of what they measured.
  double matmul_efficiency = 0.6;
  double achieved_flops() const { return peak_flops * matmul_efficiency; }
  double intra_node_bw = 230e9;      // all-reduce bus bandwidth inside a node, bytes/s (NVLink)
  double inter_node_bw = 200e9;      // network bandwidth per node, bytes/s (8 x 200 Gb/s)
  double pcie_bw = 24e9;             // host <-> GPU per GPU, bytes/s
  double nvme_bw = 25e9;             // per node, bytes/s, read and write
  double device_memory_bw = 2.0e12;  // per GPU, bytes/s (the optimizer step on the device)
  double cpu_optimizer_rate = 5e9;   // Adam parameters per second per node on its CPUs
  uint64_t gpus() const { return gpus_per_node * nodes; }

  // Takes the constants a `zeroth bench ... --json` output measures: bench train (achieved
  // FLOP/s), bench comm (intra-node all-reduce bus bandwidth), bench optim (CPU AdamW rate),
  // bench offload (NVMe read/write; host <-> device copies with --device cuda). Returns what it
  // set, one line each; InvalidArgument when the JSON is none of them.
  std::vector<std::string> calibrate(const nlohmann::json& bench);
};

// Seconds of one optimizer step, by what takes them (each part is the exposed time: what the
// engine cannot overlap with something else).
struct StepCost {
  double compute = 0;      // forward and backward (with recomputation) of every micro-batch
  double bubble = 0;       // the pipeline's fill and drain
  double tensor = 0;       // tensor-parallel all-reduces (or reduce-scatter + all-gather)
  double pipeline = 0;     // activations sent between stages
  double experts = 0;      // expert-parallel all-to-alls, what the expert products leave exposed
  double sequence = 0;     // Ulysses' all-to-alls around each attention, or the ring's exposed sends
  double data = 0;         // data-parallel collectives not hidden under compute
  double offload = 0;      // PCIe and NVMe traffic not hidden
  double optimizer = 0;    // the update (device, or CPU for an offloaded optimizer)
  double step = 0;         // the sum
  double model_flops = 0;  // per step, all GPUs: 6 P tokens + attention, without recomputation
  double mfu = 0;          // model_flops / (step x GPUs x peak)
  double tokens_per_s = 0;
  std::string bound;  // the largest part's name
};

// The time an expert layer's pass leaves its all-to-alls exposed beyond its expert products, as
// models/decoder schedules them: x the time of one direction's exchanges, cf the forward's products (the
// backward's input gradients take cf too, its weight gradients another cf), n local expert slots.
double moe_exposed_exchange(double x, double cf, int n, bool backward);
StepCost step_cost(const GptShape& shape, const Layout& layout, const LayoutMemory& memory, const Cluster& cluster);

struct PlanSearch {
  uint64_t global_batch = 0;  // sequences per step; required
  uint64_t max_micro_batch = 64;
  bool offload = true;         // consider optimizer and parameter offload
  bool runnable_only = false;  // only what this engine runs: full or no recomputation (not selective)
  int stage = -1;              // -1: every stage
  // Layouts whose attention keeps its s x s scores (Layout::attention_scores), as systems without
  // blocked attention do; zeroth's keeps each row's log-sum-exp.
  bool attention_scores = false;
  size_t top = 10;
  BufferSizes buffers;  // the bucket sizes a run would use
  // Long windows: Ulysses sizes (divisors of the data-parallel size the heads allow), the tiled
  // MLP and host checkpoints searched too.
  bool sequence = false;
  // Ring attention's sizes too (divisors of the data-parallel size that split the window into
  // 2 cp chunks): zeroth runs it on the cpu device only.
  bool context = false;
};

struct Candidate {
  Layout layout;
  LayoutMemory memory;
  StepCost cost;
  bool fits = false;
};

struct PlanResult {
  std::vector<Candidate> best;  // fastest first, at most search.top
  uint64_t considered = 0, fitting = 0;
  Candidate smallest;  // the least device memory of all considered: what to say when none fits
};

// Whether `memory` fits the cluster (device per GPU, host and NVMe per node); "" when it does,
// else what does not.
std::string does_not_fit(const LayoutMemory& memory, const Cluster& cluster);

PlanResult search_plans(const GptShape& shape, const Cluster& cluster, const PlanSearch& search);

// The longest window (shape.seq_len) some layout of search_plans fits on the cluster, in steps of
// `granule` positions (doubling, then halving the gap), and the plans at it; seq_len 0 when not
// even one granule fits. The memory grows with the window in every term that depends on it, so
// the fitting windows are a prefix.
struct WindowResult {
  uint64_t seq_len = 0;
  PlanResult plans;
  uint64_t probes = 0;
  bool capped = false;  // seq_len is `limit`: longer windows would fit too
};
// The longest window, in granules, that some layout fits, up to `limit` positions (the engine's
// model.seq_len bound: GptConfig::kMaxSeqLen).
WindowResult longest_window(GptShape shape, const Cluster& cluster, const PlanSearch& search, uint64_t granule, uint64_t limit);

}  // namespace zeroth
