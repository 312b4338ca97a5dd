// The device code of the norms (kernels/cuda/norm.cu, which launches it and describes the
// design): the LayerNorm and RmsNorm forward (optionally reading x + r, written to sum first),
// their dx (written or added into dx), and the two stages of the dweight / dbias column sums;
// with the launch shapes, shared by the .cu and by tests/kernels/norm_emulation_test.cc.
#pragma once

#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda::norm_dev {
// Internal linkage: the emulation test compiles these kernels too, and links with norm.cu's.
namespace {

constexpr int kColTile = 32;  // columns per block of the partial column sums (one warp)
constexpr int kRowLanes = 8;  // rows summed side by side per block
constexpr int64_t kChunkRows = 256;
constexpr int64_t kMaxGridY = 65535;
constexpr int kMaxRowThreads = 256;
constexpr int64_t kMaxRowBlocks = 65535 * 16;
constexpr int kFinishThreads = 256;
constexpr int kWarpRows = 4;     // rows (warps) per block of the warp-row kernels
constexpr int kMaxWarpVec = 16;  // their quads per lane: rows of up to 2048 columns

// ---- launch shapes (host) ------------------------------------------------------------------

// The row kernels (forward, dx): one block per row, grid-striding past max_blocks rows; a
// warp for narrow rows, up to kMaxRowThreads threads.
struct RowShape {
  unsigned blocks = 0, threads = 0;
};
inline RowShape RowShapeOf(int64_t n, int64_t d, int64_t max_blocks = kMaxRowBlocks) {
  const int64_t t = (d + 31) / 32 * 32;
  return {static_cast<unsigned>(std::min(n, max_blocks)),
          static_cast<unsigned>(std::clamp<int64_t>(t, 32, kMaxRowThreads))};
}

// The warp-row kernels (below): whether they take rows of width d with these operands (16-byte
// aligned; null ones ignored), their quads per lane (the fewest of 1, 2, 4, 8, 16 that cover
// d), and their grid (kWarpRows rows a block, capped at max_blocks blocks).
inline bool UseWarpRows(int64_t d, std::initializer_list<const void*> operands) {
  if (d <= 0 || d % 4 != 0 || d > 128 * kMaxWarpVec) return false;
  for (const void* p : operands) {
    if (p != nullptr && reinterpret_cast<uintptr_t>(p) % 16 != 0) return false;
  }
  return true;
}
inline int WarpVecOf(int64_t d) {
  int vec = 1;
  while (128 * vec < d) vec *= 2;
  return vec;
}
inline RowShape WarpRowShapeOf(int64_t n, int64_t max_blocks = kMaxRowBlocks) {
  return {static_cast<unsigned>(std::min((n + kWarpRows - 1) / kWarpRows, max_blocks)),
          static_cast<unsigned>(32 * kWarpRows)};
}
// Calls fn(std::integral_constant<int, vec>) for the warp kernels' template argument.
template <typename F>
void WithWarpVec(int vec, F&& fn) {
  switch (vec) {
    case 1: return fn(std::integral_constant<int, 1>{});
    case 2: return fn(std::integral_constant<int, 2>{});
    case 4: return fn(std::integral_constant<int, 4>{});
    case 8: return fn(std::integral_constant<int, 8>{});
    default: return fn(std::integral_constant<int, 16>{});
  }
}

// The column sums over n > 0 rows of width d: ColumnPartialKernel<cols> on (kColTile,
// kRowLanes) blocks over (tiles of kColTile cols columns, chunks) of chunk_rows rows (more
// than kChunkRows when the chunks would pass max_chunks), then ColumnFinishKernel on
// finish_blocks of kFinishThreads (GridFor(d)). cols: 4 (a thread's 4 columns read with
// 16-byte loads) when ColumnQuadsFit, else 1.
struct ColumnShape {
  int64_t chunk_rows = 0, chunks = 0;
  unsigned tiles = 0, finish_blocks = 0;
  int cols = 1;
};
inline bool ColumnQuadsFit(int64_t d, const float* x, const float* dy) {
  return d % 4 == 0 && reinterpret_cast<uintptr_t>(x) % 16 == 0 &&
         reinterpret_cast<uintptr_t>(dy) % 16 == 0;
}
inline ColumnShape ColumnShapeOf(int64_t n, int64_t d, int64_t max_chunks = kMaxGridY,
                                 int64_t max_finish_blocks = kMaxGridBlocks, int cols = 1) {
  ColumnShape s;
  s.cols = cols;
  s.chunk_rows = std::max(kChunkRows, (n + max_chunks - 1) / max_chunks);
  s.chunks = (n + s.chunk_rows - 1) / s.chunk_rows;
  s.tiles = static_cast<unsigned>((d + kColTile * cols - 1) / (kColTile * cols));
  s.finish_blocks = static_cast<unsigned>(
      std::clamp<int64_t>((d + kFinishThreads - 1) / kFinishThreads, 1, max_finish_blocks));
  return s;
}

// ---- forward -------------------------------------------------------------------------------

// The row the norm reads: x's row, or (residual) x + res written to out first, element by
// element by the thread that later reads it back (so no barrier is needed in between).
__device__ __forceinline__ const float* ResidualRow(const float* x, const float* res, float* out,
                                                    int64_t r, int64_t d) {
  if (res == nullptr) return x + r * d;
  for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
    out[r * d + j] = __fadd_rn(x[r * d + j], res[r * d + j]);
  }
  return out + r * d;
}

