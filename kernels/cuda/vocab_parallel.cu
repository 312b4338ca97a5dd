// CUDA implementation of kernels/vocab_parallel.h: one thread per row for the row
// reductions (a loop over this rank's vocabulary columns in the CPU's order, so the results
// equal the CPU's up to expf), one thread per element for the rest. No atomics.
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/vocab_parallel.h"

namespace switchyard::kernels::cuda {
namespace {

__global__ void LocalIdsKernel(const int32_t* ids, int64_t n, int64_t start, int64_t valid,
                               int32_t trash, int32_t* out) {
  SY_GRID_STRIDE(i, n) {
    const int64_t l = static_cast<int64_t>(ids[i]) - start;
    out[i] = l >= 0 && l < valid ? static_cast<int32_t>(l) : trash;
  }
}

__global__ void RowMaxKernel(const float* x, int64_t n, int64_t c, int64_t valid, float* out) {
  SY_GRID_STRIDE(r, n) {
    float best = -INFINITY;
    for (int64_t j = 0; j < valid; ++j) best = fmaxf(best, x[r * c + j]);
    out[r] = best;
  }
}

__global__ void ExpSumKernel(const float* x, int64_t n, int64_t c, int64_t valid,
                             const float* m, float* out) {
  SY_GRID_STRIDE(r, n) {
    double sum = 0;
    for (int64_t j = 0; j < valid; ++j) sum += exp(static_cast<double>(__fsub_rn(x[r * c + j], m[r])));
    out[r] = static_cast<float>(sum);
  }
}

__global__ void TargetLogitKernel(const float* x, const int32_t* t, int64_t n, int64_t c,
                                  int64_t start, int64_t valid, float* out) {
  SY_GRID_STRIDE(r, n) {
    const int64_t l = static_cast<int64_t>(t[r]) - start;
    out[r] = l >= 0 && l < valid ? x[r * c + l] : 0.0f;
  }
}

__global__ void SoftmaxGradKernel(const float* x, const int32_t* t, int64_t n, int64_t c,
                                  int64_t start, int64_t valid, const float* m, const float* s,
                                  float scale, int32_t ignore, float* d) {
  SY_GRID_STRIDE(i, n * c) {
    const int64_t r = i / c, j = i % c;
    float g = 0.0f;
    if (t[r] != ignore && j < valid) {
      const float p = __fdiv_rn(static_cast<float>(exp(static_cast<double>(__fsub_rn(x[i], m[r])))), s[r]);
      const int64_t target = static_cast<int64_t>(t[r]) - start;
      g = __fmul_rn(scale, __fsub_rn(p, j == target ? 1.0f : 0.0f));
    }
    d[i] = g;
  }
}

}  // namespace

void VocabShardLocalIds(const Tensor& ids, int64_t vocab_start, int64_t valid, int32_t trash,
                        Tensor& local, DeviceContext* ctx) {
  const int64_t n = ids.numel();
  if (n == 0) return;
  LocalIdsKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(ids.data<int32_t>(), n, vocab_start,
                                                        valid, trash, local.data<int32_t>());
  SY_CUDA_CHECK(cudaGetLastError());
}

void VocabShardRowMax(const Tensor& logits, int64_t valid, Tensor& out, DeviceContext* ctx) {
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  RowMaxKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(logits.data<float>(), n, logits.dim(1),
                                                      valid, out.data<float>());
  SY_CUDA_CHECK(cudaGetLastError());
}

void VocabShardExpSum(const Tensor& logits, int64_t valid, const Tensor& row_max, Tensor& out,
                      DeviceContext* ctx) {
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  ExpSumKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(logits.data<float>(), n, logits.dim(1),
                                                      valid, row_max.data<float>(),
                                                      out.data<float>());
  SY_CUDA_CHECK(cudaGetLastError());
}

void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, Tensor& out, DeviceContext* ctx) {
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  TargetLogitKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(
      logits.data<float>(), targets.data<int32_t>(), n, logits.dim(1), vocab_start, valid,
      out.data<float>());
  SY_CUDA_CHECK(cudaGetLastError());
}

void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits,
                           DeviceContext* ctx) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  if (n * c == 0) return;
  SoftmaxGradKernel<<<GridFor(n * c), 256, 0, StreamOf(ctx)>>>(
      logits.data<float>(), targets.data<int32_t>(), n, c, vocab_start, valid,
      row_max.data<float>(), exp_sum.data<float>(), grad_scale, ignore_index,
      dlogits.data<float>());
  SY_CUDA_CHECK(cudaGetLastError());
}

}  // namespace switchyard::kernels::cuda
