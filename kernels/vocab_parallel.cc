// Argument checks and device dispatch for kernels/vocab_parallel.h.
#include "kernels/vocab_parallel.h"

#include "kernels/check.h"
#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// logits (N, C) f32 on `device` with 0 <= valid_cols <= C.
void CheckLogits(const Tensor& logits, int64_t valid_cols, Device device, const char* op,
                 const char* owner) {
  CheckTensorOn(logits, DType::kF32, device, op, "logits", owner);
  SY_CHECK(logits.ndim() == 2 && valid_cols >= 0 && valid_cols <= logits.dim(1))
      << op << ": logits " << ShapeString(logits.shape()) << " with " << valid_cols
      << " valid columns";
}

// A per-row tensor of `dtype` with one element per row of the logits.
void CheckPerRow(const Tensor& t, DType dtype, const Tensor& logits, const char* op,
                 const char* name, const char* owner) {
  CheckTensorOn(t, dtype, logits.device(), op, name, owner);
  SY_CHECK_EQ(t.numel(), logits.dim(0))
      << op << ": " << name << " " << ShapeString(t.shape()) << " for logits "
      << ShapeString(logits.shape());
}

// ids (N) i32, a table shard (Vl, d) f32 and rows (N, d) f32 (any (..., d)), on `device`.
void CheckLookup(const Tensor& ids, const Tensor& table, const Tensor& rows, int64_t vocab_start,
                 const char* op, const char* table_name, const char* rows_name) {
  const Device device = table.device();
  CheckTensorOn(ids, DType::kI32, device, op, "ids", table_name);
  CheckTensorOn(table, DType::kF32, device, op, table_name, table_name);
  CheckTensorOn(rows, DType::kF32, device, op, rows_name, table_name);
  SY_CHECK_EQ(table.ndim(), 2) << op << ": " << table_name << " is (Vl, d), got "
                               << ShapeString(table.shape());
  SY_CHECK_GE(vocab_start, 0) << op << ": vocab_start";
  const int64_t d = table.dim(1), n = ids.numel();
  SY_CHECK(rows.ndim() >= 1 && rows.dim(-1) == d && rows.numel() == n * d)
      << op << ": " << rows_name << " " << ShapeString(rows.shape()) << " for " << n
      << " ids and rows of " << d;
}

}  // namespace

void VocabShardRowMax(const Tensor& logits, int64_t valid_cols, Tensor& out,
                      DeviceContext* ctx) {
  constexpr const char* kOp = "VocabShardRowMax";
  SY_CHECK(out.defined()) << kOp << ": out is undefined";
  CheckLogits(logits, valid_cols, out.device(), kOp, "out");
  CheckPerRow(out, DType::kF32, logits, kOp, "out", "out");
  SY_DISPATCH_DEVICE(out, ctx, cpu::VocabShardRowMax(logits, valid_cols, out),
                     cuda::VocabShardRowMax(logits, valid_cols, out, ctx));
}

void VocabShardExpSum(const Tensor& logits, int64_t valid_cols, const Tensor& row_max,
                      Tensor& out, DeviceContext* ctx) {
  constexpr const char* kOp = "VocabShardExpSum";
  SY_CHECK(out.defined()) << kOp << ": out is undefined";
  CheckLogits(logits, valid_cols, out.device(), kOp, "out");
  CheckPerRow(row_max, DType::kF32, logits, kOp, "row_max", "out");
  CheckPerRow(out, DType::kF32, logits, kOp, "out", "out");
  SY_DISPATCH_DEVICE(out, ctx, cpu::VocabShardExpSum(logits, valid_cols, row_max, out),
                     cuda::VocabShardExpSum(logits, valid_cols, row_max, out, ctx));
}

void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, int32_t ignore_index, Tensor& out,
                           DeviceContext* ctx) {
  constexpr const char* kOp = "VocabShardTargetLogit";
  SY_CHECK(out.defined()) << kOp << ": out is undefined";
  CheckLogits(logits, valid_cols, out.device(), kOp, "out");
  CheckPerRow(targets, DType::kI32, logits, kOp, "targets", "out");
  CheckPerRow(out, DType::kF32, logits, kOp, "out", "out");
  SY_DISPATCH_DEVICE(
      out, ctx,
      cpu::VocabShardTargetLogit(logits, targets, vocab_start, valid_cols, ignore_index, out),
      cuda::VocabShardTargetLogit(logits, targets, vocab_start, valid_cols, ignore_index, out,
                                  ctx));
}

void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits,
                           DeviceContext* ctx) {
  constexpr const char* kOp = "VocabShardSoftmaxGrad";
  SY_CHECK(dlogits.defined()) << kOp << ": dlogits is undefined";
  CheckLogits(logits, valid_cols, dlogits.device(), kOp, "dlogits");
  CheckPerRow(targets, DType::kI32, logits, kOp, "targets", "dlogits");
  CheckPerRow(row_max, DType::kF32, logits, kOp, "row_max", "dlogits");
  CheckPerRow(exp_sum, DType::kF32, logits, kOp, "exp_sum", "dlogits");
  CheckTensorOn(dlogits, DType::kF32, dlogits.device(), kOp, "dlogits");
  SY_CHECK(dlogits.shape() == logits.shape())
      << kOp << ": dlogits " << ShapeString(dlogits.shape()) << ", logits "
      << ShapeString(logits.shape());
  SY_DISPATCH_DEVICE(dlogits, ctx,
                     cpu::VocabShardSoftmaxGrad(logits, targets, vocab_start, valid_cols,
                                                row_max, exp_sum, grad_scale, ignore_index,
                                                dlogits),
                     cuda::VocabShardSoftmaxGrad(logits, targets, vocab_start, valid_cols,
                                                 row_max, exp_sum, grad_scale, ignore_index,
                                                 dlogits, ctx));
}

void VocabShardEmbeddingForward(const Tensor& ids, const Tensor& table_shard,
                                int64_t vocab_start, Tensor& out, DeviceContext* ctx) {
  constexpr const char* kOp = "VocabShardEmbeddingForward";
  SY_CHECK(out.defined() && table_shard.defined()) << kOp << ": out or table_shard undefined";
  CheckLookup(ids, table_shard, out, vocab_start, kOp, "table_shard", "out");
  SY_DISPATCH_DEVICE(out, ctx, cpu::VocabShardEmbeddingForward(ids, table_shard, vocab_start, out),
                     cuda::VocabShardEmbeddingForward(ids, table_shard, vocab_start, out, ctx));
}

void VocabShardEmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vocab_start,
                                 Tensor& dtable_shard, DeviceContext* ctx) {
  constexpr const char* kOp = "VocabShardEmbeddingBackward";
  SY_CHECK(dtable_shard.defined()) << kOp << ": dtable_shard is undefined";
  CheckLookup(ids, dtable_shard, dout, vocab_start, kOp, "dtable_shard", "dout");
  SY_DISPATCH_DEVICE(dtable_shard, ctx,
                     cpu::VocabShardEmbeddingBackward(ids, dout, vocab_start, dtable_shard),
                     cuda::VocabShardEmbeddingBackward(ids, dout, vocab_start, dtable_shard, ctx));
}

}  // namespace switchyard::kernels
