// The vocabulary split and the vocabulary-parallel cross-entropy of vocab_parallel.h.
//
// Two all-reduces per call: (N + 1) maxima — every row's max over this rank's valid
// columns, and one more value, the end of this rank's real ids, whose max over ranks is V
// (for the target check) — then (2, N) sums: the sums of exp(l - max) and the target
// logits (only the rank holding a row's target adds a nonzero one).
#include "engine/parallel/vocab_parallel.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/check.h"
#include "kernels/vocab_parallel.h"

namespace switchyard::parallel {

int64_t PaddedVocab(int64_t vocab, int tp) {
  SY_CHECK(vocab >= 1 && tp >= 1) << "PaddedVocab: vocabulary " << vocab << " over tp " << tp;
  return (vocab + tp - 1) / tp * tp;
}

VocabRange VocabRangeOf(int64_t vocab, int tp, int rank) {
  SY_CHECK(rank >= 0 && rank < tp) << "VocabRangeOf: rank " << rank << " of tp " << tp;
  VocabRange r;
  r.shard_cols = PaddedVocab(vocab, tp) / tp;
  r.start = rank * r.shard_cols;
  r.valid_cols = std::clamp<int64_t>(vocab - r.start, 0, r.shard_cols);
  return r;
}

kernels::CrossEntropySums VocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets,
                                                    int64_t vocab_start, int64_t valid_cols,
                                                    dist::Communicator& tp, Tensor* dlogits,
                                                    double grad_scale, DeviceContext* ctx,
                                                    int32_t ignore_index) {
  constexpr const char* kOp = "VocabParallelCrossEntropy";
  SY_CHECK(logits.defined() && targets.defined() && logits.ndim() == 2 &&
           targets.numel() == logits.dim(0))
      << kOp << ": logits " << ShapeString(logits.shape()) << ", targets "
      << ShapeString(targets.shape());
  SY_CHECK(vocab_start >= 0 && valid_cols >= 0 && valid_cols <= logits.dim(1))
      << kOp << ": " << valid_cols << " valid columns from " << vocab_start << " for logits "
      << ShapeString(logits.shape());
  const int64_t n = logits.dim(0);
  const Device dev = logits.device();
  const Tensor flat_targets = targets.Reshape({n});

  // maxima (N + 1): the rows' max, then the end of this rank's real ids (exact in f32 for
  // any vocabulary below 2^24).
  Tensor maxima = Tensor::Empty({n + 1}, DType::kF32, dev);
  Tensor row_max = maxima.Slice(0, n);
  kernels::VocabShardRowMax(logits, valid_cols, row_max, ctx);
  SY_CHECK_LT(vocab_start + valid_cols, int64_t{1} << 24) << kOp << ": vocabulary too large";
  const Tensor ids_end = Tensor::FromVector(
      std::vector<float>{valid_cols > 0 ? static_cast<float>(vocab_start + valid_cols) : 0.0f},
      {1});  // alive until the copies back below have synchronised
  maxima.Slice(n, n + 1).CopyFrom(ids_end, ctx);
  if (tp.size() > 1) tp.AllReduce(maxima, dist::ReduceOp::kMax);

  // sums (2, N): the sums of exponentials against the global max, and the target logits.
  Tensor sums = Tensor::Empty({2, n}, DType::kF32, dev);
  Tensor exp_sum = sums.Slice(0, 1).Reshape({n});
  Tensor target_logit = sums.Slice(1, 2).Reshape({n});
  kernels::VocabShardExpSum(logits, valid_cols, row_max, exp_sum, ctx);
  kernels::VocabShardTargetLogit(logits, flat_targets, vocab_start, valid_cols, ignore_index,
                                 target_logit, ctx);
  if (tp.size() > 1) tp.AllReduce(sums, dist::ReduceOp::kSum);

  // loss_r = log(sum) + max - target, summed in double in row order on the host.
  const std::vector<float> m = maxima.ToHost("vocab_parallel.ce", ctx).ToVector<float>();
  const std::vector<float> s = sums.ToHost("vocab_parallel.ce", ctx).ToVector<float>();
  const std::vector<int32_t> ids =
      flat_targets.ToHost("vocab_parallel.ce", ctx).ToVector<int32_t>();
  const int64_t vocab = static_cast<int64_t>(m[n]);
  kernels::CrossEntropySums result;
  for (int64_t r = 0; r < n; ++r) {
    if (ids[r] == ignore_index) continue;
    SY_CHECK(ids[r] >= 0 && ids[r] < vocab)
        << kOp << ": target " << ids[r] << " at row " << r << " is outside the vocabulary of "
        << vocab << " (ignore_index=" << ignore_index << ")";
    result.loss_sum += std::log(static_cast<double>(s[r])) + static_cast<double>(m[r]) -
                       static_cast<double>(s[n + r]);
    ++result.count;
  }
  if (dlogits != nullptr) {
    kernels::VocabShardSoftmaxGrad(logits, flat_targets, vocab_start, valid_cols, row_max,
                                   exp_sum, static_cast<float>(grad_scale), ignore_index,
                                   *dlogits, ctx);
  }
  return result;
}

}  // namespace switchyard::parallel
