// kernels/attention.h: the forward (output and logsumexp) against a naive triple loop with a
// causal mask in double, for grouped-query heads (Hq = 4, Hkv = 2) and ordinary multi-head
// (Hq = Hkv); GQA equals multi-head attention over repeated key/value heads; causality
// (changing a later token never changes an earlier output); every backward against central
// finite differences of the f32 forward.
#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "tests/kernels/grad_check.h"
#include "tests/testing/tolerance.h"

namespace switchyard::kernels {
namespace {

using testing::Dot;
using testing::ExpectClose;
using testing::NumericGradient;
using testing::RandomTensor;

constexpr int64_t kB = 2, kS = 5, kHd = 4;
// Forward vs double: f32 sums of <= 5 products and a softmax of <= 5 terms.
constexpr double kFwdAbsTol = 1e-6, kFwdRelTol = 1e-5;
// Central differences, step 1e-2, of the f32 forward: L sums B S Hq hd <= 160 terms, so its
// f32 rounding (~1e-7 each, ~1e-6 worst case) over 2h is <= 5e-5; truncation h^2/6 |L'''| is ~1e-5
// for O(1) inputs.
constexpr float kStep = 1e-2f;
constexpr double kFdAbsTol = 1e-4, kFdRelTol = 1e-3;

struct Case {
  int64_t hq, hkv;
  std::string Name() const { return "Hq=" + std::to_string(hq) + ",Hkv=" + std::to_string(hkv); }
};
const Case kCases[] = {{4, 2}, {3, 3}, {2, 1}};

struct Inputs {
  Tensor q, k, v;
};

Inputs RandomInputs(const Case& c, uint64_t stream) {
  return {RandomTensor({kB, kS, c.hq, kHd}, stream), RandomTensor({kB, kS, c.hkv, kHd}, stream + 1),
          RandomTensor({kB, kS, c.hkv, kHd}, stream + 2)};
}

struct Outputs {
  Tensor out, lse;
};

Outputs RunAttention(const Inputs& in) {
  const int64_t hq = in.q.dim(2);
  Outputs o{Tensor::Empty(in.q.shape(), DType::kF32), Tensor::Empty({kB, hq, kS}, DType::kF32)};
  AttentionForward(in.q, in.k, in.v, o.out, o.lse);
  return o;
}

// The definition, one (b, h, i) at a time in double: out (B, S, Hq, hd), lse (B, Hq, S).
void Naive(const Inputs& in, std::vector<double>& out, std::vector<double>& lse) {
  const int64_t hq = in.q.dim(2), hkv = in.k.dim(2), group = hq / hkv;
  const std::vector<float> q = in.q.ToVector<float>(), k = in.k.ToVector<float>(),
                           v = in.v.ToVector<float>();
  out.assign(q.size(), 0.0);
  lse.assign(kB * hq * kS, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHd));
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < kS; ++i) {
        std::vector<double> s(i + 1);
        double max = -1e300;
        for (int64_t j = 0; j <= i; ++j) {  // causal: keys 0..i only
          double dot = 0.0;
          for (int64_t e = 0; e < kHd; ++e)
            dot += q[((b * kS + i) * hq + h) * kHd + e] *
                   static_cast<double>(k[((b * kS + j) * hkv + g) * kHd + e]);
          s[j] = scale * dot;
          max = std::max(max, s[j]);
        }
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - max);
        lse[(b * hq + h) * kS + i] = max + std::log(sum);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = std::exp(s[j] - max) / sum;
          for (int64_t e = 0; e < kHd; ++e)
            out[((b * kS + i) * hq + h) * kHd + e] += p * v[((b * kS + j) * hkv + g) * kHd + e];
        }
      }
    }
  }
}

TEST(AttentionTest, ForwardMatchesNaiveCausalLoop) {
  for (const Case& c : kCases) {
    Inputs in = RandomInputs(c, 10);
    Outputs o = RunAttention(in);
    std::vector<double> out, lse;
    Naive(in, out, lse);
    ExpectClose(o.out.ToVector<float>(), out, kFwdAbsTol, kFwdRelTol, c.Name() + " out");
    ExpectClose(o.lse.ToVector<float>(), lse, kFwdAbsTol, kFwdRelTol, c.Name() + " lse");
  }
}

// Key/value heads repeated Hq / Hkv times: GQA must equal plain multi-head attention on them.
Tensor RepeatHeads(const Tensor& kv, int64_t group) {
  const int64_t hkv = kv.dim(2);
  Tensor out = Tensor::Empty({kB, kS, hkv * group, kHd}, DType::kF32);
  const float* src = kv.data<float>();
  float* dst = out.data<float>();
  for (int64_t t = 0; t < kB * kS; ++t)
    for (int64_t h = 0; h < hkv * group; ++h)
      for (int64_t e = 0; e < kHd; ++e)
        dst[(t * hkv * group + h) * kHd + e] = src[(t * hkv + h / group) * kHd + e];
  return out;
}

