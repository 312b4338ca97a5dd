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
#include <cub/device/device_radix_sort.cuh>

#include <climits>
#include <cmath>

#include "kernels/cuda/common.cuh"
#include "kernels/vocab_parallel.h"

namespace switchyard::kernels::cuda {
namespace {

// Threads for a row of `cols` elements: about four per thread, 32..1024.
int RowThreads(int64_t cols) {
  const int64_t t = ((cols + 3) / 4 + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 1024 ? 1024 : t));
}

unsigned RowBlocks(int64_t n) { return static_cast<unsigned>(n < 65535 * 16 ? n : 65535 * 16); }

// The local index of global id `id` in [start, start + count), or -1.
__device__ __forceinline__ int64_t LocalIndex(int32_t id, int64_t start, int64_t count) {
  const int64_t l = static_cast<int64_t>(id) - start;
  return l >= 0 && l < count ? l : -1;
}

__global__ void LocalIdsKernel(const int32_t* ids, int64_t n, int64_t start, int64_t valid,
                               int32_t trash, int32_t* out) {
  SY_GRID_STRIDE(i, n) {
    const int64_t l = LocalIndex(ids[i], start, valid);
    out[i] = l >= 0 ? static_cast<int32_t>(l) : trash;
  }
}

// x (n, c); out (n) = max of x[r, :valid].
__global__ void RowMaxKernel(const float* x, int64_t n, int64_t c, int64_t valid, float* out) {
  __shared__ float shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    float best = -INFINITY;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) best = fmaxf(best, x[r * c + j]);
    best = BlockMax(best, shared, -INFINITY);
    if (threadIdx.x == 0) out[r] = best;
  }
}

// x (n, c); out (n) = sum of exp(x[r, :valid] - m[r]).
__global__ void ExpSumKernel(const float* x, int64_t n, int64_t c, int64_t valid,
                             const float* m, float* out) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float max = m[r];
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < valid; j += blockDim.x) {
      sum += expf(__fsub_rn(x[r * c + j], max));
    }
    sum = BlockSum(sum, shared);
    if (threadIdx.x == 0) out[r] = static_cast<float>(sum);
  }
}

__global__ void TargetLogitKernel(const float* x, const int32_t* t, int64_t n, int64_t c,
                                  int64_t start, int64_t valid, int32_t ignore, float* out) {
  SY_GRID_STRIDE(r, n) {
    const int64_t l = t[r] == ignore ? -1 : LocalIndex(t[r], start, valid);
    out[r] = l >= 0 ? x[r * c + l] : 0.0f;
  }
}

__global__ void SoftmaxGradKernel(const float* x, const int32_t* t, int64_t n, int64_t c,
                                  int64_t start, int64_t valid, const float* m, const float* s,
                                  float scale, int32_t ignore, float* d) {
  SY_GRID_STRIDE(i, n * c) {
    const int64_t r = i / c, j = i % c;
    float g = 0.0f;
    if (t[r] != ignore && j < valid) {
      const float p = __fdiv_rn(expf(__fsub_rn(x[i], m[r])), s[r]);
      const bool is_target = j == LocalIndex(t[r], start, valid);
      g = __fmul_rn(scale, __fsub_rn(p, is_target ? 1.0f : 0.0f));
    }
    d[i] = g;
  }
}

// out (n, d)[i, :] = table (rows, d)[ids[i] - start, :] for this shard's ids, else 0.
__global__ void EmbeddingForwardKernel(const int32_t* ids, const float* table, int64_t n,
                                       int64_t d, int64_t start, int64_t rows, float* out) {
  SY_GRID_STRIDE(e, n * d) {
    const int64_t i = e / d, j = e % d;
    const int64_t l = LocalIndex(ids[i], start, rows);
    out[e] = l >= 0 ? table[l * d + j] : 0.0f;
  }
}

__global__ void IotaKernel(int32_t* out, int64_t n) {
  SY_GRID_STRIDE(i, n) out[i] = static_cast<int32_t>(i);
}

