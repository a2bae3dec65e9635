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
// Written to `path`.tmp and renamed, so a crash never leaves a half-written file under `path`.
void write_safetensors(const std::string& path, const SafeTensors& file);

// A safetensors file written tensor by tensor, so the whole of it never sits in memory: the
// header (every tensor's name, dtype and shape, declared up front) first, then each tensor's
// bytes in the declared order; into `path`.tmp, flushed to the disk (fsync), renamed and the
// folder flushed by finish(). Destroyed before finish(), it removes the .tmp and leaves `path`
// as it was.
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

  // The next declared tensor's bytes; InvalidArgument when `name` or the size is not the next
  // entry's. IoError naming the file when the write fails.
  void write(const std::string& name, const void* data, size_t bytes);
  void finish();

 private:
  void write_all(const void* data, size_t bytes);

  std::string path_, tmp_;
  std::vector<Entry> entries_;
  size_t next_ = 0;
  int fd_ = -1;
};

}  // namespace zeroth
