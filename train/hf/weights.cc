#include "train/hf/weights.h"

#include <fcntl.h>   // open
#include <unistd.h>  // close

#include <algorithm>   // std::min, std::max, std::stable_sort
#include <cerrno>      // errno
#include <cstdio>      // std::rename
#include <cstring>     // std::strerror
#include <filesystem>  // std::filesystem
#include <fstream>     // std::ifstream, std::ofstream
#include <set>         // std::set

#include <fmt/format.h>       // fmt::format
#include <fmt/ranges.h>       // fmt::join
#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/cpu/kernels.h"       // cpu::cast
#include "core/error.h"             // ZEROTH_THROW
#include "train/hf/model_config.h"  // hf_config_to_json, read_hf_config

namespace zeroth {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

std::string shape_text(const std::vector<int64_t>& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// [rows, cols] into [cols, rows], in tiles, so the rows read and the columns written both stay
// in cache (a plain column walk misses on every element of a 768 x 2304 matrix).
void transpose(const float* in, size_t rows, size_t cols, float* out) {
  constexpr size_t kTile = 32;
  for (size_t r0 = 0; r0 < rows; r0 += kTile) {
    for (size_t c0 = 0; c0 < cols; c0 += kTile) {
      const size_t r1 = std::min(rows, r0 + kTile), c1 = std::min(cols, c0 + kTile);
      for (size_t r = r0; r < r1; ++r)
        for (size_t c = c0; c < c1; ++c) out[c * rows + r] = in[r * cols + c];
    }
  }
}


// Where a tensor comes in Hugging Face's state dict (module registration order), which is the
// order save_pretrained fills its shards in: the embeddings, each layer (attention's projections
// with their biases, then its norms, the MLP, the layer norms), the final norm, the head.
int state_dict_rank(const std::string& name) {
  static const char* const kOrder[] = {// Llama family, per layer
                                       "self_attn.q_proj.weight", "self_attn.q_proj.bias", "self_attn.k_proj.weight",
                                       "self_attn.k_proj.bias", "self_attn.v_proj.weight", "self_attn.v_proj.bias",
                                       "self_attn.o_proj.weight", "self_attn.o_proj.bias", "self_attn.q_norm.weight",
                                       "self_attn.k_norm.weight", "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight",
                                       "input_layernorm.weight", "post_attention_layernorm.weight",
                                       // GPT-2, per layer
                                       "ln_1.weight", "ln_1.bias", "attn.c_attn.weight", "attn.c_attn.bias", "attn.c_proj.weight",
                                       "attn.c_proj.bias", "ln_2.weight", "ln_2.bias", "mlp.c_fc.weight", "mlp.c_fc.bias",
                                       "mlp.c_proj.weight", "mlp.c_proj.bias"};
  for (int i = 0; i < static_cast<int>(std::size(kOrder)); ++i) {
    if (name.ends_with(std::string(".") + kOrder[i])) return i;
  }
  return 0;
}

// A small file (config.json, the index) written whole to .tmp and renamed.
void write_text_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out || !out.write(text.data(), static_cast<std::streamsize>(text.size())) || !out.flush())
      ZEROTH_THROW(IoError, "writing {}: {}", tmp, std::strerror(errno));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    const int err = errno;
    std::remove(tmp.c_str());
    ZEROTH_THROW(IoError, "rename(\"{}\", \"{}\"): {}", tmp, path, std::strerror(err));
  }
}

}  // namespace

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  ZEROTH_THROW(InvalidArgument, "weights cannot be saved as {}", dtype_name(dtype));
}

bool is_hf_weights(const std::string& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec))
    return fs::exists(fs::path(path) / kHfIndexName, ec) || fs::exists(fs::path(path) / kHfSingleName, ec);
  return path.ends_with(".safetensors");
}

