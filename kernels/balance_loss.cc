// Argument checks and device dispatch for kernels/balance_loss.h.
#include "kernels/balance_loss.h"

#include "kernels/check.h"
#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// counts (k E + 1) i64 on `device`, for E experts; returns k.
int64_t CheckCounts(const Tensor& counts, int64_t experts, Device device, const char* op) {
  CheckTensorOn(counts, DType::kI64, device, op, "counts", "the first tensor");
  SY_CHECK(experts > 0 && counts.numel() >= 1 && (counts.numel() - 1) % experts == 0)
      << op << ": counts " << ShapeString(counts.shape()) << " for " << experts << " experts";
  return (counts.numel() - 1) / experts;
}

}  // namespace

void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values, DeviceContext* ctx) {
  constexpr const char* kOp = "BalanceValuesInto";
  SY_CHECK(counts.defined() && prob_sums.defined()) << kOp << ": undefined sums";
  const int64_t e = prob_sums.numel();
  CheckTensorOn(prob_sums, DType::kF32, counts.device(), kOp, "prob_sums", "counts");
  CheckTensorOn(values, DType::kF64, counts.device(), kOp, "values", "counts");
  const int64_t k = CheckCounts(counts, e, counts.device(), kOp);
  SY_CHECK(k == top_k && values.numel() == e + 2)
      << kOp << ": counts of " << k << " slots for top_k " << top_k << ", values "
      << ShapeString(values.shape()) << " for " << e << " experts";
  SY_DISPATCH_DEVICE(counts, ctx,
                     cpu::BalanceValuesInto(counts, prob_sums, tokens, top_k, coef, values),
                     cuda::BalanceValuesInto(counts, prob_sums, tokens, top_k, coef, values, ctx));
}

void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, DeviceContext* ctx) {
  constexpr const char* kOp = "AddBalanceColumn";
  SY_CHECK(dprobs.defined() && dprobs.ndim() == 2) << kOp << ": dprobs " << dprobs.DebugString();
  CheckTensorOn(dprobs, DType::kF32, dprobs.device(), kOp, "dprobs", "dprobs");
  const int64_t k = CheckCounts(counts, dprobs.dim(1), dprobs.device(), kOp);
  SY_CHECK_EQ(k, top_k) << kOp << ": counts of " << k << " slots for top_k " << top_k;
  SY_DISPATCH_DEVICE(dprobs, ctx,
                     cpu::AddBalanceColumn(dprobs, counts, tokens, top_k, coef, grad),
                     cuda::AddBalanceColumn(dprobs, counts, tokens, top_k, coef, grad, ctx));
}

}  // namespace switchyard::kernels
