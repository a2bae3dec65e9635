// Where a run's weights start when run.init_from names them: a zeroth checkpoint's (weights only)
// or a Hugging Face model's, each rank reading its own part of every block.
#include <filesystem>  // std::filesystem

#include "core/error.h"                    // ZEROTH_THROW
#include "engine/checkpoint/checkpoint.h"  // ckpt::load
#include "engine/engine.h"                 // Engine
#include "models/decoder/gpt.h"            // Gpt
#include "train/hf/weights.h"              // HfModelReader, is_hf_weights, check_hf_config
#include "train/run_folder.h"              // is_run_folder, run_folder_weights
#include "train/trainer.h"

namespace zeroth {

void load_initial_weights(Engine& engine, const TrainConfig& config) {
  namespace fs = std::filesystem;
  // A run's folder: its trained weights.
  const std::string from = is_run_folder(config.run.init_from) ? run_folder_weights(config.run.init_from) : config.run.init_from;
  std::error_code ec;
  const bool checkpoint = fs::is_directory(from, ec) &&
                          (fs::exists(fs::path(from) / ckpt::kManifestName, ec) || fs::exists(fs::path(from) / ckpt::kLatestName, ec));
  if (!checkpoint && !is_hf_weights(from)) {
    ZEROTH_THROW(ConfigError,
                 "run.init_from {} is {}: give a zeroth checkpoint folder (or a step folder), a run's folder, a .safetensors file, or "
                 "a Hugging Face model folder holding model.safetensors or model.safetensors.index.json (PyTorch .bin weights are not "
                 "read)",
                 from, fs::exists(from, ec) ? "none of those" : "not there");
  }
  if (checkpoint && config.model.lora.enabled()) {
    ZEROTH_THROW(ConfigError,
                 "run.init_from {} is a zeroth checkpoint, which holds no LoRA adapters to start from; give LoRA a Hugging Face model "
                 "(`zeroth ckpt export` writes one from the checkpoint) or a run's folder",
                 from);
  }
  if (checkpoint) {
    ckpt::load(engine, from, nullptr, true);
    return;
  }
  check_hf_config(config.model, from);
  HfModelReader reader(config.model, from);
  const auto whole = Gpt::block_specs(config.model);
  const auto& blocks = engine.plan().blocks;
  for (size_t b = 0; b < blocks.size(); ++b) {
    // The base model's weights come from the file; the adapters start as a fresh run starts them.
    if (blocks[b].name.ends_with(".lora")) {
      engine.initialize_block(static_cast<int>(b));
      continue;
    }
    int w = 0;
    while (whole[w].name != blocks[b].name) ++w;  // the plan's blocks are the model's, by name
    engine.set_block_values(static_cast<int>(b), [&](size_t lo, size_t hi, float* out) {
      reader.read_block(w, engine.block_spec(static_cast<int>(b)), blocks[b].param_offsets, lo, hi, out);
    });
  }
  engine.release_transfer_buffers();
}

}  // namespace zeroth
