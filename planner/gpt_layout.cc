// Korthikanti's activations and the ZeRO paper's model states for a GPT at a parallel layout.
#include "planner/gpt_layout.h"

#include <algorithm>  // std::max, std::min
#include <cmath>      // std::log, std::llround

#include <fmt/format.h>  // fmt::format

#include "core/memory.h"           // logits_chunk_rows
#include "planner/model_states.h"  // zero_model_states

namespace zeroth {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
uint64_t round_bytes(double v) { return static_cast<uint64_t>(std::llround(v)); }

// Narayanan et al. 2021, Table 1: parameters (billions), heads, hidden, layers.
struct PublishedShape {
  double billions;
  uint64_t heads, hidden, layers;
};
constexpr PublishedShape kMegatronShapes[] = {
    {1.7, 24, 2304, 24},   {3.6, 32, 3072, 30},    {7.5, 32, 4096, 36},     {18.4, 48, 6144, 40},     {39.1, 64, 8192, 48},
    {76.1, 80, 10240, 60}, {145.6, 96, 12288, 80}, {310.1, 128, 16384, 96}, {529.6, 128, 20480, 105}, {1008.0, 160, 25600, 128},
};

}  // namespace

GptShape GptShape::llama_shape(uint64_t layers, uint64_t hidden, uint64_t heads, uint64_t kv_heads, uint64_t ffn, uint64_t seq_len,
                               uint64_t vocab, bool tied) {
  GptShape s{layers, hidden, heads, seq_len, vocab};
  s.kv_heads = kv_heads, s.ffn = ffn, s.llama = true, s.tied = tied;
  return s;
}

uint64_t GptShape::layer_vector_params() const {
  if (llama) return 2 * hidden + (qkv_bias ? hidden + 2 * kv_width() : 0);  // two RMSNorm weights, Qwen2's biases
  return 4 * hidden + 2 * hidden + kv_width() * 2 + mlp_width() + hidden;   // LayerNorms; q, k, v, o, up, down biases
}

uint64_t GptShape::layer_slice(uint64_t tp) const {
  // The norms, and GPT-2's two row-parallel biases; q/k/v biases are column-parallel, split.
  const uint64_t whole = llama ? 2 * hidden : 6 * hidden;
  return (layer_params() - whole) / tp + whole;
}

uint64_t GptShape::moe_layer_shared_params() const { return layer_params() - mlp_params(mlp_width()) + experts * hidden; }

uint64_t GptShape::moe_layer_shared_slice(uint64_t tp) const {
  // Whole: the norms, GPT-2's attention output bias, the router.
  const uint64_t whole = (llama ? 2 : 5) * hidden + experts * hidden;
  return (moe_layer_shared_params() - whole) / tp + whole;
}

uint64_t GptShape::moe_layer_active_matmul() const {
  return attention_matmul_params() + experts * hidden + top_k * expert_matmul_params();
}

uint64_t GptShape::params() const {
  const uint64_t embeddings = vocab * hidden * (tied ? 1 : 2) + (llama ? 0 : seq_len * hidden);
  const uint64_t expert_layer = moe() ? moe_layer_shared_params() + experts * expert_params() : 0;
  return (layers - moe_layers()) * layer_params() + moe_layers() * expert_layer + embeddings + (llama ? hidden : 2 * hidden);
}

uint64_t GptShape::active_params() const { return params() - moe_layers() * (experts - std::min(top_k, experts)) * expert_params(); }

GptShape GptShape::from_params(uint64_t params, uint64_t seq_len, uint64_t vocab) {
  const PublishedShape* best = &kMegatronShapes[0];
  for (const auto& s : kMegatronShapes) {
    if (std::abs(std::log(s.billions * 1e9 / static_cast<double>(params))) <
        std::abs(std::log(best->billions * 1e9 / static_cast<double>(params))))
      best = &s;
  }
  GptShape shape{0, best->hidden, best->heads, seq_len, vocab};
  const double rest = static_cast<double>(params) - static_cast<double>((vocab + seq_len + 2) * best->hidden);
  const double layers = rest / static_cast<double>(shape.layer_params());
  shape.layers = std::max<uint64_t>(4, 4 * static_cast<uint64_t>(std::max<long long>(1, std::llround(layers / 4))));
  return shape;
}

std::string GptShape::describe() const {
  std::string out = fmt::format("{} layers, hidden {}, {} heads, seq {}, vocab {}", layers, hidden, heads, seq_len, vocab);
  if (llama) out += fmt::format(", Llama: {} key/value heads, SwiGLU {}, {} head", kv_heads, mlp_width(), tied ? "tied" : "untied");
  return out;
}

