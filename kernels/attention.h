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
// Shapes (all f32, contiguous): q, out, dq (B, S, Hq, hd); k, v, dk, dv (B, S, Hkv, hd);
// lse (B, Hq, S). Every matrix product reads the (B, S, H, hd) layout in place (leading
// dimension H * hd), so no head is ever copied out. The CPU implementation
// (kernels/cpu/attention.cc) is one cpu::Sgemm per (batch, head); the CUDA one
// (kernels/cuda/attention.cu) is cuBLAS strided-batched GEMMs over the batch, one call per
// query head, with the (S, S) score matrices of a chunk of the batch in stream-ordered
// scratch, and row kernels for the causal softmax. Attention is f32 on both devices: its
// products run in f32 whatever DeviceContext::matmul_dtype says (the scores feed an exp).
#pragma once

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// out = causal attention of q over k, v; writes lse. Hq must be a multiple of Hkv.
void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      DeviceContext* ctx = nullptr);

// Gradients from dout (B, S, Hq, hd) given the forward's inputs and lse. dq, dk and dv are
// written (not accumulated); the Hq / Hkv query heads of a group sum into their key/value
// head's dk and dv.
void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                       DeviceContext* ctx = nullptr);

// The implementations, after kernels/attention.cc has checked the arguments.
namespace cpu {
void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse);
void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv);
}  // namespace cpu

namespace cuda {
void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      DeviceContext* ctx);
void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                       DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
