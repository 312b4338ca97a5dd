// Argument checks and device dispatch for kernels/norm.h.
#include "kernels/check.h"
#include "kernels/norm.h"

#include "kernels/dispatch.h"
#include "kernels/elementwise.h"

namespace switchyard::kernels {
namespace {

// x is (..., d) for the weight's d; returns the row count N.
int64_t CheckRows(const Tensor& x, const Tensor& weight, Device device, const char* op) {
  CheckTensorOn(x, DType::kF32, device, op, "x");
  CheckTensorOn(weight, DType::kF32, device, op, "weight");
  const int64_t d = weight.numel();
  SY_CHECK(x.ndim() >= 1 && x.dim(-1) == d)
      << op << ": x " << ShapeString(x.shape()) << " for a weight of " << d;
  return d == 0 ? 0 : x.numel() / d;
}

void CheckVector(const Tensor& t, int64_t n, Device device, const char* op, const char* what) {
  CheckTensorOn(t, DType::kF32, device, op, what);
  SY_CHECK(t.numel() == n) << op << ": " << what << " " << ShapeString(t.shape()) << ", expected "
                           << n << " elements";
}

void CheckSameShape(const Tensor& x, const Tensor& t, Device device, const char* op,
                    const char* what) {
  CheckTensorOn(t, DType::kF32, device, op, what);
  SY_CHECK(x.shape() == t.shape()) << op << ": " << what << " " << ShapeString(t.shape())
                                   << ", expected " << ShapeString(x.shape());
}

// A forward's output y: x's shape, f32 or bf16 (the products' operand, rounded as written).
void CheckOutput(const Tensor& x, const Tensor& y, Device device, const char* op) {
  SY_CHECK(y.dtype() == DType::kF32 || y.dtype() == DType::kBF16)
      << op << ": y is " << DTypeName(y.dtype()) << ", not f32 or bf16";
  CheckTensorOn(y, y.dtype(), device, op, "y");
  SY_CHECK(x.shape() == y.shape()) << op << ": y " << ShapeString(y.shape()) << ", expected "
                                   << ShapeString(x.shape());
  if (y.dtype() == DType::kBF16 && y.numel() > 0) {
    const char* xb = static_cast<const char*>(x.raw_data());
    const char* yb = static_cast<const char*>(y.raw_data());
    SY_CHECK(yb + y.numel() * 2 <= xb || xb + x.numel() * 4 <= yb)
        << op << ": a bf16 y shares memory with x";
  }
}

// The CPU's forward into y: `f32_op(y32)` on y, or for a bf16 y on an f32 tensor then rounded
// into y (the bits the CUDA kernels store).
template <typename Op>
void CpuForwardInto(Tensor& y, Op f32_op) {
  if (y.dtype() == DType::kF32) {
    f32_op(y);
    return;
  }
  Tensor y32 = Tensor::Empty(y.shape(), DType::kF32);
  f32_op(y32);
  cpu::Cast(y32, y);
}

// Write::kAdd reads dx while dy is read: they must not share memory.
void CheckAddInto(const Tensor& dx, const Tensor& dy, Write write, const char* op) {
  if (write != Write::kAdd) return;
  const char* a = static_cast<const char*>(dx.raw_data());
  const char* b = static_cast<const char*>(dy.raw_data());
  const int64_t bytes = dx.numel() * static_cast<int64_t>(sizeof(float));
  SY_CHECK(a + bytes <= b || b + bytes <= a)
      << op << ": dx and dy share memory, which adding into dx (Write::kAdd) cannot take";
}

}  // namespace

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& y, Tensor& mean, Tensor& rstd, DeviceContext* ctx) {
  constexpr const char* kOp = "LayerNormForward";
  SY_CHECK(y.defined()) << kOp << ": y is undefined";
  const Device dev = y.device();
  const int64_t n = CheckRows(x, weight, dev, kOp);
  if (bias.defined()) CheckVector(bias, weight.numel(), dev, kOp, "bias");
  CheckOutput(x, y, dev, kOp);
  CheckVector(mean, n, dev, kOp, "mean");
  CheckVector(rstd, n, dev, kOp, "rstd");
  SY_DISPATCH_DEVICE(y, ctx, CpuForwardInto(y, [&](Tensor& yo) {
                       cpu::LayerNormForward(x, weight, bias, eps, yo, mean, rstd);
                     }),
                     cuda::LayerNormForward(x, weight, bias, eps, y, mean, rstd, ctx));
}

void LayerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight,
                       Tensor& dbias, DeviceContext* ctx, Write write) {
  constexpr const char* kOp = "LayerNormBackward";
  SY_CHECK(dx.defined()) << kOp << ": dx is undefined";
  const Device dev = dx.device();
  const int64_t n = CheckRows(x, weight, dev, kOp);
  const int64_t d = weight.numel();
  CheckVector(mean, n, dev, kOp, "mean");
  CheckVector(rstd, n, dev, kOp, "rstd");
  CheckSameShape(x, dy, dev, kOp, "dy");
  CheckSameShape(x, dx, dev, kOp, "dx");
  CheckVector(dweight, d, dev, kOp, "dweight");
  if (dbias.defined()) CheckVector(dbias, d, dev, kOp, "dbias");
  CheckAddInto(dx, dy, write, kOp);
  SY_DISPATCH_DEVICE(
      dx, ctx, cpu::LayerNormBackward(x, weight, mean, rstd, dy, dx, dweight, dbias, write),
      cuda::LayerNormBackward(x, weight, mean, rstd, dy, dx, dweight, dbias, write, ctx));
}

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd,
                    DeviceContext* ctx) {
  constexpr const char* kOp = "RmsNormForward";
  SY_CHECK(y.defined()) << kOp << ": y is undefined";
  const Device dev = y.device();
  const int64_t n = CheckRows(x, weight, dev, kOp);
  CheckOutput(x, y, dev, kOp);
  CheckVector(rstd, n, dev, kOp, "rstd");
  SY_DISPATCH_DEVICE(y, ctx, CpuForwardInto(y, [&](Tensor& yo) {
                       cpu::RmsNormForward(x, weight, eps, yo, rstd);
                     }),
                     cuda::RmsNormForward(x, weight, eps, y, rstd, ctx));
}

void RmsNormBackward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                     Tensor& dx, Tensor& dweight, DeviceContext* ctx, Write write) {
  constexpr const char* kOp = "RmsNormBackward";
  SY_CHECK(dx.defined()) << kOp << ": dx is undefined";
  const Device dev = dx.device();
  const int64_t n = CheckRows(x, weight, dev, kOp);
  CheckVector(rstd, n, dev, kOp, "rstd");
  CheckSameShape(x, dy, dev, kOp, "dy");
  CheckSameShape(x, dx, dev, kOp, "dx");
  CheckVector(dweight, weight.numel(), dev, kOp, "dweight");
  CheckAddInto(dx, dy, write, kOp);
  SY_DISPATCH_DEVICE(dx, ctx, cpu::RmsNormBackward(x, weight, rstd, dy, dx, dweight, write),
                     cuda::RmsNormBackward(x, weight, rstd, dy, dx, dweight, write, ctx));
}

namespace {
// x, r and sum of one shape; y a separate tensor of that shape.
void CheckResidual(const Tensor& x, const Tensor& r, const Tensor& sum, const Tensor& y,
                   Device dev, const char* op) {
  CheckSameShape(x, r, dev, op, "r");
  CheckSameShape(x, sum, dev, op, "sum");
  CheckOutput(x, y, dev, op);
  SY_CHECK(y.numel() == 0 || (y.raw_data() != x.raw_data() && y.raw_data() != r.raw_data() &&
                              y.raw_data() != sum.raw_data()))
      << op << ": y must not share memory with x, r or sum";
}
}  // namespace

void AddLayerNormForward(const Tensor& x, const Tensor& r, const Tensor& weight,
                         const Tensor& bias, float eps, Tensor& sum, Tensor& y, Tensor& mean,
                         Tensor& rstd, DeviceContext* ctx) {
  constexpr const char* kOp = "AddLayerNormForward";
  SY_CHECK(y.defined() && sum.defined()) << kOp << ": y or sum is undefined";
  const Device dev = y.device();
  const int64_t n = CheckRows(x, weight, dev, kOp);
  if (bias.defined()) CheckVector(bias, weight.numel(), dev, kOp, "bias");
  CheckResidual(x, r, sum, y, dev, kOp);
  CheckVector(mean, n, dev, kOp, "mean");
  CheckVector(rstd, n, dev, kOp, "rstd");
  SY_DISPATCH_DEVICE(y, ctx, CpuForwardInto(y, [&](Tensor& yo) {
                       cpu::AddLayerNormForward(x, r, weight, bias, eps, sum, yo, mean, rstd);
                     }),
                     cuda::AddLayerNormForward(x, r, weight, bias, eps, sum, y, mean, rstd, ctx));
}

void AddRmsNormForward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                       Tensor& sum, Tensor& y, Tensor& rstd, DeviceContext* ctx) {
  constexpr const char* kOp = "AddRmsNormForward";
  SY_CHECK(y.defined() && sum.defined()) << kOp << ": y or sum is undefined";
  const Device dev = y.device();
  const int64_t n = CheckRows(x, weight, dev, kOp);
  CheckResidual(x, r, sum, y, dev, kOp);
  CheckVector(rstd, n, dev, kOp, "rstd");
  SY_DISPATCH_DEVICE(y, ctx, CpuForwardInto(y, [&](Tensor& yo) {
                       cpu::AddRmsNormForward(x, r, weight, eps, sum, yo, rstd);
                     }),
                     cuda::AddRmsNormForward(x, r, weight, eps, sum, y, rstd, ctx));
}

}  // namespace switchyard::kernels
