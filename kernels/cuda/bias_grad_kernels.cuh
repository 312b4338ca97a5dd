// The device code of the bias gradient (kernels/cuda/bias.cu, which launches it and describes
// the two stages): where the chunks are, stage 1 (chunk column sums, with a fused
// activation's gradient computed and written as it sums) and stage 2 (each group's chunks).
// Include after kernels/cuda/common.cuh and kernels/cuda/activation_math.cuh.
#pragma once

#include <cstdint>
#include <initializer_list>

namespace switchyard::kernels::cuda::bias_grad {
// Internal linkage: the emulation test compiles these kernels too, and links with bias.cu's.
namespace {

constexpr int kTileCols = 32;  // columns per stage-1 block (one warp across)
constexpr int kRowLanes = 8;   // row lanes per stage-1 block
constexpr int kSumLanes = 32;  // chunk lanes per stage-2 block

// What stage 1 sums: dy itself, or the gradient of a fused activation, which it also writes
// (kGelu: dx = dy gelu'(a); kSwiglu: da and db of SwigluBackward, summing da). kCast sums dy
// itself and writes it rounded to bf16 into dx16 (the products' operand: BiasGradCast).
enum class Fused { kNone, kGelu, kSwiglu, kCast };

struct FusedArgs {
  const float* a = nullptr;  // the activation's input (kGelu, kSwiglu)
  const float* b = nullptr;  // swiglu's gate input
  float* dx = nullptr;       // dx (kGelu) or da (kSwiglu): may be dy's memory
  float* db = nullptr;       // kSwiglu's db
  // Or, under bf16 activation storage, the kept bf16 a and b (set instead of a and b).
  const __nv_bfloat16* a16 = nullptr;
  const __nv_bfloat16* b16 = nullptr;
  // Or the gradients written rounded to bf16 (set instead of dx and db: the products'
  // operands), summed as f32 all the same.
  __nv_bfloat16* dx16 = nullptr;
  __nv_bfloat16* db16 = nullptr;
};

// Writes a fused gradient's elements [i, i + N): f32, or rounded into the bf16 output when
// that is set.
template <int N>
__device__ __forceinline__ void WriteGrad(float* p, __nv_bfloat16* p16, int64_t i,
                                          const Vals<N>& v) {
  if (p16 != nullptr) {
    StoreVals<N>(p16 + i, v);
  } else {
    StoreVals<N>(p + i, v);
  }
}

// What stage 1 reads of elements [i, i + N) (N = 1, or 4 consecutive columns with 16-byte and
// 8-byte accesses), and the values it adds for them (fused: the gradient, which it also
// writes there).
template <int N>
struct Inputs {
  Vals<N> dy{}, a{}, b{};
};
template <Fused F, int N>
__device__ __forceinline__ Inputs<N> LoadAt(const float* dy, const FusedArgs& f, int64_t i) {
  Inputs<N> x;
  x.dy = LoadVals<N>(dy + i);
  if constexpr (F == Fused::kGelu || F == Fused::kSwiglu) {
    x.a = f.a16 != nullptr ? LoadVals<N>(f.a16 + i) : LoadVals<N>(f.a + i);
  }
  if constexpr (F == Fused::kSwiglu) {
    x.b = f.b16 != nullptr ? LoadVals<N>(f.b16 + i) : LoadVals<N>(f.b + i);
  }
  return x;
}
template <Fused F, int N>
__device__ __forceinline__ Vals<N> SummandsOf(const Inputs<N>& x, const FusedArgs& f,
                                              int64_t i) {
  if constexpr (F == Fused::kNone) {
    return x.dy;
  } else if constexpr (F == Fused::kCast) {
    StoreVals<N>(f.dx16 + i, x.dy);
    return x.dy;
  } else if constexpr (F == Fused::kGelu) {
    Vals<N> v;
#pragma unroll
    for (int e = 0; e < N; ++e) v.v[e] = GeluGrad(x.a.v[e], x.dy.v[e]);
    WriteGrad<N>(f.dx, f.dx16, i, v);
    return v;
  } else {
    Vals<N> da, db;
#pragma unroll
    for (int e = 0; e < N; ++e) SwigluGrad(x.a.v[e], x.b.v[e], x.dy.v[e], &da.v[e], &db.v[e]);
    WriteGrad<N>(f.dx, f.dx16, i, da);
    WriteGrad<N>(f.db, f.db16, i, db);
    return da;
  }
}

// True when stage 1 may take four columns a thread (N = 4): n a multiple of 4 and dy, the
// partial sums and every array of `fused` 16-byte aligned. Host code.
inline bool QuadsFit(int64_t n, const float* dy, const float* partial, const FusedArgs& f) {
  if (n % 4 != 0) return false;
  for (const void* p : {static_cast<const void*>(dy), static_cast<const void*>(partial),
                        static_cast<const void*>(f.a), static_cast<const void*>(f.b),
                        static_cast<const void*>(f.dx), static_cast<const void*>(f.db),
                        static_cast<const void*>(f.a16), static_cast<const void*>(f.b16),
                        static_cast<const void*>(f.dx16), static_cast<const void*>(f.db16)}) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}

// Where the chunks are. Host-listed: chunk c is rows [bounds[c], bounds[c + 1]), group g
// owns chunks [chunk_begin[g], chunk_begin[g + 1]). Device-sized (offsets non-null): group
// g's rows [offsets[g], offsets[g + 1]) in chunks of K, after the earlier groups' chunks.
// Neither: one group of `rows` rows, chunk c is rows [c K, min(rows, (c + 1) K)).
struct Chunks {
  const int64_t* bounds = nullptr;
  const int64_t* chunk_begin = nullptr;
  const int64_t* offsets = nullptr;
  int64_t groups = 1;
  int64_t rows_per_chunk = 0;
  int64_t rows = 0;
  int64_t count = 0;  // chunks (device-sized: the most there can be)
};

__device__ __forceinline__ int64_t ChunksOfRows(int64_t rows, int64_t k) {
  return (rows + k - 1) / k;
}

// Device-sized: group g's first chunk and its number of chunks.
__device__ __forceinline__ void GroupChunks(const Chunks& ch, int64_t g, int64_t* first,
                                            int64_t* count) {
  int64_t c = 0;
  for (int64_t h = 0; h < g; ++h) {
    c += ChunksOfRows(ch.offsets[h + 1] - ch.offsets[h], ch.rows_per_chunk);
  }
  *first = c;
  *count = ChunksOfRows(ch.offsets[g + 1] - ch.offsets[g], ch.rows_per_chunk);
}

// Rows [r0, r1) of chunk c; false for a device-sized slot past the last group's chunks.
__device__ __forceinline__ bool ChunkRows(const Chunks& ch, int64_t c, int64_t* r0,
                                          int64_t* r1) {
  const int64_t k = ch.rows_per_chunk;
  if (ch.bounds != nullptr) {
    *r0 = ch.bounds[c];
    *r1 = ch.bounds[c + 1];
    return true;
  }
  if (ch.offsets != nullptr) {
    int64_t first = 0;
    for (int64_t g = 0; g < ch.groups; ++g) {
      const int64_t begin = ch.offsets[g], end = ch.offsets[g + 1];
      const int64_t count = ChunksOfRows(end - begin, k);
      if (c < first + count) {
        *r0 = begin + (c - first) * k;
        *r1 = *r0 + k < end ? *r0 + k : end;
        return true;
      }
      first += count;
    }
    return false;
  }
  *r0 = c * k;
  *r1 = *r0 + k < ch.rows ? *r0 + k : ch.rows;
  return true;
}

// Stage 1: partial (chunks, n)[c, j] = sum of dy[r, j] (or its fused gradient) over the rows
// of chunk c. Block (kTileCols, kRowLanes); grid.x = column tiles of kTileCols N columns,
// thread tx columns [N tx, N tx + N) of its tile (QuadsFit for N = 4: each column's sums in
// the same order, so the same bits as N = 1); grid.y strides over chunks; every element is
// visited by exactly one thread.
template <Fused F, int N = 1>
__global__ void ChunkColumnSumKernel(const float* dy, int64_t n, Chunks ch, float* partial,
                                     FusedArgs fused) {
  __shared__ float lane_sums[kRowLanes][kTileCols * N];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = (blockIdx.x * static_cast<int64_t>(kTileCols) + tx) * N;
  // The loop bounds and the chunk's rows depend on blockIdx only, so every thread reaches
  // both barriers, or none.
  for (int64_t c = blockIdx.y; c < ch.count; c += gridDim.y) {
    int64_t r0, r1;
    if (!ChunkRows(ch, c, &r0, &r1)) continue;
    Vals<N> sum{};
    auto add = [&](const Vals<N>& t) {
#pragma unroll
      for (int e = 0; e < N; ++e) sum.v[e] = __fadd_rn(sum.v[e], t.v[e]);
    };
    if (j < n) {
      // Four rows' loads in flight at once: dx may be dy's (or a's) memory, so the compiler
      // may not move a later row's loads above an earlier row's store, but each element is
      // read and written by this thread alone, so loading first is safe. The additions keep
      // the row order (the same bits as one row at a time).
      int64_t r = r0 + ty;
      for (; r + 3 * kRowLanes < r1; r += 4 * kRowLanes) {
        Inputs<N> x[4];
#pragma unroll
        for (int u = 0; u < 4; ++u) x[u] = LoadAt<F, N>(dy, fused, (r + u * kRowLanes) * n + j);
#pragma unroll
        for (int u = 0; u < 4; ++u) add(SummandsOf<F, N>(x[u], fused, (r + u * kRowLanes) * n + j));
      }
      for (; r < r1; r += kRowLanes) {
        add(SummandsOf<F, N>(LoadAt<F, N>(dy, fused, r * n + j), fused, r * n + j));
      }
    }
#pragma unroll
    for (int e = 0; e < N; ++e) lane_sums[ty][N * tx + e] = sum.v[e];
    __syncthreads();
    if (ty == 0 && j < n) {
      Vals<N> total;
#pragma unroll
      for (int e = 0; e < N; ++e) {
        total.v[e] = lane_sums[0][N * tx + e];
        for (int k = 1; k < kRowLanes; ++k) {
          total.v[e] = __fadd_rn(total.v[e], lane_sums[k][N * tx + e]);
        }
      }
      StoreVals<N>(partial + c * n + j, total);
    }
    __syncthreads();  // lane_sums is rewritten by the next chunk
  }
}

// Stage 2: dbias (G, n)[g, j] = (beta == 0 ? 0 : beta * dbias[g, j]) + the sum of
// partial[c, j] over group g's chunks. Block (kTileCols, kSumLanes), grid (column tiles,
// groups): lane ty adds chunks c0 + ty, c0 + ty + kSumLanes, ... in order, then lane 0 adds
// the lane sums in lane order (a thread per column adding hundreds of partials one after
// another would wait on each of them in turn).
__global__ void GroupSumKernel(const float* partial, Chunks ch, int64_t n, float beta,
                               float* dbias) {
  __shared__ float lane_sums[kSumLanes][kTileCols];
  const int tx = threadIdx.x, ty = threadIdx.y;
  const int64_t j = blockIdx.x * static_cast<int64_t>(kTileCols) + tx;
  // The loop bounds depend on blockIdx only, so every thread reaches both barriers.
  for (int64_t g = blockIdx.y; g < ch.groups; g += gridDim.y) {
    int64_t c0 = 0, c1 = ch.count;
    if (ch.chunk_begin != nullptr) {
      c0 = ch.chunk_begin[g];
      c1 = ch.chunk_begin[g + 1];
    } else if (ch.offsets != nullptr) {
      int64_t count = 0;
      GroupChunks(ch, g, &c0, &count);
      c1 = c0 + count;
    }
    float sum = 0.0f;
    if (j < n) {
#pragma unroll 4
      for (int64_t c = c0 + ty; c < c1; c += kSumLanes) sum = __fadd_rn(sum, partial[c * n + j]);
    }
    lane_sums[ty][tx] = sum;
    __syncthreads();
    if (ty == 0 && j < n) {
      float total = lane_sums[0][tx];
      for (int k = 1; k < kSumLanes; ++k) total = __fadd_rn(total, lane_sums[k][tx]);
      const int64_t i = g * n + j;
      const float base = beta == 0.0f ? 0.0f : __fmul_rn(beta, dbias[i]);
      dbias[i] = __fadd_rn(base, total);
    }
    __syncthreads();  // lane_sums is rewritten for the next group
  }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::bias_grad
