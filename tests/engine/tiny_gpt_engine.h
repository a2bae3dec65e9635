// The engine settings the tiny-GPT equivalence tests share (gpt_equivalence_test.cc,
// pipeline_test.cc): small buckets so that several fire, ln_f persistent at stage 3, clipping,
// AdamW with weight decay and a linear warm-up, a fixed seed.
#pragma once

#include "engine/config/config.h"  // EngineConfig

namespace zeroth::testing {

inline EngineConfig tiny_gpt_engine(int stage, int gradient_accumulation, DType compute = DType::f32) {
  EngineConfig ec;
  ec.zero.stage = stage;
  ec.zero.reduce_bucket_size = 6000;  // a layer of the tiny GPT (12.6k elements) is a bucket by itself
  ec.zero.allgather_bucket_size = 6000;
  ec.zero.stage3_prefetch_bucket_size = 8000;
  ec.zero.stage3_param_persistence_threshold = 100;  // ln_f stays whole
  ec.zero.stage3_max_reuse_distance = 0;
  ec.compute_dtype = compute;
  ec.gradient_accumulation_steps = gradient_accumulation;
  ec.gradient_clipping = 1.0;
  ec.optimizer.lr = 1e-2;
  ec.optimizer.weight_decay = 0.01;
  ec.schedule.kind = ScheduleKind::warmup;
  ec.schedule.warmup_max_lr = 1e-2;
  ec.schedule.warmup_num_steps = 2;
  ec.schedule.warmup_type = WarmupType::linear;
  ec.seed = 7;
  return ec;
}

}  // namespace zeroth::testing
