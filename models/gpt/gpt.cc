// The GPT's blocks and its micro-step: which kernels run in which block use, and where the
// activations live. Kernels are in cpu/gpt_kernels.cc; all work is enqueued on the host's
// compute stream, one closure per block use, so the engine's gathers and reductions overlap it.
#include "models/gpt/gpt.h"

#include <algorithm>  // std::max
#include <cmath>      // std::sqrt
#include <cstring>    // std::memset

#include <fmt/format.h>  // fmt::format

#include "core/device.h"         // Buffer
#include "core/error.h"          // ZEROTH_THROW
#include "core/log.h"            // ZLOG_WARN
#include "models/gpt/kernels.h"  // gpt::Kernels

namespace zeroth {

// ---- configuration --------------------------------------------------------------------------

GptConfig GptConfig::preset(std::string_view name) {
  GptConfig c;
  if (name == "gpt2-124m" || name == "gpt2") return c;
  if (name == "gpt2-350m") c.n_layer = 24, c.n_head = 16, c.n_embd = 1024;
  else if (name == "gpt2-774m") c.n_layer = 36, c.n_head = 20, c.n_embd = 1280;
  else if (name == "gpt2-1558m") c.n_layer = 48, c.n_head = 25, c.n_embd = 1600;
  else
    ZEROTH_THROW(ConfigError, "model.preset \"{}\" is not a known preset; use one of gpt2-124m, gpt2-350m, gpt2-774m, gpt2-1558m",
                 name);
  return c;
}

std::vector<std::string> GptConfig::preset_names() { return {"gpt2-124m", "gpt2-350m", "gpt2-774m", "gpt2-1558m"}; }

size_t GptConfig::num_parameters() const {
  size_t n = 0;
  for (const auto& b : Gpt::block_specs(*this)) {
    for (const auto& p : b.params) n += p.numel();
  }
  return n;
}

void GptConfig::validate() const {
  auto positive = [](const char* key, int v) {
    if (v <= 0) ZEROTH_THROW(ConfigError, "model.{} must be a positive integer, got {}", key, v);
  };
  positive("vocab_size", vocab_size);
  positive("seq_len", seq_len);
  positive("n_layer", n_layer);
  positive("n_head", n_head);
  positive("n_embd", n_embd);
  if (n_embd % n_head != 0) {
    ZEROTH_THROW(ConfigError, "model.n_embd ({}) must be a multiple of model.n_head ({}): each head gets n_embd / n_head channels",
                 n_embd, n_head);
  }
  if (cpu_checkpointing && !activation_checkpointing) {
    ZEROTH_THROW(
        ConfigError,
        "activation_checkpointing.cpu_checkpointing moves the activation checkpoints to host memory, but checkpointing is off "
        "(model.activation_checkpointing false): turn it on, or drop cpu_checkpointing");
  }
}

// ---- blocks ---------------------------------------------------------------------------------

std::vector<BlockSpec> Gpt::block_specs(const GptConfig& c) {
  c.validate();
  const int64_t V = c.vocab_size, T = c.seq_len, C = c.n_embd;
  const double proj_std = 0.02 / std::sqrt(2.0 * c.n_layer);  // GPT-2: residual projections scaled by depth
  std::vector<BlockSpec> out;
  out.push_back({"embed",
                 {{"wte", {V, C}, InitRule::normal(0.02), ParamRole::embedding},
                  {"wpe", {T, C}, InitRule::normal(0.02), ParamRole::embedding}}});
  for (int l = 0; l < c.n_layer; ++l) {
    out.push_back({"h." + std::to_string(l),
                   {{"ln_1.weight", {C}, InitRule::constant(1), ParamRole::norm},
                    {"ln_1.bias", {C}, InitRule::zeros(), ParamRole::norm},
                    {"attn.c_attn.weight", {3 * C, C}, InitRule::normal(0.02), ParamRole::weight},
                    {"attn.c_attn.bias", {3 * C}, InitRule::zeros(), ParamRole::bias},
                    {"attn.c_proj.weight", {C, C}, InitRule::normal(proj_std), ParamRole::weight},
                    {"attn.c_proj.bias", {C}, InitRule::zeros(), ParamRole::bias},
                    {"ln_2.weight", {C}, InitRule::constant(1), ParamRole::norm},
                    {"ln_2.bias", {C}, InitRule::zeros(), ParamRole::norm},
                    {"mlp.c_fc.weight", {4 * C, C}, InitRule::normal(0.02), ParamRole::weight},
                    {"mlp.c_fc.bias", {4 * C}, InitRule::zeros(), ParamRole::bias},
                    {"mlp.c_proj.weight", {C, 4 * C}, InitRule::normal(proj_std), ParamRole::weight},
                    {"mlp.c_proj.bias", {C}, InitRule::zeros(), ParamRole::bias}}});
  }
  out.push_back(
      {"ln_f", {{"weight", {C}, InitRule::constant(1), ParamRole::norm}, {"bias", {C}, InitRule::zeros(), ParamRole::norm}}});
  return out;
}

std::vector<Gpt::HfParam> Gpt::hf_params(const GptConfig& c) {
  std::vector<HfParam> out;
  const auto specs = block_specs(c);
  for (size_t b = 0; b < specs.size(); ++b) {
    // "embed" {wte, wpe}, "h.<l>" with Hugging Face's own suffixes, "ln_f" {weight, bias}.
    const std::string prefix = specs[b].name == "embed" ? "transformer." : "transformer." + specs[b].name + ".";
    for (size_t i = 0; i < specs[b].params.size(); ++i) {
      const std::string& p = specs[b].params[i].name;
      const bool conv1d = p == "attn.c_attn.weight" || p == "attn.c_proj.weight" || p == "mlp.c_fc.weight" || p == "mlp.c_proj.weight";
      out.push_back({static_cast<int>(b), i, prefix + (specs[b].name == "embed" ? p + ".weight" : p), conv1d});
    }
  }
  return out;
}

BlockSchedule Gpt::schedule(const GptConfig& c) {
  const int L = c.n_layer, embed = 0, ln_f = L + 1;
  BlockSchedule s;
  s.forward.push_back(embed);
  for (int l = 0; l < L; ++l) s.forward.push_back(1 + l);
  s.forward.push_back(ln_f);
  s.forward.push_back(embed);  // the LM head
  s.backward.push_back(embed);
  s.backward.push_back(ln_f);
  for (int l = L - 1; l >= 0; --l) s.backward.push_back(1 + l);
  s.backward.push_back(embed);
  return s;
}

// ---- activations ----------------------------------------------------------------------------

namespace {

// What one transformer block keeps from forward for backward.
struct LayerActs {
  float *ln1, *ln1_mean, *ln1_rstd, *qkv, *att, *atty, *res2, *ln2, *ln2_mean, *ln2_rstd, *fch, *fch_gelu;
};

// Backward scratch: the residual stream's gradient and the per-kernel gradients of activations.
struct GradScratch {
  float *dresid = nullptr, *dC = nullptr, *dqkv = nullptr, *dfch = nullptr, *datt = nullptr;
};

}  // namespace

// One micro-batch in flight: what its backward needs from its forward.
struct Slot {
  int B = 0, T = 0;
  int32_t *tokens = nullptr, *targets = nullptr;
  // [L + 1] residual stream: resid[l] is block l's input. With cpu_checkpointing these alternate
  // between two device buffers, and saved[l] (host memory) keeps the first L - 1 for backward.
  std::vector<float*> resid, saved;
  std::vector<LayerActs> layer;  // [L], or [1] shared when checkpointing
  float *lnf = nullptr, *lnf_mean = nullptr, *lnf_rstd = nullptr, *logits = nullptr, *row_loss = nullptr;
};

struct Gpt::State {
  GptConfig cfg;
  Device* device = nullptr;
  std::unique_ptr<gpt::Kernels> k;
  int B = 0, T = 0;
  BlockHost* host = nullptr;
  Buffer buffer;            // every activation slot and the backward scratch, one allocation (tag: activations)
  Buffer host_buffer;       // with cpu_checkpointing: every slot's checkpoints, in host memory
  Buffer token_buffer;      // tokens and targets of every slot, on the device
  std::vector<Slot> slots;  // micro-batch m uses slot m mod slots.size()
  int in_flight = 0;        // forwards whose backward has not been enqueued
  GradScratch d;            // backward passes run one at a time: shared
  Buffer wbuf, gbuf;        // f32 copies of a narrow block's parameters and gradients

