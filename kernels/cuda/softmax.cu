// CUDA implementation of kernels/softmax.h: one block per row (grid-stride over rows), the
// max in f32 and the sums in double as on the CPU, the elementwise parts in the CPU's f32
// expressions with explicit round-to-nearest intrinsics (no FMA contraction). Differences
// from the CPU: expf (CUDA, <= 2 ulp) against the host libm, and the reduction order of the
// double sums. Every row is fully read by the reductions (which end in a barrier) before
// any thread writes it, and each element is written by the thread that reads it, so y may
// alias x and dx may alias dy. The device code is in kernels/cuda/softmax_kernels.cuh.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/softmax_kernels.cuh"
#include "kernels/softmax.h"

namespace switchyard::kernels::cuda {

namespace sm = softmax_dev;

void SoftmaxForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  if (x.numel() == 0) return;
  const int64_t c = x.dim(-1), n = x.numel() / c;
  sm::SoftmaxForwardKernel<<<sm::RowBlocks(n), sm::RowThreads(c), 0, StreamOf(ctx)>>>(
      x.data<float>(), y.data<float>(), n, c);
  SY_CUDA_CHECK_LAUNCH();
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  if (y.numel() == 0) return;
  const int64_t c = y.dim(-1), n = y.numel() / c;
  sm::SoftmaxBackwardKernel<<<sm::RowBlocks(n), sm::RowThreads(c), 0, StreamOf(ctx)>>>(
      y.data<float>(), dy.data<float>(), dx.data<float>(), n, c);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
