// Reading and writing safetensors files.
#include "core/safetensors.h"

#include <fcntl.h>   // open
#include <unistd.h>  // pread, pwrite, fsync, close, unlink

#include <algorithm>   // std::stable_sort, std::find
#include <cerrno>      // errno
#include <cstdio>      // std::rename
#include <cstring>     // std::strerror, std::memcpy
#include <filesystem>  // std::filesystem::path
#include <fstream>     // std::ifstream
#include <iterator>    // std::size

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/cpu/kernels.h"  // cpu::cast
#include "core/error.h"        // ZEROTH_THROW
#include "core/json_int.h"     // json_ints

namespace zeroth {
namespace {

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16") return 2;
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  return 0;
}

size_t entry_bytes(const std::vector<int64_t>& shape, const std::string& dtype) {
  size_t n = dtype_bytes(dtype);
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

}  // namespace

size_t SafeTensor::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::vector<float> SafeTensor::as_f32() const {
  std::vector<float> out(numel());
  if (out.empty()) return out;  // memcpy takes no null pointer, even for no bytes
  if (dtype == "F32") {
    std::memcpy(out.data(), data.data(), out.size() * 4);
  } else if (dtype == "BF16" || dtype == "F16") {
    cpu::cast(data.data(), dtype == "BF16" ? DType::bf16 : DType::f16, out.data(), DType::f32, out.size());
  } else {
    ZEROTH_THROW(InvalidArgument, "tensor of dtype {} cannot be read as f32", dtype);
  }
  return out;
}

std::vector<int32_t> SafeTensor::as_i32() const {
  if (dtype != "I32") ZEROTH_THROW(InvalidArgument, "tensor of dtype {} cannot be read as int32", dtype);
  std::vector<int32_t> out(numel());
  std::memcpy(out.data(), data.data(), out.size() * 4);
  return out;
}

const SafeTensor& SafeTensors::at(const std::string& name) const {
  auto it = tensors.find(name);
  if (it == tensors.end()) ZEROTH_THROW(InvalidArgument, "{} has no tensor named {}", source, name);
  return it->second;
}

SafeTensors read_safetensors(const std::string& path, bool with_data) {
  std::ifstream in(path, std::ios::binary);
  if (!in) ZEROTH_THROW(IoError, "open(\"{}\") for reading: {}", path, std::strerror(errno));
  in.seekg(0, std::ios::end);
  const auto size = static_cast<uint64_t>(in.tellg());
  in.seekg(0);
  uint64_t header_len = 0;
  if (size < 8 || !in.read(reinterpret_cast<char*>(&header_len), 8) || header_len > size - 8) {
    ZEROTH_THROW(InvalidArgument, "{} is not a safetensors file: its header length does not fit the file ({} bytes)", path, size);
  }
  std::string text(header_len, '\0');
  in.read(text.data(), static_cast<std::streamsize>(header_len));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    ZEROTH_THROW(InvalidArgument, "{}: the safetensors header is not valid JSON: {}", path, e.what());
  }
  const uint64_t data_start = 8 + header_len, data_size = size - data_start;
  SafeTensors out;
  out.source = path;
  for (const auto& [name, v] : header.items()) {
    if (name == "__metadata__") {
      for (const auto& [k, m] : v.items()) out.metadata[k] = m.is_string() ? m.get<std::string>() : m.dump();
      continue;
    }
    SafeTensor t;
    try {
      t.dtype = v.at("dtype").get<std::string>();
      t.shape = json_ints<int64_t>(v.at("shape"));
      // Sizes a reader can multiply: no dimension below 0, no element count past 64 bits.
      uint64_t count = 1;
      for (int64_t d : t.shape) {
        if (d < 0 || __builtin_mul_overflow(count, static_cast<uint64_t>(d), &count))
          ZEROTH_THROW(InvalidArgument, "{}: tensor {} has the shape {}, which no tensor has", path, name, v.at("shape").dump());
      }
      const auto range = json_ints<uint64_t>(v.at("data_offsets"));
      if (range.size() != 2 || range[0] > range[1] || range[1] > data_size) {
        ZEROTH_THROW(InvalidArgument, "{}: tensor {} has data_offsets outside the file's {} data bytes", path, name, data_size);
      }
      uint64_t bytes = 0;
      if (dtype_bytes(t.dtype) == 0 || __builtin_mul_overflow(count, dtype_bytes(t.dtype), &bytes) || range[1] - range[0] != bytes) {
        ZEROTH_THROW(InvalidArgument, "{}: tensor {} ({} {}) has {} bytes, which its dtype and shape do not explain", path, name,
                     t.dtype, nlohmann::json(t.shape).dump(), range[1] - range[0]);
      }
      t.file_offset = data_start + range[0];
      if (with_data) {
        t.data.resize(range[1] - range[0]);
        in.seekg(static_cast<std::streamoff>(t.file_offset));
        if (!in.read(t.data.data(), static_cast<std::streamsize>(t.data.size()))) {
          ZEROTH_THROW(IoError, "{}: reading tensor {} failed", path, name);
        }
      }
    } catch (const nlohmann::json::exception& e) {
      ZEROTH_THROW(InvalidArgument, "{}: tensor {} has a malformed header entry: {}", path, name, e.what());
    }
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

std::vector<char> read_tensor_data(const SafeTensors& file, const std::string& name) {
  const SafeTensor& t = file.at(name);
  std::vector<char> data(t.numel() * dtype_bytes(t.dtype));
  std::ifstream in(file.source, std::ios::binary);
  in.seekg(static_cast<std::streamoff>(t.file_offset));
  if (!in || !in.read(data.data(), static_cast<std::streamsize>(data.size())))
    ZEROTH_THROW(IoError, "{}: reading tensor {} ({} bytes at {}) failed: {}", file.source, name, data.size(), t.file_offset,
                 std::strerror(errno));
  return data;
}

void read_tensor_f32(const SafeTensors& file, const std::string& name, size_t lo, size_t hi, float* out, int held) {
  const SafeTensor& t = file.at(name);
  const DType type = t.dtype == "F32" ? DType::f32 : t.dtype == "BF16" ? DType::bf16 : t.dtype == "F16" ? DType::f16 : DType::f32;
  if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
    ZEROTH_THROW(InvalidArgument, "{}: tensor {} is {}; only F32, BF16 and F16 values can be read as f32", file.source, name, t.dtype);
  if (lo > hi || hi > t.numel())
    ZEROTH_THROW(InvalidArgument, "{}: elements [{}, {}) of tensor {}, which has {}", file.source, lo, hi, name, t.numel());
  const size_t width = dtype_size(type), bytes = (hi - lo) * width;
  // f32 lands in place; 16-bit values are widened from a staging copy (the cast is parallel, so
  // it cannot widen in place).
  std::vector<char> narrow(type == DType::f32 ? 0 : bytes);
  char* into = type == DType::f32 ? reinterpret_cast<char*>(out) : narrow.data();
  const int fd = held >= 0 ? held : ::open(file.source.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) ZEROTH_THROW(IoError, "open(\"{}\") for reading: {}", file.source, std::strerror(errno));
  size_t done = 0;
  while (done < bytes) {
    const ssize_t n = ::pread(fd, into + done, bytes - done, static_cast<off_t>(t.file_offset + lo * width + done));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      if (held < 0) ::close(fd);
      ZEROTH_THROW(IoError, "{}: pread of tensor {} ({} bytes at {}): {}", file.source, name, bytes - done,
                   t.file_offset + lo * width + done, n < 0 ? std::strerror(err) : "the file ends early");
    }
    done += static_cast<size_t>(n);
  }
  if (held < 0) ::close(fd);
  if (type != DType::f32) cpu::cast(into, type, out, DType::f32, hi - lo);
}

void write_safetensors(const std::string& path, const SafeTensors& file) {
  std::vector<SafeTensorsWriter::Entry> entries;
  for (const auto& [name, t] : file.tensors) entries.push_back({name, t.dtype, t.shape});
  SafeTensorsWriter out(path, std::move(entries), file.metadata);
  for (const auto& [name, t] : file.tensors) out.write(name, t.data.data(), t.data.size());
  out.finish();
}

namespace {

// The order of the safetensors library's Dtype enum: a file's data is laid out by dtype, the
// last of this list first, then by name.
int dtype_rank(const std::string& dtype) {
  static const char* const kOrder[] = {"BOOL", "U8",  "I8",  "F8_E5M2", "F8_E4M3", "I16", "U16", "F16",
                                       "BF16", "I32", "U32", "F32",     "F64",     "I64", "U64"};
  for (int i = 0; i < static_cast<int>(std::size(kOrder)); ++i) {
    if (dtype == kOrder[i]) return i;
  }
  return -1;
}

}  // namespace

SafeTensorsWriter::SafeTensorsWriter(std::string path, std::vector<Entry> entries, const std::map<std::string, std::string>& metadata)
    : path_(std::move(path)), tmp_(path_ + ".tmp"), entries_(std::move(entries)) {
  std::stable_sort(entries_.begin(), entries_.end(), [](const Entry& a, const Entry& b) {
    const int ra = dtype_rank(a.dtype), rb = dtype_rank(b.dtype);
    return ra != rb ? ra > rb : a.name < b.name;
  });
  // As the safetensors library writes it: the metadata, then each tensor in data order, its keys
  // dtype, shape, data_offsets; padded with spaces so the data starts 8-byte aligned.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) header["__metadata__"] = metadata;
  uint64_t offset = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    const size_t bytes = entry_bytes(e.shape, e.dtype);
    if (dtype_bytes(e.dtype) == 0)
      ZEROTH_THROW(InvalidArgument, "{}: tensor {} has dtype {}, not a safetensors dtype", path_, e.name, e.dtype);
    if (e.name == "__metadata__" || index_.contains(e.name))
      ZEROTH_THROW(InvalidArgument, "{}: tensor {} is declared twice (or under the metadata's name)", path_, e.name);
    index_[e.name] = i;
    offsets_.push_back(offset);
    header[e.name] = {{"dtype", e.dtype}, {"shape", e.shape}, {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  written_.assign(entries_.size(), false);
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) ZEROTH_THROW(IoError, "open(\"{}\") for writing: {}", tmp_, std::strerror(errno));
  const uint64_t len = text.size();
  std::string head(reinterpret_cast<const char*>(&len), 8);
  head += text;
  data_start_ = head.size();
  write_at(head.data(), head.size(), 0);
}

SafeTensorsWriter::~SafeTensorsWriter() {
  if (fd_ < 0) return;
  ::close(fd_);
  ::unlink(tmp_.c_str());
}

void SafeTensorsWriter::write_at(const void* data, size_t bytes, uint64_t at) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    const ssize_t n = ::pwrite(fd_, p, bytes, static_cast<off_t>(at));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0)
      ZEROTH_THROW(IoError, "pwrite({}, {} bytes at {}): {}", tmp_, bytes, at, n < 0 ? std::strerror(errno) : "nothing written");
    p += n;
    at += static_cast<uint64_t>(n);
    bytes -= static_cast<size_t>(n);
  }
}