// x, y (n, d); mean, rstd (n); bias may be null. res non-null: the row normalised is
// x + res, written to sum (kernels::AddLayerNormForward). y: f32, or bf16 (each value
// rounded as it is stored: the operand of the products that read it).
template <typename TY>
__global__ void LayerNormForwardKernel(const float* x, const float* w, const float* b, float eps,
                                       TY* y, float* mean, float* rstd, int64_t n, int64_t d,
                                       const float* res = nullptr, float* sum_out = nullptr) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = ResidualRow(x, res, sum_out, r, d);
    TY* yr = y + r * d;
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) sum += xr[j];
    const double mu = BlockSum(sum, shared) / static_cast<double>(d);
    double var = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const double c = xr[j] - mu;
      var += c * c;
    }
    var = BlockSum(var, shared) / static_cast<double>(d);
    const float m = static_cast<float>(mu);
    const float s = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float v = __fmul_rn(__fmul_rn(__fsub_rn(xr[j], m), s), w[j]);
      StoreAs(yr, j, b ? __fadd_rn(v, b[j]) : v);
    }
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = s;
    }
  }
}

// x, y (n, d); rstd (n). res non-null: the row normalised is x + res, written to sum
// (kernels::AddRmsNormForward). y: f32 or bf16, as LayerNormForwardKernel's.
template <typename TY>
__global__ void RmsNormForwardKernel(const float* x, const float* w, float eps, TY* y,
                                     float* rstd, int64_t n, int64_t d,
                                     const float* res = nullptr, float* sum_out = nullptr) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = ResidualRow(x, res, sum_out, r, d);
    TY* yr = y + r * d;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      ss += static_cast<double>(xr[j]) * xr[j];
    }
    ss = BlockSum(ss, shared);
    const float s =
        static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      StoreAs(yr, j, __fmul_rn(__fmul_rn(xr[j], s), w[j]));
    }
    if (threadIdx.x == 0) rstd[r] = s;
  }
}

// ---- dx ------------------------------------------------------------------------------------

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per row; x, dy, dx (n, d). add: dx += it.
__global__ void LayerNormDxKernel(const float* x, const float* w, const float* mean,
                                  const float* rstd, const float* dy, float* dx, int64_t n,
                                  int64_t d, bool add) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = x + r * d;
    const float* dyr = dy + r * d;
    float* dxr = dx + r * d;
    const float m = mean[r], s = rstd[r];
    double sum_g = 0.0, sum_gx = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float xhat = __fmul_rn(__fsub_rn(xr[j], m), s);
      const float g = __fmul_rn(dyr[j], w[j]);
      sum_g += g;
      sum_gx += static_cast<double>(g) * xhat;
    }
    sum_g = BlockSum(sum_g, shared);
    sum_gx = BlockSum(sum_gx, shared);
    const float mean_g = static_cast<float>(sum_g / static_cast<double>(d));
    const float mean_gx = static_cast<float>(sum_gx / static_cast<double>(d));
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float xhat = __fmul_rn(__fsub_rn(xr[j], m), s);
      const float g = __fmul_rn(dyr[j], w[j]);
      const float v = __fmul_rn(s, __fsub_rn(__fsub_rn(g, mean_g), __fmul_rn(xhat, mean_gx)));
      dxr[j] = add ? __fadd_rn(dxr[j], v) : v;
    }
  }
}

