// Fused causal attention on bf16 operands (FlashAttention-2, Dao 2023; online softmax of
// Milakov & Gimelshein 2018): the same op as kernels/attention.h (same shapes, masks, lse,
// delta and GQA contract) computed block by block, never holding an S x S tensor.
//
// The switch. kernels::AttentionForward / AttentionBackward run this path instead of the
// exact f32 one when UseFlashAttention(ctx, head_dim) is true: the context's matrix
// products are bf16 (DeviceContext::matmul_dtype, runtime.precision bf16 or auto on a GPU)
// and head_dim is one the kernel is instantiated for (64, 128). The CUDA backend runs the
// tensor-core kernel (kernels/cuda/flash_attention.cu); the CPU runs its twin
// (kernels/cpu/flash_attention.cc), which rounds at the same points with the same block sizes
// and the same online-softmax order, so a bf16 CPU run is the reference of a bf16 GPU run
// (as for kernels::Gemm). f32 precision, or another head_dim, keeps the exact path.
//
// Numerics (docs/model.md, "Attention on the GPU"), per (batch, query head, query block of
// kFlashBlockQ rows), key blocks of kFlashBlockK keys in increasing order:
//   q^, k^, v^ = bf16(q), bf16(k), bf16(v)                        (round to nearest even)
//   x = f32(q^ k^T)                          bf16 x bf16 products, f32 accumulation
//   masked: key j >= S, or j > i under kCausal -> -inf; blocks wholly above the diagonal
//   are skipped
// The softmax runs in base 2 on the unscaled scores, c = FlashScaleLog2(hd) = f32(scale log2 e)
// folding 1/sqrt(hd) and 1/ln 2 into one factor, so that each weight is one fma and one exp2
// (FlashAttention-2's form; the tensor cores outpace a full expf per score):
//   m' = max(m, rowmax x);  a = exp2(f32(m - m') c);  p = exp2(fma(x, c, -f32(m' c)))
//   l = l a + rowsum p                                              (f32 p)
//   acc = acc a + f32(bf16(p) v^)                                   bf16 P in the product
//   out = acc / l,  lse = f32(m scale) + log l                      (f32; lse in base e)
// Backward (given lse and delta = rowsum(dout * out), AttentionBackwardDelta), with
// do^ = bf16(dout) and lse2 = f32(lse kLog2e) per row:
//   p = exp2(fma(x, c, -lse2)), dp = f32(do^ v^T), ds = p (dp - delta)     (f32)
//   dv = sum f32(bf16(p)^T do^),  dk = scale sum f32(bf16(ds)^T q^),
//   dq = scale sum f32(bf16(ds) k^)
// dk and dv sum the query heads of a kv head's group in one pass per key block (no
// atomics), dq is a second pass per query block: both deterministic.
#pragma once

#include <cmath>
#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "kernels/attention.h"

namespace switchyard::kernels {

// Query rows and keys per block, on both devices (the twin's blocks are the kernel's).
inline constexpr int64_t kFlashBlockQ = 64;
inline constexpr int64_t kFlashBlockK = 64;

// log2 e in f32, and the scores' factor into the base-2 softmax: f32(1/sqrt(hd) log2 e), with
// 1/sqrt(hd) first rounded to f32 (the scale both devices use) and the product rounded once.
inline constexpr float kLog2e = 1.44269504088896341f;
inline float FlashScale(int64_t head_dim) {
  return static_cast<float>(1.0 / std::sqrt(static_cast<double>(head_dim)));
}
inline float FlashScaleLog2(int64_t head_dim) {
  return static_cast<float>(static_cast<double>(FlashScale(head_dim)) * 1.44269504088896341);
}

// Head widths the fused kernel is instantiated for. Others keep the exact path: its
// tiles are (64, head_dim) bf16 in shared memory with head_dim a multiple of the 16-wide
// tensor-core fragment, and each width is a template instance with its own register and
// shared-memory budget.
inline constexpr bool FlashAttentionSupports(int64_t head_dim) {
  return head_dim == 64 || head_dim == 128;
}

// The switch: the fused bf16 path runs when ctx asks for bf16 matrix products and head_dim
// is supported. A null context (f32) never selects it.
bool UseFlashAttention(const DeviceContext* ctx, int64_t head_dim);

// The implementations, after kernels/attention.cc has checked the arguments (the shapes of
// kernels/attention.h). Backward needs `delta` (kernels/attention.cc computes it when the
// caller has none).
namespace cpu {
void FlashAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                           Tensor& lse, AttentionMask mask);
void FlashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                            const Tensor& dout, const Tensor& delta, Tensor& dq, Tensor& dk,
                            Tensor& dv, AttentionMask mask);
}  // namespace cpu

namespace cuda {
void FlashAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                           Tensor& lse, AttentionMask mask, DeviceContext* ctx);
void FlashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                            const Tensor& dout, const Tensor& delta, Tensor& dq, Tensor& dk,
                            Tensor& dv, AttentionMask mask, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
