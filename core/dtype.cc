// DType names and the scalar conversion entry points.
#include "core/dtype.h"

#include "core/cpu/kernels.h"
#include "core/error.h"

namespace zeroth {

namespace {
#include "core/cpu/convert_scalar.inc"
}  // namespace

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::f32: return "f32";
    case DType::bf16: return "bf16";
    case DType::f16: return "f16";
  }
  return "invalid";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "fp32" || name == "float32" || name == "float") return DType::f32;
  if (name == "bf16" || name == "bfloat16") return DType::bf16;
  if (name == "f16" || name == "fp16" || name == "float16" || name == "half") return DType::f16;
  ZEROTH_THROW(InvalidArgument, "unknown dtype '{}' (use f32, bf16 or f16)", name);
}

uint16_t f32_to_bf16_bits(float value) { return scalar_f32_to_bf16(f32_bits(value)); }
uint16_t f32_to_f16_bits(float value) { return scalar_f32_to_f16(f32_bits(value)); }
float bf16_bits_to_f32(uint16_t bits) { return bits_f32(scalar_bf16_to_f32(bits)); }
float f16_bits_to_f32(uint16_t bits) { return bits_f32(scalar_f16_to_f32(bits)); }

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t count) {
  cpu::cast(src, src_type, dst, dst_type, count);
}

}  // namespace zeroth
