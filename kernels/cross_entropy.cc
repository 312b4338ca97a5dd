// Argument checks and device dispatch for kernels/cross_entropy.h. The targets' values are
// checked against the vocabulary by the implementations.
#include "kernels/check.h"
#include "kernels/cross_entropy.h"

#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// logits (N, V) f32 with V >= 1 and targets (N) i32 on `device`, and dlogits (if given)
// shaped like the logits.
void CheckArgs(const Tensor& logits, const Tensor& targets, const Tensor* dlogits, Device device,
               const char* op) {
  const char* owner = dlogits ? "dlogits" : "logits";
  if (dlogits) CheckTensorOn(*dlogits, DType::kF32, device, op, "dlogits", owner);
  CheckTensorOn(logits, DType::kF32, device, op, "logits", owner);
  CheckTensorOn(targets, DType::kI32, device, op, "targets", owner);
  SY_CHECK(logits.ndim() >= 1 && logits.dim(-1) >= 1)
      << op << ": logits " << ShapeString(logits.shape()) << " need a vocabulary dimension";
  const int64_t n = logits.numel() / logits.dim(-1);
  SY_CHECK_EQ(targets.numel(), n) << op << ": targets " << ShapeString(targets.shape())
                                  << " for logits " << ShapeString(logits.shape());
  if (dlogits) {
    SY_CHECK(dlogits->shape() == logits.shape())
        << op << ": dlogits " << ShapeString(dlogits->shape()) << ", logits "
        << ShapeString(logits.shape());
  }
}

// The CPU's sums written into sums (2) f64.
void CpuCrossEntropyInto(const Tensor& logits, const Tensor& targets, Tensor& dlogits,
                         double grad_scale, int32_t ignore_index, Tensor& sums) {
  const CrossEntropySums s = cpu::CrossEntropy(logits, targets, &dlogits, grad_scale,
                                               ignore_index, "CrossEntropyForwardBackwardInto");
  sums.data<double>()[0] = s.loss_sum;
  sums.data<double>()[1] = static_cast<double>(s.count);
}

}  // namespace

int64_t CountTargets(const Tensor& targets, int32_t ignore_index, DeviceContext* ctx) {
  SY_CHECK(targets.defined()) << "CountTargets: targets is undefined";
  CheckTensorOn(targets, DType::kI32, targets.device(), "CountTargets", "targets", "targets");
  int64_t count = 0;
  SY_DISPATCH_DEVICE_NOW(targets, ctx, count = cpu::CountTargets(targets, ignore_index),
                     count = cuda::CountTargets(targets, ignore_index, ctx));
  counters::CountReadback("cross_entropy.count_targets");
  return count;
}

CrossEntropySums CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                     int32_t ignore_index, DeviceContext* ctx) {
  constexpr const char* kOp = "CrossEntropyForward";
  SY_CHECK(logits.defined()) << kOp << ": logits is undefined";
  CheckArgs(logits, targets, nullptr, logits.device(), kOp);
  CrossEntropySums sums;
  SY_DISPATCH_DEVICE_NOW(
      logits, ctx, sums = cpu::CrossEntropy(logits, targets, nullptr, 0.0, ignore_index, kOp),
      sums = cuda::CrossEntropy(logits, targets, nullptr, 0.0, ignore_index, kOp, ctx));
  counters::CountReadback("cross_entropy");
  return sums;
}

CrossEntropySums CrossEntropyForwardBackward(const Tensor& logits, const Tensor& targets,
                                             Tensor& dlogits, double grad_scale,
                                             int32_t ignore_index, DeviceContext* ctx) {
  constexpr const char* kOp = "CrossEntropyForwardBackward";
  SY_CHECK(dlogits.defined()) << kOp << ": dlogits is undefined";
  CheckArgs(logits, targets, &dlogits, dlogits.device(), kOp);
  CrossEntropySums sums;
  SY_DISPATCH_DEVICE_NOW(
      dlogits, ctx,
      sums = cpu::CrossEntropy(logits, targets, &dlogits, grad_scale, ignore_index, kOp),
      sums = cuda::CrossEntropy(logits, targets, &dlogits, grad_scale, ignore_index, kOp, ctx));
  counters::CountReadback("cross_entropy");
  return sums;
}

void CrossEntropyForwardBackwardInto(const Tensor& logits, const Tensor& targets,
                                     Tensor& dlogits, double grad_scale, int32_t ignore_index,
                                     Tensor& sums, DeviceContext* ctx) {
  constexpr const char* kOp = "CrossEntropyForwardBackwardInto";
  SY_CHECK(dlogits.defined()) << kOp << ": dlogits is undefined";
  CheckArgs(logits, targets, &dlogits, dlogits.device(), kOp);
  CheckTensorOn(sums, DType::kF64, dlogits.device(), kOp, "sums", "dlogits");
  SY_CHECK_EQ(sums.numel(), 2) << kOp << ": sums " << ShapeString(sums.shape());
  SY_DISPATCH_DEVICE(
      dlogits, ctx, CpuCrossEntropyInto(logits, targets, dlogits, grad_scale, ignore_index, sums),
      cuda::CrossEntropyInto(logits, targets, dlogits, grad_scale, ignore_index, sums, ctx));
}

double CrossEntropyMean(const Tensor& logits, const Tensor& targets, Tensor& dlogits,
                        int32_t ignore_index, DeviceContext* ctx) {
  const int64_t count = CountTargets(targets, ignore_index, ctx);
  const double scale = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
  return CrossEntropyForwardBackward(logits, targets, dlogits, scale, ignore_index, ctx).Mean();
}

}  // namespace switchyard::kernels
