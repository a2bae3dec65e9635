// The consolidated weights: gathered per block, transposed where Hugging Face's Conv1D wants it,
// streamed into one safetensors file.
#include "train/export.h"

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
  for (size_t b = 0; b < specs.size(); ++b) {
    const std::vector<float> values = engine.master_values(static_cast<int>(b));
    on_lead([&] {
      const auto& offsets = engine.plan().blocks[b].param_offsets;
      for (; next < hf.size() && hf[next].block == static_cast<int>(b); ++next) {
        const auto& p = specs[b].params[hf[next].param];
        const float* v = values.data() + offsets[hf[next].param];
        std::vector<float> t(v, v + p.numel());
        if (hf[next].transposed) {
          const size_t rows = static_cast<size_t>(p.shape[0]), cols = static_cast<size_t>(p.shape[1]);
          for (size_t r = 0; r < rows; ++r)
            for (size_t c = 0; c < cols; ++c) t[c * rows + r] = v[r * cols + c];
        }
        std::vector<char> data(t.size() * dtype_size(dtype));
        cpu::cast(t.data(), DType::f32, data.data(), dtype, t.size());
        out->write(hf[next].name, data.data(), data.size());
        bytes += data.size();
      }
    });
  }
  on_lead([&] { out->finish(); });
  if (failed) std::rethrow_exception(failed);
  return bytes;
}

}  // namespace zeroth
