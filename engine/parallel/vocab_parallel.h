// The vocabulary split over the tensor-parallel group and the vocabulary-parallel
// cross-entropy (Megatron-LM megatron/core/tensor_parallel/cross_entropy.py,
// _VocabParallelCrossEntropy): each tp rank holds the logits of its vocabulary shard, and
// the loss of every row comes from all-reduces of one value per row (the max, then the sum
// of exponentials with the target logit), so the full (N, V) logits never exist on one
// rank. The per-rank kernels are in kernels/vocab_parallel.h (with the vocabulary-parallel
// embedding's lookup and backward).
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "kernels/cross_entropy.h"

namespace switchyard::parallel {

// V rounded up to a multiple of tp (Megatron pads the vocabulary so every rank holds an
// equal shard).
int64_t PaddedVocab(int64_t vocab, int tp);

// Rank `rank` of `tp` holds vocabulary ids [start, start + shard_cols) of the padded
// vocabulary; the first valid_cols of them are real ids (< V), the rest padding. valid_cols
// may be 0 (V small against tp: a rank of padding only).
struct VocabRange {
  int64_t start = 0, valid_cols = 0, shard_cols = 0;
};
VocabRange VocabRangeOf(int64_t vocab, int tp, int rank);

// The cross-entropy sums of rows whose logits are split by vocabulary.
//   logits (N, C) f32: this rank's columns, ids [vocab_start, vocab_start + C), of which
//          the first valid_cols are real (the rest padding, never counted);
//   targets (N) i32 global ids, any shape of N; ignore_index masks a row.
// Returns on every rank the sums kernels::CrossEntropyForward gives on the whole logits:
// per counted row log(sum exp(l - max)) + max - l[target], with max, the sum and the target
// logit all-reduced over tp, accumulated in double in row order on the host (identical on
// every rank); count = rows whose target != ignore_index. A counted target outside
// [0, V) is a fatal check on every rank (V = the largest vocab_start + valid_cols).
// dlogits (N, C) f32 or null (may be &logits): written with grad_scale * (softmax -
// onehot) on this rank's valid columns, 0 on padding columns and ignored rows.
// Collective over tp: two all-reduces of one to two values per row; on a device, one
// device->host copy of them (a stream synchronisation).
kernels::CrossEntropySums VocabParallelCrossEntropy(const Tensor& logits, const Tensor& targets,
                                                    int64_t vocab_start, int64_t valid_cols,
                                                    dist::Communicator& tp, Tensor* dlogits,
                                                    double grad_scale, DeviceContext* ctx,
                                                    int32_t ignore_index = kernels::kIgnoreIndex);

}  // namespace switchyard::parallel