void check_hf_config(const GptConfig& m, const std::string& path) {
  std::error_code ec;
  if (!fs::is_directory(path, ec) || !fs::exists(fs::path(path) / "config.json", ec)) return;
  const GptConfig f = read_hf_config(path).model;
  std::vector<std::string> differ;
  auto same = [&](const char* key, const auto& mine, const auto& theirs) {
    if (!(mine == theirs)) differ.push_back(fmt::format("{} {} where the file has {}", key, mine, theirs));
  };
  same("architecture", m.hf_architecture(), f.hf_architecture());
  same("model.n_layer", m.n_layer, f.n_layer);
  same("model.n_embd", m.n_embd, f.n_embd);
  same("model.n_head", m.n_head, f.n_head);
  if (m.vocab_size < f.vocab_size)
    differ.push_back(fmt::format("model.vocab_size {} where the file has {}", m.vocab_size, f.vocab_size));
  if (m.llama() && f.llama()) {
    same("model.n_kv_head", m.kv_heads(), f.kv_heads());
    same("model.head_dim", m.head_size(), f.head_size());
    same("model.intermediate_size", m.ffn(), f.ffn());
    same("model.rms_norm_eps", m.norm_eps, f.norm_eps);
    same("model.rope_theta", m.rope_theta, f.rope_theta);
    same("model.rope_scaling", rope_scaling_to_json(m.rope_scaling).dump(), rope_scaling_to_json(f.rope_scaling).dump());
    same("model.qkv_bias", m.qkv_bias, f.qkv_bias);
    same("model.attention_bias", m.o_bias, f.o_bias);
    same("model.qk_norm", m.qk_norm, f.qk_norm);
    same("model.tie_word_embeddings", m.tie_word_embeddings, f.tie_word_embeddings);
  }
  if (!differ.empty()) {
    ZEROTH_THROW(ConfigError,
                 "{}/config.json describes another model than the config's: {}; set model.hf_config to {} to take its shape", path,
                 fmt::join(differ, "; "), path);
  }
}

HfWeights::HfWeights(const std::string& path) : path_(path) {
  std::error_code ec;
  std::vector<std::string> shards;
  if (!fs::is_directory(path, ec)) {
    shards.push_back(path);
  } else if (const fs::path index = fs::path(path) / kHfIndexName; fs::exists(index, ec)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      ZEROTH_THROW(InvalidArgument, "{} is not valid JSON: {}", index.string(), e.what());
    }
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      ZEROTH_THROW(InvalidArgument, "{} has no weight_map object (tensor name -> shard file)", index.string());
    std::set<std::string> files;
    for (const auto& [name, file] : j["weight_map"].items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        ZEROTH_THROW(InvalidArgument, "{}: weight_map[{}] must name a file in the folder, got {}", index.string(), name, file.dump());
      files.insert(file.get<std::string>());
    }
    for (const auto& f : files) {
      const fs::path shard = fs::path(path) / f;
      if (!fs::exists(shard, ec))
        ZEROTH_THROW(InvalidArgument, "{} names the shard {}, which is not in {}; the folder is incomplete", index.string(), f, path);
      shards.push_back(shard.string());
    }
  } else if (fs::exists(fs::path(path) / kHfSingleName, ec)) {
    shards.push_back((fs::path(path) / kHfSingleName).string());
  } else {
    ZEROTH_THROW(InvalidArgument, "{} holds neither {} nor {}; it is not a Hugging Face model folder", path, kHfSingleName,
                 kHfIndexName);
  }
  for (const auto& s : shards) {
    files_.push_back(read_safetensors(s, false));
    for (const auto& [name, t] : files_.back().tensors) {
      if (!where_.emplace(name, files_.size() - 1).second)
        ZEROTH_THROW(InvalidArgument, "{}: tensor {} is in two shards ({} and {})", path, name, files_[where_[name]].source, s);
    }
  }
  // Held open once every header is read (the destructor closes them; a constructor that throws
  // before here holds none).
  for (const auto& f : files_) {
    const int fd = ::open(f.source.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      const int err = errno;
      for (const int open_fd : fds_) ::close(open_fd);
      ZEROTH_THROW(IoError, "open(\"{}\") for reading: {}", f.source, std::strerror(err));
    }
    fds_.push_back(fd);
  }
}

