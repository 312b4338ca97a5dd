// CPU reference implementation of kernels/attention.h. For every (batch, query head) and
// block of query rows: the block's scores against the keys it can see by one sgemm, the
// masked row softmax in place, then the block's output by a second sgemm; Backward
// recomputes the probabilities from lse. The (B, S, H, hd) layout is
// read in place with leading dimension H * hd, so no head is ever copied out. Row i sees the
// keys j < Visible(i): i + 1 under kCausal, S under kFull.
#include "kernels/attention.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/thread_pool.h"
#include "kernels/cpu/rows.h"
#include "kernels/gemm.h"
#include "kernels/softmax.h"

namespace switchyard::kernels::cpu {
namespace {

struct Dims {
  int64_t b, s, hq, hkv, hd;
  int64_t group() const { return hq / hkv; }
};

// Keys query row i sees: j in [0, Visible(i)).
int64_t Visible(AttentionMask mask, int64_t i, int64_t s) {
  return mask == AttentionMask::kCausal ? i + 1 : s;
}

// Query rows are taken in blocks of kQueryBlock under kCausal: block [i0, i1) only sees the
// keys [0, i1), so the products skip the masked corner above the diagonal blocks. Under
// kFull the one block is every row and every key.
constexpr int64_t kQueryBlock = 64;
int64_t QueryBlock(AttentionMask mask, int64_t s) {
  return mask == AttentionMask::kCausal ? kQueryBlock : std::max<int64_t>(1, s);
}
int64_t KeysOf(AttentionMask mask, int64_t i1, int64_t s) {
  return mask == AttentionMask::kCausal ? i1 : s;
}

}  // namespace

void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      AttentionMask mask) {
  const int64_t s = q.dim(1), hd = q.dim(3);
  const Dims d{q.dim(0), s, q.dim(2), k.dim(2), hd};
  const int64_t ldq = d.hq * hd, ldkv = d.hkv * hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  ParallelFor(d.b * d.hkv, 1, [&](int64_t pair0, int64_t pair1) {
  std::vector<float> p(static_cast<size_t>(s * s));  // (S, S) scores, then probabilities
  for (int64_t pair = pair0; pair < pair1; ++pair) {
    const int64_t b = pair / d.hkv, g = pair % d.hkv;
    for (int64_t h = g * d.group(); h < (g + 1) * d.group(); ++h) {
      const float* qbh = q.data<float>() + b * s * ldq + h * hd;
      const float* kbg = k.data<float>() + b * s * ldkv + g * hd;
      const float* vbg = v.data<float>() + b * s * ldkv + g * hd;
      float* obh = out.data<float>() + b * s * ldq + h * hd;
      float* lbh = lse.data<float>() + (b * d.hq + h) * s;
      for (int64_t i0 = 0; i0 < s; i0 += QueryBlock(mask, s)) {
        const int64_t i1 = std::min(s, i0 + QueryBlock(mask, s)), keys = KeysOf(mask, i1, s);
        float* pb = p.data() + i0 * s;  // the block's rows of p (row stride S)
        // scores = scale * q k^T: (rows, hd) @ (hd, keys).
        Sgemm(false, true, i1 - i0, keys, hd, scale, qbh + i0 * ldq, ldq, kbg, ldkv, 0.0f, pb, s);
        for (int64_t i = i0; i < i1; ++i) {
          float* row = p.data() + i * s;
          const int64_t len = Visible(mask, i, s);
          lbh[i] = SoftmaxRow(row, row, len);
          for (int64_t j = len; j < keys; ++j) row[j] = 0.0f;  // masked
        }
        // out = p v: (rows, keys) @ (keys, hd).
        Sgemm(false, false, i1 - i0, hd, keys, 1.0f, pb, s, vbg, ldkv, 0.0f, obh + i0 * ldq, ldq);
      }
    }
  }
  });
}

