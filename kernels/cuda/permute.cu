// CUDA kernels of kernels/permute.h.
//
//   SortAssignments  kernels/cuda/sort_assignments.cu.
//   GatherRows       ScatterAddRows, Combine: "row kernels", a group of 2^p threads per
//                    output row (p chosen from the row width, 256 threads per block),
//                    grid-stride over rows; float4 loads and stores when d % 4 == 0 and
//                    every row pointer is 16-byte aligned.
//   CombineBackward  one warp per permuted row: dout row and the dot for the gate.
//   EntropySum       grid-stride partial sums in double, one per block, added on the host.
// The kernels and their launch shapes are in kernels/cuda/permute_kernels.cuh.
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/permute_kernels.cuh"
#include "kernels/permute.h"

namespace switchyard::kernels::cuda {
namespace {

using dispatch::permute::CombineBackwardBlocks;
using dispatch::permute::CombineBackwardKernel;
using dispatch::permute::CombineKernel;
using dispatch::permute::EntropyBlocks;
using dispatch::permute::EntropyKernel;
using dispatch::permute::GatherRowsKernel;
using dispatch::permute::GatherRowsToBf16Kernel;
using dispatch::permute::kMaxSortedK;
using dispatch::permute::kThreads;
using dispatch::permute::LaunchRows;
using dispatch::permute::LayoutFor;
using dispatch::permute::RowLayout;
using dispatch::permute::ScatterAddKernel;
using dispatch::permute::SumInOrderKernel;

}  // namespace

void GatherRows(const Tensor& src, const Tensor& index, Tensor& dst, DeviceContext* ctx) {
  const int64_t rows = dst.dim(0), d = dst.dim(1);
  if (rows == 0 || d == 0) return;
  cudaStream_t stream = StreamOf(ctx);
  if (src.dtype() == DType::kF32 && dst.dtype() == DType::kBF16) {  // rounded as stored
    const RowLayout l = LayoutFor(rows, d);
    GatherRowsToBf16Kernel<<<l.blocks, kThreads, 0, stream>>>(
        src.data<float>(), index.data<int64_t>(), static_cast<__nv_bfloat16*>(dst.raw_data()),
        rows, d, l.log2);
    SY_CUDA_CHECK_LAUNCH();
    return;
  }
  if (dst.dtype() == DType::kU8 || dst.dtype() == DType::kBF16) {  // bytes, 2-byte words; f32
    const RowLayout l = LayoutFor(rows, d);                           // and i32 below
    auto launch = [&](auto* tag) {
      using E = std::remove_pointer_t<decltype(tag)>;
      GatherRowsKernel<E><<<l.blocks, kThreads, 0, stream>>>(
          static_cast<const E*>(src.raw_data()), index.data<int64_t>(),
          static_cast<E*>(dst.raw_data()), rows, d, l.log2);
    };
    if (dst.dtype() == DType::kU8) {
      launch(static_cast<uint8_t*>(nullptr));
    } else {
      launch(static_cast<uint16_t*>(nullptr));
    }
    SY_CUDA_CHECK_LAUNCH();
    return;
  }
  LaunchRows(d, {src.raw_data(), dst.raw_data()}, [&](auto tag, int64_t width) {
    using V = decltype(tag);
    const RowLayout l = LayoutFor(rows, width);
    GatherRowsKernel<V><<<l.blocks, kThreads, 0, stream>>>(
        static_cast<const V*>(src.raw_data()), index.data<int64_t>(),
        static_cast<V*>(dst.raw_data()), rows, width, l.log2);
    SY_CUDA_CHECK_LAUNCH();
  });
}

void ScatterAddRows(const Tensor& drows, const Tensor& inverse, Tensor& dh, Write write,
                    DeviceContext* ctx) {
  const int64_t tokens = dh.dim(0), d = dh.dim(1);
  const int k = static_cast<int>(inverse.dim(1));
  if (tokens == 0 || d == 0) return;
  cudaStream_t stream = StreamOf(ctx);
  if (drows.dim(0) == 0) {  // no rows: nothing to add, or zeros to set
    if (write == Write::kSet) dh.SetZero(ctx);
    return;
  }
  LaunchRows(d, {drows.raw_data(), dh.raw_data()}, [&](auto tag, int64_t width) {
    using V = decltype(tag);
    const RowLayout l = LayoutFor(tokens, width);
    auto* in = static_cast<const V*>(drows.raw_data());
    auto* out = static_cast<V*>(dh.raw_data());
    const auto launch = [&](auto kernel) {
      kernel<<<l.blocks, kThreads, 0, stream>>>(in, inverse.data<int64_t>(), out, tokens, k,
                                                width, l.log2);
    };
    const bool sorted = k <= kMaxSortedK, set = write == Write::kSet;
    if (sorted && set) launch(ScatterAddKernel<V, true, true>);
    if (sorted && !set) launch(ScatterAddKernel<V, true, false>);
    if (!sorted && set) launch(ScatterAddKernel<V, false, true>);
    if (!sorted && !set) launch(ScatterAddKernel<V, false, false>);
    SY_CUDA_CHECK_LAUNCH();
  });
}

void Combine(const Tensor& out, const Tensor& gates, const Tensor& inverse, const Tensor& extra,
             Tensor& y, Tensor* kept, DeviceContext* ctx) {
  const int64_t tokens = y.dim(0), d = y.dim(1);
  const int k = static_cast<int>(inverse.dim(1));
  if (tokens == 0 || d == 0) return;
  cudaStream_t stream = StreamOf(ctx);
  const void* extra_ptr = extra.defined() ? extra.raw_data() : nullptr;
  // An empty `out` (nothing kept) has no valid pointer to read; no slot refers to it then.
  const void* out_ptr = out.numel() > 0 ? out.raw_data() : nullptr;
  LaunchRows(d, {out_ptr, extra_ptr, y.raw_data()}, [&](auto tag, int64_t width) {
    using V = decltype(tag);
    const RowLayout l = LayoutFor(tokens, width);
    auto* o = static_cast<const V*>(out_ptr);
    auto* x = static_cast<const V*>(extra_ptr);
    auto* dst = static_cast<V*>(y.raw_data());
    __nv_bfloat16* kp =
        kept != nullptr && kept->numel() > 0 ? static_cast<__nv_bfloat16*>(kept->raw_data()) : nullptr;
    if (k <= kMaxSortedK) {
      CombineKernel<V, true><<<l.blocks, kThreads, 0, stream>>>(
          o, gates.data<float>(), inverse.data<int64_t>(), x, dst, tokens, k, width, l.log2, kp);
    } else {
      CombineKernel<V, false><<<l.blocks, kThreads, 0, stream>>>(
          o, gates.data<float>(), inverse.data<int64_t>(), x, dst, tokens, k, width, l.log2, kp);
    }
    SY_CUDA_CHECK_LAUNCH();
  });
}

void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates, const Tensor& slot,
                     const Tensor& inverse, Tensor& dout, Tensor& dgates, DeviceContext* ctx) {
  const int64_t rows = out.dim(0), d = dy.dim(1), k = gates.dim(1);
  cudaStream_t stream = StreamOf(ctx);
  if (dgates.numel() > 0) {
    SY_CUDA_CHECK(cudaMemsetAsync(dgates.raw_data(), 0, dgates.nbytes(), stream));
  }
  if (rows == 0) return;
  // A bf16 out (the combine's kept rows) is read, and a bf16 dout written, element by element:
  // no float4 alignment.
  const bool out16 = out.dtype() == DType::kBF16, dout16 = dout.dtype() == DType::kBF16;
  LaunchRows(d, {dy.raw_data(), out16 ? nullptr : out.raw_data(),
                 dout16 ? nullptr : dout.raw_data()},
             [&](auto tag, int64_t width) {
    using V = decltype(tag);
    const unsigned blocks = CombineBackwardBlocks(rows);
    auto launch = [&](const auto* o, auto* dst) {
      using TO = std::remove_const_t<std::remove_pointer_t<decltype(o)>>;
      using TD = std::remove_pointer_t<decltype(dst)>;
      CombineBackwardKernel<V, TO, TD><<<blocks, kThreads, 0, stream>>>(
          static_cast<const V*>(dy.raw_data()), o, gates.data<float>(), slot.data<int64_t>(),
          inverse.defined() ? inverse.data<int64_t>() : nullptr, dst, dgates.data<float>(), rows,
          k, width);
    };
    auto with_dout = [&](const auto* o) {
      if (dout16) {
        launch(o, static_cast<__nv_bfloat16*>(dout.raw_data()));
      } else {
        launch(o, static_cast<V*>(dout.raw_data()));
      }
    };
    if (out16) {
      with_dout(static_cast<const __nv_bfloat16*>(out.raw_data()));
    } else {
      with_dout(static_cast<const V*>(out.raw_data()));
    }
    SY_CUDA_CHECK_LAUNCH();
  });
}

