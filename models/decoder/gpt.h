// Decoder-only transformers on the block API, written out per block (no autograd): GPT-2 (learned
// positions, LayerNorm, GELU MLP, the LM head tied to the token embedding) and the Llama family
// (rotary positions, RMSNorm, SwiGLU MLP, grouped-query attention, an untied head where the model
// has one: Llama, Mistral, Qwen2/Qwen3, SmolLM, TinyLlama), either with mixture-of-experts MLPs
// (models/moe). Trained with cross-entropy. Parameter names, shapes ([out, in]) and initialization
// follow Hugging Face's (GPT-2's as nanoGPT's), so weights move to and from PyTorch by name.
//
// Blocks: "embed" {wte [V, C], wpe [T, C] for GPT-2}, "h.0" .. "h.{L-1}" (and an expert layer's
// experts), "ln_f", and "lm_head" where the head is untied. A tied head uses "embed" twice: first
// as the embedding, last as the LM head (forward), and in reverse order in backward, so ZeRO-3
// gathers the tied matrix where it is needed and its gradient is complete after both uses.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // int32_t
#include <memory>       // std::shared_ptr
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include <array>  // std::array

#include "comm/communicator.h"  // Communicator
#include "models/block_api.h"   // BlockHost, BlockSpec, BlockSchedule

namespace zeroth {

// How Llama 3 and linear scaling stretch rotary positions (Hugging Face's rope_scaling).
struct RopeScaling {
  enum class Type : uint8_t { none, linear, llama3 };
  Type type = Type::none;
  double factor = 1;
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  int original_max_position_embeddings = 8192;       // llama3
};

// Mixture-of-experts layers (GShard, Switch, Mixtral): in layer l with (l + 1) % every == 0 the MLP
// becomes num_experts MLPs of the architecture's kind (GPT-2's GELU one, the Llama family's SwiGLU
// one, intermediate_size wide) behind a router; each token goes to its top_k experts (moe/router.h:
// capacity, drops, combine weights, the auxiliary losses). 0 experts: a dense model.
struct MoeConfig {
  int num_experts = 0;
  int top_k = 2;
  double capacity_factor = 1.0, eval_capacity_factor = 1.0;
  int min_capacity = 4;
  bool drop_tokens = true;
  bool normalize_top_k = false;  // model.moe's reader defaults it to top_k >= 2
  double aux_loss_coef = 0.01, z_loss_coef = 0.0;
  int every = 1;
  int intermediate_size = 0;  // each expert's width; 0: the model's MLP width
  bool enabled() const { return num_experts > 0; }
};

// What the expert layers' routing did over the passes since it was last taken (Gpt::take_moe_stats):
// the auxiliary losses' sums (without coefficients) over the layer passes, the choices made and
// dropped, and the busiest expert's rows over the mean (the largest any pass had).
struct MoeStats {
  int passes = 0;
  double aux_loss = 0, z_loss = 0;
  size_t choices = 0, dropped = 0;
  double max_load = 0;
};

// LoRA (Hu et al. 2021, as PEFT's LoraConfig): each targeted linear layer W of every transformer
// block computes W x + scale B A x, A [r, in] and B [out, r] in an adapter block of their own per
// layer ("<layer>.lora", trainable), the base blocks frozen. scale = alpha / r, or alpha / sqrt(r)
// with use_rslora. target_modules are Hugging Face's module names (q_proj ... down_proj; GPT-2's
// c_attn, c_proj, c_fc), "all-linear" every one of them.
struct LoraConfig {
  int r = 0;
  double alpha = 8;
  std::vector<std::string> target_modules;
  bool use_rslora = false;
  bool enabled() const { return r > 0; }
  double scale() const;
};

// One decoder with the switches of its family, as Megatron-core's GPTModel serves Llama: GPT-2
// (LayerNorm, learned positions, GELU MLP, biases, tied head) or the Llama family (RMSNorm,
// rotary positions, SwiGLU MLP, grouped-query attention, no biases but Qwen2's q/k/v ones,
// Qwen3's per-head q/k RMSNorm, tied or untied head).
enum class Architecture : uint8_t { gpt2, llama };

struct GptConfig {
  Architecture architecture = Architecture::gpt2;
  int vocab_size = 50257;
  int seq_len = 1024;  // positions the model knows (rows of wpe; the rotary table); micro-batches may be shorter
  // The longest model.seq_len a config takes (16M positions: int positions and row indices stay far
  // from overflow, and `zeroth plan --max-seq` answers up to it).
  static constexpr int kMaxSeqLen = 1 << 24;
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  // The Llama family's (GPT-2 keeps the defaults): key/value heads (0: n_head), channels per head
  // (0: n_embd / n_head), the MLP's width (0: 4 n_embd), the norms' epsilon, rotary base and
  // scaling, q/k/v biases (Qwen2; attention_bias adds the output projection's too), per-head q/k
  // norms (Qwen3), and whether the LM head is the token embedding.
  int n_kv_head = 0;
  int head_dim = 0;
  int intermediate_size = 0;
  double norm_eps = 1e-5;
  double rope_theta = 10000;
  RopeScaling rope_scaling;
  bool qkv_bias = false, o_bias = false;
  bool qk_norm = false;
  bool tie_word_embeddings = true;
  // The context the Llama family's weights were published for (max_position_embeddings), which
  // an export writes back; 0: model.seq_len. It changes nothing computed.
  int max_positions = 0;
  // Keep only each transformer block's input during forward and recompute the block in its
  // backward: activation memory per layer drops from ~16 C floats per token (and NH T more for
  // the attention's probabilities where they are kept) to C.
  bool activation_checkpointing = false;
  // With activation_checkpointing: the checkpoints (each block's input) live in host memory, the
  // device keeps two working copies per micro-batch slot; each is copied back on a stream of its own
  // while the next block runs its backward, but for the last two, which backward finds in the
  // working copies (DeepSpeed's activation_checkpointing.cpu_checkpointing).
  bool cpu_checkpointing = false;
  // The LM head and the loss by chunks of this many tokens (0: whole). Chunked, no micro-batch
  // keeps its [tokens, vocabulary] logits: forward keeps each token's softmax statistics, and
  // backward makes each chunk's logits again (one more LM-head product) and turns them into their
  // gradient, in a scratch of one chunk's logits (model.chunked_loss).
  int loss_chunk_rows = 0;
  // The dense MLP by tiles of this many rows (0: whole), as ALST's tiled MLP: no layer keeps its
  // MLP's intermediates (the up-projection's output and the activation's, up + F floats a token);
  // the backward makes each tile's again, one more up-projection (model.tiled_mlp).
  int mlp_tile_rows = 0;
  // The chunk that keeps a chunk's logits near 64 MiB on each of `tensor_parallel` ranks (its slice
  // of the vocabulary): core/memory.h's logits_chunk_rows.
  int auto_loss_chunk_rows(int tensor_parallel = 1) const;
  // What a layer's attention keeps for its backward, which the device decides, not a config file:
  // CUDA's kernels keep the probabilities (B NH T T floats, and as much scratch for backward), the
  // CPU's blocked attention each row's log-sum-exp (B NH T floats). Gpt sets it from its device,
  // and a plan from the run's (attention_keeps_probabilities in kernels.h).
  bool attention_probabilities = false;

