// The device code of the load-balancing loss from its device sums (kernels/cuda/
// balance_loss.cu, which launches it): the loss value and counts, and the gradient column
// added to every row of dprobs. Every double operation is an explicit round-to-nearest
// intrinsic (no fused multiply-add): the host's bits.
#pragma once

#include <cstdint>

#include "kernels/cuda/device_common.cuh"
#include "kernels/write.h"

namespace switchyard::kernels::cuda::balance_loss {
// Internal linkage: the emulation test compiles these kernels too, and links with the .cu's.
namespace {

__device__ __forceinline__ int64_t AssignmentsOf(const int64_t* counts, int64_t E, int64_t k,
                                                 int64_t e) {
  int64_t a = 0;
  for (int64_t j = 0; j < k; ++j) a += counts[j * E + e];
  return a;
}

// moe::LoadBalancingLossFromSums' value of one group's (or part's) sums: f32(coef (E dot /
// (T k T))), dot = sum_e a_e s_e in expert order; 0 when T = 0.
__device__ __forceinline__ float BalanceAux(const int64_t* counts, const float* prob_sums,
                                            int64_t E, int64_t k, int64_t tokens, float coef) {
  if (tokens == 0) return 0.0f;
  double dot = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    const double a = static_cast<double>(AssignmentsOf(counts, E, k, e));
    dot = __dadd_rn(dot, __dmul_rn(a, static_cast<double>(prob_sums[e])));
  }
  const double T = static_cast<double>(tokens);
  const double den = __dmul_rn(__dmul_rn(T, static_cast<double>(k)), T);
  const double ratio = __ddiv_rn(__dmul_rn(static_cast<double>(E), dot), den);
  return static_cast<float>(__dmul_rn(static_cast<double>(coef), ratio));
}

// moe::LoadBalancingLossBackward's column entry e: f32(((grad * coef) * E) * f_e / T),
// f_e = a_e / (T * k); tokens > 0.
__device__ __forceinline__ float BalanceColumnAt(const int64_t* counts, int64_t E, int64_t k,
                                                 int64_t tokens, float coef, float grad,
                                                 int64_t e) {
  const double T = static_cast<double>(tokens);
  const double f = __ddiv_rn(static_cast<double>(AssignmentsOf(counts, E, k, e)),
                             __dmul_rn(T, static_cast<double>(k)));
  const double g = __dmul_rn(__dmul_rn(static_cast<double>(grad), static_cast<double>(coef)),
                             static_cast<double>(E));
  return static_cast<float>(__ddiv_rn(__dmul_rn(g, f), T));
}

// One thread: values = {aux, a_0..a_{E-1}, bad}.
__global__ void BalanceValuesKernel(const int64_t* __restrict__ counts,
                                    const float* __restrict__ prob_sums, int64_t E, int64_t k,
                                    int64_t tokens, float coef, double* __restrict__ values) {
  for (int64_t e = 0; e < E; ++e) values[1 + e] = static_cast<double>(AssignmentsOf(counts, E, k, e));
  values[0] = static_cast<double>(BalanceAux(counts, prob_sums, E, k, tokens, coef));
  values[E + 1] = static_cast<double>(counts[k * E]);
}

// col[e] = BalanceColumnAt(e).
__global__ void BalanceColumnKernel(const int64_t* __restrict__ counts, int64_t E, int64_t k,
                                    int64_t tokens, float coef, float grad,
                                    float* __restrict__ col) {
  SY_GRID_STRIDE(e, E) { col[e] = BalanceColumnAt(counts, E, k, tokens, coef, grad, e); }
}

// x[i] += col[i % E] (kSet: +0 + col[i % E], x unread).
__global__ void AddColumnKernel(float* __restrict__ x, const float* __restrict__ col, int64_t n,
                                int64_t E, Write write) {
  SY_GRID_STRIDE(i, n) { x[i] = __fadd_rn(write == Write::kSet ? 0.0f : x[i], col[i % E]); }
}

// ---- Parts of part_tokens rows (the sequence scope) -----------------------------------

// The rows of part p of a group of T.
__device__ __forceinline__ int64_t PartRows(int64_t T, int64_t part_tokens, int64_t p) {
  const int64_t r0 = p * part_tokens;
  return (T - r0 < part_tokens ? T - r0 : part_tokens);
}

// counts (P, k E + 1), zeroed: row t / part_tokens counts slot (t, j)'s expert (the last
// entry of the row an index outside [0, E)). Integer atomics: exact in any order.
__global__ void PartSlotCountsKernel(const int32_t* __restrict__ indices, int64_t n, int64_t k,
                                     int64_t E, int64_t part_tokens,
                                     unsigned long long* __restrict__ counts) {
  SY_GRID_STRIDE(i, n) {
    const int64_t t = i / k, j = i % k, e = indices[i];
    unsigned long long* c = counts + (t / part_tokens) * (k * E + 1);
    atomicAdd(e < 0 || e >= E ? &c[k * E] : &c[j * E + e], 1ull);
  }
}

// sums (P, E): thread (p, e) adds column e of part p's rows in double in row order and
// rounds once (cpu::ProbColumnSums' bits); consecutive threads read consecutive e.
__global__ void PartColumnSumsKernel(const float* __restrict__ probs, int64_t T, int64_t E,
                                     int64_t part_tokens, int64_t parts,
                                     float* __restrict__ sums) {
  SY_GRID_STRIDE(i, parts * E) {
    const int64_t p = i / E, e = i % E, r0 = p * part_tokens;
    const int64_t r1 = r0 + PartRows(T, part_tokens, p);
    double acc = 0.0;
    for (int64_t r = r0; r < r1; ++r) acc = __dadd_rn(acc, static_cast<double>(probs[r * E + e]));
    sums[i] = static_cast<float>(acc);
  }
}

// One thread: value[0] = f32(sum_p aux_p / P), the sum in double in part order.
__global__ void PartBalanceValueKernel(const int64_t* __restrict__ counts,
                                       const float* __restrict__ prob_sums, int64_t T,
                                       int64_t part_tokens, int64_t parts, int64_t E, int64_t k,
                                       float coef, double* __restrict__ value) {
  double sum = 0.0;
  for (int64_t p = 0; p < parts; ++p) {
    const float aux = BalanceAux(counts + p * (k * E + 1), prob_sums + p * E, E, k,
                                 PartRows(T, part_tokens, p), coef);
    sum = __dadd_rn(sum, static_cast<double>(aux));
  }
  value[0] = static_cast<double>(static_cast<float>(__ddiv_rn(sum, static_cast<double>(parts))));
}

// cols (P, E): part p's column with grad part_grad (its rows > 0).
__global__ void PartBalanceColumnsKernel(const int64_t* __restrict__ counts, int64_t T,
                                         int64_t part_tokens, int64_t parts, int64_t E,
                                         int64_t k, float coef, float part_grad,
                                         float* __restrict__ cols) {
  SY_GRID_STRIDE(i, parts * E) {
    const int64_t p = i / E, e = i % E;
    cols[i] = BalanceColumnAt(counts + p * (k * E + 1), E, k, PartRows(T, part_tokens, p), coef,
                              part_grad, e);
  }
}

// x (T, E)[i] += cols[part of row i / E][i % E] (kSet: +0 + it, x unread).
__global__ void AddPartColumnsKernel(float* __restrict__ x, const float* __restrict__ cols,
                                     int64_t n, int64_t E, int64_t part_tokens, Write write) {
  SY_GRID_STRIDE(i, n) {
    const float c = cols[(i / E / part_tokens) * E + i % E];
    x[i] = __fadd_rn(write == Write::kSet ? 0.0f : x[i], c);
  }
}

// ---- The global scope: f = load ---------------------------------------------------------

// One thread: value[0] = f32(coef (E dot / T)), dot = sum_e load_e s_e in expert order.
__global__ void GlobalBalanceValueKernel(const float* __restrict__ load,
                                         const float* __restrict__ prob_sums, int64_t E,
                                         int64_t tokens, float coef, double* __restrict__ value) {
  float aux = 0.0f;
  if (tokens != 0) {
    double dot = 0.0;
    for (int64_t e = 0; e < E; ++e) {
      dot = __dadd_rn(dot, __dmul_rn(static_cast<double>(load[e]),
                                     static_cast<double>(prob_sums[e])));
    }
    const double ratio = __ddiv_rn(__dmul_rn(static_cast<double>(E), dot),
                                   static_cast<double>(tokens));
    aux = static_cast<float>(__dmul_rn(static_cast<double>(coef), ratio));
  }
  value[0] = static_cast<double>(aux);
}

// col[e] = f32((((grad * coef) * E) * load_e) / T); tokens > 0.
__global__ void GlobalBalanceColumnKernel(const float* __restrict__ load, int64_t E,
                                          int64_t tokens, float coef, float grad,
                                          float* __restrict__ col) {
  SY_GRID_STRIDE(e, E) {
    const double g = __dmul_rn(__dmul_rn(static_cast<double>(grad), static_cast<double>(coef)),
                               static_cast<double>(E));
    col[e] = static_cast<float>(
        __ddiv_rn(__dmul_rn(g, static_cast<double>(load[e])), static_cast<double>(tokens)));
  }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::balance_loss