// dx = rstd * (g - x * rstd^2 * mean(g * x)) per row; x, dy, dx (n, d). add: dx += it.
__global__ void RmsNormDxKernel(const float* x, const float* w, const float* rstd, const float* dy,
                                float* dx, int64_t n, int64_t d, bool add) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = x + r * d;
    const float* dyr = dy + r * d;
    float* dxr = dx + r * d;
    const float s = rstd[r];
    double sum_gx = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      sum_gx += static_cast<double>(dyr[j]) * w[j] * xr[j];
    }
    sum_gx = BlockSum(sum_gx, shared);
    const float c = __fmul_rn(__fmul_rn(static_cast<float>(sum_gx / static_cast<double>(d)), s), s);
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      const float v = __fmul_rn(s, __fsub_rn(__fmul_rn(dyr[j], w[j]), __fmul_rn(xr[j], c)));
      dxr[j] = add ? __fadd_rn(dxr[j], v) : v;
    }
  }
}

// ---- forward and dx, one warp per row -----------------------------------------------------
// For rows of d <= 128 kMaxWarpVec columns, d a multiple of 4, every operand 16-byte aligned
// (UseWarpRows): each warp holds its row in registers, lane l the 4-column quads at columns
// 4 (l + 32 i), i < kVec, read and written with 16-byte accesses (8 bytes for a bf16 y); the
// statistics are the block kernels' double sums (each lane's columns in order, then the
// warp's butterfly) and the elementwise parts the same f32 expressions. One read of the row
// and one write, no block barrier; kWarpRows rows (warps) per block, grid-striding. The whole
// row is read before any of it is written, so y may alias x and dx may alias dy here too.
using Quad = Vals<4>;

// Lane threadIdx.x % 32's quads of a row; the ones at or past d are zeros, never stored.
template <int kVec>
struct RowQuads {
  Quad q[kVec];
  __device__ __forceinline__ static int64_t Column(int i) {
    return 4 * (static_cast<int64_t>(threadIdx.x % 32) + 32 * i);
  }
  __device__ __forceinline__ void Load(const float* row, int64_t d) {
#pragma unroll
    for (int i = 0; i < kVec; ++i) q[i] = Column(i) < d ? LoadVals<4>(row + Column(i)) : Quad{};
  }
  __device__ __forceinline__ void Store(float* row, int64_t d) const {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (Column(i) < d) StoreVals<4>(row + Column(i), q[i]);
    }
  }
  // f(i, e, value) over the lane's columns in order.
  template <typename F>
  __device__ __forceinline__ void ForEach(int64_t d, F&& f) const {
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      if (Column(i) >= d) break;
#pragma unroll
      for (int e = 0; e < 4; ++e) f(i, e, q[i].v[e]);
    }
  }
};

// The forward's row r: x's, or x + res, written to sum_out first.
template <int kVec>
__device__ __forceinline__ void LoadNormRow(RowQuads<kVec>& xr, const float* x, const float* res,
                                            float* sum_out, int64_t r, int64_t d) {
  xr.Load(x + r * d, d);
  if (res == nullptr) return;
  RowQuads<kVec> rr;
  rr.Load(res + r * d, d);
#pragma unroll
  for (int i = 0; i < kVec; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) xr.q[i].v[e] = __fadd_rn(xr.q[i].v[e], rr.q[i].v[e]);
  }
  xr.Store(sum_out + r * d, d);
}
// The first row of this warp; the warps stride by gridDim.x kWarpRows.
__device__ __forceinline__ int64_t FirstWarpRow() {
  return static_cast<int64_t>(blockIdx.x) * kWarpRows + threadIdx.x / 32;
}

template <int kVec, typename TY>
__global__ void __launch_bounds__(32 * kWarpRows)
    LayerNormForwardWarpKernel(const float* x, const float* w, const float* b, float eps, TY* y,
                               float* mean, float* rstd, int64_t n, int64_t d,
                               const float* res = nullptr, float* sum_out = nullptr) {
  for (int64_t r = FirstWarpRow(); r < n; r += static_cast<int64_t>(gridDim.x) * kWarpRows) {
    RowQuads<kVec> xr;
    LoadNormRow(xr, x, res, sum_out, r, d);
    double sum = 0.0;
    xr.ForEach(d, [&](int, int, float v) { sum += v; });
    const double mu = WarpSum(sum) / static_cast<double>(d);
    double var = 0.0;
    xr.ForEach(d, [&](int, int, float v) {
      const double c = v - mu;
      var += c * c;
    });
    var = WarpSum(var) / static_cast<double>(d);
    const float m = static_cast<float>(mu);
    const float s = static_cast<float>(1.0 / sqrt(var + static_cast<double>(eps)));
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int64_t c = RowQuads<kVec>::Column(i);
      if (c >= d) break;
      const Quad wq = LoadVals<4>(w + c), bq = b ? LoadVals<4>(b + c) : Quad{};
      Quad out;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float v = __fmul_rn(__fmul_rn(__fsub_rn(xr.q[i].v[e], m), s), wq.v[e]);
        out.v[e] = b ? __fadd_rn(v, bq.v[e]) : v;
      }
      StoreVals<4>(y + r * d + c, out);
    }
    if (threadIdx.x % 32 == 0) {
      mean[r] = m;
      rstd[r] = s;
    }
  }
}

