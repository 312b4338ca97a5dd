// The device code of the elementwise ops (kernels/cuda/elementwise.cu, which launches them):
// arithmetic, fills and the f32 <-> bf16 casts, one grid-stride kernel per op, with the launch
// shape shared by the .cu and by tests/kernels/optimizer_emulation_test.cc. Include after
// kernels/cuda/device_common.cuh.
#pragma once

#include <algorithm>
#include <cstdint>

namespace switchyard::kernels::cuda::elementwise {
// Internal linkage: the emulation test compiles these kernels too, and links with
// elementwise.cu's.
namespace {

constexpr int kThreads = 256;

enum class Op { kAdd, kMul, kAxpy, kMulAdd };

// Op::kAdd:    out = a + b          Op::kMul:    out = a * b
// Op::kAxpy:   out += alpha * a     Op::kMulAdd: out += a * b
// a, b, out (n); b unread by kAxpy (may be null).
template <Op kOp>
__global__ void ArithKernel(const float* a, const float* b, float* out, float alpha, int64_t n) {
  SY_GRID_STRIDE(i, n) {
    if constexpr (kOp == Op::kAdd) {
      out[i] = __fadd_rn(a[i], b[i]);
    } else if constexpr (kOp == Op::kMul) {
      out[i] = __fmul_rn(a[i], b[i]);
    } else if constexpr (kOp == Op::kAxpy) {
      out[i] = __fadd_rn(out[i], __fmul_rn(alpha, a[i]));
    } else {
      out[i] = __fadd_rn(out[i], __fmul_rn(a[i], b[i]));
    }
  }
}

// out (n) = value; T is float, or uint16_t for bf16 bits.
template <typename T>
__global__ void FillKernel(T* out, T value, int64_t n) {
  SY_GRID_STRIDE(i, n) { out[i] = value; }
}

// ZeroManyKernel's table: up to kZeroManyBatch tensors' addresses and sizes, passed by value
// (about 1.5 KB of the kernel's parameters), and the blocks each one gets, laid end to end
// (ZeroManyBlocks): as many as its 16-byte words need at kThreads a block, at most
// kZeroMaxBlocks (the threads then stride), so that a bias takes one block and an expert
// weight's gradient a thousand, not every tensor the largest one's grid.
constexpr int kZeroManyBatch = 64;
constexpr int64_t kZeroMaxBlocks = 1024;
struct ZeroTable {
  int count = 0;
  void* ptr[kZeroManyBatch] = {};
  int64_t bytes[kZeroManyBatch] = {};
  int64_t first_block[kZeroManyBatch + 1] = {};  // tensor i: [first_block[i], first_block[i + 1])
};

// Host code: fills table.first_block for its count tensors; returns the grid (the blocks in all).
inline unsigned ZeroManyBlocks(ZeroTable& table, int64_t max_blocks = kZeroMaxBlocks) {
  int64_t total = 0;
  for (int i = 0; i < table.count; ++i) {
    table.first_block[i] = total;
    const int64_t words = (table.bytes[i] + 15) / 16;
    total += std::clamp<int64_t>((words + kThreads - 1) / kThreads, 1, max_blocks);
  }
  table.first_block[table.count] = total;
  return static_cast<unsigned>(total);
}

struct alignas(16) Words16 {  // one 16-byte store
  uint32_t w[4] = {};
};

// Each block zeroes its tensor's share (ZeroManyBlocks), the tensor's blocks striding over it
// in 16-byte words where its address and size allow, else 4-byte words, else bytes.
__global__ void ZeroManyKernel(ZeroTable table) {
  int t = 0;
  while (static_cast<int64_t>(blockIdx.x) >= table.first_block[t + 1]) ++t;
  char* p = static_cast<char*>(table.ptr[t]);
  const int64_t bytes = table.bytes[t];
  const int64_t blocks = table.first_block[t + 1] - table.first_block[t];
  const int64_t stride = blocks * blockDim.x;
  const int64_t start = (blockIdx.x - table.first_block[t]) * blockDim.x + threadIdx.x;
  const uintptr_t address = reinterpret_cast<uintptr_t>(p);
  if (address % 16 == 0 && bytes % 16 == 0) {
    Words16* w = reinterpret_cast<Words16*>(p);
    for (int64_t i = start; i < bytes / 16; i += stride) w[i] = Words16{};
  } else if (address % 4 == 0 && bytes % 4 == 0) {
    uint32_t* w = reinterpret_cast<uint32_t*>(p);
    for (int64_t i = start; i < bytes / 4; i += stride) w[i] = 0;
  } else {
    for (int64_t i = start; i < bytes; i += stride) p[i] = 0;
  }
}

// f32 -> bf16 bits with the integer rounding of BFloat16::FromFloat (engine/core/dtype.h):
// round to nearest even; a NaN keeps its sign and top payload bits and is made quiet.
// (__float2bfloat16_rn rounds numbers the same way but returns one canonical NaN.)
__device__ __forceinline__ uint16_t F32ToBf16Bits(float f) {
  uint32_t u = __float_as_uint(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40u);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// The casts take N = 1 element a thread, or N = 4 (a 16-byte f32 access and an 8-byte bf16
// one) when CastQuadsFit: the grid then strides over n / 4 quads, and the last n % 4 elements
// go to block 0's first threads.
template <int N>
__device__ __forceinline__ bool CastTail(int64_t n, int64_t& i) {
  if (N == 1 || blockIdx.x != 0 || threadIdx.x >= n % N) return false;
  i = n / N * N + threadIdx.x;
  return true;
}

// True when both arrays are aligned for the quads (16 bytes for f32, 8 for bf16). Host code.
inline bool CastQuadsFit(const void* f32, const void* bf16) {
  return reinterpret_cast<uintptr_t>(f32) % 16 == 0 && reinterpret_cast<uintptr_t>(bf16) % 8 == 0;
}

// src, dst (n).
template <int N = 1>
__global__ void F32ToBf16Kernel(const float* src, uint16_t* dst, int64_t n) {
  SY_GRID_STRIDE(q, n / N) {
    const int64_t i = q * N;
    if constexpr (N == 4) {
      const Vals<4> v = LoadVals<4>(src + i);
      uint16_t b[4];
#pragma unroll
      for (int e = 0; e < 4; ++e) b[e] = F32ToBf16Bits(v.v[e]);
      *reinterpret_cast<Bf16x4*>(dst + i) = Bf16x4{b[0] | static_cast<uint32_t>(b[1]) << 16,
                                                   b[2] | static_cast<uint32_t>(b[3]) << 16};
    } else {
      dst[i] = F32ToBf16Bits(src[i]);
    }
  }
  if (int64_t i = 0; CastTail<N>(n, i)) dst[i] = F32ToBf16Bits(src[i]);
}

// src, dst (n): exact.
template <int N = 1>
__global__ void Bf16ToF32Kernel(const uint16_t* src, float* dst, int64_t n) {
  SY_GRID_STRIDE(q, n / N) {
    const int64_t i = q * N;
    if constexpr (N == 4) {
      StoreVals<4>(dst + i, LoadVals<4>(reinterpret_cast<const __nv_bfloat16*>(src + i)));
    } else {
      dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
    }
  }
  if (int64_t i = 0; CastTail<N>(n, i)) {
    dst[i] = __uint_as_float(static_cast<uint32_t>(src[i]) << 16);
  }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::elementwise
