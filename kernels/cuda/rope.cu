// CUDA implementation of kernels/rope.h, in two launches like the CPU reference:
//   RopeTableKernel:  the (S, hd/2) cos / sin table, one thread per (s, i): the angle
//                     pos * base^(-2i/hd) and its sine and cosine in double (the CPU's
//                     expression), rounded to f32; so the table matches the CPU's up to the
//                     last-ulp differences of CUDA's and the host's pow / sin / cos.
//   RopeRotateKernel: one thread per (b, s, h, i) pair, the CPU's f32 products with
//                     explicit round-to-nearest intrinsics (no FMA contraction). Each pair
//                     is read by its thread before it writes it: y may alias x.
#include "kernels/cuda/common.cuh"
#include "kernels/rope.h"

namespace switchyard::kernels::cuda {
namespace {

// table (2, s, half): cos at [0], sign * sin at [1].
__global__ void RopeTableKernel(float* table, int64_t s, int64_t half, int64_t hd, double base,
                                int64_t position_offset, float sign) {
  const int64_t count = s * half;
  SY_GRID_STRIDE(k, count) {
    const int64_t t = k / half, i = k % half;
    const double pos = static_cast<double>(position_offset + t);
    const double theta = pow(base, -2.0 * i / static_cast<double>(hd));
    double sn, cs;
    sincos(pos * theta, &sn, &cs);
    table[k] = static_cast<float>(cs);
    table[count + k] = sign * static_cast<float>(sn);
  }
}

// x, y (rows, 2 * half) with rows = B * S * H, row = (b * S + t) * H + h.
__global__ void RopeRotateKernel(const float* x, float* y, const float* table, int64_t pairs,
                                 int64_t s, int64_t nh, int64_t half) {
  const float* cos_table = table;
  const float* sin_table = table + s * half;
  SY_GRID_STRIDE(p, pairs) {
    const int64_t i = p % half, row = p / half;
    const int64_t t = (row / nh) % s;
    const int64_t at = row * 2 * half + i;
    const float c = cos_table[t * half + i], sn = sin_table[t * half + i];
    const float x1 = x[at], x2 = x[at + half];
    y[at] = __fsub_rn(__fmul_rn(x1, c), __fmul_rn(x2, sn));
    y[at + half] = __fadd_rn(__fmul_rn(x2, c), __fmul_rn(x1, sn));
  }
}

}  // namespace

void RopeRotate(const Tensor& x, Tensor& y, float base, int64_t position_offset, float sign,
                DeviceContext* ctx) {
  const int64_t nb = x.dim(0), s = x.dim(1), nh = x.dim(2), half = x.dim(3) / 2;
  const int64_t pairs = nb * s * nh * half;
  if (pairs == 0) return;
  Tensor table = Tensor::Empty({2, s, half}, DType::kF32, ctx->device());
  RopeTableKernel<<<GridFor(s * half), 256, 0, StreamOf(ctx)>>>(
      table.data<float>(), s, half, 2 * half, static_cast<double>(base), position_offset, sign);
  SY_CUDA_CHECK_LAUNCH();
  RopeRotateKernel<<<GridFor(pairs), 256, 0, StreamOf(ctx)>>>(
      x.data<float>(), y.data<float>(), table.data<float>(), pairs, s, nh, half);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