  static size_t layer_floats(const GptConfig& c, size_t BT, size_t B, size_t T) {
    const size_t C = c.n_embd;
    return 15 * BT * C + 4 * BT + B * c.n_head * T * T;
  }
  // The residual stream's copies on the device, and the checkpoints in host memory, per slot.
  static size_t resid_copies(const GptConfig& c) { return c.cpu_checkpointing ? 2 : static_cast<size_t>(c.n_layer) + 1; }
  // The inputs of blocks 0 .. L-2: backward finds the last two (ln_f's and block L-1's) still in
  // the working copies.
  static size_t saved_count(const GptConfig& c) {
    return c.cpu_checkpointing && c.n_layer > 1 ? static_cast<size_t>(c.n_layer) - 1 : 0;
  }
  static size_t saved_floats(const GptConfig& c, int B, int T) { return saved_count(c) * B * T * c.n_embd; }
  static size_t slot_floats(const GptConfig& c, int B, int T) {
    const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd, L = c.n_layer;
    const size_t layers = c.activation_checkpointing ? 1 : L;
    return resid_copies(c) * BT * C + layers * layer_floats(c, BT, B, T) + BT * C + 3 * BT + BT * c.vocab_size;
  }
  static size_t scratch_floats(const GptConfig& c, int B, int T) {
    const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd;
    return BT * C * (1 + 1 + 3 + 4) + static_cast<size_t>(B) * c.n_head * T * T;
  }