  MoeConfig moe;
  // Blocks whose parameters do not train (BlockSpec::frozen), by block name: what the training
  // config's model.trainable / model.frozen patterns resolve to.
  std::vector<std::string> frozen_blocks;
  LoraConfig lora;

  // "gpt2-124m" (alias "gpt2"), "gpt2-350m", "gpt2-774m", "gpt2-1558m"; ConfigError otherwise.
  static GptConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();
  size_t num_parameters() const;
  // The parameters one token meets: every expert layer counts top_k of its experts.
  size_t active_parameters() const;
  // Model FLOPs of one token's forward and backward at seq_len, PaLM's estimate (its appendix B,
  // as nanoGPT and llm.c use it): 6 N + 12 L H Q T, N the active parameters that multiply (the
  // position table and an untied input embedding left out), H Q the attention's width.
  // `context`: the positions a row attends over (0: seq_len), for rows cut shorter.
  // Frozen blocks (frozen_blocks, or LoRA's base) count 4 FLOPs a parameter (no weight gradient), and
  // LoRA's adapters 6.
  double flops_per_token(int context = 0) const;
  bool moe_layer(int l) const { return moe.enabled() && (l + 1) % moe.every == 0; }
  int expert_ffn() const { return moe.intermediate_size > 0 ? moe.intermediate_size : ffn(); }
  bool llama() const { return architecture == Architecture::llama; }
  int kv_heads() const { return n_kv_head > 0 ? n_kv_head : n_head; }
  int head_size() const { return head_dim > 0 ? head_dim : n_embd / n_head; }
  int ffn() const { return intermediate_size > 0 ? intermediate_size : 4 * n_embd; }
  // "GPT-2 4 layers, 4 heads, 256 wide" or the Llama family's line with its switches.
  std::string describe() const;
  // Hugging Face's class for these weights: GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM
  // (q/k/v biases without o's), Qwen3ForCausalLM (per-head q/k norms).
  std::string hf_architecture() const;
  // The rotary angles' cosines and sines per position (seq_len x head_size: cosines, then sines),
  // as Hugging Face computes them in f32.
  std::vector<float> rope_table() const;
  // ConfigError naming the key (model.*) when a value is out of range.
  void validate() const;
};

// The part of the model one pipeline rank holds: its model chunks (virtual stages, in the order it
// runs them), each a range of transformer layers [lo, hi). The chunk with layer 0 also holds the
// embedding; the one ending at n_layer holds ln_f and the LM head, with its own copy of the token
// embedding (block "embed", tied: the engine sums the copies' gradients) unless the rank has the
// embedding already. The default: the whole model as one chunk.
struct GptPart {
  std::vector<std::array<int, 2>> chunks;
  // Tensor parallelism (Megatron-LM): rank `tp_rank` of `tp_ranks` holds its share of every layer's
  // heads and MLP and of the vocabulary (ParamSpec::tp says which slice of each parameter); with
  // sequence_parallel also its rows of the micro-batch's tokens in the residual stream, the
  // LayerNorms and the pipeline's activations.
  int tp_rank = 0, tp_ranks = 1;
  bool sequence_parallel = false;
  // Expert parallelism (GShard, DeepSpeed-MoE): rank `ep_rank` of `ep_ranks` holds experts
  // [ep_rank n, (ep_rank + 1) n) of every expert layer (n = num_experts / ep_ranks), in a block of its
  // own that ZeRO partitions over the data-parallel ranks holding the same experts
  // (BlockSpec::expert_parallel); tokens reach them through the expert-parallel group's all-to-alls.
  int ep_rank = 0, ep_ranks = 1;
  // The most tokens a micro-batch of any rank of the expert-parallel group holds (0: this rank's
  // own): the experts' receive buffers are sized for the group's largest, so a rank running a
  // shorter micro-batch (the last round of an evaluation) still has room for what its peers send.
  size_t ep_group_tokens = 0;
  // The all-to-alls on a stream of their own, under the experts' products (false: in turn on the
  // compute stream; the results are the same bits either way).
  bool ep_overlap = true;
  // Ulysses sequence parallelism (DeepSpeed-Ulysses): rank `sq_rank` of `sq_ranks` holds positions
  // [sq_rank T, (sq_rank + 1) T) of every sample of a micro-batch of T sq_ranks positions; around
  // the attention an all-to-all turns its q, k, v rows into all the sample's positions of its
  // share of the heads (n_head / sq_ranks query heads; the key/value heads split alike, or one
  // replicated where there are fewer of them than ranks) and the attention's output back. The
  // weights are the same on every rank of the group: ZeRO shards them over it like data parallelism.
  int sq_rank = 0, sq_ranks = 1;
  // Ring attention (context parallelism, context_ring.h): rank `cp_rank` of `cp_ranks` holds chunks
  // cp_rank and 2 cp_ranks - 1 - cp_rank of every sample's 2 cp_ranks chunks of positions (its T rows:
  // the first chunk's, then the second's), every head; keys and values travel around the group. The
  // weights are the same on every rank of the group, as Ulysses'. One of the two at a time.
  int cp_rank = 0, cp_ranks = 1;
  // The ranks that share each sample's positions: Ulysses' or the ring's.
  int sample_ranks() const { return sq_ranks * cp_ranks; }
  bool whole(const GptConfig& config) const;
  bool has_embedding() const;                                 // a chunk starts at layer 0
  bool has_head(const GptConfig& config) const;               // a chunk ends at n_layer
  bool first_chunk(int chunk) const;                          // starts at layer 0: its input is the tokens
  bool last_chunk(int chunk, const GptConfig& config) const;  // ends at n_layer: its output is the loss
  // Rank `rank` of a `stages`-stage pipeline with `layers[k]` layers in virtual stage k (of
  // stages x v, v = layers.size() / stages): chunk c is virtual stage c x stages + rank.
  static GptPart of_rank(const std::vector<int>& layers, int stages, int rank);
};

// How the layers split over `parts` virtual stages, layers per stage in order:
// "uniform" (equal counts, the remainder to the first), "parameters" (the largest stage's
// parameter count as small as it can be, counting the embedding on the first and ln_f on the
// last, as DeepSpeed's partition_method balances), or given (`counts`, which must add up to
// n_layer). ConfigError (naming pipeline.partition_method) when a stage would hold no layer.
// With experts shared over `expert_ranks` ranks, an expert layer weighs what one rank holds of it.
std::vector<int> partition_layers(const GptConfig& config, int parts, const std::string& method, const std::vector<int>& counts = {},
                                  int expert_ranks = 1);

class Gpt {
 public:
  // Registers the blocks and the schedule (one per chunk) with the host. With part.tp_ranks > 1,
  // `tensor` is the tensor-parallel group (rank part.tp_rank of part.tp_ranks): the block uses'
  // collectives run there on the host's compute stream; with part.ep_ranks > 1, `experts` is the
  // expert-parallel group (rank part.ep_rank of part.ep_ranks) the expert layers' all-to-alls run in.
  // With part.sq_ranks > 1, `sequence` is the Ulysses group (rank part.sq_rank of part.sq_ranks); with
  // part.cp_ranks > 1 the ring's (rank part.cp_rank of part.cp_ranks).
  Gpt(BlockHost& host, GptConfig config, GptPart part = {}, Communicator* tensor = nullptr, Communicator* experts = nullptr,
      Communicator* sequence = nullptr);
  ~Gpt();

