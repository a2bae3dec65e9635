// Element access for CUDA kernels: f32/bf16/f16 loads and stores through the bit-exact scalar
// conversions, and host-side dtype dispatch. Included inside an anonymous namespace, after
// convert_scalar.inc (with ZEROTH_HD defined as __host__ __device__).

template <DType T>
__device__ inline float load(const void* p, size_t i) {
  if constexpr (T == DType::f32) return static_cast<const float*>(p)[i];
  else if constexpr (T == DType::bf16) return bits_f32(scalar_bf16_to_f32(static_cast<const uint16_t*>(p)[i]));
  else return bits_f32(scalar_f16_to_f32(static_cast<const uint16_t*>(p)[i]));
}

template <DType T>
__device__ inline void store(void* p, size_t i, float v) {
  if constexpr (T == DType::f32) static_cast<float*>(p)[i] = v;
  else if constexpr (T == DType::bf16) static_cast<uint16_t*>(p)[i] = scalar_f32_to_bf16(f32_bits(v));
  else static_cast<uint16_t*>(p)[i] = scalar_f32_to_f16(f32_bits(v));
}

template <class Fn>
void with_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::f32: fn.template operator()<DType::f32>(); return;
    case DType::bf16: fn.template operator()<DType::bf16>(); return;
    case DType::f16: fn.template operator()<DType::f16>(); return;
  }
}
