// Element types and the host-side bf16 value type.
#pragma once

#include <cstdint>
#include <cstring>
#include <ostream>
#include <string_view>

#include "engine/core/status.h"

namespace switchyard {

// kF64 is last so the values of the others stay as they were.
enum class DType : uint8_t { kF32, kBF16, kF16, kI32, kI64, kU8, kF64 };

// Bytes per element.
size_t SizeOf(DType dtype);
// "f32", "bf16", "f16", "i32", "i64", "u8", "f64".
std::string_view DTypeName(DType dtype);
// Parses the names above (and "float32", "bfloat16", "int32", "int64", "uint8",
// "float64").
StatusOr<DType> ParseDType(std::string_view name);
bool IsFloating(DType dtype);
inline std::ostream& operator<<(std::ostream& out, DType dtype) {
  return out << DTypeName(dtype);
}

// bfloat16 on the host: the upper 16 bits of an IEEE float. Conversion from float rounds
// to nearest even (NaN stays NaN), matching __float2bfloat16 on the GPU.
struct BFloat16 {
  uint16_t bits = 0;

  BFloat16() = default;
  explicit BFloat16(float f) : bits(FromFloat(f)) {}
  explicit operator float() const { return ToFloat(bits); }

  static uint16_t FromFloat(float f) {
    uint32_t u;
    std::memcpy(&u, &f, sizeof(u));
    if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
    u += 0x7fffu + ((u >> 16) & 1u);
    return static_cast<uint16_t>(u >> 16);
  }
  static float ToFloat(uint16_t b) {
    uint32_t u = static_cast<uint32_t>(b) << 16;
    float f;
    std::memcpy(&f, &u, sizeof(f));
    return f;
  }
};

// The DType of a C++ element type: DTypeOf<float>() == DType::kF32.
template <typename T>
constexpr DType DTypeOf();
template <> constexpr DType DTypeOf<float>() { return DType::kF32; }
template <> constexpr DType DTypeOf<BFloat16>() { return DType::kBF16; }
template <> constexpr DType DTypeOf<int32_t>() { return DType::kI32; }
template <> constexpr DType DTypeOf<int64_t>() { return DType::kI64; }
template <> constexpr DType DTypeOf<uint8_t>() { return DType::kU8; }
template <> constexpr DType DTypeOf<double>() { return DType::kF64; }

}  // namespace switchyard
