// The device code of the norms (kernels/cuda/norm.cu, which launches it and describes the
// design): the LayerNorm and RmsNorm forward (optionally reading x + r, written to sum first),
// their dx (written or added into dx), and the two stages of the dweight / dbias column sums;
// with the launch shapes, shared by the .cu and by tests/kernels/norm_emulation_test.cc.
#pragma once

#include <algorithm>
#include <cstdint>

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

// The column sums over n > 0 rows of width d: ColumnPartialKernel on (kColTile, kRowLanes)
// blocks over (tiles, chunks) of chunk_rows rows (more than kChunkRows when the chunks would
// pass max_chunks), then ColumnFinishKernel on finish_blocks of kFinishThreads (GridFor(d)).
struct ColumnShape {
  int64_t chunk_rows = 0, chunks = 0;
  unsigned tiles = 0, finish_blocks = 0;
};
inline ColumnShape ColumnShapeOf(int64_t n, int64_t d, int64_t max_chunks = kMaxGridY,
                                 int64_t max_finish_blocks = kMaxGridBlocks) {
  ColumnShape s;
  s.chunk_rows = std::max(kChunkRows, (n + max_chunks - 1) / max_chunks);
  s.chunks = (n + s.chunk_rows - 1) / s.chunk_rows;
  s.tiles = static_cast<unsigned>((d + kColTile - 1) / kColTile);
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

// ---- dweight / dbias -----------------------------------------------------------------------

// Block (kColTile, kRowLanes) at (column tile, chunk): partial_w[chunk, j] = sum over the
// chunk's rows of the dweight term, partial_b likewise for dy (LayerNorm with a bias only).
// Sums in double, in a fixed order: lane k of the chunk's rows k, k + kRowLanes, ..., then the
// lanes in order. mean null: RmsNorm, term dy * x * rstd (the CPU's f32 expression); else
// LayerNorm, term dy * xhat rounded to f32 (the CPU multiplies in double).
__global__ void ColumnPartialKernel(const float* x, const float* dy, const float* mean,
                                    const float* rstd, int64_t n, int64_t d, int64_t chunk_rows,
                                    double* partial_w, double* partial_b) {
  __shared__ double lanes_w[kRowLanes][kColTile];
  __shared__ double lanes_b[kRowLanes][kColTile];
  const int64_t j = static_cast<int64_t>(blockIdx.x) * kColTile + threadIdx.x;
  const int64_t chunk = blockIdx.y;
  const int64_t r_end = min(n, (chunk + 1) * chunk_rows);
  double acc_w = 0.0, acc_b = 0.0;
  if (j < d) {
    for (int64_t r = chunk * chunk_rows + threadIdx.y; r < r_end; r += kRowLanes) {
      const float g = dy[r * d + j];
      if (mean == nullptr) {
        acc_w += __fmul_rn(__fmul_rn(g, x[r * d + j]), rstd[r]);
      } else {
        acc_w += __fmul_rn(g, __fmul_rn(__fsub_rn(x[r * d + j], mean[r]), rstd[r]));
        acc_b += g;
      }
    }
  }
  lanes_w[threadIdx.y][threadIdx.x] = acc_w;
  lanes_b[threadIdx.y][threadIdx.x] = acc_b;
  __syncthreads();
  if (threadIdx.y == 0 && j < d) {
    for (int k = 1; k < kRowLanes; ++k) {
      acc_w += lanes_w[k][threadIdx.x];
      acc_b += lanes_b[k][threadIdx.x];
    }
    partial_w[chunk * d + j] = acc_w;
    if (partial_b != nullptr) partial_b[chunk * d + j] = acc_b;
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
