// The device code of the elementwise ops (kernels/cuda/elementwise.cu, which launches them):
// arithmetic, fills and the f32 <-> bf16 casts, one grid-stride kernel per op, with the launch
// shape shared by the .cu and by tests/kernels/optimizer_emulation_test.cc. Include after
// kernels/cuda/device_common.cuh.
#pragma once

#include <algorithm>
#include <cstdint>

namespace switchyard::kernels::cuda::elementwise {
// Internal linkage: the emulation test compiles these kernels too, and links with
// elementwise.cu's.
namespace {

constexpr int kThreads = 256;

enum class Op { kAdd, kMul, kAxpy, kMulAdd };

// Op::kAdd:    out = a + b          Op::kMul:    out = a * b
// Op::kAxpy:   out += alpha * a     Op::kMulAdd: out += a * b
// a, b, out (n); b unread by kAxpy (may be null).
template <Op kOp>
__global__ void ArithKernel(const float* a, const float* b, float* out, float alpha, int64_t n) {
  SY_GRID_STRIDE(i, n) {
    if constexpr (kOp == Op::kAdd) {
      out[i] = __fadd_rn(a[i], b[i]);
    } else if constexpr (kOp == Op::kMul) {
      out[i] = __fmul_rn(a[i], b[i]);
    } else if constexpr (kOp == Op::kAxpy) {
      out[i] = __fadd_rn(out[i], __fmul_rn(alpha, a[i]));
    } else {
      out[i] = __fadd_rn(out[i], __fmul_rn(a[i], b[i]));
    }
  }
}

// out (n) = value; T is float, or uint16_t for bf16 bits.
template <typename T>
__global__ void FillKernel(T* out, T value, int64_t n) {
  SY_GRID_STRIDE(i, n) { out[i] = value; }
}

// f32 -> bf16 bits with the integer rounding of BFloat16::FromFloat (engine/core/dtype.h):
// round to nearest even; a NaN keeps its sign and top payload bits and is made quiet.
// (__float2bfloat16_rn rounds numbers the same way but returns one canonical NaN.)
__device__ __forceinline__ uint16_t F32ToBf16Bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// src, dst (n).
__global__ void F32ToBf16Kernel(const float* src, uint16_t* dst, int64_t n) {
  SY_GRID_STRIDE(i, n) { dst[i] = F32ToBf16Bits(src[i]); }
}

// src, dst (n): exact.
__global__ void Bf16ToF32Kernel(const uint16_t* src, float* dst, int64_t n) {
  SY_GRID_STRIDE(i, n) { dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16); }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::elementwise
