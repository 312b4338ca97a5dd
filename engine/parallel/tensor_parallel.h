// Megatron-LM's tensor-parallel mappings (megatron/core/tensor_parallel/mappings.py): each
// is a pair of functions, the forward and its conjugate backward, over the tensor-parallel
// group `tp`. A group of size 1 makes every one the identity. Tensors are rows (dim 0) of
// tokens in (sequence, position) order; the "last dim" forms split features.
//
//   forward                              backward
//   CopyToTensorParallelRegion     (f)   identity           all-reduce
//   ReduceFromTensorParallelRegion (g)   all-reduce         identity
//   ScatterToTensorParallelRegion        own last-dim block all-gather last dim
//   GatherFromTensorParallelRegion       all-gather last    own last-dim block
//   ScatterToSequenceParallelRegion      own row block      all-gather rows
//   GatherFromSequenceParallelRegion     all-gather rows    reduce-scatter rows
//   ReduceScatterToSequenceParallelRegion reduce-scatter    all-gather rows
//
// Sequence parallelism: tp rank r holds rows [r*N/tp, (r+1)*N/tp) (SequenceShardOf).
// Plus the vocabulary-parallel cross-entropy (Megatron's vocab_parallel_cross_entropy): the
// logits of each tp rank are the columns of its vocabulary shard, and the loss of every
// row comes from three all-reduces of one value per row (max, sum of exponentials, target
// logit), so the full logits never exist on one rank.
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "kernels/cross_entropy.h"

namespace switchyard::parallel {

// Rows [begin, end) of `rows` that tp rank `rank` of `size` holds; size must divide rows.
struct SequenceShard {
  int64_t begin = 0, end = 0;
};
SequenceShard SequenceShardOf(int64_t rows, int rank, int size);

Tensor CopyToTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx);
Tensor CopyToTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                          DeviceContext* ctx);

Tensor ReduceFromTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx);
Tensor ReduceFromTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                              DeviceContext* ctx);

// x (..., tp * c) -> (..., c), this rank's block of the last dim.
Tensor ScatterToTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx);
Tensor ScatterToTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                             DeviceContext* ctx);

// x (..., c) -> (..., tp * c), the ranks' blocks side by side.
Tensor GatherFromTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx);
Tensor GatherFromTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                              DeviceContext* ctx);

// x (N, ...) -> (N/tp, ...), this rank's rows.
Tensor ScatterToSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                       DeviceContext* ctx);
Tensor ScatterToSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                               DeviceContext* ctx);

// x (N/tp, ...) -> (N, ...), every rank's rows in rank order.
Tensor GatherFromSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                        DeviceContext* ctx);
Tensor GatherFromSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                                DeviceContext* ctx);

// x (N, ...) partial sums -> (N/tp, ...), this rank's rows of the sum.
Tensor ReduceScatterToSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                             DeviceContext* ctx);
Tensor ReduceScatterToSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                                     DeviceContext* ctx);

// The vocabulary split: V padded to a multiple of tp, rank r holds columns
// [start, start + shard_cols) of which the first valid_cols are real vocabulary.
struct VocabRange {
  int64_t start = 0, valid_cols = 0, shard_cols = 0;
};
int64_t PaddedVocab(int64_t vocab, int tp);
VocabRange VocabRangeOf(int64_t vocab, int tp, int rank);

// Cross-entropy sums over rows of logits split by vocabulary: logits (N, C) this rank's
// columns, of which the first valid_cols are vocabulary ids [vocab_start, +valid_cols) (the
// rest padding, never counted); targets (N) i32 global ids, kernels::kIgnoreIndex masks a
// row. Returns the same sums as kernels::CrossEntropyForward on the whole logits, on every
// rank (loss_sum accumulated in double in row order). With dlogits (may alias logits):
// grad_scale * (softmax - onehot) on this rank's valid columns, 0 on padding and ignored
// rows. Collective over tp.
kernels::CrossEntropySums VocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets,
                                                    int64_t vocab_start, int64_t valid_cols,
                                                    dist::Communicator& tp, Tensor* dlogits,
                                                    double grad_scale, DeviceContext* ctx);

}  // namespace switchyard::parallel
