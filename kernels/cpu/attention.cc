// CPU reference implementation of kernels/attention.h. For every (batch, query head): the
// score matrix (S, S) by one sgemm, the causal row softmax in place, then the output by a
// second sgemm; Backward recomputes the probabilities from lse. The (B, S, H, hd) layout is
// read in place with leading dimension H * hd, so no head is ever copied out.
#include "kernels/attention.h"

#include <cmath>
#include <vector>

#include "kernels/gemm.h"
#include "kernels/softmax.h"

namespace switchyard::kernels::cpu {
namespace {

struct Dims {
  int64_t b, s, hq, hkv, hd;
  int64_t group() const { return hq / hkv; }
};

}  // namespace

void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse) {
  const int64_t s = q.dim(1), hd = q.dim(3);
  const Dims d{q.dim(0), s, q.dim(2), k.dim(2), hd};
  const int64_t ldq = d.hq * hd, ldkv = d.hkv * hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  std::vector<float> p(static_cast<size_t>(s * s));  // (S, S) scores, then probabilities
  for (int64_t b = 0; b < d.b; ++b) {
    for (int64_t h = 0; h < d.hq; ++h) {
      const int64_t g = h / d.group();
      const float* qbh = q.data<float>() + b * s * ldq + h * hd;
      const float* kbg = k.data<float>() + b * s * ldkv + g * hd;
      const float* vbg = v.data<float>() + b * s * ldkv + g * hd;
      float* obh = out.data<float>() + b * s * ldq + h * hd;
      float* lbh = lse.data<float>() + (b * d.hq + h) * s;
      // s = scale * q k^T: (S, hd) @ (hd, S).
      Sgemm(false, true, s, s, hd, scale, qbh, ldq, kbg, ldkv, 0.0f, p.data(), s);
      for (int64_t i = 0; i < s; ++i) {
        float* row = p.data() + i * s;
        lbh[i] = SoftmaxRow(row, row, i + 1);
        for (int64_t j = i + 1; j < s; ++j) row[j] = 0.0f;  // causal mask
      }
      // out = p v: (S, S) @ (S, hd).
      Sgemm(false, false, s, hd, s, 1.0f, p.data(), s, vbg, ldkv, 0.0f, obh, ldq);
    }
  }
}

void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv) {
  const int64_t s = q.dim(1), hd = q.dim(3);
  const Dims d{q.dim(0), s, q.dim(2), k.dim(2), hd};
  const int64_t ldq = d.hq * hd, ldkv = d.hkv * hd;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  dk.SetZero();
  dv.SetZero();
  std::vector<float> p(static_cast<size_t>(s * s));   // (S, S) probabilities
  std::vector<float> dp(static_cast<size_t>(s * s));  // (S, S) dp, then ds in place
  for (int64_t b = 0; b < d.b; ++b) {
    for (int64_t h = 0; h < d.hq; ++h) {
      const int64_t g = h / d.group();
      const float* qbh = q.data<float>() + b * s * ldq + h * hd;
      const float* kbg = k.data<float>() + b * s * ldkv + g * hd;
      const float* vbg = v.data<float>() + b * s * ldkv + g * hd;
      const float* dobh = dout.data<float>() + b * s * ldq + h * hd;
      const float* lbh = lse.data<float>() + (b * d.hq + h) * s;
      float* dqbh = dq.data<float>() + b * s * ldq + h * hd;
      float* dkbg = dk.data<float>() + b * s * ldkv + g * hd;
      float* dvbg = dv.data<float>() + b * s * ldkv + g * hd;
      // p = exp(scale * q k^T - lse), masked.
      Sgemm(false, true, s, s, hd, scale, qbh, ldq, kbg, ldkv, 0.0f, p.data(), s);
      for (int64_t i = 0; i < s; ++i) {
        float* row = p.data() + i * s;
        for (int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] - lbh[i]);
        for (int64_t j = i + 1; j < s; ++j) row[j] = 0.0f;
      }
      // dv += p^T dout: (S, S)^T @ (S, hd).
      Sgemm(true, false, s, hd, s, 1.0f, p.data(), s, dobh, ldq, 1.0f, dvbg, ldkv);
      // dp = dout v^T: (S, hd) @ (hd, S); ds = softmax backward of each row over j <= i.
      Sgemm(false, true, s, s, hd, 1.0f, dobh, ldq, vbg, ldkv, 0.0f, dp.data(), s);
      for (int64_t i = 0; i < s; ++i) {
        float* row = dp.data() + i * s;
        SoftmaxRowBackward(p.data() + i * s, row, row, i + 1);
        for (int64_t j = i + 1; j < s; ++j) row[j] = 0.0f;
      }
      // dq = scale * ds k: (S, S) @ (S, hd); dk += scale * ds^T q.
      Sgemm(false, false, s, hd, s, scale, dp.data(), s, kbg, ldkv, 0.0f, dqbh, ldq);
      Sgemm(true, false, s, hd, s, scale, dp.data(), s, qbh, ldq, 1.0f, dkbg, ldkv);
    }
  }
}

}  // namespace switchyard::kernels::cpu
