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
// lse (B, Hq, S). Every matrix product is one cpu::Sgemm per (batch, head) straight on the
// (B, S, H, hd) layout (leading dimension H * hd). The CPU implementation is
// kernels/cpu/attention.cc; a CUDA tensor is a fatal check until the CUDA backend lands.
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

}  // namespace switchyard::kernels
