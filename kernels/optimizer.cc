// Argument checks and device dispatch for kernels/optimizer.h, and the AdamW scalars both
// implementations share.
#include "kernels/optimizer.h"

#include <cmath>

#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// `t` is defined, f32 and on `device` (that of the first tensor, the one dispatched on).
void CheckF32On(const Tensor& t, Device device, const char* op, const char* what) {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.device() == device) << op << ": " << what << " is on " << t.device()
                                 << " but the first tensor is on " << device;
  SY_CHECK(t.dtype() == DType::kF32)
      << op << ": " << what << " is " << DTypeName(t.dtype()) << ", expected f32";
}

void CheckLike(const Tensor& param, const Tensor& t, const char* op, const char* what) {
  CheckF32On(t, param.device(), op, what);
  SY_CHECK(param.shape() == t.shape()) << op << ": " << what << " " << ShapeString(t.shape())
                                       << ", expected " << ShapeString(param.shape());
}

void CheckAdamW(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, Device device, const char* op) {
  CheckF32On(param, device, op, "param");
  CheckLike(param, grad, op, "grad");
  CheckLike(param, exp_avg, op, "exp_avg");
  CheckLike(param, exp_avg_sq, op, "exp_avg_sq");
}

void CheckStep(const AdamWStep& hp, const char* op) {
  SY_CHECK(hp.step >= 1) << op << ": step " << hp.step << " (steps count from 1)";
}

}  // namespace

AdamWScalars AdamWScalarsOf(const AdamWStep& hp, float weight_decay) {
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  AdamWScalars s;
  s.decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * weight_decay);
  s.step_size = static_cast<float>(hp.lr / bc1);
  s.bc2_sqrt = static_cast<float>(std::sqrt(bc2));
  return s;
}

void AdamWUpdate(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                 const AdamWStep& hp, DeviceContext* ctx) {
  constexpr const char* kOp = "AdamWUpdate";
  SY_CHECK(param.defined()) << kOp << ": param is undefined";
  CheckAdamW(param, grad, exp_avg, exp_avg_sq, param.device(), kOp);
  CheckStep(hp, kOp);
  SY_DISPATCH_DEVICE(param, ctx, cpu::AdamWUpdate(param, grad, exp_avg, exp_avg_sq, hp),
                     cuda::AdamWUpdate(param, grad, exp_avg, exp_avg_sq, hp, ctx));
}

void AdamWUpdateMany(std::span<AdamWTensors> tensors, const AdamWStep& hp, DeviceContext* ctx) {
  constexpr const char* kOp = "AdamWUpdateMany";
  CheckStep(hp, kOp);
  if (tensors.empty()) return;
  const Tensor& first = tensors.front().param;
  SY_CHECK(first.defined()) << kOp << ": param 0 is undefined";
  for (const AdamWTensors& t : tensors) {
    CheckAdamW(t.param, t.grad, t.exp_avg, t.exp_avg_sq, first.device(), kOp);
  }
  SY_DISPATCH_DEVICE(first, ctx, cpu::AdamWUpdateMany(tensors, hp),
                     cuda::AdamWUpdateMany(tensors, hp, ctx));
}

void SgdUpdate(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum,
               float weight_decay, DeviceContext* ctx) {
  constexpr const char* kOp = "SgdUpdate";
  SY_CHECK(param.defined()) << kOp << ": param is undefined";
  CheckF32On(param, param.device(), kOp, "param");
  CheckLike(param, grad, kOp, "grad");
  if (momentum != 0.0f) CheckLike(param, momentum_buf, kOp, "momentum_buf");
  SY_DISPATCH_DEVICE(param, ctx,
                     cpu::SgdUpdate(param, grad, momentum_buf, lr, momentum, weight_decay),
                     cuda::SgdUpdate(param, grad, momentum_buf, lr, momentum, weight_decay, ctx));
}

double SumSquares(const Tensor& t, DeviceContext* ctx) {
  SY_CHECK(t.defined()) << "SumSquares: t is undefined";
  CheckF32On(t, t.device(), "SumSquares", "t");
  double sum = 0.0;
  SY_DISPATCH_DEVICE(t, ctx, sum = cpu::SumSquares(t), sum = cuda::SumSquares(t, ctx));
  return sum;
}

std::vector<double> SumSquaresMany(std::span<const Tensor> tensors, DeviceContext* ctx) {
  if (tensors.empty()) return {};
  const Tensor& first = tensors.front();
  SY_CHECK(first.defined()) << "SumSquaresMany: tensor 0 is undefined";
  for (const Tensor& t : tensors) CheckF32On(t, first.device(), "SumSquaresMany", "a tensor");
  std::vector<double> sums;
  SY_DISPATCH_DEVICE(first, ctx, sums = cpu::SumSquaresMany(tensors),
                     sums = cuda::SumSquaresMany(tensors, ctx));
  return sums;
}

void ScaleInPlace(Tensor& t, float scale, DeviceContext* ctx) {
  SY_CHECK(t.defined()) << "ScaleInPlace: t is undefined";
  CheckF32On(t, t.device(), "ScaleInPlace", "t");
  SY_DISPATCH_DEVICE(t, ctx, cpu::ScaleInPlace(t, scale), cuda::ScaleInPlace(t, scale, ctx));
}

void ScaleMany(std::span<Tensor> tensors, float scale, DeviceContext* ctx) {
  if (tensors.empty()) return;
  const Tensor& first = tensors.front();
  SY_CHECK(first.defined()) << "ScaleMany: tensor 0 is undefined";
  for (const Tensor& t : tensors) CheckF32On(t, first.device(), "ScaleMany", "a tensor");
  SY_DISPATCH_DEVICE(first, ctx, cpu::ScaleMany(tensors, scale),
                     cuda::ScaleMany(tensors, scale, ctx));
}

}  // namespace switchyard::kernels
