// Helpers shared by the MoE layer tests (moe_layer_test.cc, moe_layer_grad_test.cc,
// moe_layer_stats_test.cc): deterministic inputs, a config, a layer from Init, and the
// independent double-precision reference of the layer's forward (MODEL.md sections 2-3).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"
#include "tests/testing/tolerance.h"

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

// ---- Forward-error bounds ----------------------------------------------------------------
// Each bound below holds for any f32 evaluation of the layer, whatever the summation order
// (OpenBLAS core type, blocking, threads, row count): products by Higham's Theorem 3.5 (see
// tests/testing/tolerance.h), elementwise functions by their f32 formulas, and propagation
// through Lipschitz constants. Two f32 evaluations then differ by at most twice the bound.

inline constexpr double kU = test_util::kF32Unit;
// gamma_n = n u / (1 - n u) <= (n + 2) u while n (n + 2) u <= 2 (n up to ~5000).
inline double Gamma(int64_t n) { return static_cast<double>(n + 2) * kU; }

// Largest |f'| of the activations: gelu (tanh form) 1.1289 at x ~ 1.5; silu 1.0998.
inline constexpr double kGeluSlope = 1.13, kSiluSlope = 1.1;
// Second-order terms (an error times an error) are below 1% of the first-order ones here.
inline constexpr double kSecondOrder = 1.01;

// The expert MLP y = act(x W1 + b1) W2 + b2 (swiglu: silu(x W1 + b1) * (x W3)) on one row,
// in double from the f32 parameters, and `bound`: |y_f32 - y| <= bound for the engine's f32
// evaluation (experts.cc: a GEMM, + b1, the activation, a GEMM, + b2):
//   a: |da| <= gamma_{d+1} (|x||W1| + |b1|)             (b: gamma_d |x||W3|)
//   h: |dh| <= L |da| + e |h|, L the slope bound above, e the f32 activation's own error:
//      gelu x / (1 + exp(-2 v)), v = c (x + 0.044715 x^3): v to 6u relative, vec_math's
//      2-ulp exp then carries 2 |v| 6u, + and / one u each: (12 |v| + 5) u, taken as
//      (16 |v| + 8) u; silu(a) b: 2-ulp exp of -a, +, /, two products: 6u, taken as 8u;
//      relu: exact. swiglu: |dh| <= 1.1 |da| (|b| + |db|) + |silu a| |db| + 8u |h|.
//   y: |dy| <= gamma_{f+1} ((|h| + |dh|) |W2| + |b2|) + |dh| |W2|.
struct MlpBound {
  std::vector<double> y, bound;  // (d)
};
inline MlpBound MlpWithBound(const Experts& ex, int64_t le, const float* x) {
  const ExpertsOptions& o = ex.options();
  const int64_t d = o.d_model, f = o.d_hidden;
  const float* w1 = ex.w1().data<float>() + le * d * f;
  const float* w2 = ex.w2().data<float>() + le * f * d;
  const float* w3 = ex.w3().defined() ? ex.w3().data<float>() + le * d * f : nullptr;
  const float* b1 = o.bias ? ex.b1().data<float>() + le * f : nullptr;
  const float* b2 = o.bias && o.adds_output_bias ? ex.b2().data<float>() + le * d : nullptr;
  std::vector<double> hidden(f), dh(f);
  MlpBound r{std::vector<double>(d, 0.0), std::vector<double>(d, 0.0)};
  for (int64_t j = 0; j < f; ++j) {
    double a = b1 ? b1[j] : 0.0, sa = b1 ? std::abs(b1[j]) : 0.0, b = 0.0, sb = 0.0;
    for (int64_t i = 0; i < d; ++i) {
      a += static_cast<double>(x[i]) * w1[i * f + j];
      sa += std::abs(static_cast<double>(x[i]) * w1[i * f + j]);
      if (w3) {
        b += static_cast<double>(x[i]) * w3[i * f + j];
        sb += std::abs(static_cast<double>(x[i]) * w3[i * f + j]);
      }
    }
    const double da = Gamma(b1 ? d + 1 : d) * sa, db = Gamma(d) * sb;
    switch (o.activation) {
      case Activation::kGelu: {
        hidden[j] = Gelu(a);
        const double v = std::sqrt(2.0 / M_PI) * (a + 0.044715 * a * a * a);
        dh[j] = kGeluSlope * da + (16 * std::abs(v) + 8) * kU * std::abs(hidden[j]);
        break;
      }
      case Activation::kRelu:
        hidden[j] = a > 0 ? a : 0.0;
        dh[j] = da;
        break;
      case Activation::kSwiglu:
        hidden[j] = Silu(a) * b;
        dh[j] = kSiluSlope * da * (std::abs(b) + db) + std::abs(Silu(a)) * db +
                8 * kU * std::abs(hidden[j]);
        break;
    }
  }
  for (int64_t i = 0; i < d; ++i) {
    double y = b2 ? b2[i] : 0.0, s = b2 ? std::abs(b2[i]) : 0.0, carried = 0.0;
    for (int64_t j = 0; j < f; ++j) {
      y += hidden[j] * w2[j * d + i];
      s += (std::abs(hidden[j]) + dh[j]) * std::abs(w2[j * d + i]);
      carried += dh[j] * std::abs(w2[j * d + i]);
    }
    r.y[i] = y;
    r.bound[i] = kSecondOrder * (Gamma(b2 ? f + 1 : f) * s + carried);
  }
  return r;
}

