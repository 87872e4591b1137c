#pragma once
// Element types: f32/f64 compute, bf16/f16 storage, i32/i64 token ids.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace seqforge {

enum class DType : uint8_t { f32, f64, bf16, f16, i32, i64 };

size_t dtype_size(DType t);
std::string_view dtype_name(DType t);              // "f32", "bf16", ...
std::string_view dtype_safetensors_name(DType t);  // "F32", "BF16", ...
bool dtype_from_safetensors_name(std::string_view s, DType* out);

template <typename T>
constexpr DType dtype_of();
template <>
constexpr DType dtype_of<float>() {
  return DType::f32;
}
template <>
constexpr DType dtype_of<double>() {
  return DType::f64;
}
template <>
constexpr DType dtype_of<int32_t>() {
  return DType::i32;
}
template <>
constexpr DType dtype_of<int64_t>() {
  return DType::i64;
}

// bfloat16: the upper 16 bits of an IEEE float; conversion rounds to nearest even, NaN stays NaN.
struct bf16 {
  uint16_t bits;
};
inline bf16 to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}
inline float from_bf16(bf16 b) {
  uint32_t u = static_cast<uint32_t>(b.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// IEEE half precision (storage only): round to nearest even, with subnormals, inf and NaN.
uint16_t to_f16(float f);
inline float from_f16(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {  // zero or subnormal: mant * 2^-24, exact in float
    const float out = static_cast<float>(mant) * 0x1p-24f;
    return sign ? -out : out;
  }
  const uint32_t bits = exp == 31 ? (sign | 0x7f800000u | (mant << 13))
                                  : (sign | ((exp + 112u) << 23) | (mant << 13));
  float out;
  std::memcpy(&out, &bits, 4);
  return out;
}
struct f16 {
  uint16_t bits;
};

// Converts n elements between float-like dtypes (f32, f64, bf16, f16) on the host.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

// The index of the first of n elements that is NaN or infinite (its value in *value), or -1;
// always -1 for integer dtypes. `data` need not be aligned.
int64_t first_non_finite(const void* data, DType t, size_t n, double* value = nullptr);

}  // namespace seqforge
