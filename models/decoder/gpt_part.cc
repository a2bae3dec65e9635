// A rank's part of the model (GptPart): its chunks and the checks of its place in each parallel group
// (the pipeline's partition of the layers is gpt.cc's: it weighs the blocks).
#include <algorithm>  // std::max
#include <string>     // std::string
#include <vector>     // std::vector

#include <fmt/format.h>  // fmt::format

#include "core/error.h"           // ZEROTH_THROW
#include "models/decoder/dims.h"  // gpt::check_part

namespace zeroth {

namespace gpt {

void check_part(const GptConfig& c, const GptPart& part) {
  std::vector<int> owner(c.n_layer, -1);
  for (size_t k = 0; k < part.chunks.size(); ++k) {
    const auto [lo, hi] = part.chunks[k];
    if (lo < 0 || hi > c.n_layer || lo >= hi)
      ZEROTH_THROW(InvalidArgument, "GPT part: chunk {} holds layers [{}, {}) of a {}-layer model", k, lo, hi, c.n_layer);
    for (int l = lo; l < hi; ++l) {
      if (owner[l] >= 0) ZEROTH_THROW(InvalidArgument, "GPT part: layer {} is in chunks {} and {}", l, owner[l], k);
      owner[l] = static_cast<int>(k);
    }
  }
  if (part.tp_ranks < 1 || part.tp_rank < 0 || part.tp_rank >= part.tp_ranks)
    ZEROTH_THROW(InvalidArgument, "GPT part: tensor-parallel rank {} of {}", part.tp_rank, part.tp_ranks);
  if (c.llama() && c.kv_heads() % part.tp_ranks != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.tensor = {} splits the key/value heads over its ranks, but model.n_kv_head = {} is not a multiple of it; "
                 "as Megatron-LM, zeroth does not replicate key/value heads: use a tensor-parallel size that divides them",
                 part.tp_ranks, c.kv_heads());
  }
  if (part.ep_ranks < 1 || part.ep_rank < 0 || part.ep_rank >= part.ep_ranks)
    ZEROTH_THROW(InvalidArgument, "GPT part: expert-parallel rank {} of {}", part.ep_rank, part.ep_ranks);
  if (part.ep_ranks > 1 && (!c.moe.enabled() || c.moe.num_experts % part.ep_ranks != 0)) {
    ZEROTH_THROW(ConfigError,
                 "parallel.expert = {} shares each expert layer's experts out over its ranks, so it must divide "
                 "model.moe.num_experts, which is {}; use an expert-parallel size that divides the experts",
                 part.ep_ranks, c.moe.num_experts);
  }
  if (c.n_head % part.tp_ranks != 0) {
    ZEROTH_THROW(ConfigError,
                 "parallel.tensor = {} splits the attention heads over its ranks, but model.n_head = {} is not a multiple of it; "
                 "use a tensor-parallel size that divides the heads",
                 part.tp_ranks, c.n_head);
  }
  if (part.sq_ranks < 1 || part.sq_rank < 0 || part.sq_rank >= part.sq_ranks)
    ZEROTH_THROW(InvalidArgument, "GPT part: sequence-parallel rank {} of {}", part.sq_rank, part.sq_ranks);
  if (part.cp_ranks < 1 || part.cp_rank < 0 || part.cp_rank >= part.cp_ranks)
    ZEROTH_THROW(InvalidArgument, "GPT part: context-parallel rank {} of {}", part.cp_rank, part.cp_ranks);
  if (part.sq_ranks > 1 && part.cp_ranks > 1) {
    ZEROTH_THROW(ConfigError,
                 "parallel.sequence = {} (Ulysses) and parallel.context = {} (ring attention) both split each sample's positions; "
                 "they do not compose yet: use one of them",
                 part.sq_ranks, part.cp_ranks);
  }
  if (part.sq_ranks > 1) {
    // Ulysses hands each rank of the group whole heads: the query heads split evenly, the
    // key/value heads too, or each rank takes one replicated where there are fewer than ranks.
    const int heads = c.n_head / part.tp_ranks, kv = c.kv_heads() / part.tp_ranks, u = part.sq_ranks;
    if (heads % u != 0) {
      ZEROTH_THROW(ConfigError,
                   "parallel.sequence = {} splits the attention heads over its ranks, but each {} has {} (model.n_head = {}{}), "
                   "not a multiple of it; use a sequence-parallel size that divides them",
                   u, part.tp_ranks > 1 ? "tensor-parallel rank" : "rank", heads, c.n_head,
                   part.tp_ranks > 1 ? fmt::format(" over parallel.tensor = {}", part.tp_ranks) : "");
    }
    if (kv % u != 0 && u % kv != 0) {
      ZEROTH_THROW(ConfigError,
                   "parallel.sequence = {} shares the {} key/value heads out over its ranks (model.n_kv_head = {}{}): it must "
                   "divide them, or be a multiple of them (each rank then takes a copy of the one its query heads read); use "
                   "such a sequence-parallel size",
                   u, kv, c.kv_heads(), part.tp_ranks > 1 ? fmt::format(" over parallel.tensor = {}", part.tp_ranks) : "");
    }
  }
  if (c.vocab_size < part.tp_ranks) {
    ZEROTH_THROW(ConfigError, "parallel.tensor = {} splits the vocabulary, but model.vocab_size is only {}", part.tp_ranks,
                 c.vocab_size);
  }
  if (c.cpu_checkpointing && !part.whole(c)) {
    ZEROTH_THROW(ConfigError,
                 "activation_checkpointing.cpu_checkpointing keeps a whole model's block inputs in host memory and cannot run on a "
                 "pipeline stage; turn it off (model.activation_checkpointing still recomputes each layer, with its inputs on the "
                 "device) or train without parallel.pipeline");
  }
}

}  // namespace gpt

bool GptPart::whole(const GptConfig& c) const {
  return chunks.empty() || (chunks.size() == 1 && chunks[0][0] == 0 && chunks[0][1] == c.n_layer);
}
bool GptPart::has_embedding() const {
  if (chunks.empty()) return true;
  for (const auto& ch : chunks) {
    if (ch[0] == 0) return true;
  }
  return false;
}
bool GptPart::has_head(const GptConfig& c) const {
  if (chunks.empty()) return true;
  for (const auto& ch : chunks) {
    if (ch[1] == c.n_layer) return true;
  }
  return false;
}
bool GptPart::first_chunk(int chunk) const { return chunks.empty() ? chunk == 0 : chunks.at(chunk)[0] == 0; }
bool GptPart::last_chunk(int chunk, const GptConfig& c) const {
  return chunks.empty() ? chunk == 0 : chunks.at(chunk)[1] == c.n_layer;
}

GptPart GptPart::of_rank(const std::vector<int>& layers, int stages, int rank) {
  ZEROTH_CHECK(stages >= 1 && rank >= 0 && rank < stages && !layers.empty() && layers.size() % stages == 0,
               "GptPart::of_rank: {} virtual stages over {} stages, rank {}", layers.size(), stages, rank);
  std::vector<int> start(layers.size() + 1, 0);
  for (size_t k = 0; k < layers.size(); ++k) start[k + 1] = start[k] + layers[k];
  GptPart part;
  for (size_t k = rank; k < layers.size(); k += stages) part.chunks.push_back({start[k], start[k + 1]});
  return part;
}

}  // namespace zeroth
