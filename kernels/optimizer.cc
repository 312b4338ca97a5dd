// Argument checks and device dispatch for kernels/optimizer.h, and the AdamW scalars both
// implementations share.
#include "kernels/check.h"
#include "kernels/optimizer.h"

#include <cmath>

#include "engine/core/counters.h"
#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

void CheckLike(const Tensor& param, const Tensor& t, const char* op, const char* what) {
  CheckTensorOn(t, DType::kF32, param.device(), op, what, "the first tensor");
  SY_CHECK(param.shape() == t.shape()) << op << ": " << what << " " << ShapeString(t.shape())
                                       << ", expected " << ShapeString(param.shape());
}

void CheckAdamW(const Tensor& param, const Tensor& grad, const Tensor& exp_avg,
                const Tensor& exp_avg_sq, Device device, const char* op) {
  CheckTensorOn(param, DType::kF32, device, op, "param", "the first tensor");
  CheckLike(param, grad, op, "grad");
  CheckLike(param, exp_avg, op, "exp_avg");
  CheckLike(param, exp_avg_sq, op, "exp_avg_sq");
}

// One partial per tensor (SumSquaresPartition's CPU layout).
void CpuSumSquaresPartials(std::span<const Tensor> tensors, Tensor& partials) {
  SY_CHECK_EQ(partials.numel(), static_cast<int64_t>(tensors.size())) << "SumSquaresPartials";
  const std::vector<double> sums = cpu::SumSquaresMany(tensors);
  for (size_t k = 0; k < sums.size(); ++k) partials.data<double>()[k] = sums[k];
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
    if (!t.shadow.defined()) continue;
    CheckTensorOn(t.shadow, DType::kBF16, first.device(), kOp, "shadow", "param 0");
    SY_CHECK(t.shadow.shape() == t.param.shape())
        << kOp << ": shadow " << ShapeString(t.shadow.shape()) << ", expected "
        << ShapeString(t.param.shape());
    counters::CountConversion(DType::kF32, DType::kBF16, t.param.numel());
    counters::CountWeightConversion(t.param.numel());
  }
  // The table goes into a recorded closure by value (kernels/dispatch.h).
  std::vector<AdamWTensors> table(tensors.begin(), tensors.end());
  SY_DISPATCH_DEVICE(first, ctx, cpu::AdamWUpdateMany(table, hp),
                     cuda::AdamWUpdateMany(tensors, hp, ctx));
}

void SgdUpdate(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum,
               float weight_decay, DeviceContext* ctx) {
  constexpr const char* kOp = "SgdUpdate";
  SY_CHECK(param.defined()) << kOp << ": param is undefined";
  CheckTensorOn(param, DType::kF32, param.device(), kOp, "param", "the first tensor");
  CheckLike(param, grad, kOp, "grad");
  if (momentum != 0.0f) CheckLike(param, momentum_buf, kOp, "momentum_buf");
  SY_DISPATCH_DEVICE(param, ctx,
                     cpu::SgdUpdate(param, grad, momentum_buf, lr, momentum, weight_decay),
                     cuda::SgdUpdate(param, grad, momentum_buf, lr, momentum, weight_decay, ctx));
}

double SumSquares(const Tensor& t, DeviceContext* ctx) {
  SY_CHECK(t.defined()) << "SumSquares: t is undefined";
  CheckTensorOn(t, DType::kF32, t.device(), "SumSquares", "t", "the first tensor");
  double sum = 0.0;
  SY_DISPATCH_DEVICE_NOW(t, ctx, sum = cpu::SumSquares(t), sum = cuda::SumSquares(t, ctx));
  counters::CountReadback("sum_squares");
  return sum;
}

std::vector<double> SumSquaresMany(std::span<const Tensor> tensors, DeviceContext* ctx) {
  if (tensors.empty()) return {};
  const Tensor& first = tensors.front();
  SY_CHECK(first.defined()) << "SumSquaresMany: tensor 0 is undefined";
  for (const Tensor& t : tensors) {
    CheckTensorOn(t, DType::kF32, first.device(), "SumSquaresMany", "a tensor", "the first tensor");
  }
  std::vector<double> sums;
  SY_DISPATCH_DEVICE_NOW(first, ctx, sums = cpu::SumSquaresMany(tensors),
                     sums = cuda::SumSquaresMany(tensors, ctx));
  counters::CountReadback("sum_squares");
  return sums;
}

std::vector<int64_t> SumSquaresPartition(std::span<const Tensor> tensors, Device device) {
  if (device.is_cpu()) {
    // One partial per tensor: its SumSquares.
    std::vector<int64_t> first(tensors.size() + 1);
    for (size_t k = 0; k <= tensors.size(); ++k) first[k] = static_cast<int64_t>(k);
    return first;
  }
  std::vector<int64_t> first;
  SY_CUDA_BRANCH(first = cuda::SumSquaresPartition(tensors));
  return first;
}

void SumSquaresPartials(std::span<const Tensor> tensors, Tensor& partials, DeviceContext* ctx) {
  if (tensors.empty()) return;
  const Tensor& first = tensors.front();
  for (const Tensor& t : tensors) {
    CheckTensorOn(t, DType::kF32, first.device(), "SumSquaresPartials", "a tensor",
                  "the first tensor");
  }
  CheckTensorOn(partials, DType::kF64, first.device(), "SumSquaresPartials", "partials",
                "the first tensor");
  const std::vector<Tensor> table(tensors.begin(), tensors.end());  // recorded by value
  SY_DISPATCH_DEVICE(first, ctx, CpuSumSquaresPartials(table, partials),
                     cuda::SumSquaresPartials(tensors, partials, ctx));
}

void ScaleInPlace(Tensor& t, float scale, DeviceContext* ctx) {
  SY_CHECK(t.defined()) << "ScaleInPlace: t is undefined";
  CheckTensorOn(t, DType::kF32, t.device(), "ScaleInPlace", "t", "the first tensor");
  SY_DISPATCH_DEVICE(t, ctx, cpu::ScaleInPlace(t, scale), cuda::ScaleInPlace(t, scale, ctx));
}

void ScaleMany(std::span<Tensor> tensors, float scale, DeviceContext* ctx) {
  if (tensors.empty()) return;
  const Tensor& first = tensors.front();
  SY_CHECK(first.defined()) << "ScaleMany: tensor 0 is undefined";
  for (const Tensor& t : tensors) {
    CheckTensorOn(t, DType::kF32, first.device(), "ScaleMany", "a tensor", "the first tensor");
  }
  std::vector<Tensor> table(tensors.begin(), tensors.end());  // recorded by value
  SY_DISPATCH_DEVICE(first, ctx, cpu::ScaleMany(table, scale),
                     cuda::ScaleMany(tensors, scale, ctx));
}

}  // namespace switchyard::kernels
