// Shared helpers for the CUDA kernels' host side: the context's stream and cuBLAS handle,
// host<->device copies of small tables and scratch memory; with the device helpers of
// kernels/cuda/device_common.cuh. Every kernel family in kernels/cuda/*.cu includes this and
// nothing else of the backend's plumbing.
#pragma once

#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <cstdint>
#include <vector>

#include "engine/core/cuda_check.h"
#include "engine/core/device_context.h"
#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda {

// A comparison switch from the environment (SWITCHYARD_CUBLASLT, SWITCHYARD_GROUPED_WIDE,
// SWITCHYARD_FLASH_PREFETCH): "0" turns it off, "1" on, unset or anything else gives
// `fallback`. Host code; callers read it once (a function-local static).
inline bool EnvSwitch(const char* name, bool fallback) {
  const char* v = std::getenv(name);
  if (v == nullptr) return fallback;
  if (std::strcmp(v, "0") == 0) return false;
  if (std::strcmp(v, "1") == 0) return true;
  return fallback;
}

inline cudaStream_t StreamOf(DeviceContext* ctx) {
  return static_cast<cudaStream_t>(ctx->stream());
}
inline cublasHandle_t CublasOf(DeviceContext* ctx) {
  return static_cast<cublasHandle_t>(ctx->cublas());
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

// Lets `kernel` take `bytes` of dynamic shared memory: past the default 48 KiB a kernel must
// opt in (cudaFuncAttributeMaxDynamicSharedMemorySize) before its launch.
template <typename Kernel>
void AllowSharedMemory(Kernel kernel, int bytes) {
  if (bytes > 48 * 1024) {
    SY_CUDA_CHECK(
        cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    // A hint that the SM's unified L1 / shared memory favour shared memory for this kernel,
    // so that its launch bounds' CTAs an SM (2 of the 101 KB Hopper GEMM tiles) fit at once.
    SY_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributePreferredSharedMemoryCarveout,
                                       cudaSharedmemCarveoutMaxShared));
  }
}

// Bytes of a u8 scratch tensor on ctx's device (at least 1).
inline Tensor Scratch(size_t bytes, DeviceContext* ctx) {
  return Tensor::Empty({static_cast<int64_t>(std::max<size_t>(bytes, 1))}, DType::kU8,
                       ctx->device());
}

// Calls launch with t's data as float* or, for a bf16 t, __nv_bfloat16* (const for a const
// t): the kernels templated on an f32-or-bf16 operand (kernels/cuda/device_common.cuh's
// LoadF32 and StoreAs) take either.
template <typename Launch>
void WithF32OrBf16(const Tensor& t, Launch launch) {
  if (t.dtype() == DType::kBF16) {
    launch(static_cast<const __nv_bfloat16*>(t.raw_data()));
  } else {
    launch(t.data<float>());
  }
}
template <typename Launch>
void WithF32OrBf16(Tensor& t, Launch launch) {
  if (t.dtype() == DType::kBF16) {
    launch(static_cast<__nv_bfloat16*>(t.raw_data()));
  } else {
    launch(t.data<float>());
  }
}

}  // namespace switchyard::kernels::cuda
