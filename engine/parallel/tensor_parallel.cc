// The tensor-parallel mappings of tensor_parallel.h: the row forms are one collective each;
// the last-dim forms move whole rows of a 2-d view with kernels::GatherRows, which copies
// f32 rows bit for bit on both devices, so any dtype travels as f32 words.
#include "engine/parallel/tensor_parallel.h"

#include <vector>

#include "engine/core/check.h"
#include "kernels/permute.h"

namespace switchyard::parallel {
namespace {

bool Alone(const dist::Communicator& tp) { return tp.size() == 1; }

// `shape` with its first / last dim replaced.
Shape WithFirst(Shape s, int64_t v) {
  s[0] = v;
  return s;
}
Shape WithLast(Shape s, int64_t v) {
  s.back() = v;
  return s;
}

// The last dim of x, which must divide into `parts` blocks.
int64_t LastDim(const Tensor& x, int parts, const char* op) {
  SY_CHECK(x.defined() && x.ndim() >= 1) << op << ": needs a tensor with a last dim, got "
                                         << (x.defined() ? ShapeString(x.shape()) : "undefined");
  SY_CHECK(x.dim(-1) % parts == 0)
      << op << ": last dim of " << ShapeString(x.shape()) << " over " << parts << " ranks";
  return x.dim(-1);
}

// The rows of x, which must divide into `parts` blocks.
int64_t Rows(const Tensor& x, int parts, const char* op) {
  SY_CHECK(x.defined() && x.ndim() >= 1) << op << ": needs a tensor with rows, got "
                                         << (x.defined() ? ShapeString(x.shape()) : "undefined");
  SY_CHECK(x.dim(0) % parts == 0)
      << op << ": " << ShapeString(x.shape()) << " rows over " << parts << " ranks";
  return x.dim(0);
}

// Elements of x before its last dim (the rows of its (M, last dim) view).
int64_t LeadingRows(const Tensor& x) {
  int64_t m = 1;
  for (int i = 0; i + 1 < x.ndim(); ++i) m *= x.dim(i);
  return m;
}

// x as `rows` rows of f32 words, sharing its memory (x stays alive for the call).
Tensor AsWords(const Tensor& x, int64_t rows, const char* op) {
  const int64_t bytes = x.numel() / rows * static_cast<int64_t>(SizeOf(x.dtype()));
  SY_CHECK(bytes % 4 == 0) << op << ": blocks of " << bytes << " bytes (" << DTypeName(x.dtype())
                           << ") are not whole 4-byte words";
  return Tensor::Wrap(x.raw_data(), {rows, bytes / 4}, DType::kF32, x.device());
}

// A host index tensor on `device`.
Tensor IndexOn(const std::vector<int64_t>& index, Device device, DeviceContext* ctx) {
  Tensor host = Tensor::FromVector(index, {static_cast<int64_t>(index.size())});
  return device.is_cpu() ? host : host.To(device, ctx);
}

// Block `rank` of `tp` blocks of the last dim of x (..., tp * c): a new (..., c) tensor.
// Viewed as (M * tp, c), the block is rows i * tp + rank.
Tensor LastDimBlock(const Tensor& x, int rank, int tp, DeviceContext* ctx, const char* op) {
  const int64_t c = LastDim(x, tp, op) / tp, m = LeadingRows(x);
  std::vector<int64_t> index(m);
  for (int64_t i = 0; i < m; ++i) index[i] = i * tp + rank;
  Tensor out = Tensor::Empty(WithLast(x.shape(), c), x.dtype(), x.device());
  if (out.numel() == 0) return out;
  Tensor out_words = AsWords(out, m, op);
  kernels::GatherRows(AsWords(x, m * tp, op), IndexOn(index, x.device(), ctx), out_words, ctx);
  return out;
}

// Every rank's x (..., c) side by side along the last dim: (..., tp * c). The all-gather
// gives (tp, M, c); output row i * tp + r of the (M * tp, c) view is block row r * M + i.
Tensor GatherLastDim(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx,
                     const char* op) {
  const int size = tp.size();
  const int64_t c = LastDim(x, 1, op), m = LeadingRows(x);
  Tensor out = Tensor::Empty(WithLast(x.shape(), c * size), x.dtype(), x.device());
  Tensor blocks = Tensor::Empty({size * m, c}, x.dtype(), x.device());
  tp.AllGather(x.Reshape({m, c}), blocks);
  if (out.numel() == 0) return out;
  std::vector<int64_t> index(m * size);
  for (int64_t i = 0; i < m; ++i)
    for (int r = 0; r < size; ++r) index[i * size + r] = r * m + i;
  Tensor out_words = AsWords(out, m * size, op);
  kernels::GatherRows(AsWords(blocks, size * m, op), IndexOn(index, x.device(), ctx), out_words,
                      ctx);
  return out;
}

// A new tensor with every rank's rows (N/tp, ...) in rank order: (N, ...).
Tensor AllGatherRows(const Tensor& x, dist::Communicator& tp, const char* op) {
  Rows(x, 1, op);
  Tensor out = Tensor::Empty(WithFirst(x.shape(), x.dim(0) * tp.size()), x.dtype(), x.device());
  tp.AllGather(x, out);
  return out;
}

// This rank's rows of the sum over ranks of x (N, ...): (N/tp, ...).
Tensor ReduceScatterRows(const Tensor& x, dist::Communicator& tp, const char* op) {
  const int64_t n = Rows(x, tp.size(), op);
  Tensor out = Tensor::Empty(WithFirst(x.shape(), n / tp.size()), x.dtype(), x.device());
  tp.ReduceScatter(x, out, dist::ReduceOp::kSum);
  return out;
}

Tensor AllReduceSum(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx) {
  Tensor sum = x.Clone(ctx);
  tp.AllReduce(sum, dist::ReduceOp::kSum);
  return sum;
}

}  // namespace

SequenceShard SequenceShardOf(int64_t rows, int rank, int size) {
  SY_CHECK(size >= 1 && rank >= 0 && rank < size && rows >= 0 && rows % size == 0)
      << "sequence shard: " << rows << " rows over " << size << " ranks (rank " << rank << ")";
  const int64_t per = rows / size;
  return {rank * per, (rank + 1) * per};
}

Tensor CopyToTensorParallelRegion(const Tensor& x, dist::Communicator&, DeviceContext*) {
  return x;
}

Tensor CopyToTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                          DeviceContext* ctx) {
  return Alone(tp) ? dy : AllReduceSum(dy, tp, ctx);
}

