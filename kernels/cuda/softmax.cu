// CUDA implementation of kernels/softmax.h: one block per row (grid-stride over rows), the
// max in f32 and the sums in double as on the CPU, the elementwise parts in the CPU's f32
// expressions with explicit round-to-nearest intrinsics (no FMA contraction). Differences
// from the CPU: expf (CUDA, <= 2 ulp) against the host libm, and the reduction order of the
// double sums. Every row is fully read by the reductions (which end in a barrier) before
// any thread writes it, and each element is written by the thread that reads it, so y may
// alias x and dx may alias dy.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/softmax.h"

namespace switchyard::kernels::cuda {
namespace {

// Threads per row block: about four elements per thread, a warp at least, 1024 at most
// (C = 50257 gets 1024).
int RowThreads(int64_t c) {
  int64_t t = ((c + 3) / 4 + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 1024 ? 1024 : t));
}

unsigned RowBlocks(int64_t n) { return static_cast<unsigned>(n < 65535 * 16 ? n : 65535 * 16); }

// x, y (n, c), c >= 1.
__global__ void SoftmaxForwardKernel(const float* x, float* y, int64_t n, int64_t c) {
  __shared__ float shared_max[32];
  __shared__ double shared_sum[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = x + r * c;
    float* yr = y + r * c;
    float max = -INFINITY;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) max = xr[j] > max ? xr[j] : max;
    max = BlockMax(max, shared_max, -INFINITY);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) sum += expf(__fsub_rn(xr[j], max));
    sum = BlockSum(sum, shared_sum);
    const float inv = static_cast<float>(1.0 / sum);
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      yr[j] = __fmul_rn(expf(__fsub_rn(xr[j], max)), inv);
    }
  }
}

// dx = y * (dy - sum(dy * y)) per row.
__global__ void SoftmaxBackwardKernel(const float* y, const float* dy, float* dx, int64_t n,
                                      int64_t c) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* yr = y + r * c;
    const float* dyr = dy + r * c;
    float* dxr = dx + r * c;
    double dot = 0.0;
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      dot += static_cast<double>(dyr[j]) * yr[j];
    }
    const float d = static_cast<float>(BlockSum(dot, shared));
    for (int64_t j = threadIdx.x; j < c; j += blockDim.x) {
      dxr[j] = __fmul_rn(yr[j], __fsub_rn(dyr[j], d));
    }
  }
}

}  // namespace

void SoftmaxForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  if (x.numel() == 0) return;
  const int64_t c = x.dim(-1), n = x.numel() / c;
  SoftmaxForwardKernel<<<RowBlocks(n), RowThreads(c), 0, StreamOf(ctx)>>>(x.data<float>(),
                                                                          y.data<float>(), n, c);
  SY_CUDA_CHECK_LAUNCH();
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  if (y.numel() == 0) return;
  const int64_t c = y.dim(-1), n = y.numel() / c;
  SoftmaxBackwardKernel<<<RowBlocks(n), RowThreads(c), 0, StreamOf(ctx)>>>(
      y.data<float>(), dy.data<float>(), dx.data<float>(), n, c);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
