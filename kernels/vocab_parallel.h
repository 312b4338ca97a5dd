// The per-rank pieces of Megatron-LM's vocabulary-parallel embedding and cross-entropy
// (megatron/core/tensor_parallel/layers.py VocabParallelEmbedding, cross_entropy.py
// _VocabParallelCrossEntropy); engine/parallel/vocab_parallel.h composes them with the
// collectives. A tensor-parallel rank holds the vocabulary ids [vocab_start, vocab_start +
// valid_cols) of a vocabulary padded to a multiple of tp; its logits are (N, C) with
// C >= valid_cols columns, the columns past valid_cols being padding that never counts
// (0 <= valid_cols <= C: a rank may hold padding only).
//
//   VocabShardRowMax             out (N) = max over valid columns of logits (-inf if none)
//   VocabShardExpSum             out (N) = sum over valid columns of exp(logit - row_max)
//   VocabShardTargetLogit        out (N) = logits[r, t - vocab_start] for this rank's
//                                targets, 0 for the others and for ignored rows
//   VocabShardSoftmaxGrad        dlogits = grad_scale * (exp(l - max) / sum - onehot) on
//                                valid columns of counted rows; 0 on padding and ignored rows
//   VocabShardEmbeddingForward   out (N, d) = table_shard[id - vocab_start] for this rank's
//                                ids, 0 for the others (the sum over ranks is the lookup)
//   VocabShardEmbeddingBackward  dtable_shard[id - vocab_start] += dout[i] for this rank's
//                                ids, in position order (kernels/embedding.h's order, so
//                                the shard equals those rows of the whole EmbeddingBackward)
//
// Ids are not checked against the vocabulary (a rank knows only its own range): an id no
// rank holds looks up zeros. f32 logits and tables, i32 ids and targets. CPU reference in
// kernels/cpu/vocab_parallel.cc; CUDA in kernels/cuda/vocab_parallel.cu (one block per row
// for the row reductions, a fixed reduction tree; a stable sort for the embedding backward;
// no atomics, deterministic).
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// logits (N, C) f32; out, row_max, exp_sum (N) f32; targets (N) i32 (any shape of N).
void VocabShardRowMax(const Tensor& logits, int64_t valid_cols, Tensor& out,
                      DeviceContext* ctx = nullptr);
void VocabShardExpSum(const Tensor& logits, int64_t valid_cols, const Tensor& row_max,
                      Tensor& out, DeviceContext* ctx = nullptr);
void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, int32_t ignore_index, Tensor& out,
                           DeviceContext* ctx = nullptr);
// dlogits (N, C) f32, written whole; may be the same tensor as logits.
void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits,
                           DeviceContext* ctx = nullptr);

// ids (N) i32 (any shape); table_shard, dtable_shard (Vl, d) f32; out, dout (N, d) f32 (or
// any (..., d) with N rows). Forward writes out whole; backward accumulates.
void VocabShardEmbeddingForward(const Tensor& ids, const Tensor& table_shard,
                                int64_t vocab_start, Tensor& out, DeviceContext* ctx = nullptr);
void VocabShardEmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vocab_start,
                                 Tensor& dtable_shard, DeviceContext* ctx = nullptr);

// The implementations on checked arguments.
namespace cpu {
void VocabShardRowMax(const Tensor& logits, int64_t valid_cols, Tensor& out);
void VocabShardExpSum(const Tensor& logits, int64_t valid_cols, const Tensor& row_max,
                      Tensor& out);
void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, int32_t ignore_index, Tensor& out);
void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits);
void VocabShardEmbeddingForward(const Tensor& ids, const Tensor& table_shard,
                                int64_t vocab_start, Tensor& out);
void VocabShardEmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vocab_start,
                                 Tensor& dtable_shard);
}  // namespace cpu

namespace cuda {
void VocabShardRowMax(const Tensor& logits, int64_t valid_cols, Tensor& out, DeviceContext* ctx);
void VocabShardExpSum(const Tensor& logits, int64_t valid_cols, const Tensor& row_max,
                      Tensor& out, DeviceContext* ctx);
void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, int32_t ignore_index, Tensor& out,
                           DeviceContext* ctx);
void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits,
                           DeviceContext* ctx);
void VocabShardEmbeddingForward(const Tensor& ids, const Tensor& table_shard,
                                int64_t vocab_start, Tensor& out, DeviceContext* ctx);
void VocabShardEmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vocab_start,
                                 Tensor& dtable_shard, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
