// Attention in double with forward-error bounds that hold for any f32 evaluation of the CPU
// kernels (kernels/cpu/attention.cc), whatever OpenBLAS's summation order, and whether the
// keys are taken whole or as blocks merged by AttentionMerge (ring attention, the block
// decomposition): ref.x is the exact value from the f32 inputs, |x_f32 - ref.x| <= ref.x_bound.
// Two f32 evaluations then differ by at most the sum of their bounds (2 x the larger).
//
// Per (batch, head, query row i), n keys visible, u = 2^-24, gamma_m = (m + 2) u as in
// tests/moe/moe_layer_test_util.h, S the sequence length (an upper bound of any sgemm's
// inner dimension over keys), M the number of AttentionMerge calls that combine two finite
// blocks (a merge into -inf only copies):
//   scores s_j = scale q_i k_j (sgemm, alpha = the f32 scale, used by the reference too):
//     |ds_j| <= delta = max_j gamma_{hd+1} scale (|q_i| |k_j|);
//   Lambda = 2 max_j |s_j| + log n + 1 bounds |s - max|, |s - lse|, |lse| and any block's lse;
//   block softmax p = exp(s - m) / sum (SoftmaxRow: VecExp to 4u, the sum gamma_S, the
//     reciprocal and product 2u): perturbing the scores by delta moves p by 2 delta relative,
//     the arguments' rounding Lambda u, so eps_p = 2 delta + (2 Lambda + S + 8) u;
//   lse = m + log(sum): |dlse| <= delta + (S + 8 + 2 Lambda) u; each merge (lo - hi, exp,
//     log1p, + hi) adds (2 Lambda + 8) u: Dl = delta + (S + 8 + 2 Lambda) u + M (2 Lambda + 8) u;
//   a merge's weights exp(l - merged) are relative 2 Dl + (2 Lambda + 4) u, with the products
//     and the sum (2 Lambda + 8) u: eps_pi = eps_p + M (2 Dl + (2 Lambda + 8) u) relative on
//     every key's effective probability pi_j;
//   out = sum_j pi_j v_j: |dout_e| <= (eps_pi + gamma_{S+M+1}) sum_j pi_j |v_je|.
// Backward, p recomputed as exp(s - lse) from the f32 lse: eps_b = delta + Dl + (2 Lambda + 6) u;
//   dp_j = dout_i v_j: |ddp_j| <= gamma_hd (|dout_i| |v_j|) =: gamma_hd b_j;
//   the row's delta (SoftmaxRowBackward's sum_j p dp in f32 lanes, or AttentionBackwardDelta's
//     sum_e out dout from the f32 out in double): |dD| <= D = max(sum_j p_j (eps_b |dp_j| +
//     gamma_hd b_j) + (S + 2) u sum_j p_j |dp_j|, sum_e out_bound_e |dout_e| + 2 u sum_e |out
//     dout|);
//   ds_j = p_j (dp_j - D): |dds_j| <= p_j ((eps_b + 3u) (|dp_j| + |D|) + gamma_hd b_j + D);
//   dq_i = scale sum_j ds_j k_j, dk_j = scale sum_i ds_ij q_i (over the group's heads too),
//     dv_j = sum_i p_ij dout_i: each term through at most G S + 2 M + 2 roundings (sgemm with
//     beta 1 over query blocks and heads, the blocks' sums), plus the carried |dds| and eps_b.
// Second-order terms (an error times an error) are under 1% here: every bound is x 1.01.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "tests/testing/tolerance.h"

