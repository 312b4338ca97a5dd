// CUDA implementation of kernels/elementwise.h: one grid-stride kernel per op, 256 threads
// per block, GridFor(n) blocks. Products and sums use __fmul_rn / __fadd_rn, which the
// compiler never contracts into a fused multiply-add, so every result equals the CPU's bit
// for bit. Pointers are not __restrict__: outputs may be the same memory as inputs (each
// thread reads its element before writing it).
#include <cstdint>

#include "engine/core/dtype.h"
#include "kernels/cuda/common.cuh"
#include "kernels/elementwise.h"

namespace switchyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;

enum class Op { kAdd, kMul, kAxpy, kMulAdd };

// Op::kAdd:    out = a + b          Op::kMul:    out = a * b
// Op::kAxpy:   out += alpha * a     Op::kMulAdd: out += a * b
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

template <Op kOp>
void LaunchArith(const float* a, const float* b, float* out, float alpha, int64_t n,
                 DeviceContext* ctx) {
  if (n == 0) return;
  ArithKernel<kOp><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(a, b, out, alpha, n);
  SY_CUDA_CHECK_LAUNCH();
}

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

__global__ void F32ToBf16Kernel(const float* src, uint16_t* dst, int64_t n) {
  SY_GRID_STRIDE(i, n) { dst[i] = F32ToBf16Bits(src[i]); }
}

__global__ void Bf16ToF32Kernel(const uint16_t* src, float* dst, int64_t n) {
  SY_GRID_STRIDE(i, n) { dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16); }
}

}  // namespace

void Add(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx) {
  LaunchArith<Op::kAdd>(a.data<float>(), b.data<float>(), out.data<float>(), 0.0f, out.numel(),
                        ctx);
}

void Axpy(float alpha, const Tensor& x, Tensor& y, DeviceContext* ctx) {
  LaunchArith<Op::kAxpy>(x.data<float>(), nullptr, y.data<float>(), alpha, y.numel(), ctx);
}

void Mul(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx) {
  LaunchArith<Op::kMul>(a.data<float>(), b.data<float>(), out.data<float>(), 0.0f, out.numel(),
                        ctx);
}

void MulAdd(const Tensor& a, const Tensor& b, Tensor& y, DeviceContext* ctx) {
  LaunchArith<Op::kMulAdd>(a.data<float>(), b.data<float>(), y.data<float>(), 0.0f, y.numel(), ctx);
}

void Fill(Tensor& t, float value, DeviceContext* ctx) {
  const int64_t n = t.numel();
  if (n == 0) return;
  if (t.dtype() == DType::kBF16) {
    FillKernel<uint16_t><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        static_cast<uint16_t*>(t.raw_data()), BFloat16::FromFloat(value), n);
  } else {
    FillKernel<float>
        <<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(t.data<float>(), value, n);
  }
  SY_CUDA_CHECK_LAUNCH();
}

void Cast(const Tensor& src, Tensor& dst, DeviceContext* ctx) {
  const int64_t n = dst.numel();
  if (n == 0) return;
  if (src.dtype() == dst.dtype()) {
    if (src.raw_data() != dst.raw_data()) {
      SY_CUDA_CHECK(cudaMemcpyAsync(dst.raw_data(), src.raw_data(), dst.nbytes(),
                                    cudaMemcpyDeviceToDevice, StreamOf(ctx)));
    }
    return;
  }
  if (src.dtype() == DType::kF32) {
    F32ToBf16Kernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        src.data<float>(), static_cast<uint16_t*>(dst.raw_data()), n);
  } else {
    Bf16ToF32Kernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        static_cast<const uint16_t*>(src.raw_data()), dst.data<float>(), n);
  }
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
