// Matrix products. Row-major throughout; `x @ W` with W stored (in, out) as in MODEL.md.
// The CPU implementation calls OpenBLAS sgemm (kernels/cpu/gemm.cc); the CUDA one cuBLAS
// (kernels/cuda/gemm.cu, cublasGemmEx; row-major C = op(A) op(B) is computed as the
// column-major C^T = op(B)^T op(A)^T, so no data is ever transposed).
//
// Precision (MODEL.md section 1, DeviceContext::matmul_dtype): the output c is f32, or bf16
// for a product in bf16 mode with beta 0 (below).
//  - kF32 (the default, and a null context): f32 inputs, f32 products and sums (cuBLAS
//    CUBLAS_COMPUTE_32F, no TF32), so the GPU matches the CPU to f32 rounding.
//  - kBF16: both operands are rounded to bf16 (round to nearest even, engine/core/dtype.h)
//    and the products are summed in f32. The CPU rounds copies of the operands and calls
//    sgemm, so it is the exact-rounding reference of the GPU's bf16 mode; the two differ
//    only in summation order.
// Operands may also be bf16 tensors already (weights kept in bf16): they are read as they
// are, and a product with any bf16 operand runs in bf16 mode whatever the context says
// (the other operand is rounded too).
// A bf16 c (Gemm and GemmBias, bf16 mode, beta 0): the f32 result (the sums, alpha, the
// bias) rounded once to bf16, round to nearest even: the bits of the f32 product then Cast,
// with no f32 c in memory on CUDA (cuBLAS writes bf16 from its f32 accumulators) and no
// conversion counted. The producer of a bf16 operand (attention's q, k and v projections)
// writes it so.
#pragma once

#include <cstdint>
#include <span>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// c (m, n) = alpha * op(a) @ op(b) + beta * c, where op(a) is (m, k) — a is (m, k), or
// (k, m) when trans_a — and op(b) is (k, n) — b is (k, n), or (n, k) when trans_b.
// a and b: 2-d f32 or bf16; c: 2-d f32, or bf16 in bf16 mode with beta 0; all on one device.
// k = 0 gives c = beta * c; beta = 0 never reads c (NaN in c is overwritten).
void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c,
          float alpha = 1.0f, float beta = 0.0f, DeviceContext* ctx = nullptr);

// c (m, n) = op(a) @ op(b) + bias (n) on every row (alpha 1, beta 0): a Linear layer's
// forward. On the CPU Gemm then AddBias (the same bits). On CUDA one cuBLASLt product with
// the bias added in its epilogue (one pass over c fewer; its sums may run in another order
// than Gemm's, within the same bound of the exact product), or Gemm then AddBias where
// cuBLASLt offers no algorithm for the shape (said once) or SWITCHYARD_CUBLASLT=0 asks so.
// A bf16 c (bf16 mode) holds the f32 op(a) @ op(b) + bias rounded once (see above).
void GemmBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
              Tensor& c, DeviceContext* ctx = nullptr);

// How the CPU runs the groups of a grouped product: each group's product whole on one
// compute thread, the groups spread over the threads (kWhole), or the groups one after
// another with each large product split over the threads (kSplit). A product's last bits
// can depend on which (OpenBLAS may pick another kernel for a block of it than for the
// whole). kAuto decides from the call's own `rows` (GroupScheduleFor). A call that computes
// some of a set's groups (the others given zero rows) under GroupScheduleFor(the whole
// set's rows) gives each of them the bits the call over the whole set gives it: the MoE
// layer's overlap chunks (moe/overlap.h). CUDA ignores it (cuBLAS runs each group alone).
enum class GroupSchedule { kAuto, kWhole, kSplit };

// The schedule kAuto picks for these rows on this thread: kWhole when there are several
// groups, several compute threads (outside a parallel region) and no group holds more than
// one thread's share of the rows; else kSplit.
GroupSchedule GroupScheduleFor(std::span<const int64_t> rows);

// `t` (f32) as the matrix products in ctx's precision read it: t itself in f32 mode (a null
// ctx, or t bf16 already, or empty), else a bf16 copy of it (one conversion). Pass it to
// every product that reads the same operand (a layer's incoming gradient: the weight
// gradient's product and the input gradient's) to convert it once instead of once per
// product; the products see the same bf16 values either way.
Tensor MatmulOperand(const Tensor& t, DeviceContext* ctx = nullptr);
// MatmulOperand(dy) with BiasGrad(dy, dbias, beta) (kernels/activation.h) in the same pass
// over dy where it converts (kernels::BiasGradCast): a Linear layer's incoming gradient as
// its products' operand beside its bias gradient. The same bits as the two calls.
Tensor MatmulOperandWithBiasGrad(const Tensor& dy, Tensor& dbias, float beta,
                                 DeviceContext* ctx = nullptr);
// The dtype of MatmulOperand's result for an f32 tensor: bf16 in bf16 mode, else f32. A
// producer that can write its output in it (the activations' backward ops) hands the products
// their operand with no conversion at all.
DType MatmulOperandDType(const DeviceContext* ctx);

// Grouped products over contiguous row blocks, one weight matrix per group (the expert
// GEMMs). Rows of x are split into consecutive blocks of rows[g] rows (sum = x.dim(0));
// `rows` is on the host.
//   out[block g] (rows[g], n) = alpha * x[block g] (rows[g], k) @ op(w[g]) + beta * out[block g]
// w: (G, k, n), or (G, n, k) when trans_w. Groups with zero rows are skipped. x and w: f32
// or bf16; out: f32.
void GroupedGemm(const Tensor& x, std::span<const int64_t> rows, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha = 1.0f, float beta = 0.0f,
                 DeviceContext* ctx = nullptr, GroupSchedule schedule = GroupSchedule::kAuto);

