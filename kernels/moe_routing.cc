// Argument checks and device dispatch for kernels/moe_routing.h.
#include <cstdint>

#include "kernels/check.h"
#include "kernels/moe_routing.h"

#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// `t` is defined, of `dtype`, on `device` (the output's) and of `shape`.
void CheckLike(const Tensor& t, DType dtype, Device device, const Shape& shape, const char* op,
               const char* what) {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.device() == device) << op << ": " << what << " is on " << t.device()
                                 << " but the output is on " << device;
  SY_CHECK(t.dtype() == dtype) << op << ": " << what << " is " << DTypeName(t.dtype())
                               << ", expected " << DTypeName(dtype);
  SY_CHECK(t.shape() == shape) << op << ": " << what << " " << ShapeString(t.shape())
                               << ", expected " << ShapeString(shape);
}

// `t` is a defined 2-d tensor of `dtype` (its shape is what the op derives T, E or k from).
void CheckMatrix(const Tensor& t, DType dtype, const char* op, const char* what) {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.dtype() == dtype) << op << ": " << what << " is " << DTypeName(t.dtype())
                               << ", expected " << DTypeName(dtype);
  SY_CHECK(t.ndim() == 2) << op << ": " << what << " must be 2-d, got "
                          << ShapeString(t.shape());
}

// The arguments both router backwards share: dlogits (T, E) f32 on the device the others
// must be on; probs (T, E); indices (T, k) i32; gates, dgates (T, k); dprobs and
// dlogits_extra (T, E) or undefined.
void CheckBackward(const Tensor& probs, const Tensor& indices, const Tensor& gates,
                   const Tensor& dgates, const Tensor& dprobs, const Tensor& dlogits_extra,
                   const Tensor& dlogits, const char* op) {
  CheckMatrix(dlogits, DType::kF32, op, "dlogits");
  CheckMatrix(indices, DType::kI32, op, "indices");
  const Device dev = dlogits.device();
  const int64_t T = dlogits.dim(0), E = dlogits.dim(1), k = indices.dim(1);
  CheckLike(probs, DType::kF32, dev, {T, E}, op, "probs");
  CheckLike(indices, DType::kI32, dev, {T, k}, op, "indices");
  CheckLike(gates, DType::kF32, dev, {T, k}, op, "gates");
  CheckLike(dgates, DType::kF32, dev, {T, k}, op, "dgates");
  if (dprobs.defined()) CheckLike(dprobs, DType::kF32, dev, {T, E}, op, "dprobs");
  if (dlogits_extra.defined()) {
    CheckLike(dlogits_extra, DType::kF32, dev, {T, E}, op, "dlogits_extra");
  }
}


void CheckTopK(const Tensor& logits, const Tensor& bias, bool random_second, const Tensor& probs,
               const Tensor& indices, const Tensor& gates, const Tensor& keep) {
  constexpr const char* kOp = "RouterTopK";
  CheckMatrix(logits, DType::kF32, kOp, "logits");
  CheckMatrix(indices, DType::kI32, kOp, "indices");
  const Device dev = indices.device();
  const int64_t T = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
  SY_CHECK(k >= 1 && k <= E) << kOp << ": top_k=" << k << " for " << E << " experts";
  SY_CHECK(!random_second || k == 2) << kOp << ": the random second expert needs top_k=2, got "
                                     << k;
  CheckLike(logits, DType::kF32, dev, {T, E}, kOp, "logits");
  CheckLike(indices, DType::kI32, dev, {T, k}, kOp, "indices");
  CheckLike(probs, DType::kF32, dev, {T, E}, kOp, "probs");
  CheckLike(gates, DType::kF32, dev, {T, k}, kOp, "gates");
  CheckLike(keep, DType::kU8, dev, {T, k}, kOp, "keep");
  if (bias.defined()) CheckLike(bias, DType::kF32, dev, {E}, kOp, "expert bias");
}
}  // namespace

void RouterTopK(const Tensor& logits, const Tensor& bias, bool normalize, bool random_second,
                RngKey second_key, int64_t first_token, Tensor& probs, Tensor& indices,
                Tensor& gates, Tensor& keep, DeviceContext* ctx) {
  CheckTopK(logits, bias, random_second, probs, indices, gates, keep);
  SY_DISPATCH_DEVICE(indices, ctx,
                     cpu::RouterTopK(logits, bias, normalize, random_second, second_key,
                                     first_token, probs, indices, gates, keep),
                     cuda::RouterTopK(logits, bias, normalize, random_second, second_key,
                                      first_token, probs, indices, gates, keep, ctx));
}

