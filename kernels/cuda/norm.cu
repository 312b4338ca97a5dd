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
//
// The device code and the launch shapes are in kernels/cuda/norm_kernels.cuh.

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/norm_kernels.cuh"
#include "kernels/norm.h"

namespace switchyard::kernels::cuda {
namespace {

using norm_dev::ColumnShape;
using norm_dev::kColTile;
using norm_dev::kFinishThreads;
using norm_dev::kRowLanes;
using norm_dev::RowShape;

// dweight (and dbias when defined) += column sums of the norm's terms over the n rows.
void AccumulateColumns(const Tensor& x, const Tensor& dy, const float* mean, const float* rstd,
                       int64_t n, int64_t d, Tensor& dweight, Tensor* dbias, DeviceContext* ctx) {
  const ColumnShape shape = norm_dev::ColumnShapeOf(n, d);
  const int64_t chunks = shape.chunks;
  const int64_t parts = dbias ? 2 : 1;
  Tensor scratch = Tensor::Empty({parts * chunks * d * static_cast<int64_t>(sizeof(double))},
                                 DType::kU8, ctx->device());
  double* partial_w = static_cast<double*>(scratch.raw_data());  // (chunks, d)
  double* partial_b = dbias ? partial_w + chunks * d : nullptr;   // (chunks, d)
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(shape.tiles, static_cast<unsigned>(chunks));
  norm_dev::ColumnPartialKernel<<<grid, block, 0, StreamOf(ctx)>>>(
      x.data<float>(), dy.data<float>(), mean, rstd, n, d, shape.chunk_rows, partial_w,
      partial_b);
  SY_CUDA_CHECK_LAUNCH();
  norm_dev::ColumnFinishKernel<<<shape.finish_blocks, kFinishThreads, 0, StreamOf(ctx)>>>(
      partial_w, chunks, d, dweight.data<float>());
  SY_CUDA_CHECK_LAUNCH();
  if (dbias) {
    norm_dev::ColumnFinishKernel<<<shape.finish_blocks, kFinishThreads, 0, StreamOf(ctx)>>>(
        partial_b, chunks, d, dbias->data<float>());
    SY_CUDA_CHECK_LAUNCH();
  }
}

}  // namespace

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& y, Tensor& mean, Tensor& rstd, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  const RowShape rows = norm_dev::RowShapeOf(n, d);
  WithF32OrBf16(y, [&](auto* yp) {
    norm_dev::LayerNormForwardKernel<<<rows.blocks, rows.threads, 0, StreamOf(ctx)>>>(
        x.data<float>(), weight.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
        eps, yp, mean.data<float>(), rstd.data<float>(), n, d);
  });
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
  const RowShape rows = norm_dev::RowShapeOf(n, d);
  norm_dev::LayerNormDxKernel<<<rows.blocks, rows.threads, 0, StreamOf(ctx)>>>(
      x.data<float>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(),
      dy.data<float>(), dx.data<float>(), n, d, write == DxWrite::kAdd);
  SY_CUDA_CHECK_LAUNCH();
}

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd,
                    DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  const RowShape rows = norm_dev::RowShapeOf(n, d);
  WithF32OrBf16(y, [&](auto* yp) {
    norm_dev::RmsNormForwardKernel<<<rows.blocks, rows.threads, 0, StreamOf(ctx)>>>(
        x.data<float>(), weight.data<float>(), eps, yp, rstd.data<float>(), n, d);
  });
  SY_CUDA_CHECK_LAUNCH();
}

void RmsNormBackward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                     Tensor& dx, Tensor& dweight, DxWrite write, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  // The column sums read dy: they run before dx (which may alias dy) is written.
  AccumulateColumns(x, dy, nullptr, rstd.data<float>(), n, d, dweight, nullptr, ctx);
  const RowShape rows = norm_dev::RowShapeOf(n, d);
  norm_dev::RmsNormDxKernel<<<rows.blocks, rows.threads, 0, StreamOf(ctx)>>>(
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
  const RowShape rows = norm_dev::RowShapeOf(n, d);
  WithF32OrBf16(y, [&](auto* yp) {
    norm_dev::LayerNormForwardKernel<<<rows.blocks, rows.threads, 0, StreamOf(ctx)>>>(
        x.data<float>(), weight.data<float>(), bias.defined() ? bias.data<float>() : nullptr,
        eps, yp, mean.data<float>(), rstd.data<float>(), n, d, r.data<float>(),
        sum.data<float>());
  });
  SY_CUDA_CHECK_LAUNCH();
}

void AddRmsNormForward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                       Tensor& sum, Tensor& y, Tensor& rstd, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  const RowShape rows = norm_dev::RowShapeOf(n, d);
  WithF32OrBf16(y, [&](auto* yp) {
    norm_dev::RmsNormForwardKernel<<<rows.blocks, rows.threads, 0, StreamOf(ctx)>>>(
        x.data<float>(), weight.data<float>(), eps, yp, rstd.data<float>(), n, d,
        r.data<float>(), sum.data<float>());
  });
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
