// CUDA implementation of kernels/moe_routing.h. Arguments are checked by
// kernels/moe_routing.cc. The CPU loops in kernels/cpu/moe_routing.cc are the reference:
//  - per-token ops (RouterTopK, RouterBackwardLogits, the z-loss) run one warp per token,
//    four tokens per 128-thread block; the per-token sums are in double like the CPU's
//    (exp is exp(double), rounded to f32 where the CPU rounds expf), so only the order of
//    the double sums differs and results agree to ~1 f32 ulp;
//  - counts use integer atomics (exact); the column sums a fixed two-level double sum (no
//    float atomics: deterministic);
//  - admission sorts the (T * k) assignments with a stable cub::DeviceRadixSort on the
//    fewest key bits that order them (expert, slot) or (expert, decreasing gate); a rank is
//    then the sorted position minus the start of the expert's (or the (expert, slot))
//    segment, from an exclusive scan of the per-key counts. Exact.
#include <cub/device/device_radix_sort.cuh>
#include <cub/device/device_scan.cuh>

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
                                 uint8_t* __restrict__ keep) {
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

__global__ void UpdateExpertBiasKernel(float* __restrict__ bias,
                                       const int32_t* __restrict__ sign, int64_t E, float rate) {
  SY_GRID_STRIDE(i, E) {
    if (sign[i] > 0) bias[i] += rate;
    if (sign[i] < 0) bias[i] -= rate;
  }
}

// ---- Admission ------------------------------------------------------------------------
//
// Every assignment i = t * k + j (token-major; the sort's value) gets a class K:
//   K = e * k + j  competing (keep = 1) for expert e in slot j
//   K = k * E      removed (keep = 0)
//   K = k * E + 1  expert index outside [0, E)
// counts[K] (atomics) and their exclusive scan `starts` give each class's segment in K
// order. The sort key orders the assignments:
//   position    key = K (u32): by expert, then slot, then token (stable: values ascend);
//   probability key = (e << 32) | ~Ordered(gate) (u64), removed/bad (E or E+1) << 32: by
//               expert, then decreasing gate, then token and slot (stable).
// Either way expert e's competitors form one segment starting at starts[e * k], and under
// `position` its slot-j ones the sub-segment starting at starts[e * k + j].

// Order-preserving unsigned image of a float (ascending), with -0 taken as +0 (the CPU
// compares gates with >, which treats them as equal).
__device__ __forceinline__ uint32_t OrderedBits(float g) {
  if (g == 0.0f) g = 0.0f;
  const uint32_t bits = __float_as_uint(g);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

template <bool kByProbability>
using AdmissionKey = std::conditional_t<kByProbability, unsigned long long, uint32_t>;

template <bool kByProbability>
__global__ void AdmissionKeysKernel(const int32_t* __restrict__ indices,
                                    const uint8_t* __restrict__ keep,
                                    const float* __restrict__ gates, int64_t n, int k, int E,
                                    AdmissionKey<kByProbability>* __restrict__ keys,
                                    int32_t* __restrict__ values,
                                    unsigned long long* __restrict__ counts) {
  using Key = AdmissionKey<kByProbability>;
  const int64_t removed = static_cast<int64_t>(k) * E;
  SY_GRID_STRIDE(i, n) {
    const int e = indices[i];
    const int j = static_cast<int>(i % k);
    int64_t cls;
    Key key;
    if (e < 0 || e >= E) {
      cls = removed + 1;
      if constexpr (kByProbability) key = static_cast<Key>(E + 1) << 32;
      else key = static_cast<Key>(cls);
    } else if (keep != nullptr && keep[i] == 0) {
      cls = removed;
      if constexpr (kByProbability) key = static_cast<Key>(E) << 32;
      else key = static_cast<Key>(cls);
    } else {
      cls = static_cast<int64_t>(e) * k + j;
      if constexpr (kByProbability) {
        key = (static_cast<Key>(e) << 32) | static_cast<Key>(~OrderedBits(gates[i]));
      } else {
        key = static_cast<Key>(cls);
      }
    }
    keys[i] = key;
    values[i] = static_cast<int32_t>(i);
    atomicAdd(&counts[cls], 1ull);
  }
}

// For sorted position s holding assignment v = t * k + j of expert e: rank = s - (the start
// of e's segment), or under `position` with offsets, s - starts[e * k + j] + offsets[j][e].
template <bool kByProbability>
__global__ void AdmissionRankKernel(const AdmissionKey<kByProbability>* __restrict__ keys,
                                    const int32_t* __restrict__ values, int64_t n, int k, int E,
                                    const long long* __restrict__ starts,
                                    const int64_t* __restrict__ offsets, int64_t capacity,
                                    uint8_t* __restrict__ kept, int64_t* __restrict__ position) {
  SY_GRID_STRIDE(s, n) {
    const auto key = keys[s];
    const int32_t v = values[s];
    int e, j;
    if constexpr (kByProbability) {
      e = static_cast<int>(key >> 32);
      if (e >= E) continue;  // removed or bad: they sort after every competitor
      j = v % k;
    } else {
      if (key >= static_cast<uint32_t>(k) * static_cast<uint32_t>(E)) continue;
      e = static_cast<int>(key / k);
      j = static_cast<int>(key % k);
    }
    const int64_t base = offsets != nullptr
                             ? starts[static_cast<int64_t>(e) * k + j] -
                                   offsets[static_cast<int64_t>(j) * E + e]
                             : starts[static_cast<int64_t>(e) * k];
    const int64_t rank = s - base;
    if (capacity < 0 || rank < capacity) {
      kept[v] = 1;
      position[v] = rank;
    }
  }
}

// Copies a host vector to a new tensor on ctx's device (ordered on its stream; the host
// memory may go away on return).
template <typename T>
Tensor ToDevice(const std::vector<T>& host, DeviceContext* ctx) {
  return Tensor::FromVector(host, {static_cast<int64_t>(host.size())}).To(ctx->device(), ctx);
}

// The values of a device tensor, copied on ctx's stream after the work queued there (the
// context's stream does not synchronise with the legacy default stream).
template <typename T>
std::vector<T> ToHost(const Tensor& t, DeviceContext* ctx) {
  Tensor host = Tensor::Empty(t.shape(), t.dtype());
  host.CopyFrom(t, ctx);  // waits for the stream
  return host.ToVector<T>();
}

// Bytes of a u8 scratch tensor on ctx's device (at least 1).
Tensor Scratch(size_t bytes, DeviceContext* ctx) {
  return Tensor::Empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::kU8,
                       ctx->device());
}

// The device part of admission: keys, counts, scan, sort, ranks. Returns the (k * E + 2)
// class counts on the device.
template <bool kByProbability>
Tensor AdmitOnDevice(const Tensor& indices, const Tensor& gates, const Tensor& keep, int E,
                     int64_t capacity, const Tensor& offsets, Tensor& kept, Tensor& position,
                     DeviceContext* ctx) {
  using Key = AdmissionKey<kByProbability>;
  cudaStream_t stream = StreamOf(ctx);
  const int64_t T = indices.dim(0);
  const int k = static_cast<int>(indices.dim(1));
  const int64_t n = T * k;
  const int64_t classes = static_cast<int64_t>(k) * E + 2;
  const Device dev = ctx->device();

  Tensor counts = Tensor::Zeros({classes}, DType::kI64, dev, ctx);
  Tensor starts = Tensor::Empty({classes}, DType::kI64, dev);
  // Keys: u32 or u64 (as i32 pairs or i64 tensors of the same bytes).
  const DType key_dtype = sizeof(Key) == 8 ? DType::kI64 : DType::kI32;
  Tensor keys_in = Tensor::Empty({n}, key_dtype, dev);
  Tensor keys_out = Tensor::Empty({n}, key_dtype, dev);
  Tensor values_in = Tensor::Empty({n}, DType::kI32, dev);
  Tensor values_out = Tensor::Empty({n}, DType::kI32, dev);
  Key* kin = static_cast<Key*>(keys_in.raw_data());
  Key* kout = static_cast<Key*>(keys_out.raw_data());
  int32_t* vin = values_in.data<int32_t>();
  int32_t* vout = values_out.data<int32_t>();
  auto* cnt = reinterpret_cast<unsigned long long*>(counts.data<int64_t>());
  auto* cnt_ll = reinterpret_cast<long long*>(counts.data<int64_t>());
  auto* start_ll = reinterpret_cast<long long*>(starts.data<int64_t>());

  AdmissionKeysKernel<kByProbability><<<GridFor(n), 256, 0, stream>>>(
      indices.data<int32_t>(), keep.defined() ? keep.data<uint8_t>() : nullptr,
      kByProbability ? gates.data<float>() : nullptr, n, k, E, kin, vin, cnt);
  SY_CUDA_CHECK_LAUNCH();

  // The fewest key bits that hold every key.
  const int end_bit = kByProbability
                          ? 32 + std::bit_width(static_cast<uint64_t>(E) + 1)
                          : std::bit_width(static_cast<uint64_t>(classes - 1));
  size_t sort_bytes = 0, scan_bytes = 0;
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, sort_bytes, kin, kout, vin, vout, n, 0,
                                                end_bit, stream));
  SY_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(nullptr, scan_bytes, cnt_ll, start_ll, classes,
                                              stream));
  Tensor temp = Scratch(std::max(sort_bytes, scan_bytes), ctx);
  SY_CUDA_CHECK(cub::DeviceScan::ExclusiveSum(temp.raw_data(), scan_bytes, cnt_ll, start_ll,
                                              classes, stream));
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), sort_bytes, kin, kout, vin, vout,
                                                n, 0, end_bit, stream));

  AdmissionRankKernel<kByProbability><<<GridFor(n), 256, 0, stream>>>(
      kout, vout, n, k, E, start_ll, offsets.defined() ? offsets.data<int64_t>() : nullptr,
      capacity, kept.data<uint8_t>(), position.data<int64_t>());
  SY_CUDA_CHECK_LAUNCH();
  return counts;
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
  // lse^2 per token, then their sum, in double (i64 tensors hold the bytes).
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

