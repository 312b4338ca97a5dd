// CUDA implementation of kernels/norm.h.
//
// Forward and dx: one warp per row with the row in registers (16-byte loads and stores) when
// the row fits (d <= 2048, a multiple of 4, aligned operands: norm_dev::UseWarpRows), else one
// block per row (grid-stride over rows); row statistics reduced in double as on the CPU; the
// elementwise parts use the CPU's f32 expressions with explicit round-to-nearest intrinsics
// (no FMA contraction), so they differ from the CPU only through the reduction order of the
// statistics. Each row is fully read by the reductions (which end in a barrier, or in the
// warp's registers) before any thread writes, and every element is then written by
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

#include <initializer_list>
#include <type_traits>

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
  const int cols = norm_dev::ColumnQuadsFit(d, x.data<float>(), dy.data<float>()) ? 4 : 1;
  const ColumnShape shape =
      norm_dev::ColumnShapeOf(n, d, norm_dev::kMaxGridY, kMaxGridBlocks, cols);
  const int64_t chunks = shape.chunks;
  const int64_t parts = dbias ? 2 : 1;
  Tensor scratch = Tensor::Empty({parts * chunks * d * static_cast<int64_t>(sizeof(double))},
                                 DType::kU8, ctx->device());
  double* partial_w = static_cast<double*>(scratch.raw_data());  // (chunks, d)
  double* partial_b = dbias ? partial_w + chunks * d : nullptr;   // (chunks, d)
  const dim3 block(kColTile, kRowLanes);
  const dim3 grid(shape.tiles, static_cast<unsigned>(chunks));
  if (cols == 4) {
    norm_dev::ColumnPartialKernel<4><<<grid, block, 0, StreamOf(ctx)>>>(
        x.data<float>(), dy.data<float>(), mean, rstd, n, d, shape.chunk_rows, partial_w,
        partial_b);
  } else {
    norm_dev::ColumnPartialKernel<1><<<grid, block, 0, StreamOf(ctx)>>>(
        x.data<float>(), dy.data<float>(), mean, rstd, n, d, shape.chunk_rows, partial_w,
        partial_b);
  }
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

// Launches warp(vec, shape) (a warp-row kernel with vec quads per lane) when the rows of width
// d with these operands fit it, else block(shape) (the block-per-row kernel).
template <typename Warp, typename Block>
void LaunchRows(int64_t n, int64_t d, std::initializer_list<const void*> operands, Warp&& warp,
                Block&& block) {
  if (norm_dev::UseWarpRows(d, operands)) {
    const RowShape shape = norm_dev::WarpRowShapeOf(n);
    norm_dev::WithWarpVec(norm_dev::WarpVecOf(d), [&](auto vec) { warp(vec, shape); });
  } else {
    block(norm_dev::RowShapeOf(n, d));
  }
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& y, Tensor& mean, Tensor& rstd, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  WithF32OrBf16(y, [&](auto* yp) {
    using TY = std::remove_pointer_t<decltype(yp)>;
    LaunchRows(
        n, d, {x.raw_data(), weight.raw_data(), b, yp},
        [&](auto vec, RowShape s) {
          norm_dev::LayerNormForwardWarpKernel<decltype(vec)::value, TY>
              <<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(x.data<float>(), weight.data<float>(),
                                                          b, eps, yp, mean.data<float>(),
                                                          rstd.data<float>(), n, d);
        },
        [&](RowShape s) {
          norm_dev::LayerNormForwardKernel<<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(
              x.data<float>(), weight.data<float>(), b, eps, yp, mean.data<float>(),
              rstd.data<float>(), n, d);
        });
  });
}

void LayerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight,
                       Tensor& dbias, Write write, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  // The column sums read dy: they run before dx (which may alias dy) is written.
  AccumulateColumns(x, dy, mean.data<float>(), rstd.data<float>(), n, d, dweight,
                    dbias.defined() ? &dbias : nullptr, ctx);
  const bool add = write == Write::kAdd;
  LaunchRows(
      n, d, {x.raw_data(), weight.raw_data(), dy.raw_data(), dx.raw_data()},
      [&](auto vec, RowShape s) {
        norm_dev::LayerNormDxWarpKernel<decltype(vec)::value>
            <<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(
                x.data<float>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(),
                dy.data<float>(), dx.data<float>(), n, d, add);
      },
      [&](RowShape s) {
        norm_dev::LayerNormDxKernel<<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(
            x.data<float>(), weight.data<float>(), mean.data<float>(), rstd.data<float>(),
            dy.data<float>(), dx.data<float>(), n, d, add);
      });
}