void RouterTopKScored(const Tensor& logits, const Tensor& bias, const RouterScoring& scoring,
                      bool random_second, RngKey second_key, int64_t first_token,
                      Tensor& probs, Tensor& scores, Tensor& indices, Tensor& gates,
                      Tensor& keep, DeviceContext* ctx) {
  if (!scoring.sigmoid && scoring.groups == 0) {
    SY_CHECK(!scores.defined()) << "RouterTopKScored: softmax scores are the probs";
    RouterTopK(logits, bias, scoring.normalize, random_second, second_key, first_token, probs,
               indices, gates, keep, ctx);
    return;
  }
  constexpr const char* kOp = "RouterTopKScored";
  CheckMatrix(logits, DType::kF32, kOp, "logits");
  CheckMatrix(indices, DType::kI32, kOp, "indices");
  const Device dev = indices.device();
  const int64_t T = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
  SY_CHECK(dev.is_cpu()) << "moe.score=sigmoid and moe.route_groups run on the CPU only, got "
                         << dev.ToString();
  const int64_t G = scoring.groups, M = scoring.group_topk;
  SY_CHECK(G == 0 || (E % G == 0 && M >= 1 && M <= G && k <= M * (E / G)))
      << kOp << ": " << G << " groups, top " << M << " of them, k=" << k << ", E=" << E;
  SY_CHECK(k >= 1 && k <= E) << kOp << ": top_k=" << k << " for " << E << " experts";
  SY_CHECK(!random_second || k == 2) << kOp << ": the random second expert needs top_k=2";
  CheckLike(probs, DType::kF32, dev, {T, E}, kOp, "probs");
  if (scoring.sigmoid) {
    CheckLike(scores, DType::kF32, dev, {T, E}, kOp, "scores");
  } else {
    SY_CHECK(!scores.defined()) << kOp << ": softmax scores are the probs";
  }
  CheckLike(gates, DType::kF32, dev, {T, k}, kOp, "gates");
  CheckLike(keep, DType::kU8, dev, {T, k}, kOp, "keep");
  if (bias.defined()) CheckLike(bias, DType::kF32, dev, {E}, kOp, "expert bias");
  SY_DISPATCH_DEVICE(indices, ctx,
                     cpu::RouterTopKScored(logits, bias, scoring, random_second, second_key,
                                           first_token, probs, scores, indices, gates, keep),
                     SY_LOG(FATAL) << kOp << " on " << dev.ToString());
}

void RouterTopKScored(const Tensor& logits, const Tensor& bias, const RouterScoring& scoring,
                      bool random_second, const DeviceRng& second, Tensor& probs,
                      Tensor& scores, Tensor& indices, Tensor& gates, Tensor& keep,
                      DeviceContext* ctx) {
  SY_CHECK(second.values.defined() && second.values.dtype() == DType::kI64 &&
           second.values.numel() == 2 && second.values.device() == indices.device())
      << "RouterTopKScored: DeviceRng values must be (2) i64 on " << indices.device()
      << ", got " << second.values.DebugString();
  if (indices.device().is_cpu()) {
    // The key read when the choice runs (at each replay of a capture), then the host-key op.
    auto on_cpu = [=]() mutable {
      const int64_t* v = second.values.data<int64_t>();
      RouterTopKScored(logits, bias, scoring, random_second,
                       RngKey{second.seed, static_cast<uint64_t>(v[0])},
                       (v[1] + second.token_offset) * second.per_token, probs, scores, indices,
                       gates, keep, nullptr);
    };
    if (ctx != nullptr && ctx->capturing()) {
      ctx->Record(on_cpu);
    } else {
      on_cpu();
    }
    return;
  }
  SY_CHECK(!scoring.sigmoid && scoring.groups == 0 && !scores.defined())
      << "moe.score=sigmoid and moe.route_groups run on the CPU only, got "
      << indices.device().ToString();
  CheckTopK(logits, bias, random_second, probs, indices, gates, keep);
  SY_DISPATCH_DEVICE(indices, ctx, (void)0,
                     cuda::RouterTopK(logits, bias, scoring.normalize, random_second, second,
                                      probs, indices, gates, keep, ctx));
}

