#include "dense/tp_block.h"

#include "engine/parallel/tensor_parallel.h"

namespace switchyard::dense {

Tensor EnterTensorParallel(const TensorParallel& tp, const Tensor& x, DeviceContext* ctx) {
  if (!tp.active()) return x;
  if (tp.sequence_parallel) return parallel::GatherFromSequenceParallelRegion(x, *tp.comm, ctx);
  return parallel::CopyToTensorParallelRegion(x, *tp.comm, ctx);
}

Tensor EnterTensorParallelBackward(const TensorParallel& tp, const Tensor& dx_full,
                                   DeviceContext* ctx) {
  if (!tp.active()) return dx_full;
  if (tp.sequence_parallel) {
    return parallel::GatherFromSequenceParallelRegionBackward(dx_full, *tp.comm, ctx);
  }
  return parallel::CopyToTensorParallelRegionBackward(dx_full, *tp.comm, ctx);
}

Tensor LeaveTensorParallel(const TensorParallel& tp, const Tensor& partial, DeviceContext* ctx) {
  if (!tp.active()) return partial;
  if (tp.sequence_parallel) {
    return parallel::ReduceScatterToSequenceParallelRegion(partial, *tp.comm, ctx);
  }
  return parallel::ReduceFromTensorParallelRegion(partial, *tp.comm, ctx);
}

Tensor LeaveTensorParallelBackward(const TensorParallel& tp, const Tensor& dy,
                                   DeviceContext* ctx) {
  if (!tp.active()) return dy;
  if (tp.sequence_parallel) {
    return parallel::ReduceScatterToSequenceParallelRegionBackward(dy, *tp.comm, ctx);
  }
  return parallel::ReduceFromTensorParallelRegionBackward(dy, *tp.comm, ctx);
}

}  // namespace switchyard::dense