void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv,
                       AttentionMask mask, const Tensor& delta) {
  const int64_t s = q.dim(1), hd = q.dim(3);
  const Dims d{q.dim(0), s, q.dim(2), k.dim(2), hd};
  const int64_t ldq = d.hq * hd, ldkv = d.hkv * hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  dk.SetZero();
  dv.SetZero();
  ParallelFor(d.b * d.hkv, 1, [&](int64_t pair0, int64_t pair1) {
  std::vector<float> p(static_cast<size_t>(s * s));   // (S, S) probabilities
  std::vector<float> dp(static_cast<size_t>(s * s));  // (S, S) dp, then ds in place
  for (int64_t pair = pair0; pair < pair1; ++pair) {
    const int64_t b = pair / d.hkv, g = pair % d.hkv;
    for (int64_t h = g * d.group(); h < (g + 1) * d.group(); ++h) {
      const float* qbh = q.data<float>() + b * s * ldq + h * hd;
      const float* kbg = k.data<float>() + b * s * ldkv + g * hd;
      const float* vbg = v.data<float>() + b * s * ldkv + g * hd;
      const float* dobh = dout.data<float>() + b * s * ldq + h * hd;
      const float* lbh = lse.data<float>() + (b * d.hq + h) * s;
      const float* dbh = delta.defined() ? delta.data<float>() + (b * d.hq + h) * s : nullptr;
      float* dqbh = dq.data<float>() + b * s * ldq + h * hd;
      float* dkbg = dk.data<float>() + b * s * ldkv + g * hd;
      float* dvbg = dv.data<float>() + b * s * ldkv + g * hd;
      for (int64_t i0 = 0; i0 < s; i0 += QueryBlock(mask, s)) {
        const int64_t i1 = std::min(s, i0 + QueryBlock(mask, s)), keys = KeysOf(mask, i1, s);
        const int64_t rows = i1 - i0;
        float* pb = p.data() + i0 * s;    // the block's rows of p and dp (row stride S)
        float* dpb = dp.data() + i0 * s;
        // p = exp(scale * q k^T - lse), masked: (rows, hd) @ (hd, keys).
        Sgemm(false, true, rows, keys, hd, scale, qbh + i0 * ldq, ldq, kbg, ldkv, 0.0f, pb, s);
        for (int64_t i = i0; i < i1; ++i) {
          float* row = p.data() + i * s;
          const int64_t len = Visible(mask, i, s);
          ExpShiftRow(row, lbh[i], row, len);
          for (int64_t j = len; j < keys; ++j) row[j] = 0.0f;
        }
        // dv[:keys] += p^T dout: (rows, keys)^T @ (rows, hd).
        Sgemm(true, false, keys, hd, rows, 1.0f, pb, s, dobh + i0 * ldq, ldq, 1.0f, dvbg, ldkv);
        // dp = dout v^T: (rows, hd) @ (hd, keys); ds = softmax backward of each row over the
        // visible keys: p (dp - sum_j p dp), or p (dp - delta) for a block of a larger softmax.
        Sgemm(false, true, rows, keys, hd, 1.0f, dobh + i0 * ldq, ldq, vbg, ldkv, 0.0f, dpb, s);
        for (int64_t i = i0; i < i1; ++i) {
          float* row = dp.data() + i * s;
          const float* prow = p.data() + i * s;
          const int64_t len = Visible(mask, i, s);
          if (dbh != nullptr) {
            for (int64_t j = 0; j < len; ++j) row[j] = prow[j] * (row[j] - dbh[i]);
          } else {
            SoftmaxRowBackward(prow, row, row, len);
          }
          for (int64_t j = len; j < keys; ++j) row[j] = 0.0f;
        }
        // dq = scale * ds k: (rows, keys) @ (keys, hd); dk[:keys] += scale * ds^T q.
        Sgemm(false, false, rows, hd, keys, scale, dpb, s, kbg, ldkv, 0.0f, dqbh + i0 * ldq, ldq);
        Sgemm(true, false, keys, hd, rows, scale, dpb, s, qbh + i0 * ldq, ldq, 1.0f, dkbg, ldkv);
      }
    }
  }
  });
}

namespace {
// out f32 or bf16 (T; a bf16 value widened as read: exact).
template <typename T>
void DeltaRows(const T* o, const Tensor& dout, Tensor& delta, int64_t b, int64_t s, int64_t hq,
               int64_t hd) {
  const float* g = dout.data<float>();
  float* dl = delta.data<float>();
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t i = 0; i < s; ++i) {
      for (int64_t h = 0; h < hq; ++h) {
        const int64_t at = ((bi * s + i) * hq + h) * hd;
        double dot = 0.0;
        for (int64_t e = 0; e < hd; ++e) {
          dot += static_cast<double>(g[at + e]) * static_cast<float>(o[at + e]);
        }
        dl[(bi * hq + h) * s + i] = static_cast<float>(dot);
      }
    }
  }
}
}  // namespace

void AttentionBackwardDelta(const Tensor& out, const Tensor& dout, Tensor& delta) {
  const int64_t b = out.dim(0), s = out.dim(1), hq = out.dim(2), hd = out.dim(3);
  if (out.dtype() == DType::kBF16) {
    return DeltaRows(static_cast<const BFloat16*>(out.raw_data()), dout, delta, b, s, hq, hd);
  }
  DeltaRows(out.data<float>(), dout, delta, b, s, hq, hd);
}

void AttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b) {
  const int64_t b = out.dim(0), s = out.dim(1), hq = out.dim(2), hd = out.dim(3);
  float* o = out.data<float>();
  float* l = lse.data<float>();
  const float* ob = out_b.data<float>();
  const float* lb = lse_b.data<float>();
  for (int64_t bi = 0; bi < b; ++bi) {
    for (int64_t h = 0; h < hq; ++h) {
      for (int64_t i = 0; i < s; ++i) {
        const int64_t r = (bi * hq + h) * s + i;  // the row's lse
        float* orow = o + ((bi * s + i) * hq + h) * hd;
        const float* brow = ob + ((bi * s + i) * hq + h) * hd;
        if (l[r] == -INFINITY) {  // nothing seen yet: the block's values
          for (int64_t e = 0; e < hd; ++e) orow[e] = brow[e];
          l[r] = lb[r];
          continue;
        }
        const float hi = std::max(l[r], lb[r]), lo = std::min(l[r], lb[r]);
        const float merged = hi + std::log1p(std::exp(lo - hi));
        const float wa = std::exp(l[r] - merged), wb = std::exp(lb[r] - merged);
        for (int64_t e = 0; e < hd; ++e) orow[e] = orow[e] * wa + brow[e] * wb;
        l[r] = merged;
      }
    }
  }
}

}  // namespace switchyard::kernels::cpu