namespace {

// The entropy's per-block partial sums (returned, `blocks` of them) on the device.
Tensor EntropyPartials(const Tensor& probs, unsigned& blocks, DeviceContext* ctx) {
  const int64_t n = probs.numel();
  blocks = EntropyBlocks(n);
  Tensor partial = Tensor::Empty({static_cast<int64_t>(blocks)}, DType::kF64, probs.device());
  EntropyKernel<<<blocks, kThreads, 0, StreamOf(ctx)>>>(probs.data<float>(), n,
                                                        partial.data<double>());
  SY_CUDA_CHECK_LAUNCH();
  return partial;
}

}  // namespace

double EntropySum(const Tensor& probs, DeviceContext* ctx) {
  if (probs.numel() == 0) return 0.0;
  unsigned blocks = 0;
  const Tensor partial = EntropyPartials(probs, blocks, ctx);
  // Added on the host in block order: deterministic for a given n.
  Tensor host = partial.To(Device::Cpu(), ctx);
  const double* part = host.data<double>();
  double sum = 0.0;
  for (unsigned b = 0; b < blocks; ++b) sum += part[b];
  return sum;
}

void EntropySumInto(const Tensor& probs, Tensor& sum, DeviceContext* ctx) {
  if (probs.numel() == 0) {
    sum.SetZero(ctx);
    return;
  }
  unsigned blocks = 0;
  const Tensor partial = EntropyPartials(probs, blocks, ctx);
  SumInOrderKernel<<<1, 1, 0, StreamOf(ctx)>>>(partial.data<double>(), blocks,
                                               sum.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
