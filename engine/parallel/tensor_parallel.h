// Megatron-LM's tensor-parallel mappings (megatron/core/tensor_parallel/mappings.py): each
// is a pair of functions, the forward and its conjugate backward, over the tensor-parallel
// group `tp`; the layer that owns a split calls them (dense/tp_block.cc). Nothing else
// lives here.
//
//   forward                                 backward
//   CopyToTensorParallelRegion      (f)     identity            all-reduce (sum)
//   ReduceFromTensorParallelRegion  (g)     all-reduce (sum)    identity
//   ScatterToTensorParallelRegion           own last-dim block  all-gather last dim
//   GatherFromTensorParallelRegion          all-gather last dim own last-dim block
//   ScatterToSequenceParallelRegion         own row block       all-gather rows
//   GatherFromSequenceParallelRegion        all-gather rows     reduce-scatter rows (sum)
//   ReduceScatterToSequenceParallelRegion   reduce-scatter rows all-gather rows
//
// Tensors: rows are dim 0, tokens in (sequence, position) order, N = B * S; the "last dim"
// forms split features, (..., tp * c) <-> (..., c), rank r holding columns [r*c, (r+1)*c).
// Sequence parallelism: rank r holds the contiguous rows SequenceShardOf(N, r, tp) =
// [r*N/tp, (r+1)*N/tp); N (and the last dim for its forms) must divide by tp, a fatal check.
//
// Every function returns a new tensor, except the identities, which return their argument
// (its handle: the same storage). A group of size 1 makes every mapping the identity.
// Device tensors need `tp`'s device and ctx (the stream the collectives are ordered on);
// the all-reduce and row forms move any dtype, the last-dim forms any dtype whose blocks
// are whole 4-byte words (f32; bf16 with an even block). Collective over tp: every rank
// calls the same mappings in the same order.
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::parallel {

// Rows [begin, end) of `rows` that rank `rank` of a group of `size` holds under sequence
// parallelism; size must divide rows.
struct SequenceShard {
  int64_t begin = 0, end = 0;
  int64_t rows() const { return end - begin; }
};
SequenceShard SequenceShardOf(int64_t rows, int rank, int size);

// f: x enters the region replicated; its gradient is the sum of every rank's.
Tensor CopyToTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx);
Tensor CopyToTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                          DeviceContext* ctx);

// g: every rank's partial x summed (row-parallel output); the gradient passes unchanged.
Tensor ReduceFromTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx);
Tensor ReduceFromTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                              DeviceContext* ctx);

// x (..., tp * c) replicated -> (..., c), this rank's block of the last dim.
Tensor ScatterToTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx);
// dy (..., c) -> (..., tp * c), every rank's block side by side.
Tensor ScatterToTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                             DeviceContext* ctx);

// x (..., c) -> (..., tp * c), every rank's block side by side.
Tensor GatherFromTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx);
// dy (..., tp * c) -> (..., c), this rank's block.
Tensor GatherFromTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                              DeviceContext* ctx);

// x (N, ...) replicated -> (N/tp, ...), this rank's rows.
Tensor ScatterToSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                       DeviceContext* ctx);
// dy (N/tp, ...) -> (N, ...), every rank's rows in rank order.
Tensor ScatterToSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                               DeviceContext* ctx);

// x (N/tp, ...) -> (N, ...), every rank's rows in rank order.
Tensor GatherFromSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                        DeviceContext* ctx);
// dy (N, ...) partial -> (N/tp, ...), this rank's rows of the sum over ranks.
Tensor GatherFromSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                                DeviceContext* ctx);

// x (N, ...) partial -> (N/tp, ...), this rank's rows of the sum over ranks.
Tensor ReduceScatterToSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                             DeviceContext* ctx);
// dy (N/tp, ...) -> (N, ...), every rank's rows in rank order.
Tensor ReduceScatterToSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                                     DeviceContext* ctx);

}  // namespace switchyard::parallel
