// The consolidated weights: gathered per block, streamed into Hugging Face's files.
#include "train/hf/export.h"

#include <algorithm>   // std::min
#include <cstring>     // std::memmove
#include <exception>   // std::exception_ptr
#include <filesystem>  // std::filesystem::create_directories
#include <functional>  // std::function
#include <map>         // std::map
#include <optional>    // std::optional
#include <vector>      // std::vector

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/cpu/kernels.h"          // cpu::cast
#include "core/error.h"                // ZEROTH_CHECK
#include "core/safetensors.h"          // SafeTensors, write_safetensors
#include "engine/checkpoint/format.h"  // ckpt::write_file_atomically

namespace zeroth {
namespace {

// The device buffer the transfers below go through, in floats: no more than the gather of one
// block's master values takes (what the engine's estimate counts for the end-of-run save), or 32
// KiB (inside the estimate's allowance) where that gather takes nothing.
size_t wire_floats(const Plan& plan) {
  size_t most = 0;
  for (size_t b = 0; b < plan.blocks.size(); ++b) {
    const OwnedRange& m = plan.values_owned(static_cast<int>(b));
    if (m.numel() < plan.blocks[b].padded) most = std::max(most, m.numel() + plan.blocks[b].padded);
  }
  return std::max<size_t>(most, 8192);
}

// `count` floats from `from` (host memory of rank `source`) to `to` (host memory of rank `dest`) of
// `comm`, in pieces through one device buffer.
void transfer(Engine& engine, Communicator& comm, int source, int dest, const float* from, float* to, size_t count) {
  Device& device = engine.device();
  Stream& cs = engine.compute_stream();
  const size_t chunk = std::min(count, wire_floats(engine.plan()));
  Buffer wire = device.allocate(std::max<size_t>(chunk, 1) * sizeof(float), MemTag::other);
  for (size_t at = 0; at < count; at += chunk) {
    const size_t n = std::min(chunk, count - at);
    const TensorView piece{wire.data(), n, DType::f32};
    if (comm.rank() == source) {
      device.copy(cs, wire.data(), from + at, n * sizeof(float));
      comm.send(cs, piece, dest);
    } else {
      comm.recv(cs, piece, source);
      device.copy(cs, to + at, wire.data(), n * sizeof(float));
    }
  }
  cs.synchronize();
}

// Tensor-parallel rank 0 of the group receives every rank's slices of `block` (`mine`: each rank's
// parameters end to end, its own sizes) and places them in the whole tensors, end to end; the
// other ranks send theirs and get nothing back. On data-parallel rank 0 of each rank's group.
std::vector<float> assemble_slices(Engine& engine, Communicator& tensor, int block, const std::vector<float>& mine, size_t numel) {
  const auto& spec = engine.block_spec(block);
  std::vector<float> whole;
  if (tensor.rank() != 0) {
    transfer(engine, tensor, tensor.rank(), 0, mine.data(), nullptr, mine.size());
    return whole;
  }
  whole.assign(numel, 0.0f);
  for (int r = 0; r < tensor.size(); ++r) {
    // Rank r's slices: its parameters cut for r (the vocabulary's parts differ by a row).
    std::vector<ParamSpec> cut;
    size_t count = 0;
    for (const auto& p : spec.params) {
      ParamSpec unsplit = p;
      if (p.tp.split()) unsplit.shape = p.tp.full_shape;
      cut.push_back(p.tp.split() ? unsplit.cut(p.tp.axis, p.tp.groups, r, p.tp.ranks) : p);
      count += cut.back().numel();
    }
    std::vector<float> theirs = r == 0 ? mine : std::vector<float>(count);
    if (r != 0) transfer(engine, tensor, r, 0, nullptr, theirs.data(), count);
    size_t at = 0, full_at = 0;
    for (const auto& p : cut) {
      ParamSpec full = p;
      if (p.tp.split()) full.shape = p.tp.full_shape;
      const size_t full_numel = full.numel();
      // Replicated parameters: rank 0's copy.
      if (p.tp.split() || r == 0) p.tp.put(theirs.data() + at, whole.data() + full_at, p.numel());
      at += p.numel(), full_at += full_numel;
    }
  }
  return whole;
}

// Block `spec` of the whole model, gathered from the ranks that hold it into `dense` (its parameters
// end to end in their whole shapes) on the lead rank (data-parallel, tensor-parallel and pipeline
// rank 0); the others may be left with anything. Every rank calls it for every block in the same
// order: the gathers are collective.
void gather_whole_block(Engine& engine, const StageExport& pipeline, const BlockSpec& spec, std::vector<float>& dense) {
  const int stage = pipeline.stages != nullptr ? pipeline.stages->rank() : 0;
  const int tp_rank = pipeline.tensor != nullptr ? pipeline.tensor->rank() : 0;
  Stream& cs = engine.compute_stream();
  const std::string& name = spec.name;
  int local = -1;
  for (size_t b = 0; b < engine.plan().blocks.size(); ++b) {
    if (engine.plan().blocks[b].name == name) local = static_cast<int>(b);
  }
  // The tied embedding's copy with the LM head is not the one written.
  const bool mine = local >= 0 && (name != "embed" || stage == 0);
  size_t numel = 0;
  for (const auto& p : spec.params) numel += p.numel();
  if (mine) {
    // This rank's parameters end to end (its slices of them with tensor parallelism), moved
    // together in the gathered block itself: a second block-sized vector would double the
    // export's peak (315 MB per layer of a 2B-parameter GPT).
    engine.master_values(local, dense);
    const auto& offsets = engine.plan().blocks[local].param_offsets;
    const auto& params = engine.block_spec(local).params;
    size_t end = 0;
    for (size_t i = 0; i < params.size(); ++i) {  // offsets ascend, so each move goes to the left
      std::memmove(dense.data() + end, dense.data() + offsets[i], params[i].numel() * sizeof(float));
      end += params[i].numel();
    }
    dense.resize(end);
    const bool experts = engine.plan().blocks[local].expert;
    // An expert block is whole on every tensor-parallel rank: nothing to assemble over them.
    if (pipeline.tensor != nullptr && !experts)
      dense = engine.comm().rank() == 0 ? assemble_slices(engine, *pipeline.tensor, local, dense, numel) : std::vector<float>{};
    if (experts) {
      // The expert-parallel ranks' slices are consecutive experts: in rank order, the block. Only
      // the group of data-parallel rank 0 (ranks 0 .. ep - 1: the trainer's split) needs it, on
      // its tensor-parallel rank 0, and takes it through the transfers' wire buffer: a
      // block-sized device buffer per rank is more than the run's estimate holds for its end.
      ZEROTH_CHECK(pipeline.experts != nullptr && dense.size() * pipeline.experts->size() == numel,
                   "exporting block {}: {} elements of its experts here, {} in the model", name, dense.size(), numel);
      Communicator& ep = *pipeline.experts;
      const size_t slice = dense.size();
      if (tp_rank == 0 && engine.comm().rank() / ep.size() == 0) {
        if (ep.rank() == 0) {
          dense.resize(numel);
          for (int r = 1; r < ep.size(); ++r) transfer(engine, ep, r, 0, nullptr, dense.data() + r * slice, slice);
        } else {
          transfer(engine, ep, ep.rank(), 0, dense.data(), nullptr, slice);
        }
      }
    }
  }
  if (tp_rank != 0) return;  // rank 0 of the tensor-parallel group holds the whole block now
  if (pipeline.stages != nullptr && engine.comm().rank() == 0) {
    // Which stage holds it: each says, stage 0 learns (a small all-reduce over the group).
    Buffer flag = engine.device().allocate(sizeof(float), MemTag::buffers);
    const float me = mine ? static_cast<float>(stage) : 0.0f;
    engine.device().copy(cs, flag.data(), &me, sizeof me);
    pipeline.stages->all_reduce(cs, flag.view(DType::f32), ReduceOp::sum);
    float from = 0;
    engine.device().copy(cs, &from, flag.data(), sizeof from);
    cs.synchronize();
    const int source = static_cast<int>(from);
    if (source != 0 && (stage == 0 || stage == source)) {
      if (stage == 0) dense.resize(numel);
      transfer(engine, *pipeline.stages, source, 0, dense.data(), dense.data(), numel);
    }
  }
}

// Each LoRA adapter of `adapters` (a layer's adapter block, whole) merged into `layer` (its base
// block, whole, end to end): W += scale B A for every "<module>.lora_A.weight".
void merge_adapters(const BlockSpec& layer, std::vector<float>& values, const BlockSpec& lora_spec, const std::vector<float>& adapters,
                    double scale) {
  auto offset_of = [](const BlockSpec& spec, const std::string& name) {
    size_t at = 0;
    for (const auto& p : spec.params) {
      if (p.name == name) return at;
      at += p.numel();
    }
    ZEROTH_THROW(InvalidArgument, "merging LoRA adapters: block {} has no parameter {}", spec.name, name);
  };
  auto shape_of = [](const BlockSpec& spec, const std::string& name) {
    for (const auto& p : spec.params)
      if (p.name == name) return p.tp.split() ? p.tp.full_shape : p.shape;
    return std::vector<int64_t>{};
  };
  constexpr std::string_view kA = ".lora_A.weight";
  for (const auto& p : lora_spec.params) {
    if (!p.name.ends_with(kA)) continue;
    const std::string module = p.name.substr(0, p.name.size() - kA.size());
    const auto a_shape = shape_of(lora_spec, p.name);
    const size_t r = static_cast<size_t>(a_shape[0]), in = static_cast<size_t>(a_shape[1]);
    const size_t out = static_cast<size_t>(shape_of(layer, module + ".weight")[0]);
    add_lora_delta(values.data() + offset_of(layer, module + ".weight"), adapters.data() + offset_of(lora_spec, p.name),
                   adapters.data() + offset_of(lora_spec, module + ".lora_B.weight"), out, in, r, scale);
  }
}

}  // namespace

// Long: one loop over the model's blocks, each gathered and written (a layer's LoRA adapters gathered before it and merged
// into it); every rank must make the same collectives in the same order.
uint64_t save_gpt_weights(Engine& engine, const GptConfig& config, const std::string& path, DType dtype, const StageExport& pipeline,
                          uint64_t shard_bytes) {
  const int stage = pipeline.stages != nullptr ? pipeline.stages->rank() : 0;
  const int tp_rank = pipeline.tensor != nullptr ? pipeline.tensor->rank() : 0;
  const bool lead = engine.comm().rank() == 0 && stage == 0 && tp_rank == 0;
  std::optional<HfWriter> out;
  std::exception_ptr failed;
  // Rank 0's errors wait until every gather is done: the other ranks are in them too.
  auto on_lead = [&](const auto& work) {
    if (!lead || failed) return;
    try {
      work();
    } catch (...) {
      failed = std::current_exception();
      out.reset();  // removes the .tmp
    }
  };
  on_lead([&] { out.emplace(config, path, dtype, shard_bytes); });
  const auto whole = Gpt::block_specs(config);
  // The blocks in order, but each layer's adapters before the layer they merge into.
  std::vector<size_t> order;
  for (size_t g = 0; g < whole.size(); ++g) {
    if (whole[g].name.ends_with(".lora")) continue;
    for (size_t a = g + 1; a < whole.size(); ++a)  // a layer's, or its experts' ("<layer>.experts.lora")
      if (whole[a].name == whole[g].name + ".lora") order.push_back(a);
    order.push_back(g);
  }
  std::vector<float> dense, adapters;  // one block's values at a time, its memory kept from block to block
  int adapters_of = -1;                // the block `adapters` holds
  for (size_t g : order) {
    gather_whole_block(engine, pipeline, whole[g], dense);
    if (whole[g].name.ends_with(".lora")) {
      if (lead) adapters.swap(dense), adapters_of = static_cast<int>(g);
      continue;
    }
    on_lead([&] {
      if (adapters_of >= 0 && whole[adapters_of].name == whole[g].name + ".lora")
        merge_adapters(whole[g], dense, whole[adapters_of], adapters, config.lora.scale());
      std::vector<size_t> at(1, 0);
      for (const auto& p : whole[g].params) at.push_back(at.back() + p.numel());
      while (!out->done() && out->block() == static_cast<int>(g)) out->write(dense.data() + at[out->param()]);
    });
  }
  uint64_t bytes = 0;
  on_lead([&] { bytes = out->finish(); });
  if (failed) std::rethrow_exception(failed);
  return bytes;
}


void add_lora_delta(float* W, const float* A, const float* B, size_t out, size_t in, size_t r, double scale) {
  for (size_t o = 0; o < out; ++o) {
    for (size_t i = 0; i < in; ++i) {
      double sum = 0;
      for (size_t k = 0; k < r; ++k) sum += static_cast<double>(B[o * r + k]) * A[k * in + i];
      W[o * in + i] += static_cast<float>(scale * sum);
    }
  }
}

uint64_t write_peft_adapter(const std::string& folder, const GptConfig& config,
                            const std::function<void(int block, size_t param, float* out)>& values, DType dtype,
                            const std::string& base_model) {
  ZEROTH_CHECK(config.lora.enabled(), "write_peft_adapter on a model without LoRA");
  const auto whole = Gpt::block_specs(config);
  SafeTensors file;
  file.metadata["format"] = "pt";
  std::vector<std::string> modules;  // PEFT's target_modules: the adapted layers' own names
  std::vector<float> f32;
  uint64_t bytes = 0;
  for (const auto& h : Gpt::peft_params(config)) {
    const ParamSpec& p = whole[h.block].params[h.param];
    f32.resize(p.numel());
    values(h.block, h.param, f32.data());
    SafeTensor t{safetensors_dtype(dtype), p.shape, std::vector<char>(p.numel() * dtype_size(dtype))};
    cpu::cast(f32.data(), DType::f32, t.data.data(), dtype, p.numel());
    bytes += t.data.size();
    file.tensors[h.name] = std::move(t);
    // Whole paths inside a layer ("self_attn.q_proj", "attn.c_proj"): PEFT matches a target by its
    // last parts, and GPT-2's "c_proj" alone would name the MLP's projection too.
    const std::string module = p.name.substr(0, p.name.find(".lora_"));
    if (std::find(modules.begin(), modules.end(), module) == modules.end()) modules.push_back(module);
  }
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec) ZEROTH_THROW(IoError, "create_directories(\"{}\"): {}", folder, ec.message());
  write_safetensors(folder + "/adapter_model.safetensors", file);
  const LoraConfig& l = config.lora;
  const nlohmann::json adapter = {{"peft_type", "LORA"},
                                  {"task_type", "CAUSAL_LM"},
                                  {"base_model_name_or_path", base_model.empty() ? nlohmann::json() : nlohmann::json(base_model)},
                                  {"r", l.r},
                                  {"lora_alpha", l.alpha},
                                  {"lora_dropout", 0.0},
                                  {"target_modules", modules},
                                  {"use_rslora", l.use_rslora},
                                  {"use_dora", false},
                                  {"bias", "none"},
                                  // GPT-2's Conv1D layers keep [in, out]; the adapters are nn.Linear's either way.
                                  {"fan_in_fan_out", !config.llama()},
                                  {"init_lora_weights", true},
                                  {"inference_mode", true},
                                  {"modules_to_save", nullptr},
                                  {"layers_to_transform", nullptr},
                                  {"layers_pattern", nullptr},
                                  {"rank_pattern", nlohmann::json::object()},
                                  {"alpha_pattern", nlohmann::json::object()},
                                  {"revision", nullptr}};
  ckpt::write_file_atomically(folder, "adapter_config.json", adapter.dump(2) + "\n");
  return bytes;
}

