// The forward device code of kernels/cuda/bias.cu (which launches it and describes the ops):
// the bias add over rows, one bias or one per row group (the group of a row found by a
// binary search in the groups' offsets), and bias + activation fused, one bias or grouped,
// writing f32 or bf16 activations and, under bf16 storage, the bf16 pre-activations the
// backward reads; and the launch shape of the row-wise kernels. The bias gradient's device
// code is kernels/cuda/bias_grad_kernels.cuh. Include after kernels/cuda/device_common.cuh
// and kernels/cuda/activation_math.cuh.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>

namespace switchyard::kernels::cuda::bias_fwd {
// Internal linkage: the emulation test compiles these kernels too, and links with the .cu's.
namespace {

// Threads per block: the elementwise grid is device_common.cuh's GridFor(total, kThreads); the
// row-wise kernels' is RowLaunchOf.
constexpr int kThreads = 256;

// Where a forward op writes: the activation's output (f32 h, or bf16 h16), and, when kept_a
// is set, bf16(a + bias) there instead of a + bias back into a (swiglu: kept_b = bf16(b)).
struct ForwardOut {
  float* h = nullptr;
  __nv_bfloat16* h16 = nullptr;
  __nv_bfloat16* kept_a = nullptr;
  __nv_bfloat16* kept_b = nullptr;
};

// Elements [i, i + N) of a forward (N = 1, or 4 with 16-byte and 8-byte accesses: Vals):
// v (a's, plus the bias when `biased`: the bias add's __fadd_rn) kept rounded or written back
// into a, and the activation of v (kAct 0: gelu; 1: silu(v) b) stored, rounded when h16.
template <int kAct, int N>
__device__ __forceinline__ void ForwardVals(float* a, const float* b, const ForwardOut& o,
                                            int64_t i, const Vals<N>& v, bool biased) {
  if (o.kept_a != nullptr) {
    StoreVals<N>(o.kept_a + i, v);
  } else if (biased) {
    StoreVals<N>(a + i, v);
  }
  Vals<N> y;
  if constexpr (kAct == 0) {
#pragma unroll
    for (int e = 0; e < N; ++e) y.v[e] = Gelu(v.v[e]);
  } else {
    const Vals<N> vb = LoadVals<N>(b + i);
    if (o.kept_b != nullptr) StoreVals<N>(o.kept_b + i, vb);
#pragma unroll
    for (int e = 0; e < N; ++e) y.v[e] = Swiglu(v.v[e], vb.v[e]);
  }
  if (o.h16 != nullptr) {
    StoreVals<N>(o.h16 + i, y);
  } else {
    StoreVals<N>(o.h + i, y);
  }
}

// True when the forward over (rows, n) may take N = 4: n a multiple of 4 and every array
// aligned for the quads' accesses (16 bytes). Host code.
inline bool ForwardQuadsFit(int64_t n, std::initializer_list<const void*> arrays) {
  if (n % 4 != 0) return false;
  for (const void* p : arrays) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Fused bias + activation over a (rows, n), one bias (or none: bias null, the activation of
// a with the same outputs): N consecutive elements (one row's: n a multiple of N) read and
// written by one thread; the grid strides over total / N.
template <int kAct, int N = 1>
__global__ void BiasActForwardKernel(float* a, const float* bias, const float* b, ForwardOut o,
                                     int64_t total, int64_t n) {
  // The bias column: a 32-bit remainder when the indices fit (a 64-bit one is a long
  // software division per element).
  const bool narrow = total <= static_cast<int64_t>(UINT32_MAX);
  SY_GRID_STRIDE(q, total / N) {
    const int64_t i = q * N;
    const int64_t col = narrow ? static_cast<int64_t>(static_cast<uint32_t>(i) %
                                                      static_cast<uint32_t>(n))
                               : i % n;
    Vals<N> v = LoadVals<N>(a + i);
    if (bias != nullptr) {
      const Vals<N> bv = LoadVals<N>(bias + col);
#pragma unroll
      for (int e = 0; e < N; ++e) v.v[e] = __fadd_rn(v.v[e], bv.v[e]);
    }
    ForwardVals<kAct, N>(a, b, o, i, v, bias != nullptr);
  }
}

// ---- bias over rows ----------------------------------------------------------------------

// The group g of row r: the largest g in [0, groups) with offsets[g] <= r (an empty group
// shares its offset with the next, so the search lands on the non-empty group holding r).
// offsets: groups + 1 ascending entries, offsets[groups] = rows; null means one group.
__device__ __forceinline__ int64_t GroupOfRow(const int64_t* offsets, int64_t groups, int64_t r) {
  if (offsets == nullptr) return 0;
  int64_t lo = 0, hi = groups - 1;
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (offsets[mid] <= r) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// out (rows, n)[r, :] += bias (G, n)[group of r, :].
__global__ void AddBiasKernel(float* out, const float* bias, const int64_t* offsets, int64_t groups,
                              int64_t rows, int64_t n) {
  // Device-sized groups may end before the tensor does (rows past offsets[groups]: no group).
  if (offsets != nullptr && offsets[groups] < rows) rows = offsets[groups];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* b = bias + GroupOfRow(offsets, groups, r) * n;
    float* row = out + r * n;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      row[j] = __fadd_rn(row[j], b[j]);
    }
  }
}

// Grouped bias + activation over a (rows, n): a row in a group adds its group's bias, a row
// past the groups none; then ForwardElement.
template <int kAct>
__global__ void GroupedBiasActKernel(float* a, const float* bias, const float* b, ForwardOut o,
                                     const int64_t* offsets, int64_t groups, int64_t rows,
                                     int64_t n) {
  const int64_t end = offsets[groups];
  for (int64_t r = blockIdx.y; r < rows; r += gridDim.y) {
    const float* br = r < end ? bias + GroupOfRow(offsets, groups, r) * n : nullptr;
    for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < n;
         j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
      const int64_t i = r * n + j;
      const Vals<1> v{{br != nullptr ? __fadd_rn(a[i], br[j]) : a[i]}};
      ForwardVals<kAct, 1>(a, b, o, i, v, br != nullptr);
    }
  }
}

// The row-wise kernels' launch over (rows, n): `threads` across a row's columns (a multiple
// of 32 covering n, at most kThreads), blocks_x column blocks, blocks_y rows; the loops cover
// the rows and columns past a capped grid.
struct RowLaunch {
  unsigned blocks_x = 0, blocks_y = 0;
  int threads = 0;
};
inline RowLaunch RowLaunchOf(int64_t rows, int64_t n) {
  const int threads = static_cast<int>(std::clamp<int64_t>((n + 31) / 32 * 32, 32, kThreads));
  return {static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 1024)),
          static_cast<unsigned>(std::min<int64_t>(rows, 65535)), threads};
}

}  // namespace
}  // namespace switchyard::kernels::cuda::bias_fwd
