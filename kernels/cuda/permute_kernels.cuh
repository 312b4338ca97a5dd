// The device code of kernels/cuda/permute.cu (which launches it; its top comment gives the
// kernels' layout): the row kernels (gather, scatter-add, combine), the combine's backward,
// the entropy's partial sums and their in-order sum; with the launch shapes and the float /
// float4 choice, which the host side and tests/kernels/dispatch_emulation_test.cc both use.
// Include after kernels/cuda/common.cuh (or the host model of CUDA, which must then define
// float4 and make_float4).
#pragma once

#include <cstdint>
#include <initializer_list>

namespace switchyard::kernels::cuda::dispatch::permute {
// Internal linkage: the emulation test compiles these kernels too, and links with permute.cu.
namespace {

constexpr int kThreads = 256;
// Tokens with at most this many slots sum their rows in increasing row order (the CPU's
// order); wider tokens in slot order.
constexpr int kMaxSortedK = 8;
constexpr int64_t kNoRow = INT64_MAX;
constexpr unsigned kMaxEntropyBlocks = 1024;  // the entropy's partial sums, at most

// ---- float / float4 arithmetic, rounded separately (no fused multiply-add) ---------------

__device__ __forceinline__ float Add(float a, float b) { return __fadd_rn(a, b); }
__device__ __forceinline__ float4 Add(float4 a, float4 b) {
  return make_float4(__fadd_rn(a.x, b.x), __fadd_rn(a.y, b.y), __fadd_rn(a.z, b.z),
                     __fadd_rn(a.w, b.w));
}
__device__ __forceinline__ float Scale(float w, float b) { return __fmul_rn(w, b); }
__device__ __forceinline__ float4 Scale(float w, float4 b) {
  return make_float4(__fmul_rn(w, b.x), __fmul_rn(w, b.y), __fmul_rn(w, b.z), __fmul_rn(w, b.w));
}
__device__ __forceinline__ double Dot(float a, float b) {
  return static_cast<double>(a) * static_cast<double>(b);
}
__device__ __forceinline__ double Dot(float4 a, float4 b) {
  return static_cast<double>(a.x) * b.x + static_cast<double>(a.y) * b.y +
         static_cast<double>(a.z) * b.z + static_cast<double>(a.w) * b.w;
}
template <typename V>
__device__ __forceinline__ V Zero();
template <>
__device__ __forceinline__ float Zero<float>() { return 0.0f; }
template <>
__device__ __forceinline__ float4 Zero<float4>() { return make_float4(0.0f, 0.0f, 0.0f, 0.0f); }

// Vector i (a float, or 4 floats for float4) of f32 rows, or of bf16 rows widened (exact);
// and vector i stored rounded into bf16 rows. For the combine's kept rows (bf16 activation
// storage); element by element, so bf16 rows need only their own alignment.
template <typename V>
__device__ __forceinline__ void LoadWidened(const V* p, int64_t i, V& v) { v = p[i]; }
__device__ __forceinline__ void LoadWidened(const __nv_bfloat16* p, int64_t i, float& v) {
  v = LoadF32(p, i);
}
__device__ __forceinline__ void LoadWidened(const __nv_bfloat16* p, int64_t i, float4& v) {
  const __nv_bfloat16* q = p + 4 * i;
  v = make_float4(FromBf16(q[0]), FromBf16(q[1]), FromBf16(q[2]), FromBf16(q[3]));
}
__device__ __forceinline__ void StoreRounded(__nv_bfloat16* p, int64_t i, float v) {
  StoreAs(p, i, v);
}
__device__ __forceinline__ void StoreRounded(__nv_bfloat16* p, int64_t i, float4 v) {
  __nv_bfloat16* q = p + 4 * i;
  q[0] = ToBf16(v.x);
  q[1] = ToBf16(v.y);
  q[2] = ToBf16(v.z);
  q[3] = ToBf16(v.w);
}
// Vector i of rows stored as they are, or rounded into bf16 rows (the combine's backward
// writing the experts' gradient as their products' bf16 operand).
template <typename V>
__device__ __forceinline__ void StoreRow(V* p, int64_t i, V v) { p[i] = v; }
template <typename V>
__device__ __forceinline__ void StoreRow(__nv_bfloat16* p, int64_t i, V v) { StoreRounded(p, i, v); }

// Whether rows of d floats at these pointers can move as float4.
bool CanUseFloat4(int64_t d, std::initializer_list<const void*> ptrs) {
  if (d % 4 != 0) return false;
  for (const void* p : ptrs) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Threads per row (2^log2, at most the block) for rows of `width` vectors, and the grid.
struct RowLayout {
  int log2 = 0;
  unsigned blocks = 1;
};
RowLayout LayoutFor(int64_t rows, int64_t width) {
  RowLayout l;
  while ((int64_t{1} << l.log2) < width && (1 << l.log2) < kThreads) ++l.log2;
  l.blocks = GridFor(rows, kThreads >> l.log2);
  return l;
}

// CombineBackward's blocks: one warp per permuted row.
inline unsigned CombineBackwardBlocks(int64_t rows) { return GridFor(rows, kThreads / 32); }

// EntropyKernel's blocks (and partial sums) for n probabilities.
inline unsigned EntropyBlocks(int64_t n) {
  const unsigned blocks = GridFor(n, kThreads);
  return blocks < kMaxEntropyBlocks ? blocks : kMaxEntropyBlocks;
}

// The row loop of a row kernel whose rows each get a group of 2^log2 consecutive threads:
// for (int64_t r : the rows of this thread's group). Every thread of a group, and of a warp
// when 2^log2 >= 32, runs the same iterations.
#define SY_ROW_LOOP(r, rows, log2)                                                        \
  for (int64_t r = blockIdx.x * static_cast<int64_t>(blockDim.x >> (log2)) +             \
                   (threadIdx.x >> (log2));                                             \
       r < (rows); r += static_cast<int64_t>(gridDim.x) * (blockDim.x >> (log2)))

// ---- Row kernels -----------------------------------------------------------------------

template <typename V>
__global__ void GatherRowsKernel(const V* __restrict__ src, const int64_t* __restrict__ index,
                                 V* __restrict__ dst, int64_t rows, int64_t width, int log2) {
  const int64_t group = int64_t{1} << log2, lane = threadIdx.x & (group - 1);
  SY_ROW_LOOP(r, rows, log2) {
    const V* in = src + index[r] * width;
    V* out = dst + r * width;
    for (int64_t c = lane; c < width; c += group) out[c] = in[c];
  }
}

// GatherRowsKernel rounding f32 rows into bf16 (kernels/permute.h).
__global__ void GatherRowsToBf16Kernel(const float* __restrict__ src,
                                       const int64_t* __restrict__ index,
                                       __nv_bfloat16* __restrict__ dst, int64_t rows,
                                       int64_t width, int log2) {
  const int64_t group = int64_t{1} << log2, lane = threadIdx.x & (group - 1);
  SY_ROW_LOOP(r, rows, log2) {
    const float* in = src + index[r] * width;
    __nv_bfloat16* out = dst + r * width;
    for (int64_t c = lane; c < width; c += group) out[c] = ToBf16(in[c]);
  }
}

// The kept rows of token t as keys (row << 32 | j), ascending; kNoRow fills the rest. Only
// static indices into `keys`, so it stays in registers.
__device__ __forceinline__ void SortedRowsOf(const int64_t* __restrict__ inverse, int64_t t,
                                             int k, int64_t (&keys)[kMaxSortedK]) {
#pragma unroll
  for (int i = 0; i < kMaxSortedK; ++i) {
    const int64_t a = i < k ? inverse[t * k + i] : -1;
    keys[i] = a >= 0 ? (a << 32) | i : kNoRow;
  }
  // Odd-even transposition sort: kMaxSortedK rounds sort kMaxSortedK keys.
#pragma unroll
  for (int round = 0; round < kMaxSortedK; ++round) {
#pragma unroll
    for (int i = round & 1; i + 1 < kMaxSortedK; i += 2) {
      const int64_t x = keys[i], y = keys[i + 1];
      const int64_t lo = x < y ? x : y, hi = x < y ? y : x;
      keys[i] = lo;
      keys[i + 1] = hi;
    }
  }
}

// dh[t] += the token's rows of drows, or with kSet dh[t] = +0 + those rows (what a zeroed dh
// would hold after the add: dh is not read). kSorted: k <= kMaxSortedK, increasing row order.
template <typename V, bool kSorted, bool kSet>
__global__ void ScatterAddKernel(const V* __restrict__ drows, const int64_t* __restrict__ inverse,
                                 V* __restrict__ dh, int64_t tokens, int k, int64_t width,
                                 int log2) {
  const int64_t group = int64_t{1} << log2, lane = threadIdx.x & (group - 1);
  SY_ROW_LOOP(t, tokens, log2) {
    V* out = dh + t * width;
    if constexpr (kSorted) {
      int64_t keys[kMaxSortedK];
      SortedRowsOf(inverse, t, k, keys);
      for (int64_t c = lane; c < width; c += group) {
        V acc = kSet ? Zero<V>() : out[c];
#pragma unroll
        for (int i = 0; i < kMaxSortedK; ++i) {
          if (keys[i] == kNoRow) break;
          acc = Add(acc, drows[(keys[i] >> 32) * width + c]);
        }
        out[c] = acc;
      }
    } else {
      for (int64_t c = lane; c < width; c += group) {
        V acc = kSet ? Zero<V>() : out[c];
        for (int j = 0; j < k; ++j) {
          const int64_t a = inverse[t * k + j];
          if (a >= 0) acc = Add(acc, drows[a * width + c]);
        }
        out[c] = acc;
      }
    }
  }
}

// y[t] = sum of gates[s] * out[a] over the token's kept slots (+ extra[t]); kept non-null:
// each such row a also stored there rounded to bf16 (every row is some one slot's).
template <typename V, bool kSorted>
__global__ void CombineKernel(const V* __restrict__ out, const float* __restrict__ gates,
                              const int64_t* __restrict__ inverse, const V* __restrict__ extra,
                              V* __restrict__ y, int64_t tokens, int k, int64_t width, int log2,
                              __nv_bfloat16* __restrict__ kept = nullptr) {
  const int64_t group = int64_t{1} << log2, lane = threadIdx.x & (group - 1);
  SY_ROW_LOOP(t, tokens, log2) {
    V* dst = y + t * width;
    const V* add = extra != nullptr ? extra + t * width : nullptr;
    if constexpr (kSorted) {
      int64_t keys[kMaxSortedK];
      float w[kMaxSortedK];
      SortedRowsOf(inverse, t, k, keys);
#pragma unroll
      for (int i = 0; i < kMaxSortedK; ++i) {
        w[i] = keys[i] == kNoRow ? 0.0f : gates[t * k + (keys[i] & 0xffffffff)];
      }
      for (int64_t c = lane; c < width; c += group) {
        V acc = Zero<V>();
#pragma unroll
        for (int i = 0; i < kMaxSortedK; ++i) {
          if (keys[i] == kNoRow) break;
          const int64_t at = (keys[i] >> 32) * width + c;
          const V v = out[at];
          acc = Add(acc, Scale(w[i], v));
          if (kept != nullptr) StoreRounded(kept, at, v);
        }
        if (add != nullptr) acc = Add(acc, add[c]);
        dst[c] = acc;
      }
    } else {
      for (int64_t c = lane; c < width; c += group) {
        V acc = Zero<V>();
        for (int j = 0; j < k; ++j) {
          const int64_t a = inverse[t * k + j];
          if (a < 0) continue;
          const V v = out[a * width + c];
          acc = Add(acc, Scale(gates[t * k + j], v));
          if (kept != nullptr) StoreRounded(kept, a * width + c, v);
        }
        if (add != nullptr) acc = Add(acc, add[c]);
        dst[c] = acc;
      }
    }
  }
}

// One warp per permuted row a: dout[a] = w * dy[t], dgates[s] = dot(dy[t], out[a]). out: V
// rows, or the combine's kept bf16 rows (TO = __nv_bfloat16, widened as read); dout: V rows,
// or bf16 rows (TD = __nv_bfloat16, each w * dy rounded as stored: the experts' operand).
template <typename V, typename TO = V, typename TD = V>
__global__ void CombineBackwardKernel(const V* __restrict__ dy, const TO* __restrict__ out,
                                      const float* __restrict__ gates,
                                      const int64_t* __restrict__ slot,
                                      const int64_t* __restrict__ inverse, TD* __restrict__ dout,
                                      float* __restrict__ dgates, int64_t rows, int64_t k,
                                      int64_t width) {
  const int lane = threadIdx.x & 31;
  // Every lane of a warp runs the same iterations (a is the same across the warp), so the
  // shuffles in WarpSum see the whole warp.
  SY_ROW_LOOP(a, rows, 5) {
    const int64_t s = slot[a];
    if (inverse != nullptr && inverse[s] != a) {  // a dropped row (the same for the warp)
      for (int64_t c = lane; c < width; c += 32) StoreRow(dout, a * width + c, Zero<V>());
      continue;
    }
    const float w = gates[s];
    const V* g = dy + (s / k) * width;
    double dot = 0.0;
    for (int64_t c = lane; c < width; c += 32) {
      const V gv = g[c];
      V ov;
      LoadWidened(out, a * width + c, ov);
      StoreRow(dout, a * width + c, Scale(w, gv));
      dot += Dot(gv, ov);
    }
    dot = WarpSum(dot);
    if (lane == 0) dgates[s] = static_cast<float>(dot);
  }
}

__global__ void EntropyKernel(const float* __restrict__ p, int64_t n,
                              double* __restrict__ partial) {
  __shared__ double shared[32];
  double sum = 0.0;
  SY_GRID_STRIDE(i, n) {
    const float v = p[i];
    if (v > 0.0f) sum -= static_cast<double>(v) * static_cast<double>(logf(v));
  }
  sum = BlockSum(sum, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = sum;
}

// Launches a row kernel as float4 when possible, else float. `launch(V tag, width)`.
template <typename F>
void LaunchRows(int64_t d, std::initializer_list<const void*> ptrs, F launch) {
  if (CanUseFloat4(d, ptrs)) {
    launch(float4{}, d / 4);
  } else {
    launch(float{}, d);
  }
}


// out[0] = 0.0 + part[0] + part[1] + ... in block order (EntropySum's host loop).
__global__ void SumInOrderKernel(const double* __restrict__ part, unsigned n,
                                 double* __restrict__ out) {
  double sum = 0.0;
  for (unsigned b = 0; b < n; ++b) sum = __dadd_rn(sum, part[b]);
  out[0] = sum;
}


}  // namespace
}  // namespace switchyard::kernels::cuda::dispatch::permute