HfWeights::~HfWeights() {
  for (const int fd : fds_) ::close(fd);
}

std::optional<HfWeights::Found> HfWeights::find(const std::string& name) const {
  std::vector<std::string> tries = {name};
  for (const char* prefix : {"model.", "transformer."}) {
    if (name.starts_with(prefix)) tries.push_back(name.substr(std::string(prefix).size()));
  }
  for (const auto& n : tries) {
    auto it = where_.find(n);
    if (it != where_.end()) {
      const SafeTensors& f = files_[it->second];
      return Found{&f, n, &f.tensors.at(n), fds_[it->second]};
    }
  }
  return std::nullopt;
}

HfModelReader::HfModelReader(const GptConfig& config, const std::string& path)
    : config_(config), specs_(Gpt::block_specs(config)), weights_(path) {
  sources_.resize(specs_.size());
  for (size_t b = 0; b < specs_.size(); ++b) sources_[b].resize(specs_[b].params.size());
  std::set<std::string> used;
  for (const auto& h : Gpt::hf_params(config)) {
    const auto found = weights_.find(h.name);
    const bool bare = h.name.starts_with("model.") || h.name.starts_with("transformer.");
    if (!found) {
      ZEROTH_THROW(InvalidArgument, "{} has no tensor {}{}; it is not a {} in Hugging Face's names{}", path, h.name,
                   bare ? " (nor " + h.name.substr(h.name.find('.') + 1) + ")" : std::string(), config.hf_architecture(),
                   h.name == "lm_head.weight" ? " with an untied head (model.tie_word_embeddings false)" : "");
    }
    const SafeTensor& t = *found->tensor;
    const ParamSpec& p = specs_[h.block].params[h.param];
    std::vector<int64_t> want = p.shape;
    if (h.transposed) std::swap(want[0], want[1]);
    // The embedding may have fewer vocabulary rows than the model (llm.c pads GPT-2's 50257 to
    // 50304), GPT-2's positions more rows than model.seq_len.
    const bool rows = want.size() == 2 && t.shape.size() == 2 && t.shape[1] == want[1] && !h.transposed;
    const bool vocab = p.name == "wte" || h.name.ends_with("embed_tokens.weight") || h.name == "lm_head.weight";
    const bool fits = t.shape == want || (rows && vocab && t.shape[0] <= want[0]) ||
                      (rows && p.name == "wpe" && t.shape[0] >= want[0]);
    if (!fits) {
      ZEROTH_THROW(InvalidArgument, "{}: tensor {} is {} but the model (model.* of the config) needs {}{}", found->file->source,
                   found->name, shape_text(t.shape), shape_text(want),
                   vocab             ? "; the model's vocabulary must be at least the file's"
                   : p.name == "wpe" ? "; the file must hold at least model.seq_len positions"
                                     : "");
    }
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16") {
      ZEROTH_THROW(InvalidArgument, "{}: tensor {} is {}; only F32, BF16 and F16 weights can be read", found->file->source,
                   found->name, t.dtype);
    }
    sources_[h.block][h.param] = {*found, h.transposed};
    used.insert(found->name);
  }
  for (const auto& [name, file] : weights_.stored()) {
    if (used.contains(name) || name.ends_with("rotary_emb.inv_freq") || name.ends_with(".attn.bias") ||
        name.ends_with(".attn.masked_bias"))
      continue;
    ZEROTH_THROW(InvalidArgument, "{}: tensor {} has no place in the model ({}){}", weights_.file(file).source, name,
                 config.describe(),
                 name == "lm_head.weight" ? "; the file's head is untied: set model.tie_word_embeddings false" : "");
  }
}

