// CPU reference implementation of kernels/attention.h. For every (batch, query head): the
// score matrix (S, S) by one sgemm, the causal row softmax in place, then the output by a
// second sgemm; Backward recomputes the probabilities from lse. The (B, S, H, hd) layout is
// read in place with leading dimension H * hd, so no head is ever copied out.
#include "kernels/attention.h"

#include <cmath>
#include <vector>

#include "kernels/cpu/cpu_check.h"
#include "kernels/gemm.h"
#include "kernels/softmax.h"

namespace switchyard::kernels {
namespace {

struct Dims {
  int64_t b, s, hq, hkv, hd;
  int64_t group() const { return hq / hkv; }
};

void CheckShape(const Tensor& t, const Shape& want, const char* op, const char* what) {
  cpu::CheckCpuF32(t, op, what);
  SY_CHECK(t.shape() == want) << op << ": " << what << " " << ShapeString(t.shape())
                              << ", expected " << ShapeString(want);
}

Dims CheckInputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                 const char* op) {
  cpu::CheckCpuF32(q, op, "q");
  SY_CHECK_EQ(q.ndim(), 4) << op << ": q is (B, S, Hq, hd), got " << ShapeString(q.shape());
  cpu::CheckCpuF32(k, op, "k");
  SY_CHECK_EQ(k.ndim(), 4) << op << ": k is (B, S, Hkv, hd), got " << ShapeString(k.shape());
  const Dims d{q.dim(0), q.dim(1), q.dim(2), k.dim(2), q.dim(3)};
  SY_CHECK_GE(d.hd, 1) << op << ": empty heads, q " << ShapeString(q.shape());
  SY_CHECK(d.hkv >= 1 && d.hq % d.hkv == 0)
      << op << ": Hq=" << d.hq << " is not a multiple of Hkv=" << d.hkv;
  const Shape kv_shape{d.b, d.s, d.hkv, d.hd};
  CheckShape(k, kv_shape, op, "k");
  CheckShape(v, kv_shape, op, "v");
  CheckShape(lse, {d.b, d.hq, d.s}, op, "lse");
  return d;
}

}  // namespace

void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      DeviceContext* ctx) {
  constexpr const char* kOp = "AttentionForward";
  const Dims d = CheckInputs(q, k, v, lse, kOp);
  CheckShape(out, q.shape(), kOp, "out");
  const int64_t s = d.s, hd = d.hd;
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
      cpu::Sgemm(false, true, s, s, hd, scale, qbh, ldq, kbg, ldkv, 0.0f, p.data(), s);
      for (int64_t i = 0; i < s; ++i) {
        float* row = p.data() + i * s;
        lbh[i] = cpu::SoftmaxRow(row, row, i + 1);
        for (int64_t j = i + 1; j < s; ++j) row[j] = 0.0f;  // causal mask
      }
      // out = p v: (S, S) @ (S, hd).
      cpu::Sgemm(false, false, s, hd, s, 1.0f, p.data(), s, vbg, ldkv, 0.0f, obh, ldq);
    }
  }
}

void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, DeviceContext* ctx) {
  constexpr const char* kOp = "AttentionBackward";
  const Dims d = CheckInputs(q, k, v, lse, kOp);
  CheckShape(dout, q.shape(), kOp, "dout");
  CheckShape(dq, q.shape(), kOp, "dq");
  CheckShape(dk, k.shape(), kOp, "dk");
  CheckShape(dv, v.shape(), kOp, "dv");
  const int64_t s = d.s, hd = d.hd;
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
      cpu::Sgemm(false, true, s, s, hd, scale, qbh, ldq, kbg, ldkv, 0.0f, p.data(), s);
      for (int64_t i = 0; i < s; ++i) {
        float* row = p.data() + i * s;
        for (int64_t j = 0; j <= i; ++j) row[j] = std::exp(row[j] - lbh[i]);
        for (int64_t j = i + 1; j < s; ++j) row[j] = 0.0f;
      }
      // dv += p^T dout: (S, S)^T @ (S, hd).
      cpu::Sgemm(true, false, s, hd, s, 1.0f, p.data(), s, dobh, ldq, 1.0f, dvbg, ldkv);
      // dp = dout v^T: (S, hd) @ (hd, S); ds = softmax backward of each row over j <= i.
      cpu::Sgemm(false, true, s, s, hd, 1.0f, dobh, ldq, vbg, ldkv, 0.0f, dp.data(), s);
      for (int64_t i = 0; i < s; ++i) {
        float* row = dp.data() + i * s;
        cpu::SoftmaxRowBackward(p.data() + i * s, row, row, i + 1);
        for (int64_t j = i + 1; j < s; ++j) row[j] = 0.0f;
      }
      // dq = scale * ds k: (S, S) @ (S, hd); dk += scale * ds^T q.
      cpu::Sgemm(false, false, s, hd, s, scale, dp.data(), s, kbg, ldkv, 0.0f, dqbh, ldq);
      cpu::Sgemm(true, false, s, hd, s, scale, dp.data(), s, qbh, ldq, 1.0f, dkbg, ldkv);
    }
  }
}

}  // namespace switchyard::kernels