AdmissionCounts AdmitAssignments(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                                 int64_t num_experts, int64_t capacity, AdmissionOrder order,
                                 std::span<const int64_t> offsets, Tensor& kept,
                                 Tensor& position, DeviceContext* ctx) {
  const int64_t T = indices.dim(0), k = indices.dim(1), E = num_experts;
  const int64_t n = T * k;
  AdmissionCounts a;
  a.before.assign(E, 0);
  a.after.assign(E, 0);
  if (n == 0) return a;
  SY_CHECK(n <= INT32_MAX && k * E + 2 <= INT32_MAX)
      << "AdmitAssignments on CUDA: T*k=" << n << ", k*E=" << k * E << " exceed int32";
  cudaStream_t stream = StreamOf(ctx);
  SY_CUDA_CHECK(cudaMemsetAsync(kept.raw_data(), 0, kept.nbytes(), stream));
  SY_CUDA_CHECK(cudaMemsetAsync(position.raw_data(), 0xFF, position.nbytes(), stream));  // -1
  const bool by_probability = order == AdmissionOrder::kProbability;
  Tensor offsets_dev;
  if (!offsets.empty()) {
    offsets_dev = ToDevice(std::vector<int64_t>(offsets.begin(), offsets.end()), ctx);
  }

  const int e32 = static_cast<int>(E);
  Tensor counts_dev =
      by_probability
          ? AdmitOnDevice<true>(indices, gates, keep, e32, capacity, offsets_dev, kept, position,
                                ctx)
          : AdmitOnDevice<false>(indices, gates, keep, e32, capacity, offsets_dev, kept, position,
                                 ctx);
  const std::vector<int64_t> c = ToHost<int64_t>(counts_dev, ctx);  // the one copy back
  SY_CHECK_EQ(c[k * E + 1], 0) << "AdmitAssignments: " << c[k * E + 1]
                               << " expert indices outside [0, " << E << ")";
  a.removed = c[k * E];
  const bool limited = capacity >= 0;
  for (int64_t e = 0; e < E; ++e) {
    int64_t earlier_slots = 0;  // this piece's competitors for e in slots < j
    for (int64_t j = 0; j < k; ++j) {
      const int64_t len = c[e * k + j];
      a.before[e] += len;
      if (!by_probability) {
        // Slot j's competitors for e hold ranks base, base + 1, ...; those below C stay.
        const int64_t base = offsets.empty() ? earlier_slots : offsets[j * E + e];
        a.after[e] += limited ? std::clamp<int64_t>(capacity - base, 0, len) : len;
      }
      earlier_slots += len;
    }
    if (by_probability) a.after[e] = limited ? std::min(a.before[e], capacity) : a.before[e];
  }
  return a;
}

}  // namespace switchyard::kernels::cuda
