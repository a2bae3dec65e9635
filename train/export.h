// The trained weights of a GPT run as one safetensors file in Hugging Face's GPT-2 names and
// layouts, which GPT2LMHeadModel loads: what a run leaves in its output folder.
#pragma once

#include <cstdint>  // uint64_t
#include <string>   // std::string

#include "core/dtype.h"      // DType
#include "engine/engine.h"   // Engine
#include "models/gpt/gpt.h"  // GptConfig

namespace zeroth {

// Gathers the fp32 master weights block by block (so rank 0 holds one block at a time), casts them
// to `dtype` (f32, bf16 or f16) and has rank 0 stream them into `path` (written to a .tmp, fsync'd,
// renamed). Collective over the engine's data-parallel group. Rank 0 returns the bytes written (the
// others 0) and raises its write's error, if any, once the gathers are done.
uint64_t save_gpt_weights(Engine& engine, const GptConfig& config, const std::string& path, DType dtype);

}  // namespace zeroth