// sorted_rows / positions (n): local rows in increasing order (`rows` = not this shard's),
// each with its position. The block at the head of each run of one local row adds the
// run's dout rows into dtable (rows, d) in position order.
__global__ void ScatterAddRunsKernel(const int32_t* sorted_rows, const int32_t* positions,
                                     int64_t n, const float* dout, float* dtable, int64_t d,
                                     int64_t rows) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const int32_t row = sorted_rows[k];
    if (row >= rows) continue;
    if (k > 0 && sorted_rows[k - 1] == row) continue;  // not the head of its run
    int64_t end = k + 1;
    while (end < n && sorted_rows[end] == row) ++end;
    float* dst = dtable + static_cast<int64_t>(row) * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = dst[j];
      for (int64_t q = k; q < end; ++q) acc = __fadd_rn(acc, dout[positions[q] * d + j]);
      dst[j] = acc;
    }
  }
}

}  // namespace

void VocabShardRowMax(const Tensor& logits, int64_t valid_cols, Tensor& out, DeviceContext* ctx) {
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  RowMaxKernel<<<RowBlocks(n), RowThreads(valid_cols), 0, StreamOf(ctx)>>>(
      logits.data<float>(), n, logits.dim(1), valid_cols, out.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void VocabShardExpSum(const Tensor& logits, int64_t valid_cols, const Tensor& row_max,
                      Tensor& out, DeviceContext* ctx) {
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  ExpSumKernel<<<RowBlocks(n), RowThreads(valid_cols), 0, StreamOf(ctx)>>>(
      logits.data<float>(), n, logits.dim(1), valid_cols, row_max.data<float>(),
      out.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void VocabShardTargetLogit(const Tensor& logits, const Tensor& targets, int64_t vocab_start,
                           int64_t valid_cols, int32_t ignore_index, Tensor& out,
                           DeviceContext* ctx) {
  const int64_t n = logits.dim(0);
  if (n == 0) return;
  TargetLogitKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(
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
  SoftmaxGradKernel<<<GridFor(n * c), 256, 0, StreamOf(ctx)>>>(
      logits.data<float>(), targets.data<int32_t>(), n, c, vocab_start, valid_cols,
      row_max.data<float>(), exp_sum.data<float>(), grad_scale, ignore_index,
      dlogits.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void VocabShardEmbeddingForward(const Tensor& ids, const Tensor& table_shard,
                                int64_t vocab_start, Tensor& out, DeviceContext* ctx) {
  const int64_t n = ids.numel(), rows = table_shard.dim(0), d = table_shard.dim(1);
  if (n * d == 0) return;
  EmbeddingForwardKernel<<<GridFor(n * d), 256, 0, StreamOf(ctx)>>>(
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
  LocalIdsKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(ids.data<int32_t>(), n, vocab_start,
                                                        rows, static_cast<int32_t>(rows), local);
  SY_CUDA_CHECK_LAUNCH();
  IotaKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(positions, n);
  SY_CUDA_CHECK_LAUNCH();
  int end_bit = 1;  // keys are in [0, rows]
  while (end_bit < 31 && (int64_t{1} << end_bit) <= rows) ++end_bit;
  size_t temp_bytes = 0;
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, local, sorted_local,
                                                positions, sorted_positions, static_cast<int>(n),
                                                0, end_bit, StreamOf(ctx)));
  Tensor temp = Scratch(temp_bytes, ctx);
  SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, local, sorted_local,
                                                positions, sorted_positions, static_cast<int>(n),
                                                0, end_bit, StreamOf(ctx)));
  const int threads = static_cast<int>(std::min<int64_t>(256, std::max<int64_t>(32, (d + 31) / 32 * 32)));
  ScatterAddRunsKernel<<<RowBlocks(n), threads, 0, StreamOf(ctx)>>>(
      sorted_local, sorted_positions, n, dout.data<float>(), dtable_shard.data<float>(), d, rows);
  SY_CUDA_CHECK_LAUNCH();
}


}  // namespace switchyard::kernels::cuda
