// The decoder's head (Decoder, engine/model/decoder.h): the final norm's output through the
// untied head or the tied token table into logits, the cross-entropy, and their backward;
// whole, or a chunk of rows at a time (set_head_chunk, "Head chunking").
#include <algorithm>
#include <optional>

#include "engine/core/profile.h"
#include "engine/core/step_readback.h"
#include "engine/model/decoder.h"
#include "engine/parallel/tensor_parallel.h"
#include "engine/parallel/vocab_parallel.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"

namespace switchyard::model {

using parallel::PartId;

void Decoder::ForwardHead(const DecoderInput& in, const ResidualStream& stream,
                          DecoderOutput& out) {
  const int64_t n = in.tokens.numel(), d = model_.d_model;
  const dense::TensorParallel tp = this->tp();
  DeviceContext* ctx = ctx_;
  DecoderActivations& acts = out.acts;
  Acquire(PartId::NormF(), HeadPart());
  ScopedPhase phase(Phase::kEmbeddingHeadLoss);  // the final norm, the head and the loss
  // Under bf16 activation storage without tp the final norm writes the head's bf16 operand,
  // which its products read forward and backward (and keep): no f32 rows, no conversions.
  // The last block's residual add and the final norm in one kernel.
  acts.norm_f = stream.Norm(
      *norm_f_, ctx,
      NormsWriteBf16Operands(kernels::StoresBf16(ctx), tp.active()) ? DType::kBF16 : DType::kF32);
  const Tensor& x = acts.norm_f.x;
  Release(PartId::NormF());
  Acquire(HeadPart(), PartId());
  acts.head_in = dense::EnterTensorParallel(tp, acts.norm_f.y.Reshape({x.numel() / d, d}), ctx)
                     .Reshape({n, d});
  if (head_chunk_ > 0 && head_chunk_ < n) {
    ForwardHeadChunked(in, head_chunk_, out);
    return;
  }
  Tensor logits = HeadLogits(acts.head_in, &acts.head);  // (N, this rank's vocabulary columns)
  const Tensor targets = in.targets.Reshape({n});
  if (CrossEntropyOnDevice(in)) {
    // A training step: the sums stay on the device until the step's one readback.
    StepReadback::Slots slots = ctx->step_readback()->Reserve(2, device(), ctx);
    HeadLoss(logits, targets, /*grad=*/true, in.ce_grad_scale, &slots.values);
    acts.dlogits = logits;
    out.ce_sum = PendingSum::Slot(slots.first);
    out.ce_count = -1;
    return;
  }
  const kernels::CrossEntropySums ce = HeadLoss(logits, targets, in.training, in.ce_grad_scale, nullptr);
  if (in.training) {
    acts.dlogits = logits;
  } else {
    Release(HeadPart());  // a training forward keeps it for Backward
  }
  out.ce_sum = ce.loss_sum;
  out.ce_count = ce.count;
}

kernels::CrossEntropySums Decoder::HeadLoss(Tensor& logits, const Tensor& targets, bool grad,
                                            float grad_scale, Tensor* sums) const {
  if (sums != nullptr) {
    // The step-readback kernel always writes a gradient: scale 0 where none is wanted.
    kernels::CrossEntropyForwardBackwardInto(logits, targets, logits, grad ? grad_scale : 0.0,
                                             kernels::kIgnoreIndex, *sums, ctx_);
    return {};
  }
  const dense::TensorParallel tp = this->tp();
  if (tp.active()) {
    return parallel::VocabParallelCrossEntropy(logits, targets, eo_.vocab_start(), eo_.valid_rows(),
                                               *tp.comm, grad ? &logits : nullptr, grad_scale, ctx_);
  }
  if (grad) {
    return kernels::CrossEntropyForwardBackward(logits, targets, logits, grad_scale,
                                                kernels::kIgnoreIndex, ctx_);
  }
  return kernels::CrossEntropyForward(logits, targets, kernels::kIgnoreIndex, ctx_);
}

void Decoder::HeadProductsBackward(const Tensor& rows,
                                   const std::optional<dense::LinearActivations>& kept,
                                   const Tensor& dlogits, Tensor& drows) {
  if (head_) {
    head_->BackwardInto(*kept, dlogits, drows, 0.0f, ctx_);
    return;
  }
  // The logits' gradient is the largest operand: converted once for both products.
  const Tensor dl = kernels::MatmulOperand(dlogits, ctx_);
  kernels::Gemm(dl, false, embed_->wte(), false, drows, 1.0f, 0.0f, ctx_);
  Tensor grad_wte = embed_->grad_wte();
  kernels::Gemm(dl, true, rows, false, grad_wte, 1.0f, 1.0f, ctx_);
}

bool Decoder::CrossEntropyOnDevice(const DecoderInput& in) const {
  return ctx_ != nullptr && ctx_->step_readback() != nullptr && in.training && in.ids_checked &&
         !tp().active();
}

Tensor Decoder::HeadLogits(const Tensor& rows, std::optional<dense::LinearActivations>* kept) const {
  if (head_) {
    // The head keeps its input as given (acts.head_in: the final norm's f32 output, or its
    // bf16 operand under bf16 storage without tp).
    dense::LinearActivations a =
        head_->Forward(rows, ctx_, /*add_bias=*/true, kernels::KeepInput::kAsGiven);
    Tensor y = a.y;
    if (kept != nullptr) *kept = std::move(a);
    return y;
  }
  Tensor logits = Tensor::Empty({rows.dim(0), eo_.local_rows()}, DType::kF32, device());
  kernels::Gemm(rows, false, embed_->wte(), true, logits, 1.0f, 0.0f, ctx_);
  return logits;
}

void Decoder::ForwardHeadChunked(const DecoderInput& in, int64_t chunk, DecoderOutput& out) {
  DecoderActivations& acts = out.acts;
  const int64_t n = acts.head_in.dim(0);
  const Tensor targets = in.targets.Reshape({n});
  const bool on_device = CrossEntropyOnDevice(in);
  PendingSum loss;  // chunk sums in row order
  int64_t count = 0;
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t r1 = std::min(n, r0 + chunk);
    Tensor logits = HeadLogits(acts.head_in.Slice(r0, r1), nullptr);
    const Tensor t = targets.Slice(r0, r1);
    if (on_device) {
      StepReadback::Slots slots = ctx_->step_readback()->Reserve(2, device(), ctx_);
      HeadLoss(logits, t, /*grad=*/false, 0.0f, &slots.values);
      loss += PendingSum::Slot(slots.first);
      continue;
    }
    const kernels::CrossEntropySums ce = HeadLoss(logits, t, /*grad=*/false, 0.0f, nullptr);
    loss += ce.loss_sum;
    count += ce.count;
  }
  out.ce_sum = loss;
  out.ce_count = on_device ? -1 : count;
  if (in.training) {
    acts.head_chunk = chunk;
  } else {
    Release(HeadPart());  // a training forward keeps it for Backward
  }
}

