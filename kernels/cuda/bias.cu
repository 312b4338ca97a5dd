// CUDA implementation of kernels/activation.h's bias ops: the bias add over rows and its
// gradient, flat and grouped (host- or device-sized groups), and bias + activation fused.
//
// Bias add over rows: a 2-D grid, blockIdx.y over rows (grid-stride), x over columns; the
// group of a row is a binary search in the block offsets (G + 1, copied from the host).
//
// Bias gradient (column sums, deterministic, no atomics), in two stages:
//   1. rows are cut into chunks of at most K rows that never cross a group boundary;
//      a (32, 8) block sums a 32-column tile of one chunk — 8 row lanes, each adding every
//      8th row in order, then lane 0 adds the 8 lane sums in order — into partial (C, n).
//   2. a (32, 32) block per (group, 32-column tile) adds the group's chunk partials: 32
//      chunk lanes, each adding every 32nd chunk in order, then lane 0 the 32 lane sums in
//      order, and writes dbias = (beta == 0 ? 0 : beta * dbias) + sum.
// The order of additions depends only on the shapes and the group sizes, so repeated runs
// give identical bits. With host-sized groups the host lists the chunks; with device-sized
// ones (offsets on the device) each group's rows are cut the same way, the groups' chunks
// one after another, and both stages find their chunk from the offsets (a scan of the G
// groups): the same chunks, so the same bits as the host-sized op given a dy of the same
// rows (K depends on dy's row count: 64 up to 65,536 rows). The host launches the most
// chunks any split can need, R / K + G (each group ends at most one partial chunk), and the
// chunks past the last group's do nothing.
//
// Fused bias + activation (the dense MLP): forward adds the bias and applies the activation
// in one grid-stride kernel; backward computes the activation's gradient inside stage 1 of
// the bias gradient (writing it as it sums it), so GeluBackward + BiasGrad become one pass
// over the rows plus stage 2, with the very same bits as the two unfused ops. The gradient
// is written in f32, or rounded into the products' bf16 operand (FusedArgs::dx16, db16),
// summed as f32 either way. BiasGradCast is the same with no activation: stage 1 writes dy
// rounded to bf16 as it sums it (a Linear's incoming gradient as its products' operand).
//
// The device code: kernels/cuda/bias_kernels.cuh (the bias add, the fused forward, and the
// row-wise launch shape) and kernels/cuda/bias_grad_kernels.cuh (the two stages).
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/activation.h"
#include "kernels/cuda/activation_math.cuh"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/bias_grad_kernels.cuh"
#include "kernels/cuda/bias_kernels.cuh"

