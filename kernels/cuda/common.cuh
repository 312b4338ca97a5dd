// Shared helpers for the CUDA kernels: the context's stream and cuBLAS handle, grid sizes,
// grid-stride loops, warp/block reductions, host<->device copies of small tables, scratch
// memory and bf16 conversions. Every kernel family in
// kernels/cuda/*.cu includes this and nothing else of the backend's plumbing.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/core/cuda_check.h"
#include "engine/core/device_context.h"

namespace switchyard::kernels::cuda {

inline cudaStream_t StreamOf(DeviceContext* ctx) {
  return static_cast<cudaStream_t>(ctx->stream());
}
inline cublasHandle_t CublasOf(DeviceContext* ctx) {
  return static_cast<cublasHandle_t>(ctx->cublas());
}

// Blocks of `threads` covering n elements, capped so grid-stride loops cover the rest.
inline unsigned GridFor(int64_t n, int threads = 256) {
  int64_t blocks = (n + threads - 1) / threads;
  if (blocks < 1) blocks = 1;
  if (blocks > 65535 * 8) blocks = 65535 * 8;
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

// Copies a host vector to a new tensor on ctx's device (ordered on its stream; the host
// memory may go away on return).
template <typename T>
inline Tensor ToDevice(const std::vector<T>& host, DeviceContext* ctx) {
  return Tensor::FromVector(host, {static_cast<int64_t>(host.size())}).To(ctx->device(), ctx);
}

// The values of a device tensor, copied on ctx's stream after the work queued there (the
// context's stream does not synchronise with the legacy default stream).
template <typename T>
inline std::vector<T> ToHost(const Tensor& t, DeviceContext* ctx) {
  Tensor host = Tensor::Empty(t.shape(), t.dtype());
  host.CopyFrom(t, ctx);  // waits for the stream
  return host.ToVector<T>();
}

// Bytes of a u8 scratch tensor on ctx's device (at least 1).
inline Tensor Scratch(size_t bytes, DeviceContext* ctx) {
  return Tensor::Empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::kU8,
                       ctx->device());
}

// Round-to-nearest-even f32 -> bf16, and back, the same rounding as engine/core/dtype.h.
__device__ __forceinline__ __nv_bfloat16 ToBf16(float v) { return __float2bfloat16_rn(v); }
__device__ __forceinline__ float FromBf16(__nv_bfloat16 v) { return __bfloat162float(v); }

}  // namespace switchyard::kernels::cuda
