// Matrix products. Row-major throughout; `x @ W` with W stored (in, out) as in MODEL.md.
// The CPU implementation calls OpenBLAS sgemm (f32); the CUDA one (cuBLAS, bf16 inputs with
// f32 accumulation) lands with the CUDA backend.
#pragma once

#include <cstdint>
#include <span>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// c (m, n) = alpha * op(a) @ op(b) + beta * c, where op(a) is (m, k) — a is (m, k), or
// (k, m) when trans_a — and op(b) is (k, n) — b is (k, n), or (n, k) when trans_b.
// All three are 2-d contiguous f32 tensors on the same device.
void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
          float alpha = 1.0f, float beta = 0.0f, DeviceContext* ctx = nullptr);

// Grouped products over contiguous row blocks, one weight matrix per group (the expert
// GEMMs). Rows of x are split into consecutive blocks of rows[g] rows (sum = x.dim(0)).
//   out[block g] (rows[g], n) = alpha * x[block g] (rows[g], k) @ op(w[g]) + beta * out[block g]
// w: (G, k, n), or (G, n, k) when trans_w. Groups with zero rows are skipped.
void GroupedGemm(const Tensor& x, std::span<const int64_t> rows, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha = 1.0f, float beta = 0.0f,
                 DeviceContext* ctx = nullptr);

// Grouped weight gradients: for every group g,
//   dw[g] (k, n) = alpha * x[block g]^T (k, rows[g]) @ dy[block g] (rows[g], n) + beta * dw[g]
// x: (R, k), dy: (R, n), dw: (G, k, n). A group with zero rows gets dw[g] = beta * dw[g].
void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> rows,
                           Tensor& dw, float alpha = 1.0f, float beta = 0.0f,
                           DeviceContext* ctx = nullptr);

namespace cpu {
// Plain row-major sgemm on raw pointers (leading dimensions in elements).
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);
}  // namespace cpu

}  // namespace switchyard::kernels
