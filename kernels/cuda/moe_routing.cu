// CUDA implementation of kernels/moe_routing.h. Arguments are checked by
// kernels/moe_routing.cc. The CPU loops in kernels/cpu/moe_routing.cc are the reference:
//  - per-token ops (RouterTopK, RouterBackwardLogits, the z-loss) run one warp per token,
//    four tokens per 128-thread block; the per-token sums are in double like the CPU's
//    (exp is exp(double), rounded to f32 where the CPU rounds expf), so only the order of
//    the double sums differs and results agree to ~1 f32 ulp;
//  - counts use integer atomics (exact); the column sums a fixed two-level double sum (no
//    float atomics: deterministic);
//  - capacity admission is kernels/cuda/admission.cu.
#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/moe_routing.h"

namespace switchyard::kernels::cuda {
namespace {

constexpr int kWarpsPerBlock = 4;  // per-token kernels: one warp per token
constexpr int kTokenThreads = 32 * kWarpsPerBlock;
// RouterTopK marks the chosen experts of a token in one 64-bit mask per lane.
constexpr int64_t kMaxTopKExperts = 32 * 64;

unsigned TokenBlocks(int64_t tokens) {
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

// ---- ProbColumnSums -------------------------------------------------------------------

constexpr int kSumCols = 32;      // columns per block (one per lane: coalesced rows)
constexpr int kSumRowLanes = 8;   // threads down each column
constexpr int64_t kMaxSumChunks = 1024;

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

__global__ void AddColumnConstantsKernel(float* __restrict__ x, const float* __restrict__ column,
                                         int64_t n, int E) {
  SY_GRID_STRIDE(i, n) { x[i] += column[i % E]; }
}

// ---- Z-loss ---------------------------------------------------------------------------

// Per token: lse = logsumexp in double; lse_sq[t] = lse^2 (when lse_sq is given) and
// dlogits[t, e] += scale(lse) * softmax_e (when dlogits is given), the CPU's expressions.
__global__ void ZLossKernel(const float* __restrict__ logits, int64_t T, int E, double grad_coef,
                            int64_t n, double* __restrict__ lse_sq,
                            float* __restrict__ dlogits) {
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
      dlogits[t * E + e] += static_cast<float>(v);
    }
  }
}

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

__global__ void UpdateExpertBiasKernel(float* __restrict__ bias,
                                       const int32_t* __restrict__ sign, int64_t E, float rate) {
  SY_GRID_STRIDE(i, E) {
    if (sign[i] > 0) bias[i] += rate;
    if (sign[i] < 0) bias[i] -= rate;
  }
}

}  // namespace

void RouterTopK(const Tensor& logits, const Tensor& bias, bool normalize, bool random_second,
                RngKey second_key, int64_t first_token, Tensor& probs, Tensor& indices,
                Tensor& gates, Tensor& keep, DeviceContext* ctx) {
  const int64_t T = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
  SY_CHECK(E <= kMaxTopKExperts) << "RouterTopK on CUDA supports up to " << kMaxTopKExperts
                                 << " experts, got " << E;
  if (T == 0) return;
  RouterTopKKernel<<<TokenBlocks(T), kTokenThreads, 0, StreamOf(ctx)>>>(
      logits.data<float>(), bias.defined() ? bias.data<float>() : nullptr, T,
      static_cast<int>(E), static_cast<int>(k), normalize, random_second, second_key,
      first_token, probs.data<float>(), indices.data<int32_t>(), gates.data<float>(),
      keep.data<uint8_t>());
  SY_CUDA_CHECK_LAUNCH();
}

void RouterTopK(const Tensor& logits, const Tensor& bias, bool normalize, bool random_second,
                const DeviceRng& second, Tensor& probs, Tensor& indices, Tensor& gates,
                Tensor& keep, DeviceContext* ctx) {
  const int64_t T = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
  SY_CHECK(E <= kMaxTopKExperts) << "RouterTopK on CUDA supports up to " << kMaxTopKExperts
                                 << " experts, got " << E;
  SY_CHECK_EQ(second.per_token, 1) << "RouterTopK: the second-expert draw is one per token";
  if (T == 0) return;
  RouterTopKKernel<<<TokenBlocks(T), kTokenThreads, 0, StreamOf(ctx)>>>(
      logits.data<float>(), bias.defined() ? bias.data<float>() : nullptr, T,
      static_cast<int>(E), static_cast<int>(k), normalize, random_second,
      RngKey{second.seed, 0}, 0, probs.data<float>(), indices.data<int32_t>(),
      gates.data<float>(), keep.data<uint8_t>(), second.values.data<int64_t>(),
      second.token_offset);
  SY_CUDA_CHECK_LAUNCH();
}

void RouterBackwardLogits(const Tensor& probs, const Tensor& indices, const Tensor& gates,
                          const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, bool normalize, Tensor& dlogits,
                          DeviceContext* ctx) {
  const int64_t T = dlogits.dim(0), E = dlogits.dim(1), k = indices.dim(1);
  if (T == 0 || E == 0) return;
  RouterBackwardLogitsKernel<<<TokenBlocks(T), kTokenThreads, 0, StreamOf(ctx)>>>(
      probs.data<float>(), indices.data<int32_t>(), gates.data<float>(), dgates.data<float>(),
      dprobs.defined() ? dprobs.data<float>() : nullptr,
      dlogits_extra.defined() ? dlogits_extra.data<float>() : nullptr, T, static_cast<int>(E),
      static_cast<int>(k), normalize, dlogits.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void CountSlotAssignments(const Tensor& indices, const Tensor& keep, int64_t num_experts,
                          Tensor& counts, DeviceContext* ctx) {
  cudaStream_t stream = StreamOf(ctx);
  SY_CUDA_CHECK(cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), stream));
  const int64_t n = indices.numel();
  if (n == 0) return;
  CountSlotAssignmentsKernel<<<GridFor(n), 256, 0, stream>>>(
      indices.data<int32_t>(), keep.defined() ? keep.data<uint8_t>() : nullptr, n,
      static_cast<int>(indices.dim(1)), static_cast<int>(num_experts),
      reinterpret_cast<unsigned long long*>(counts.data<int64_t>()));
  SY_CUDA_CHECK_LAUNCH();
}

