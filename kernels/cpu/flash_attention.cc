// CPU twin of the fused bf16 attention kernel (kernels/flash_attention.h,
// kernels/cuda/flash_attention.cu): the same blocks (kFlashBlockQ query rows x kFlashBlockK
// keys), the same rounding points (q, k, v, dout to bf16 once; p and ds to bf16 before
// their products), f32 accumulation, the same online-softmax order and formulas. Each block
// product is one cpu::Sgemm on the bf16-rounded f32 values, so the twin and the kernel differ
// only in f32 summation order inside a block product (and the last ulps of exp2: the kernel's
// is the hardware's approximate one), never in what is rounded where or in the arguments of
// exp2 (each an fma, kernels/flash_attention.h). The (B, S, H, hd) layout is read in place
// (leading dimension H hd).
//
// Backward is the kernel's two passes: per (batch, kv head, key block) dk and dv summed over
// the group's query heads and every query block that sees the keys; per (batch, query head,
// query block) dq over the key blocks it sees. Both recompute the tile's p and ds the same way
// (BackwardTile).
#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/thread_pool.h"
#include "kernels/flash_attention.h"
#include "kernels/gemm.h"

namespace switchyard::kernels::cpu {
namespace {

constexpr int64_t kBq = kFlashBlockQ, kBk = kFlashBlockK;

float RoundBf16(float x) { return BFloat16::ToFloat(BFloat16::FromFloat(x)); }

// t's values rounded to bf16 (kept as f32): an f32 t rounded, a bf16 t (q, k, v on the fused
// path may come in bf16) widened, which is exact.
std::vector<float> Rounded(const Tensor& t) {
  std::vector<float> out(static_cast<size_t>(t.numel()));
  if (t.dtype() == DType::kBF16) {
    const BFloat16* src = t.data<BFloat16>();
    for (int64_t i = 0; i < t.numel(); ++i) out[i] = BFloat16::ToFloat(src[i].bits);
    return out;
  }
  const float* src = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) out[i] = RoundBf16(src[i]);
  return out;
}

struct FlashDims {
  int64_t b, s, hq, hkv, hd;
  int64_t group() const { return hq / hkv; }
  int64_t ldq() const { return hq * hd; }    // row stride of q, out, dq, dout
  int64_t ldkv() const { return hkv * hd; }  // row stride of k, v, dk, dv
  int64_t q_blocks() const { return (s + kBq - 1) / kBq; }
  int64_t k_blocks() const { return (s + kBk - 1) / kBk; }
};

FlashDims DimsOf(const Tensor& q, const Tensor& k) {
  return {q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
}

// Whether query i sees key j (both < S).
bool Sees(AttentionMask mask, int64_t i, int64_t j) {
  return mask == AttentionMask::kFull || j <= i;
}

// Key blocks the query block starting at i0 visits, [0, n): under kCausal those holding a
// key <= its last row, so the blocks wholly above the diagonal are skipped.
int64_t KeyBlocksOf(const FlashDims& d, AttentionMask mask, int64_t i0) {
  const int64_t keys = mask == AttentionMask::kCausal ? std::min(d.s, i0 + kBq) : d.s;
  return (keys + kBk - 1) / kBk;
}

// First query block that sees a key of the block starting at j0.
int64_t FirstQueryBlockOf(AttentionMask mask, int64_t j0) {
  return mask == AttentionMask::kCausal ? j0 / kBq : 0;
}

// One (query block, key block) tile of the backward, (rows, keys) row-major with row stride
// kBk: s and dp scratch, p in bf16, ds = p (dp - delta) in bf16.
struct BackwardTile {
  std::vector<float> s = std::vector<float>(kBq * kBk), dp = s, p = s, ds = s;
};

// q, dout (rows, hd) at the block's first row (stride ldq), k, v (keys, hd) at its first key
// (stride ldkv), all bf16-rounded; lse, delta: the block's rows; c = FlashScaleLog2(hd).
void ComputeTile(const FlashDims& d, AttentionMask mask, float c, const float* q,
                 const float* dout, const float* k, const float* v, const float* lse,
                 const float* delta, int64_t i0, int64_t rows, int64_t j0, int64_t keys,
                 BackwardTile& t) {
  Sgemm(false, true, rows, keys, d.hd, 1.0f, q, d.ldq(), k, d.ldkv(), 0.0f, t.s.data(), kBk);
  Sgemm(false, true, rows, keys, d.hd, 1.0f, dout, d.ldq(), v, d.ldkv(), 0.0f, t.dp.data(), kBk);
  for (int64_t r = 0; r < rows; ++r) {
    const float lse2 = lse[r] * kLog2e;
    for (int64_t j = 0; j < keys; ++j) {
      const int64_t at = r * kBk + j;
      const float p = Sees(mask, i0 + r, j0 + j) ? std::exp2(std::fma(t.s[at], c, -lse2)) : 0.0f;
      t.p[at] = RoundBf16(p);
      t.ds[at] = RoundBf16(p * (t.dp[at] - delta[r]));
    }
  }
}

}  // namespace

void FlashAttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out,
                           Tensor& lse, AttentionMask mask) {
  const FlashDims d = DimsOf(q, k);
  if (d.b == 0 || d.s == 0 || d.hq == 0) return;
  const float scale = FlashScale(d.hd), c = FlashScaleLog2(d.hd);
  const std::vector<float> qr = Rounded(q), kr = Rounded(k), vr = Rounded(v);
  const int64_t hd = d.hd, tasks = d.b * d.hq * d.q_blocks();
  ParallelFor(tasks, 1, [&](int64_t t0, int64_t t1) {
    std::vector<float> sc(kBq * kBk), p(kBq * kBk), pv(kBq * hd), acc(kBq * hd);
    std::vector<float> m(kBq), l(kBq), alpha(kBq);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t qb = task % d.q_blocks(), h = (task / d.q_blocks()) % d.hq;
      const int64_t b = task / (d.q_blocks() * d.hq), g = h / d.group();
      const int64_t i0 = qb * kBq, rows = std::min(d.s, i0 + kBq) - i0;
      const float* qp = qr.data() + (b * d.s + i0) * d.ldq() + h * hd;
      const float* kp = kr.data() + b * d.s * d.ldkv() + g * hd;
      const float* vp = vr.data() + b * d.s * d.ldkv() + g * hd;
      std::fill(m.begin(), m.end(), -INFINITY);
      std::fill(l.begin(), l.end(), 0.0f);
      std::fill(acc.begin(), acc.end(), 0.0f);
      for (int64_t kb = 0; kb < KeyBlocksOf(d, mask, i0); ++kb) {
        const int64_t j0 = kb * kBk, keys = std::min(d.s, j0 + kBk) - j0;
        // Scores (rows, keys) = q^ k^T, masked; the softmax in base 2 on them.
        Sgemm(false, true, rows, keys, hd, 1.0f, qp, d.ldq(), kp + j0 * d.ldkv(), d.ldkv(), 0.0f,
              sc.data(), kBk);
        for (int64_t r = 0; r < rows; ++r) {
          float* srow = sc.data() + r * kBk;
          float block_max = -INFINITY;
          for (int64_t j = 0; j < keys; ++j) {
            if (!Sees(mask, i0 + r, j0 + j)) srow[j] = -INFINITY;
            block_max = std::max(block_max, srow[j]);
          }
          const float m_new = std::max(m[r], block_max);
          const bool none = m_new == -INFINITY;  // a row with no key yet
          const float mc = none ? 0.0f : m_new * c;
          alpha[r] = none ? 0.0f : std::exp2((m[r] - m_new) * c);
          float row_sum = 0.0f;
          for (int64_t j = 0; j < keys; ++j) {
            const float e = std::exp2(std::fma(srow[j], c, -mc));
            row_sum += e;
            p[r * kBk + j] = RoundBf16(e);
          }
          l[r] = l[r] * alpha[r] + row_sum;
          m[r] = m_new;
        }
        // pv (rows, hd) = bf16(p) v^; acc = acc alpha + pv.
        Sgemm(false, false, rows, hd, keys, 1.0f, p.data(), kBk, vp + j0 * d.ldkv(), d.ldkv(),
              0.0f, pv.data(), hd);
        for (int64_t r = 0; r < rows; ++r) {
          for (int64_t e = 0; e < hd; ++e) {
            acc[r * hd + e] = acc[r * hd + e] * alpha[r] + pv[r * hd + e];
          }
        }
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* orow = out.data<float>() + (b * d.s + i0 + r) * d.ldq() + h * hd;
        for (int64_t e = 0; e < hd; ++e) orow[e] = acc[r * hd + e] / l[r];
        lse.data<float>()[(b * d.hq + h) * d.s + i0 + r] = m[r] * scale + std::log(l[r]);
      }
    }
  });
}

void FlashAttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                            const Tensor& dout, const Tensor& delta, Tensor& dq, Tensor& dk,
                            Tensor& dv, AttentionMask mask) {
  const FlashDims d = DimsOf(q, k);
  if (d.b == 0 || d.s == 0) return;
  if (d.hq == 0) {  // no query head reads k or v
    dk.SetZero();
    dv.SetZero();
    return;
  }
  const float scale = FlashScale(d.hd), c = FlashScaleLog2(d.hd);
  const int64_t hd = d.hd;
  const std::vector<float> qr = Rounded(q), kr = Rounded(k), vr = Rounded(v),
                           dor = Rounded(dout);
  const float* pl = lse.data<float>();
  const float* pd = delta.data<float>();
  // Pass 1, per (b, kv head g, key block): dv = sum bf16(p)^T do^, dk = scale sum bf16(ds)^T q^
  // over the group's query heads, then the query blocks in order.
  ParallelFor(d.b * d.hkv * d.k_blocks(), 1, [&](int64_t t0, int64_t t1) {
    BackwardTile tile;
    std::vector<float> dk_acc(kBk * hd), dv_acc(kBk * hd);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t kb = task % d.k_blocks(), g = (task / d.k_blocks()) % d.hkv;
      const int64_t b = task / (d.k_blocks() * d.hkv);
      const int64_t j0 = kb * kBk, keys = std::min(d.s, j0 + kBk) - j0;
      const float* kp = kr.data() + (b * d.s + j0) * d.ldkv() + g * hd;
      const float* vp = vr.data() + (b * d.s + j0) * d.ldkv() + g * hd;
      std::fill(dk_acc.begin(), dk_acc.end(), 0.0f);
      std::fill(dv_acc.begin(), dv_acc.end(), 0.0f);
      for (int64_t h = g * d.group(); h < (g + 1) * d.group(); ++h) {
        for (int64_t qb = FirstQueryBlockOf(mask, j0); qb < d.q_blocks(); ++qb) {
          const int64_t i0 = qb * kBq, rows = std::min(d.s, i0 + kBq) - i0;
          const int64_t qoff = (b * d.s + i0) * d.ldq() + h * hd, loff = (b * d.hq + h) * d.s + i0;
          ComputeTile(d, mask, c, qr.data() + qoff, dor.data() + qoff, kp, vp, pl + loff,
                      pd + loff, i0, rows, j0, keys, tile);
          Sgemm(true, false, keys, hd, rows, 1.0f, tile.p.data(), kBk, dor.data() + qoff,
                d.ldq(), 1.0f, dv_acc.data(), hd);
          Sgemm(true, false, keys, hd, rows, 1.0f, tile.ds.data(), kBk, qr.data() + qoff,
                d.ldq(), 1.0f, dk_acc.data(), hd);
        }
      }
      for (int64_t j = 0; j < keys; ++j) {
        const int64_t at = (b * d.s + j0 + j) * d.ldkv() + g * hd;
        for (int64_t e = 0; e < hd; ++e) {
          dk.data<float>()[at + e] = dk_acc[j * hd + e] * scale;
          dv.data<float>()[at + e] = dv_acc[j * hd + e];
        }
      }
    }
  });
  // Pass 2, per (b, query head h, query block): dq = scale sum bf16(ds) k^ over its key blocks.
  ParallelFor(d.b * d.hq * d.q_blocks(), 1, [&](int64_t t0, int64_t t1) {
    BackwardTile tile;
    std::vector<float> dq_acc(kBq * hd);
    for (int64_t task = t0; task < t1; ++task) {
      const int64_t qb = task % d.q_blocks(), h = (task / d.q_blocks()) % d.hq;
      const int64_t b = task / (d.q_blocks() * d.hq), g = h / d.group();
      const int64_t i0 = qb * kBq, rows = std::min(d.s, i0 + kBq) - i0;
      const int64_t qoff = (b * d.s + i0) * d.ldq() + h * hd, loff = (b * d.hq + h) * d.s + i0;
      std::fill(dq_acc.begin(), dq_acc.end(), 0.0f);
      for (int64_t kb = 0; kb < KeyBlocksOf(d, mask, i0); ++kb) {
        const int64_t j0 = kb * kBk, keys = std::min(d.s, j0 + kBk) - j0;
        const float* kp = kr.data() + (b * d.s + j0) * d.ldkv() + g * hd;
        const float* vp = vr.data() + (b * d.s + j0) * d.ldkv() + g * hd;
        ComputeTile(d, mask, c, qr.data() + qoff, dor.data() + qoff, kp, vp, pl + loff,
                    pd + loff, i0, rows, j0, keys, tile);
        Sgemm(false, false, rows, hd, keys, 1.0f, tile.ds.data(), kBk, kp, d.ldkv(), 1.0f,
              dq_acc.data(), hd);
      }
      for (int64_t r = 0; r < rows; ++r) {
        float* row = dq.data<float>() + qoff + r * d.ldq();
        for (int64_t e = 0; e < hd; ++e) row[e] = dq_acc[r * hd + e] * scale;
      }
    }
  });
}

}  // namespace switchyard::kernels::cpu
