// CPU implementation of kernels/moe_routing.h's RouterTopKScored and RouterBackwardScored:
// sigmoid scores (DeepSeek-V3) and node-limited routing (a token's experts come from its M
// best groups of E/G). Its softmax case without groups is RouterTopK (kernels/cpu/
// moe_routing.cc calls it), so a softmax router gives the same bits with or without groups.
#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine/core/thread_pool.h"
#include "kernels/cpu/router_rows.h"
#include "kernels/cpu/rows.h"
#include "kernels/moe_routing.h"

namespace switchyard::kernels::cpu {
namespace {

// probs = softmax(l), max-subtracted, the exp sum in double.
void SoftmaxRow(const float* l, int64_t E, float* p) {
  const float m = *std::max_element(l, l + E);
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    p[e] = std::exp(l[e] - m);
    sum += p[e];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t e = 0; e < E; ++e) p[e] *= inv;
}

// s = sigmoid(l) in double rounded to f32 once; p = s * f32(1 / sum s) (sum in double).
void SigmoidRow(const float* l, int64_t E, float* s, float* p) {
  double sum = 0.0;
  for (int64_t e = 0; e < E; ++e) {
    s[e] = static_cast<float>(1.0 / (1.0 + std::exp(-static_cast<double>(l[e]))));
    sum += s[e];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t e = 0; e < E; ++e) p[e] = s[e] * inv;
}

// Node-limited routing: sets c[e] = -inf for the experts outside the M groups (of E/G
// experts each) whose two largest c sum highest; ties to the smaller group.
void KeepBestGroups(float* c, int64_t E, int64_t G, int64_t M, std::vector<float>& group_score,
                    std::vector<int32_t>& group_order) {
  const int64_t n = E / G;
  for (int64_t g = 0; g < G; ++g) {
    const float* x = c + g * n;
    float a = -INFINITY, b = -INFINITY;  // the largest two, a >= b
    for (int64_t i = 0; i < n; ++i) {
      if (x[i] > a) {
        b = a;
        a = x[i];
      } else if (x[i] > b) {
        b = x[i];
      }
    }
    group_score[g] = n >= 2 ? a + b : a;
  }
  std::iota(group_order.begin(), group_order.end(), 0);
  std::stable_sort(group_order.begin(), group_order.end(),
                   [&](int32_t x, int32_t y) { return group_score[x] > group_score[y]; });
  for (int64_t r = M; r < G; ++r) {
    std::fill(c + group_order[r] * n, c + (group_order[r] + 1) * n, -INFINITY);
  }
}

}  // namespace

void RouterTopKScored(const Tensor& logits, const Tensor& bias_t, const RouterScoring& scoring,
                      bool random_second, RngKey second_key, int64_t first_token,
                      Tensor& probs, Tensor& scores, Tensor& indices, Tensor& gates,
                      Tensor& keep) {
  const int64_t T = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
  const int64_t G = scoring.groups;
  const float* bias = bias_t.defined() ? bias_t.data<float>() : nullptr;
  const float* lp = logits.data<float>();
  float* pp = probs.data<float>();
  float* sp = scoring.sigmoid ? scores.data<float>() : pp;  // softmax: the scores are probs
  int32_t* ip = indices.data<int32_t>();
  float* gp = gates.data<float>();
  uint8_t* kp = keep.data<uint8_t>();

  // Tokens are independent (the GShard draw is keyed by the token): they run in parallel.
  ParallelFor(T, RowsPerChunk(E, 2048), [&](int64_t t0, int64_t t1) {
    std::vector<int32_t> order(E), group_order(std::max<int64_t>(G, 1));
    std::vector<float> c(E), group_score(std::max<int64_t>(G, 1));
    for (int64_t t = t0; t < t1; ++t) {
      const float* l = lp + t * E;
      float* s = sp + t * E;
      if (scoring.sigmoid) {
        SigmoidRow(l, E, s, pp + t * E);
      } else {
        SoftmaxRow(l, E, pp + t * E);
      }
      // The choice scores, limited to the best groups; then top-k, ties to the smaller index.
      for (int64_t e = 0; e < E; ++e) c[e] = bias ? s[e] + bias[e] : s[e];
      if (G > 0) KeepBestGroups(c.data(), E, G, scoring.group_topk, group_score, group_order);
      std::iota(order.begin(), order.end(), 0);
      std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
        return c[a] > c[b] || (c[a] == c[b] && a < b);
      });
      int32_t* idx = ip + t * k;
      float* g = gp + t * k;
      float gate_sum = 0.0f;
      for (int64_t j = 0; j < k; ++j) {
        idx[j] = order[j];
        g[j] = s[order[j]];
        gate_sum += g[j];
        kp[t * k + j] = 1;
      }
      if (scoring.normalize) {
        for (int64_t j = 0; j < k; ++j) g[j] /= gate_sum;
      }
      // GShard (arXiv 2006.16668, Algorithm 1): keep the second expert iff u < 2 * g2,
      // g2 = s2 / (s1 + s2) on the two chosen scores, whether or not the gates are normalised.
      if (random_second) {
        const float s1 = s[idx[0]], s2 = s[idx[1]];
        const float u = UniformAt(second_key, static_cast<uint64_t>(first_token + t));
        kp[t * k + 1] = u < 2.0f * (s2 / (s1 + s2)) ? 1 : 0;
      }
    }
  });
}

void RouterBackwardScored(const Tensor& probs, const Tensor& scores, const Tensor& indices,
                          const Tensor& gates, const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, const RouterScoring& scoring,
                          Tensor& dlogits) {
  // Sigmoid only (softmax goes to RouterBackwardLogits).
  const int64_t T = probs.dim(0), E = probs.dim(1), k = indices.dim(1);
  const float* extra_p = dprobs.defined() ? dprobs.data<float>() : nullptr;
  const float* extra_l = dlogits_extra.defined() ? dlogits_extra.data<float>() : nullptr;
  const float* pp = probs.data<float>();
  const float* sp = scores.data<float>();
  const int32_t* ip = indices.data<int32_t>();
  const float* gp = gates.data<float>();
  const float* dgp = dgates.data<float>();
  float* dl = dlogits.data<float>();
  std::vector<double> ds(E);
  for (int64_t t = 0; t < T; ++t) {
    const float* s = sp + t * E;
    const float* p = pp + t * E;
    std::fill(ds.begin(), ds.end(), 0.0);
    // The aux loss's share, through p = s / S.
    if (extra_p != nullptr) {
      const float* dp = extra_p + t * E;
      double sum_s = 0.0, dot = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        sum_s += s[e];
        dot += static_cast<double>(dp[e]) * p[e];
      }
      for (int64_t e = 0; e < E; ++e) ds[e] = (dp[e] - dot) / sum_s;
    }
    AddGateShare(s, ip + t * k, gp + t * k, dgp + t * k, k, scoring.normalize, ds.data());
    // Sigmoid: ds/dl = s (1 - s).
    for (int64_t e = 0; e < E; ++e) {
      const double se = s[e];
      double v = ds[e] * se * (1.0 - se);
      if (extra_l) v += extra_l[t * E + e];
      dl[t * E + e] = static_cast<float>(v);
    }
  }
}

}  // namespace switchyard::kernels::cpu