void HfModelReader::read(int block, size_t param, const ParamSpec& as, size_t lo, size_t hi, float* out) {
  const Source& s = sources_.at(block).at(param);
  const size_t stored = s.found.tensor->numel();
  // Whole-tensor elements [a, a + n) into `to`; past the file's vocabulary rows, zero.
  auto stored_range = [&](size_t a, size_t n, float* to) {
    const size_t e = std::min(a + n, stored);
    if (a < e) read_tensor_f32(*s.found.file, s.found.name, a, e, to, s.found.fd);
    std::fill(to + (a < e ? e - a : 0), to + n, 0.0f);
  };
  if (!s.transposed) {
    // Zeroth's layout is the file's, row for row: read just these elements, or a tensor-parallel
    // slice's runs of them.
    if (!as.tp.split()) {
      stored_range(lo, hi - lo, out);
    } else {
      as.tp.for_each_run(lo, hi, [&](size_t full, size_t count, size_t local) { stored_range(full, count, out + (local - lo)); });
    }
    return;
  }
  // GPT-2's Conv1D weights are stored [in, out]: the tensor is read once and turned, and kept for
  // the next range of the same slice.
  const int rank = as.tp.split() ? as.tp.rank : -1;
  if (cached_block_ != block || cached_param_ != param || cached_rank_ != rank) {
    const ParamSpec& whole = specs_[block].params[param];
    std::vector<float> values(whole.numel(), 0.0f);
    stored_range(0, values.size(), values.data());
    std::vector<float> turned(values.size());
    transpose(values.data(), static_cast<size_t>(whole.shape[1]), static_cast<size_t>(whole.shape[0]), turned.data());
    if (as.tp.split()) {
      cached_.resize(as.numel());
      as.tp.take(turned.data(), cached_.data(), as.numel());
    } else {
      cached_ = std::move(turned);
    }
    cached_block_ = block, cached_param_ = param, cached_rank_ = rank;
  }
  std::copy(cached_.begin() + static_cast<std::ptrdiff_t>(lo), cached_.begin() + static_cast<std::ptrdiff_t>(hi), out);
}

void HfModelReader::read_block(int block, const BlockSpec& as, const std::vector<size_t>& offsets, size_t lo, size_t hi, float* out) {
  std::fill(out, out + (hi - lo), 0.0f);
  // An expert-parallel rank's experts are a run of the model's block, from its first one's place.
  const auto& whole = specs_.at(block).params;
  size_t first = 0;
  while (!as.params.empty() && first < whole.size() && whole[first].name != as.params[0].name) ++first;
  ZEROTH_CHECK(as.params.empty() || first + as.params.size() <= whole.size(), "block {}: parameter {} is not the model's",
               specs_.at(block).name, as.params[0].name);
  for (size_t i = 0; i < as.params.size(); ++i) {
    const size_t p0 = offsets[i], a = std::max(p0, lo), e = std::min(p0 + as.params[i].numel(), hi);
    if (a < e) read(block, first + i, as.params[i], a - p0, e - p0, out + (a - lo));
  }
}

