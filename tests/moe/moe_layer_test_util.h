// Helpers shared by the MoE layer tests (moe_layer_test.cc, moe_layer_grad_test.cc,
// moe_layer_stats_test.cc): deterministic inputs, a config, a layer from Init, and the
// independent double-precision reference of the layer's forward (MODEL.md sections 2-3).
#pragma once

#include <algorithm>
#include <cmath>
#include <numeric>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"

namespace switchyard::moe::testing {

constexpr uint64_t kDataSeed = 4242;

// (shape) values std * N(0, 1) from a Philox stream of the test's own.
inline Tensor Normal(const Shape& shape, uint64_t stream, float std) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillNormal(t, RngKey{kDataSeed, stream}, 0, 0.0f, std);
  return t;
}

inline MoEConfig Config(int64_t E, int64_t k, Activation act) {
  MoEConfig c;
  c.d_model = 6;
  c.num_experts = E;
  c.top_k = k;
  c.d_expert = 5;
  c.activation = act;
  c.aux_loss_coef = 0.0f;
  c.z_loss_coef = 0.0f;
  return c;
}

// A layer whose router logits have O(1) spread (so routing margins are large compared with
// float rounding and finite-difference steps) and whose experts give O(1) outputs; biases
// are made non-zero so that they matter.
inline MoELayer MakeLayer(const MoEConfig& config, dist::Communicator* ep, uint64_t seed = 7) {
  MoELayer layer = MoELayer::Init(config, /*layer_id=*/3, ep, seed, /*std=*/0.35f);
  Tensor wr = layer.router_weight();
  kernels::FillNormal(wr, RngKey{seed, 901}, 0, 0.0f, 0.8f);
  auto fill_bias = [&](Experts& ex, uint64_t stream) {
    if (Tensor b1 = ex.b1(); b1.defined()) kernels::FillNormal(b1, RngKey{seed, stream}, 0, 0.0f, 0.2f);
    if (Tensor b2 = ex.b2(); b2.defined()) kernels::FillNormal(b2, RngKey{seed, stream + 1}, 0, 0.0f, 0.2f);
  };
  fill_bias(layer.experts(), 910);
  if (layer.shared()) fill_bias(layer.shared()->experts(), 920);
  return layer;
}


// ---- The reference ---------------------------------------------------------------------

inline double Gelu(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
inline double Silu(double x) { return x / (1.0 + std::exp(-x)); }

// Local expert `le` of `ex` applied to the row x (d), in double.
inline std::vector<double> Mlp(const Experts& ex, int64_t le, const float* x) {
  const ExpertsOptions& o = ex.options();
  const int64_t d = o.d_model, f = o.d_hidden;
  const float* w1 = ex.w1().data<float>() + le * d * f;
  const float* w2 = ex.w2().data<float>() + le * f * d;
  const float* w3 = ex.w3().defined() ? ex.w3().data<float>() + le * d * f : nullptr;
  const float* b1 = ex.b1().defined() ? ex.b1().data<float>() + le * f : nullptr;
  const float* b2 = ex.b2().defined() ? ex.b2().data<float>() + le * d : nullptr;
  std::vector<double> hidden(f), y(d, 0.0);
  for (int64_t o2 = 0; o2 < f; ++o2) {
    double a = b1 ? b1[o2] : 0.0, b = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      a += static_cast<double>(x[i]) * w1[i * f + o2];
      if (w3) b += static_cast<double>(x[i]) * w3[i * f + o2];
    }
    switch (o.activation) {
      case Activation::kGelu: hidden[o2] = Gelu(a); break;
      case Activation::kRelu: hidden[o2] = a > 0 ? a : 0.0; break;
      case Activation::kSwiglu: hidden[o2] = Silu(a) * b; break;
    }
  }
  for (int64_t i = 0; i < d; ++i) {
    y[i] = b2 ? b2[i] : 0.0;
    for (int64_t o2 = 0; o2 < f; ++o2) y[i] += hidden[o2] * w2[o2 * d + i];
  }
  return y;
}

struct Reference {
  std::vector<double> y;                 // (N, d)
  std::vector<int32_t> indices;          // (N, k)
  std::vector<double> gates;             // (N, k)
  std::vector<uint8_t> kept;             // (N, k)
  std::vector<double> aux, z;            // (G)
  std::vector<int64_t> kept_counts;      // (G, E)
  std::vector<int64_t> counts;           // (E) before dropping
  double entropy_sum = 0;
  int64_t dropped = 0;                   // assignments not reaching an expert
  // Distances of the decisions from flipping: k-th vs (k+1)-th score; for `probability`,
  // the smallest gap between two competitors' gates; for `random`, |u - 2 g2|.
  double topk_margin = 1e9, gate_gap = 1e9, random_margin = 1e9;
};

