// CUDA implementation of kernels/balance_loss.h. The sums are a few hundred numbers: one
// thread adds the dot product in expert order (as the host loop), and each expert's column
// entry is one thread's; every double operation is an explicit round-to-nearest intrinsic
// (no fused multiply-add), so the values are the host's bits.
#include "kernels/balance_loss.h"
#include "kernels/cuda/common.cuh"

namespace switchyard::kernels::cuda {
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

void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values, DeviceContext* ctx) {
  BalanceValuesKernel<<<1, 1, 0, StreamOf(ctx)>>>(counts.data<int64_t>(),
                                                  prob_sums.data<float>(), prob_sums.numel(),
                                                  top_k, tokens, coef, values.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, DeviceContext* ctx) {
  const int64_t E = dprobs.dim(1), n = dprobs.numel();
  if (tokens == 0 || n == 0) return;
  Tensor col = Tensor::Empty({E}, DType::kF32, dprobs.device());
  BalanceColumnKernel<<<GridFor(E), 256, 0, StreamOf(ctx)>>>(counts.data<int64_t>(), E, top_k,
                                                             tokens, coef, grad,
                                                             col.data<float>());
  SY_CUDA_CHECK_LAUNCH();
  AddColumnKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(dprobs.data<float>(),
                                                         col.data<float>(), n, E);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
