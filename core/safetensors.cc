// Reading and writing safetensors files.
#include "core/safetensors.h"

#include <cerrno>   // errno
#include <cstdio>   // std::rename
#include <cstring>  // std::strerror, std::memcpy
#include <fstream>  // std::ifstream, std::ofstream

#include <nlohmann/json.hpp>  // nlohmann::json

#include "core/cpu/kernels.h"  // cpu::cast
#include "core/error.h"        // ZEROTH_THROW

namespace zeroth {
namespace {

size_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F32" || dtype == "I32") return 4;
  if (dtype == "BF16" || dtype == "F16" || dtype == "I16") return 2;
  if (dtype == "F64" || dtype == "I64") return 8;
  if (dtype == "U8" || dtype == "I8" || dtype == "BOOL") return 1;
  return 0;
}

}  // namespace

size_t SafeTensor::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= static_cast<size_t>(d);
  return n;
}

std::vector<float> SafeTensor::as_f32() const {
  std::vector<float> out(numel());
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

SafeTensors read_safetensors(const std::string& path) {
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
      t.shape = v.at("shape").get<std::vector<int64_t>>();
      const auto range = v.at("data_offsets").get<std::vector<uint64_t>>();
      if (range.size() != 2 || range[0] > range[1] || range[1] > data_size) {
        ZEROTH_THROW(InvalidArgument, "{}: tensor {} has data_offsets outside the file's {} data bytes", path, name, data_size);
      }
      if (dtype_bytes(t.dtype) == 0 || range[1] - range[0] != t.numel() * dtype_bytes(t.dtype)) {
        ZEROTH_THROW(InvalidArgument, "{}: tensor {} ({} {}) has {} bytes, which its dtype and shape do not explain", path, name,
                     t.dtype, nlohmann::json(t.shape).dump(), range[1] - range[0]);
      }
      t.data.resize(range[1] - range[0]);
      in.seekg(static_cast<std::streamoff>(data_start + range[0]));
      if (!in.read(t.data.data(), static_cast<std::streamsize>(t.data.size()))) {
        ZEROTH_THROW(IoError, "{}: reading tensor {} failed", path, name);
      }
    } catch (const nlohmann::json::exception& e) {
      ZEROTH_THROW(InvalidArgument, "{}: tensor {} has a malformed header entry: {}", path, name, e.what());
    }
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

void write_safetensors(const std::string& path, const SafeTensors& file) {
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
  uint64_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) ZEROTH_THROW(IoError, "open(\"{}\") for writing: {}", tmp, std::strerror(errno));
    const uint64_t len = text.size();
    out.write(reinterpret_cast<const char*>(&len), 8);
    out.write(text.data(), static_cast<std::streamsize>(text.size()));
    for (const auto& [name, t] : file.tensors) out.write(t.data.data(), static_cast<std::streamsize>(t.data.size()));
    out.flush();
    if (!out) ZEROTH_THROW(IoError, "writing {} failed (disk full?)", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) {
    ZEROTH_THROW(IoError, "rename(\"{}\", \"{}\"): {}", tmp, path, std::strerror(errno));
  }
}

}  // namespace zeroth