// Section 2 of MODEL.md, directly, in double. Expert e of the global E lives in `layer`
// (ep = 1: every expert is local).
inline Reference ReferenceForward(MoELayer& layer, const Tensor& h, int64_t T, bool training,
                           int64_t step, int64_t first_token) {
  const MoEConfig& c = layer.config();
  const int64_t N = h.dim(0), d = c.d_model, E = c.num_experts, k = c.top_k, G = N / T;
  const float* hp = h.data<float>();
  const float* wr = layer.router_weight().data<float>();
  const float* bias = layer.expert_bias().defined() ? layer.expert_bias().data<float>() : nullptr;
  const bool jitter = training && c.jitter_eps > 0;
  const RngKey jitter_key{c.seed, StreamId(StrCat("layers.", layer.layer_id(),
                                                  ".moe.router.jitter.step.", step))};
  const RngKey second_key{c.seed, StreamId(StrCat("layers.", layer.layer_id(),
                                                  ".moe.router.second_expert.step.", step))};
  const double cf = training ? c.capacity_factor : c.eval_capacity_factor;
  const int64_t C = cf > 0 ? static_cast<int64_t>(std::ceil(cf * T * k / E - 1e-9)) : -1;

  Reference r;
  r.y.assign(N * d, 0.0);
  r.indices.assign(N * k, -1);
  r.gates.assign(N * k, 0.0);
  r.kept.assign(N * k, 0);
  r.kept_counts.assign(G * E, 0);
  r.counts.assign(E, 0);
  std::vector<uint8_t> competes(N * k, 1);
  std::vector<double> probs(N * E);

  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> f(E, 0.0), P(E, 0.0);
    double zsum = 0;
    for (int64_t t = g * T; t < (g + 1) * T; ++t) {
      std::vector<double> logits(E, 0.0);
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t i = 0; i < d; ++i) {
          double x = hp[t * d + i];
          if (jitter) {
            const double u = UniformAt(jitter_key, (first_token + t) * d + i);
            x *= (1.0 - c.jitter_eps) + 2.0 * c.jitter_eps * u;
          }
          logits[e] += x * wr[i * E + e];
        }
      }
      const double m = *std::max_element(logits.begin(), logits.end());
      double s = 0;
      for (double l : logits) s += std::exp(l - m);
      const double lse = m + std::log(s);
      zsum += lse * lse;
      double* p = &probs[t * E];
      for (int64_t e = 0; e < E; ++e) {
        p[e] = std::exp(logits[e] - lse);
        P[e] += p[e] / T;
        r.entropy_sum -= p[e] * std::log(p[e]);
      }
      // Top-k by score, ties to the lower index: a stable sort by decreasing score.
      std::vector<int> order(E);
      std::iota(order.begin(), order.end(), 0);
      auto score = [&](int e) { return p[e] + (bias ? bias[e] : 0.0); };
      std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return score(a) > score(b); });
      if (k < E) r.topk_margin = std::min(r.topk_margin, score(order[k - 1]) - score(order[k]));
      double gsum = 0;
      for (int64_t j = 0; j < k; ++j) gsum += p[order[j]];
      for (int64_t j = 0; j < k; ++j) {
        r.indices[t * k + j] = order[j];
        r.gates[t * k + j] = c.normalize_gates ? p[order[j]] / gsum : p[order[j]];
        f[order[j]] += 1.0 / (T * k);
        ++r.counts[order[j]];
      }
      if (c.second_expert_policy == SecondExpertPolicy::kRandom) {
        const double g2 = p[order[1]] / (p[order[0]] + p[order[1]]);
        const double u = UniformAt(second_key, first_token + t);
        competes[t * k + 1] = u < 2 * g2;
        r.random_margin = std::min(r.random_margin, std::abs(u - 2 * g2));
      }
    }
    double aux = 0;
    for (int64_t e = 0; e < E; ++e) aux += f[e] * P[e];
    r.aux.push_back(c.aux_loss_coef * E * aux);
    r.z.push_back(c.z_loss_coef * zsum / T);

    // Admission in priority order.
    std::vector<std::pair<int64_t, int64_t>> order;  // (t, j)
    if (c.drop_policy == DropPolicy::kPosition) {
      for (int64_t j = 0; j < k; ++j)
        for (int64_t t = g * T; t < (g + 1) * T; ++t) order.push_back({t, j});
    } else {
      for (int64_t t = g * T; t < (g + 1) * T; ++t)
        for (int64_t j = 0; j < k; ++j) order.push_back({t, j});
      std::stable_sort(order.begin(), order.end(), [&](auto a, auto b) {
        return r.gates[a.first * k + a.second] > r.gates[b.first * k + b.second];
      });
      std::vector<double> sorted;
      for (auto [t, j] : order) sorted.push_back(r.gates[t * k + j]);
      for (size_t i = 1; i < sorted.size(); ++i)
        r.gate_gap = std::min(r.gate_gap, sorted[i - 1] - sorted[i]);
    }
    std::vector<int64_t> taken(E, 0);
    for (auto [t, j] : order) {
      if (!competes[t * k + j]) continue;
      const int e = r.indices[t * k + j];
      if (C < 0 || taken[e] < C) {
        r.kept[t * k + j] = 1;
        ++r.kept_counts[g * E + e];
      }
      ++taken[e];
    }
  }

  // Experts, combine, shared experts.
  for (int64_t t = 0; t < N; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      if (!r.kept[t * k + j]) {
        ++r.dropped;
        continue;
      }
      std::vector<double> out = Mlp(layer.experts(), r.indices[t * k + j], hp + t * d);
      for (int64_t i = 0; i < d; ++i) r.y[t * d + i] += r.gates[t * k + j] * out[i];
    }
    if (layer.shared()) {
      std::vector<double> out = Mlp(layer.shared()->experts(), 0, hp + t * d);
      for (int64_t i = 0; i < d; ++i) r.y[t * d + i] += out[i];
    }
  }
  return r;
}


// Every parameter of the layer with its gradient, in a fixed order: the router weight, the
// routed experts', then the shared experts'.
struct Param {
  std::string name;
  Tensor value, grad;
};
inline std::vector<Param> ParamsOf(MoELayer& layer) {
  std::vector<Param> ps = {{"router.weight", layer.router_weight(), layer.grad_router_weight()}};
  for (const parallel::Parameter& p : layer.experts().Parameters())
    ps.push_back({"experts." + p.name, p.value, p.grad});
  if (layer.shared()) {
    for (const parallel::Parameter& p : layer.shared()->experts().Parameters())
      ps.push_back({"shared." + p.name, p.value, p.grad});
  }
  return ps;
}

}  // namespace switchyard::moe::testing