uint64_t save_lora_adapter(Engine& engine, const GptConfig& config, const std::string& folder, DType dtype,
                           const StageExport& pipeline, const std::string& base_model) {
  ZEROTH_CHECK(config.lora.enabled(), "save_lora_adapter on a model without LoRA");
  const int stage = pipeline.stages != nullptr ? pipeline.stages->rank() : 0;
  const int tp_rank = pipeline.tensor != nullptr ? pipeline.tensor->rank() : 0;
  const bool lead = engine.comm().rank() == 0 && stage == 0 && tp_rank == 0;
  const auto whole = Gpt::block_specs(config);
  // Every adapter block gathered whole (collective), kept on the lead: they are small.
  std::map<int, std::vector<float>> blocks;
  std::vector<float> dense;
  for (size_t b = 0; b < whole.size(); ++b) {
    if (!whole[b].name.ends_with(".lora")) continue;
    gather_whole_block(engine, pipeline, whole[b], dense);
    if (lead) blocks[static_cast<int>(b)] = dense;
  }
  if (!lead) return 0;
  return write_peft_adapter(
      folder, config,
      [&](int block, size_t param, float* out) {
    size_t at = 0;
    for (size_t i = 0; i < param; ++i) at += whole[block].params[i].numel();
    const auto& v = blocks.at(block);
    std::copy(v.begin() + at, v.begin() + at + whole[block].params[param].numel(), out);
      },
      dtype, base_model);
}

}  // namespace zeroth
