// GPT-2 on the block API: token + position embedding, n_layer pre-LayerNorm transformer blocks
// (causal multi-head attention, GELU MLP), final LayerNorm, and an LM head tied to the token
// embedding, trained with cross-entropy. Forward and backward are written out per block; there
// is no autograd. Parameter names, shapes ([out, in]) and initialization follow GPT-2 / nanoGPT,
// so weights move to and from PyTorch by name.
//
// Blocks: "embed" {wte [V, C], wpe [T, C]}, "h.0" .. "h.{L-1}", "ln_f". The schedule uses
// "embed" twice: first as the embedding, last as the LM head (forward), and in reverse order
// in backward, so ZeRO-3 gathers the tied matrix where it is needed and its gradient is complete
// after both uses.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // int32_t
#include <memory>       // std::shared_ptr
#include <string>       // std::string
#include <string_view>  // std::string_view
#include <vector>       // std::vector

#include "models/block_api.h"  // BlockHost, BlockSpec, BlockSchedule

namespace zeroth {

struct GptConfig {
  int vocab_size = 50257;
  int seq_len = 1024;  // positions the model knows (rows of wpe); micro-batches may be shorter
  int n_layer = 12;
  int n_head = 12;
  int n_embd = 768;
  // Keep only each transformer block's input during forward and recompute the block in its
  // backward: activation memory per layer drops from ~(16 C + 2 NH T) to C floats per token.
  bool activation_checkpointing = false;
  // With activation_checkpointing: the checkpoints (each block's input) live in host memory, the
  // device keeps two working copies per micro-batch slot; each is copied back before its block's
  // recompute, but for the last two, which backward finds in the working copies (DeepSpeed's
  // activation_checkpointing.cpu_checkpointing).
  bool cpu_checkpointing = false;

  // "gpt2-124m" (alias "gpt2"), "gpt2-350m", "gpt2-774m", "gpt2-1558m"; ConfigError otherwise.
  static GptConfig preset(std::string_view name);
  static std::vector<std::string> preset_names();
  size_t num_parameters() const;
  // ConfigError naming the key (model.*) when a value is out of range.
  void validate() const;
};

class Gpt {
 public:
  // Registers the blocks and the schedule with the host.
  Gpt(BlockHost& host, GptConfig config);
  ~Gpt();

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
  static BlockSchedule schedule(const GptConfig& config);

  // Enqueues the forward of micro-batch `micro` of the cycle on the host's compute stream:
  // tokens and targets are [B, T] with T <= seq_len; *loss (mean cross-entropy over B*T) is
  // written when the stream gets there. All pointers must stay valid until then. The
  // activations stay in the micro-batch's slot until its backward.
  void forward(int micro, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss);
  // Enqueues the backward of a micro-batch whose forward ran.
  void backward(int micro);
  void forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, int micro = 0);
  // Forward only, between the host's begin_/end_evaluation (which this calls). With `logits`,
  // the [B, T, V] logits are copied there too.
  void evaluate(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits = nullptr);

  // Activation bytes for `slots` micro-batches of B x T in flight (what the model allocates,
  // tag activations: the slots, their token ids, the backward scratch), on the device and (the
  // checkpoints, with cpu_checkpointing) in host memory.
  static size_t activation_bytes(const GptConfig& config, int B, int T, int slots = 1);
  static size_t host_activation_bytes(const GptConfig& config, int B, int T, int slots = 1);
  // f32 copies of one block's parameters and gradients, when the compute dtype is narrow (tag: buffers).
  static size_t scratch_bytes(const GptConfig& config, DType compute);
  // Both, for the host's estimate.
  static ModelFootprint footprint(const GptConfig& config, int B, int T, DType compute, int slots);
  const GptConfig& config() const { return config_; }

 private:
  struct State;
  void run_forward(int micro, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits, bool training);

  BlockHost& host_;
  GptConfig config_;
  int embed_ = -1, ln_f_ = -1;
  std::vector<int> layers_;
  std::shared_ptr<State> state_;  // activations and f32 weight copies, touched by the stream only
};

}  // namespace zeroth
