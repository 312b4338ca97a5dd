// CUDA implementation of kernels/attention.h, correct first: the (S, S) score matrices of a
// chunk of the batch are materialised in stream-ordered scratch (nb, Hq, S, S) and every
// product is a cuBLAS f32 strided-batched GEMM straight on the (B, S, H, hd) layout
// (leading dimension H * hd), batched over the batch elements of the chunk, one call per
// query head (head h reads kv head h / (Hq / Hkv), which no single stride can express).
// Row kernels do the masked softmax (forward) and its backward (kCausal: row i sees keys
// j <= i; kFull: every key). Backward recomputes the probabilities from lse, takes the
// softmax-backward row sum from `delta` when given (a block of a larger softmax), and sums
// the Hq / Hkv query heads of a group into their kv head's dk and dv through GEMM beta: the
// group's first head writes (beta = 0), the rest add. AttentionBackwardDelta and
// AttentionMerge are one warp per (b, i, h) row. The device code is in
// kernels/cuda/attention_kernels.cuh.
#include <algorithm>
#include <climits>
#include <cmath>

#include "kernels/attention.h"
#include "kernels/cuda/attention_kernels.cuh"
#include "kernels/cuda/common.cuh"

namespace switchyard::kernels::cuda {
namespace {

namespace ad = attention_dev;

// Score scratch a call aims for: the batch is processed in chunks of batch elements whose
// (Hq, S, S) matrices fit in this many bytes (at least one element at a time).
constexpr int64_t kScratchBytes = int64_t{1} << 30;

struct Dims {
  int64_t b, s, hq, hkv, hd;
  int64_t group() const { return hq / hkv; }
  int64_t ldq() const { return hq * hd; }     // row stride of q, out, dq, dout
  int64_t ldkv() const { return hkv * hd; }   // row stride of k, v, dk, dv
  int64_t per_b() const { return hq * s * s; }  // score elements per batch element
};

Dims DimsOf(const Tensor& q, const Tensor& k) {
  return {q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
}

int Int(int64_t v, const char* what) {
  SY_CHECK(v >= 0 && v <= INT_MAX) << "attention: " << what << " = " << v
                                   << " does not fit a 32-bit int";
  return static_cast<int>(v);
}

// Batch elements per chunk when every element needs `matrices` (Hq, S, S) f32 buffers.
int64_t ChunkOf(const Dims& d, int64_t matrices) {
  const int64_t bytes = d.per_b() * matrices * static_cast<int64_t>(sizeof(float));
  return std::clamp<int64_t>(kScratchBytes / std::max<int64_t>(bytes, 1), 1, d.b);
}

// Row-major f32 strided-batched GEMM: for t in [0, batch),
//   c_t (m, n) = alpha op(a_t) op(b_t) + beta c_t,   x_t = x + t * stride_x,
// as the column-major c_t^T = op(b_t)^T op(a_t)^T (operands swapped, no data moved).
void BatchedGemm(DeviceContext* ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                 int64_t k, float alpha, const float* a, int64_t lda, int64_t stride_a,
                 const float* b, int64_t ldb, int64_t stride_b, float beta, float* c,
                 int64_t ldc, int64_t stride_c, int64_t batch) {
  SY_CUBLAS_CHECK(Cublas().GemmStridedBatchedEx(
      CublasOf(ctx), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N, trans_a ? CUBLAS_OP_T : CUBLAS_OP_N,
      Int(n, "n"), Int(m, "m"), Int(k, "k"), &alpha, b, CUDA_R_32F, Int(ldb, "ldb"), stride_b, a,
      CUDA_R_32F, Int(lda, "lda"), stride_a, &beta, c, CUDA_R_32F, Int(ldc, "ldc"), stride_c,
      Int(batch, "batch"), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

// Scores of the chunk's batch elements [b0, b0 + nb): p (nb, Hq, S, S) = scale q k^T, per
// query head one batched GEMM (S, hd) @ (hd, S) over the nb elements.
void Scores(const Dims& d, const float* q, const float* k, int64_t b0, int64_t nb, float scale,
            float* p, DeviceContext* ctx) {
  const int64_t s = d.s, hd = d.hd;
  for (int64_t h = 0; h < d.hq; ++h) {
    const int64_t g = h / d.group();
    BatchedGemm(ctx, false, true, s, s, hd, scale, q + b0 * s * d.ldq() + h * hd, d.ldq(),
                s * d.ldq(), k + b0 * s * d.ldkv() + g * hd, d.ldkv(), s * d.ldkv(), 0.0f,
                p + h * s * s, s, d.per_b(), nb);
  }
}

}  // namespace

void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      AttentionMask mask, DeviceContext* ctx) {
  const Dims d = DimsOf(q, k);
  if (d.b == 0 || d.s == 0 || d.hq == 0) return;
  const int64_t s = d.s, hd = d.hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const bool causal = mask == AttentionMask::kCausal;
  const int64_t chunk = ChunkOf(d, 1);
  Tensor scratch = Tensor::Empty({chunk * d.per_b()}, DType::kF32, q.device());
  float* p = scratch.data<float>();
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  float* po = out.data<float>();
  float* pl = lse.data<float>();
  for (int64_t b0 = 0; b0 < d.b; b0 += chunk) {
    const int64_t nb = std::min(chunk, d.b - b0);
    Scores(d, pq, pk, b0, nb, scale, p, ctx);
    const int64_t rows = nb * d.hq * s;
    ad::MaskedSoftmaxKernel<<<Int(rows, "score rows"), ad::RowThreads(s), 0, StreamOf(ctx)>>>(
        p, pl + b0 * d.hq * s, s, causal);
    SY_CUDA_CHECK_LAUNCH();
    // out (S, hd) = p (S, S) @ v (S, hd), per query head over the chunk.
    for (int64_t h = 0; h < d.hq; ++h) {
      const int64_t g = h / d.group();
      BatchedGemm(ctx, false, false, s, hd, s, 1.0f, p + h * s * s, s, d.per_b(),
                  pv + b0 * s * d.ldkv() + g * hd, d.ldkv(), s * d.ldkv(), 0.0f,
                  po + b0 * s * d.ldq() + h * hd, d.ldq(), s * d.ldq(), nb);
    }
  }
}

void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                       AttentionMask mask, const Tensor& delta, DeviceContext* ctx) {
  const Dims d = DimsOf(q, k);
  if (d.b == 0 || d.s == 0) return;
  if (d.hq == 0) {  // no query head reads k or v: dk = dv = 0 (written, as on the CPU)
    dk.SetZero(ctx);
    dv.SetZero(ctx);
    return;
  }
  const int64_t s = d.s, hd = d.hd, group = d.group();
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  const bool causal = mask == AttentionMask::kCausal;
  const int64_t chunk = ChunkOf(d, 2);
  Tensor scratch = Tensor::Empty({2 * chunk * d.per_b()}, DType::kF32, q.device());
  float* p = scratch.data<float>();        // (nb, Hq, S, S) probabilities
  float* dp = p + chunk * d.per_b();       // (nb, Hq, S, S) dp, then ds in place
  const float* pq = q.data<float>();
  const float* pk = k.data<float>();
  const float* pv = v.data<float>();
  const float* pdo = dout.data<float>();
  const float* pl = lse.data<float>();
  const float* pdelta = delta.defined() ? delta.data<float>() : nullptr;
  float* pdq = dq.data<float>();
  float* pdk = dk.data<float>();
  float* pdv = dv.data<float>();
  for (int64_t b0 = 0; b0 < d.b; b0 += chunk) {
    const int64_t nb = std::min(chunk, d.b - b0);
    const int64_t rows = nb * d.hq * s;
    // p = exp(scale q k^T - lse), masked.
    Scores(d, pq, pk, b0, nb, scale, p, ctx);
    ad::MaskedExpKernel<<<GridFor(rows * s, ad::kThreads), ad::kThreads, 0, StreamOf(ctx)>>>(
        p, pl + b0 * d.hq * s, s, rows * s, causal);
    SY_CUDA_CHECK_LAUNCH();
    // dp (S, S) = dout (S, hd) @ v^T (hd, S).
    for (int64_t h = 0; h < d.hq; ++h) {
      const int64_t g = h / group;
      BatchedGemm(ctx, false, true, s, s, hd, 1.0f, pdo + b0 * s * d.ldq() + h * hd, d.ldq(),
                  s * d.ldq(), pv + b0 * s * d.ldkv() + g * hd, d.ldkv(), s * d.ldkv(), 0.0f,
                  dp + h * s * s, s, d.per_b(), nb);
    }
    ad::MaskedSoftmaxBackwardKernel<<<Int(rows, "score rows"), ad::RowThreads(s), 0,
                                      StreamOf(ctx)>>>(
        p, dp, pdelta == nullptr ? nullptr : pdelta + b0 * d.hq * s, s, causal);
    SY_CUDA_CHECK_LAUNCH();
    for (int64_t h = 0; h < d.hq; ++h) {
      const int64_t g = h / group;
      // The group's first query head writes dk and dv; the others add to them.
      const float beta_kv = h % group == 0 ? 0.0f : 1.0f;
      const float* p_h = p + h * s * s;
      const float* ds_h = dp + h * s * s;
      // dv (S, hd) += p^T (S, S) @ dout (S, hd).
      BatchedGemm(ctx, true, false, s, hd, s, 1.0f, p_h, s, d.per_b(),
                  pdo + b0 * s * d.ldq() + h * hd, d.ldq(), s * d.ldq(), beta_kv,
                  pdv + b0 * s * d.ldkv() + g * hd, d.ldkv(), s * d.ldkv(), nb);
      // dq (S, hd) = scale ds (S, S) @ k (S, hd).
      BatchedGemm(ctx, false, false, s, hd, s, scale, ds_h, s, d.per_b(),
                  pk + b0 * s * d.ldkv() + g * hd, d.ldkv(), s * d.ldkv(), 0.0f,
                  pdq + b0 * s * d.ldq() + h * hd, d.ldq(), s * d.ldq(), nb);
      // dk (S, hd) += scale ds^T (S, S) @ q (S, hd).
      BatchedGemm(ctx, true, false, s, hd, s, scale, ds_h, s, d.per_b(),
                  pq + b0 * s * d.ldq() + h * hd, d.ldq(), s * d.ldq(), beta_kv,
                  pdk + b0 * s * d.ldkv() + g * hd, d.ldkv(), s * d.ldkv(), nb);
    }
  }
}

void AttentionBackwardDelta(const Tensor& out, const Tensor& dout, Tensor& delta,
                            DeviceContext* ctx) {
  const int64_t s = out.dim(1), hq = out.dim(2), hd = out.dim(3);
  const int64_t rows = out.dim(0) * s * hq;
  if (rows == 0) return;
  const int64_t blocks = (rows + ad::kWarpsPerBlock - 1) / ad::kWarpsPerBlock;
  WithF32OrBf16(out, [&](auto* op) {
    ad::DeltaKernel<<<Int(blocks, "delta blocks"), 32 * ad::kWarpsPerBlock, 0, StreamOf(ctx)>>>(
        op, dout.data<float>(), delta.data<float>(), s, hq, hd, rows);
  });
  SY_CUDA_CHECK_LAUNCH();
}

void AttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                    DeviceContext* ctx) {
  const int64_t s = out.dim(1), hq = out.dim(2), hd = out.dim(3);
  const int64_t rows = out.dim(0) * s * hq;
  if (rows == 0) return;
  const int64_t blocks = (rows + ad::kWarpsPerBlock - 1) / ad::kWarpsPerBlock;
  ad::MergeKernel<<<Int(blocks, "merge blocks"), 32 * ad::kWarpsPerBlock, 0, StreamOf(ctx)>>>(
      out.data<float>(), lse.data<float>(), out_b.data<float>(), lse_b.data<float>(), s, hq, hd,
      rows);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
