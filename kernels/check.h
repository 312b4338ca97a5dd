// Argument checks shared by the dispatch files (kernels/<family>.cc): every tensor an op
// reads or writes is defined, on the device the op runs on (the output's), and of the
// expected dtype. One fatal line names the op, the argument and what is wrong with it.
#pragma once

#include "engine/core/check.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// t is defined and on `device`, where `owner` ("the output") decided the device.
inline void CheckDefinedOn(const Tensor& t, Device device, const char* op, const char* what,
                           const char* owner = "the output") {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.device() == device) << op << ": " << what << " is on " << t.device() << " but "
                                 << owner << " is on " << device;
}

// The same, and t holds `dtype`.
inline void CheckTensorOn(const Tensor& t, DType dtype, Device device, const char* op,
                          const char* what, const char* owner = "the output") {
  CheckDefinedOn(t, device, op, what, owner);
  SY_CHECK(t.dtype() == dtype) << op << ": " << what << " is " << DTypeName(t.dtype())
                               << ", expected " << DTypeName(dtype);
}

}  // namespace switchyard::kernels
