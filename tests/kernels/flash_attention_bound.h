// Attention in double with forward-error bounds for the fused bf16 path
// (kernels/flash_attention.h: its CUDA kernel and its CPU twin): ref.x is the exact value from
// the given f32 inputs, and any evaluation that rounds as the fused path does satisfies
// |x_flash - ref.x| <= ref.x_bound, by construction (whatever the summation order inside a
// block product). Used two ways:
//  - against the exact f32 path: operand_unit = 2^-8 (q, k, v, dout are rounded to bf16 by
//    the fused path) and |flash - exact_f32| <= this bound + tests/kernels/attention_bound.h's;
//  - kernel against twin: both read the same bf16 operands, so the inputs are rounded here
//    first and operand_unit = 0; the two differ by at most twice the bound (what is left:
//    f32 order, the last ulp of exp, and a bf16 rounding of p or ds that falls on the other
//    side of a tie).
//
// Per (batch, head, query row i), n keys visible, ub = operand_unit, up = 2^-8 (p and ds are
// always rounded to bf16 before their products), u = 2^-24, gamma_m = (m + 2) u, S the
// sequence length, nb = ceil(S / 64) key blocks, G = Hq / Hkv:
//   scores s_j = scale q_i . k_j: the operands' rounding (1 + ub)^2 and the f32 dot product
//     gamma_hd, then the product by scale (u):
//     |ds_j| <= delta = max_j scale A_ij ((1 + ub)^2 (1 + gamma_hd) (1 + u) - 1),
//     A_ij = sum_e |q_ie k_je|;
//   Lambda = 2 (max_j |s_j| + delta) + log n + 1 bounds |s - max|, |s - lse| and |lse|;
//   weights w_j = bf16(exp2(fma(x_j, c, -f32(m c)))) a... / l, in base 2 on the unscaled scores
//     x (kernels/flash_attention.h; c = f32(scale log2 e)): perturbing every score by delta
//     moves the softmax by exp(2 delta) relative; the f32 work per key block: the argument,
//     read in base e, is off by |s - s_m| u (c's rounding) + |s_m| u (m c's) + |s - s_m| u (the
//     fma's), at most 3 Lambda u; ex2.approx within 2^-22 = 4 u relative, and the product 1 u;
//     the rescale a = exp2(f32(m - m') c) likewise (2 |s_m - s_m'| u, the same bound). Over
//     at most nb + 2 rescales of numerator and sum, the sum l and the accumulation
//     gamma_{n+nb}, the division u:
//     eps_w = 2 (nb + 2) (3 Lambda + 5) u + gamma_{n+nb} + u;
//   the GPU's ex2.approx.ftz flushes a weight below 2^-126 (of the running max's 1) to 0:
//     at most n 2^-126 max_j |v_je| on out (l >= 1) and n 2^-126 on lse;
//   out_e = sum_j w_j v_je: |dout_e| <= (exp(2 delta) (1 + up) (1 + ub) (1 + eps_w)
//     (1 + gamma_{n+nb}) - 1) sum_j p_j |v_je| + n 2^-126 max_j |v_je|;
//   lse = f32(m scale) + log l: |dlse| <= delta + eps_w + 3 u (|lse| + Lambda + 1) + n 2^-126.
// Backward, from the evaluation's own lse and delta = rowsum(dout * out) of its own out:
//   p = exp2(fma(x, c, -f32(lse f32(log2 e)))): the argument, in base e, is off by |s| u (c)
//     + 2 |lse| u (log2 e and the product) + |s - lse| u (the fma), at most 4 Lambda u, and
//     ex2.approx 4 u: theta_p = exp(delta + lse_bound) (1 + (4 Lambda + 5) u) - 1 relative,
//     and a p below 2^-126 may be flushed to 0 (ftz: 2^-126 absolute on p, on ds times
//     |dp - D| and its error);
//   dp_j = do^ . v^: |ddp_j| <= ((1 + ub)^2 (1 + gamma_hd) - 1) B_ij, B_ij = sum_e |do_ie v_je|;
//   delta_i (double sum of the f32 out and dout, stored in f32):
//     |dD| <= sum_e |do_ie| out_bound_ie + 2 u sum_e |do_ie out_ie| + u |D_i|;
//   ds = bf16(p (dp - D)), eta = (1 + u)^2 (1 + up) - 1:
//     |dds_ij| <= p_ij (((1 + theta_p) (1 + eta) - 1) |dp_ij - D_i|
//                       + (1 + theta_p) (1 + eta) (|ddp_ij| + |dD_i|));
//   dq_i = scale sum_j ds_ij k^_j (f32 over the key blocks, gamma_{S+nb}, then the scale u):
//     sum_j ((|ds_ij| + |dds_ij|) (1 + ub) (1 + gamma_{S+nb}) (1 + u) - |ds_ij|) |k_je| scale;
//   dk_j likewise over the group's heads and rows (gamma_{G (S+nb)}) with |q_ie|;
//   dv_j = sum p~_ij do^_i:
//     sum p_ij |do_ie| ((1 + theta_p) (1 + up) (1 + ub) (1 + gamma_{G (S+nb)}) - 1).
// Blocks of a larger softmax merged by AttentionMerge (ring attention), M merges of two finite
// blocks: each block's lse is off by its eps_w and rounding (the score perturbation delta is
// common to the blocks and already in exp(2 delta)), each merge rounds (2 Lambda + 8) u
// (tests/kernels/attention_bound.h), so the weights gain a factor
// (1 + M (2 eps_w + 4 u (|lse| + Lambda + 1) + (2 Lambda + 8) u)) and lse M (2 Lambda + 8) u;
// the backward's block sums (kernels::Add) add 2 M + 2 roundings to every gamma of a gradient.
// Second-order terms left out of these products (an error times an error) are under 1% here:
// every bound is x 1.01.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "tests/kernels/attention_bound.h"
#include "tests/testing/tolerance.h"

