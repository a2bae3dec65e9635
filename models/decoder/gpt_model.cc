// The Gpt object: its construction (blocks, schedules, streams), teardown, and the calls that route
// to the passes (gpt_step.cc).
#include <exception>  // std::exception
#include <utility>    // std::pair

#include "core/error.h"  // ZEROTH_THROW
#include "core/log.h"    // ZLOG_WARN
#include "models/decoder/gpt_state.h"
#include "models/decoder/layers.h"   // gpt::part_blocks
#include "models/kernels/kernels.h"  // gpt::make_kernels

namespace zeroth {

Gpt::Gpt(BlockHost& host, GptConfig config, GptPart part, Communicator* tensor, Communicator* experts, Communicator* sequence)
    : host_(host),
      config_(config),
      part_(gpt::complete_part(part, config)),
      tensor_(tensor),
      experts_comm_(experts),
      sequence_(sequence),
      state_(std::make_shared<State>()) {
  const int group = tensor != nullptr ? tensor->size() : 1, rank = tensor != nullptr ? tensor->rank() : 0;
  if (part_.tp_ranks != group || (group > 1 && part_.tp_rank != rank)) {
    ZEROTH_THROW(InvalidArgument, "GPT part for tensor-parallel rank {} of {}, but the group given makes it rank {} of {}",
                 part_.tp_rank, part_.tp_ranks, rank, group);
  }
  const int ep = experts != nullptr ? experts->size() : 1, ep_rank = experts != nullptr ? experts->rank() : 0;
  if (part_.ep_ranks != ep || (ep > 1 && part_.ep_rank != ep_rank)) {
    ZEROTH_THROW(InvalidArgument, "GPT part for expert-parallel rank {} of {}, but the group given makes it rank {} of {}",
                 part_.ep_rank, part_.ep_ranks, ep_rank, ep);
  }
  const int sq = sequence != nullptr ? sequence->size() : 1, sq_rank = sequence != nullptr ? sequence->rank() : 0;
  const int mine = part_.sq_ranks > 1 ? part_.sq_rank : part_.cp_rank;
  if (part_.sample_ranks() != sq || (sq > 1 && mine != sq_rank)) {
    ZEROTH_THROW(InvalidArgument, "GPT part for {} rank {} of {}, but the group given makes it rank {} of {}",
                 part_.cp_ranks > 1 ? "context-parallel" : "sequence-parallel", mine, part_.sample_ranks(), sq_rank, sq);
  }
  if (part_.cp_ranks > 1 && host_.device().kind() != DeviceKind::cpu) {
    ZEROTH_THROW(ConfigError,
                 "parallel.context = {} runs ring attention, whose kernels run on the cpu device only; on {} split long windows "
                 "with parallel.sequence (Ulysses) instead",
                 part_.cp_ranks, host_.device().name());
  }
  auto specs = block_specs(config_, part_);
  for (auto& spec : specs) host_.add_block(std::move(spec));
  const gpt::PartBlocks ids = gpt::part_blocks(config_, part_);
  embed_ = ids.embed, ln_f_ = ids.ln_f, head_ = ids.head, layers_ = ids.layers, experts_ = ids.experts, lora_ = ids.lora;
  expert_lora_ = ids.expert_lora;
  host_.set_chunk_schedules(schedules(config_, part_));
  config_.attention_probabilities = gpt::attention_keeps_probabilities(host_.device().kind());
  state_->cfg = config_;
  state_->part = part_;
  state_->host = &host_;
  state_->device = &host_.device();
  state_->k = gpt::make_kernels(host_.compute_stream());
  if (part_.ep_ranks > 1 && part_.ep_overlap) state_->exchange = host_.device().create_stream();
  if (part_.cp_ranks > 1) {
    state_->ring_stream = host_.device().create_stream();
    for (auto& e : state_->ring_events) e = host_.device().create_event();
  }
  if (config_.cpu_checkpointing) {
    state_->restore_stream = host_.device().create_stream();
    state_->copy_free = host_.device().create_event();
    for (auto& e : state_->restored) e = host_.device().create_event();
  }
}

Gpt::~Gpt() {
  // Work still queued on the stream uses the state's buffers. A destructor must not throw: an
  // error the stream kept (the run is usually unwinding from it already) is logged instead.
  try {
    host_.compute_stream().synchronize();
  } catch (const std::exception& e) {
    ZLOG_WARN("GPT teardown: the compute stream had failed: {}", e.what());
  }
  for (const auto& [side, name] : {std::pair{state_->exchange.get(), "the expert all-to-alls'"},
                                   std::pair{state_->restore_stream.get(), "the host checkpoints'"}}) {
    if (side == nullptr) continue;
    try {
      side->synchronize();
    } catch (const std::exception& e) {
      ZLOG_WARN("GPT teardown: {} stream had failed: {}", name, e.what());
    }
  }
}


MoeStats Gpt::take_moe_stats() {
  MoeStats out = state_->moe_stats;
  state_->moe_stats = {};
  return out;
}

void Gpt::time_exchanges(bool on) { state_->time_exchanges = on; }

double Gpt::take_exchange_seconds() { return static_cast<double>(state_->exchange_nanos.exchange(0)) * 1e-9; }

void Gpt::forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, int micro,
                           const int32_t* positions) {
  forward(micro, tokens, targets, B, T, loss, positions);
  backward(micro);
}

void Gpt::evaluate(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits, const int32_t* positions) {
  if (!part_.whole(config_)) ZEROTH_THROW(InvalidArgument, "Gpt::evaluate on a pipeline stage; run its chunks (evaluate_chunk)");
  if (logits != nullptr && part_.tp_ranks > 1) {
    ZEROTH_THROW(InvalidArgument, "Gpt::evaluate with logits on tensor-parallel rank {} of {}: a rank holds only its vocabulary slice",
                 part_.tp_rank, part_.tp_ranks);
  }
  host_.begin_evaluation();
  try {
    run_forward(0, 0, tokens, targets, B, T, loss, logits, false, false, positions);
  } catch (...) {
    host_.end_evaluation();
    throw;
  }
  host_.end_evaluation();
}

void Gpt::evaluate_chunk(int chunk, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss,
                         const int32_t* positions) {
  run_forward(0, chunk, tokens, targets, B, T, loss, nullptr, false, false, positions);
}

void Gpt::forward(int micro, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, const int32_t* positions) {
  if (!part_.whole(config_)) ZEROTH_THROW(InvalidArgument, "Gpt::forward on a pipeline stage; run its chunks (forward_chunk)");
  run_forward(micro, 0, tokens, targets, B, T, loss, nullptr, true, false, positions);
}

void Gpt::backward(int micro) {
  if (!part_.whole(config_)) ZEROTH_THROW(InvalidArgument, "Gpt::backward on a pipeline stage; run its chunks (backward_chunk)");
  run_backward(micro, 0);
}

void Gpt::forward_chunk(int micro, int chunk, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss,
                        const int32_t* positions) {
  run_forward(micro, chunk, tokens, targets, B, T, loss, nullptr, true, false, positions);
}

void Gpt::backward_chunk(int micro, int chunk) { run_backward(micro, chunk); }


}  // namespace zeroth