  // On the caller's thread: a new shape waits for the stream to finish with the old buffers.
  void check_shape(int b, int t) const {
    if (in_flight > 0 && (b != B || t != T)) {
      ZEROTH_THROW(
          InvalidArgument,
          "GPT micro-batch of {} x {} while {} micro-batch(es) of {} x {} are in flight: the micro-batches of a cycle share one shape",
          b, t, in_flight, B, T);
    }
  }

  void reserve(Stream& stream, int b, int t, int n_slots, DType compute) {
    if (b == B && t == T && static_cast<size_t>(n_slots) == slots.size()) return;
    check_shape(b, t);
    stream.synchronize();
    const size_t BT = static_cast<size_t>(b) * t, C = cfg.n_embd, L = cfg.n_layer;
    buffer.reset();
    token_buffer.reset();
    host_buffer.reset();
    buffer = device->allocate((n_slots * slot_floats(cfg, b, t) + scratch_floats(cfg, b, t)) * sizeof(float), MemTag::activations);
    if (const size_t saved = n_slots * saved_floats(cfg, b, t); saved > 0) {
      host_buffer = host->allocate_host(saved * sizeof(float), MemTag::activations);
      std::memset(host_buffer.data(), 0, host_buffer.bytes());  // first touch here, not in a step
    }
    token_buffer = device->allocate(n_slots * 2 * BT * sizeof(int32_t), MemTag::activations);
    if (const size_t scratch = Gpt::scratch_bytes(cfg, compute); scratch > 0 && !wbuf) {
      wbuf = device->allocate(scratch / 2, MemTag::buffers);
      gbuf = device->allocate(scratch / 2, MemTag::buffers);
    }
    // Touched once here: first touch of fresh memory is slow, and a step must not pay it.
    device->fill(stream, buffer.view(DType::f32), 0.0f);
    stream.synchronize();
    float* at = buffer.as<float>();
    auto take = [&](size_t n) {
      float* p = at;
      at += n;
      return p;
    };
    slots.assign(n_slots, {});
    for (int i = 0; i < n_slots; ++i) {
      auto& sl = slots[i];
      sl.B = b, sl.T = t;
      sl.tokens = token_buffer.as<int32_t>() + 2 * BT * i;
      sl.targets = sl.tokens + BT;
      sl.resid.assign(L + 1, nullptr);
      sl.saved.assign(saved_count(cfg), nullptr);
      float* copies[2] = {nullptr, nullptr};
      for (size_t l = 0; l <= L; ++l) {
        if (!cfg.cpu_checkpointing) {
          sl.resid[l] = take(BT * C);
          continue;
        }
        if (l < 2) copies[l] = take(BT * C);
        sl.resid[l] = copies[l % 2];
        if (l < sl.saved.size()) sl.saved[l] = host_buffer.as<float>() + (i * sl.saved.size() + l) * BT * C;
      }
      sl.layer.assign(cfg.activation_checkpointing ? 1 : L, {});
      for (auto& a : sl.layer) {
        a.ln1 = take(BT * C), a.ln1_mean = take(BT), a.ln1_rstd = take(BT), a.qkv = take(3 * BT * C);
        a.att = take(static_cast<size_t>(b) * cfg.n_head * t * t), a.atty = take(BT * C), a.res2 = take(BT * C);
        a.ln2 = take(BT * C), a.ln2_mean = take(BT), a.ln2_rstd = take(BT), a.fch = take(4 * BT * C), a.fch_gelu = take(4 * BT * C);
      }
      sl.lnf = take(BT * C), sl.lnf_mean = take(BT), sl.lnf_rstd = take(BT), sl.logits = take(BT * cfg.vocab_size),
      sl.row_loss = take(BT);
    }
    d.dresid = take(BT * C), d.dC = take(BT * C), d.dqkv = take(3 * BT * C), d.dfch = take(4 * BT * C);
    d.datt = take(static_cast<size_t>(b) * cfg.n_head * t * t);
    B = b, T = t;
  }
};

namespace {

// A block's parameters as f32 pointers, and where its backward adds gradients in f32. For an f32
// block these are the engine's own views; for bf16/f16 the parameters are widened into scratch and
// the gradients gathered in f32 scratch, then added into the narrow views once (flush).
class Bound {
 public:
  Bound(gpt::Kernels& k, const std::vector<TensorView>& params, const std::vector<TensorView>* grads, const Buffer& wbuf,
        const Buffer& gbuf)
      : k_(k), grads_(grads) {
    size_t total = 0;
    for (const auto& p : params) total += p.numel;
    narrow_ = !params.empty() && params[0].dtype != DType::f32;
    if (narrow_ && grads != nullptr) k_.zero(gbuf.as<float>(), total);
    size_t off = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      if (narrow_) {
        k_.widen(params[i], wbuf.as<float>() + off);
        p_.push_back(wbuf.as<float>() + off);
        if (grads != nullptr) g_.push_back(gbuf.as<float>() + off);
      } else {
        p_.push_back(params[i].as<float>());
        if (grads != nullptr) g_.push_back((*grads)[i].as<float>());
      }
      off += params[i].numel;
    }
  }
  const float* p(size_t i) const { return p_[i]; }
  float* g(size_t i) const { return g_[i]; }
  void flush() const {
    if (!narrow_ || grads_ == nullptr) return;
    for (size_t i = 0; i < grads_->size(); ++i) k_.add_into((*grads_)[i], g_[i]);
  }

