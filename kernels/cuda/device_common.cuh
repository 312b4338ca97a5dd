// The helpers every kernel family shares: grid sizes, grid-stride loops, warp and block
// reductions, bf16 conversions. Nothing here names the CUDA runtime, so the host model of CUDA
// (tests/kernels/cuda_emulation.h) compiles the same source; the *_kernels.cuh files that hold
// a family's device code include this.
#pragma once

#include <cstdint>
#include <cstring>

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

// ---- Operands of the warp-level tensor-core product mma.sync.m16n8k16 (bf16 x bf16 + f32).
// A register holds two bf16 values, the first in its low half. Lane l of a warp, g = l / 4,
// t = l % 4, holds (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
//   a (16 x 16, row-major): a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
//                           a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9];
//   b (16 x 8):             b[0] = B[2t, 2t+1][g], b[1] = B[2t+8, 2t+9][g];
//   c, d (16 x 8, f32):     c[0], c[1] = C[g][2t, 2t+1], c[2], c[3] = C[g+8][2t, 2t+1].
// So the accumulators of two neighbouring n = 8 tiles, rounded and packed, are the a operand
// of the next product (the FlashAttention-2 trick: softmax weights stay in registers).

// Two bf16 values at p (4-byte aligned) as one operand register.
__device__ __forceinline__ uint32_t LoadBf16x2(const __nv_bfloat16* p) {
#ifdef __CUDA_ARCH__
  return *reinterpret_cast<const uint32_t*>(p);
#else
  uint32_t v;
  std::memcpy(&v, p, sizeof(v));
  return v;
#endif
}
__device__ __forceinline__ void StoreBf16x2(__nv_bfloat16* p, uint32_t v) {
#ifdef __CUDA_ARCH__
  *reinterpret_cast<uint32_t*>(p) = v;
#else
  std::memcpy(static_cast<void*>(p), &v, sizeof(v));
#endif
}
// bf16(lo) in the low half, bf16(hi) in the high half (round to nearest even).
__device__ __forceinline__ uint32_t PackBf16x2(float lo, float hi) {
  return static_cast<uint32_t>(__bfloat16_as_ushort(ToBf16(lo))) |
         static_cast<uint32_t>(__bfloat16_as_ushort(ToBf16(hi))) << 16;
}

// ---- N consecutive values of an f32 or bf16 array as f32: N = 1, or N = 4 with one access
// (16 bytes of f32, 8 of bf16; the caller checks the alignment). bf16 widens exactly and is
// stored rounded to nearest even, as ToBf16.
template <int N>
struct alignas(N == 4 ? 16 : 4) Vals {
  static_assert(N == 1 || N == 4, "one value or a 16-byte quad");
  float v[N];
};
struct alignas(8) Bf16x4 {
  uint32_t lo, hi;  // columns 0, 1 and 2, 3, the first of each pair in the low half
};

template <int N>
__device__ __forceinline__ Vals<N> LoadVals(const float* p) {
  if constexpr (N == 4) {
    return *reinterpret_cast<const Vals<4>*>(p);
  } else {
    return Vals<1>{{*p}};
  }
}
template <int N>
__device__ __forceinline__ Vals<N> LoadVals(const __nv_bfloat16* p) {
  if constexpr (N == 4) {
    const Bf16x4 q = *reinterpret_cast<const Bf16x4*>(p);
    return Vals<4>{{__uint_as_float(q.lo << 16), __uint_as_float(q.lo & 0xffff0000u),
                    __uint_as_float(q.hi << 16), __uint_as_float(q.hi & 0xffff0000u)}};
  } else {
    return Vals<1>{{FromBf16(*p)}};
  }
}
template <int N>
__device__ __forceinline__ void StoreVals(float* p, const Vals<N>& v) {
  if constexpr (N == 4) {
    *reinterpret_cast<Vals<4>*>(p) = v;
  } else {
    *p = v.v[0];
  }
}
template <int N>
__device__ __forceinline__ void StoreVals(__nv_bfloat16* p, const Vals<N>& v) {
  if constexpr (N == 4) {
    *reinterpret_cast<Bf16x4*>(p) = Bf16x4{PackBf16x2(v.v[0], v.v[1]), PackBf16x2(v.v[2], v.v[3])};
  } else {
    *p = ToBf16(v.v[0]);
  }
}

#ifdef __CUDACC__
// ldmatrix.m8n8.x4 (bf16): lanes 8 i to 8 i + 7 give the addresses (shared memory, 16-byte
// aligned) of rows 0-7 of matrix i (8 bf16 each); lane l receives in r[i] the pair at row l / 4,
// columns 2 (l % 4), +1 of matrix i, or with Trans the pair at rows 2 (l % 4), +1, column l / 4
// (the matrix transposed). The host model of CUDA defines its own.
__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], const __nv_bfloat16* row) {
#ifdef __CUDA_ARCH__
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
#ifdef __CUDA_ARCH__
  const unsigned addr = static_cast<unsigned>(__cvta_generic_to_shared(row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
#endif
}

// d += a b over one warp (every lane calls it, with the fragments above); sm_80 or later.
// The host model of CUDA (tests/kernels/cuda_emulation.h) defines its own.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[2]) {
#ifdef __CUDA_ARCH__
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
      "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
#endif
}
#endif

}  // namespace switchyard::kernels::cuda
