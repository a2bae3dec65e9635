// What a run plans before it starts, per stage (train/trainer.h): the engine's plan for the
// stage's part of the model, its footprint and the estimate of both; and the host memory a rank
// holds outside the engine.
#include <vector>  // std::vector

#include "core/cpu/gemm.h"           // gemm_host_bytes
#include "engine/pipeline/runner.h"  // pipe_passes
#include "engine/plan/estimate.h"    // estimate
#include "models/decoder/gpt.h"      // Gpt
#include "models/kernels/kernels.h"  // attention_keeps_probabilities
#include "train/data.h"              // open_run_data, run_data_host_bytes
#include "train/trainer.h"

namespace zeroth {

void check_data(const TrainConfig& config) { open_run_data(config, config.sample_parallel(), 0); }

StagePlan plan_stage(const TrainConfig& config, int stage, int dp_rank, int tp_rank) {
  const int pp = config.parallel.pipeline;
  const GptPart part = config.part(stage, tp_rank, dp_rank);
  std::vector<PassRef> passes;
  if (pp > 1) {
    passes = pipe_passes(make_pipe_schedule(config.parallel.schedule, pp, static_cast<int>(config.engine.gradient_accumulation_steps),
                                            config.parallel.virtual_stages),
                         stage);
  }
  StagePlan out;
  out.plan = make_plan(Gpt::block_specs(config.model, part), Gpt::schedules(config.model, part), config.engine, config.data_parallel(),
                       dp_rank, passes);
  if (pp > 1 && config.model.tie_word_embeddings && (stage == 0 || stage == pp - 1))
    tie_block(out.plan, Gpt::embedding_block(config.model, part), stage == 0);
  out.plan.stages = pp;
  GptConfig model = config.model;
  model.attention_probabilities = gpt::attention_keeps_probabilities(config.run.device == "cpu" ? DeviceKind::cpu : DeviceKind::cuda);
  // A Ulysses rank holds its share of each sample's positions.
  out.model = Gpt::footprint(model, static_cast<int>(config.micro_batch_size), config.model.seq_len / config.sample_ranks(),
                             config.engine.compute_dtype, out.plan.chunk_in_flight, part);
  out.need = estimate(out.plan, out.model, config.run.checkpoint_async, !config.run.resume.empty());
  return out;
}

size_t run_host_bytes(const TrainConfig& config, bool count_data) {
  return (count_data ? run_data_host_bytes(config) : 0) + kRankThreadsHostBytes + cpu::gemm_host_bytes();
}

StagePlan largest_stage(const TrainConfig& config, int* stage) {
  StagePlan best;
  for (int s = 0; s < config.parallel.pipeline; ++s) {
    StagePlan p = plan_stage(config, s, 0);
    if (s == 0 || p.need.total(Tier::device) > best.need.total(Tier::device)) {
      best = std::move(p);
      if (stage != nullptr) *stage = s;
    }
  }
  return best;
}

}  // namespace zeroth
