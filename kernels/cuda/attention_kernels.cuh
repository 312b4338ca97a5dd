// The device code of the exact f32 attention (kernels/cuda/attention.cu, which launches it
// between its cuBLAS products and describes the design): the masked row softmax, the masked
// exp of the backward, the masked softmax backward, and the warp-per-row delta and merge of the
// ring-attention blocks; with the launch shapes, which the .cu and the emulation test
// (tests/kernels/attention_emulation_test.cc) both take from here.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda::attention_dev {
// Internal linkage: the emulation test compiles these kernels too, and links with
// attention.cu's.
namespace {

constexpr int kThreads = 256;  // block of the grid-stride MaskedExpKernel

// Threads per row block: a multiple of 32 (BlockSum/BlockMax), no more than the row needs.
inline int RowThreads(int64_t s) { return s <= 32 ? 32 : s <= 64 ? 64 : s <= 128 ? 128 : 256; }

// Keys row r of a chunk's (nb, Hq, S, S) scores sees: j < len, query position i = r % S.
__device__ __forceinline__ int64_t VisibleKeys(int64_t r, int64_t s, bool causal) {
  return causal ? r % s + 1 : s;
}

// One block per score row r of a chunk laid out (nb, Hq, S, S) as rows of S. In place:
// p[r, j] = softmax over the visible j of the scores, 0 for the others; lse[r] = logsumexp
// of the row (the chunk's lse rows are laid out the same way).
__global__ void MaskedSoftmaxKernel(float* p, float* lse, int64_t s, bool causal) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const int64_t len = VisibleKeys(r, s, causal);
  float* row = p + r * s;
  float row_max = -INFINITY;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) row_max = fmaxf(row_max, row[j]);
  row_max = BlockMax(row_max, shared, -INFINITY);
  float sum = 0.0f;
  for (int64_t j = threadIdx.x; j < len; j += blockDim.x) sum += expf(row[j] - row_max);
  sum = BlockSum(sum, shared);  // >= 1: the max term is exp(0)
  const float inv = 1.0f / sum;
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    row[j] = j < len ? expf(row[j] - row_max) * inv : 0.0f;
  }
  if (threadIdx.x == 0) lse[r] = row_max + logf(sum);
}

// Elementwise over a chunk's (nb, Hq, S, S) scores: p = exp(s - lse[row]) for the visible
// keys, else 0.
__global__ void MaskedExpKernel(float* p, const float* lse, int64_t s, int64_t n, bool causal) {
  SY_GRID_STRIDE(idx, n) {
    const int64_t r = idx / s, j = idx % s;
    p[idx] = j < VisibleKeys(r, s, causal) ? expf(p[idx] - lse[r]) : 0.0f;
  }
}

// One block per row: the softmax backward of row r over its visible keys, in place in dp:
//   ds[r, j] = p[r, j] (dp[r, j] - dot[r]), 0 for the masked j,
// with dot[r] = sum over the visible j' of p[r, j'] dp[r, j'], or delta[r] when delta is not
// null (the row's softmax spans more keys than this block; delta is laid out like lse).
__global__ void MaskedSoftmaxBackwardKernel(const float* p, float* dp, const float* delta,
                                            int64_t s, bool causal) {
  __shared__ float shared[32];
  const int64_t r = blockIdx.x;
  const int64_t len = VisibleKeys(r, s, causal);
  const float* prow = p + r * s;
  float* drow = dp + r * s;
  float dot = 0.0f;
  if (delta != nullptr) {  // uniform over the block
    dot = delta[r];
  } else {
    for (int64_t j = threadIdx.x; j < len; j += blockDim.x) dot += prow[j] * drow[j];
    dot = BlockSum(dot, shared);
  }
  for (int64_t j = threadIdx.x; j < s; j += blockDim.x) {
    drow[j] = j < len ? prow[j] * (drow[j] - dot) : 0.0f;
  }
}

// Rows of (b, i, h) per block of the warp-per-row kernels below.
constexpr int kWarpsPerBlock = 8;

// One warp per row (b, i, h) of out, dout (B, S, Hq, hd): delta[(b Hq + h) S + i] =
// sum_e dout[row, e] out[row, e], summed in double as on the CPU. out: f32, or the bf16 out
// kept under bf16 activation storage (widened as read).
template <typename TO>
__global__ void DeltaKernel(const TO* out, const float* dout, float* delta, int64_t s,
                            int64_t hq, int64_t hd, int64_t rows) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;  // the whole warp leaves together
  const TO* o = out + row * hd;
  const float* g = dout + row * hd;
  double dot = 0.0;
  for (int64_t e = lane; e < hd; e += 32) dot += static_cast<double>(g[e]) * LoadF32(o, e);
  dot = WarpSum(dot);
  if (lane == 0) {
    const int64_t h = row % hq, i = (row / hq) % s, b = row / (hq * s);
    delta[(b * hq + h) * s + i] = static_cast<float>(dot);
  }
}

// One warp per row (b, i, h): the online-softmax merge of kernels/attention.h. Every lane
// reads the row's lse before lane 0 overwrites it.
__global__ void MergeKernel(float* out, float* lse, const float* out_b, const float* lse_b,
                            int64_t s, int64_t hq, int64_t hd, int64_t rows) {
  const int64_t row = blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + threadIdx.x / 32;
  const int lane = threadIdx.x % 32;
  if (row >= rows) return;
  const int64_t h = row % hq, i = (row / hq) % s, b = row / (hq * s);
  const int64_t r = (b * hq + h) * s + i;
  const float la = lse[r], lb = lse_b[r];
  float* o = out + row * hd;
  const float* ob = out_b + row * hd;
  float merged;
  if (la == -INFINITY) {  // nothing seen yet: the block's values
    for (int64_t e = lane; e < hd; e += 32) o[e] = ob[e];
    merged = lb;
  } else {
    const float hi = fmaxf(la, lb), lo = fminf(la, lb);
    merged = hi + log1pf(expf(lo - hi));
    const float wa = expf(la - merged), wb = expf(lb - merged);
    for (int64_t e = lane; e < hd; e += 32) o[e] = o[e] * wa + ob[e] * wb;
  }
  __syncwarp();
  if (lane == 0) lse[r] = merged;
}

}  // namespace
}  // namespace switchyard::kernels::cuda::attention_dev
