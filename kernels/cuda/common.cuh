// Shared helpers for the CUDA kernels: the context's stream and cuBLAS handle, grid sizes.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

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

}  // namespace switchyard::kernels::cuda