// The scales of dk and dv of one shared key/value head, summed over the heads that read it
// (kernels/cpu/attention.cc): dv_g = sum_{h in g} p_h^T dout_h and dk_g = scale sum_{h in g}
// ds_h^T q_h, ds = p (dp - sum_j p dp), dp = dout v^T. Upper bounds of the terms' magnitudes
// from p and dp in double: |ds_ij| <= p_ij (|dp_ij| + max_j |dp_ij|) (sum_j p_j = 1); the f32
// p and dp are within a few u of these (1.01 covers it). Returns (dk scale, dv scale), each
// laid out like k: (B, S, Hkv, hd).
std::pair<std::vector<double>, std::vector<double>> SharedHeadGradScales(const Inputs& in,
                                                                         const Tensor& dout) {
  const int64_t hq = in.q.dim(2), hkv = in.k.dim(2), group = hq / hkv;
  const std::vector<float> q = in.q.ToVector<float>(), k = in.k.ToVector<float>(),
                           v = in.v.ToVector<float>(), go = dout.ToVector<float>();
  std::vector<double> dk(k.size(), 0.0), dv(v.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(kHd));
  auto Q = [&](int64_t b, int64_t i, int64_t h, int64_t e) { return q[((b * kS + i) * hq + h) * kHd + e]; };
  auto G = [&](int64_t b, int64_t i, int64_t h, int64_t e) { return go[((b * kS + i) * hq + h) * kHd + e]; };
  auto KV = [&](int64_t b, int64_t j, int64_t g, int64_t e) { return ((b * kS + j) * hkv + g) * kHd + e; };
  for (int64_t b = 0; b < kB; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / group;
      for (int64_t i = 0; i < kS; ++i) {
        std::vector<double> s(i + 1), dp(i + 1, 0.0);
        double max = -1e300, sum = 0, max_dp = 0;
        for (int64_t j = 0; j <= i; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < kHd; ++e) {
            dot += Q(b, i, h, e) * static_cast<double>(k[KV(b, j, g, e)]);
            dp[j] += G(b, i, h, e) * static_cast<double>(v[KV(b, j, g, e)]);
          }
          s[j] = scale * dot;
          max = std::max(max, s[j]);
          max_dp = std::max(max_dp, std::abs(dp[j]));
        }
        for (int64_t j = 0; j <= i; ++j) sum += std::exp(s[j] - max);
        for (int64_t j = 0; j <= i; ++j) {
          const double p = 1.01 * std::exp(s[j] - max) / sum;
          const double ds = p * (std::abs(dp[j]) + max_dp);
          for (int64_t e = 0; e < kHd; ++e) {
            dv[KV(b, j, g, e)] += p * std::abs(G(b, i, h, e));
            dk[KV(b, j, g, e)] += scale * ds * std::abs(Q(b, i, h, e));
          }
        }
      }
    }
  }
  return {dk, dv};
}

// Each query head runs the very same sgemm calls (same shapes, same operand values; only the
// key/value leading dimension differs, which OpenBLAS's packing absorbs) and the same row
// softmax in both, so out, lse and dq are bitwise equal. dk and dv of a shared head are the
// only sums taken in another order: GQA accumulates the group's heads into one dk by sgemm
// with beta 1 (each term through at most group (S + 1) + 1 roundings), the repeated side sums
// per-head f32 results (S + 1 roundings each) in double. Both are within gamma of that many
// roundings of the exact sum, so within a product bound of inner dimension group (S + 1) on
// the scales of SharedHeadGradScales.
TEST(AttentionTest, GroupedQueryEqualsRepeatedKeyValueHeads) {
  const Case c{4, 2};
  const int64_t group = c.hq / c.hkv;
  Inputs in = RandomInputs(c, 20);
  Inputs rep{in.q, RepeatHeads(in.k, 2), RepeatHeads(in.v, 2)};
  Outputs a = RunAttention(in), b = RunAttention(rep);
  EXPECT_EQ(a.out.ToVector<float>(), b.out.ToVector<float>()) << "GQA vs repeated out";
  EXPECT_EQ(a.lse.ToVector<float>(), b.lse.ToVector<float>()) << "GQA vs repeated lse";

  // Gradients: dk of a shared head is the sum over the heads that read it.
  Tensor dout = RandomTensor(in.q.shape(), 23);
  Tensor dq = Tensor::Empty(in.q.shape(), DType::kF32),
         dk = Tensor::Empty(in.k.shape(), DType::kF32),
         dv = Tensor::Empty(in.v.shape(), DType::kF32);
  AttentionBackward(in.q, in.k, in.v, a.lse, dout, dq, dk, dv);
  Tensor rdq = Tensor::Empty(in.q.shape(), DType::kF32),
         rdk = Tensor::Empty(rep.k.shape(), DType::kF32),
         rdv = Tensor::Empty(rep.v.shape(), DType::kF32);
  AttentionBackward(rep.q, rep.k, rep.v, b.lse, dout, rdq, rdk, rdv);
  EXPECT_EQ(dq.ToVector<float>(), rdq.ToVector<float>()) << "GQA vs repeated dq";
  const auto [dk_scale, dv_scale] = SharedHeadGradScales(in, dout);
  for (auto [grad, rgrad, scale, name] : {std::tuple{&dk, &rdk, &dk_scale, "dk"},
                                          std::tuple{&dv, &rdv, &dv_scale, "dv"}}) {
    const std::vector<float> r = rgrad->ToVector<float>();
    std::vector<double> summed(grad->numel(), 0.0);
    for (int64_t t = 0; t < kB * kS; ++t)
      for (int64_t h = 0; h < 4; ++h)
        for (int64_t e = 0; e < kHd; ++e)
          summed[(t * 2 + h / 2) * kHd + e] += r[(t * 4 + h) * kHd + e];
    test_util::ExpectWithinProductBound(grad->ToVector<float>(), summed, *scale,
                                        group * (kS + 1), std::string("GQA vs repeated ") + name);
  }
}

