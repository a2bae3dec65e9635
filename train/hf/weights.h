// A model's weights as Hugging Face keeps them: one .safetensors file, or a folder with
// model.safetensors, or with model.safetensors.index.json and the shards it names (plus the
// config.json that describes the model). What run.init_from and `zeroth ckpt import` read, and
// what `zeroth ckpt export` and a run's end write; read and written a tensor at a time, never
// the whole model at once.
#pragma once

#include <cstdint>   // uint64_t
#include <map>       // std::map
#include <memory>    // std::unique_ptr
#include <optional>  // std::optional
#include <string>    // std::string
#include <vector>    // std::vector

#include "core/dtype.h"          // DType
#include "core/safetensors.h"    // SafeTensors, SafeTensorsWriter
#include "models/block_api.h"    // BlockSpec, ParamSpec
#include "models/decoder/gpt.h"  // GptConfig

namespace zeroth {

inline constexpr const char* kHfIndexName = "model.safetensors.index.json";
inline constexpr const char* kHfSingleName = "model.safetensors";
inline constexpr uint64_t kHfDefaultShardBytes = 5'000'000'000;  // Hugging Face's "5GB"

// The safetensors name of a dtype weights are saved in ("F32", "BF16", "F16"; InvalidArgument else).
const char* safetensors_dtype(DType dtype);

// Whether `path` is Hugging Face weights: a .safetensors file, or a folder with either name above.
bool is_hf_weights(const std::string& path);

// A folder's config.json (when it has one) against the model the weights are read into: every
// setting that changes what the weights compute (architecture, shape, norms' epsilon, rotary base
// and scaling, biases, q/k norms, tied head) must agree; ConfigError naming each that does not,
// both values. The model's vocabulary may be larger than the file's (padding rows).
void check_hf_config(const GptConfig& model, const std::string& path);

// The tensors of such a file or folder: every header read (InvalidArgument naming the file when
// one is not valid, or when the index names a shard that is missing), no data.
class HfWeights {
 public:
  explicit HfWeights(const std::string& path);
  ~HfWeights();
  HfWeights(const HfWeights&) = delete;
  HfWeights& operator=(const HfWeights&) = delete;
  struct Found {
    const SafeTensors* file = nullptr;
    std::string name;  // as stored
    const SafeTensor* tensor = nullptr;
    int fd = -1;  // the file, held open while the HfWeights lives
  };
  // The tensor Hugging Face's *ForCausalLM names `name`, stored under that name or without its
  // "model." / "transformer." prefix (the bare LlamaModel's and GPT2Model's names).
  std::optional<Found> find(const std::string& name) const;
  const std::string& path() const { return path_; }
  size_t files() const { return files_.size(); }
  // Every stored tensor's name, with the file that holds it.
  const std::map<std::string, size_t>& stored() const { return where_; }
  const SafeTensors& file(size_t i) const { return files_.at(i); }

 private:
  std::string path_;
  std::vector<SafeTensors> files_;
  std::vector<int> fds_;                 // each file open for reading, so a slice's many ranges open nothing
  std::map<std::string, size_t> where_;  // stored name -> its file
};

// A GptConfig's parameters from Hugging Face weights, as element ranges in zeroth's layout and
// f32. Every tensor is found and its shape checked against the model at construction (from the
// headers); InvalidArgument naming the tensor, the file and both shapes when one does not fit.
// Position rows past model.seq_len are not read; vocabulary rows the file lacks read as zero. A
// stored tensor the model has no place for (an untied head for a tied model) is an error too;
// Hugging Face's non-persistent buffers (rotary inv_freq, GPT-2's attention masks) are skipped.
class HfModelReader {
 public:
  HfModelReader(const GptConfig& config, const std::string& path);
  // Elements [lo, hi) of parameter `param` of block `block` (Gpt::block_specs(config)) as `as`
  // holds it: the whole tensor, or a tensor-parallel rank's slice (as.tp). Only the range's bytes
  // are read (a slice's runs of the whole tensor); GPT-2's transposed Conv1D weights are read
  // whole once and kept until another tensor or slice is asked for.
  void read(int block, size_t param, const ParamSpec& as, size_t lo, size_t hi, float* out);
  // Padded elements [lo, hi) of a block as `as` lays it out (`offsets`: each parameter's start),
  // the padding zero: what Engine::set_block_values asks for.
  void read_block(int block, const BlockSpec& as, const std::vector<size_t>& offsets, size_t lo, size_t hi, float* out);
  const HfWeights& weights() const { return weights_; }

 private:
  struct Source {
    HfWeights::Found found;
    bool transposed = false;
  };
  GptConfig config_;
  std::vector<BlockSpec> specs_;
  HfWeights weights_;
  std::vector<std::vector<Source>> sources_;  // [block][param]
  int cached_block_ = -1, cached_rank_ = -2;
  size_t cached_param_ = 0;
  std::vector<float> cached_;
};

// The model's tensors into Hugging Face's layout, one at a time in Gpt::hf_params order (the
// caller asks which comes next and hands its f32 values in zeroth's layout), cast to `dtype`.
// Into one file when `path` ends in .safetensors; otherwise into the folder `path`: config.json,
// and model.safetensors or shards of at most `shard_bytes` each (a larger tensor alone) named
// model-0000k-of-0000n.safetensors with model.safetensors.index.json, as Hugging Face's
// save_pretrained lays them out. Each file is written to .tmp and renamed when whole; an earlier
// export's files in the folder are removed first, the index and config.json written last.
class HfWriter {
 public:
  HfWriter(const GptConfig& config, const std::string& path, DType dtype, uint64_t shard_bytes = kHfDefaultShardBytes);
  bool done() const { return next_ == hf_.size(); }
  int block() const { return hf_.at(next_).block; }
  size_t param() const { return hf_.at(next_).param; }
  void write(const float* values);
  uint64_t finish();  // the bytes of tensor data written
  size_t shards() const { return shards_.size(); }

 private:
  struct Shard {
    std::string file;
    std::vector<SafeTensorsWriter::Entry> entries;
    size_t written = 0;
    std::unique_ptr<SafeTensorsWriter> out;  // open from its first tensor to its last
  };
  GptConfig config_;
  std::string path_;
  bool folder_;
  std::vector<BlockSpec> specs_;
  std::vector<Gpt::HfParam> hf_;
  std::vector<size_t> shard_of_;  // per hf_ entry
  std::vector<Shard> shards_;
  DType dtype_;
  size_t next_ = 0;
  uint64_t bytes_ = 0;
  std::vector<float> turned_;
  std::vector<char> narrow_;
};

}  // namespace zeroth
