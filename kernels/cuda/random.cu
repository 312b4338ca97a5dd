// CUDA random fills (kernels/random.h): Philox at each element's global index, as the CPU;
// uniform fills are the CPU's bits (the scaling rounded step by step, never a fused
// multiply-add, which nvcc would otherwise form), normal fills differ through the device's
// log and cos. The device code is in kernels/cuda/random_kernels.cuh.
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/random_kernels.cuh"
#include "kernels/random.h"

namespace switchyard::kernels::cuda {
namespace {

namespace rnd = random_dev;
using rnd::Dist;

template <Dist D>
void Launch(Tensor& out, RngKey key, int64_t first, float a, float b, DeviceContext* ctx,
            const int64_t* at = nullptr, int64_t token_offset = 0, int64_t per_token = 1) {
  int64_t n = out.numel();
  if (n == 0) return;
  if (out.dtype() == DType::kF32) {
    rnd::FillKernel<float, D><<<GridFor(n, rnd::kThreads), rnd::kThreads, 0, StreamOf(ctx)>>>(
        static_cast<float*>(out.raw_data()), n, key, first, a, b, at, token_offset, per_token);
  } else {
    SY_CHECK(out.dtype() == DType::kBF16) << "random fill of " << DTypeName(out.dtype());
    rnd::FillKernel<__nv_bfloat16, D>
        <<<GridFor(n, rnd::kThreads), rnd::kThreads, 0, StreamOf(ctx)>>>(
            static_cast<__nv_bfloat16*>(out.raw_data()), n, key, first, a, b, at, token_offset,
            per_token);
  }
  SY_CUDA_CHECK_LAUNCH();
}

void LaunchMulUniform(const Tensor& x, Tensor& out, RngKey key, int64_t first, float lo,
                      float hi, Write write, DeviceContext* ctx, const int64_t* at = nullptr,
                      int64_t token_offset = 0, int64_t per_token = 1) {
  const int64_t n = out.numel();
  if (n == 0) return;
  const unsigned grid = GridFor(n, rnd::kThreads);
  const float* px = x.data<float>();
  float* po = out.data<float>();
  if (write == Write::kSet) {
    rnd::MulUniformKernel<false><<<grid, rnd::kThreads, 0, StreamOf(ctx)>>>(
        px, po, n, key, first, lo, hi, at, token_offset, per_token);
  } else {
    rnd::MulUniformKernel<true><<<grid, rnd::kThreads, 0, StreamOf(ctx)>>>(
        px, po, n, key, first, lo, hi, at, token_offset, per_token);
  }
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void MulUniform(const Tensor& x, Tensor& out, RngKey key, int64_t first_index, float lo,
                float hi, Write write, DeviceContext* ctx) {
  LaunchMulUniform(x, out, key, first_index, lo, hi, write, ctx);
}

void MulUniform(const Tensor& x, Tensor& out, const DeviceRng& at, float lo, float hi,
                Write write, DeviceContext* ctx) {
  LaunchMulUniform(x, out, RngKey{at.seed, 0}, 0, lo, hi, write, ctx, at.values.data<int64_t>(),
                   at.token_offset, at.per_token);
}

void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi,
                 DeviceContext* ctx) {
  Launch<Dist::kUniform>(out, key, first_index, lo, hi, ctx);
}

void FillUniform(Tensor& out, const DeviceRng& at, float lo, float hi, DeviceContext* ctx) {
  Launch<Dist::kUniform>(out, RngKey{at.seed, 0}, 0, lo, hi, ctx, at.values.data<int64_t>(),
                         at.token_offset, at.per_token);
}

void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std,
                DeviceContext* ctx) {
  Launch<Dist::kNormal>(out, key, first_index, mean, std, ctx);
}

void FillRandomBits(Tensor& out, RngKey key, int64_t first_index, DeviceContext* ctx) {
  int64_t n = out.numel();
  if (n == 0) return;
  rnd::BitsKernel<<<GridFor(n, rnd::kThreads), rnd::kThreads, 0, StreamOf(ctx)>>>(
      out.data<int32_t>(), n, key, first_index);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
