// The helpers every kernel family shares: grid sizes, grid-stride loops, warp and block
// reductions, bf16 conversions. Nothing here names the CUDA runtime, so the host model of CUDA
// (tests/kernels/cuda_emulation.h) compiles the same source; the *_kernels.cuh files that hold
// a family's device code include this.
#pragma once

#include <cstdint>

#ifdef __CUDACC__
#include <cuda_bf16.h>
#endif

namespace switchyard::kernels::cuda {

// The most blocks a grid-stride launch asks for; the loops cover the rest.
constexpr int64_t kMaxGridBlocks = 65535 * 8;

// Blocks of `threads` covering n elements (at least one), at most max_blocks (the emulation
// tests lower it so that the grid-stride loops run). Host code.
inline unsigned GridFor(int64_t n, int threads = 256, int64_t max_blocks = kMaxGridBlocks) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > max_blocks) blocks = max_blocks;
  return static_cast<unsigned>(blocks);
}

// for (int64_t i : grid-stride indices below n) — use as SY_GRID_STRIDE(i, n) { ... }.
#define SY_GRID_STRIDE(i, n)                                                   \
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; \
       i < (n); i += static_cast<int64_t>(gridDim.x) * blockDim.x)

constexpr unsigned kFullMask = 0xffffffffu;

template <typename T>
__device__ __forceinline__ T WarpSum(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(kFullMask, v, offset);
  return v;
}

template <typename T>
__device__ __forceinline__ T WarpMax(T v) {
  for (int offset = 16; offset > 0; offset >>= 1) {
    T other = __shfl_xor_sync(kFullMask, v, offset);
    v = other > v ? other : v;
  }
  return v;
}

// Sum over all threads of the block (blockDim.x a multiple of 32, at most 1024); every
// thread gets the result. `shared` holds at least 32 T. Contains __syncthreads(): call it
// from every thread of the block, and not twice in a row on the same `shared` without a
// barrier between (it ends with one, so back-to-back calls are safe).
template <typename T>
__device__ __forceinline__ T BlockSum(T v, T* shared) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = WarpSum(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = lane < warps ? shared[lane] : T(0);
  total = WarpSum(total);
  __syncthreads();
  return total;
}

// Max over all threads of the block; same contract as BlockSum. `lowest` fills idle lanes.
template <typename T>
__device__ __forceinline__ T BlockMax(T v, T* shared, T lowest) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int warps = (blockDim.x + 31) >> 5;
  v = WarpMax(v);
  if (lane == 0) shared[warp] = v;
  __syncthreads();
  T total = lane < warps ? shared[lane] : lowest;
  total = WarpMax(total);
  __syncthreads();
  return total;
}

// Round-to-nearest-even f32 -> bf16, and back, the same rounding as engine/core/dtype.h.
__device__ __forceinline__ __nv_bfloat16 ToBf16(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float FromBf16(__nv_bfloat16 v) { return __bfloat162float(v); }

// Element i of an f32 or bf16 array as f32 (a bf16 value widened: exact). For kernels that read
// a kept activation in either storage type.
__device__ __forceinline__ float LoadF32(const float* p, int64_t i) { return p[i]; }
__device__ __forceinline__ float LoadF32(const __nv_bfloat16* p, int64_t i) {
  return FromBf16(p[i]);
}
// p[i] = v, rounded to nearest even when p is bf16 (a producer writing a bf16 operand).
__device__ __forceinline__ void StoreAs(float* p, int64_t i, float v) { p[i] = v; }
__device__ __forceinline__ void StoreAs(__nv_bfloat16* p, int64_t i, float v) {
  p[i] = ToBf16(v);
}

}  // namespace switchyard::kernels::cuda
