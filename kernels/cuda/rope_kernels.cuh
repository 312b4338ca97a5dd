// The device code of the rotary embeddings (kernels/cuda/rope.cu, which launches it and
// describes the design): the cos / sin table and the rotation of the (i, i + hd/2) pairs; with
// the block size, which the .cu and the emulation test
// (tests/kernels/rope_softmax_emulation_test.cc) both take from here.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda::rope_dev {
// Internal linkage: the emulation test compiles these kernels too, and links with rope.cu's.
namespace {

constexpr int kThreads = 256;  // block of both grid-stride kernels

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
}  // namespace switchyard::kernels::cuda::rope_dev