void SafeTensorsWriter::write(const std::string& name, const void* data, size_t bytes) {
  const auto it = index_.find(name);
  if (it == index_.end()) ZEROTH_THROW(InvalidArgument, "{}: tensor {} was not declared", path_, name);
  if (written_[it->second]) ZEROTH_THROW(InvalidArgument, "{}: tensor {} is written already", path_, name);
  const Entry& e = entries_[it->second];
  const size_t n = entry_bytes(e.shape, e.dtype);
  if (bytes != n) ZEROTH_THROW(InvalidArgument, "{}: tensor {} is declared as {} bytes, {} given", path_, name, n, bytes);
  write_at(data, bytes, data_start_ + offsets_[it->second]);
  written_[it->second] = true;
  ++count_;
}

void SafeTensorsWriter::finish() {
  if (count_ != entries_.size()) {
    const size_t missing = static_cast<size_t>(std::find(written_.begin(), written_.end(), false) - written_.begin());
    ZEROTH_THROW(InvalidArgument, "{}: finished after {} of {} tensors ({} not written)", path_, count_, entries_.size(),
                 entries_[missing].name);
  }
  if (::fsync(fd_) != 0) ZEROTH_THROW(IoError, "fsync({}): {}", tmp_, std::strerror(errno));
  if (::close(fd_) != 0) {
    fd_ = -1;
    ::unlink(tmp_.c_str());
    ZEROTH_THROW(IoError, "close({}): {}", tmp_, std::strerror(errno));
  }
  fd_ = -1;
  if (std::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    ZEROTH_THROW(IoError, "rename(\"{}\", \"{}\"): {}", tmp_, path_, std::strerror(err));
  }
  // The rename itself lasts only once the folder's entry is on the disk too.
  const std::string folder = std::filesystem::path(path_).parent_path().string();
  const int dir = ::open(folder.empty() ? "." : folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dir < 0) ZEROTH_THROW(IoError, "open(\"{}\", O_DIRECTORY) to fsync the rename of {}: {}", folder, path_, std::strerror(errno));
  const int rc = ::fsync(dir);
  const int err = errno;
  ::close(dir);
  if (rc != 0) ZEROTH_THROW(IoError, "fsync of the folder \"{}\" after renaming {}: {}", folder, path_, std::strerror(err));
}

}  // namespace zeroth