void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd,
                    DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  WithF32OrBf16(y, [&](auto* yp) {
    using TY = std::remove_pointer_t<decltype(yp)>;
    LaunchRows(
        n, d, {x.raw_data(), weight.raw_data(), yp},
        [&](auto vec, RowShape s) {
          norm_dev::RmsNormForwardWarpKernel<decltype(vec)::value, TY>
              <<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(x.data<float>(), weight.data<float>(),
                                                          eps, yp, rstd.data<float>(), n, d);
        },
        [&](RowShape s) {
          norm_dev::RmsNormForwardKernel<<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(
              x.data<float>(), weight.data<float>(), eps, yp, rstd.data<float>(), n, d);
        });
  });
}

void RmsNormBackward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                     Tensor& dx, Tensor& dweight, Write write, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  // The column sums read dy: they run before dx (which may alias dy) is written.
  AccumulateColumns(x, dy, nullptr, rstd.data<float>(), n, d, dweight, nullptr, ctx);
  const bool add = write == Write::kAdd;
  LaunchRows(
      n, d, {x.raw_data(), weight.raw_data(), dy.raw_data(), dx.raw_data()},
      [&](auto vec, RowShape s) {
        norm_dev::RmsNormDxWarpKernel<decltype(vec)::value>
            <<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(x.data<float>(), weight.data<float>(),
                                                        rstd.data<float>(), dy.data<float>(),
                                                        dx.data<float>(), n, d, add);
      },
      [&](RowShape s) {
        norm_dev::RmsNormDxKernel<<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(
            x.data<float>(), weight.data<float>(), rstd.data<float>(), dy.data<float>(),
            dx.data<float>(), n, d, add);
      });
}

void AddLayerNormForward(const Tensor& x, const Tensor& r, const Tensor& weight,
                         const Tensor& bias, float eps, Tensor& sum, Tensor& y, Tensor& mean,
                         Tensor& rstd, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  const float* b = bias.defined() ? bias.data<float>() : nullptr;
  WithF32OrBf16(y, [&](auto* yp) {
    using TY = std::remove_pointer_t<decltype(yp)>;
    LaunchRows(
        n, d, {x.raw_data(), r.raw_data(), weight.raw_data(), b, yp, sum.raw_data()},
        [&](auto vec, RowShape s) {
          norm_dev::LayerNormForwardWarpKernel<decltype(vec)::value, TY>
              <<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(
                  x.data<float>(), weight.data<float>(), b, eps, yp, mean.data<float>(),
                  rstd.data<float>(), n, d, r.data<float>(), sum.data<float>());
        },
        [&](RowShape s) {
          norm_dev::LayerNormForwardKernel<<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(
              x.data<float>(), weight.data<float>(), b, eps, yp, mean.data<float>(),
              rstd.data<float>(), n, d, r.data<float>(), sum.data<float>());
        });
  });
}

void AddRmsNormForward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                       Tensor& sum, Tensor& y, Tensor& rstd, DeviceContext* ctx) {
  const int64_t d = weight.numel();
  const int64_t n = d == 0 ? 0 : x.numel() / d;
  if (n == 0) return;
  WithF32OrBf16(y, [&](auto* yp) {
    using TY = std::remove_pointer_t<decltype(yp)>;
    LaunchRows(
        n, d, {x.raw_data(), r.raw_data(), weight.raw_data(), yp, sum.raw_data()},
        [&](auto vec, RowShape s) {
          norm_dev::RmsNormForwardWarpKernel<decltype(vec)::value, TY>
              <<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(x.data<float>(), weight.data<float>(),
                                                          eps, yp, rstd.data<float>(), n, d,
                                                          r.data<float>(), sum.data<float>());
        },
        [&](RowShape s) {
          norm_dev::RmsNormForwardKernel<<<s.blocks, s.threads, 0, StreamOf(ctx)>>>(
              x.data<float>(), weight.data<float>(), eps, yp, rstd.data<float>(), n, d,
              r.data<float>(), sum.data<float>());
        });
  });
}

}  // namespace switchyard::kernels::cuda
