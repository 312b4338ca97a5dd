// CUDA implementation of kernels/norm.h.
//
// Forward and dx: one block per row (grid-stride over rows), row statistics reduced in
// double as on the CPU; the elementwise parts use the CPU's f32 expressions with explicit
// round-to-nearest intrinsics (no FMA contraction), so they differ from the CPU only
// through the reduction order of the statistics. Each row is fully read by the reductions
// (which end in a barrier) before any thread writes, and every element is then written by
// the thread that reads it: y may alias x, dx may alias dy.
//
// The residual add + norm (AddLayerNormForward, AddRmsNormForward) is the same forward kernel
// reading x + r, which each thread writes to sum (__fadd_rn, as kernels::Add) for its columns
// before it reads them back: one launch and one pass less than Add then the norm.
//
// dweight / dbias: deterministic column sums, no atomics. ColumnPartialKernel gives each
// chunk of kChunkRows rows its per-column sum (in double, fixed order) in a scratch buffer
// (chunks, d); ColumnFinishKernel adds the chunks in order and accumulates into dweight.
#include <algorithm>

#include "kernels/cuda/common.cuh"
#include "kernels/norm.h"

namespace switchyard::kernels::cuda {
namespace {

constexpr int kColTile = 32;  // columns per block of the partial column sums (one warp)
constexpr int kRowLanes = 8;  // rows summed side by side per block
constexpr int64_t kChunkRows = 256;
constexpr int64_t kMaxGridY = 65535;

// Threads for one block per row of width d: a warp for narrow rows, up to 256.
int RowThreads(int64_t d) {
  const int64_t t = (d + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 256 ? 256 : t));
}

unsigned RowBlocks(int64_t n) { return static_cast<unsigned>(n < 65535 * 16 ? n : 65535 * 16); }

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
// x + res, written to sum (kernels::AddLayerNormForward).
__global__ void LayerNormForwardKernel(const float* x, const float* w, const float* b, float eps,
                                       float* y, float* mean, float* rstd, int64_t n, int64_t d,
                                       const float* res = nullptr, float* sum_out = nullptr) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = ResidualRow(x, res, sum_out, r, d);
    float* yr = y + r * d;
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
      yr[j] = b ? __fadd_rn(v, b[j]) : v;
    }
    if (threadIdx.x == 0) {
      mean[r] = m;
      rstd[r] = s;
    }
  }
}

// dx = rstd * (g - mean(g) - xhat * mean(g * xhat)) per row.
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

__global__ void RmsNormForwardKernel(const float* x, const float* w, float eps, float* y,
                                     float* rstd, int64_t n, int64_t d,
                                     const float* res = nullptr, float* sum_out = nullptr) {
  __shared__ double shared[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* xr = ResidualRow(x, res, sum_out, r, d);
    float* yr = y + r * d;
    double ss = 0.0;
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      ss += static_cast<double>(xr[j]) * xr[j];
    }
    ss = BlockSum(ss, shared);
    const float s =
        static_cast<float>(1.0 / sqrt(ss / static_cast<double>(d) + static_cast<double>(eps)));
    for (int64_t j = threadIdx.x; j < d; j += blockDim.x) {
      yr[j] = __fmul_rn(__fmul_rn(xr[j], s), w[j]);
    }
    if (threadIdx.x == 0) rstd[r] = s;
  }
}

// dx = rstd * (g - x * rstd^2 * mean(g * x)) per row.
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

// Block (kColTile, kRowLanes) at (column tile, chunk): partial_w[chunk, j] = sum over the
// chunk's rows of the dweight term, partial_b likewise for dy (LayerNorm with a bias only).
// The terms are the CPU's f32 expressions; the sums are double, in a fixed order.
// mean null: RmsNorm (term dy * x * rstd), else LayerNorm (term dy * xhat).
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

// out[j] += sum over chunks c (in order) of partial[c, j].
__global__ void ColumnFinishKernel(const double* partial, int64_t chunks, int64_t d, float* out) {
  SY_GRID_STRIDE(j, d) {
    double acc = 0.0;
    for (int64_t c = 0; c < chunks; ++c) acc += partial[c * d + j];
    out[j] = static_cast<float>(static_cast<double>(out[j]) + acc);
  }
}