Tensor Decoder::BackwardHeadChunked(const DecoderInput& in, const DecoderActivations& acts) {
  const int64_t n = acts.head_in.dim(0), d = model_.d_model, chunk = acts.head_chunk;
  const Tensor targets = in.targets.Reshape({n});
  // Forward's loss paths, for the same gradient bits as the whole head's; the sums of the
  // step-readback path go to a scratch pair (Forward reserved the ones the step reads).
  const bool on_device = CrossEntropyOnDevice(in);
  Tensor sums = on_device ? Tensor::Empty({2}, DType::kF64, device()) : Tensor();
  Tensor dhidden = Tensor::Empty({n, d}, DType::kF32, device());
  for (int64_t r0 = 0; r0 < n; r0 += chunk) {
    const int64_t r1 = std::min(n, r0 + chunk);
    const Tensor rows = acts.head_in.Slice(r0, r1), t = targets.Slice(r0, r1);
    Tensor dh = dhidden.Slice(r0, r1);
    std::optional<dense::LinearActivations> kept;
    Tensor logits = HeadLogits(rows, &kept);  // Forward's bits again
    HeadLoss(logits, t, /*grad=*/true, in.ce_grad_scale, on_device ? &sums : nullptr);
    HeadProductsBackward(rows, kept, logits, dh);
  }
  return dhidden;
}

Tensor Decoder::BackwardHead(const DecoderInput& in, const DecoderActivations& acts) {
  if (acts.head_chunk > 0) return BackwardHeadChunked(in, acts);
  Tensor dhidden = Tensor::Empty({acts.dlogits.dim(0), model_.d_model}, DType::kF32, device());
  HeadProductsBackward(acts.head_in, acts.head, acts.dlogits, dhidden);
  return dhidden;
}

}  // namespace switchyard::model
