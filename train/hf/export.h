// The trained weights of a run, gathered from the ranks that hold them and written in Hugging
// Face's names and layouts (train/hf/weights.h): what a run leaves in its output folder.
#pragma once

#include <cstdint>     // uint64_t
#include <functional>  // std::function
#include <string>      // std::string

#include "core/dtype.h"          // DType
#include "engine/engine.h"       // Engine
#include "models/decoder/gpt.h"  // GptConfig
#include "train/hf/weights.h"    // HfWriter, kHfDefaultShardBytes

namespace zeroth {

// Gathers the fp32 master weights block by block (so rank 0 holds one block at a time) and has
// rank 0 stream them through an HfWriter (`path`: a .safetensors file or a folder of shards of at
// most `shard_bytes`). Collective over the engine's data-parallel group. Rank 0 returns the bytes
// written (the others 0) and raises its write's error, if any, once the gathers are done.
// On a pipeline, every stage calls it with `stages` (its pipeline group) and its part: the owner of
// each block (the first stage for the tied embedding) gathers it over its data-parallel group and,
// from data-parallel rank 0, sends it to stage 0, whose data-parallel rank 0 writes the file. With
// tensor parallelism (`tensor`, the part's tensor-parallel group), each block's slices are first
// assembled on tensor-parallel rank 0 of their stage.
struct StageExport {
  Communicator* stages = nullptr;
  GptPart part;
  Communicator* tensor = nullptr;
  Communicator* experts = nullptr;  // the expert-parallel group, whose ranks hold the experts' slices in order
};
// With LoRA (config.lora) the adapters are merged into the weights they adapt (W + scale B A).
uint64_t save_gpt_weights(Engine& engine, const GptConfig& config, const std::string& path, DType dtype,
                          const StageExport& pipeline = {}, uint64_t shard_bytes = kHfDefaultShardBytes);

// The LoRA adapters (config.lora), gathered as save_gpt_weights gathers a block (whole tensors,
// never a rank's shard), written into `folder` as PEFT's save_pretrained writes an adapter:
// adapter_model.safetensors under PEFT's names in `dtype`, and adapter_config.json (`base_model`:
// its base_model_name_or_path, null when empty). Each file written to .tmp and renamed. Collective
// as save_gpt_weights; rank 0 returns the bytes of tensor data written.
uint64_t save_lora_adapter(Engine& engine, const GptConfig& config, const std::string& folder, DType dtype,
                           const StageExport& pipeline = {}, const std::string& base_model = "");
// The writing half of it: values(block, param, out) gives an adapter parameter's whole tensor
// (Gpt::peft_params' blocks and parameters of config). Returns the bytes of tensor data written.
uint64_t write_peft_adapter(const std::string& folder, const GptConfig& config,
                            const std::function<void(int block, size_t param, float* out)>& values, DType dtype,
                            const std::string& base_model = "");
// LoRA's merge of one adapted layer: W [out, in] += scale B [out, r] A [r, in], summed in float64.
void add_lora_delta(float* W, const float* A, const float* B, size_t out, size_t in, size_t r, double scale);

}  // namespace zeroth
