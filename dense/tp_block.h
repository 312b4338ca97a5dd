// How a dense block enters and leaves its tensor-parallel region (Megatron-LM's
// ColumnParallelLinear input and RowParallelLinear output, for a block of several
// projections: q, k and v share one gathered input, so the block communicates, not each
// Linear).
//
// Rows are tokens (dim 0, (sequence, position) order). Without sequence parallelism every
// tp rank holds all N rows; with it, rank r holds rows [r*N/tp, (r+1)*N/tp).
//
//   enter   sp: all-gather the rows (backward: reduce-scatter)
//           no sp: identity               (backward: all-reduce)      Megatron's f
//   leave   sp: reduce-scatter the rows of the row-parallel partial sums
//                                          (backward: all-gather)
//           no sp: all-reduce             (backward: identity)         Megatron's g
#pragma once

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::dense {

// The tensor-parallel group a block runs in. comm null (or of size 1): none.
struct TensorParallel {
  dist::Communicator* comm = nullptr;
  bool sequence_parallel = false;

  int rank() const { return comm ? comm->rank() : 0; }
  int size() const { return comm ? comm->size() : 1; }
  bool active() const { return size() > 1; }
};

// x: this rank's rows -> the block's input (all rows).
Tensor EnterTensorParallel(const TensorParallel& tp, const Tensor& x, DeviceContext* ctx);
// d(block input) -> d(x), this rank's rows.
Tensor EnterTensorParallelBackward(const TensorParallel& tp, const Tensor& dx_full,
                                   DeviceContext* ctx);
// The row-parallel partial sums (all rows) -> the block's output rows on this rank.
Tensor LeaveTensorParallel(const TensorParallel& tp, const Tensor& partial, DeviceContext* ctx);
// d(output rows) -> d(partial) (all rows).
Tensor LeaveTensorParallelBackward(const TensorParallel& tp, const Tensor& dy,
                                   DeviceContext* ctx);

}  // namespace switchyard::dense