 private:
  gpt::Kernels& k_;
  const std::vector<TensorView>* grads_;
  bool narrow_ = false;
  std::vector<const float*> p_;
  std::vector<float*> g_;
};

// Parameter indices inside a transformer block, in block_specs order.
enum LayerParam { kLn1W, kLn1B, kAttnW, kAttnB, kProjW, kProjB, kLn2W, kLn2B, kFcW, kFcB, kFcProjW, kFcProjB };

void layer_forward(gpt::Kernels& k, const GptConfig& c, const Bound& w, const LayerActs& a, const float* x, float* out, int B, int T) {
  const size_t BT = static_cast<size_t>(B) * T, C = c.n_embd;
  const int Ci = c.n_embd;
  k.layernorm_forward(a.ln1, a.ln1_mean, a.ln1_rstd, x, w.p(kLn1W), w.p(kLn1B), BT, Ci);
  k.matmul_forward(a.qkv, a.ln1, w.p(kAttnW), w.p(kAttnB), BT, Ci, 3 * Ci);
  k.attention_forward(a.atty, a.att, a.qkv, B, T, Ci, c.n_head);
  k.matmul_forward(a.res2, a.atty, w.p(kProjW), w.p(kProjB), BT, Ci, Ci);
  k.accumulate(a.res2, x, BT * C);
  k.layernorm_forward(a.ln2, a.ln2_mean, a.ln2_rstd, a.res2, w.p(kLn2W), w.p(kLn2B), BT, Ci);
  k.matmul_forward(a.fch, a.ln2, w.p(kFcW), w.p(kFcB), BT, Ci, 4 * Ci);
  k.gelu_forward(a.fch_gelu, a.fch, 4 * BT * C);
  if (out != nullptr) {
    k.matmul_forward(out, a.fch_gelu, w.p(kFcProjW), w.p(kFcProjB), BT, 4 * Ci, Ci);
    k.accumulate(out, a.res2, BT * C);
  }
}

// dresid holds the gradient at the block's output on entry and at its input on return.
void layer_backward(gpt::Kernels& k, const GptConfig& c, const Bound& w, const LayerActs& a, const GradScratch& s, const float* x,
                    int B, int T) {
  const size_t BT = static_cast<size_t>(B) * T;
  const int C = c.n_embd;
  float* dresid = s.dresid;
  k.matmul_backward(s.dfch, w.g(kFcProjW), w.g(kFcProjB), dresid, a.fch_gelu, w.p(kFcProjW), BT, 4 * C, C);
  k.gelu_backward(s.dfch, a.fch, s.dfch, 4 * BT * C);
  k.matmul_backward(s.dC, w.g(kFcW), w.g(kFcB), s.dfch, a.ln2, w.p(kFcW), BT, C, 4 * C);
  k.layernorm_backward(dresid, w.g(kLn2W), w.g(kLn2B), s.dC, a.res2, w.p(kLn2W), a.ln2_mean, a.ln2_rstd, BT, C);
  k.matmul_backward(s.dC, w.g(kProjW), w.g(kProjB), dresid, a.atty, w.p(kProjW), BT, C, C);
  k.attention_backward(s.dqkv, s.datt, s.dC, a.qkv, a.att, B, T, C, c.n_head);
  k.matmul_backward(s.dC, w.g(kAttnW), w.g(kAttnB), s.dqkv, a.ln1, w.p(kAttnW), BT, C, 3 * C);
  k.layernorm_backward(dresid, w.g(kLn1W), w.g(kLn1B), s.dC, x, w.p(kLn1W), a.ln1_mean, a.ln1_rstd, BT, C);
}

void check_tokens(const int32_t* t, size_t n, int V, const char* what) {
  for (size_t i = 0; i < n; ++i) {
    if (t[i] < 0 || t[i] >= V) {
      ZEROTH_THROW(InvalidArgument,
                   "{} id {} at position {} is outside the model's vocabulary [0, {}): the data and model.vocab_size disagree", what,
                   t[i], i, V);
    }
  }
}

}  // namespace

