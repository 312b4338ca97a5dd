// The device code of the load-balancing loss from its device sums (kernels/cuda/
// balance_loss.cu, which launches it): the loss value and counts, and the gradient column
// added to every row of dprobs. Every double operation is an explicit round-to-nearest
// intrinsic (no fused multiply-add): the host's bits.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda::balance_loss {
// Internal linkage: the emulation test compiles these kernels too, and links with the .cu's.
namespace {

__device__ __forceinline__ int64_t AssignmentsOf(const int64_t* counts, int64_t E, int64_t k,
                                                 int64_t e) {
  int64_t a = 0;
  for (int64_t j = 0; j < k; ++j) a += counts[j * E + e];
  return a;
}

// One thread: values = {aux, a_0..a_{E-1}, bad}.
__global__ void BalanceValuesKernel(const int64_t* __restrict__ counts,
                                    const float* __restrict__ prob_sums, int64_t E, int64_t k,
                                    int64_t tokens, float coef, double* __restrict__ values) {
  double dot = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    const int64_t a = AssignmentsOf(counts, E, k, e);
    values[1 + e] = static_cast<double>(a);
    dot = __dadd_rn(dot, __dmul_rn(static_cast<double>(a), static_cast<double>(prob_sums[e])));
  }
  float aux = 0.0f;
  if (tokens != 0) {
    const double T = static_cast<double>(tokens);
    const double den = __dmul_rn(__dmul_rn(T, static_cast<double>(k)), T);
    const double ratio = __ddiv_rn(__dmul_rn(static_cast<double>(E), dot), den);
    aux = static_cast<float>(__dmul_rn(static_cast<double>(coef), ratio));
  }
  values[0] = static_cast<double>(aux);
  values[E + 1] = static_cast<double>(counts[k * E]);
}

// col[e] = f32(((grad * coef) * E) * f_e / T), f_e = a_e / (T * k).
__global__ void BalanceColumnKernel(const int64_t* __restrict__ counts, int64_t E, int64_t k,
                                    int64_t tokens, float coef, float grad,
                                    float* __restrict__ col) {
  SY_GRID_STRIDE(e, E) {
    const double T = static_cast<double>(tokens);
    const double f = __ddiv_rn(static_cast<double>(AssignmentsOf(counts, E, k, e)),
                               __dmul_rn(T, static_cast<double>(k)));
    const double g = __dmul_rn(__dmul_rn(static_cast<double>(grad), static_cast<double>(coef)),
                               static_cast<double>(E));
    col[e] = static_cast<float>(__ddiv_rn(__dmul_rn(g, f), T));
  }
}

__global__ void AddColumnKernel(float* __restrict__ x, const float* __restrict__ col, int64_t n,
                                int64_t E) {
  SY_GRID_STRIDE(i, n) { x[i] = __fadd_rn(x[i], col[i % E]); }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::balance_loss