void ProbColumnSums(const Tensor& probs, Tensor& sums, DeviceContext* ctx) {
  const int64_t T = probs.dim(0), E = probs.dim(1);
  if (E == 0) return;
  cudaStream_t stream = StreamOf(ctx);
  const int64_t chunks = std::min<int64_t>((T + 255) / 256, kMaxSumChunks);
  const int64_t rows_per_chunk = chunks > 0 ? (T + chunks - 1) / chunks : 0;
  // Partial sums in double (an i64 tensor holds their bytes).
  Tensor partial = Tensor::Empty({std::max<int64_t>(chunks * E, 1)}, DType::kI64, ctx->device());
  double* pp = reinterpret_cast<double*>(partial.data<int64_t>());
  if (chunks > 0) {
    dim3 grid(static_cast<unsigned>((E + kSumCols - 1) / kSumCols), static_cast<unsigned>(chunks));
    dim3 block(kSumCols, kSumRowLanes);
    ColumnPartialSumsKernel<<<grid, block, 0, stream>>>(probs.data<float>(), T,
                                                        static_cast<int>(E), rows_per_chunk, pp);
    SY_CUDA_CHECK_LAUNCH();
  }
  ColumnFinalSumsKernel<<<GridFor(E), 256, 0, stream>>>(pp, chunks, static_cast<int>(E),
                                                        sums.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void AddColumnConstants(Tensor& x, std::span<const float> column, DeviceContext* ctx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  Tensor col = ToDevice(std::vector<float>(column.begin(), column.end()), ctx);
  AddColumnConstantsKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(
      x.data<float>(), col.data<float>(), n, static_cast<int>(x.dim(1)));
  SY_CUDA_CHECK_LAUNCH();
}

float RouterZLoss(const Tensor& logits, float coef, float grad, int64_t group_tokens,
                  Tensor* dlogits, bool want_value, DeviceContext* ctx) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const int64_t n = group_tokens > 0 ? group_tokens : T;
  if (T == 0) return 0.0f;
  cudaStream_t stream = StreamOf(ctx);
  const Device dev = ctx->device();
  // lse^2 per token, then their sum, in double (held as i64 tensors of the same size,
  // written before DType::kF64 existed).
  Tensor lse_sq, total;
  if (want_value) {
    lse_sq = Tensor::Empty({T}, DType::kI64, dev);
    total = Tensor::Empty({1}, DType::kI64, dev);
  }
  double* lp = want_value ? reinterpret_cast<double*>(lse_sq.data<int64_t>()) : nullptr;
  float* dl = dlogits != nullptr ? dlogits->data<float>() : nullptr;
  if (lp == nullptr && dl == nullptr) return 0.0f;
  const double grad_coef = static_cast<double>(grad) * coef * 2.0;
  ZLossKernel<<<TokenBlocks(T), kTokenThreads, 0, stream>>>(logits.data<float>(), T,
                                                            static_cast<int>(E), grad_coef, n,
                                                            lp, dl);
  SY_CUDA_CHECK_LAUNCH();
  if (!want_value) return 0.0f;
  SumDoublesKernel<<<1, 1024, 0, stream>>>(lp, T, reinterpret_cast<double*>(total.data<int64_t>()));
  SY_CUDA_CHECK_LAUNCH();
  const int64_t bits = ToHost<int64_t>(total, ctx)[0];  // waits for the stream
  double sum = 0.0;
  std::memcpy(&sum, &bits, sizeof(double));
  return static_cast<float>(coef * sum / n);
}

void RouterZLossInto(const Tensor& logits, float coef, int64_t group_tokens, Tensor& value,
                     DeviceContext* ctx) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const int64_t n = group_tokens > 0 ? group_tokens : T;
  cudaStream_t stream = StreamOf(ctx);
  if (T == 0) {
    value.SetZero(ctx);
    return;
  }
  Tensor lse_sq = Tensor::Empty({T}, DType::kF64, ctx->device());
  Tensor total = Tensor::Empty({1}, DType::kF64, ctx->device());
  ZLossKernel<<<TokenBlocks(T), kTokenThreads, 0, stream>>>(logits.data<float>(), T,
                                                            static_cast<int>(E), 0.0, n,
                                                            lse_sq.data<double>(), nullptr);
  SY_CUDA_CHECK_LAUNCH();
  SumDoublesKernel<<<1, 1024, 0, stream>>>(lse_sq.data<double>(), T, total.data<double>());
  SY_CUDA_CHECK_LAUNCH();
  ZLossValueKernel<<<1, 1, 0, stream>>>(total.data<double>(), coef, n, value.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate,
                      DeviceContext* ctx) {
  const int64_t E = bias.numel();
  if (E == 0) return;
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  // sign(mean - c_i) = sign(total - E * c_i), exactly, on the host.
  std::vector<int32_t> sign(E);
  for (int64_t i = 0; i < E; ++i) {
    const int64_t diff = total - E * counts[i];
    sign[i] = diff > 0 ? 1 : (diff < 0 ? -1 : 0);
  }
  Tensor s = ToDevice(sign, ctx);
  UpdateExpertBiasKernel<<<GridFor(E), 256, 0, StreamOf(ctx)>>>(bias.data<float>(),
                                                                s.data<int32_t>(), E, rate);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