// ---- the micro-step -------------------------------------------------------------------------

size_t Gpt::scratch_bytes(const GptConfig& config, DType compute) {
  if (compute == DType::f32) return 0;
  size_t widest = 0;
  for (const auto& spec : block_specs(config)) {
    size_t n = 0;
    for (const auto& p : spec.params) n += p.numel();
    widest = std::max(widest, n);
  }
  return 2 * widest * sizeof(float);
}

Gpt::Gpt(BlockHost& host, GptConfig config) : host_(host), config_(config), state_(std::make_shared<State>()) {
  auto specs = block_specs(config_);
  for (auto& spec : specs) {
    const int id = host_.add_block(std::move(spec));
    if (embed_ < 0) embed_ = id;
    else if (static_cast<int>(layers_.size()) < config_.n_layer) layers_.push_back(id);
    else ln_f_ = id;
  }
  host_.set_schedule(schedule(config_));
  state_->cfg = config_;
  state_->host = &host_;
  state_->device = &host_.device();
  state_->k = gpt::make_kernels(host_.compute_stream());
}

Gpt::~Gpt() {
  // Work still queued on the stream uses the state's buffers. A destructor must not throw: an
  // error the stream kept (the run is usually unwinding from it already) is logged instead.
  try {
    host_.compute_stream().synchronize();
  } catch (const std::exception& e) {
    ZLOG_WARN("GPT teardown: the compute stream had failed: {}", e.what());
  }
}

size_t Gpt::activation_bytes(const GptConfig& config, int B, int T, int slots) {
  const size_t BT = static_cast<size_t>(B) * T;
  return (slots * State::slot_floats(config, B, T) + State::scratch_floats(config, B, T)) * sizeof(float) +
         slots * 2 * BT * sizeof(int32_t);
}