// dweight (and dbias when defined) += column sums of the norm's terms over the n rows.
void AccumulateColumns(const Tensor& x, const Tensor& dy, const float* mean, const float* rstd,
                       int64_t n, int64_t d, Tensor& dweight, Tensor* dbias, DeviceContext* ctx) {
  const int64_t chunk_rows = std::max(kChunkRows, (n + kMaxGridY - 1) / kMaxGridY);
  const int64_t chunks = (n + chunk_rows - 1) / chunk_rows;
  const int64_t parts = dbias ? 2 : 1;
  Tensor scratch = Tensor::Empty({parts * chunks * d * static_cast<int64_t>(sizeof(double))},
                                 DType::kU8, ctx->device());
  double* partial_w = static_cast<double*>(scratch.raw_data());
  double* partial_b = dbias ? partial_w + chunks * d : nullptr;
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(static_cast<unsigned>((d + kColTile - 1) / kColTile),
                  static_cast<unsigned>(chunks));
  ColumnPartialKernel<<<grid, block, 0, StreamOf(ctx)>>>(
      x.data<float>(), dy.data<float>(), mean, rstd, n, d, chunk_rows, partial_w, partial_b);
  SY_CUDA_CHECK_LAUNCH();
  ColumnFinishKernel<<<GridFor(d), 256, 0, StreamOf(ctx)>>>(partial_w, chunks, d,
                                                            dweight.data<float>());
  SY_CUDA_CHECK_LAUNCH();
  if (dbias) {
    ColumnFinishKernel<<<GridFor(d), 256, 0, StreamOf(ctx)>>>(partial_b, chunks, d,
                                                              dbias->data<float>());
    SY_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& y, Tensor& mean, Tensor& rstd, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  LayerNormForwardKernel<<<RowBlocks(n), RowThreads(d), 0, StreamOf(ctx)>>>(
      x.data<float>(), weight.data<float>(), bias.defined() ? bias.data<float>() : nullptr, eps,
      y.data<float>(), mean.data<float>(), rstd.data<float>(), n, d);
  SY_CUDA_CHECK_LAUNCH();
}

void LayerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight,
                       Tensor& dbias, DxWrite write, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  // The column sums read dy: they run before dx (which may alias dy) is written.
  AccumulateColumns(x, dy, mean.data<float>(), rstd.data<float>(), n, d, dweight,
                    dbias.defined() ? &dbias : nullptr, ctx);
  LayerNormDxKernel<<<RowBlocks(n), RowThreads(d), 0, StreamOf(ctx)>>>(
      x.data<float>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(),
      dy.data<float>(), dx.data<float>(), n, d, write == DxWrite::kAdd);
  SY_CUDA_CHECK_LAUNCH();
}

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd,
                    DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  RmsNormForwardKernel<<<RowBlocks(n), RowThreads(d), 0, StreamOf(ctx)>>>(
      x.data<float>(), weight.data<float>(), eps, y.data<float>(), rstd.data<float>(), n, d);
  SY_CUDA_CHECK_LAUNCH();
}

void RmsNormBackward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                     Tensor& dx, Tensor& dweight, DxWrite write, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  // The column sums read dy: they run before dx (which may alias dy) is written.
  AccumulateColumns(x, dy, nullptr, rstd.data<float>(), n, d, dweight, nullptr, ctx);
  RmsNormDxKernel<<<RowBlocks(n), RowThreads(d), 0, StreamOf(ctx)>>>(
      x.data<float>(), weight.data<float>(), rstd.data<float>(), dy.data<float>(), dx.data<float>(),
      n, d, write == DxWrite::kAdd);
  SY_CUDA_CHECK_LAUNCH();
}

void AddLayerNormForward(const Tensor& x, const Tensor& r, const Tensor& weight,
                         const Tensor& bias, float eps, Tensor& sum, Tensor& y, Tensor& mean,
                         Tensor& rstd, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  LayerNormForwardKernel<<<RowBlocks(n), RowThreads(d), 0, StreamOf(ctx)>>>(
      x.data<float>(), weight.data<float>(), bias.defined() ? bias.data<float>() : nullptr, eps,
      y.data<float>(), mean.data<float>(), rstd.data<float>(), n, d, r.data<float>(),
      sum.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void AddRmsNormForward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                       Tensor& sum, Tensor& y, Tensor& rstd, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  RmsNormForwardKernel<<<RowBlocks(n), RowThreads(d), 0, StreamOf(ctx)>>>(
      x.data<float>(), weight.data<float>(), eps, y.data<float>(), rstd.data<float>(), n, d,
      r.data<float>(), sum.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
