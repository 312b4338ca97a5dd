// The per-rank pieces of Megatron-LM's vocabulary-parallel embedding and cross-entropy
// (engine/parallel/tensor_parallel.h composes them with the collectives). A tensor-parallel
// rank holds the vocabulary ids [vocab_start, vocab_start + valid) of a vocabulary padded
// to a multiple of tp; its logits are (N, C) with C >= valid columns, the columns past
// `valid` being padding that never counts.
//
//   VocabShardLocalIds      ids (N) i32 -> local (N) i32: id - vocab_start for this rank's
//                           ids, `trash` for the others (the embedding table carries one
//                           extra zero row there, so kernels/embedding.h does the lookup
//                           and its deterministic backward unchanged)
//   VocabShardRowMax        out (N) = max over valid columns of logits
//   VocabShardExpSum        out (N) = sum over valid columns of exp(logit - row_max)
//   VocabShardTargetLogit   out (N) = logits[r, t - vocab_start] for this rank's targets, else 0
//   VocabShardSoftmaxGrad   dlogits = grad_scale * (exp(l - max) / sum - onehot) on valid
//                           columns of counted rows; 0 on padding and ignored rows
//
// f32 logits, i32 ids; outputs f32. CPU reference in kernels/cpu/vocab_parallel.cc, CUDA in
// kernels/cuda/vocab_parallel.cu (one thread per row or element: no atomics, deterministic).
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

void VocabShardLocalIds(const Tensor& ids, int64_t vocab_start, int64_t valid, int32_t trash,
                        Tensor& local, DeviceContext* ctx = nullptr);
void VocabShardRowMax(const Tensor& logits, int64_t valid, Tensor& out,
                      DeviceContext* ctx = nullptr);
void VocabShardExpSum(const Tensor& logits, int64_t valid, const Tensor& row_max, Tensor& out,
                      DeviceContext* ctx = nullptr);
void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, Tensor& out, DeviceContext* ctx = nullptr);
void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits,
                           DeviceContext* ctx = nullptr);

namespace cpu {
void VocabShardLocalIds(const Tensor& ids, int64_t vocab_start, int64_t valid, int32_t trash,
                        Tensor& local);
void VocabShardRowMax(const Tensor& logits, int64_t valid, Tensor& out);
void VocabShardExpSum(const Tensor& logits, int64_t valid, const Tensor& row_max, Tensor& out);
void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, Tensor& out);
void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits);
}  // namespace cpu

namespace cuda {
void VocabShardLocalIds(const Tensor& ids, int64_t vocab_start, int64_t valid, int32_t trash,
                        Tensor& local, DeviceContext* ctx);
void VocabShardRowMax(const Tensor& logits, int64_t valid, Tensor& out, DeviceContext* ctx);
void VocabShardExpSum(const Tensor& logits, int64_t valid, const Tensor& row_max, Tensor& out,
                      DeviceContext* ctx);
void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, Tensor& out, DeviceContext* ctx);
void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits,
                           DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
