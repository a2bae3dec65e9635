// The safetensors file format (an 8-byte little-endian header length, a JSON header naming each
// tensor's dtype, shape and byte range, then the raw data): PyTorch and Hugging Face exchange
// weights this way, and zeroth reads reference files and writes exported weights with it.
#pragma once

#include <cstdint>  // int64_t
#include <map>      // std::map
#include <string>   // std::string
#include <vector>   // std::vector

#include "core/dtype.h"  // DType

namespace zeroth {

struct SafeTensor {
  std::string dtype;  // "F32", "BF16", "F16", "I32", ...
  std::vector<int64_t> shape;
  std::vector<char> data;
  uint64_t file_offset = 0;  // where the data starts in the file
  size_t numel() const;
  // The values as f32 (F32, BF16, F16) or int32 (I32); InvalidArgument for other dtypes.
  std::vector<float> as_f32() const;
  std::vector<int32_t> as_i32() const;
};

struct SafeTensors {
  std::map<std::string, SafeTensor> tensors;
  std::map<std::string, std::string> metadata;
  // InvalidArgument naming the missing tensor and the file.
  const SafeTensor& at(const std::string& name) const;
  std::string source;  // the path it was read from
};

// IoError when the file cannot be read; InvalidArgument (with the path) when it is not valid.
// Without `with_data`, only the header: each tensor's data stays in the file (read_tensor_data).
SafeTensors read_safetensors(const std::string& path, bool with_data = true);
// One tensor's bytes of a file read without its data, so a large file is read tensor by tensor.
std::vector<char> read_tensor_data(const SafeTensors& file, const std::string& name);
// Elements [lo, hi) of a tensor of such a file (F32, BF16 or F16) as f32 into `out`: only their
// bytes are read, through `fd` when the caller holds the file open (else it is opened for the
// call). InvalidArgument for another dtype or a range past the tensor.
void read_tensor_f32(const SafeTensors& file, const std::string& name, size_t lo, size_t hi, float* out, int fd = -1);
// Written to `path`.tmp and renamed, so a crash never leaves a half-written file under `path`.
void write_safetensors(const std::string& path, const SafeTensors& file);

// A safetensors file written tensor by tensor, so the whole of it never sits in memory: the
// header (every tensor's name, dtype and shape, declared up front) first, then each tensor's
// bytes, in any order; into `path`.tmp, flushed to the disk (fsync), renamed and the folder
// flushed by finish(). Laid out as the safetensors library lays a file out (data ordered by
// dtype, then name; the header in that order), so the same tensors make the same bytes.
// Destroyed before finish(), it removes the .tmp and leaves `path` as it was.
class SafeTensorsWriter {
 public:
  struct Entry {
    std::string name, dtype;
    std::vector<int64_t> shape;
  };
  SafeTensorsWriter(std::string path, std::vector<Entry> entries, const std::map<std::string, std::string>& metadata = {});
  ~SafeTensorsWriter();
  SafeTensorsWriter(const SafeTensorsWriter&) = delete;
  SafeTensorsWriter& operator=(const SafeTensorsWriter&) = delete;

  // A declared tensor's bytes, once; InvalidArgument when `name` is not declared, is written
  // already, or the size is not its own. IoError naming the file when the write fails.
  void write(const std::string& name, const void* data, size_t bytes);
  bool done() const { return count_ == entries_.size(); }
  void finish();

 private:
  void write_at(const void* data, size_t bytes, uint64_t at);

  std::string path_, tmp_;
  std::vector<Entry> entries_;  // in data order
  std::map<std::string, size_t> index_;
  std::vector<uint64_t> offsets_;
  std::vector<bool> written_;
  size_t count_ = 0;
  uint64_t data_start_ = 0;
  int fd_ = -1;
};

}  // namespace zeroth