  static std::vector<BlockSpec> block_specs(const GptConfig& config, const GptPart& part);
  static std::vector<BlockSchedule> schedules(const GptConfig& config, const GptPart& part);
  // The part's copy of the tied token embedding when it is not the one that embeds (-1 else), and
  // the block id of the embedding wherever it is (-1: none).
  static int embedding_block(const GptConfig& config, const GptPart& part);


  static std::vector<BlockSpec> block_specs(const GptConfig& config);
  // Hugging Face's GPT-2 (GPT2LMHeadModel) name of every parameter, in block_specs order, and
  // whether Hugging Face keeps it transposed: its Conv1D layers store [in, out] where zeroth's
  // matrices are [out, in]. The LM head is the token embedding (tied), as in Hugging Face.
  struct HfParam {
    int block = 0;
    size_t param = 0;
    std::string name;
    bool transposed = false;
  };
  static std::vector<HfParam> hf_params(const GptConfig& config);
  // The LoRA adapters' parameters (GptConfig::lora) in PEFT's names, as its adapter_model.safetensors
  // holds them ("base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight"), in block_specs order.
  static std::vector<HfParam> peft_params(const GptConfig& config);
  static BlockSchedule schedule(const GptConfig& config);

  // A pipeline rank's chunk passes. The runner (engine/pipeline/runner.h) receives a chunk's input into
  // chunk_input() before its forward and sends chunk_output() after; before its backward it
  // receives the gradient of the output into output_grad(), and sends input_grad() after. tokens
  // are read by the chunk that embeds, targets and *loss by the one with the head; others may
  // pass null. prepare() sizes the activation slots for B x T before the first receive.
  void prepare(int B, int T);
  void forward_chunk(int micro, int chunk, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss,
                     const int32_t* positions = nullptr);
  void backward_chunk(int micro, int chunk);
  // Evaluation through a pipeline: the chunk's forward in the evaluation slot, between the host's
  // begin_/end_evaluation (which the caller makes); logits are not kept.
  void evaluate_chunk(int chunk, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss,
                      const int32_t* positions = nullptr);
  enum class Port : uint8_t { input, output, input_grad, output_grad };
  // [B, T, C] f32 on the device, for micro-batch `micro` (-1: the evaluation slot) of `chunk`.
  TensorView port(Port which, int micro, int chunk) const;
  const GptPart& part() const { return part_; }

