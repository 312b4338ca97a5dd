#include "dense/parameter.h"

namespace switchyard::dense {

Status CheckParameter(const std::string& what, const Tensor& t, const Shape& shape, Device device) {
  if (!t.defined()) return InvalidArgument(what, " is missing; expected ", ShapeString(shape));
  if (t.shape() != shape) {
    return InvalidArgument(what, " has shape ", ShapeString(t.shape()), ", expected ",
                           ShapeString(shape));
  }
  if (t.dtype() != DType::kF32) {
    return InvalidArgument(what, " is ", DTypeName(t.dtype()), ", expected f32");
  }
  if (t.device() != device) {
    return InvalidArgument(what, " is on ", t.device(), ", expected ", device);
  }
  return OkStatus();
}

Tensor Filled(const Shape& shape, float value, Device device, DeviceContext* ctx) {
  Tensor host = Tensor::FromVector(std::vector<float>(NumElements(shape), value), shape);
  return device.is_cpu() ? host : host.To(device, ctx);
}

}  // namespace switchyard::dense
