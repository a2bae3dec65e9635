// The engine's plan: decided once from the blocks, the config and the world size, then walked by
// every step. It fixes each block's flat layout and shard, the buckets, the stage-3 gather and
// release points along the block schedule, the arena offsets of transient buffers, and the bytes
// per memory tag that a rank holds at peak. Every rank computes the same plan, so collective
// membership and order never depend on what happens at run time.
#pragma once

#include <array>    // std::array
#include <cstddef>  // size_t
#include <cstdint>  // int64_t
#include <string>   // std::string
#include <vector>   // std::vector

#include <nlohmann/json_fwd.hpp>  // nlohmann::json

#include "core/memory.h"    // kMemTagCount
#include "engine/config.h"  // EngineConfig
#include "models/block_api.h"  // BlockSpec, BlockSchedule

namespace zeroth {

struct PlannedBlock {
  std::string name;
  std::vector<size_t> param_offsets;  // element offsets in the block's flat buffer
  size_t numel = 0;                    // sum of parameter sizes, without padding
  size_t padded = 0;                   // flat size: a multiple of dp * alignment
  size_t shard = 0;                    // padded / dp
  size_t shard_offset = 0;             // in the rank's concatenated shard space
  size_t full_offset = 0;              // in the concatenated full space (stages 0-2, persistent blocks)
  bool persistent = false;             // stage 3: small enough to stay gathered
  int reduce_bucket = -1;
  int gather_bucket = -1;  // stages 1-2: the post-step all-gather bucket
};

// Consecutive blocks in shard order whose collective runs as one.
struct Bucket {
  std::vector<int> blocks;
  size_t shard_offset = 0;  // of the first block
  size_t shard_numel = 0;   // per rank
  size_t full_offset = 0;
  bool staged = false;      // goes through the rank-major staging buffer (more than one block, or a dtype change)
};

// One step of a micro-step's walk (stage 3 gathers and releases; transient gradient buffers).
struct PlannedUse {
  int block = -1;
  bool backward = false;
  bool last_backward_use = false;  // gradients complete after it
  struct Gather {
    int block;
    size_t arena_offset;  // elements of the compute dtype in the parameter arena
  };
  std::vector<Gather> gathers;        // issued before this use (on demand and prefetch)
  std::vector<int> releases;          // after this use
  bool grad_alloc = false;            // first backward use: the gradient buffer is placed
  size_t grad_arena_offset = 0;       // elements of the compute dtype in the gradient arena
  // After this use. Stages 0-1: the block itself, once added to the accumulator; 2-3: the blocks
  // of the bucket fired before this use's (double buffering), and at the end every one left.
  std::vector<int> grad_releases;
  int fire_bucket = -1;               // the reduce bucket that is complete after this use
};

struct Plan {
  int stage = 0;
  int dp = 1;
  int rank = 0;
  DType compute_dtype = DType::f32;
  DType comm_dtype = DType::f32;
  int state_arrays = 0;
  std::vector<PlannedBlock> blocks;  // in registration order
  std::vector<int> shard_order;      // block indices by last backward use
  std::vector<Bucket> reduce_buckets, gather_buckets;
  std::vector<PlannedUse> uses;      // forward uses, then backward uses
  size_t total_numel = 0, total_padded = 0, shard_numel = 0;  // shard_numel: this rank's, all blocks
  size_t persistent_numel = 0;                                 // stage 3, full elements held
  size_t param_arena = 0, grad_arena = 0;                      // elements of the compute dtype
  size_t reduce_staging = 0, gather_staging = 0;               // elements (comm dtype / compute dtype)
  bool master_aliases_params = false;  // f32 compute: the master weights are the parameters' own shard
  std::array<size_t, kMemTagCount> bytes{};  // what the engine holds per tag at peak

  size_t total_bytes() const;
  nlohmann::json to_json() const;
  std::string table() const;  // compact, for the log at start
};

// Throws ConfigError on a schedule that names unknown blocks or misses one.
Plan make_plan(const std::vector<BlockSpec>& blocks, const BlockSchedule& schedule, const EngineConfig& config, int dp,
               int rank);

}  // namespace zeroth
