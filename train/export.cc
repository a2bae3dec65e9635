// The consolidated weights: gathered per block, transposed where Hugging Face's Conv1D wants it,
// streamed into one safetensors file.
#include "train/export.h"

#include <algorithm>  // std::min
#include <exception>  // std::exception_ptr
#include <optional>   // std::optional
#include <vector>     // std::vector

#include "core/cpu/kernels.h"  // cpu::cast
#include "core/error.h"        // ZEROTH_CHECK
#include "core/safetensors.h"  // SafeTensorsWriter

namespace zeroth {
namespace {

const char* safetensors_dtype(DType dtype) {
  switch (dtype) {
    case DType::f32: return "F32";
    case DType::bf16: return "BF16";
    case DType::f16: return "F16";
  }
  ZEROTH_THROW(InvalidArgument, "weights cannot be saved as {}", dtype_name(dtype));
}

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

}  // namespace

uint64_t save_gpt_weights(Engine& engine, const GptConfig& config, const std::string& path, DType dtype) {
  const auto specs = Gpt::block_specs(config);
  const auto hf = Gpt::hf_params(config);
  const bool lead = engine.comm().rank() == 0;
  std::optional<SafeTensorsWriter> out;
  std::exception_ptr failed;
  uint64_t bytes = 0;
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
  on_lead([&] {
    std::vector<SafeTensorsWriter::Entry> entries;
    for (const auto& h : hf) {
      std::vector<int64_t> shape = specs[h.block].params[h.param].shape;
      if (h.transposed) std::swap(shape[0], shape[1]);
      entries.push_back({h.name, safetensors_dtype(dtype), shape});
    }
    out.emplace(path, std::move(entries), std::map<std::string, std::string>{{"format", "pt"}});
  });
  size_t next = 0;
  std::vector<float> turned;
  std::vector<char> narrow;
  for (size_t b = 0; b < specs.size(); ++b) {
    const std::vector<float> values = engine.master_values(static_cast<int>(b));
    on_lead([&] {
      const auto& offsets = engine.plan().blocks[b].param_offsets;
      for (; next < hf.size() && hf[next].block == static_cast<int>(b); ++next) {
        const auto& p = specs[b].params[hf[next].param];
        const float* v = values.data() + offsets[hf[next].param];
        if (hf[next].transposed) {
          turned.resize(p.numel());
          transpose(v, static_cast<size_t>(p.shape[0]), static_cast<size_t>(p.shape[1]), turned.data());
          v = turned.data();
        }
        const size_t n = p.numel() * dtype_size(dtype);
        if (dtype != DType::f32) {
          narrow.resize(n);
          cpu::cast(v, DType::f32, narrow.data(), dtype, p.numel());
        }
        out->write(hf[next].name, dtype == DType::f32 ? static_cast<const void*>(v) : narrow.data(), n);
        bytes += n;
      }
    });
  }
  on_lead([&] { out->finish(); });
  if (failed) std::rethrow_exception(failed);
  return bytes;
}

}  // namespace zeroth
