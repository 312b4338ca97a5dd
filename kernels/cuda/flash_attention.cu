// CUDA implementation of kernels/flash_attention.h: fused attention on tensor cores
// (mma.sync.m16n8k16, bf16 operands with f32 accumulators, in registers), FlashAttention-2
// style. This file launches the kernels; their device code is
// kernels/cuda/flash_attention_kernels.cuh. Its CPU twin is kernels/cpu/flash_attention.cc; the
// formulas and rounding points are listed in kernels/flash_attention.h and both files follow
// them.
//
// Blocks: 128 threads (4 warps) per CTA, tiles of kBr = 64 query rows and kBc = 64 keys.
// Warp w owns rows [16 w, 16 w + 16) of the tile (query rows, or keys in the dk/dv kernel) and
// keeps its scores, softmax weights and output accumulators in registers in the m16n8k16
// fragment layout (kernels/cuda/device_common.cuh): a row's values sit in the four lanes of a
// quad, which combine a row's max and sum with two shuffles, and the accumulators of the
// scores, rounded to bf16, are directly the first operand of the next product. Only the
// operand tiles pass through shared memory: inputs are (B, S, H, hd), f32 rows rounded to bf16
// as they are loaded into row-major (64, hd) tiles and bf16 rows (q, k, v from the attention
// layer under bf16 storage) copied there by cp.async, each loaded once per use; ldmatrix
// reads the fragments, transposed where a tile's rows are the product's K (v in the forward,
// k for dq, q and dout for dk and dv). Rows past S load as zeros and are masked (keys) or not
// written (queries). The tiles a kernel loops over are double-buffered: each block's loop
// stores the next block's pair into the buffers the warps are not reading and ends with one
// barrier (two a block before: one before the store, one after).
//
//   FlashForwardKernel    grid (query blocks, Hq, B): online softmax over the key blocks,
//                         out and lse written once.
//   FlashBackwardKvKernel grid (key blocks, Hkv, B): dk and dv of the block's keys, summed over
//                         the group's query heads and the query blocks that see the keys, kept
//                         in registers and written once (no atomics).
//   FlashBackwardQKernel  grid (query blocks, Hq, B): dq over the key blocks the rows see.
// Both backward kernels recompute the tile's p and ds = p (dp - delta) with the same code
// (BackwardWeights).
//
// The softmax is in base 2 on the unscaled scores (kernels/flash_attention.h): each weight is
// one fmaf and one ex2.approx, where expf of a scaled and shifted score took about a dozen
// instructions, which at these tile sizes issue as often as the tensor-core products. The f32
// arithmetic that the twin does in two roundings (m * c, then the fma; acc * a, then + pv) is
// written with __fmul_rn / __fadd_rn so that nvcc does not contract it into one fma; the order
// of the sums inside a tensor-core product (here acc * a is the product's accumulator input),
// the order of a row's sum over its four lanes and the last ulps of exp2 (the SFU's
// approximation against the C library's) differ from the twin, all inside the bound of
// tests/kernels/flash_attention_bound.h.
#include <climits>
#include <cstdint>
#include <initializer_list>
#include <cmath>
#include <type_traits>

#include <cuda_pipeline_primitives.h>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/flash_attention_kernels.cuh"
#include "kernels/flash_attention.h"

namespace switchyard::kernels::cuda {
namespace {

using flash::Dims;
using flash::kBr;
using flash::kThreads;
using flash::Sizes;

int Int(int64_t v, const char* what) {
  SY_CHECK(v >= 0 && v <= INT_MAX) << "flash attention: " << what << " = " << v
                                   << " does not fit a 32-bit int";
  return static_cast<int>(v);
}

// Grid (blocks, heads, batch); heads and batch are grid y and z (at most 65535).
dim3 GridOf(int64_t blocks, int64_t heads, int64_t batch) {
  SY_CHECK(heads <= 65535 && batch <= 65535)
      << "flash attention: " << heads << " heads and a batch of " << batch
      << " exceed the grid's y and z limits (65535)";
  return dim3(static_cast<unsigned>(Int(blocks, "blocks")), static_cast<unsigned>(heads),
              static_cast<unsigned>(batch));
}


// Whether every row of these (B, S, H, hd) tensors starts on 16 bytes: the tiles then load
// a quad of f32 or a chunk of 8 bf16 in one access (hd is a multiple of 64, so the base
// pointer decides).
bool RowsAligned(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (reinterpret_cast<uintptr_t>(t->raw_data()) % 16 != 0) return false;
  }
  return true;
}

// dout: the backward's (f32); the forward has none.
Dims DimsOf(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor* dout = nullptr) {
  return {Int(q.dim(1), "S"), Int(q.dim(2), "Hq"), Int(k.dim(2), "Hkv"),
          RowsAligned({&q, &k, &v}), dout != nullptr && RowsAligned({dout})};
}

// k's or v's elements as TI, q's type (WithF32OrBf16 of q; kernels/attention.cc checks that
// all three share it).
template <typename TI>
const TI* In(const Tensor& t) {
  return static_cast<const TI*>(t.raw_data());
}

flash::Scale ScaleOf(int64_t hd) { return {FlashScale(hd), FlashScaleLog2(hd)}; }

// Whether the HD = 64 kernels fetch the next block's tiles ahead (flash::kPrefetch, the
// default) or load them as they store them (SWITCHYARD_FLASH_PREFETCH=0: for comparison, as
// benchmarks/attention_gpu_perf runs both). Read once.
bool FetchAhead() {
  static const bool ahead = EnvSwitch("SWITCHYARD_FLASH_PREFETCH", true);
  return ahead;
}

template <int HD, bool kAhead>
void LaunchForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                   bool causal, DeviceContext* ctx) {
  const Dims d = DimsOf(q, k, v);
  const int bytes = Sizes<HD>::kForward;
  WithF32OrBf16(q, [&](auto* qp) {
    using TI = std::remove_const_t<std::remove_pointer_t<decltype(qp)>>;
    WithF32OrBf16(out, [&](auto* op) {
      using TO = std::remove_pointer_t<decltype(op)>;
      const auto kernel = flash::FlashForwardKernel<HD, TI, TO, kAhead>;
      AllowSharedMemory(kernel, bytes);
      kernel<<<GridOf((d.s + kBr - 1) / kBr, d.hq, q.dim(0)), kThreads, bytes, StreamOf(ctx)>>>(
          qp, In<TI>(k), In<TI>(v), op, lse.data<float>(), d, causal, ScaleOf(HD));
    });
  });
  SY_CUDA_CHECK_LAUNCH();
}