TEST(AttentionTest, LaterTokensNeverChangeEarlierOutputs) {
  for (const Case& c : kCases) {
    Inputs in = RandomInputs(c, 30);
    const std::vector<float> before = RunAttention(in).out.ToVector<float>();
    for (int64_t t = 1; t < kS; ++t) {
      // New q, k and v at positions >= t in every batch row.
      Inputs changed{in.q.Clone(), in.k.Clone(), in.v.Clone()};
      for (Tensor* x : {&changed.q, &changed.k, &changed.v}) {
        const int64_t row = x->dim(2) * kHd;
        float* p = x->data<float>();
        for (int64_t b = 0; b < kB; ++b)
          for (int64_t i = t * row; i < kS * row; ++i) p[b * kS * row + i] += 0.5f + 0.1f * (i % 7);
      }
      const std::vector<float> after = RunAttention(changed).out.ToVector<float>();
      const int64_t row = c.hq * kHd;
      for (int64_t b = 0; b < kB; ++b) {
        for (int64_t i = 0; i < t * row; ++i)
          ASSERT_EQ(after[b * kS * row + i], before[b * kS * row + i])
              << c.Name() << ": position " << i / row << " changed when positions >= " << t
              << " did";
        bool later_changed = false;
        for (int64_t i = t * row; i < kS * row; ++i)
          later_changed |= after[b * kS * row + i] != before[b * kS * row + i];
        EXPECT_TRUE(later_changed) << c.Name() << ": the change did not reach position " << t;
      }
    }
  }
}

TEST(AttentionTest, GradientsMatchFiniteDifferences) {
  for (const Case& c : kCases) {
    Inputs in = RandomInputs(c, 40);
    const std::vector<float> dout = RandomTensor(in.q.shape(), 43).ToVector<float>();
    auto loss = [&] { return Dot(RunAttention(in).out, dout); };
    Outputs o = RunAttention(in);
    Tensor dq = Tensor::Empty(in.q.shape(), DType::kF32),
           dk = Tensor::Empty(in.k.shape(), DType::kF32),
           dv = Tensor::Empty(in.v.shape(), DType::kF32);
    // Garbage in the outputs: Backward writes, never accumulates.
    for (Tensor* g : {&dq, &dk, &dv}) *g = RandomTensor(g->shape(), 99, 5.0f, 6.0f);
    AttentionBackward(in.q, in.k, in.v, o.lse, Tensor::FromVector(dout, in.q.shape()), dq, dk, dv);
    ExpectClose(dq.ToVector<float>(), NumericGradient(in.q, loss, kStep), kFdAbsTol, kFdRelTol,
                c.Name() + " dq");
    ExpectClose(dk.ToVector<float>(), NumericGradient(in.k, loss, kStep), kFdAbsTol, kFdRelTol,
                c.Name() + " dk");
    ExpectClose(dv.ToVector<float>(), NumericGradient(in.v, loss, kStep), kFdAbsTol, kFdRelTol,
                c.Name() + " dv");
  }
}

TEST(AttentionDeathTest, HeadsThatDoNotGroupAreFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS has started its threads
  Tensor q = Tensor::Zeros({1, 2, 3, 4}, DType::kF32),
         kv = Tensor::Zeros({1, 2, 2, 4}, DType::kF32);
  Tensor out = Tensor::Zeros({1, 2, 3, 4}, DType::kF32),
         lse = Tensor::Zeros({1, 3, 2}, DType::kF32);
  EXPECT_DEATH(AttentionForward(q, kv, kv, out, lse), "not a multiple");
}

}  // namespace
}  // namespace switchyard::kernels