// |got_i - want_i| <= factor bound_i for every i; prints the worst fraction of it used.
template <typename G, typename W>
void ExpectWithinBound(const std::vector<G>& got, const std::vector<W>& want,
                       const std::vector<double>& bound, const std::string& what,
                       double factor = 1.0) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(bound.size(), want.size()) << what;
  if (want.empty()) return;
  const test_util::BoundUsed used = test_util::WorstFractionOfBound(got, want, bound, factor);
  EXPECT_LE(used.fraction, 1.0) << what << ": element " << used.index << " is "
                                << static_cast<double>(got[used.index]) << ", expected "
                                << static_cast<double>(want[used.index]) << ", bound "
                                << factor * bound[used.index];
  std::printf("  %-40s forward bound used %.3f\n", what.c_str(), used.fraction);
}

// Local expert `le` of `ex` applied to the row x (d), in double.
inline std::vector<double> Mlp(const Experts& ex, int64_t le, const float* x) {
  return MlpWithBound(ex, le, x).y;
}

struct Reference {
  std::vector<double> y;                 // (N, d)
  std::vector<double> y_bound;           // (N, d): |y_f32 - y| <= y_bound
  std::vector<double> gate_bound;        // (N, k): |gate_f32 - gate| <= gate_bound
  std::vector<double> aux_bound, z_bound;  // (G)
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
// (ep = 1: every expert is local). With the bounds of any f32 evaluation (see "Forward-error
// bounds" above), per token:
//   logits l = (h * jitter) Wr: |dl_e| <= gamma_{d+4} (|h~||Wr|)_e (the jitter factor and its
//     product: a few roundings more per term);
//   probs (moe_routing.cc: f32 exp(l - m), a double sum, an f32 reciprocal and product):
//     |dp_e| <= p_e eps_p, eps_p = 2 max |dl| + 2 (max |l - m| + 6) u (softmax moves p by at
//     most 2 max |dl| relative; the exp's argument rounding |l - m| u, exp, 1 / sum, product);
//   gates: eps_g = eps_p, normalised 2 eps_p + gamma_{k+1} (the f32 sum of k, the quotient);
//   y = sum_j g_j Y_j + S: |dy| <= sum_j (eps_g g_j (|Y_j| + B_j) + g_j B_j) + B_S
//     + gamma_{k+1} (sum_j g_j |Y_j| + |S|), B the experts' MlpWithBound;
//   aux = c E sum_e f_e P_e, all terms >= 0: relative (max eps_p + gamma_{T+E+2});
//   z = c sum lse^2 / T: |dlse| <= max |dl| + 2 (|lse| + E + 4) u, then first order.
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
  r.y_bound.assign(N * d, 0.0);
  r.gate_bound.assign(N * k, 0.0);
  std::vector<double> gate_eps(N, 0.0);
  r.indices.assign(N * k, -1);
  r.gates.assign(N * k, 0.0);
  r.kept.assign(N * k, 0);
  r.kept_counts.assign(G * E, 0);
  r.counts.assign(E, 0);
  std::vector<uint8_t> competes(N * k, 1);
  std::vector<double> probs(N * E);