namespace switchyard::test_util {

struct AttentionRef {
  std::vector<double> out, out_bound;  // (B, S, Hq, hd)
  std::vector<double> lse, lse_bound;  // (B, Hq, S)
  std::vector<double> dq, dq_bound;    // (B, S, Hq, hd); empty without dout
  std::vector<double> dk, dk_bound, dv, dv_bound;  // (B, S, Hkv, hd)
};

inline AttentionRef AttentionWithBound(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t,
                                       const Tensor& dout_t, bool causal, int64_t merges) {
  const int64_t B = q_t.dim(0), S = q_t.dim(1), hq = q_t.dim(2), hd = q_t.dim(3);
  const int64_t hkv = k_t.dim(2), G = hq / hkv, M = merges;
  const std::vector<float> q = q_t.ToVector<float>(), k = k_t.ToVector<float>(),
                           v = v_t.ToVector<float>();
  const bool back = dout_t.defined();
  const std::vector<float> go = back ? dout_t.ToVector<float>() : std::vector<float>();
  const double u = kF32Unit, second = 1.01;
  auto gamma = [u](int64_t m) { return static_cast<double>(m + 2) * u; };
  const double scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(hd)));
  AttentionRef r;
  r.out.assign(q.size(), 0.0);
  r.out_bound.assign(q.size(), 0.0);
  r.lse.assign(B * hq * S, 0.0);
  r.lse_bound.assign(B * hq * S, 0.0);
  if (back) {
    r.dq.assign(q.size(), 0.0);
    r.dq_bound.assign(q.size(), 0.0);
    for (auto* x : {&r.dk, &r.dk_bound, &r.dv, &r.dv_bound}) x->assign(k.size(), 0.0);
  }
  const double g_sum = gamma(G * S + 2 * M + 2), g_dq = gamma(S + 2 * M + 2);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / G;
      for (int64_t i = 0; i < S; ++i) {
        const int64_t n = causal ? i + 1 : S;
        const int64_t qi = ((b * S + i) * hq + h) * hd;
        auto kv = [&](int64_t j) { return ((b * S + j) * hkv + g) * hd; };
        std::vector<double> s(n), p(n);
        double delta = 0, max_abs = 0, m = -1e300;
        for (int64_t j = 0; j < n; ++j) {
          double dot = 0, abs = 0;
          for (int64_t e = 0; e < hd; ++e) {
            dot += static_cast<double>(q[qi + e]) * k[kv(j) + e];
            abs += std::abs(static_cast<double>(q[qi + e]) * k[kv(j) + e]);
          }
          s[j] = scale * dot;
          delta = std::max(delta, gamma(hd + 1) * scale * abs);
          max_abs = std::max(max_abs, std::abs(s[j]));
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - m);
        const double lse = m + std::log(sum);
        const double lambda = 2 * max_abs + std::log(static_cast<double>(n)) + 1;
        const double dl = delta + (S + 8 + 2 * lambda) * u + M * (2 * lambda + 8) * u;
        const double eps_pi = 2 * delta + (2 * lambda + S + 8) * u +
                              M * (2 * dl + (2 * lambda + 8) * u);
        const int64_t li = (b * hq + h) * S + i;
        r.lse[li] = lse;
        r.lse_bound[li] = second * dl;
        std::vector<double> pv(hd, 0.0);
        for (int64_t j = 0; j < n; ++j) {
          p[j] = std::exp(s[j] - lse);
          for (int64_t e = 0; e < hd; ++e) {
            r.out[qi + e] += p[j] * v[kv(j) + e];
            pv[e] += p[j] * std::abs(static_cast<double>(v[kv(j) + e]));
          }
        }
        for (int64_t e = 0; e < hd; ++e)
          r.out_bound[qi + e] = second * (eps_pi + gamma(S + M + 1)) * pv[e];
        if (!back) continue;
        const double eps_b = delta + dl + (2 * lambda + 6) * u;
        std::vector<double> dp(n, 0.0), bdp(n, 0.0);
        double dsum = 0, route_a = 0, pdp = 0;
        for (int64_t j = 0; j < n; ++j) {
          for (int64_t e = 0; e < hd; ++e) {
            dp[j] += static_cast<double>(go[qi + e]) * v[kv(j) + e];
            bdp[j] += std::abs(static_cast<double>(go[qi + e]) * v[kv(j) + e]);
          }
          dsum += p[j] * dp[j];
          route_a += p[j] * (eps_b * std::abs(dp[j]) + gamma(hd) * bdp[j]);
          pdp += p[j] * std::abs(dp[j]);
        }
        route_a += (S + 2) * u * pdp;
        double route_b = 0;
        for (int64_t e = 0; e < hd; ++e) {
          route_b += r.out_bound[qi + e] * std::abs(static_cast<double>(go[qi + e])) +
                     2 * u * std::abs(r.out[qi + e] * go[qi + e]);
        }
        const double D = second * std::max(route_a, route_b);
        for (int64_t j = 0; j < n; ++j) {
          const double ds = p[j] * (dp[j] - dsum);
          const double dsb = second * p[j] *
                             ((eps_b + 3 * u) * (std::abs(dp[j]) + std::abs(dsum)) +
                              gamma(hd) * bdp[j] + D);
          for (int64_t e = 0; e < hd; ++e) {
            const double kk = k[kv(j) + e], qq = q[qi + e], dd = go[qi + e];
            r.dq[qi + e] += scale * ds * kk;
            r.dq_bound[qi + e] +=
                second * scale * (g_dq * (std::abs(ds) + dsb) + dsb) * std::abs(kk);
            r.dk[kv(j) + e] += scale * ds * qq;
            r.dk_bound[kv(j) + e] +=
                second * scale * (g_sum * (std::abs(ds) + dsb) + dsb) * std::abs(qq);
            r.dv[kv(j) + e] += p[j] * dd;
            r.dv_bound[kv(j) + e] += second * (g_sum + eps_b) * p[j] * std::abs(dd);
          }
        }
      }
    }
  }
  return r;
}

// |got_i - want_i| <= factor bound_i; prints the worst fraction of it used.
template <typename G, typename W>
void ExpectWithinAttentionBound(const std::vector<G>& got, const std::vector<W>& want,
                                const std::vector<double>& bound, double factor,
                                const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(bound.size(), want.size()) << what;
  if (want.empty()) return;
  const BoundUsed used = WorstFractionOfBound(got, want, bound, factor);
  EXPECT_LE(used.fraction, 1.0) << what << ": element " << used.index << " is "
                                << static_cast<double>(got[used.index]) << ", expected "
                                << static_cast<double>(want[used.index]) << ", bound "
                                << factor * bound[used.index];
  std::printf("  %-40s forward bound used %.3f\n", what.c_str(), used.fraction);
}

}  // namespace switchyard::test_util