size_t Gpt::host_activation_bytes(const GptConfig& config, int B, int T, int slots) {
  return slots * State::saved_floats(config, B, T) * sizeof(float);
}

ModelFootprint Gpt::footprint(const GptConfig& config, int B, int T, DType compute, int slots) {
  return {activation_bytes(config, B, T, slots), scratch_bytes(config, compute), host_activation_bytes(config, B, T, slots),
          fmt::format("{} slot{} of a {} x {} micro-batch", slots, slots == 1 ? "" : "s", B, T)};
}

void Gpt::forward_backward(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, int micro) {
  forward(micro, tokens, targets, B, T, loss);
  backward(micro);
}

void Gpt::evaluate(const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits) {
  host_.begin_evaluation();
  try {
    run_forward(0, tokens, targets, B, T, loss, logits, false);
  } catch (...) {
    host_.end_evaluation();
    throw;
  }
  host_.end_evaluation();
}

void Gpt::forward(int micro, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss) {
  run_forward(micro, tokens, targets, B, T, loss, nullptr, true);
}

void Gpt::run_forward(int micro, const int32_t* tokens, const int32_t* targets, int B, int T, float* loss, float* logits,
                      bool training) {
  if (B <= 0 || T <= 0 || T > config_.seq_len) {
    ZEROTH_THROW(InvalidArgument, "GPT micro-batch {} x {}: need B >= 1 and 1 <= T <= model.seq_len ({})", B, T, config_.seq_len);
  }
  if (micro < 0) ZEROTH_THROW(InvalidArgument, "GPT forward of micro-batch {}: micro-batch ids start at 0", micro);
  // The caller's host arrays are checked here and copied in stream order to the device, once
  // the host has accepted the use (so a refused call leaves every slot as it was).
  check_tokens(tokens, static_cast<size_t>(B) * T, config_.vocab_size, "token");
  check_tokens(targets, static_cast<size_t>(B) * T, config_.vocab_size, "target");
  auto s = state_;
  Stream& stream = host_.compute_stream();
  s->check_shape(B, T);
  const auto& embed = host_.begin_forward(embed_, micro);
  s->reserve(stream, B, T, host_.micro_batches_in_flight(), host_.compute_dtype());
  Slot* sl = &s->slots[training ? micro % s->slots.size() : 0];
  host_.device().copy(stream, sl->tokens, tokens, static_cast<size_t>(B) * T * sizeof(int32_t));
  host_.device().copy(stream, sl->targets, targets, static_cast<size_t>(B) * T * sizeof(int32_t));
  gpt::Kernels& k = *s->k;
  const GptConfig c = config_;
  const size_t BT = static_cast<size_t>(B) * T;
  const int L = c.n_layer, C = c.n_embd, V = c.vocab_size;
  // Without backward nothing is kept per layer: evaluation runs in the first set.
  auto acts = [sl, training](int l) -> const LayerActs& { return sl->layer[!training || sl->layer.size() == 1 ? 0 : l]; };
  // cpu_checkpointing: each block's input goes to host memory once it is computed (evaluation
  // has no backward to keep it for).
  const size_t bytes = BT * C * sizeof(float);
  auto keep = [&](int l) {
    if (training && static_cast<size_t>(l) < sl->saved.size()) host_.device().copy(stream, sl->saved[l], sl->resid[l], bytes);
  };
  {
    k.submit([s, sl, &k, B, T, C, params = embed.params] {
      Bound w(k, params, nullptr, s->wbuf, s->gbuf);
      k.encoder_forward(sl->resid[0], sl->tokens, w.p(0), w.p(1), B, T, C);
    });
    keep(0);
    host_.end_forward(embed_, micro);
  }
  for (int l = 0; l < L; ++l) {
    const auto& v = host_.begin_forward(layers_[l], micro);
    k.submit([s, sl, &k, c, l, B, T, acts, params = v.params] {
      Bound w(k, params, nullptr, s->wbuf, s->gbuf);
      layer_forward(k, c, w, acts(l), sl->resid[l], sl->resid[l + 1], B, T);
    });
    keep(l + 1);
    host_.end_forward(layers_[l], micro);
  }
  {
    const auto& v = host_.begin_forward(ln_f_, micro);
    k.submit([s, sl, &k, L, BT, C, params = v.params] {
      Bound w(k, params, nullptr, s->wbuf, s->gbuf);
      k.layernorm_forward(sl->lnf, sl->lnf_mean, sl->lnf_rstd, sl->resid[L], w.p(0), w.p(1), BT, C);
    });
    host_.end_forward(ln_f_, micro);
  }
  {
    const auto& v = host_.begin_forward(embed_, micro);
    const float dscale = training ? static_cast<float>(host_.loss_gradient_scale() / static_cast<double>(BT)) : 0.0f;
    k.submit([s, sl, &k, BT, C, V, loss, logits, dscale, params = v.params] {
      Bound w(k, params, nullptr, s->wbuf, s->gbuf);
      k.matmul_forward(sl->logits, sl->lnf, w.p(0), nullptr, BT, C, V);
      if (logits != nullptr) k.download(logits, sl->logits, BT * V);
      k.crossentropy(sl->logits, sl->targets, BT, V, dscale, sl->row_loss, loss);
    });
    host_.end_forward(embed_, micro);
  }
  if (training) ++s->in_flight;
}

