// Causal multi-head attention with grouped-query heads (MODEL.md section 1; Vaswani et al.
// 2017, GQA: Ainslie et al. 2023). Query head h reads key/value head h / (Hq / Hkv), so
// Hq = Hkv is ordinary multi-head attention and Hkv = 1 multi-query attention. For batch b
// and query head h, with scale = 1 / sqrt(hd):
//   s[i, j] = scale * q[b, i, h, :] . k[b, j, g, :]                   g = h / (Hq / Hkv)
//   p[i, :] = softmax over j <= i of s[i, j]   (j > i masked: p = 0), in f32
//   out[b, i, h, :] = sum_j p[i, j] v[b, j, g, :]
// Forward keeps the logsumexp of every score row, lse[b, h, i] = log sum_{j<=i} exp(s[i, j]),
// and Backward recomputes p = exp(s - lse) from q and k (the FlashAttention contract, so the
// CUDA kernel can keep the same activations); memory kept per micro-batch is B Hq S floats
// instead of B Hq S^2.
//
// Blocks of a larger softmax (ring attention, dense/ring_attention.h; Liu et al. 2023, and
// the online softmax of Milakov & Gimelshein 2018 / FlashAttention): when the keys of a
// query row are split into blocks, each block is one call here, and
//  - AttentionMask::kFull lets every query of the block see every key of it (a key block
//    wholly before the query block); kCausal is the diagonal block;
//  - AttentionMerge folds a block's (out_b, lse_b) into the running (out, lse), giving the
//    attention over the union of the blocks' keys;
//  - AttentionBackward with `delta` = AttentionBackwardDelta(out, dout) of the FINAL (merged)
//    out, and the FINAL lse, gives one block's share of dq and its keys' dk, dv:
//      p = exp(s - lse),  dp = dout v^T,  ds = p (dp - delta),  delta[i] = dout[i] . out[i]
//    (sum_j p[i, j] dp[i, j] = dout[i] . out[i] over the whole softmax), so the blocks' dq
//    sum to the whole softmax's dq. Without delta the block is the whole softmax.
//
// Shapes (all f32, contiguous): q, out, dq (B, S, Hq, hd); k, v, dk, dv (B, S, Hkv, hd);
// lse, delta (B, Hq, S). On the fused path (below) AttentionForward's out may be bf16 (its f32
// values rounded as stored: the output projection's operand under bf16 activation storage),
// and AttentionBackwardDelta reads such an out as f32 (widened: exact). Every matrix product reads the (B, S, H, hd) layout in place
// (leading dimension H * hd), so no head is ever copied out. The CPU implementation
// (kernels/cpu/attention.cc) is one cpu::Sgemm per (batch, head); the CUDA one
// (kernels/cuda/attention.cu) is cuBLAS strided-batched GEMMs over the batch, one call per
// query head, with the (S, S) score matrices of a chunk of the batch in stream-ordered
// scratch, and row kernels for the masked softmax. These are exact f32 on both devices.
// When DeviceContext::matmul_dtype is bf16 and hd is 64 or 128 (UseFlashAttention), the same
// calls run the fused bf16 path instead (kernels/flash_attention.h: the tensor-core kernel on
// CUDA, its twin on the CPU), with the same contract: lse out, delta and kFull blocks in.
#pragma once

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// Which keys of the block a query sees: kCausal, keys j <= i (the diagonal block, and plain
// causal attention); kFull, every key (a key block that lies wholly before the queries).
enum class AttentionMask { kCausal, kFull };

// out = attention of q over k, v under `mask`; writes lse. Hq must be a multiple of Hkv.
void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      DeviceContext* ctx = nullptr, AttentionMask mask = AttentionMask::kCausal);

// Gradients from dout (B, S, Hq, hd) given the forward's inputs and lse. dq, dk and dv are
// written (not accumulated); the Hq / Hkv query heads of a group sum into their key/value
// head's dk and dv. With `delta` defined ((B, Hq, S), AttentionBackwardDelta of the final
// out), q's rows belong to a softmax over more keys than this block's: lse must be that
// softmax's, and the results are this block's contributions (see the file comment).
void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                       DeviceContext* ctx = nullptr, AttentionMask mask = AttentionMask::kCausal,
                       const Tensor& delta = Tensor());

// delta (B, Hq, S) = rowsum(dout * out): delta[b, h, i] = sum_e dout[b, i, h, e] out[b, i, h, e]
// (out, dout (B, S, Hq, hd); summed in double on the CPU and the GPU).
void AttentionBackwardDelta(const Tensor& out, const Tensor& dout, Tensor& delta,
                            DeviceContext* ctx = nullptr);

// Online-softmax merge of a block into the running result, row by row (b, h, i):
//   lse' = log(exp(lse) + exp(lse_b)) = m + log1p(exp(n - m)),  m = max, n = min of the two
//   out' = out exp(lse - lse') + out_b exp(lse_b - lse')
// A row whose lse is -inf (no key seen yet) takes the block's out_b and lse_b as they are.
// out, out_b (B, S, Hq, hd); lse, lse_b (B, Hq, S); out and lse are updated in place.
void AttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                    DeviceContext* ctx = nullptr);

// The implementations, after kernels/attention.cc has checked the arguments. `delta` may be
// undefined (the block is the whole softmax).
namespace cpu {
void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      AttentionMask mask);
void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                       AttentionMask mask, const Tensor& delta);
void AttentionBackwardDelta(const Tensor& out, const Tensor& dout, Tensor& delta);
void AttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b);
}  // namespace cpu

namespace cuda {
void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      AttentionMask mask, DeviceContext* ctx);
void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                       AttentionMask mask, const Tensor& delta, DeviceContext* ctx);
void AttentionBackwardDelta(const Tensor& out, const Tensor& dout, Tensor& delta,
                            DeviceContext* ctx);
void AttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                    DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
