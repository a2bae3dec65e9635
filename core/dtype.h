// Element types (f32, bf16, f16) and exact conversions between them.
//
// Conversions to the narrow types round to nearest, ties to even, on the raw bits, so results do
// not depend on the FPU mode. Values past the largest finite number become Inf. A NaN keeps its
// sign and the top bits of its payload (a signalling NaN stays signalling, so every bf16/f16 bit
// pattern survives a round trip through f32); a payload that would truncate to zero gets the
// quiet bit instead, so a NaN never turns into Inf. f16 subnormals are produced and read exactly.
#pragma once

#include <cstddef>      // size_t
#include <cstdint>      // uint16_t, uint32_t
#include <string_view>  // std::string_view

namespace zeroth {

enum class DType : uint8_t { f32 = 0, bf16 = 1, f16 = 2 };

// Element-wise reductions the kernels and collectives share (avg is sum with a scale).
enum class ReduceKind : uint8_t { sum, max };

inline constexpr size_t dtype_size(DType t) { return t == DType::f32 ? 4 : 2; }
std::string_view dtype_name(DType t);
// Parses "f32"/"float32"/"fp32", "bf16"/"bfloat16", "f16"/"float16"/"fp16"; else InvalidArgument.
DType parse_dtype(std::string_view name);

// Scalar conversions on bit patterns (the reference every vector path must match bit for bit).
uint16_t f32_to_bf16_bits(float value);
uint16_t f32_to_f16_bits(float value);
float bf16_bits_to_f32(uint16_t bits);
float f16_bits_to_f32(uint16_t bits);

// Array conversions through the CPU kernel dispatcher; src and dst must not overlap.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t count);

}  // namespace zeroth
