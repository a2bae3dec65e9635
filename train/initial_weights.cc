// Where a run's weights start when run.init_from names them: a zeroth checkpoint's (weights only)
// or a Hugging Face model's, each rank reading its own part of every block.
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream
#include <map>         // std::map

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/error.h"                    // ZEROTH_THROW
#include "core/safetensors.h"              // read_safetensors
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

void load_lora_adapter(Engine& engine, const TrainConfig& config) {
  namespace fs = std::filesystem;
  const std::string& dir = config.lora_init_from;
  const LoraConfig& lora = config.model.lora;
  const fs::path config_path = fs::path(dir) / "adapter_config.json", weights_path = fs::path(dir) / "adapter_model.safetensors";
  std::error_code ec;
  if (!fs::exists(config_path, ec) || !fs::exists(weights_path, ec)) {
    ZEROTH_THROW(ConfigError,
                 "lora.init_from {} is not a PEFT adapter folder: it needs adapter_config.json and adapter_model.safetensors (what "
                 "a LoRA run writes into its output_dir)",
                 dir);
  }
  std::ifstream in(config_path);
  nlohmann::json adapter;
  try {
    adapter = nlohmann::json::parse(in);
  } catch (const nlohmann::json::exception& e) {
    ZEROTH_THROW(ConfigError, "lora.init_from: {} is not JSON: {}", config_path.string(), e.what());
  }
  const int r = adapter.value("r", 0);
  const double alpha = adapter.value("lora_alpha", 0.0);
  const bool rslora = adapter.value("use_rslora", false);
  if (r != lora.r || alpha != lora.alpha || rslora != lora.use_rslora) {
    ZEROTH_THROW(ConfigError,
                 "lora.init_from {}: its adapters have r {}, lora_alpha {:g}, use_rslora {} where the config's lora has r {}, alpha "
                 "{:g}, use_rslora {}; set the config's to the adapter's",
                 dir, r, alpha, rslora, lora.r, lora.alpha, lora.use_rslora);
  }
  const SafeTensors file = read_safetensors(weights_path.string());
  const auto whole = Gpt::block_specs(config.model);
  std::map<std::string, std::string> peft;  // "<block>.<param>" -> PEFT's name
  for (const auto& h : Gpt::peft_params(config.model)) peft[whole[h.block].name + "." + whole[h.block].params[h.param].name] = h.name;
  for (size_t b = 0; b < engine.plan().blocks.size(); ++b) {
    const auto& blk = engine.plan().blocks[b];
    if (!blk.name.ends_with(".lora")) continue;
    const BlockSpec& spec = engine.block_spec(static_cast<int>(b));
    std::vector<float> values(blk.padded, 0.0f);
    for (size_t i = 0; i < spec.params.size(); ++i) {
      const ParamSpec& p = spec.params[i];
      const std::string& name = peft.at(spec.name + "." + p.name);
      const auto found = file.tensors.find(name);
      const std::vector<int64_t> shape = p.tp.split() ? p.tp.full_shape : p.shape;
      if (found == file.tensors.end() || found->second.shape != shape) {
        ZEROTH_THROW(ConfigError,
                     "lora.init_from {}: adapter_model.safetensors {} {}; the config's lora.target_modules and model need it", dir,
                     found == file.tensors.end() ? "has no tensor" : "has another shape for", name);
      }
      const std::vector<float> full = found->second.as_f32();
      if (p.tp.split()) {
        p.tp.take(full.data(), values.data() + blk.param_offsets[i], p.numel());
      } else {
        std::copy(full.begin(), full.end(), values.begin() + static_cast<std::ptrdiff_t>(blk.param_offsets[i]));
      }
    }
    engine.set_block_values(static_cast<int>(b), [&](size_t lo, size_t hi, float* out) {
      std::copy(values.begin() + static_cast<std::ptrdiff_t>(lo), values.begin() + static_cast<std::ptrdiff_t>(hi), out);
    });
  }
  engine.release_transfer_buffers();
}

}  // namespace zeroth
