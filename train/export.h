// The trained weights of a GPT as one safetensors file in Hugging Face's GPT-2 names and layouts,
// which GPT2LMHeadModel loads (what a run leaves in its output folder, what `zeroth ckpt export`
// writes), and the way back: such a file as a run's initial weights (run.init_from, `zeroth ckpt
// import`).
#pragma once

#include <cstdint>     // uint64_t
#include <functional>  // std::function
#include <optional>    // std::optional
#include <string>      // std::string
#include <vector>      // std::vector

#include "core/dtype.h"        // DType
#include "core/safetensors.h"  // SafeTensorsWriter
#include "engine/engine.h"     // Engine
#include "models/gpt/gpt.h"    // GptConfig

namespace zeroth {

// Streams the GPT's tensors into `path` in Hugging Face's order, names and layouts (Conv1D
// weights transposed), cast to `dtype` (f32, bf16 or f16), one tensor at a time: the caller asks
// which tensor comes next (a parameter of Gpt::block_specs) and hands its f32 values in zeroth's
// layout. Written to `path`.tmp, fsync'd and renamed by finish().
class Gpt2Writer {
 public:
  Gpt2Writer(const GptConfig& config, const std::string& path, DType dtype);
  bool done() const { return next_ == hf_.size(); }
  int block() const { return hf_.at(next_).block; }
  size_t param() const { return hf_.at(next_).param; }
  void write(const float* values);
  uint64_t finish();  // the bytes of tensor data written

 private:
  std::vector<BlockSpec> specs_;
  std::vector<Gpt::HfParam> hf_;
  DType dtype_;
  size_t next_ = 0;
  uint64_t bytes_ = 0;
  std::optional<SafeTensorsWriter> out_;
  std::vector<float> turned_;
  std::vector<char> narrow_;
};

// Gathers the fp32 master weights block by block (so rank 0 holds one block at a time) and has
// rank 0 stream them through a Gpt2Writer. Collective over the engine's data-parallel group. Rank 0
// returns the bytes written (the others 0) and raises its write's error, if any, once the gathers
// are done.
// On a pipeline, every stage calls it with `stages` (its pipeline group) and its part: the owner of
// each block (the first stage for the tied embedding) gathers it over its data-parallel group and,
// from data-parallel rank 0, sends it to stage 0, whose data-parallel rank 0 writes the file. With
// tensor parallelism (`tensor`, the part's tensor-parallel group), each block's slices are first
// assembled on tensor-parallel rank 0 of their stage.
struct StageExport {
  Communicator* stages = nullptr;
  GptPart part;
  Communicator* tensor = nullptr;
};
uint64_t save_gpt_weights(Engine& engine, const GptConfig& config, const std::string& path, DType dtype,
                          const StageExport& pipeline = {});

// A GPT-2 safetensors file (Hugging Face's names, with or without the "transformer." prefix, and
// layouts; F32, BF16 or F16) read tensor by tensor: each parameter of Gpt::block_specs(config) in
// zeroth's layout, in f32, handed to `take(block, param, values)` block by block, each block's
// parameters in order. Position embeddings beyond
// model.seq_len are dropped; a model vocabulary larger than the file's gets zero rows (as llm.c
// pads GPT-2's 50257 to 50304). InvalidArgument naming the file, the tensor and the shapes when
// the file does not fit the model.
void read_gpt2_weights(const GptConfig& config, const std::string& path,
                       const std::function<void(int block, size_t param, std::vector<float>& values)>& take);

}  // namespace zeroth
