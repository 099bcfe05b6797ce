#pragma once
// Element types and conversions. 16-bit floats are stored as raw bits; every narrowing conversion
// rounds to nearest, ties to even (what PyTorch and the hardware do).
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>

namespace ds {

enum class DType : uint8_t { f32, bf16, f16, i32, i64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);  // "fp32", "bf16", "fp16", "int32", "int64"
DType dtype_from_name(std::string_view name);  // accepts fp32/float32/float, bf16/bfloat16, ...
inline bool is_floating(DType t) { return t == DType::f32 || t == DType::bf16 || t == DType::f16; }

struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

inline float bf16_to_float(uint16_t b) {
  uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

inline uint16_t float_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest even
  return static_cast<uint16_t>(u >> 16);
}

float f16_to_float(uint16_t h);
uint16_t float_to_f16(float f);

// Bulk conversion between any two dtypes (floating <-> floating, int <-> float by value).
// Vectorised for the float <-> 16-bit cases; n elements, contiguous.
void convert(const void* src, DType src_type, void* dst, DType dst_type, size_t n);

}  // namespace ds