std::string GptShape::problem() const {
  if (layers == 0 || hidden == 0 || heads == 0 || seq_len == 0 || vocab == 0)
    return "every dimension (layers, hidden, heads, seq, vocab) must be positive";
  if (hidden % heads != 0) return fmt::format("hidden {} is not a multiple of heads {}", hidden, heads);
  if (kv_heads > 0 && heads % kv_heads != 0) return fmt::format("heads {} is not a multiple of key/value heads {}", heads, kv_heads);
  if (moe() && (top_k < 1 || top_k > experts)) return fmt::format("top_k {} must be within 1 and the {} experts", top_k, experts);
  if (moe() && (moe_every < 1 || moe_every > layers))
    return fmt::format("every {}: expert layers come every 1 to {} (the layers) layers", moe_every, layers);
  return "";
}

std::string_view checkpointing_name(Checkpointing c) {
  switch (c) {
    case Checkpointing::none: return "none";
    case Checkpointing::selective: return "selective";
    case Checkpointing::full: return "full";
  }
  return "?";
}


std::string Layout::describe() const {
  std::string out = fmt::format("dp {} x tp {} x pp {}, micro-batch {} x {}, ZeRO-{}", dp, tp, pp, micro_batch, micro_batches, stage);
  if (ep > 1) out += fmt::format(", experts over {} ranks", ep);
  if (offload_optimizer != OffloadDevice::none) out += fmt::format(", optimizer on {}", offload_device_name(offload_optimizer));
  if (offload_param != OffloadDevice::none) out += fmt::format(", parameters on {}", offload_device_name(offload_param));
  if (checkpointing != Checkpointing::none) out += fmt::format(", {} recompute", checkpointing_name(checkpointing));
  if (host_checkpoints && checkpointing == Checkpointing::full) out += " (checkpoints in host memory)";
  if (sequence_parallel) out += ", sequence parallel";
  if (sq > 1) out += fmt::format(", Ulysses over {} ranks", sq);
  if (cp > 1) out += fmt::format(", ring attention over {} ranks", cp);
  if (tiled_mlp) out += ", tiled MLP";
  if (pp > 1) out += fmt::format(", {}", pipe_kind_name(schedule));
  return out;
}

uint64_t layer_activation_bytes(const GptShape& shape, uint64_t micro_batch, uint64_t tp, bool sequence_parallel,
                                Checkpointing checkpointing, bool attention_scores, bool tiled_mlp, uint64_t sq) {
  const double s = static_cast<double>(shape.seq_len), b = static_cast<double>(micro_batch), h = static_cast<double>(shape.hidden),
               a = static_cast<double>(shape.heads), t = static_cast<double>(tp);
  const double sbh = s * b * h;
  if (checkpointing == Checkpointing::full) return round_bytes(2 * sbh / (sequence_parallel ? t : 1));
  // GPT-2: softmax input and output, its dropout mask and output, 5 a s^2 b bytes split over heads;
  // a Llama keeps softmax's output only.
  const double core = shape.llama ? 2 : 5;
  const double attention = checkpointing == Checkpointing::selective ? 0
                           : attention_scores                        ? core * a * s * s * b / t * static_cast<double>(sq)
                                                                     : 4 * a * s * b / t;
  // What tensor parallelism splits, and what it leaves whole without sequence parallelism: GPT-2's
  // layer norms and dropouts (10 s b h), a Llama's norms' inputs and outputs (8 s b h).
  const double kv = static_cast<double>(shape.kv_width()), ffn = static_cast<double>(shape.mlp_width());
  const double mlp = tiled_mlp ? 0 : shape.llama ? 6 * s * b * ffn : 16 * sbh;
  // Ulysses keeps the attention's output twice: in its heads (the attention's) and in the rank's rows.
  const double second_layout = sq > 1 ? 2 * sbh : 0;
  const double split = (shape.llama ? 4 * sbh + 4 * s * b * kv + mlp : 8 * sbh + mlp) + second_layout;
  const double whole = shape.llama ? 8 * sbh : 10 * sbh;
  if (tp == 1 || sequence_parallel) return round_bytes((split + whole) / t + attention);
  return round_bytes(whole + split / t + attention);
}

