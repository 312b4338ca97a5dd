// The device code of the random fills (kernels/cuda/random.cu, which launches it and describes
// the design): Philox (engine/core/philox.h, the CPU's own functions) at each element's global
// index; with the block size, which the .cu and the emulation test
// (tests/kernels/random_emulation_test.cc) both take from here.
#pragma once

#include <cstdint>

#include "engine/core/philox.h"
#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda::random_dev {
// Internal linkage: the emulation test compiles these kernels too, and links with random.cu's.
namespace {

constexpr int kThreads = 256;  // block of the grid-stride kernels

enum class Dist { kUniform, kNormal };

// at (kernels::DeviceRng's values), when not null: the key's stream and the first index are
// read here, {stream, first_token} -> (first_token + token_offset) * per_token.
template <typename T, Dist D>
__global__ void FillKernel(T* out, int64_t n, RngKey key, int64_t first, float a, float b,
                           const int64_t* at = nullptr, int64_t token_offset = 0,
                           int64_t per_token = 1) {
  if (at != nullptr) {
    key.stream = static_cast<uint64_t>(at[0]);
    first = (at[1] + token_offset) * per_token;
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t g = static_cast<uint64_t>(first + i);
    // Rounded as the CPU's lo + (hi - lo) u and mean + std z (no fused multiply-add).
    float v = D == Dist::kUniform
                  ? __fadd_rn(a, __fmul_rn(__fsub_rn(b, a), UniformAt(key, g)))
                  : __fadd_rn(a, __fmul_rn(b, NormalAt(key, g)));
    if constexpr (sizeof(T) == 4) {
      out[i] = v;
    } else {
      out[i] = __float2bfloat16_rn(v);
    }
  }
}

// x times FillKernel's uniform value (f32): out = x u (kAdd false) or out += x u (kAdd true),
// each rounded as the CPU's Mul / MulAdd. `at` as FillKernel's.
template <bool kAdd>
__global__ void MulUniformKernel(const float* x, float* out, int64_t n, RngKey key, int64_t first,
                                 float lo, float hi, const int64_t* at = nullptr,
                                 int64_t token_offset = 0, int64_t per_token = 1) {
  if (at != nullptr) {
    key.stream = static_cast<uint64_t>(at[0]);
    first = (at[1] + token_offset) * per_token;
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float u = __fadd_rn(lo, __fmul_rn(__fsub_rn(hi, lo),
                                            UniformAt(key, static_cast<uint64_t>(first + i))));
    const float v = __fmul_rn(x[i], u);
    out[i] = kAdd ? __fadd_rn(out[i], v) : v;
  }
}

__global__ void BitsKernel(int32_t* out, int64_t n, RngKey key, int64_t first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(RandomBitsAt(key, static_cast<uint64_t>(first + i)));
  }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::random_dev
