// CUDA implementation of kernels/embedding.h.
//
// Ids: ValidateIdsKernel records the smallest position holding an id outside [0, V) in a
// device word (atomicMin, so the first bad position whatever the schedule); the kernels
// skip such ids, and the op then copies that word to the host (8 bytes, one stream
// synchronisation per lookup) and fails naming the id, as the CPU does.
//
// Backward, deterministic and bit-identical to the CPU: the (id, position) pairs are sorted
// by id with cub's stable radix sort, so each id's positions stay in increasing order; one
// block per run of equal ids then adds that id's dout rows into dtable in that order, each
// thread owning columns — the same f32 additions in the same order as the CPU loop. (A
// very frequent id serialises its run in one block: correct, but the slow case.)
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

// sorted_ids / rows (n): ids in increasing order, each with its dout row (in increasing
// order within an id). The block at the head of each run of one valid id adds the run's
// rows into dtable (v, d), column by column, in order.
__global__ void ScatterAddRunsKernel(const int32_t* sorted_ids, const int32_t* rows, int64_t n,
                                     const float* dout, float* dtable, int64_t d, int64_t v) {
  for (int64_t k = blockIdx.x; k < n; k += gridDim.x) {
    const int32_t id = sorted_ids[k];
    if (id < 0 || id >= v) continue;
    if (k > 0 && sorted_ids[k - 1] == id) continue;  // not the head of its run
    int64_t end = k + 1;
    while (end < n && sorted_ids[end] == id) ++end;
    float* dst = dtable + id * d;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      float acc = dst[j];
      for (int64_t q = k; q < end; ++q) acc = __fadd_rn(acc, dout[rows[q] * d + j]);
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

void EmbeddingForward(const Tensor& ids, const Tensor& table, Tensor& out, DeviceContext* ctx) {
  const int64_t n = ids.numel(), v = table.dim(0), d = table.dim(1);
  if (n == 0) return;
  Tensor word = NewBadIdWord(ctx);
  LaunchValidate(ids, v, word, ctx);
  if (d > 0) {
    GatherKernel<<<GridFor(n * d), 256, 0, StreamOf(ctx)>>>(
        ids.data<int32_t>(), table.data<float>(), out.data<float>(), n, d, v);
    SY_CUDA_CHECK_LAUNCH();
  }
  CheckBadIdWord(word, ids, v, "EmbeddingForward", ctx);
}

void EmbeddingBackward(const Tensor& ids, const Tensor& dout, Tensor& dtable, DeviceContext* ctx) {
  const int64_t n = ids.numel(), v = dtable.dim(0), d = dtable.dim(1);
  if (n == 0) return;
  SY_CHECK(n <= INT32_MAX) << "EmbeddingBackward: " << n << " ids; the CUDA sort takes < 2^31";
  Tensor word = NewBadIdWord(ctx);
  LaunchValidate(ids, v, word, ctx);
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
    const unsigned blocks = static_cast<unsigned>(n < 65535 * 16 ? n : 65535 * 16);
    ScatterAddRunsKernel<<<blocks, RowThreads(d), 0, StreamOf(ctx)>>>(
        sorted_ids, sorted_positions, n, dout.data<float>(), dtable.data<float>(), d, v);
    SY_CUDA_CHECK_LAUNCH();
  }
  CheckBadIdWord(word, ids, v, "EmbeddingBackward", ctx);
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
