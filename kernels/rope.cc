// Argument checks and device dispatch for kernels/rope.h.
#include "kernels/rope.h"

#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// Checks input and output, then rotates by sign * angle on the output's device.
void Rotate(const Tensor& x, Tensor& y, float base, int64_t position_offset, float sign,
            const char* op, DeviceContext* ctx) {
  SY_CHECK(y.defined()) << op << ": output is undefined";
  SY_CHECK(x.defined()) << op << ": input is undefined";
  SY_CHECK(x.device() == y.device())
      << op << ": input is on " << x.device() << " but the output is on " << y.device();
  SY_CHECK(x.dtype() == DType::kF32 && y.dtype() == DType::kF32)
      << op << ": input is " << DTypeName(x.dtype()) << ", output " << DTypeName(y.dtype())
      << ", expected f32";
  SY_CHECK(x.ndim() == 4 && x.dim(3) % 2 == 0)
      << op << ": input is (B, S, H, hd) with hd even, got " << ShapeString(x.shape());
  SY_CHECK(x.shape() == y.shape())
      << op << ": input " << ShapeString(x.shape()) << ", output " << ShapeString(y.shape());
  SY_CHECK(base > 0.0f) << op << ": base=" << base;
  SY_DISPATCH_DEVICE(y, ctx, cpu::RopeRotate(x, y, base, position_offset, sign),
                     cuda::RopeRotate(x, y, base, position_offset, sign, ctx));
}

}  // namespace

void RopeForward(const Tensor& x, Tensor& y, float base, int64_t position_offset,
                 DeviceContext* ctx) {
  Rotate(x, y, base, position_offset, 1.0f, "RopeForward", ctx);
}

void RopeBackward(const Tensor& dy, Tensor& dx, float base, int64_t position_offset,
                  DeviceContext* ctx) {
  Rotate(dy, dx, base, position_offset, -1.0f, "RopeBackward", ctx);
}

}  // namespace switchyard::kernels
