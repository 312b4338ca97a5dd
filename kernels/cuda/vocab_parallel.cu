// CUDA implementation of kernels/vocab_parallel.h.
//
// Row reductions (RowMax, ExpSum): one block per row (grid-stride over rows), each thread
// a fixed strided subset of the row's valid columns, then the fixed tree of BlockMax /
// BlockSum (common.cuh): deterministic. The max equals the CPU's; the sum takes expf (<= 2
// ulp, as kernels/cuda/cross_entropy.cu) summed in double in another order than the CPU.
// TargetLogit: one thread per row. SoftmaxGrad: one thread per element, reading its logit
// before writing its gradient (dlogits may alias logits).
//
// Embedding: the forward is one thread per output element. The backward is the
// kernels/cuda/embedding.cu scheme restricted to this shard: every id becomes its local row,
// or the sentinel Vl for ids of other ranks; a stable radix sort (cub) of (local row,
// position) keeps each row's positions in increasing order, and one block per run of a
// local row adds the run's dout rows in that order, each thread owning columns — the CPU's
// f32 additions in the CPU's order, so both devices give bit-identical shards. No atomics.
// The device code is in kernels/cuda/vocab_parallel_kernels.cuh.
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/vocab_parallel_kernels.cuh"
#include "kernels/vocab_parallel.h"

namespace switchyard::kernels::cuda {

namespace vd = vocab_dev;

void VocabShardRowMax(const Tensor& logits, int64_t valid_cols, Tensor& out, DeviceContext* ctx) {
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  vd::RowMaxKernel<<<vd::RowBlocks(n), vd::RowThreads(valid_cols), 0, StreamOf(ctx)>>>(
      logits.data<float>(), n, logits.dim(1), valid_cols, out.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void VocabShardExpSum(const Tensor& logits, int64_t valid_cols, const Tensor& row_max,
                      Tensor& out, DeviceContext* ctx) {
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  vd::ExpSumKernel<<<vd::RowBlocks(n), vd::RowThreads(valid_cols), 0, StreamOf(ctx)>>>(
      logits.data<float>(), n, logits.dim(1), valid_cols, row_max.data<float>(),
      out.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, int32_t ignore_index, Tensor& out,
                           DeviceContext* ctx) {
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  vd::TargetLogitKernel<<<GridFor(n, vd::kThreads), vd::kThreads, 0, StreamOf(ctx)>>>(
      logits.data<float>(), targets.data<int32_t>(), n, logits.dim(1), vocab_start, valid_cols,
      ignore_index, out.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void VocabShardSoftmaxGrad(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, const Tensor& row_max, const Tensor& exp_sum,
                           float grad_scale, int32_t ignore_index, Tensor& dlogits,
                           DeviceContext* ctx) {
  const int64_t n = logits.dim(0), c = logits.dim(1);
  if (n * c == 0) return;
  vd::SoftmaxGradKernel<<<GridFor(n * c, vd::kThreads), vd::kThreads, 0, StreamOf(ctx)>>>(
      logits.data<float>(), targets.data<int32_t>(), n, c, vocab_start, valid_cols,
      row_max.data<float>(), exp_sum.data<float>(), grad_scale, ignore_index,
      dlogits.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void VocabShardEmbeddingForward(const Tensor& ids, const Tensor& table_shard,
                                int64_t vocab_start, Tensor& out, DeviceContext* ctx) {
  const int64_t n = ids.numel(), rows = table_shard.dim(0), d = table_shard.dim(1);
  if (n * d == 0) return;
  vd::EmbeddingForwardKernel<<<GridFor(n * d, vd::kThreads), vd::kThreads, 0, StreamOf(ctx)>>>(
      ids.data<int32_t>(), table_shard.data<float>(), n, d, vocab_start, rows,
      out.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void VocabShardEmbeddingBackward(const Tensor& ids, const Tensor& dout, int64_t vocab_start,
                                 Tensor& dtable_shard, DeviceContext* ctx) {
  const int64_t n = ids.numel(), rows = dtable_shard.dim(0), d = dtable_shard.dim(1);
  if (n * d == 0) return;
  SY_CHECK(n <= INT32_MAX && rows < INT32_MAX)
      << "VocabShardEmbeddingBackward: " << n << " ids, " << rows
      << " rows; the CUDA sort takes < 2^31";
  // (4, n) i32: local rows (sentinel `rows`), sorted local rows, positions, sorted positions.
  Tensor keys = Tensor::Empty({4, n}, DType::kI32, ctx->device());
  int32_t* local = keys.data<int32_t>();
  int32_t* sorted_local = local + n;
  int32_t* positions = sorted_local + n;
  int32_t* sorted_positions = positions + n;
  vd::LocalIdsKernel<<<GridFor(n, vd::kThreads), vd::kThreads, 0, StreamOf(ctx)>>>(
      ids.data<int32_t>(), n, vocab_start, rows, static_cast<int32_t>(rows), local);
  SY_CUDA_CHECK_LAUNCH();
  vd::IotaKernel<<<GridFor(n, vd::kThreads), vd::kThreads, 0, StreamOf(ctx)>>>(positions, n);
  SY_CUDA_CHECK_LAUNCH();
  const int end_bit = vd::KeyBits(rows);  // keys are in [0, rows]
  size_t temp_bytes = 0;
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, local, sorted_local,
                                                positions, sorted_positions, static_cast<int>(n),
                                                0, end_bit, StreamOf(ctx)));
  Tensor temp = Scratch(temp_bytes, ctx);
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, local, sorted_local,
                                                positions, sorted_positions, static_cast<int>(n),
                                                0, end_bit, StreamOf(ctx)));
  vd::ScatterAddRunsKernel<<<vd::RowBlocks(n), vd::RunThreads(d), 0, StreamOf(ctx)>>>(
      sorted_local, sorted_positions, n, dout.data<float>(), dtable_shard.data<float>(), d, rows);
  SY_CUDA_CHECK_LAUNCH();
}


}  // namespace switchyard::kernels::cuda