namespace switchyard::kernels::cuda {
namespace {

using bias_grad::Chunks;
using bias_grad::ChunkColumnSumKernel;
using bias_grad::Fused;
using bias_grad::FusedArgs;
using bias_grad::GroupSumKernel;
using bias_grad::kRowLanes;
using bias_grad::kSumLanes;
using bias_grad::kTileCols;
using bias_fwd::AddBiasKernel;
using bias_fwd::BiasActForwardKernel;
using bias_fwd::ForwardOut;
using bias_fwd::GroupedBiasActKernel;
using bias_fwd::kThreads;
using bias_fwd::RowLaunch;
using bias_fwd::RowLaunchOf;

ForwardOut OutOf(Tensor& h, KeptRounded kept) {
  ForwardOut o;
  if (h.dtype() == DType::kBF16) {
    o.h16 = static_cast<__nv_bfloat16*>(h.raw_data());
  } else {
    o.h = h.data<float>();
  }
  if (kept.a != nullptr) o.kept_a = static_cast<__nv_bfloat16*>(kept.a->raw_data());
  if (kept.b != nullptr) o.kept_b = static_cast<__nv_bfloat16*>(kept.b->raw_data());
  return o;
}

// The fused backward's saved inputs a (and swiglu's b): f32, or the bf16 values kept under
// bf16 activation storage (read by the kernels as f32); and its outputs dx (da) and swiglu's
// db: f32, or bf16 (the products' operands, rounded as stored).
FusedArgs FusedArgsOf(const Tensor& a, const Tensor& b, Tensor& dx, Tensor* db) {
  FusedArgs f;
  if (a.dtype() == DType::kBF16) {
    f.a16 = static_cast<const __nv_bfloat16*>(a.raw_data());
    if (b.defined()) f.b16 = static_cast<const __nv_bfloat16*>(b.raw_data());
  } else {
    f.a = a.data<float>();
    if (b.defined()) f.b = b.data<float>();
  }
  if (dx.dtype() == DType::kBF16) {
    f.dx16 = static_cast<__nv_bfloat16*>(dx.raw_data());
    if (db != nullptr) f.db16 = static_cast<__nv_bfloat16*>(db->raw_data());
  } else {
    f.dx = dx.data<float>();
    if (db != nullptr) f.db = db->data<float>();
  }
  return f;
}

// The fused forward's bias, null when there is none.
const float* BiasOrNull(const Tensor& bias) {
  return bias.defined() ? bias.data<float>() : nullptr;
}

// Rows per stage-1 chunk: at least 64 (8 per row lane), more for tall inputs so there are
// about 1024 chunks at most (plus one per group) and stage 2 stays short.
int64_t RowsPerChunk(int64_t rows) { return std::max<int64_t>(64, (rows + 1023) / 1024); }

// The row-wise kernels' launch over (rows, n), as a grid.
struct RowGrid {
  dim3 grid;
  int threads;
};
RowGrid RowGridOf(int64_t rows, int64_t n) {
  const RowLaunch l = RowLaunchOf(rows, n);
  return {dim3(l.blocks_x, l.blocks_y), l.threads};
}

void LaunchAddBias(Tensor& out, const Tensor& bias, const int64_t* offsets, int64_t groups,
                   DeviceContext* ctx) {
  const int64_t rows = out.dim(0), n = out.dim(1);
  if (rows == 0 || n == 0) return;
  const RowGrid g = RowGridOf(rows, n);
  AddBiasKernel<<<g.grid, g.threads, 0, StreamOf(ctx)>>>(out.data<float>(), bias.data<float>(),
                                                         offsets, groups, rows, n);
  SY_CUDA_CHECK_LAUNCH();
}

// Host-sized groups' chunks: the table [chunk_begin (G + 1) | bounds (C + 1)] (group g owns
// chunks [chunk_begin[g], chunk_begin[g + 1]); chunk c is rows [bounds[c], bounds[c + 1]))
// copied to the device into *holder, which the caller keeps until the launches are queued.
Chunks HostChunks(std::span<const int64_t> rows, int64_t total, DeviceContext* ctx,
                  Tensor* holder) {
  const int64_t groups = static_cast<int64_t>(rows.size());
  const int64_t k = RowsPerChunk(total);
  std::vector<int64_t> chunk_begin(groups + 1, 0), bounds(1, 0);
  int64_t row = 0;
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t end = row + rows[g];
    for (; row < end; row = std::min(end, row + k)) bounds.push_back(std::min(end, row + k));
    chunk_begin[g + 1] = static_cast<int64_t>(bounds.size()) - 1;
  }
  const int64_t chunks = static_cast<int64_t>(bounds.size()) - 1;
  std::vector<int64_t> table(chunk_begin);
  table.insert(table.end(), bounds.begin(), bounds.end());
  *holder = ToDevice(table, ctx);
  const int64_t* d_table = holder->data<int64_t>();
  return Chunks{.bounds = d_table + groups + 1, .chunk_begin = d_table, .groups = groups,
                .rows_per_chunk = k, .rows = total, .count = chunks};
}

// Device-sized groups' chunks: found from the offsets by both stages; the most chunks any
// split of `rows` rows into G groups can need.
Chunks DeviceChunks(const Tensor& offsets, int64_t groups, int64_t rows) {
  const int64_t k = RowsPerChunk(rows);  // the host-sized op's K for these rows
  return Chunks{.offsets = offsets.data<int64_t>(), .groups = groups, .rows_per_chunk = k,
                .rows = rows, .count = (rows + groups * (k - 1)) / k};
}

Chunks ChunksOf(const RowGroups& groups, int64_t n_groups, int64_t rows, DeviceContext* ctx,
                Tensor* holder) {
  return groups.offsets.defined() ? DeviceChunks(groups.offsets, n_groups, rows)
                                  : HostChunks(groups.rows, rows, ctx, holder);
}

// Both stages over the chunks `ch` of dy's rows.
template <Fused F = Fused::kNone>
void LaunchBiasGrad(const Tensor& dy, Tensor& dbias, float beta, Chunks ch, DeviceContext* ctx,
                    FusedArgs fused = {}) {
  const int64_t n = dy.dim(1);
  if (n == 0 || ch.groups == 0) return;
  Tensor partial;
  if (ch.count > 0) {
    partial = Tensor::Empty({ch.count, n}, DType::kF32, ctx->device());
    const dim3 block(kTileCols, kRowLanes);
    const unsigned chunk_blocks = static_cast<unsigned>(std::min<int64_t>(ch.count, 65535));
    // Four columns a thread (16-byte accesses) where the width and the arrays allow.
    if (bias_grad::QuadsFit(n, dy.data<float>(), partial.data<float>(), fused)) {
      const dim3 grid(static_cast<unsigned>((n + 4 * kTileCols - 1) / (4 * kTileCols)),
                      chunk_blocks);
      ChunkColumnSumKernel<F, 4><<<grid, block, 0, StreamOf(ctx)>>>(
          dy.data<float>(), n, ch, partial.data<float>(), fused);
    } else {
      const dim3 grid(static_cast<unsigned>((n + kTileCols - 1) / kTileCols), chunk_blocks);
      ChunkColumnSumKernel<F, 1><<<grid, block, 0, StreamOf(ctx)>>>(
          dy.data<float>(), n, ch, partial.data<float>(), fused);
    }
    SY_CUDA_CHECK_LAUNCH();
  }
  const dim3 block(kTileCols, kSumLanes);
  const dim3 grid(static_cast<unsigned>((n + kTileCols - 1) / kTileCols),
                  static_cast<unsigned>(std::min<int64_t>(ch.groups, 65535)));
  GroupSumKernel<<<grid, block, 0, StreamOf(ctx)>>>(
      ch.count > 0 ? partial.data<float>() : nullptr, ch, n, beta, dbias.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

// One group of all dy's rows in uniform chunks (BiasGrad and the fused backward ops).
Chunks UniformChunks(int64_t rows) {
  const int64_t k = RowsPerChunk(rows);
  return Chunks{.rows_per_chunk = k, .rows = rows, .count = (rows + k - 1) / k};
}

}  // namespace

void AddBias(Tensor& out, const Tensor& bias, DeviceContext* ctx) {
  LaunchAddBias(out, bias, /*offsets=*/nullptr, /*groups=*/1, ctx);
}

void BiasGrad(const Tensor& dy, Tensor& dbias, float beta, DeviceContext* ctx) {
  LaunchBiasGrad(dy, dbias, beta, UniformChunks(dy.dim(0)), ctx);
}

void BiasGradCast(const Tensor& dy, Tensor& dbias, float beta, Tensor& dy16,
                  DeviceContext* ctx) {
  FusedArgs f;
  f.dx16 = static_cast<__nv_bfloat16*>(dy16.raw_data());
  LaunchBiasGrad<Fused::kCast>(dy, dbias, beta, UniformChunks(dy.dim(0)), ctx, f);
}

void GroupedAddBias(Tensor& out, std::span<const int64_t> rows, const Tensor& bias,
                    DeviceContext* ctx) {
  if (out.numel() == 0) return;
  std::vector<int64_t> offsets(rows.size() + 1, 0);
  for (size_t g = 0; g < rows.size(); ++g) offsets[g + 1] = offsets[g] + rows[g];
  const Tensor device_offsets = ToDevice(offsets, ctx);
  LaunchAddBias(out, bias, device_offsets.data<int64_t>(), static_cast<int64_t>(rows.size()), ctx);
}

void GroupedBiasGrad(const Tensor& dy, std::span<const int64_t> rows, Tensor& dbias, float beta,
                     DeviceContext* ctx) {
  if (rows.empty() || dy.dim(1) == 0) return;
  Tensor table;
  LaunchBiasGrad(dy, dbias, beta, HostChunks(rows, dy.dim(0), ctx, &table), ctx);
}

void GroupedAddBias(Tensor& out, const Tensor& offsets, const Tensor& bias, DeviceContext* ctx) {
  if (out.numel() == 0 || bias.dim(0) == 0) return;
  LaunchAddBias(out, bias, offsets.data<int64_t>(), bias.dim(0), ctx);
}

void GroupedBiasGrad(const Tensor& dy, const Tensor& offsets, Tensor& dbias, float beta,
                     DeviceContext* ctx) {
  LaunchBiasGrad(dy, dbias, beta, DeviceChunks(offsets, dbias.dim(0), dy.dim(0)), ctx);
}

namespace {
// The fused forward over a (rows, n): four consecutive elements a thread (16-byte f32 and
// 8-byte bf16 accesses) when n and the arrays allow it, else one.
template <int kAct>
void LaunchBiasAct(float* a, const float* bias, const float* b, const ForwardOut& o,
                   int64_t total, int64_t n, DeviceContext* ctx) {
  if (bias_fwd::ForwardQuadsFit(n, {a, bias, b, o.h, o.h16, o.kept_a, o.kept_b})) {
    BiasActForwardKernel<kAct, 4><<<GridFor(total / 4, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        a, bias, b, o, total, n);
  } else {
    BiasActForwardKernel<kAct, 1><<<GridFor(total, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        a, bias, b, o, total, n);
  }
  SY_CUDA_CHECK_LAUNCH();
}
}  // namespace

void BiasGeluForward(Tensor& a, const Tensor& bias, Tensor& h, KeptRounded kept,
                     DeviceContext* ctx) {
  const int64_t total = a.numel();
  if (total == 0) return;
  LaunchBiasAct<0>(a.data<float>(), BiasOrNull(bias), nullptr, OutOf(h, kept), total, a.dim(1),
                   ctx);
}

void BiasSwigluForward(Tensor& a, const Tensor& bias, const Tensor& b, Tensor& out,
                       KeptRounded kept, DeviceContext* ctx) {
  const int64_t total = a.numel();
  if (total == 0) return;
  LaunchBiasAct<1>(a.data<float>(), BiasOrNull(bias), b.data<float>(), OutOf(out, kept), total,
                   a.dim(1), ctx);
}

// The gradient in stage 1 of the bias gradient: the same chunks, order and sums as
// GeluBackward then BiasGrad, so the same bits, with one pass over the rows fewer.
void GeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx, Tensor& dbias,
                          float beta, DeviceContext* ctx) {
  const FusedArgs f = FusedArgsOf(a, Tensor(), dx, nullptr);
  LaunchBiasGrad<Fused::kGelu>(dy, dbias, beta, UniformChunks(dx.dim(0)), ctx, f);
}

void SwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da,
                            Tensor& db, Tensor& dbias, float beta, DeviceContext* ctx) {
  const FusedArgs f = FusedArgsOf(a, b, da, &db);
  LaunchBiasGrad<Fused::kSwiglu>(dout, dbias, beta, UniformChunks(da.dim(0)), ctx, f);
}

