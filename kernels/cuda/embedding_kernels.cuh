// The device code of the embedding ops (kernels/cuda/embedding.cu, which launches it and
// describes the design): the id check, the gather, the two-stage deterministic backward over
// the ids as the .cu sorts them (cub's stable radix sort), and the learned positions; with the
// backward's launch shapes, which the .cu and the emulation test
// (tests/kernels/embedding_emulation_test.cc) both take from here.
#pragma once

#include <climits>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda::embedding {
// Internal linkage: the emulation test compiles these kernels too, and links with embedding.cu's.
namespace {

constexpr unsigned long long kNoBadId = ULLONG_MAX;  // the id check's word: no bad id seen
constexpr int kThreads = 256;                        // block of the grid-stride kernels
constexpr int64_t kMaxBlocks = 65535 * 16;           // grid cap of the backward's stages

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

// The backward's launches for n ids and rows of d: partial is (2 chunks, d); stage 1 runs
// chunk_blocks blocks over the chunks and stage 2 `blocks` blocks over the sorted positions
// (grid-stride past max_blocks), both of `threads` threads striding over the d columns.
struct BackwardLaunch {
  int64_t chunks = 0;
  unsigned chunk_blocks = 0, blocks = 0;
  int threads = 0;
};

BackwardLaunch BackwardShape(int64_t n, int64_t d, int64_t max_blocks = kMaxBlocks) {
  BackwardLaunch l;
  l.chunks = (n + kPieceRows - 1) / kPieceRows;
  l.chunk_blocks = static_cast<unsigned>(l.chunks < max_blocks ? l.chunks : max_blocks);
  l.blocks = static_cast<unsigned>(n < max_blocks ? n : max_blocks);
  const int64_t t = (d + 31) / 32 * 32;  // a warp per 32 columns, 1 to 8 warps
  l.threads = static_cast<int>(t < 32 ? 32 : (t > 256 ? 256 : t));
  return l;
}

}  // namespace
}  // namespace switchyard::kernels::cuda::embedding
