// cuBLAS and cuBLASLt, loaded when a CUDA device first needs them rather than when the
// program starts. Linked, the two libraries cost every process about 0.2 s and 210 MB of
// resident memory before main (their relocations and static constructors): every CPU run of
// a CUDA build paid it, once per MPI rank. The entry points the engine calls are resolved by
// dlsym from the libraries of the toolkit it was built against (that toolkit's lib
// directory first, then the dynamic loader's search path: LD_LIBRARY_PATH, the runpath).
// Only for translation units of the CUDA backend (needs the CUDA headers, not nvcc).
#pragma once

#include <cublasLt.h>
#include <cublas_v2.h>

#include <string>

#include "absl/status/statusor.h"

namespace switchyard {

// cuBLAS's names without their prefix: Cublas().GemmEx is cublasGemmEx (the v2 API's). The
// two Ex products are named by type: C++ also sees inline overloads of them that take the
// compute type as a cudaDataType; these are the library's entry points.
struct CublasApi {
  using GemmExFn = cublasStatus_t (*)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int,
                                      int, int, const void*, const void*, cudaDataType, int,
                                      const void*, cudaDataType, int, const void*, void*,
                                      cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
  using GemmStridedBatchedExFn = cublasStatus_t (*)(
      cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void*,
      const void*, cudaDataType, int, long long, const void*, cudaDataType, int, long long,
      const void*, void*, cudaDataType, int, long long, int, cublasComputeType_t,
      cublasGemmAlgo_t);

  decltype(&cublasCreate) Create;
  decltype(&cublasDestroy) Destroy;
  decltype(&cublasSetStream) SetStream;
  GemmExFn GemmEx;
  GemmStridedBatchedExFn GemmStridedBatchedEx;
  decltype(&cublasGetStatusName) GetStatusName;
  decltype(&cublasGetStatusString) GetStatusString;
  decltype(&cublasLtCreate) LtCreate;
  decltype(&cublasLtGetVersion) LtGetVersion;
  decltype(&cublasLtMatmul) LtMatmul;
  decltype(&cublasLtMatmulAlgoGetHeuristic) LtMatmulAlgoGetHeuristic;
  decltype(&cublasLtMatmulDescCreate) LtMatmulDescCreate;
  decltype(&cublasLtMatmulDescSetAttribute) LtMatmulDescSetAttribute;
  decltype(&cublasLtMatmulPreferenceCreate) LtMatmulPreferenceCreate;
  decltype(&cublasLtMatmulPreferenceDestroy) LtMatmulPreferenceDestroy;
  decltype(&cublasLtMatmulPreferenceSetAttribute) LtMatmulPreferenceSetAttribute;
  decltype(&cublasLtMatrixLayoutCreate) LtMatrixLayoutCreate;
};

// Loads the two libraries on the first call (thread-safe) and every entry point above; the
// same result after. An error names the library or the entry point and where it looked.
const absl::StatusOr<const CublasApi*>& LoadCublas();
// LoadCublas's table; a failure to load is fatal, one line.
const CublasApi& Cublas();
// Whether this process has loaded cuBLAS (CPU runs never do).
bool CublasLoaded();

namespace internal {
// dlopen of NAME.so.<cuBLAS major> from DIR (when not empty), else wherever the loader finds
// it; the error names each path tried and why it failed.
absl::StatusOr<void*> OpenLibrary(const std::string& name, const std::string& dir);
}  // namespace internal

}  // namespace switchyard
