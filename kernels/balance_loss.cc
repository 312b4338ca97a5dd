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
                      float coef, float grad, Write write, DeviceContext* ctx) {
  constexpr const char* kOp = "AddBalanceColumn";
  SY_CHECK(dprobs.defined() && dprobs.ndim() == 2) << kOp << ": dprobs " << dprobs.DebugString();
  CheckTensorOn(dprobs, DType::kF32, dprobs.device(), kOp, "dprobs", "dprobs");
  const int64_t k = CheckCounts(counts, dprobs.dim(1), dprobs.device(), kOp);
  SY_CHECK_EQ(k, top_k) << kOp << ": counts of " << k << " slots for top_k " << top_k;
  SY_DISPATCH_DEVICE(dprobs, ctx,
                     cpu::AddBalanceColumn(dprobs, counts, tokens, top_k, coef, grad, write),
                     cuda::AddBalanceColumn(dprobs, counts, tokens, top_k, coef, grad, write,
                                            ctx));
}

namespace {

// The parts of a group of `tokens` rows in runs of part_tokens.
int64_t PartsOf(int64_t tokens, int64_t part_tokens, const char* op) {
  SY_CHECK(tokens >= 0 && part_tokens > 0)
      << op << ": " << tokens << " tokens in parts of " << part_tokens;
  return (tokens + part_tokens - 1) / part_tokens;
}

// counts (P, k E + 1) i64 for P parts of E experts on `device`; returns k.
int64_t CheckPartCounts(const Tensor& counts, int64_t parts, int64_t experts, Device device,
                        const char* op) {
  CheckTensorOn(counts, DType::kI64, device, op, "counts", "the first tensor");
  SY_CHECK(counts.ndim() == 2 && counts.dim(0) == parts && experts > 0 &&
           counts.dim(1) >= 1 && (counts.dim(1) - 1) % experts == 0)
      << op << ": counts " << ShapeString(counts.shape()) << " for " << parts << " parts of "
      << experts << " experts";
  return (counts.dim(1) - 1) / experts;
}

void CheckLoad(const Tensor& load, int64_t experts, Device device, const char* op) {
  CheckTensorOn(load, DType::kF32, device, op, "load", "the sums");
  SY_CHECK(load.numel() == experts) << op << ": load " << ShapeString(load.shape()) << " for "
                                    << experts << " experts";
}

}  // namespace

void PartBalanceSums(const Tensor& probs, const Tensor& indices, int64_t part_tokens,
                     Tensor& counts, Tensor& prob_sums, DeviceContext* ctx) {
  constexpr const char* kOp = "PartBalanceSums";
  SY_CHECK(probs.defined() && probs.ndim() == 2) << kOp << ": probs " << probs.DebugString();
  const Device dev = probs.device();
  const int64_t T = probs.dim(0), E = probs.dim(1), P = PartsOf(T, part_tokens, kOp);
  CheckTensorOn(probs, DType::kF32, dev, kOp, "probs", "probs");
  CheckTensorOn(indices, DType::kI32, dev, kOp, "indices", "probs");
  SY_CHECK(indices.ndim() == 2 && indices.dim(0) == T)
      << kOp << ": indices " << ShapeString(indices.shape()) << " for probs "
      << ShapeString(probs.shape());
  const int64_t k = CheckPartCounts(counts, P, E, dev, kOp);
  SY_CHECK_EQ(k, indices.dim(1)) << kOp << ": counts of " << k << " slots for top_k "
                                 << indices.dim(1);
  CheckTensorOn(prob_sums, DType::kF32, dev, kOp, "prob_sums", "probs");
  SY_CHECK(prob_sums.ndim() == 2 && prob_sums.dim(0) == P && prob_sums.dim(1) == E)
      << kOp << ": prob_sums " << ShapeString(prob_sums.shape()) << " for " << P
      << " parts of " << E << " experts";
  SY_DISPATCH_DEVICE(counts, ctx, cpu::PartBalanceSums(probs, indices, part_tokens, counts,
                                                       prob_sums),
                     cuda::PartBalanceSums(probs, indices, part_tokens, counts, prob_sums, ctx));
}

void PartBalanceValueInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                          int64_t part_tokens, int64_t top_k, float coef, Tensor& value,
                          DeviceContext* ctx) {
  constexpr const char* kOp = "PartBalanceValueInto";
  SY_CHECK(counts.defined() && prob_sums.defined()) << kOp << ": undefined sums";
  const int64_t P = PartsOf(tokens, part_tokens, kOp);
  CheckTensorOn(prob_sums, DType::kF32, counts.device(), kOp, "prob_sums", "counts");
  SY_CHECK(prob_sums.ndim() == 2 && prob_sums.dim(0) == P)
      << kOp << ": prob_sums " << ShapeString(prob_sums.shape()) << " for " << P << " parts";
  const int64_t k = CheckPartCounts(counts, P, prob_sums.dim(1), counts.device(), kOp);
  SY_CHECK_EQ(k, top_k) << kOp << ": counts of " << k << " slots for top_k " << top_k;
  CheckTensorOn(value, DType::kF64, counts.device(), kOp, "value", "counts");
  SY_CHECK_EQ(value.numel(), 1) << kOp << ": value " << ShapeString(value.shape());
  SY_DISPATCH_DEVICE(
      value, ctx,
      cpu::PartBalanceValueInto(counts, prob_sums, tokens, part_tokens, top_k, coef, value),
      cuda::PartBalanceValueInto(counts, prob_sums, tokens, part_tokens, top_k, coef, value,
                                 ctx));
}

void AddPartBalanceColumns(Tensor& dprobs, const Tensor& counts, int64_t part_tokens,
                           int64_t top_k, float coef, float grad, Write write,
                           DeviceContext* ctx) {
  constexpr const char* kOp = "AddPartBalanceColumns";
  SY_CHECK(dprobs.defined() && dprobs.ndim() == 2) << kOp << ": dprobs " << dprobs.DebugString();
  CheckTensorOn(dprobs, DType::kF32, dprobs.device(), kOp, "dprobs", "dprobs");
  const int64_t P = PartsOf(dprobs.dim(0), part_tokens, kOp);
  const int64_t k = CheckPartCounts(counts, P, dprobs.dim(1), dprobs.device(), kOp);
  SY_CHECK_EQ(k, top_k) << kOp << ": counts of " << k << " slots for top_k " << top_k;
  SY_DISPATCH_DEVICE(
      dprobs, ctx,
      cpu::AddPartBalanceColumns(dprobs, counts, part_tokens, top_k, coef, grad, write),
      cuda::AddPartBalanceColumns(dprobs, counts, part_tokens, top_k, coef, grad, write, ctx));
}

void GlobalBalanceValueInto(const Tensor& load, const Tensor& prob_sums, int64_t tokens,
                            float coef, Tensor& value, DeviceContext* ctx) {
  constexpr const char* kOp = "GlobalBalanceValueInto";
  SY_CHECK(prob_sums.defined() && tokens >= 0) << kOp << ": prob_sums "
                                               << prob_sums.DebugString() << ", " << tokens
                                               << " tokens";
  CheckTensorOn(prob_sums, DType::kF32, prob_sums.device(), kOp, "prob_sums", "prob_sums");
  CheckLoad(load, prob_sums.numel(), prob_sums.device(), kOp);
  CheckTensorOn(value, DType::kF64, prob_sums.device(), kOp, "value", "prob_sums");
  SY_CHECK_EQ(value.numel(), 1) << kOp << ": value " << ShapeString(value.shape());
  SY_DISPATCH_DEVICE(value, ctx, cpu::GlobalBalanceValueInto(load, prob_sums, tokens, coef, value),
                     cuda::GlobalBalanceValueInto(load, prob_sums, tokens, coef, value, ctx));
}

void AddGlobalBalanceColumn(Tensor& dprobs, const Tensor& load, int64_t tokens, float coef,
                            float grad, Write write, DeviceContext* ctx) {
  constexpr const char* kOp = "AddGlobalBalanceColumn";
  SY_CHECK(dprobs.defined() && dprobs.ndim() == 2 && tokens >= 0)
      << kOp << ": dprobs " << dprobs.DebugString() << ", " << tokens << " tokens";
  CheckTensorOn(dprobs, DType::kF32, dprobs.device(), kOp, "dprobs", "dprobs");
  CheckLoad(load, dprobs.dim(1), dprobs.device(), kOp);
  SY_DISPATCH_DEVICE(dprobs, ctx,
                     cpu::AddGlobalBalanceColumn(dprobs, load, tokens, coef, grad, write),
                     cuda::AddGlobalBalanceColumn(dprobs, load, tokens, coef, grad, write, ctx));
}

}  // namespace switchyard::kernels