namespace switchyard::test_util {

// The bf16 unit roundoff (8 significant bits, round to nearest even).
inline constexpr double kBf16Unit = 0x1p-8;

// The largest weight the GPU's ex2.approx.ftz may flush to 0 (its subnormal results).
inline constexpr double kFlushed = 0x1p-126;

// A copy of t (f32) with every element rounded to bf16.
inline Tensor RoundedToBf16(const Tensor& t) {
  Tensor out = t.Clone();
  float* p = out.data<float>();
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = BFloat16::ToFloat(BFloat16::FromFloat(p[i]));
  return out;
}

// The exact attention of q, k, v (and its gradients from dout when defined) with the fused
// path's bounds; operand_unit as in the file comment.
inline AttentionRef FlashAttentionWithBound(const Tensor& q_t, const Tensor& k_t,
                                            const Tensor& v_t, const Tensor& dout_t, bool causal,
                                            double operand_unit, int64_t merges = 0) {
  const int64_t B = q_t.dim(0), S = q_t.dim(1), hq = q_t.dim(2), hd = q_t.dim(3);
  const int64_t hkv = k_t.dim(2), G = hq / hkv, nb = (S + 63) / 64, M = merges;
  const std::vector<float> q = q_t.ToVector<float>(), k = k_t.ToVector<float>(),
                           v = v_t.ToVector<float>();
  const bool back = dout_t.defined();
  const std::vector<float> go = back ? dout_t.ToVector<float>() : std::vector<float>();
  const double u = kF32Unit, ub = operand_unit, up = kBf16Unit, second = 1.01;
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
  const double g_q = gamma(S + nb + 2 * M + 2), g_kv = gamma(G * (S + nb) + 2 * M + 2);
  const double op2 = (1 + ub) * (1 + ub) * (1 + gamma(hd));  // two rounded operands, f32 dot
  const double eta = (1 + u) * (1 + u) * (1 + up) - 1;
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
          delta = std::max(delta, scale * abs * (op2 * (1 + u) - 1));
          max_abs = std::max(max_abs, std::abs(s[j]));
          m = std::max(m, s[j]);
        }
        double sum = 0;
        for (int64_t j = 0; j < n; ++j) sum += std::exp(s[j] - m);
        const double lse = m + std::log(sum);
        const double lambda = 2 * (max_abs + delta) + std::log(static_cast<double>(n)) + 1;
        const double eps_w =
            2.0 * static_cast<double>(nb + 2) * (3 * lambda + 5) * u + gamma(n + nb) + u;
        const double flushed = static_cast<double>(n) * kFlushed;  // ex2.approx.ftz's zeros
        const double lse_round = eps_w + 3 * u * (std::abs(lse) + lambda + 1) + flushed;
        const double lse_bound = second * (delta + lse_round + M * (2 * lambda + 8) * u);
        const double merge = 1 + M * (2 * lse_round + (2 * lambda + 8) * u);
        const int64_t li = (b * hq + h) * S + i;
        r.lse[li] = lse;
        r.lse_bound[li] = lse_bound;
        const double w_rel =
            std::exp(2 * delta) * (1 + up) * (1 + ub) * (1 + eps_w) * (1 + gamma(n + nb)) * merge -
            1;
        std::vector<double> pv(hd, 0.0), vmax(hd, 0.0);
        for (int64_t j = 0; j < n; ++j) {
          p[j] = std::exp(s[j] - lse);
          for (int64_t e = 0; e < hd; ++e) {
            const double ve = std::abs(static_cast<double>(v[kv(j) + e]));
            r.out[qi + e] += p[j] * v[kv(j) + e];
            pv[e] += p[j] * ve;
            vmax[e] = std::max(vmax[e], ve);
          }
        }
        for (int64_t e = 0; e < hd; ++e) {
          r.out_bound[qi + e] = second * (w_rel * pv[e] + flushed * vmax[e]);
        }
        if (!back) continue;
        const double theta_p =
            std::exp(delta + lse_bound) * (1 + (4 * lambda + 5) * u) - 1;
        double D = 0, dD = 0;
        for (int64_t e = 0; e < hd; ++e) {
          const double dd = go[qi + e];
          D += dd * r.out[qi + e];
          dD += std::abs(dd) * r.out_bound[qi + e] + 2 * u * std::abs(dd * r.out[qi + e]);
        }
        dD += u * std::abs(D);
        for (int64_t j = 0; j < n; ++j) {
          double dp = 0, bdp = 0;
          for (int64_t e = 0; e < hd; ++e) {
            dp += static_cast<double>(go[qi + e]) * v[kv(j) + e];
            bdp += std::abs(static_cast<double>(go[qi + e]) * v[kv(j) + e]);
          }
          const double ds = p[j] * (dp - D);
          const double f = (1 + theta_p) * (1 + eta);
          const double dsb =
              second * (p[j] * ((f - 1) * std::abs(dp - D) + f * ((op2 - 1) * bdp + dD)) +
                        kFlushed * f * (std::abs(dp - D) + (op2 - 1) * bdp + dD));
          const double mag = std::abs(ds) + dsb;
          for (int64_t e = 0; e < hd; ++e) {
            const double kk = k[kv(j) + e], qq = q[qi + e], dd = go[qi + e];
            r.dq[qi + e] += scale * ds * kk;
            r.dq_bound[qi + e] += second * scale *
                                  (mag * (1 + ub) * (1 + g_q) * (1 + u) - std::abs(ds)) *
                                  std::abs(kk);
            r.dk[kv(j) + e] += scale * ds * qq;
            r.dk_bound[kv(j) + e] += second * scale *
                                     (mag * (1 + ub) * (1 + g_kv) * (1 + u) - std::abs(ds)) *
                                     std::abs(qq);
            r.dv[kv(j) + e] += p[j] * dd;
            r.dv_bound[kv(j) + e] +=
                second * (((1 + theta_p) * (1 + up) * (1 + ub) * (1 + g_kv) - 1) * p[j] +
                          kFlushed * (1 + up) * (1 + ub) * (1 + g_kv)) *
                std::abs(dd);
          }
        }
      }
    }
  }
  return r;
}

}  // namespace switchyard::test_util