template <int HD, bool kAhead>
void LaunchBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                    const Tensor& dout, const Tensor& delta, Tensor& dq, Tensor& dk, Tensor& dv,
                    bool causal, DeviceContext* ctx) {
  const Dims d = DimsOf(q, k, v, &dout);
  const int64_t blocks = (d.s + kBr - 1) / kBr;
  const cudaStream_t stream = StreamOf(ctx);
  WithF32OrBf16(q, [&](auto* qp) {
    using TI = std::remove_const_t<std::remove_pointer_t<decltype(qp)>>;
    const auto kv_kernel = flash::FlashBackwardKvKernel<HD, TI, kAhead>;
    const auto q_kernel = flash::FlashBackwardQKernel<HD, TI, kAhead>;
    AllowSharedMemory(kv_kernel, Sizes<HD>::kBackwardKv);
    AllowSharedMemory(q_kernel, Sizes<HD>::kBackwardQ);
    kv_kernel<<<GridOf(blocks, d.hkv, q.dim(0)), kThreads, Sizes<HD>::kBackwardKv, stream>>>(
        qp, In<TI>(k), In<TI>(v), lse.data<float>(), dout.data<float>(),
        delta.data<float>(), dk.data<float>(), dv.data<float>(), d, causal, ScaleOf(HD));
    SY_CUDA_CHECK_LAUNCH();
    q_kernel<<<GridOf(blocks, d.hq, q.dim(0)), kThreads, Sizes<HD>::kBackwardQ, stream>>>(
        qp, In<TI>(k), In<TI>(v), lse.data<float>(), dout.data<float>(),
        delta.data<float>(), dq.data<float>(), d, causal, ScaleOf(HD));
  });
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void FlashAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                           Tensor& lse, AttentionMask mask, DeviceContext* ctx) {
  if (q.dim(0) == 0 || q.dim(1) == 0 || q.dim(2) == 0) return;
  const bool causal = mask == AttentionMask::kCausal;
  switch (q.dim(3)) {
    case 64:
      if (FetchAhead()) return LaunchForward<64, true>(q, k, v, out, lse, causal, ctx);
      return LaunchForward<64, false>(q, k, v, out, lse, causal, ctx);
    case 128: return LaunchForward<128, false>(q, k, v, out, lse, causal, ctx);
    default:
      SY_LOG(FATAL) << "FlashAttentionForward: head_dim " << q.dim(3)
                    << " has no instance (FlashAttentionSupports)";
  }
}

void FlashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                            const Tensor& dout, const Tensor& delta, Tensor& dq, Tensor& dk,
                            Tensor& dv, AttentionMask mask, DeviceContext* ctx) {
  if (q.dim(0) == 0 || q.dim(1) == 0) return;
  if (q.dim(2) == 0) {  // no query head reads k or v: dk = dv = 0 (written)
    dk.SetZero(ctx);
    dv.SetZero(ctx);
    return;
  }
  const bool causal = mask == AttentionMask::kCausal;
  switch (q.dim(3)) {
    case 64:
      if (FetchAhead()) {
        return LaunchBackward<64, true>(q, k, v, lse, dout, delta, dq, dk, dv, causal, ctx);
      }
      return LaunchBackward<64, false>(q, k, v, lse, dout, delta, dq, dk, dv, causal, ctx);
    case 128:
      return LaunchBackward<128, false>(q, k, v, lse, dout, delta, dq, dk, dv, causal, ctx);
    default:
      SY_LOG(FATAL) << "FlashAttentionBackward: head_dim " << q.dim(3)
                    << " has no instance (FlashAttentionSupports)";
  }
}

}  // namespace switchyard::kernels::cuda