void RouterBackwardScored(const Tensor& probs, const Tensor& scores, const Tensor& indices,
                          const Tensor& gates, const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, const RouterScoring& scoring,
                          Tensor& dlogits, DeviceContext* ctx) {
  if (!scoring.sigmoid) {
    RouterBackwardLogits(probs, indices, gates, dgates, dprobs, dlogits_extra,
                         scoring.normalize, dlogits, ctx);
    return;
  }
  constexpr const char* kOp = "RouterBackwardScored";
  CheckBackward(probs, indices, gates, dgates, dprobs, dlogits_extra, dlogits, kOp);
  const Device dev = dlogits.device();
  SY_CHECK(dev.is_cpu()) << "moe.score=sigmoid runs on the CPU only, got " << dev.ToString();
  CheckLike(scores, DType::kF32, dev, probs.shape(), kOp, "scores");
  SY_DISPATCH_DEVICE(dlogits, ctx,
                     cpu::RouterBackwardScored(probs, scores, indices, gates, dgates, dprobs,
                                               dlogits_extra, scoring, dlogits),
                     SY_LOG(FATAL) << kOp << " on " << dev.ToString());
}

void RouterBackwardLogits(const Tensor& probs, const Tensor& indices, const Tensor& gates,
                          const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, bool normalize, Tensor& dlogits,
                          DeviceContext* ctx) {
  CheckBackward(probs, indices, gates, dgates, dprobs, dlogits_extra, dlogits,
                "RouterBackwardLogits");
  SY_DISPATCH_DEVICE(dlogits, ctx,
                     cpu::RouterBackwardLogits(probs, indices, gates, dgates, dprobs,
                                               dlogits_extra, normalize, dlogits),
                     cuda::RouterBackwardLogits(probs, indices, gates, dgates, dprobs,
                                                dlogits_extra, normalize, dlogits, ctx));
}

void CountSlotAssignments(const Tensor& indices, const Tensor& keep, int64_t num_experts,
                          Tensor& counts, DeviceContext* ctx) {
  constexpr const char* kOp = "CountSlotAssignments";
  CheckMatrix(indices, DType::kI32, kOp, "indices");
  SY_CHECK(num_experts >= 1) << kOp << ": num_experts=" << num_experts;
  SY_CHECK(counts.defined()) << kOp << ": counts is undefined";
  const Device dev = counts.device();
  const int64_t T = indices.dim(0), k = indices.dim(1);
  CheckLike(indices, DType::kI32, dev, {T, k}, kOp, "indices");
  CheckLike(counts, DType::kI64, dev, {k * num_experts + 1}, kOp, "counts");
  if (keep.defined()) CheckLike(keep, DType::kU8, dev, {T, k}, kOp, "keep");
  SY_DISPATCH_DEVICE(counts, ctx, cpu::CountSlotAssignments(indices, keep, num_experts, counts),
                     cuda::CountSlotAssignments(indices, keep, num_experts, counts, ctx));
}

void AddLabelAssignmentCounts(const Tensor& indices, const Tensor& labels, int64_t num_labels,
                              int64_t num_experts, Tensor& counts, DeviceContext* ctx) {
  constexpr const char* kOp = "AddLabelAssignmentCounts";
  CheckMatrix(indices, DType::kI32, kOp, "indices");
  SY_CHECK(num_labels >= 1 && num_experts >= 1 && num_labels <= INT32_MAX &&
           num_experts <= INT32_MAX)
      << kOp << ": num_labels=" << num_labels << " num_experts=" << num_experts;
  SY_CHECK(counts.defined()) << kOp << ": counts is undefined";
  const Device dev = counts.device();
  const int64_t T = indices.dim(0);
  CheckLike(indices, DType::kI32, dev, {T, indices.dim(1)}, kOp, "indices");
  CheckLike(labels, DType::kI32, dev, {T}, kOp, "labels");
  CheckLike(counts, DType::kF64, dev, {num_labels * num_experts + 1}, kOp, "counts");
  SY_DISPATCH_DEVICE(counts, ctx,
                     cpu::AddLabelAssignmentCounts(indices, labels, num_labels, num_experts,
                                                   counts),
                     cuda::AddLabelAssignmentCounts(indices, labels, num_labels, num_experts,
                                                    counts, ctx));
}