uint64_t moe_layer_activation_bytes(const GptShape& shape, uint64_t micro_batch, uint64_t tp, bool sequence_parallel,
                                    Checkpointing checkpointing, uint64_t ep, bool attention_scores, uint64_t sq) {
  const double s = static_cast<double>(shape.seq_len), b = static_cast<double>(micro_batch), h = static_cast<double>(shape.hidden);
  // The experts' MLPs are never tiled (models/decoder tiles the dense MLP only).
  const double dense = static_cast<double>(
      layer_activation_bytes(shape, micro_batch, tp, sequence_parallel, checkpointing, attention_scores, false, sq));
  if (checkpointing == Checkpointing::full) return round_bytes(dense + 2 * s * b * h);
  const double per_row = shape.llama ? 6 : 4, k = static_cast<double>(shape.top_k);
  const double mlp = per_row * s * b * static_cast<double>(shape.mlp_width()) / static_cast<double>(tp);
  const double rows = k * s * b;
  const double experts = rows * per_row * static_cast<double>(shape.expert_width()) + 4 * rows * h + (ep > 1 ? 4 * rows * h : 0);
  return round_bytes(dense - mlp + experts);
}

// Long: the slices and per-layer sizes every stage shares, then `stage_memory`'s terms (model states, activations in
// flight, buffers, allowance, host slots), each using the sizes above it.
LayoutMemory layout_memory(const GptShape& shape, const Layout& layout, const BufferSizes& sizes, uint64_t runtime_bytes) {
  // Ulysses: a rank's activations are its s / sq positions' (the attention's too, in its heads); the
  // ring's its s / cp positions'.
  const uint64_t sq = std::max<uint64_t>(layout.sq, 1), cp = std::max<uint64_t>(layout.cp, 1);
  GptShape local = shape;
  local.seq_len = ceil_div(shape.seq_len, sq * cp);
  const uint64_t h = shape.hidden, t = layout.tp, p = layout.pp, b = layout.micro_batch, s = local.seq_len;
  const uint64_t layers_on_stage = ceil_div(shape.layers, p);
  // Expert layers spread over the stages as the layers are; each holds its experts' 1 / ep, whole
  // over tp (models/decoder replicates them), partitioned by ZeRO over the dp / ep ranks holding the same.
  const uint64_t moe_on_stage = std::min(layers_on_stage, ceil_div(shape.moe_layers(), p));
  const uint64_t dense_on_stage = layers_on_stage - moe_on_stage;
  const uint64_t ep = std::max<uint64_t>(layout.ep, 1);
  const uint64_t experts_slice = shape.moe() ? shape.experts / ep * shape.expert_params() : 0;
  const uint64_t layer_slice = shape.layer_slice(t), shared_slice = shape.moe() ? shape.moe_layer_shared_slice(t) : 0;
  const uint64_t vocab_slice = ceil_div(shape.vocab, t) * h;  // vocab-parallel embedding, and head
  const uint64_t largest = std::max({layer_slice, vocab_slice, shared_slice, experts_slice});
  const bool scores = layout.attention_scores, tiled = layout.tiled_mlp;
  const uint64_t per_layer = layer_activation_bytes(local, b, t, layout.sequence_parallel, layout.checkpointing, scores, tiled, sq);
  const uint64_t per_moe_layer = shape.moe() ? moe_layer_activation_bytes(local, b, t, layout.sequence_parallel, layout.checkpointing,
                                                                          ep, scores, sq)
                                             : 0;
  const uint64_t full_layer = std::max(
      layer_activation_bytes(local, b, t, layout.sequence_parallel, Checkpointing::none, scores, tiled, sq),
      shape.moe() ? moe_layer_activation_bytes(local, b, t, layout.sequence_parallel, Checkpointing::none, ep, scores, sq) : 0);
  // Ulysses' scratch around the working layer's attention, in f32 as models/decoder allocates it
  // (Dims::ulysses_floats): the all-to-alls' send and receive buffers of every head's q, k and v of
  // the rank's positions (a key/value head copied to each rank that reads it where there are fewer
  // than sq; one buffer for one sample), the q, k, v rows before they leave and the gradient at
  // the attention's output in its heads.
  const uint64_t heads = shape.heads / t, kv_heads = (shape.kv_heads > 0 ? shape.kv_heads : shape.heads) / t;
  const uint64_t kv_sent = sq > 1 && kv_heads % sq != 0 ? sq : kv_heads;
  // The ring's (Dims::ring_floats): two buffers of the rank's keys and values, three of their
  // gradient, one block's output and log-sum-exp (s / 2 rows).
  const uint64_t hd = h / shape.heads;
  const uint64_t ring = cp > 1 ? 4 * (5 * s * b * 2 * kv_heads * hd + s / 2 * (heads * hd + heads)) : 0;
  const uint64_t exchange = ring + (sq > 1
                                        ? 4 * s * b * hd * ((b == 1 ? 1 : 2) * (heads + 2 * kv_sent) + (heads + 2 * kv_heads) + heads)
                                        : 0);
  const bool host_checkpoints = layout.host_checkpoints && layout.checkpointing == Checkpointing::full && p == 1;
  const double sp_split = layout.sequence_parallel ? static_cast<double>(t) : 1.0;

  auto stage_memory = [&](bool first, bool last) {
    LayoutMemory m;
    m.activations_per_layer = std::max(dense_on_stage > 0 ? per_layer : 0, per_moe_layer);
    // The first stage holds the embedding (and GPT-2's positions), the last the final norm and the
    // head: the embedding again when tied, unless the stage holds it already.
    const uint64_t positions = shape.llama ? 0 : shape.seq_len * h, final_norm = shape.llama ? h : 2 * h;
    m.expert_params = moe_on_stage * experts_slice;
    m.stage_params = dense_on_stage * layer_slice + moe_on_stage * shared_slice + m.expert_params +
                     (first ? vocab_slice + positions : 0) + (last ? (first && shape.tied ? 0 : vocab_slice) + final_norm : 0);
    const uint64_t expert_dp = std::max<uint64_t>(layout.dp / ep, 1);
    ModelStates states = zero_model_states(m.stage_params - m.expert_params, layout.stage, layout.dp, layout.offload_optimizer,
                                           layout.offload_param, largest);
    if (m.expert_params > 0) {
      const ModelStates e = zero_model_states(m.expert_params, layout.stage, expert_dp, layout.offload_optimizer, layout.offload_param,
                                              0);
      states.device += e.device, states.host += e.host, states.nvme += e.nvme;
    }
    m.model_states = states.device;
    // 1F1B: stage i holds p - i micro-batches before its first backward; GPipe holds them all.
    const uint64_t m_total = layout.micro_batches;
    m.in_flight = p == 1 ? 1 : layout.schedule == PipeKind::gpipe ? m_total : std::min(first ? p : 1, m_total);
    double acts = static_cast<double>(m.in_flight * (dense_on_stage * per_layer + moe_on_stage * per_moe_layer));
    // Checkpoints in host memory: the device keeps two working copies of a layer's input.
    const double kept = acts;
    if (host_checkpoints) acts = std::min(acts, 2.0 * static_cast<double>(per_layer));
    // Recomputing a layer in backward materialises its activations whole, one layer at a time.
    if (layout.checkpointing == Checkpointing::full) acts += static_cast<double>(full_layer);
    acts += static_cast<double>(exchange);
    const double sbh = static_cast<double>(s * b * h);
    if (first && !shape.llama) acts += static_cast<double>(m.in_flight) * sbh / sp_split;  // GPT-2's embedding dropout mask
    // Final layer norm and head input (4 s b h / t) and fp32 logits (4 s b V / t). With full
    // recomputation zeroth's loss runs by chunks (model.chunked_loss follows it), which keep one
    // chunk's logits whatever the micro-batch.
    if (last) {
      const uint64_t vocab_slice = (shape.vocab + t - 1) / t;
      const uint64_t logit_rows = layout.checkpointing == Checkpointing::full
                                      ? std::min<uint64_t>(s * b, logits_chunk_rows(vocab_slice))
                                      : s * b;
      acts += 4 * sbh / static_cast<double>(t) + 4.0 * static_cast<double>(logit_rows) * static_cast<double>(vocab_slice);
    }
    m.activations = round_bytes(acts);
    const uint64_t reduce_bucket = 2 * std::min(sizes.reduce_bucket, m.stage_params);
    const uint64_t prefetch = 2 * std::min(sizes.prefetch_bucket, m.stage_params);
    if (layout.stage == 1 || layout.stage == 2) m.buffers = reduce_bucket;
    // Stage 3 gathers a layer whole (with offloaded parameters the model states count it already).
    if (layout.stage == 3) m.buffers = reduce_bucket + prefetch + (layout.offload_param == OffloadDevice::none ? 2 * largest : 0);
    const uint64_t own = m.model_states + m.activations + m.buffers;
    m.allowance = runtime_bytes + round_bytes(kFragmentation * static_cast<double>(own));
    m.device = own + m.allowance;
    m.host = states.host + (host_checkpoints ? round_bytes(kept) : 0);
    m.nvme = states.nvme;
    // Swapped state passes through pinned host slots: two sub-groups of fp32 master, moments and
    // gradient for the optimizer; two largest layers of parameters.
    const uint64_t shard = ceil_div(m.stage_params - m.expert_params, layout.dp) + ceil_div(m.expert_params, expert_dp);
    if (layout.offload_optimizer == OffloadDevice::nvme) m.host += 2 * 16 * std::min(sizes.sub_group, shard);
    if (layout.offload_param == OffloadDevice::nvme) m.host += 2 * 2 * largest;
    return m;
  };
  if (p == 1) return stage_memory(true, true);
  const LayoutMemory first = stage_memory(true, false), last = stage_memory(false, true);
  return first.device >= last.device ? first : last;
}

}  // namespace zeroth
