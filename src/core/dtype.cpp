#include "seqforge/core/dtype.hpp"

#include <cmath>

#include "seqforge/core/error.hpp"

namespace seqforge {

namespace {
struct DTypeInfo {
  DType type;
  size_t size;
  std::string_view name;
  std::string_view safetensors;
};
constexpr DTypeInfo kTypes[] = {
    {DType::f32, 4, "f32", "F32"}, {DType::f64, 8, "f64", "F64"}, {DType::bf16, 2, "bf16", "BF16"},
    {DType::f16, 2, "f16", "F16"}, {DType::i32, 4, "i32", "I32"}, {DType::i64, 8, "i64", "I64"},
};
const DTypeInfo& info(DType t) { return kTypes[static_cast<int>(t)]; }
}  // namespace

size_t dtype_size(DType t) { return info(t).size; }
std::string_view dtype_name(DType t) { return info(t).name; }
std::string_view dtype_safetensors_name(DType t) { return info(t).safetensors; }

bool dtype_from_safetensors_name(std::string_view s, DType* out) {
  for (const auto& t : kTypes) {
    if (t.safetensors == s) {
      *out = t.type;
      return true;
    }
  }
  return false;
}

uint16_t to_f16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u);   // NaN
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // overflow -> inf
  if (abs < 0x38800000u) {  // subnormal half or zero: scale into the integer mantissa, round even
    const float magnitude = std::fabs(f) * 16777216.0f;  // 2^24 = 1 / smallest subnormal
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(magnitude)));
  }
  uint32_t mant = abs + 0xfffu + ((abs >> 13) & 1u);  // round to nearest even at bit 13
  return static_cast<uint16_t>(sign | ((mant - 0x38000000u) >> 13));
}

namespace {
double load(const void* src, DType t, size_t i) {
  switch (t) {
    case DType::f32:
      return static_cast<const float*>(src)[i];
    case DType::f64:
      return static_cast<const double*>(src)[i];
    case DType::bf16:
      return from_bf16(static_cast<const bf16*>(src)[i]);
    case DType::f16:
      return from_f16(static_cast<const uint16_t*>(src)[i]);
    case DType::i32:
      return static_cast<const int32_t*>(src)[i];
    case DType::i64:
      return static_cast<double>(static_cast<const int64_t*>(src)[i]);
  }
  return 0;
}
void store(void* dst, DType t, size_t i, double v) {
  switch (t) {
    case DType::f32:
      static_cast<float*>(dst)[i] = static_cast<float>(v);
      break;
    case DType::f64:
      static_cast<double*>(dst)[i] = v;
      break;
    case DType::bf16:
      static_cast<bf16*>(dst)[i] = to_bf16(static_cast<float>(v));
      break;
    case DType::f16:
      static_cast<uint16_t*>(dst)[i] = to_f16(static_cast<float>(v));
      break;
    case DType::i32:
      static_cast<int32_t*>(dst)[i] = static_cast<int32_t>(v);
      break;
    case DType::i64:
      static_cast<int64_t*>(dst)[i] = static_cast<int64_t>(v);
      break;
  }
}
}  // namespace

void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n) {
  if (n == 0) return;
  if (src_type == dst_type) {
    std::memcpy(dst, src, n * dtype_size(src_type));
    return;
  }
  if (src_type == DType::f32 && dst_type == DType::bf16) {
    const float* s = static_cast<const float*>(src);
    bf16* d = static_cast<bf16*>(dst);
    for (size_t i = 0; i < n; ++i) d[i] = to_bf16(s[i]);
    return;
  }
  for (size_t i = 0; i < n; ++i) store(dst, dst_type, i, load(src, src_type, i));
}

int64_t first_non_finite(const void* data, DType t, size_t n, double* value) {
  if (t == DType::i32 || t == DType::i64) return -1;
  const size_t width = dtype_size(t);
  const auto* bytes = static_cast<const std::byte*>(data);
  for (size_t i = 0; i < n; ++i) {
    alignas(8) std::byte element[8];  // file data may be unaligned
    std::memcpy(element, bytes + i * width, width);
    const double v = load(element, t, 0);
    if (!std::isfinite(v)) {
      if (value) *value = v;
      return static_cast<int64_t>(i);
    }
  }
  return -1;
}

}  // namespace seqforge
