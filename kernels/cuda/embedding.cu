// CUDA implementation of kernels/embedding.h.
//
// Ids: ValidateIdsKernel records the smallest position holding an id outside [0, V) in a
// device word (atomicMin, so the first bad position whatever the schedule); the kernels
// skip such ids, and the op then copies that word to the host (8 bytes, one stream
// synchronisation per lookup) and fails naming the id, as the CPU does. With ids checked
// on the host by the caller (check_ids false) neither runs; the kernels still skip bad ids.
//
// Backward, deterministic: the (id, position) pairs are sorted by id with cub's stable radix
// sort, so each id's positions stay in increasing order. The sorted positions are cut into
// chunks of kPieceRows (64). An id with at most 64 rows is added whole, in that order, by
// the block of the chunk holding its first row, each thread owning columns — the same f32
// additions in the same order as the CPU loop (bit-identical). A hot id (more rows: a
// frequent token has thousands in a batch) is summed in parallel: each chunk's piece of its
// run in order from zero by that chunk's block (stage 1), then dtable[id] plus the pieces in
// chunk order (stage 2) — a fixed two-level order, deterministic, and within the rounding
// of the CPU's running sum (the bound in tests/gpu/embedding_gpu_test.cc).
//
// Positions: AddPositionEmbedding is elementwise; its backward has one thread per (s, j)
// adding the batch's rows in order b = 0, 1, ..., as the CPU does (bit-identical).
#include <climits>
#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/embedding.h"

namespace switchyard::kernels::cuda {
namespace {

constexpr unsigned long long kNoBadId = ULLONG_MAX;

__global__ void ValidateIdsKernel(const int32_t* ids, int64_t n, int64_t v,
                                  unsigned long long* first_bad) {
  SY_GRID_STRIDE(i, n) {
    if (ids[i] < 0 || ids[i] >= v) atomicMin(first_bad, static_cast<unsigned long long>(i));
  }
}

// out (n, d)[i, j] = table (v, d)[ids[i], j]; rows of bad ids are left alone.
__global__ void GatherKernel(const int32_t* ids, const float* table, float* out, int64_t n,
                             int64_t d, int64_t v) {
  SY_GRID_STRIDE(e, n * d) {
    const int64_t i = e / d, j = e % d;
    const int32_t id = ids[i];
    if (id >= 0 && id < v) out[e] = table[id * d + j];
  }
}

__global__ void IotaKernel(int32_t* out, int64_t n) {
  SY_GRID_STRIDE(i, n) out[i] = static_cast<int32_t>(i);
}

// Rows of one piece: a run of at most kPieceRows equal ids is summed whole, in order, into
// dtable (as the CPU); a longer run (a hot token) is summed in pieces of the chunk grid below.
constexpr int64_t kPieceRows = 64;

// The end of the run of sorted_ids[k] starting at or before k, but looking at most `limit`
// positions past k (returns min(end, k + limit + 1) in that case: enough to tell a run
// longer than kPieceRows).
__device__ __forceinline__ int64_t RunEnd(const int32_t* sorted_ids, int64_t n, int64_t k,
                                          int64_t limit) {
  const int32_t id = sorted_ids[k];
  int64_t end = k + 1;
  while (end < n && end <= k + limit && sorted_ids[end] == id) ++end;
  return end;
}

// The start of the run holding k, looking back at most kPieceRows + 1 positions (a run that
// started earlier is long whatever its exact start).
__device__ __forceinline__ int64_t RunStart(const int32_t* sorted_ids, int64_t k) {
  const int32_t id = sorted_ids[k];
  int64_t start = k;
  while (start > 0 && k - start <= kPieceRows && sorted_ids[start - 1] == id) --start;
  return start;
}

// Adds rows [q0, q1) of dout (in sorted order) to acc, column j, in order.
__device__ __forceinline__ float AddRows(float acc, const int32_t* rows, int64_t q0, int64_t q1,
                                         const float* dout, int64_t d, int64_t j) {
  for (int64_t q = q0; q < q1; ++q) acc = __fadd_rn(acc, dout[rows[q] * d + j]);
  return acc;
}

// Stage 1, one block per chunk c = sorted positions [c K, (c + 1) K) (K = kPieceRows). A
// run of L <= K valid ids whose head lies in the chunk is added whole into dtable by this
// block, row by row in order (the CPU's additions: bit-identical). A longer run is cut at
// the chunk boundaries; each piece is summed in order from 0 into partial (2 C, d): slot
// 2c + 1 for the piece starting at the run's head, slot 2c for the piece of a run that began
// in an earlier chunk (a chunk holds at most one of each).
__global__ void ScatterAddPiecesKernel(const int32_t* sorted_ids, const int32_t* rows, int64_t n,
                                       const float* dout, float* dtable, float* partial,
                                       int64_t d, int64_t v) {
  const int64_t chunks = (n + kPieceRows - 1) / kPieceRows;
  for (int64_t c = blockIdx.x; c < chunks; c += gridDim.x) {
    const int64_t c0 = c * kPieceRows, c1 = c0 + kPieceRows < n ? c0 + kPieceRows : n;
    int64_t k = c0;
    if (k > 0 && sorted_ids[k - 1] == sorted_ids[k]) {  // a run begun in an earlier chunk
      const int64_t start = RunStart(sorted_ids, k);
      const int64_t end = RunEnd(sorted_ids, n, k, kPieceRows + 1 - (k - start));
      const int32_t id = sorted_ids[k];
      const bool long_run = end - start > kPieceRows;
      // A long run's piece here ends at its true end or the chunk's (end above may stop early).
      const int64_t piece_end = long_run ? RunEnd(sorted_ids, n, k, c1 - k - 1) : end;
      if (long_run && id >= 0 && id < v) {
        for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
          partial[(2 * c) * d + j] = AddRows(0.0f, rows, k, piece_end, dout, d, j);
        }
      }
      // A short run was added whole by its head's block (end is its true end then).
      k = piece_end;
    }
    while (k < c1) {  // heads of runs
      const int32_t id = sorted_ids[k];
      const int64_t end = RunEnd(sorted_ids, n, k, kPieceRows);
      const bool long_run = end - k > kPieceRows;
      if (id >= 0 && id < v) {
        if (!long_run) {
          float* dst = dtable + id * d;
          for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            dst[j] = AddRows(dst[j], rows, k, end, dout, d, j);
          }
        } else {
          for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
            partial[(2 * c + 1) * d + j] = AddRows(0.0f, rows, k, c1, dout, d, j);
          }
        }
      }
      k = long_run ? c1 : end;
    }
  }
}

