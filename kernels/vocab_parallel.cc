// Argument checks and device dispatch for kernels/vocab_parallel.h.
#include "kernels/vocab_parallel.h"

#include "kernels/check.h"
#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// logits (N, C) f32 with 0 < valid <= C, and a per-row tensor of N elements.
int64_t CheckLogits(const Tensor& logits, int64_t valid, const Tensor& rows, DType rows_dtype,
                    const char* op, const char* rows_name) {
  CheckTensorOn(logits, DType::kF32, logits.device(), op, "logits", "logits");
  SY_CHECK(logits.ndim() == 2 && valid > 0 && valid <= logits.dim(1))
      << op << ": logits " << ShapeString(logits.shape()) << " with " << valid
      << " valid columns";
  CheckTensorOn(rows, rows_dtype, logits.device(), op, rows_name, "logits");
  SY_CHECK_EQ(rows.numel(), logits.dim(0)) << op << ": " << rows_name << " "
                                           << ShapeString(rows.shape()) << " for logits "
                                           << ShapeString(logits.shape());
  return logits.dim(0);
}

}  // namespace

void VocabShardLocalIds(const Tensor& ids, int64_t vocab_start, int64_t valid, int32_t trash,
                        Tensor& local, DeviceContext* ctx) {
  constexpr const char* kOp = "VocabShardLocalIds";
  CheckTensorOn(ids, DType::kI32, ids.device(), kOp, "ids", "ids");
  CheckTensorOn(local, DType::kI32, ids.device(), kOp, "local", "ids");
  SY_CHECK_EQ(local.numel(), ids.numel()) << kOp;
  SY_DISPATCH_DEVICE(local, ctx, cpu::VocabShardLocalIds(ids, vocab_start, valid, trash, local),
                     cuda::VocabShardLocalIds(ids, vocab_start, valid, trash, local, ctx));
}

void VocabShardRowMax(const Tensor& logits, int64_t valid, Tensor& out, DeviceContext* ctx) {
  CheckLogits(logits, valid, out, DType::kF32, "VocabShardRowMax", "out");
  SY_DISPATCH_DEVICE(out, ctx, cpu::VocabShardRowMax(logits, valid, out),
                     cuda::VocabShardRowMax(logits, valid, out, ctx));
}

void VocabShardExpSum(const Tensor& logits, int64_t valid, const Tensor& row_max, Tensor& out,
                      DeviceContext* ctx) {
  CheckLogits(logits, valid, out, DType::kF32, "VocabShardExpSum", "out");
  CheckLogits(logits, valid, row_max, DType::kF32, "VocabShardExpSum", "row_max");
  SY_DISPATCH_DEVICE(out, ctx, cpu::VocabShardExpSum(logits, valid, row_max, out),
                     cuda::VocabShardExpSum(logits, valid, row_max, out, ctx));
}

void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, Tensor& out, DeviceContext* ctx) {
  CheckLogits(logits, valid, out, DType::kF32, "VocabShardTargetLogit", "out");
  CheckLogits(logits, valid, targets, DType::kI32, "VocabShardTargetLogit", "targets");
  SY_DISPATCH_DEVICE(out, ctx, cpu::VocabShardTargetLogit(logits, targets, vocab_start, valid, out),
                     cuda::VocabShardTargetLogit(logits, targets, vocab_start, valid, out, ctx));
}

void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits,
                           DeviceContext* ctx) {
  constexpr const char* kOp = "VocabShardSoftmaxGrad";
  CheckLogits(logits, valid, targets, DType::kI32, kOp, "targets");
  CheckLogits(logits, valid, row_max, DType::kF32, kOp, "row_max");
  CheckLogits(logits, valid, exp_sum, DType::kF32, kOp, "exp_sum");
  CheckTensorOn(dlogits, DType::kF32, logits.device(), kOp, "dlogits", "logits");
  SY_CHECK(dlogits.shape() == logits.shape()) << kOp << ": dlogits " << ShapeString(dlogits.shape());
  SY_DISPATCH_DEVICE(dlogits, ctx,
                     cpu::VocabShardSoftmaxGrad(logits, targets, vocab_start, valid, row_max,
                                                exp_sum, grad_scale, ignore_index, dlogits),
                     cuda::VocabShardSoftmaxGrad(logits, targets, vocab_start, valid, row_max,
                                                 exp_sum, grad_scale, ignore_index, dlogits, ctx));
}

}  // namespace switchyard::kernels
