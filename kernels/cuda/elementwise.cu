// CUDA implementation of kernels/elementwise.h: one grid-stride kernel per op
// (kernels/cuda/elementwise_kernels.cuh), 256 threads per block, GridFor(n, kThreads) blocks.
// Products and sums use __fmul_rn / __fadd_rn, which the compiler never contracts into a
// fused multiply-add, so every result equals the CPU's bit for bit. Pointers are not
// __restrict__: outputs may be the same memory as inputs (each thread reads its element
// before writing it).
#include <algorithm>
#include <cstdint>

#include "engine/core/dtype.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/elementwise_kernels.cuh"
#include "kernels/elementwise.h"

namespace switchyard::kernels::cuda {
namespace {

using elementwise::ArithKernel;
using elementwise::Bf16ToF32Kernel;
using elementwise::F32ToBf16Kernel;
using elementwise::FillKernel;
using elementwise::kThreads;
using elementwise::Op;

template <Op kOp>
void LaunchArith(const float* a, const float* b, float* out, float alpha, int64_t n,
                 DeviceContext* ctx) {
  if (n == 0) return;
  ArithKernel<kOp><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(a, b, out, alpha, n);
  SY_CUDA_CHECK_LAUNCH();
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

void ZeroMany(std::span<Tensor> tensors, DeviceContext* ctx) {
  using elementwise::kZeroManyBatch;
  elementwise::ZeroTable table;
  auto launch = [&] {
    if (table.count == 0) return;
    const unsigned blocks = elementwise::ZeroManyBlocks(table);
    elementwise::ZeroManyKernel<<<blocks, kThreads, 0, StreamOf(ctx)>>>(table);
    SY_CUDA_CHECK_LAUNCH();
    table.count = 0;
  };
  for (Tensor& t : tensors) {
    if (t.nbytes() == 0) continue;
    table.ptr[table.count] = t.raw_data();
    table.bytes[table.count] = static_cast<int64_t>(t.nbytes());
    if (++table.count == kZeroManyBatch) launch();
  }
  launch();
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
  const cudaStream_t stream = StreamOf(ctx);
  if (src.dtype() == DType::kF32) {
    const float* f = src.data<float>();
    uint16_t* h = static_cast<uint16_t*>(dst.raw_data());
    if (elementwise::CastQuadsFit(f, h)) {
      F32ToBf16Kernel<4><<<GridFor(n / 4, kThreads), kThreads, 0, stream>>>(f, h, n);
    } else {
      F32ToBf16Kernel<1><<<GridFor(n, kThreads), kThreads, 0, stream>>>(f, h, n);
    }
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(src.raw_data());
    float* f = dst.data<float>();
    if (elementwise::CastQuadsFit(f, h)) {
      Bf16ToF32Kernel<4><<<GridFor(n / 4, kThreads), kThreads, 0, stream>>>(h, f, n);
    } else {
      Bf16ToF32Kernel<1><<<GridFor(n, kThreads), kThreads, 0, stream>>>(h, f, n);
    }
  }
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
