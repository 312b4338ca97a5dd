#include "engine/parallel/tensor_parallel.h"

#include <cmath>
#include <vector>

#include "engine/core/check.h"
#include "kernels/permute.h"
#include "kernels/vocab_parallel.h"

namespace switchyard::parallel {
namespace {

bool Alone(const dist::Communicator& tp) { return tp.size() == 1; }

// Rows (dim 0) and features (the last dim) of a tensor of rank >= 1.
int64_t Features(const Tensor& t) { return t.ndim() == 0 ? 1 : t.dim(-1); }

// `shape` with its first / last dim replaced.
Shape WithFirst(Shape s, int64_t v) {
  s[0] = v;
  return s;
}
Shape WithLast(Shape s, int64_t v) {
  s.back() = v;
  return s;
}

// A new tensor with every rank's rows, in rank order.
Tensor AllGatherRows(const Tensor& x, dist::Communicator& tp) {
  Tensor out = Tensor::Empty(WithFirst(x.shape(), x.dim(0) * tp.size()), x.dtype(), x.device());
  tp.AllGather(x, out);
  return out;
}

// The row permutation between (tp, M, c) blocks and (M, tp, c): index[m * tp + r] = r * M + m.
Tensor InterleaveIndex(int64_t m, int tp, Device device, DeviceContext* ctx) {
  std::vector<int64_t> index(m * tp);
  for (int64_t i = 0; i < m; ++i)
    for (int r = 0; r < tp; ++r) index[i * tp + r] = r * m + i;
  Tensor host = Tensor::FromVector(index, {m * tp});
  return device.is_cpu() ? host : host.To(device, ctx);
}

// Column block `rank` of x (..., tp * c) as a new (..., c) tensor.
Tensor LastDimBlock(const Tensor& x, int rank, int tp, DeviceContext* ctx) {
  const int64_t c = Features(x) / tp, m = x.numel() / Features(x);
  std::vector<int64_t> index(m);
  for (int64_t i = 0; i < m; ++i) index[i] = i * tp + rank;
  Tensor idx = Tensor::FromVector(index, {m});
  if (!x.device().is_cpu()) idx = idx.To(x.device(), ctx);
  Tensor out = Tensor::Empty(WithLast(x.shape(), c), x.dtype(), x.device());
  Tensor out_rows = out.Reshape({m, c});
  kernels::GatherRows(x.Reshape({m * tp, c}), idx, out_rows, ctx);
  return out;
}

// Every rank's (..., c) side by side along the last dim: (..., tp * c).
Tensor GatherLastDim(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx) {
  const int64_t c = Features(x), m = x.numel() / c;
  Tensor blocks = Tensor::Empty({tp.size() * m, c}, x.dtype(), x.device());
  tp.AllGather(x.Reshape({m, c}), blocks);  // (tp, M, c)
  Tensor out = Tensor::Empty(WithLast(x.shape(), c * tp.size()), x.dtype(), x.device());
  Tensor out_rows = out.Reshape({m * tp.size(), c});
  kernels::GatherRows(blocks, InterleaveIndex(m, tp.size(), x.device(), ctx), out_rows, ctx);
  return out;
}

}  // namespace

SequenceShard SequenceShardOf(int64_t rows, int rank, int size) {
  SY_CHECK(size >= 1 && rank >= 0 && rank < size && rows % size == 0)
      << "sequence shard: " << rows << " rows over " << size << " ranks (rank " << rank << ")";
  const int64_t per = rows / size;
  return {rank * per, (rank + 1) * per};
}

Tensor CopyToTensorParallelRegion(const Tensor& x, dist::Communicator&, DeviceContext*) {
  return x;
}

Tensor CopyToTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                          DeviceContext* ctx) {
  return ReduceFromTensorParallelRegion(dy, tp, ctx);
}

Tensor ReduceFromTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx) {
  if (Alone(tp)) return x;
  Tensor sum = x.Clone(ctx);
  tp.AllReduce(sum, dist::ReduceOp::kSum);
  return sum;
}

Tensor ReduceFromTensorParallelRegionBackward(const Tensor& dy, dist::Communicator&,
                                              DeviceContext*) {
  return dy;
}

Tensor ScatterToTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx) {
  if (Alone(tp)) return x;
  SY_CHECK(Features(x) % tp.size() == 0)
      << "ScatterToTensorParallelRegion: last dim " << Features(x) << " over tp " << tp.size();
  return LastDimBlock(x, tp.rank(), tp.size(), ctx);
}

Tensor ScatterToTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                             DeviceContext* ctx) {
  return GatherFromTensorParallelRegion(dy, tp, ctx);
}

Tensor GatherFromTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx) {
  if (Alone(tp)) return x;
  return GatherLastDim(x, tp, ctx);
}

