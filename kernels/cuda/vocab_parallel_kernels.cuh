// The device code of the vocabulary-parallel pieces (kernels/cuda/vocab_parallel.cu, which
// launches it and describes the design): the row max and exp-sum, the target logit, the
// softmax gradient, the shard's embedding lookup and its backward over the sorted local rows;
// with the launch shapes, which the .cu and the emulation test
// (tests/kernels/vocab_parallel_emulation_test.cc) both take from here.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda::vocab_dev {
// Internal linkage: the emulation test compiles these kernels too, and links with
// vocab_parallel.cu's.
namespace {

constexpr int kThreads = 256;                  // block of the grid-stride kernels
constexpr int64_t kMaxRowBlocks = 65535 * 16;  // grid cap of the row and run kernels

// Threads for a row of `cols` elements: about four per thread, 32..1024.
inline int RowThreads(int64_t cols) {
  const int64_t t = ((cols + 3) / 4 + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 1024 ? 1024 : t));
}

inline unsigned RowBlocks(int64_t n, int64_t max_blocks = kMaxRowBlocks) {
  return static_cast<unsigned>(n < max_blocks ? n : max_blocks);
}

// Threads of ScatterAddRunsKernel for rows of d columns: a thread a column, 32..256.
inline int RunThreads(int64_t d) {
  return static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (d + 31) / 32 * 32)));
}

// The radix sort's key bits [0, KeyBits(rows)) for local rows in [0, rows] (rows: the
// sentinel of other ranks' ids).
inline int KeyBits(int64_t rows) {
  int end_bit = 1;
  while (end_bit < 31 && (int64_t{1} << end_bit) <= rows) ++end_bit;
  return end_bit;
}

// The local index of global id `id` in [start, start + count), or -1.
__device__ __forceinline__ int64_t LocalIndex(int32_t id, int64_t start, int64_t count) {
  const int64_t l = static_cast<int64_t>(id) - start;
  return l >= 0 && l < count ? l : -1;
}

__global__ void LocalIdsKernel(const int32_t* ids, int64_t n, int64_t start, int64_t valid,
                               int32_t trash, int32_t* out) {
  SY_GRID_STRIDE(i, n) {
    const int64_t l = LocalIndex(ids[i], start, valid);
    out[i] = l >= 0 ? static_cast<int32_t>(l) : trash;
  }
}

// x (n, c); out (n) = max of x[r, :valid].
__global__ void RowMaxKernel(const float* x, int64_t n, int64_t c, int64_t valid, float* out) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    float best = -INFINITY;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) best = fmaxf(best, x[r * c + j]);
    best = BlockMax(best, shared, -INFINITY);
    if (threadIdx.x == 0) out[r] = best;
  }
}

// x (n, c); out (n) = sum of exp(x[r, :valid] - m[r]).
__global__ void ExpSumKernel(const float* x, int64_t n, int64_t c, int64_t valid,
                             const float* m, float* out) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float max = m[r];
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
      sum += expf(__fsub_rn(x[r * c + j], max));
    }
    sum = BlockSum(sum, shared);
    if (threadIdx.x == 0) out[r] = static_cast<float>(sum);
  }
}

__global__ void TargetLogitKernel(const float* x, const int32_t* t, int64_t n, int64_t c,
                                  int64_t start, int64_t valid, int32_t ignore, float* out) {
  SY_GRID_STRIDE(r, n) {
    const int64_t l = t[r] == ignore ? -1 : LocalIndex(t[r], start, valid);
    out[r] = l >= 0 ? x[r * c + l] : 0.0f;
  }
}

__global__ void SoftmaxGradKernel(const float* x, const int32_t* t, int64_t n, int64_t c,
                                  int64_t start, int64_t valid, const float* m, const float* s,
                                  float scale, int32_t ignore, float* d) {
  SY_GRID_STRIDE(i, n * c) {
    const int64_t r = i / c, j = i % c;
    float g = 0.0f;
    if (t[r] != ignore && j < valid) {
      const float p = __fdiv_rn(expf(__fsub_rn(x[i], m[r])), s[r]);
      const bool is_target = j == LocalIndex(t[r], start, valid);
      g = __fmul_rn(scale, __fsub_rn(p, is_target ? 1.0f : 0.0f));
    }
    d[i] = g;
  }
}

// out (n, d)[i, :] = table (rows, d)[ids[i] - start, :] for this shard's ids, else 0.
__global__ void EmbeddingForwardKernel(const int32_t* ids, const float* table, int64_t n,
                                       int64_t d, int64_t start, int64_t rows, float* out) {
  SY_GRID_STRIDE(e, n * d) {
    const int64_t i = e / d, j = e % d;
    const int64_t l = LocalIndex(ids[i], start, rows);
    out[e] = l >= 0 ? table[l * d + j] : 0.0f;
  }
}

__global__ void IotaKernel(int32_t* out, int64_t n) {
  SY_GRID_STRIDE(i, n) out[i] = static_cast<int32_t>(i);
}

// sorted_rows / positions (n): local rows in increasing order (`rows` = not this shard's),
// each with its position. The block at the head of each run of one local row adds the
// run's dout rows into dtable (rows, d) in position order.
__global__ void ScatterAddRunsKernel(const int32_t* sorted_rows, const int32_t* positions,
                                     int64_t n, const float* dout, float* dtable, int64_t d,
                                     int64_t rows) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const int32_t row = sorted_rows[k];
    if (row >= rows) continue;
    if (k > 0 && sorted_rows[k - 1] == row) continue;  // not the head of its run
    int64_t end = k + 1;
    while (end < n && sorted_rows[end] == row) ++end;
    float* dst = dtable + static_cast<int64_t>(row) * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = dst[j];
      for (int64_t q = k; q < end; ++q) acc = __fadd_rn(acc, dout[positions[q] * d + j]);
      dst[j] = acc;
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::vocab_dev
