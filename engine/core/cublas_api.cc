#include "engine/core/cublas_api.h"

#include <dlfcn.h>

#include <atomic>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "engine/core/check.h"
#include "engine/core/status.h"

#ifndef SWITCHYARD_CUDA_LIB_DIR
#define SWITCHYARD_CUDA_LIB_DIR ""
#endif

namespace switchyard {
namespace {

std::atomic<bool> loaded{false};

template <typename Fn>
absl::Status Resolve(void* handle, const char* library, const char* symbol, Fn* fn) {
  dlerror();
  void* address = dlsym(handle, symbol);
  if (address == nullptr) return FailedPrecondition(library, " has no ", symbol);
  *fn = reinterpret_cast<Fn>(address);
  return OkStatus();
}

absl::StatusOr<const CublasApi*> Load() {
  static CublasApi api;
  // cuBLAS needs cuBLASLt: loading it first keeps one copy of each in the process.
  SY_ASSIGN_OR_RETURN(void* lt, internal::OpenLibrary("libcublasLt", SWITCHYARD_CUDA_LIB_DIR));
  SY_ASSIGN_OR_RETURN(void* blas, internal::OpenLibrary("libcublas", SWITCHYARD_CUDA_LIB_DIR));
  // The names after the headers' macros (cublasCreate is cublasCreate_v2).
#define SY_STRINGIZE(x) #x
#define SY_NAME(x) SY_STRINGIZE(x)
#define SY_BLAS(field, fn) SY_RETURN_IF_ERROR(Resolve(blas, "libcublas", SY_NAME(fn), &api.field))
#define SY_LT(field, fn) SY_RETURN_IF_ERROR(Resolve(lt, "libcublasLt", SY_NAME(fn), &api.field))
  SY_BLAS(Create, cublasCreate);
  SY_BLAS(Destroy, cublasDestroy);
  SY_BLAS(SetStream, cublasSetStream);
  SY_BLAS(GemmEx, cublasGemmEx);
  SY_BLAS(GemmStridedBatchedEx, cublasGemmStridedBatchedEx);
  SY_BLAS(GetStatusName, cublasGetStatusName);
  SY_BLAS(GetStatusString, cublasGetStatusString);
  SY_LT(LtCreate, cublasLtCreate);
  SY_LT(LtGetVersion, cublasLtGetVersion);
  SY_LT(LtMatmul, cublasLtMatmul);
  SY_LT(LtMatmulAlgoGetHeuristic, cublasLtMatmulAlgoGetHeuristic);
  SY_LT(LtMatmulDescCreate, cublasLtMatmulDescCreate);
  SY_LT(LtMatmulDescSetAttribute, cublasLtMatmulDescSetAttribute);
  SY_LT(LtMatmulPreferenceCreate, cublasLtMatmulPreferenceCreate);
  SY_LT(LtMatmulPreferenceDestroy, cublasLtMatmulPreferenceDestroy);
  SY_LT(LtMatmulPreferenceSetAttribute, cublasLtMatmulPreferenceSetAttribute);
  SY_LT(LtMatrixLayoutCreate, cublasLtMatrixLayoutCreate);
#undef SY_LT
#undef SY_BLAS
#undef SY_NAME
#undef SY_STRINGIZE
  loaded.store(true);
  return &api;
}

}  // namespace

const absl::StatusOr<const CublasApi*>& LoadCublas() {
  static const absl::StatusOr<const CublasApi*> api = Load();
  return api;
}

const CublasApi& Cublas() {
  const absl::StatusOr<const CublasApi*>& api = LoadCublas();
  SY_CHECK(api.ok()) << api.status().message();
  return **api;
}

bool CublasLoaded() { return loaded.load(); }

namespace internal {

absl::StatusOr<void*> OpenLibrary(const std::string& name, const std::string& dir) {
  const std::string soname = absl::StrCat(name, ".so.", CUBLAS_VER_MAJOR);
  std::vector<std::string> paths = {soname};
  if (!dir.empty()) paths.insert(paths.begin(), absl::StrCat(dir, "/", soname));
  std::string tried;
  for (const std::string& path : paths) {
    if (void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL)) return handle;
    const char* why = dlerror();
    absl::StrAppend(&tried, tried.empty() ? "" : "; ", why != nullptr ? why : path);
  }
  return FailedPrecondition("cannot load ", soname, " (", tried,
                            "): the CUDA backend needs the cuBLAS of CUDA ", CUBLAS_VER_MAJOR,
                            "; put its lib directory on LD_LIBRARY_PATH");
}

}  // namespace internal

}  // namespace switchyard