template <int kVec, typename TY>
__global__ void __launch_bounds__(32 * kWarpRows)
    RmsNormForwardWarpKernel(const float* x, const float* w, float eps, TY* y, float* rstd,
                             int64_t n, int64_t d, const float* res = nullptr,
                             float* sum_out = nullptr) {
  for (int64_t r = FirstWarpRow(); r < n; r += static_cast<int64_t>(gridDim.x) * kWarpRows) {
    RowQuads<kVec> xr;
    LoadNormRow(xr, x, res, sum_out, r, d);
    double ss = 0.0;
    xr.ForEach(d, [&](int, int, float v) { ss += static_cast<double>(v) * v; });
    ss = WarpSum(ss);
    const float s =
        static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int64_t c = RowQuads<kVec>::Column(i);
      if (c >= d) break;
      const Quad wq = LoadVals<4>(w + c);
      Quad out;
#pragma unroll
      for (int e = 0; e < 4; ++e) out.v[e] = __fmul_rn(__fmul_rn(xr.q[i].v[e], s), wq.v[e]);
      StoreVals<4>(y + r * d + c, out);
    }
    if (threadIdx.x % 32 == 0) rstd[r] = s;
  }
}

// dx's write: v, or added to what dx holds (add).
__device__ __forceinline__ void WriteDx(float* p, Quad v, bool add) {
  if (add) {
    const Quad old = LoadVals<4>(p);
#pragma unroll
    for (int e = 0; e < 4; ++e) v.v[e] = __fadd_rn(old.v[e], v.v[e]);
  }
  StoreVals<4>(p, v);
}

template <int kVec>
__global__ void __launch_bounds__(32 * kWarpRows)
    LayerNormDxWarpKernel(const float* x, const float* w, const float* mean, const float* rstd,
                          const float* dy, float* dx, int64_t n, int64_t d, bool add) {
  for (int64_t r = FirstWarpRow(); r < n; r += static_cast<int64_t>(gridDim.x) * kWarpRows) {
    RowQuads<kVec> xr, gr;
    xr.Load(x + r * d, d);
    gr.Load(dy + r * d, d);
    const float m = mean[r], s = rstd[r];
    double sum_g = 0.0, sum_gx = 0.0;
    xr.ForEach(d, [&](int i, int e, float xv) {
      const float xhat = __fmul_rn(__fsub_rn(xv, m), s);
      const float g = __fmul_rn(gr.q[i].v[e], w[RowQuads<kVec>::Column(i) + e]);
      sum_g += g;
      sum_gx += static_cast<double>(g) * xhat;
    });
    const float mean_g = static_cast<float>(WarpSum(sum_g) / static_cast<double>(d));
    const float mean_gx = static_cast<float>(WarpSum(sum_gx) / static_cast<double>(d));
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int64_t c = RowQuads<kVec>::Column(i);
      if (c >= d) break;
      const Quad wq = LoadVals<4>(w + c);
      Quad v;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float xhat = __fmul_rn(__fsub_rn(xr.q[i].v[e], m), s);
        const float g = __fmul_rn(gr.q[i].v[e], wq.v[e]);
        v.v[e] = __fmul_rn(s, __fsub_rn(__fsub_rn(g, mean_g), __fmul_rn(xhat, mean_gx)));
      }
      WriteDx(dx + r * d + c, v, add);
    }
  }
}