namespace {
// kAct 0: gelu, 1: swiglu (b its gate input).
template <int kAct>
void LaunchGroupedBiasAct(Tensor& a, const RowGroups& groups, const Tensor& bias,
                          const float* b, Tensor& out, KeptRounded kept, DeviceContext* ctx) {
  const int64_t rows = a.dim(0), n = a.dim(1), g = bias.dim(0);
  // No groups (device offsets {0}) still runs: every row is past the groups and gets the
  // activation of its a, as on the CPU.
  if (rows == 0 || n == 0) return;
  Tensor offsets = groups.offsets;
  if (!offsets.defined()) {  // host counts: their offsets on the device
    std::vector<int64_t> o(g + 1, 0);
    for (int64_t i = 0; i < g; ++i) o[i + 1] = o[i] + groups.rows[i];
    offsets = ToDevice(o, ctx);
  }
  const RowGrid grid = RowGridOf(rows, n);
  GroupedBiasActKernel<kAct><<<grid.grid, grid.threads, 0, StreamOf(ctx)>>>(
      a.data<float>(), bias.data<float>(), b, OutOf(out, kept), offsets.data<int64_t>(), g,
      rows, n);
  SY_CUDA_CHECK_LAUNCH();
}
}  // namespace

void GroupedBiasGeluForward(Tensor& a, const RowGroups& groups, const Tensor& bias, Tensor& h,
                            KeptRounded kept, DeviceContext* ctx) {
  LaunchGroupedBiasAct<0>(a, groups, bias, nullptr, h, kept, ctx);
}

