// Check macros for the CUDA runtime, cuBLAS and NCCL. Each failure prints the rank,
// file:line, the failed call and the library's own error string, then aborts.
// Only for translation units of the CUDA backend (needs the CUDA headers, not nvcc).
#pragma once

#include <cuda_runtime.h>

#include "engine/core/check.h"
#include "engine/core/cublas_api.h"

#define SY_CUDA_CHECK(expr)                                                          \
  do {                                                                               \
    cudaError_t sy_cuda_err_ = (expr);                                               \
    SY_CHECK(sy_cuda_err_ == cudaSuccess)                                            \
        << "CUDA error in " #expr ": " << cudaGetErrorName(sy_cuda_err_) << ": "     \
        << cudaGetErrorString(sy_cuda_err_);                                         \
  } while (0)

// After a kernel launch: catches bad launch configurations at the launch site.
#define SY_CUDA_CHECK_LAUNCH() SY_CUDA_CHECK(cudaGetLastError())

#define SY_CUBLAS_CHECK(expr)                                                                    \
  do {                                                                                           \
    cublasStatus_t sy_cublas_err_ = (expr);                                                      \
    SY_CHECK(sy_cublas_err_ == CUBLAS_STATUS_SUCCESS)                                            \
        << "cuBLAS error in " #expr ": " << ::switchyard::Cublas().GetStatusName(sy_cublas_err_) \
        << ": " << ::switchyard::Cublas().GetStatusString(sy_cublas_err_);                       \
  } while (0)

#ifdef SY_HAVE_NCCL
#include <nccl.h>
#define SY_NCCL_CHECK(expr)                                                          \
  do {                                                                               \
    ncclResult_t sy_nccl_err_ = (expr);                                              \
    SY_CHECK(sy_nccl_err_ == ncclSuccess)                                            \
        << "NCCL error in " #expr ": " << ncclGetErrorString(sy_nccl_err_) << " ("   \
        << ncclGetLastError(nullptr) << ")";                                         \
  } while (0)
#endif