  // Enqueues the forward of micro-batch `micro` of the cycle on the host's compute stream:
  // tokens and targets are [B, T] with T <= seq_len; *loss (mean cross-entropy over B*T) is
  // written when the stream gets there. All pointers must stay valid until then. The
  // activations stay in the micro-batch's slot until its backward.
  // `positions` (host memory, read at the call; null: 0 .. T - 1 in every row) packs several samples
  // into a row, as Hugging Face's position_ids do for packed sequences: a sample begins where its
  // positions restart at 0, attends only within itself (the attention runs per sample: no work on
  // the blocks between samples), and takes its positions (rotary, or GPT-2's learned) from 0. Each
  // row's first position must be 0 and each next one 0 or one more (InvalidArgument otherwise).
  // In a Ulysses group (GptPart::sq_ranks = U) tokens and targets are this rank's T positions of
  // each row, T U <= seq_len, and `positions` the whole rows' (B x T U): its samples span the ranks.
  void forward(int micro, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss,
               const int32_t* positions = nullptr);
  // What each micro-batch's loss (and so its gradient) is divided by from here on: its B x T rows
  // when 0 (the default), else `rows`. A target of -1 counts nothing (a loss mask); a run that
  // masks sets the mean count of counted targets per micro-batch of its global batch, so the step's
  // loss is the sum over the global batch's counted targets divided by their number, however the
  // batch is split into micro-batches and ranks. Takes effect for passes enqueued after it.
  void set_loss_divisor(double rows) { loss_divisor_ = rows; }
  // Enqueues the backward of a micro-batch whose forward ran.
  void backward(int micro);
  void forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, int micro = 0,
                        const int32_t* positions = nullptr);
  // Forward only, between the host's begin_/end_evaluation (which this calls). With `logits`,
  // the [B, T, V] logits are copied there too.
  void evaluate(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits = nullptr,
                const int32_t* positions = nullptr);

