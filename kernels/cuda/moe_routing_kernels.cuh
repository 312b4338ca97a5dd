// The device code of the MoE router (kernels/cuda/moe_routing.cu, which launches it and states
// how its results compare with the CPU's): the fused softmax + top-k + GShard keep, its
// backward to the logits, slot counts, the prob column sums, the z-loss and the expert-bias
// update; and the launch shapes and host constants the .cu computes from the sizes.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/philox.h"
#include "kernels/cuda/device_common.cuh"
#include "kernels/write.h"

namespace switchyard::kernels::cuda::routing {
// Internal linkage: the emulation test compiles these kernels too, and links with the .cu's.
namespace {

constexpr int kWarpsPerBlock = 4;  // per-token kernels: one warp per token
constexpr int kTokenThreads = 32 * kWarpsPerBlock;
// RouterTopK marks the chosen experts of a token in one 64-bit mask per lane.
constexpr int64_t kMaxTopKExperts = 32 * 64;

// Blocks of kTokenThreads for T tokens (one warp each).
inline unsigned TokenBlocks(int64_t tokens) {
  return static_cast<unsigned>((tokens + kWarpsPerBlock - 1) / kWarpsPerBlock);
}

// The token of this warp (uniform across the warp, so a warp exits whole).
__device__ __forceinline__ int64_t WarpToken() {
  return blockIdx.x * static_cast<int64_t>(kWarpsPerBlock) + (threadIdx.x >> 5);
}

// expf as the CPU's std::exp(float) computes it to within its last-place rounding: exp in
// double, rounded to f32 once.
__device__ __forceinline__ float ExpF(float x) {
  return static_cast<float>(exp(static_cast<double>(x)));
}

// ---- RouterTopK -----------------------------------------------------------------------

// One candidate of the top-k search: its score (probs + bias), expert and prob. i = INT_MAX
// is "no candidate".
struct Candidate {
  float s;
  int i;
  float p;
};

// Whether a comes before b in choice order: larger score, ties to the smaller expert.
__device__ __forceinline__ bool Before(const Candidate& a, const Candidate& b) {
  if (b.i == INT_MAX) return a.i != INT_MAX;
  if (a.i == INT_MAX) return false;
  return a.s > b.s || (a.s == b.s && a.i < b.i);
}

// Warp (T, E) softmax, then k rounds of a warp argmax over the experts not chosen yet. Lane
// l owns experts l, l + 32, ...; bit s of `chosen` marks expert l + 32 s as taken.
__global__ void RouterTopKKernel(const float* __restrict__ logits, const float* __restrict__ bias,
                                 int64_t T, int E, int k, bool normalize, bool random_second,
                                 RngKey key, int64_t first_token, float* __restrict__ probs,
                                 int32_t* __restrict__ indices, float* __restrict__ gates,
                                 uint8_t* __restrict__ keep, const int64_t* at = nullptr,
                                 int64_t token_offset = 0) {
  // at (kernels::DeviceRng's {stream, first_token}), when not null: the draw's stream and
  // first token are read here (per_token is 1 for the second-expert draw).
  if (at != nullptr) {
    key.stream = static_cast<uint64_t>(at[0]);
    first_token = at[1] + token_offset;
  }
  const int64_t t = WarpToken();
  if (t >= T) return;
  const int lane = threadIdx.x & 31;
  const float* l = logits + t * E;
  float* p = probs + t * E;

  float m = -INFINITY;
  for (int e = lane; e < E; e += 32) m = fmaxf(m, l[e]);
  m = WarpMax(m);
  double sum = 0.0;
  for (int e = lane; e < E; e += 32) sum += static_cast<double>(ExpF(l[e] - m));
  sum = WarpSum(sum);
  const float inv = static_cast<float>(1.0 / sum);
  for (int e = lane; e < E; e += 32) p[e] = ExpF(l[e] - m) * inv;  // read back below by this lane

  uint64_t chosen = 0;
  float gate_sum = 0.0f, p1 = 0.0f, p2 = 0.0f;
  for (int j = 0; j < k; ++j) {
    Candidate best{-INFINITY, INT_MAX, 0.0f};
    for (int e = lane, s = 0; e < E; e += 32, ++s) {
      if (chosen >> s & 1) continue;
      const float pe = p[e];
      const Candidate c{bias != nullptr ? pe + bias[e] : pe, e, pe};
      if (Before(c, best)) best = c;
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      Candidate other{__shfl_xor_sync(kFullMask, best.s, offset),
                      __shfl_xor_sync(kFullMask, best.i, offset),
                      __shfl_xor_sync(kFullMask, best.p, offset)};
      if (Before(other, best)) best = other;
    }
    // Lane 0's winner for everyone (the butterfly agrees on every lane unless scores are NaN).
    const int w = __shfl_sync(kFullMask, best.i, 0);
    const float wp = __shfl_sync(kFullMask, best.p, 0);
    if ((w & 31) == lane) chosen |= uint64_t{1} << (w >> 5);
    gate_sum += wp;
    if (j == 0) p1 = wp;
    if (j == 1) p2 = wp;
    if (lane == 0) {
      indices[t * k + j] = w;
      gates[t * k + j] = wp;
      keep[t * k + j] = 1;
    }
  }
  if (lane == 0) {
    if (normalize) {
      for (int j = 0; j < k; ++j) gates[t * k + j] = gates[t * k + j] / gate_sum;
    }
    // GShard: keep the second expert iff u < 2 * p2 / (p1 + p2).
    if (random_second) {
      const float g2 = p2 / (p1 + p2);
      const float u = UniformAt(key, static_cast<uint64_t>(first_token + t));
      keep[t * k + 1] = u < 2.0f * g2 ? 1 : 0;
    }
  }
}

// ---- RouterBackwardLogits -------------------------------------------------------------

// The gates' and dprobs' gradient on prob e of a token (double, as the CPU's dp[e]).
// Products and sums rounded once each (__dmul_rn / __dadd_rn) to follow the CPU exactly.
__device__ __forceinline__ double ProbGrad(int e, const int32_t* idx, const float* dg, int k,
                                           bool normalize, double dot_g, double sum_p,
                                           double extra) {
  double dp = extra;
  for (int j = 0; j < k; ++j) {
    if (idx[j] != e) continue;
    const double d = normalize ? (static_cast<double>(dg[j]) - dot_g) / sum_p
                               : static_cast<double>(dg[j]);
    dp = __dadd_rn(dp, d);
  }
  return dp;
}

__global__ void RouterBackwardLogitsKernel(const float* __restrict__ probs,
                                           const int32_t* __restrict__ indices,
                                           const float* __restrict__ gates,
                                           const float* __restrict__ dgates,
                                           const float* __restrict__ dprobs,
                                           const float* __restrict__ dlogits_extra, int64_t T,
                                           int E, int k, bool normalize,
                                           float* __restrict__ dlogits) {
  const int64_t t = WarpToken();
  if (t >= T) return;
  const int lane = threadIdx.x & 31;
  const float* p = probs + t * E;
  const int32_t* idx = indices + t * k;
  const float* dg = dgates + t * k;
  const float* g = gates + t * k;
  // Every lane computes the token's gate sums itself, in the CPU's order.
  double sum_p = 0.0, dot_g = 0.0;
  if (normalize) {
    for (int j = 0; j < k; ++j) {
      const int e = idx[j];
      if (e >= 0 && e < E) sum_p = __dadd_rn(sum_p, static_cast<double>(p[e]));
      dot_g = __dadd_rn(dot_g, __dmul_rn(static_cast<double>(dg[j]), static_cast<double>(g[j])));
    }
  }
  // Softmax: dl_e = p_e * (dp_e - sum_j p_j dp_j).
  double dot = 0.0;
  for (int e = lane; e < E; e += 32) {
    const double extra = dprobs != nullptr ? static_cast<double>(dprobs[t * E + e]) : 0.0;
    const double dp = ProbGrad(e, idx, dg, k, normalize, dot_g, sum_p, extra);
    dot = __dadd_rn(dot, __dmul_rn(static_cast<double>(p[e]), dp));
  }
  dot = WarpSum(dot);
  for (int e = lane; e < E; e += 32) {
    const double extra = dprobs != nullptr ? static_cast<double>(dprobs[t * E + e]) : 0.0;
    const double dp = ProbGrad(e, idx, dg, k, normalize, dot_g, sum_p, extra);
    double v = __dmul_rn(static_cast<double>(p[e]), dp - dot);
    if (dlogits_extra != nullptr) v = __dadd_rn(v, static_cast<double>(dlogits_extra[t * E + e]));
    dlogits[t * E + e] = static_cast<float>(v);
  }
}

// ---- Counts ---------------------------------------------------------------------------

// counts (k * E + 1), zeroed: [j * E + e] += 1 per kept assignment, [k * E] per bad index.
__global__ void CountSlotAssignmentsKernel(const int32_t* __restrict__ indices,
                                           const uint8_t* __restrict__ keep, int64_t n, int k,
                                           int E, unsigned long long* __restrict__ counts) {
  SY_GRID_STRIDE(i, n) {
    const int e = indices[i];
    if (e < 0 || e >= E) {
      atomicAdd(&counts[static_cast<int64_t>(k) * E], 1ull);
    } else if (keep == nullptr || keep[i] != 0) {
      atomicAdd(&counts[static_cast<int64_t>(i % k) * E + e], 1ull);
    }
  }
}

// counts (L * E + 1) f64: [l * E + e] += 1 per assignment of a label-l token (l in [0, L)),
// [L * E] per such token's index outside [0, E). Integer sums in f64 atomics: exact.
__global__ void AddLabelAssignmentCountsKernel(const int32_t* __restrict__ indices,
                                               const int32_t* __restrict__ labels, int64_t n,
                                               int k, int L, int E,
                                               double* __restrict__ counts) {
  SY_GRID_STRIDE(i, n) {
    const int label = labels[i / k];
    if (label < 0 || label >= L) continue;
    const int e = indices[i];
    atomicAdd(&counts[e < 0 || e >= E ? static_cast<int64_t>(L) * E
                                      : static_cast<int64_t>(label) * E + e],
              1.0);
  }
}

// ---- ProbColumnSums -------------------------------------------------------------------

constexpr int kSumCols = 32;      // columns per block (one per lane: coalesced rows)
constexpr int kSumRowLanes = 8;   // threads down each column
constexpr int64_t kMaxSumChunks = 1024;

// The partial sums' launch: grid (col_tiles, chunks) of (kSumCols, kSumRowLanes) blocks,
// chunk c being rows [c rows_per_chunk, min(T, (c + 1) rows_per_chunk)); chunks = 0 for T = 0.
struct ColumnSumShape {
  int64_t chunks = 0;
  int64_t rows_per_chunk = 0;
  unsigned col_tiles = 0;
};
inline ColumnSumShape ColumnSumShapeOf(int64_t T, int64_t E,
                                       int64_t max_chunks = kMaxSumChunks) {
  ColumnSumShape s;
  s.chunks = (T + 255) / 256 < max_chunks ? (T + 255) / 256 : max_chunks;
  s.rows_per_chunk = s.chunks > 0 ? (T + s.chunks - 1) / s.chunks : 0;
  s.col_tiles = static_cast<unsigned>((E + kSumCols - 1) / kSumCols);
  return s;
}

// partial[chunk * E + c] = sum of probs[rows of the chunk, c] in double, in a fixed order:
// thread y sums rows y, y + 8, ... of the chunk, then the 8 partials in order of y.
__global__ void ColumnPartialSumsKernel(const float* __restrict__ probs, int64_t T, int E,
                                        int64_t rows_per_chunk, double* __restrict__ partial) {
  __shared__ double part[kSumRowLanes][kSumCols];
  const int c = blockIdx.x * kSumCols + threadIdx.x;
  const int64_t begin = blockIdx.y * rows_per_chunk;
  const int64_t end = begin + rows_per_chunk < T ? begin + rows_per_chunk : T;
  double acc = 0.0;
  if (c < E) {
    for (int64_t r = begin + threadIdx.y; r < end; r += kSumRowLanes) {
      acc += static_cast<double>(probs[r * E + c]);
    }
  }
  part[threadIdx.y][threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.y == 0 && c < E) {
    double total = 0.0;
    for (int y = 0; y < kSumRowLanes; ++y) total += part[y][threadIdx.x];
    partial[blockIdx.y * static_cast<int64_t>(E) + c] = total;
  }
}

// sums[c] = sum over chunks of partial[chunk * E + c], in chunk order, rounded to f32.
__global__ void ColumnFinalSumsKernel(const double* __restrict__ partial, int64_t chunks, int E,
                                      float* __restrict__ sums) {
  SY_GRID_STRIDE(c, E) {
    double total = 0.0;
    for (int64_t q = 0; q < chunks; ++q) total += partial[q * E + c];
    sums[c] = static_cast<float>(total);
  }
}

// x[i] += column[i % E] (kSet: +0 + column[i % E], x unread).
__global__ void AddColumnConstantsKernel(float* __restrict__ x, const float* __restrict__ column,
                                         int64_t n, int E, Write write) {
  SY_GRID_STRIDE(i, n) { x[i] = (write == Write::kSet ? 0.0f : x[i]) + column[i % E]; }
}

// ---- Z-loss ---------------------------------------------------------------------------

// ZLossKernel's grad_coef: the CPU's grad * coef * 2.0, left to right in double.
inline double ZLossGradCoef(float grad, float coef) {
  return static_cast<double>(grad) * coef * 2.0;
}

// Per token: lse = logsumexp in double; lse_sq[t] = lse^2 (when lse_sq is given) and
// dlogits[t, e] += scale(lse) * softmax_e (when dlogits is given; kSet: +0 + it, dlogits
// unread), the CPU's expressions.
__global__ void ZLossKernel(const float* __restrict__ logits, int64_t T, int E, double grad_coef,
                            int64_t n, double* __restrict__ lse_sq, float* __restrict__ dlogits,
                            Write write) {
  const int64_t t = WarpToken();
  if (t >= T) return;
  const int lane = threadIdx.x & 31;
  const float* l = logits + t * E;
  float mf = -INFINITY;
  for (int e = lane; e < E; e += 32) mf = fmaxf(mf, l[e]);
  const double m = static_cast<double>(WarpMax(mf));
  double sum = 0.0;
  for (int e = lane; e < E; e += 32) sum += exp(static_cast<double>(l[e]) - m);
  sum = WarpSum(sum);
  const double lse = m + log(sum);
  if (lse_sq != nullptr && lane == 0) lse_sq[t] = __dmul_rn(lse, lse);
  if (dlogits != nullptr) {
    // CPU: grad * coef * 2.0 * lse / n, left to right; grad_coef = grad * coef * 2.0.
    const double scale = __dmul_rn(grad_coef, lse) / static_cast<double>(n);
    for (int e = lane; e < E; e += 32) {
      const double v = __dmul_rn(scale, exp(static_cast<double>(l[e]) - m)) / sum;
      const float base = write == Write::kSet ? 0.0f : dlogits[t * E + e];
      dlogits[t * E + e] = base + static_cast<float>(v);
    }
  }
}

constexpr int kSumDoublesThreads = 1024;  // SumDoublesKernel's one block

// out[0] = sum of x[0, n) in double: one block, a fixed order.
__global__ void SumDoublesKernel(const double* __restrict__ x, int64_t n, double* out) {
  __shared__ double shared[32];
  double v = 0.0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) v += x[i];
  v = BlockSum(v, shared);
  if (threadIdx.x == 0) out[0] = v;
}

// value[0] = the f32 z-loss coef * sum / n (RouterZLoss's host expression, in double, one
// rounding to f32), as a double.
__global__ void ZLossValueKernel(const double* __restrict__ sum, float coef, int64_t n,
                                 double* __restrict__ value) {
  const double z = __ddiv_rn(__dmul_rn(static_cast<double>(coef), sum[0]), static_cast<double>(n));
  value[0] = static_cast<double>(static_cast<float>(z));
}

// ---- Expert bias ----------------------------------------------------------------------

// sign (E) of mean - c_i = sign(total - E * c_i), exactly, on the host.
inline std::vector<int32_t> ExpertBiasSigns(std::span<const int64_t> counts) {
  const int64_t E = static_cast<int64_t>(counts.size());
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  std::vector<int32_t> sign(E);
  for (int64_t i = 0; i < E; ++i) {
    const int64_t diff = total - E * counts[i];
    sign[i] = diff > 0 ? 1 : (diff < 0 ? -1 : 0);
  }
  return sign;
}

__global__ void UpdateExpertBiasKernel(float* __restrict__ bias,
                                       const int32_t* __restrict__ sign, int64_t E, float rate) {
  SY_GRID_STRIDE(i, E) {
    if (sign[i] > 0) bias[i] += rate;
    if (sign[i] < 0) bias[i] -= rate;
  }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::routing