// Stage 2: the block at the head h of each long run adds the run's pieces into dtable in
// chunk order: dtable[id] + piece(h's chunk, slot 2c + 1) + piece(next chunk, slot 2c) + ...
// A fixed order: deterministic.
__global__ void AddPiecesKernel(const int32_t* sorted_ids, int64_t n, const float* partial,
                                float* dtable, int64_t d, int64_t v) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const int32_t id = sorted_ids[k];
    if (id < 0 || id >= v) continue;
    if (k > 0 && sorted_ids[k - 1] == id) continue;  // not the head of its run
    if (RunEnd(sorted_ids, n, k, kPieceRows) - k <= kPieceRows) continue;  // short: stage 1
    const int64_t end = RunEnd(sorted_ids, n, k, n);
    const int64_t first = k / kPieceRows, last = (end - 1) / kPieceRows;
    float* dst = dtable + id * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = __fadd_rn(dst[j], partial[(2 * first + 1) * d + j]);
      for (int64_t c = first + 1; c <= last; ++c) acc = __fadd_rn(acc, partial[(2 * c) * d + j]);
      dst[j] = acc;
    }
  }
}

// x (nb, s, d)[b, t, j] += wpe[offset + t, j].
__global__ void AddPositionKernel(float* x, const float* wpe, int64_t total, int64_t s, int64_t d,
                                  int64_t offset) {
  SY_GRID_STRIDE(e, total) {
    const int64_t j = e % d, t = (e / d) % s;
    x[e] = __fadd_rn(x[e], wpe[(offset + t) * d + j]);
  }
}

// dwpe[offset + t, j] += dx (nb, s, d)[b, t, j] for b = 0, 1, ... in order.
__global__ void PositionBackwardKernel(const float* dx, float* dwpe, int64_t nb, int64_t s,
                                       int64_t d, int64_t offset) {
  SY_GRID_STRIDE(e, s * d) {
    const int64_t t = e / d, j = e % d;
    float acc = dwpe[(offset + t) * d + j];
    for (int64_t b = 0; b < nb; ++b) acc = __fadd_rn(acc, dx[(b * s + t) * d + j]);
    dwpe[(offset + t) * d + j] = acc;
  }
}