  // Generation with a key/value cache, one sequence, on a rank that holds the whole model (no
  // pipeline, no tensor parallelism): begin_decoding(max_len) sizes the cache for positions
  // [0, max_len) (max_len <= seq_len); each decode() runs the next n tokens, at positions
  // [decoded(), decoded() + n), keeps their keys and values, and writes the last one's next-token
  // logits (vocab_size floats, host memory), synchronizing. Each decode is an evaluation of the
  // host (begin_/end_evaluation); end_decoding() frees the cache.
  void begin_decoding(int max_len);
  void decode(const int32_t* tokens, int n, float* logits);
  int decoded() const;
  void end_decoding();

  // Activation bytes for `slots` micro-batches of B x T in flight (what the model allocates,
  // tag activations: the slots, their token ids, the backward scratch), on the device and (the
  // checkpoints, with cpu_checkpointing) in host memory.
  static size_t activation_bytes(const GptConfig& config, int B, int T, int slots = 1, const GptPart& part = {});
  // With a slot count per chunk (the engine's in-flight count of each: Plan::chunk_in_flight).
  static size_t activation_bytes(const GptConfig& config, int B, int T, const std::vector<int>& chunk_slots, const GptPart& part);
  static size_t host_activation_bytes(const GptConfig& config, int B, int T, int slots = 1, const GptPart& part = {});
  // f32 copies of one block's parameters and gradients, when the compute dtype is narrow (tag: buffers).
  static size_t scratch_bytes(const GptConfig& config, DType compute, const GptPart& part = {});
  // Both, for the host's estimate.
  static ModelFootprint footprint(const GptConfig& config, int B, int T, DType compute, int slots, const GptPart& part = {});
  static ModelFootprint footprint(const GptConfig& config, int B, int T, DType compute, const std::vector<int>& chunk_slots,
                                  const GptPart& part);
  const GptConfig& config() const { return config_; }
  // The expert layers' figures since the last call (after the compute stream has passed the work
  // that made them: synchronize it first), and a fresh start.
  MoeStats take_moe_stats();
  // Ulysses: time each exchange on the compute stream from now on (a host stamp before and after
  // it, DeepSpeed's wall_clock_breakdown), and the seconds they took since the last take (after
  // the stream has passed them: synchronize it first).
  void time_exchanges(bool on);
  double take_exchange_seconds();

 private:
  struct State;
  // ", of which N the expert layers' rows (all-to-all buffers M)" for footprint's note.
  static std::string expert_rows_note(const GptConfig& config, int B, int T, const std::vector<int>& chunk_slots, const GptPart& part);
  // decoding: generation's pass (decode.cc): positions from the cache's, the last row's logits.
  void run_forward(int micro, int chunk, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits,
                   bool training, bool decoding = false, const int32_t* positions = nullptr);
  void run_backward(int micro, int chunk);
  std::vector<int> chunk_slots() const;  // the host's in-flight count of each chunk
  // InvalidArgument unless B >= 1 and 1 <= T (T x the Ulysses ranks) <= seq_len.
  void check_rows(int B, int T) const;

  BlockHost& host_;
  GptConfig config_;
  GptPart part_;
  Communicator* tensor_ = nullptr;
  Communicator* experts_comm_ = nullptr;
  Communicator* sequence_ = nullptr;
  int embed_ = -1, ln_f_ = -1, head_ = -1;
  std::vector<int> layers_;       // block of each layer of the model, -1 where another rank holds it
  std::vector<int> experts_;      // block of each expert layer's experts, -1 elsewhere
  std::vector<int> lora_;         // block of each layer's LoRA adapters, -1 elsewhere
  std::vector<int> expert_lora_;  // block of each expert layer's experts' adapters, -1 elsewhere
  std::shared_ptr<State> state_;  // activations and f32 weight copies, touched by the stream only
  double loss_divisor_ = 0;
};

}  // namespace zeroth