template <int kVec>
__global__ void __launch_bounds__(32 * kWarpRows)
    RmsNormDxWarpKernel(const float* x, const float* w, const float* rstd, const float* dy,
                        float* dx, int64_t n, int64_t d, bool add) {
  for (int64_t r = FirstWarpRow(); r < n; r += static_cast<int64_t>(gridDim.x) * kWarpRows) {
    RowQuads<kVec> xr, gr;
    xr.Load(x + r * d, d);
    gr.Load(dy + r * d, d);
    const float s = rstd[r];
    double sum_gx = 0.0;
    xr.ForEach(d, [&](int i, int e, float xv) {
      sum_gx += static_cast<double>(gr.q[i].v[e]) * w[RowQuads<kVec>::Column(i) + e] * xv;
    });
    const float c = __fmul_rn(
        __fmul_rn(static_cast<float>(WarpSum(sum_gx) / static_cast<double>(d)), s), s);
#pragma unroll
    for (int i = 0; i < kVec; ++i) {
      const int64_t col = RowQuads<kVec>::Column(i);
      if (col >= d) break;
      const Quad wq = LoadVals<4>(w + col);
      Quad v;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        v.v[e] = __fmul_rn(s, __fsub_rn(__fmul_rn(gr.q[i].v[e], wq.v[e]),
                                        __fmul_rn(xr.q[i].v[e], c)));
      }
      WriteDx(dx + r * d + col, v, add);
    }
  }
}

// ---- dweight / dbias -----------------------------------------------------------------------

// Block (kColTile, kRowLanes) at (column tile, chunk): partial_w[chunk, j] = sum over the
// chunk's rows of the dweight term, partial_b likewise for dy (LayerNorm with a bias only).
// Sums in double, in a fixed order: lane k of the chunk's rows k, k + kRowLanes, ..., then the
// lanes in order. mean null: RmsNorm, term dy * x * rstd (the CPU's f32 expression); else
// LayerNorm, term dy * xhat rounded to f32 (the CPU multiplies in double).
// N columns a thread (N = 4: ColumnQuadsFit, 16-byte loads; each column's sums in the same
// order, so the same bits as N = 1).
template <int N = 1>
__global__ void ColumnPartialKernel(const float* x, const float* dy, const float* mean,
                                    const float* rstd, int64_t n, int64_t d, int64_t chunk_rows,
                                    double* partial_w, double* partial_b) {
  __shared__ double lanes_w[kRowLanes][kColTile * N];
  __shared__ double lanes_b[kRowLanes][kColTile * N];
  const int64_t j = (static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x) * N;
  const int64_t chunk = blockIdx.y;
  const int64_t r_end = min(n, (chunk + 1) * chunk_rows);
  double acc_w[N] = {}, acc_b[N] = {};
  if (j < d) {
    for (int64_t r = chunk * chunk_rows + threadIdx.y; r < r_end; r += kRowLanes) {
      const Vals<N> g = LoadVals<N>(dy + r * d + j), xv = LoadVals<N>(x + r * d + j);
#pragma unroll
      for (int e = 0; e < N; ++e) {
        if (mean == nullptr) {
          acc_w[e] += __fmul_rn(__fmul_rn(g.v[e], xv.v[e]), rstd[r]);
        } else {
          acc_w[e] += __fmul_rn(g.v[e], __fmul_rn(__fsub_rn(xv.v[e], mean[r]), rstd[r]));
          acc_b[e] += g.v[e];
        }
      }
    }
  }
#pragma unroll
  for (int e = 0; e < N; ++e) {
    lanes_w[threadIdx.y][N * threadIdx.x + e] = acc_w[e];
    lanes_b[threadIdx.y][N * threadIdx.x + e] = acc_b[e];
  }
  __syncthreads();
  if (threadIdx.y == 0 && j < d) {
#pragma unroll
    for (int e = 0; e < N; ++e) {
      for (int k = 1; k < kRowLanes; ++k) {
        acc_w[e] += lanes_w[k][N * threadIdx.x + e];
        acc_b[e] += lanes_b[k][N * threadIdx.x + e];
      }
      partial_w[chunk * d + j + e] = acc_w[e];
      if (partial_b != nullptr) partial_b[chunk * d + j + e] = acc_b[e];
    }
  }
}

// out[j] += sum over chunks c (in order) of partial[c, j]: partial (chunks, d), out (d).
__global__ void ColumnFinishKernel(const double* partial, int64_t chunks, int64_t d, float* out) {
  SY_GRID_STRIDE(j, d) {
    double acc = 0.0;
    for (int64_t c = 0; c < chunks; ++c) acc += partial[c * d + j];
    out[j] = static_cast<float>(static_cast<double>(out[j]) + acc);
  }
}

}  // namespace
}  // namespace switchyard::kernels::cuda::norm_dev