void Gpt::backward(int micro) {
  auto s = state_;
  if (s->slots.empty() || micro < 0) ZEROTH_THROW(InvalidArgument, "GPT backward of micro-batch {} before its forward", micro);
  Slot* sl = &s->slots[micro % s->slots.size()];
  gpt::Kernels& k = *s->k;
  const GptConfig c = config_;
  const int B = sl->B, T = sl->T;
  const size_t BT = static_cast<size_t>(B) * T;
  const int L = c.n_layer, C = c.n_embd, V = c.vocab_size;
  const bool ckpt = c.activation_checkpointing;
  auto acts = [sl](int l) -> const LayerActs& { return sl->layer[sl->layer.size() == 1 ? 0 : l]; };
  Stream& stream = host_.compute_stream();
  auto restore = [&](int l) {
    if (static_cast<size_t>(l) < sl->saved.size()) host_.device().copy(stream, sl->resid[l], sl->saved[l], BT * C * sizeof(float));
  };
  {
    const auto& v = host_.begin_backward(embed_, micro);
    --s->in_flight;
    k.submit([s, sl, &k, BT, C, V, params = v.params, grads = v.grads] {
      Bound w(k, params, &grads, s->wbuf, s->gbuf);
      k.matmul_backward(s->d.dC, w.g(0), nullptr, sl->logits, sl->lnf, w.p(0), BT, C, V);
      w.flush();
    });
    host_.end_backward(embed_, micro);
  }
  {
    const auto& v = host_.begin_backward(ln_f_, micro);
    k.submit([s, sl, &k, L, BT, C, params = v.params, grads = v.grads] {
      Bound w(k, params, &grads, s->wbuf, s->gbuf);
      k.zero(s->d.dresid, BT * C);
      k.layernorm_backward(s->d.dresid, w.g(0), w.g(1), s->d.dC, sl->resid[L], w.p(0), sl->lnf_mean, sl->lnf_rstd, BT, C);
      w.flush();
    });
    host_.end_backward(ln_f_, micro);
  }
  for (int l = L - 1; l >= 0; --l) {
    const auto& v = host_.begin_backward(layers_[l], micro);
    restore(l);
    k.submit([s, sl, &k, c, l, B, T, ckpt, acts, params = v.params, grads = v.grads] {
      Bound w(k, params, &grads, s->wbuf, s->gbuf);
      if (ckpt) layer_forward(k, c, w, acts(l), sl->resid[l], nullptr, B, T);
      layer_backward(k, c, w, acts(l), s->d, sl->resid[l], B, T);
      w.flush();
    });
    host_.end_backward(layers_[l], micro);
  }
  {
    const auto& v = host_.begin_backward(embed_, micro);
    k.submit([s, sl, &k, B, T, C, params = v.params, grads = v.grads] {
      Bound w(k, params, &grads, s->wbuf, s->gbuf);
      k.encoder_backward(w.g(0), w.g(1), s->d.dresid, sl->tokens, B, T, C);
      w.flush();
    });
    host_.end_backward(embed_, micro);
  }
}

}  // namespace zeroth