Tensor GatherFromTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                              DeviceContext* ctx) {
  return ScatterToTensorParallelRegion(dy, tp, ctx);
}

Tensor ScatterToSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                       DeviceContext* ctx) {
  if (Alone(tp)) return x;
  const SequenceShard s = SequenceShardOf(x.dim(0), tp.rank(), tp.size());
  return x.Slice(s.begin, s.end);
}

Tensor ScatterToSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                               DeviceContext* ctx) {
  if (Alone(tp)) return dy;
  return AllGatherRows(dy, tp);
}

Tensor GatherFromSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                        DeviceContext* ctx) {
  if (Alone(tp)) return x;
  return AllGatherRows(x, tp);
}

Tensor GatherFromSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                                DeviceContext* ctx) {
  return ReduceScatterToSequenceParallelRegion(dy, tp, ctx);
}

Tensor ReduceScatterToSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                             DeviceContext* ctx) {
  if (Alone(tp)) return x;
  SY_CHECK(x.dim(0) % tp.size() == 0)
      << "ReduceScatterToSequenceParallelRegion: " << x.dim(0) << " rows over tp " << tp.size();
  Tensor out = Tensor::Empty(WithFirst(x.shape(), x.dim(0) / tp.size()), x.dtype(), x.device());
  tp.ReduceScatter(x, out, dist::ReduceOp::kSum);
  return out;
}

Tensor ReduceScatterToSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                                     DeviceContext* ctx) {
  return GatherFromSequenceParallelRegion(dy, tp, ctx);
}

int64_t PaddedVocab(int64_t vocab, int tp) { return (vocab + tp - 1) / tp * tp; }

VocabRange VocabRangeOf(int64_t vocab, int tp, int rank) {
  VocabRange r;
  r.shard_cols = PaddedVocab(vocab, tp) / tp;
  r.start = rank * r.shard_cols;
  r.valid_cols = std::max<int64_t>(0, std::min(r.shard_cols, vocab - r.start));
  return r;
}

kernels::CrossEntropySums VocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets,
                                                    int64_t vocab_start, int64_t valid_cols,
                                                    dist::Communicator& tp, Tensor* dlogits,
                                                    double grad_scale, DeviceContext* ctx) {
  SY_CHECK(logits.ndim() == 2 && targets.numel() == logits.dim(0))
      << "VocabParallelCrossEntropy: logits " << ShapeString(logits.shape()) << ", targets "
      << ShapeString(targets.shape());
  const int64_t n = logits.dim(0);
  const Device dev = logits.device();
  Tensor flat_targets = targets.Reshape({n});
  // The global row max, then the sum of exponentials against it, then the target logit
  // (only the rank holding the target contributes).
  Tensor row_max = Tensor::Empty({n}, DType::kF32, dev);
  kernels::VocabShardRowMax(logits, valid_cols, row_max, ctx);
  if (!Alone(tp)) tp.AllReduce(row_max, dist::ReduceOp::kMax);
  Tensor exp_sum = Tensor::Empty({n}, DType::kF32, dev);
  kernels::VocabShardExpSum(logits, valid_cols, row_max, exp_sum, ctx);
  Tensor target = Tensor::Empty({n}, DType::kF32, dev);
  kernels::VocabShardTargetLogit(logits, flat_targets, vocab_start, valid_cols, target, ctx);
  if (!Alone(tp)) {
    tp.AllReduce(exp_sum, dist::ReduceOp::kSum);
    tp.AllReduce(target, dist::ReduceOp::kSum);
  }
  // loss_r = log(sum) + max - target, summed in double in row order on the host: the same
  // value on every tp rank.
  const std::vector<float> m = row_max.To(Device::Cpu(), ctx).ToVector<float>();
  const std::vector<float> s = exp_sum.To(Device::Cpu(), ctx).ToVector<float>();
  const std::vector<float> t = target.To(Device::Cpu(), ctx).ToVector<float>();
  const std::vector<int32_t> ids = flat_targets.To(Device::Cpu(), ctx).ToVector<int32_t>();
  kernels::CrossEntropySums sums;
  for (int64_t r = 0; r < n; ++r) {
    if (ids[r] == kernels::kIgnoreIndex) continue;
    sums.loss_sum += std::log(static_cast<double>(s[r])) + static_cast<double>(m[r]) - t[r];
    ++sums.count;
  }
  if (dlogits != nullptr) {
    kernels::VocabShardSoftmaxGrad(logits, flat_targets, vocab_start, valid_cols, row_max,
                                   exp_sum, static_cast<float>(grad_scale), kernels::kIgnoreIndex,
                                   *dlogits, ctx);
  }
  return sums;
}

}  // namespace switchyard::parallel
