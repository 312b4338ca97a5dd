// Argument checks and device dispatch for kernels/softmax.h.
#include "kernels/softmax.h"

#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// `t` is defined, f32, on `device` (the output's) and of `shape`.
void CheckF32Like(const Tensor& t, Device device, const Shape& shape, const char* op,
                  const char* what) {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.device() == device) << op << ": " << what << " is on " << t.device()
                                 << " but the output is on " << device;
  SY_CHECK(t.dtype() == DType::kF32)
      << op << ": " << what << " is " << DTypeName(t.dtype()) << ", expected f32";
  SY_CHECK(t.shape() == shape) << op << ": " << what << " " << ShapeString(t.shape())
                               << ", expected " << ShapeString(shape);
}

// A non-empty tensor needs a non-empty last dimension (the rows' width).
void CheckColumns(const Tensor& t, const char* op) {
  SY_CHECK(t.numel() == 0 || (t.ndim() >= 1 && t.dim(-1) >= 1))
      << op << ": needs a non-empty last dimension, got " << ShapeString(t.shape());
}

}  // namespace

void SoftmaxForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  constexpr const char* kOp = "SoftmaxForward";
  SY_CHECK(y.defined()) << kOp << ": y is undefined";
  CheckF32Like(y, y.device(), y.shape(), kOp, "y");
  CheckF32Like(x, y.device(), y.shape(), kOp, "x");
  CheckColumns(x, kOp);
  SY_DISPATCH_DEVICE(y, ctx, cpu::SoftmaxForward(x, y), cuda::SoftmaxForward(x, y, ctx));
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  constexpr const char* kOp = "SoftmaxBackward";
  SY_CHECK(dx.defined()) << kOp << ": dx is undefined";
  CheckF32Like(dx, dx.device(), dx.shape(), kOp, "dx");
  CheckF32Like(y, dx.device(), dx.shape(), kOp, "y");
  CheckF32Like(dy, dx.device(), dx.shape(), kOp, "dy");
  CheckColumns(y, kOp);
  SY_DISPATCH_DEVICE(dx, ctx, cpu::SoftmaxBackward(y, dy, dx),
                     cuda::SoftmaxBackward(y, dy, dx, ctx));
}

}  // namespace switchyard::kernels
