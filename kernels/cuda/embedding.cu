// CUDA implementation of kernels/embedding.h: the launches, the sort and the id readback; the
// device code is in kernels/cuda/embedding_kernels.cuh.
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
#include <cstdint>

#include <cub/device/device_radix_sort.cuh>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/embedding_kernels.cuh"
#include "kernels/embedding.h"

namespace switchyard::kernels::cuda {
namespace {

namespace emb = embedding;

// Blocks of emb::kThreads for the grid-stride kernels over n elements.
unsigned Blocks(int64_t n) { return GridFor(n, emb::kThreads); }

// A device word for ValidateIdsKernel, set to emb::kNoBadId on the stream.
Tensor NewBadIdWord(DeviceContext* ctx) {
  Tensor word = Tensor::Empty({1}, DType::kI64, ctx->device());
  SY_CUDA_CHECK(cudaMemsetAsync(word.raw_data(), 0xff, sizeof(unsigned long long), StreamOf(ctx)));
  return word;
}

void LaunchValidate(const Tensor& ids, int64_t v, Tensor& word, DeviceContext* ctx) {
  const int64_t n = ids.numel();
  emb::ValidateIdsKernel<<<Blocks(n), emb::kThreads, 0, StreamOf(ctx)>>>(
      ids.data<int32_t>(), n, v, static_cast<unsigned long long*>(word.raw_data()));
  SY_CUDA_CHECK_LAUNCH();
}

// Reads the word back (synchronising the stream) and fails naming the first bad id.
void CheckBadIdWord(const Tensor& word, const Tensor& ids, int64_t v, const char* op,
                    DeviceContext* ctx) {
  SY_CHECK(ctx == nullptr || !ctx->capturing())
      << op << ": the id check reads its word back, which a captured step cannot";
  unsigned long long first = emb::kNoBadId;
  SY_CUDA_CHECK(cudaMemcpyAsync(&first, word.raw_data(), sizeof(first), cudaMemcpyDeviceToHost,
                                StreamOf(ctx)));
  SY_CUDA_CHECK(cudaStreamSynchronize(StreamOf(ctx)));
  if (first == emb::kNoBadId) return;
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
    emb::GatherKernel<<<Blocks(n * d), emb::kThreads, 0, StreamOf(ctx)>>>(
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
    emb::IotaKernel<<<Blocks(n), emb::kThreads, 0, StreamOf(ctx)>>>(positions, n);
    SY_CUDA_CHECK_LAUNCH();
    SY_CUDA_CHECK(cub::DeviceRadixSort::SortPairs(temp.raw_data(), temp_bytes, ids.data<int32_t>(),
                                                  sorted_ids, positions, sorted_positions, n, 0, 32,
                                                  StreamOf(ctx)));
    const emb::BackwardLaunch launch = emb::BackwardShape(n, d);
    Tensor partial = Tensor::Empty({2 * launch.chunks, d}, DType::kF32, dev);
    emb::ScatterAddPiecesKernel<<<launch.chunk_blocks, launch.threads, 0, StreamOf(ctx)>>>(
        sorted_ids, sorted_positions, n, dout.data<float>(), dtable.data<float>(),
        partial.data<float>(), d, v);
    SY_CUDA_CHECK_LAUNCH();
    emb::AddPiecesKernel<<<launch.blocks, launch.threads, 0, StreamOf(ctx)>>>(
        sorted_ids, n, partial.data<float>(), dtable.data<float>(), d, v);
    SY_CUDA_CHECK_LAUNCH();
  }
  if (check_ids) CheckBadIdWord(word, ids, v, "EmbeddingBackward", ctx);
}

void AddPositionEmbedding(Tensor& x, const Tensor& wpe, int64_t position_offset,
                          DeviceContext* ctx) {
  const int64_t total = x.numel(), s = x.dim(1), d = x.dim(2);
  if (total == 0) return;
  emb::AddPositionKernel<<<Blocks(total), emb::kThreads, 0, StreamOf(ctx)>>>(
      x.data<float>(), wpe.data<float>(), total, s, d, position_offset);
  SY_CUDA_CHECK_LAUNCH();
}

void PositionEmbeddingBackward(const Tensor& dx, Tensor& dwpe, int64_t position_offset,
                               DeviceContext* ctx) {
  const int64_t nb = dx.dim(0), s = dx.dim(1), d = dx.dim(2);
  if (s * d == 0) return;
  emb::PositionBackwardKernel<<<Blocks(s * d), emb::kThreads, 0, StreamOf(ctx)>>>(
      dx.data<float>(), dwpe.data<float>(), nb, s, d, position_offset);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
