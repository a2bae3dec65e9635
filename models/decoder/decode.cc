// Generation with a key/value cache: the forward pass of gpt_step.cc over the next tokens of one
// sequence, each layer's attention reading the keys and values of the positions before from the
// cache (layers.h, KvCache) instead of recomputing them.
#include <algorithm>  // std::min

#include "core/error.h"  // ZEROTH_THROW
#include "models/decoder/gpt_state.h"

namespace zeroth {
namespace {

// Tokens per pass: a long prompt runs in passes of this many, so the attention's scratch is
// NH x kPass x max_len floats, not max_len squared.
constexpr int kPass = 64;

}  // namespace

gpt::KvCache Gpt::State::kv(int layer) const {
  const Dims d = Dims::of(cfg, part);
  const size_t rows = static_cast<size_t>(kv_len) * d.W;
  float* base = static_cast<float*>(kv_buffer.data());
  gpt::KvCache kv;
  kv.rows = base + layer * rows, kv.att = base + cfg.n_layer * rows, kv.pos = kv_pos;
  return kv;
}

void Gpt::begin_decoding(int max_len) {
  if (!part_.whole(config_) || part_.tp_ranks > 1 || part_.ep_ranks > 1 || part_.sq_ranks > 1 || part_.cp_ranks > 1) {
    ZEROTH_THROW(InvalidArgument, "generation runs on one rank holding the whole model; this one holds a part (pipeline stage, "
                                  "tensor-parallel slice, expert-parallel share of the experts, Ulysses or ring attention rank)");
  }
  if (max_len < 1 || max_len > config_.seq_len)
    ZEROTH_THROW(InvalidArgument, "generation of {} positions: the model knows 1 to model.seq_len = {}", max_len, config_.seq_len);
  auto& s = *state_;
  host_.compute_stream().synchronize();
  const Dims d = Dims::of(config_, part_);
  // The cache, and the attention's scratch for a pass over up to max_len positions.
  const size_t floats = static_cast<size_t>(config_.n_layer) * max_len * d.W + static_cast<size_t>(d.NH) * kPass * max_len;
  s.kv_buffer = host_.device().allocate(floats * sizeof(float), MemTag::activations);
  s.kv_len = max_len;
  s.kv_pos = 0;
}

void Gpt::decode(const int32_t* tokens, int n, float* logits) {
  auto& s = *state_;
  if (!s.kv_buffer) ZEROTH_THROW(InvalidArgument, "Gpt::decode before begin_decoding");
  if (n < 1 || s.kv_pos + n > s.kv_len) {
    ZEROTH_THROW(InvalidArgument, "decoding {} more tokens after {}: the cache holds {} positions (begin_decoding)", n, s.kv_pos,
                 s.kv_len);
  }
  for (int at = 0; at < n; at += kPass) {
    const int m = std::min(kPass, n - at);
    host_.begin_evaluation();
    try {
      run_forward(0, 0, tokens + at, nullptr, 1, m, nullptr, logits, false, true);
      host_.compute_stream().synchronize();
    } catch (...) {
      host_.end_evaluation();
      throw;
    }
    host_.end_evaluation();
    s.kv_pos += m;
  }
}

int Gpt::decoded() const { return state_->kv_pos; }

void Gpt::end_decoding() {
  host_.compute_stream().synchronize();
  state_->kv_buffer.reset();
  state_->kv_len = state_->kv_pos = 0;
}

}  // namespace zeroth
