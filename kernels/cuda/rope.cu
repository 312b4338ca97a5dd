// CUDA implementation of kernels/rope.h, in two launches like the CPU reference:
//   RopeTableKernel:  the (S, hd/2) cos / sin table, one thread per (s, i): the angle
//                     pos * base^(-2i/hd) and its sine and cosine in double (the CPU's
//                     expression), rounded to f32; so the table matches the CPU's up to the
//                     last-ulp differences of CUDA's and the host's pow / sin / cos.
//   RopeRotateKernel: one thread per (b, s, h, i) pair, the CPU's f32 products with
//                     explicit round-to-nearest intrinsics (no FMA contraction). Each pair
//                     is read by its thread before it writes it: y may alias x.
// The device code is in kernels/cuda/rope_kernels.cuh.
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/rope_kernels.cuh"
#include "kernels/rope.h"

namespace switchyard::kernels::cuda {

namespace rd = rope_dev;

void RopeRotate(const Tensor& x, Tensor& y, float base, int64_t position_offset, float sign,
                DeviceContext* ctx) {
  const int64_t nb = x.dim(0), s = x.dim(1), nh = x.dim(2), half = x.dim(3) / 2;
  const int64_t pairs = nb * s * nh * half;
  if (pairs == 0) return;
  Tensor table = Tensor::Empty({2, s, half}, DType::kF32, ctx->device());
  rd::RopeTableKernel<<<GridFor(s * half, rd::kThreads), rd::kThreads, 0, StreamOf(ctx)>>>(
      table.data<float>(), s, half, 2 * half, static_cast<double>(base), position_offset, sign);
  SY_CUDA_CHECK_LAUNCH();
  rd::RopeRotateKernel<<<GridFor(pairs, rd::kThreads), rd::kThreads, 0, StreamOf(ctx)>>>(
      x.data<float>(), y.data<float>(), table.data<float>(), pairs, s, nh, half);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