int RowThreads(int64_t d) {
  const int64_t t = (d + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

// A device word for ValidateIdsKernel, set to kNoBadId on the stream.
Tensor NewBadIdWord(DeviceContext* ctx) {
  Tensor word = Tensor::Empty({1}, DType::kI64, ctx->device());
  SY_CUDA_CHECK(cudaMemsetAsync(word.raw_data(), 0xff, sizeof(unsigned long long), StreamOf(ctx)));
  return word;
}

void LaunchValidate(const Tensor& ids, int64_t v, Tensor& word, DeviceContext* ctx) {
  const int64_t n = ids.numel();
  ValidateIdsKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(
      ids.data<int32_t>(), n, v, static_cast<unsigned long long*>(word.raw_data()));
  SY_CUDA_CHECK_LAUNCH();
}

// Reads the word back (synchronising the stream) and fails naming the first bad id.
void CheckBadIdWord(const Tensor& word, const Tensor& ids, int64_t v, const char* op,
                    DeviceContext* ctx) {
  unsigned long long first = kNoBadId;
  SY_CUDA_CHECK(cudaMemcpyAsync(&first, word.raw_data(), sizeof(first), cudaMemcpyDeviceToHost,
                                StreamOf(ctx)));
  SY_CUDA_CHECK(cudaStreamSynchronize(StreamOf(ctx)));
  if (first == kNoBadId) return;
  int32_t id = 0;
  SY_CUDA_CHECK(cudaMemcpyAsync(&id, ids.data<int32_t>() + first, sizeof(id),
                                cudaMemcpyDeviceToHost, StreamOf(ctx)));
  SY_CUDA_CHECK(cudaStreamSynchronize(StreamOf(ctx)));
  SY_LOG(FATAL) << op << ": id " << id << " at " << first << " is outside the table of " << v
                << " rows";
}

}  // namespace

void EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor& out, bool check_ids,
                      DeviceContext* ctx) {
  const int64_t n = ids.numel(), v = table.dim(0), d = table.dim(1);
  if (n == 0) return;
  Tensor word;
  if (check_ids) {
    word = NewBadIdWord(ctx);
    LaunchValidate(ids, v, word, ctx);
  }
  if (d > 0) {
    GatherKernel<<<GridFor(n * d), 256, 0, StreamOf(ctx)>>>(
        ids.data<int32_t>(), table.data<float>(), out.data<float>(), n, d, v);
    SY_CUDA_CHECK_LAUNCH();
  }
  if (check_ids) CheckBadIdWord(word, ids, v, "EmbeddingForward", ctx);
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor& dtable, bool check_ids,
                       DeviceContext* ctx) {
  const int64_t n = ids.numel(), v = dtable.dim(0), d = dtable.dim(1);
  if (n == 0) return;
  SY_CHECK(n <= INT32_MAX) << "EmbeddingBackward: " << n << " ids; the CUDA sort takes < 2^31";
  Tensor word;
  if (check_ids) {
    word = NewBadIdWord(ctx);
    LaunchValidate(ids, v, word, ctx);
  }
  if (d > 0) {
    const Device dev = ctx->device();
    // (3, n) i32: sorted ids, positions 0..n-1, the positions in sorted order.
    Tensor keys = Tensor::Empty({3, n}, DType::kI32, dev);
    int32_t* sorted_ids = keys.data<int32_t>();
    int32_t* positions = sorted_ids + n;
    int32_t* sorted_positions = positions + n;
    size_t temp_bytes = 0;
    SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(nullptr, temp_bytes, ids.data<int32_t>(),
                                                  sorted_ids, positions, sorted_positions, n, 0, 32,
                                                  StreamOf(ctx)));
    Tensor temp = Tensor::Empty({static_cast<int64_t>(temp_bytes) + 1}, DType::kU8, dev);
    IotaKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(positions, n);
    SY_CUDA_CHECK_LAUNCH();
    SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, ids.data<int32_t>(),
                                                  sorted_ids, positions, sorted_positions, n, 0, 32,
                                                  StreamOf(ctx)));
    const int64_t chunks = (n + kPieceRows - 1) / kPieceRows;
    Tensor partial = Tensor::Empty({2 * chunks, d}, DType::kF32, dev);
    const unsigned chunk_blocks = static_cast<unsigned>(chunks < 65535 * 16 ? chunks : 65535 * 16);
    ScatterAddPiecesKernel<<<chunk_blocks, RowThreads(d), 0, StreamOf(ctx)>>>(
        sorted_ids, sorted_positions, n, dout.data<float>(), dtable.data<float>(),
        partial.data<float>(), d, v);
    SY_CUDA_CHECK_LAUNCH();
    const unsigned blocks = static_cast<unsigned>(n < 65535 * 16 ? n : 65535 * 16);
    AddPiecesKernel<<<blocks, RowThreads(d), 0, StreamOf(ctx)>>>(
        sorted_ids, n, partial.data<float>(), dtable.data<float>(), d, v);
    SY_CUDA_CHECK_LAUNCH();
  }
  if (check_ids) CheckBadIdWord(word, ids, v, "EmbeddingBackward", ctx);
}

void AddPositionEmbedding(Tensor& x, const Tensor& wpe, int64_t position_offset,
                          DeviceContext* ctx) {
  const int64_t total = x.numel(), s = x.dim(1), d = x.dim(2);
  if (total == 0) return;
  AddPositionKernel<<<GridFor(total), 256, 0, StreamOf(ctx)>>>(x.data<float>(), wpe.data<float>(),
                                                               total, s, d, position_offset);
  SY_CUDA_CHECK_LAUNCH();
}

void PositionEmbeddingBackward(const Tensor& dx, Tensor& dwpe, int64_t position_offset,
                               DeviceContext* ctx) {
  const int64_t nb = dx.dim(0), s = dx.dim(1), d = dx.dim(2);
  if (s * d == 0) return;
  PositionBackwardKernel<<<GridFor(s * d), 256, 0, StreamOf(ctx)>>>(
      dx.data<float>(), dwpe.data<float>(), nb, s, d, position_offset);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