void ProbColumnSums(const Tensor& probs, Tensor& sums, DeviceContext* ctx) {
  constexpr const char* kOp = "ProbColumnSums";
  CheckMatrix(probs, DType::kF32, kOp, "probs");
  SY_CHECK(sums.defined()) << kOp << ": sums is undefined";
  const Device dev = sums.device();
  CheckLike(probs, DType::kF32, dev, probs.shape(), kOp, "probs");
  CheckLike(sums, DType::kF32, dev, {probs.dim(1)}, kOp, "sums");
  SY_DISPATCH_DEVICE(sums, ctx, cpu::ProbColumnSums(probs, sums),
                     cuda::ProbColumnSums(probs, sums, ctx));
}

void AddColumnConstants(Tensor& x, std::span<const float> column, Write write,
                        DeviceContext* ctx) {
  constexpr const char* kOp = "AddColumnConstants";
  CheckMatrix(x, DType::kF32, kOp, "x");
  SY_CHECK(static_cast<int64_t>(column.size()) == x.dim(1))
      << kOp << ": " << column.size() << " column values for x " << ShapeString(x.shape());
  // Host arguments the CPU op reads go into the recorded closure by value (kernels/dispatch.h).
  const std::vector<float> host_column(column.begin(), column.end());
  SY_DISPATCH_DEVICE(x, ctx, cpu::AddColumnConstants(x, host_column, write),
                     cuda::AddColumnConstants(x, column, write, ctx));
}

namespace {

void CheckZLoss(const Tensor& logits, int64_t group_tokens, const Tensor* dlogits,
                const char* op) {
  CheckMatrix(logits, DType::kF32, op, "logits");
  SY_CHECK(group_tokens <= 0 || group_tokens >= logits.dim(0))
      << op << ": group_tokens=" << group_tokens << " < the " << logits.dim(0)
      << " rows of logits";
  if (dlogits != nullptr) {
    SY_CHECK(dlogits->defined()) << op << ": dlogits is undefined";
    CheckLike(logits, DType::kF32, dlogits->device(), dlogits->shape(), op, "logits");
    CheckLike(*dlogits, DType::kF32, dlogits->device(), logits.shape(), op, "dlogits");
  }
}

}  // namespace

float RouterZLoss(const Tensor& logits, float coef, float grad, int64_t group_tokens,
                  Tensor* dlogits, DeviceContext* ctx) {
  CheckZLoss(logits, group_tokens, dlogits, "RouterZLoss");
  float z = 0.0f;
  SY_DISPATCH_DEVICE_NOW(
      logits, ctx, z = cpu::RouterZLoss(logits, coef, grad, group_tokens, dlogits, Write::kAdd),
      z = cuda::RouterZLoss(logits, coef, grad, group_tokens, dlogits, Write::kAdd,
                            /*want_value=*/true, ctx));
  counters::CountReadback("moe.z_loss");
  return z;
}

void RouterZLossInto(const Tensor& logits, float coef, int64_t group_tokens, Tensor& value,
                     DeviceContext* ctx) {
  CheckZLoss(logits, group_tokens, nullptr, "RouterZLossInto");
  CheckTensorOn(value, DType::kF64, logits.device(), "RouterZLossInto", "value", "logits");
  SY_CHECK_EQ(value.numel(), 1) << "RouterZLossInto: value " << ShapeString(value.shape());
  SY_DISPATCH_DEVICE(
      logits, ctx,
      value.data<double>()[0] =
          cpu::RouterZLoss(logits, coef, 0.0f, group_tokens, nullptr, Write::kAdd),
      cuda::RouterZLossInto(logits, coef, group_tokens, value, ctx));
}

void RouterZLossBackward(const Tensor& logits, float coef, float grad, int64_t group_tokens,
                         Tensor& dlogits, Write write, DeviceContext* ctx) {
  CheckZLoss(logits, group_tokens, &dlogits, "RouterZLossBackward");
  SY_DISPATCH_DEVICE(dlogits, ctx,
                     cpu::RouterZLoss(logits, coef, grad, group_tokens, &dlogits, write),
                     cuda::RouterZLoss(logits, coef, grad, group_tokens, &dlogits, write,
                                       /*want_value=*/false, ctx));
}

