// A safetensors file as zeroth reads weights: the whole file, then header only with each
// tensor's bytes read on their own and as f32. A zeroth::Error naming the file is the one
// acceptable failure.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/error_types.h"  // zeroth::Error
#include "core/safetensors.h"
#include "tests/fuzz/fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return zeroth::fuzz::on_file(data, size, [](const std::string& path) {
    // Whole, then header only; a failure of the first still lets the second run.
    try {
      const auto whole = zeroth::read_safetensors(path, true);
      for (const auto& [name, tensor] : whole.tensors) {
        if (tensor.dtype == "F32" || tensor.dtype == "BF16" || tensor.dtype == "F16") (void)tensor.as_f32();
      }
    } catch (const zeroth::Error&) {
    }
    const auto header = zeroth::read_safetensors(path, false);
    for (const auto& [name, tensor] : header.tensors) {
      (void)zeroth::read_tensor_data(header, name);
      const size_t n = tensor.numel();
      if (n > 0 && n < (1u << 20)) {
        std::vector<float> values(n);
        zeroth::read_tensor_f32(header, name, 0, n, values.data());
      }
    }
  });
}