void GroupedBiasSwigluForward(Tensor& a, const RowGroups& groups, const Tensor& bias,
                              const Tensor& b, Tensor& out, KeptRounded kept,
                              DeviceContext* ctx) {
  LaunchGroupedBiasAct<1>(a, groups, bias, b.data<float>(), out, kept, ctx);
}

void GroupedGeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx,
                                 const RowGroups& groups, Tensor& dbias, float beta,
                                 DeviceContext* ctx) {
  if (dbias.dim(0) == 0 || dx.dim(1) == 0) return;
  const FusedArgs f = FusedArgsOf(a, Tensor(), dx, nullptr);
  Tensor table;
  LaunchBiasGrad<Fused::kGelu>(dy, dbias, beta,
                               ChunksOf(groups, dbias.dim(0), dx.dim(0), ctx, &table), ctx, f);
}

void GroupedSwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout,
                                   Tensor& da, Tensor& db, const RowGroups& groups,
                                   Tensor& dbias, float beta, DeviceContext* ctx) {
  if (dbias.dim(0) == 0 || da.dim(1) == 0) return;
  const FusedArgs f = FusedArgsOf(a, b, da, &db);
  Tensor table;
  LaunchBiasGrad<Fused::kSwiglu>(dout, dbias, beta,
                                 ChunksOf(groups, dbias.dim(0), da.dim(0), ctx, &table), ctx, f);
}

}  // namespace switchyard::kernels::cuda