Tensor ReduceFromTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx) {
  return Alone(tp) ? x : AllReduceSum(x, tp, ctx);
}

Tensor ReduceFromTensorParallelRegionBackward(const Tensor& dy, dist::Communicator&,
                                              DeviceContext*) {
  return dy;
}

Tensor ScatterToTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx) {
  if (Alone(tp)) return x;
  return LastDimBlock(x, tp.rank(), tp.size(), ctx, "ScatterToTensorParallelRegion");
}

Tensor ScatterToTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                             DeviceContext* ctx) {
  if (Alone(tp)) return dy;
  return GatherLastDim(dy, tp, ctx, "ScatterToTensorParallelRegionBackward");
}

Tensor GatherFromTensorParallelRegion(const Tensor& x, dist::Communicator& tp, DeviceContext* ctx) {
  if (Alone(tp)) return x;
  return GatherLastDim(x, tp, ctx, "GatherFromTensorParallelRegion");
}

Tensor GatherFromTensorParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                              DeviceContext* ctx) {
  if (Alone(tp)) return dy;
  return LastDimBlock(dy, tp.rank(), tp.size(), ctx, "GatherFromTensorParallelRegionBackward");
}

Tensor ScatterToSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                       DeviceContext* ctx) {
  if (Alone(tp)) return x;
  const SequenceShard s = SequenceShardOf(Rows(x, tp.size(), "ScatterToSequenceParallelRegion"),
                                          tp.rank(), tp.size());
  return x.Slice(s.begin, s.end).Clone(ctx);
}

Tensor ScatterToSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                               DeviceContext*) {
  if (Alone(tp)) return dy;
  return AllGatherRows(dy, tp, "ScatterToSequenceParallelRegionBackward");
}

Tensor GatherFromSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                        DeviceContext*) {
  if (Alone(tp)) return x;
  return AllGatherRows(x, tp, "GatherFromSequenceParallelRegion");
}

Tensor GatherFromSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                                DeviceContext*) {
  if (Alone(tp)) return dy;
  return ReduceScatterRows(dy, tp, "GatherFromSequenceParallelRegionBackward");
}

Tensor ReduceScatterToSequenceParallelRegion(const Tensor& x, dist::Communicator& tp,
                                             DeviceContext*) {
  if (Alone(tp)) return x;
  return ReduceScatterRows(x, tp, "ReduceScatterToSequenceParallelRegion");
}

Tensor ReduceScatterToSequenceParallelRegionBackward(const Tensor& dy, dist::Communicator& tp,
                                                     DeviceContext*) {
  if (Alone(tp)) return dy;
  return AllGatherRows(dy, tp, "ReduceScatterToSequenceParallelRegionBackward");
}

}  // namespace switchyard::parallel
