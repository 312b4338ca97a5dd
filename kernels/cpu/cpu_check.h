// Argument checks shared by the CPU reference kernels (norm, softmax, attention, rope,
// embedding, cross_entropy): a tensor is defined, on the host, contiguous in the expected
// dtype. A CUDA tensor is a fatal check naming the op until the CUDA backend lands.
#pragma once

#include "engine/core/check.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels::cpu {

// Checks that t is a defined host tensor of `dtype`; `op` names the caller.
inline void CheckCpu(const Tensor& t, DType dtype, const char* op, const char* what) {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.device().is_cpu()) << op << ": " << what << " on " << t.device()
                                << ": CUDA kernels for " << op << " land with the CUDA backend";
  SY_CHECK(t.dtype() == dtype) << op << ": " << what << " is " << DTypeName(t.dtype())
                               << ", expected " << DTypeName(dtype);
}

inline void CheckCpuF32(const Tensor& t, const char* op, const char* what) {
  CheckCpu(t, DType::kF32, op, what);
}

}  // namespace switchyard::kernels::cpu
