// The device code of the row softmax (kernels/cuda/softmax.cu, which launches it and describes
// the design): the forward and the backward, one block per row; with the launch shapes, which
// the .cu and the emulation test (tests/kernels/rope_softmax_emulation_test.cc) both take
// from here.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda::softmax_dev {
// Internal linkage: the emulation test compiles these kernels too, and links with softmax.cu's.
namespace {

constexpr int64_t kMaxRowBlocks = 65535 * 16;  // grid cap: the kernels stride over rows past it

// Threads per row block: about four elements per thread, a warp at least, 1024 at most
// (C = 50257 gets 1024).
inline int RowThreads(int64_t c) {
  int64_t t = ((c + 3) / 4 + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 1024 ? 1024 : t));
}

inline unsigned RowBlocks(int64_t n, int64_t max_blocks = kMaxRowBlocks) {
  return static_cast<unsigned>(n < max_blocks ? n : max_blocks);
}

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
}  // namespace switchyard::kernels::cuda::softmax_dev