HfWriter::HfWriter(const GptConfig& config, const std::string& path, DType dtype, uint64_t shard_bytes)
    : config_(config),
      path_(path),
      folder_(!path.ends_with(".safetensors")),
      specs_(Gpt::block_specs(config)),
      hf_(Gpt::hf_params(config)),
      dtype_(dtype) {
  const char* type = safetensors_dtype(dtype);
  if (shard_bytes == 0) ZEROTH_THROW(InvalidArgument, "the largest shard must be a positive size");
  auto bytes_of = [&](const Gpt::HfParam& h) { return specs_[h.block].params[h.param].numel() * dtype_size(dtype); };
  // Shards filled in the state dict's order, as save_pretrained fills them: a tensor that would
  // overflow the shard starts the next; one larger than a shard gets its own.
  std::vector<size_t> order(hf_.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) {
    if (hf_[a].block != hf_[b].block) return hf_[a].block < hf_[b].block;
    return state_dict_rank(hf_[a].name) < state_dict_rank(hf_[b].name);
  });
  // The untied head comes after the final norm in the state dict; the block order has it there.
  shard_of_.assign(hf_.size(), 0);
  std::vector<std::vector<size_t>> groups(1);
  uint64_t filled = 0;
  for (size_t i : order) {
    const uint64_t n = bytes_of(hf_[i]);
    if (folder_ && !groups.back().empty() && filled + n > shard_bytes) {
      groups.emplace_back();
      filled = 0;
    }
    groups.back().push_back(i);
    filled += n;
  }
  if (folder_) {
    // A model no Hugging Face class holds is refused before any file is written, not at the
    // config.json that comes last.
    (void)hf_config_to_json(config_, dtype_);
    std::error_code ec;
    fs::create_directories(path, ec);
    if (ec) ZEROTH_THROW(IoError, "create_directories(\"{}\"): {}", path, ec.message());
    // An earlier export's files go first: a reader must never find an old index, config or shard
    // beside new ones (the index and config.json are written last, when every shard is whole).
    for (const auto& e : fs::directory_iterator(path, ec)) {
      const std::string name = e.path().filename().string();
      const bool shard = name.starts_with("model-") && name.ends_with(".safetensors") && name.find("-of-") != std::string::npos;
      if (shard || name == kHfIndexName || name == kHfSingleName || name == "config.json") fs::remove(e.path(), ec);
    }
  }
  for (size_t s = 0; s < groups.size(); ++s) {
    Shard shard;
    shard.file = !folder_ ? path
                 : groups.size() == 1
                     ? (fs::path(path) / kHfSingleName).string()
                     : (fs::path(path) / fmt::format("model-{:05d}-of-{:05d}.safetensors", s + 1, groups.size())).string();
    for (size_t i : groups[s]) {
      std::vector<int64_t> shape = specs_[hf_[i].block].params[hf_[i].param].shape;
      if (hf_[i].transposed) std::swap(shape[0], shape[1]);
      shard.entries.push_back({hf_[i].name, type, shape});
      shard_of_[i] = s;
    }
    shards_.push_back(std::move(shard));
  }
}

void HfWriter::write(const float* v) {
  ZEROTH_CHECK(!done(), "HfWriter: every tensor is written already");
  const auto& h = hf_[next_];
  const auto& p = specs_[h.block].params[h.param];
  if (h.transposed) {
    turned_.resize(p.numel());
    transpose(v, static_cast<size_t>(p.shape[0]), static_cast<size_t>(p.shape[1]), turned_.data());
    v = turned_.data();
  }
  const size_t n = p.numel() * dtype_size(dtype_);
  if (dtype_ != DType::f32) {
    narrow_.resize(n);
    cpu::cast(v, DType::f32, narrow_.data(), dtype_, p.numel());
  }
  Shard& shard = shards_[shard_of_[next_]];
  if (!shard.out)
    shard.out = std::make_unique<SafeTensorsWriter>(shard.file, shard.entries, std::map<std::string, std::string>{{"format", "pt"}});
  shard.out->write(h.name, dtype_ == DType::f32 ? static_cast<const void*>(v) : narrow_.data(), n);
  if (++shard.written == shard.entries.size()) shard.out->finish();
  bytes_ += n;
  ++next_;
}

uint64_t HfWriter::finish() {
  ZEROTH_CHECK(done(), "HfWriter::finish after {} of {} tensors", next_, hf_.size());
  if (!folder_) return bytes_;
  // The index (when sharded) and config.json last: a folder that has them has every shard.
  const fs::path dir(path_);
  std::error_code ec;
  if (shards_.size() > 1) {
    json index = {{"metadata", {{"total_size", bytes_}}}, {"weight_map", json::object()}};
    for (const auto& s : shards_)
      for (const auto& e : s.entries) index["weight_map"][e.name] = fs::path(s.file).filename().string();
    write_text_file((dir / kHfIndexName).string(), index.dump(2) + "\n");
    fs::remove(dir / kHfSingleName, ec);  // a reader would take a stale single file first
  } else {
    fs::remove(dir / kHfIndexName, ec);
  }
  write_text_file((dir / "config.json").string(), hf_config_to_json(config_, dtype_).dump(2) + "\n");
  return bytes_;
}

}  // namespace zeroth