// Grouped weight gradients: for every group g,
//   dw[g] (k, n) = alpha * x[block g]^T (k, rows[g]) @ dy[block g] (rows[g], n) + beta * dw[g]
// x: (R, k), dy: (R, n) (f32 or bf16), dw: (G, k, n) f32. A group with zero rows gets
// dw[g] = beta * dw[g].
void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> rows,
                           Tensor& dw, float alpha = 1.0f, float beta = 0.0f,
                           DeviceContext* ctx = nullptr,
                           GroupSchedule schedule = GroupSchedule::kAuto);

// The same grouped products with the blocks sized on the device (the MoE layer's dropless
// experts on one expert-parallel rank: no host wait for the dispatch counts). `offsets`
// (G + 1) i64 on out's device: offsets[0] = 0, nondecreasing, offsets[G] <= x.dim(0); group
// g is rows [offsets[g], offsets[g + 1]). Rows from offsets[G] on belong to no group: out's
// are not written, and none adds to dw. The host never reads the offsets on CUDA (one
// tiled kernel reads them, kernels/cuda/grouped_gemm.cu; an out-of-range offset is the
// caller's bug, as an index is for GatherRows); the CPU reads them where they are and runs
// the host-sized product on those rows, bit for bit. In bf16 mode CUDA rounds f32 operands
// to bf16 as it loads them (no converted copy): the same bf16 values, summed in f32.
void GroupedGemm(const Tensor& x, const Tensor& offsets, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha = 1.0f, float beta = 0.0f,
                 DeviceContext* ctx = nullptr);
// The device-sized product with W1's bias and GELU applied as it is written (the experts'
// first projection under bf16 activation storage): for the groups' rows, a = x @ w[g] (f32,
// GroupedGemm's bits), z = a + bias[g], kept = bf16(z), h = bf16(gelu(z)): the bits of
// GroupedGemm then GroupedBiasGeluForward with KeptRounded (kernels/activation.h), without an
// f32 a in memory. CUDA writes them from the product's tiles (one kernel instead of two, and
// (R, n) f32 neither written nor read back); the CPU runs the two ops. Rows past the groups
// are not read by anything: CUDA leaves them, the CPU's ops write there what the unfused ops
// do. x (R, k), w (G, k, n): f32 or bf16; bias (G, n) f32; h and kept (R, n) bf16.
void GroupedGemmBiasGelu(const Tensor& x, const Tensor& offsets, const Tensor& w,
                         const Tensor& bias, Tensor& h, Tensor& kept,
                         DeviceContext* ctx = nullptr);
// dw[g] (k, n) = alpha * x[group g]^T @ dy[group g] + beta * dw[g], groups as above; a group
// with no rows gets beta * dw[g].
void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                           float alpha = 1.0f, float beta = 0.0f, DeviceContext* ctx = nullptr);

// c (m, n) = a (m, k) @ b (k, n), f32 only, row by row: c[i][j] is the sum over p = 0, 1,
// ..., k - 1, in that order, of the f32 products a[i][p] * b[p][j], each product rounded
// before it is added (no fused multiply-add), starting from +0. So a row's bits depend only
// on that row of a and on b: not on m, on which other rows share the call, on the CPU's BLAS
// kernels, or on the device (CPU and CUDA give the same bits). The router's logits use it
// (MODEL.md section 4: routing is a pure function of the router input), since an optimized
// sgemm may round a row differently when it is one of 64 rows than when it is one of 16.
// k = 0 gives zeros.
void RowExactGemm(const Tensor& a, const Tensor& b, Tensor& c, DeviceContext* ctx = nullptr);

// The implementations, after kernels/gemm.cc has checked the arguments. `matmul_dtype` is
// the resolved precision: kBF16 when the context asks for it or an operand is bf16.
namespace cpu {
void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
          float beta, DType matmul_dtype);
void GroupedGemm(const Tensor& x, std::span<const int64_t> rows, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha, float beta, DType matmul_dtype,
                 GroupSchedule schedule);
void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> rows,
                           Tensor& dw, float alpha, float beta, DType matmul_dtype,
                           GroupSchedule schedule);
GroupSchedule GroupScheduleFor(std::span<const int64_t> rows);

void RowExactGemm(const Tensor& a, const Tensor& b, Tensor& c);

// Plain row-major sgemm on raw pointers (leading dimensions in elements).
void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);
}  // namespace cpu

namespace cuda {
void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
          float beta, DType matmul_dtype, DeviceContext* ctx);
void GemmBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
              Tensor& c, DType matmul_dtype, DeviceContext* ctx);
void GroupedGemm(const Tensor& x, std::span<const int64_t> rows, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha, float beta, DType matmul_dtype, DeviceContext* ctx);
void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> rows,
                           Tensor& dw, float alpha, float beta, DType matmul_dtype,
                           DeviceContext* ctx);
void RowExactGemm(const Tensor& a, const Tensor& b, Tensor& c, DeviceContext* ctx);
// The device-sized grouped products (kernels/cuda/grouped_gemm.cu). x, w, dy: f32 or bf16
// (bf16 mode: f32 ones rounded to bf16 as they are loaded), out and dw f32.
void GroupedGemm(const Tensor& x, const Tensor& offsets, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha, float beta, DType matmul_dtype, DeviceContext* ctx);
void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                           float alpha, float beta, DType matmul_dtype, DeviceContext* ctx);
void GroupedGemmBiasGelu(const Tensor& x, const Tensor& offsets, const Tensor& w,
                         const Tensor& bias, Tensor& h, Tensor& kept, DType matmul_dtype,
                         DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