  for (int64_t g = 0; g < G; ++g) {
    std::vector<double> f(E, 0.0), P(E, 0.0);
    double zsum = 0, max_eps_p = 0, dzsum = 0;
    for (int64_t t = g * T; t < (g + 1) * T; ++t) {
      std::vector<double> logits(E, 0.0);
      double max_dl = 0;
      for (int64_t e = 0; e < E; ++e) {
        double scale = 0;
        for (int64_t i = 0; i < d; ++i) {
          double x = hp[t * d + i];
          if (jitter) {
            const double u = UniformAt(jitter_key, (first_token + t) * d + i);
            x *= (1.0 - c.jitter_eps) + 2.0 * c.jitter_eps * u;
          }
          logits[e] += x * wr[i * E + e];
          scale += std::abs(x * wr[i * E + e]);
        }
        max_dl = std::max(max_dl, Gamma(d + 4) * scale);
      }
      const double m = *std::max_element(logits.begin(), logits.end());
      const double spread = m - *std::min_element(logits.begin(), logits.end());
      double s = 0;
      for (double l : logits) s += std::exp(l - m);
      const double lse = m + std::log(s);
      zsum += lse * lse;
      const double eps_p = 2 * max_dl + 2 * (spread + 6) * kU;
      max_eps_p = std::max(max_eps_p, eps_p);
      gate_eps[t] = c.normalize_gates ? 2 * eps_p + Gamma(k + 1) : eps_p;
      const double dlse = max_dl + 2 * (std::abs(lse) + E + 4) * kU;
      dzsum += 2 * std::abs(lse) * dlse + dlse * dlse;
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
        r.gate_bound[t * k + j] = gate_eps[t] * r.gates[t * k + j];
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
    r.aux_bound.push_back(kSecondOrder * (max_eps_p + Gamma(T + E + 2)) * r.aux.back());
    r.z_bound.push_back(kSecondOrder * (c.z_loss_coef * dzsum / T + Gamma(T + 4) * r.z.back()));

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
    std::vector<double> magnitude(d, 0.0);  // sum_j g_j |Y_j| + |S|
    double* bound = &r.y_bound[t * d];
    for (int64_t j = 0; j < k; ++j) {
      if (!r.kept[t * k + j]) {
        ++r.dropped;
        continue;
      }
      const MlpBound out = MlpWithBound(layer.experts(), r.indices[t * k + j], hp + t * d);
      const double g = r.gates[t * k + j];
      for (int64_t i = 0; i < d; ++i) {
        r.y[t * d + i] += g * out.y[i];
        magnitude[i] += g * std::abs(out.y[i]);
        bound[i] += gate_eps[t] * g * (std::abs(out.y[i]) + out.bound[i]) + g * out.bound[i];
      }
    }
    if (layer.shared()) {
      const MlpBound out = MlpWithBound(layer.shared()->experts(), 0, hp + t * d);
      for (int64_t i = 0; i < d; ++i) {
        r.y[t * d + i] += out.y[i];
        magnitude[i] += std::abs(out.y[i]);
        bound[i] += out.bound[i];
      }
    }
    for (int64_t i = 0; i < d; ++i) bound[i] = kSecondOrder * (bound[i] + Gamma(k + 1) * magnitude[i]);
  }
  return r;
}


// ---- Cases and set-up ------------------------------------------------------------------

// A named configuration of a layer test (forward: moe_layer_test.cc, gradients:
// moe_layer_grad_test.cc), printed by its name.
struct LayerCase {
  std::string name;
  MoEConfig config;
  int64_t groups = 2, group_tokens = 16;
  bool training = true;
  bool expect_drops = false;
  std::vector<float> expert_bias;  // aux-loss-free bias values (expert_bias_rate > 0)
};
inline LayerCase MakeCase(const std::string& name, const MoEConfig& config) {
  LayerCase c;
  c.name = name;
  c.config = config;
  return c;
}
inline void PrintTo(const LayerCase& c, std::ostream* os) { *os << c.name; }

// A layer on a local communicator (ep = 1), kept together so the communicator outlives it.
struct LocalLayer {
  std::unique_ptr<dist::Communicator> ep = dist::MakeLocalCommunicator();
  MoELayer layer;
  explicit LocalLayer(const MoEConfig& config) : layer(MakeLayer(config, ep.get())) {}
};

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

// The scale of the "Accumulation bounds" (tests/moe/moe_layer_grad_test.cc): every term a
// Backward adds into a parameter gradient belongs to one token t, so S = sum over tokens of
// |token t's contribution| bounds any summation order's error by gamma_m S.
// Per parameter (ParamsOf order), S = sum over tokens of |token t's contribution|. Clobbers
// the layer's gradients (zeroes them at the end).
inline std::vector<std::vector<double>> TermScale(MoELayer& layer, MoEActivations& acts, const Tensor& dy,
                                           std::span<const float> daux,
                                           std::span<const float> dz) {
  const int64_t N = dy.dim(0), d = dy.dim(1), T = acts.group_tokens;
  std::vector<std::vector<double>> scale;
  for (const Param& p : ParamsOf(layer)) scale.emplace_back(p.grad.numel(), 0.0);
  std::vector<Tensor> inputs;
  for (const RouterOutput& r : acts.router) inputs.push_back(r.input);
  const std::vector<float> dyv = dy.ToVector<float>();
  for (int64_t t = 0; t < N; ++t) {
    std::vector<float> row(N * d, 0.0f);
    std::copy(dyv.begin() + t * d, dyv.begin() + (t + 1) * d, row.begin() + t * d);
    for (size_t g = 0; g < inputs.size(); ++g) {
      std::vector<float> in(inputs[g].numel(), 0.0f);
      if (t / T == static_cast<int64_t>(g)) {
        const std::vector<float> all = inputs[g].ToVector<float>();
        std::copy(all.begin() + (t % T) * d, all.begin() + (t % T + 1) * d,
                  in.begin() + (t % T) * d);
      }
      acts.router[g].input = Tensor::FromVector(in, inputs[g].shape());
    }
    layer.ZeroGrad();
    layer.Backward(acts, Tensor::FromVector(row, {N, d}), daux, dz);
    size_t i = 0;
    for (const Param& p : ParamsOf(layer)) {
      const std::vector<float> g = p.grad.ToVector<float>();
      for (size_t j = 0; j < g.size(); ++j) scale[i][j] += std::abs(double(g[j]));
      ++i;
    }
  }
  for (size_t g = 0; g < inputs.size(); ++g) acts.router[g].input = inputs[g];
  layer.ZeroGrad();
  return scale;
}

}  // namespace switchyard::moe::testing