void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate,
                      DeviceContext* ctx) {
  constexpr const char* kOp = "UpdateExpertBias";
  SY_CHECK(bias.defined()) << kOp << ": bias is undefined";
  CheckLike(bias, DType::kF32, bias.device(), {bias.numel()}, kOp, "bias");
  SY_CHECK(static_cast<int64_t>(counts.size()) == bias.numel())
      << kOp << ": " << counts.size() << " counts for " << bias.numel() << " experts";
  // Host arguments the CPU op reads go into the recorded closure by value (kernels/dispatch.h).
  const std::vector<int64_t> host_counts(counts.begin(), counts.end());
  SY_DISPATCH_DEVICE(bias, ctx, cpu::UpdateExpertBias(bias, host_counts, rate),
                     cuda::UpdateExpertBias(bias, counts, rate, ctx));
}

namespace {

// The arguments of both admissions (kernels/moe_routing.h).
void CheckAdmission(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                    int64_t num_experts, AdmissionOrder order, std::span<const int64_t> offsets,
                    const Tensor& kept, const Tensor& position, const char* kOp) {
  CheckMatrix(indices, DType::kI32, kOp, "indices");
  SY_CHECK(num_experts >= 1) << kOp << ": num_experts=" << num_experts;
  SY_CHECK(kept.defined()) << kOp << ": kept is undefined";
  const Device dev = kept.device();
  const Shape shape = indices.shape();
  const int64_t k = indices.dim(1);
  CheckLike(indices, DType::kI32, dev, shape, kOp, "indices");
  CheckLike(kept, DType::kU8, dev, shape, kOp, "kept");
  CheckLike(position, DType::kI64, dev, shape, kOp, "position");
  if (keep.defined()) CheckLike(keep, DType::kU8, dev, shape, kOp, "keep");
  if (order == AdmissionOrder::kPosition) {
    SY_CHECK(offsets.empty() || static_cast<int64_t>(offsets.size()) == k * num_experts)
        << kOp << ": " << offsets.size() << " offsets for k*E=" << k * num_experts;
  } else {
    SY_CHECK(offsets.empty())
        << "drop_policy=probability across split groups needs the whole group's gates";
    CheckLike(gates, DType::kF32, dev, shape, kOp, "gates");
  }
}

}  // namespace

AdmissionCounts AdmitAssignments(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                                 int64_t num_experts, int64_t capacity, AdmissionOrder order,
                                 std::span<const int64_t> offsets, Tensor& kept,
                                 Tensor& position, DeviceContext* ctx) {
  CheckAdmission(indices, gates, keep, num_experts, order, offsets, kept, position,
                 "AdmitAssignments");
  AdmissionCounts counts;
  SY_DISPATCH_DEVICE_NOW(kept, ctx,
                     counts = cpu::AdmitAssignments(indices, gates, keep, num_experts, capacity,
                                                    order, offsets, kept, position),
                     counts = cuda::AdmitAssignments(indices, gates, keep, num_experts,
                                                     capacity, order, offsets, kept, position,
                                                     ctx));
  counters::CountReadback("moe.admission");
  return counts;
}

void AdmitAssignmentsInto(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                          int64_t num_experts, int64_t capacity, AdmissionOrder order,
                          Tensor& kept, Tensor& position, Tensor& counts, DeviceContext* ctx) {
  constexpr const char* kOp = "AdmitAssignmentsInto";
  SY_CHECK(kept.defined() && counts.defined()) << kOp << ": kept or counts is undefined";
  CheckLike(counts, DType::kF64, kept.device(), {num_experts + 1}, kOp, "counts");
  auto on_cpu = [=]() mutable {
    // The host-returning admission (no readback on the CPU), its counts written as doubles.
    const AdmissionCounts c = cpu::AdmitAssignments(indices, gates, keep, num_experts, capacity,
                                                    order, {}, kept, position);
    double* out = counts.data<double>();
    for (int64_t e = 0; e < num_experts; ++e) out[e] = static_cast<double>(c.after[e]);
    out[num_experts] = 0.0;  // the CPU rejects an out-of-range index itself
  };
  CheckAdmission(indices, gates, keep, num_experts, order, {}, kept, position, kOp);
  SY_DISPATCH_DEVICE(kept, ctx, on_cpu(),
                     cuda::AdmitAssignmentsInto(indices, gates, keep, num_experts, capacity,
                                                order, kept, position, counts, ctx));
}

}  // namespace switchyard::kernels
