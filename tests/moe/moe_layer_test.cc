// The MoE layer (moe/moe_layer.h) on one process (ep = 1, a local communicator), against
// MODEL.md sections 2 and 3:
//  - Forward against an independent naive reference written here in double (softmax of
//    h @ Wr, top-k with ties to the lower index, gates, capacity admission recomputed by
//    hand for both drop policies, GShard's random second choice, per-expert MLPs,
//    gate-weighted sum, shared experts, aux and z per group, router entropy).
//  - Backward against central finite differences of
//      L = sum(y * dy) + sum_g (daux_g * aux_g + dz_g * z_g)
//    for h, the router weight and every expert and shared-expert parameter. Inputs are
//    chosen so that no perturbation flips a routing or admission decision: the margins are
//    asserted before, and every perturbed Forward's routing is compared with the base one.
//  - The statistics add up, and two Forward calls over the two halves of the groups Add()
//    up to one Forward over all of them.
//  - Bad settings are rejected with messages that name the key and the value.
#include "moe/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "kernels/random.h"

namespace switchyard::moe {
namespace {

constexpr uint64_t kDataSeed = 4242;

// (shape) values std * N(0, 1) from a Philox stream of the test's own.
Tensor Normal(const Shape& shape, uint64_t stream, float std) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillNormal(t, RngKey{kDataSeed, stream}, 0, 0.0f, std);
  return t;
}

MoEConfig Config(int64_t E, int64_t k, Activation act) {
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
MoELayer MakeLayer(const MoEConfig& config, dist::Communicator* ep, uint64_t seed = 7) {
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

double Gelu(double x) {
  const double c = std::sqrt(2.0 / M_PI);
  return 0.5 * x * (1.0 + std::tanh(c * (x + 0.044715 * x * x * x)));
}
double Silu(double x) { return x / (1.0 + std::exp(-x)); }

// Local expert `le` of `ex` applied to the row x (d), in double.
std::vector<double> Mlp(const Experts& ex, int64_t le, const float* x) {
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
Reference ReferenceForward(MoELayer& layer, const Tensor& h, int64_t T, bool training,
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

// ---- Forward vs the reference ----------------------------------------------------------

struct Case {
  std::string name;
  MoEConfig config;
  int64_t groups = 2, group_tokens = 16;
  bool training = true;
  bool expect_drops = false;
  std::vector<float> expert_bias;  // aux-loss-free bias values (expert_bias_rate > 0)
};

Case MakeCase(const std::string& name, const MoEConfig& config) {
  Case c;
  c.name = name;
  c.config = config;
  return c;
}

std::vector<Case> ForwardCases() {
  std::vector<Case> cases;
  {
    Case c = MakeCase("top1_gelu_cf1", Config(4, 1, Activation::kGelu));
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.01f;
    c.expect_drops = true;
    cases.push_back(c);
  }
  {
    Case c = MakeCase("top2_swiglu_normalised_dropless", Config(4, 2, Activation::kSwiglu));
    c.config.normalize_gates = true;
    c.config.capacity_factor = 0.0f;
    c.config.aux_loss_coef = 0.05f;
    c.config.z_loss_coef = 0.001f;
    cases.push_back(c);
  }
  {
    Case c = MakeCase("relu_bias_shared", Config(4, 2, Activation::kRelu));
    c.config.bias = true;
    c.config.num_shared_experts = 2;
    c.config.d_shared = 3;
    c.config.capacity_factor = 1.0f;
    c.config.z_loss_coef = 0.01f;
    cases.push_back(c);
  }
  {
    Case c = MakeCase("top2_probability_drop", Config(4, 2, Activation::kGelu));
    c.config.drop_policy = DropPolicy::kProbability;
    c.config.capacity_factor = 0.75f;
    c.expect_drops = true;
    cases.push_back(c);
  }
  {
    // Aux-loss-free bias steers the choice; gates stay the unbiased probs.
    Case c = MakeCase("top2_probability_expert_bias", Config(4, 2, Activation::kGelu));
    c.config.drop_policy = DropPolicy::kProbability;
    c.config.expert_bias_rate = 0.001f;
    c.config.capacity_factor = 1.0f;
    c.expert_bias = {0.15f, -0.1f, 0.0f, 0.3f};
    c.expect_drops = true;
    cases.push_back(c);
  }
  {
    Case c = MakeCase("top2_random_second_cf1", Config(4, 2, Activation::kGelu));
    c.config.second_expert_policy = SecondExpertPolicy::kRandom;
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.01f;
    cases.push_back(c);
  }
  {
    Case c = MakeCase("jitter_train", Config(4, 2, Activation::kGelu));
    c.config.jitter_eps = 0.1f;
    c.config.capacity_factor = 1.0f;
    c.config.eval_capacity_factor = 1.5f;
    c.config.z_loss_coef = 0.01f;
    cases.push_back(c);
    c.name = "jitter_eval";  // no jitter, eval_capacity_factor
    c.training = false;
    cases.push_back(c);
  }
  {
    Case c = MakeCase("E1", Config(1, 1, Activation::kGelu));
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.01f;
    c.config.z_loss_coef = 0.01f;
    cases.push_back(c);
  }
  {
    Case c = MakeCase("k_equals_E", Config(3, 3, Activation::kSwiglu));
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.01f;
    cases.push_back(c);
    c.name = "k_equals_E_normalised_position_cf_half";
    c.config.normalize_gates = true;
    c.config.capacity_factor = 0.5f;
    c.expect_drops = true;
    cases.push_back(c);
  }
  return cases;
}

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

class MoELayerForwardTest : public ::testing::TestWithParam<Case> {};

TEST_P(MoELayerForwardTest, MatchesTheReference) {
  const Case& c = GetParam();
  auto ep = dist::MakeLocalCommunicator();
  MoELayer layer = MakeLayer(c.config, ep.get());
  if (!c.expert_bias.empty()) {
    ASSERT_TRUE(layer.expert_bias().defined());
    layer.expert_bias().CopyFrom(Tensor::FromVector(c.expert_bias, {c.config.num_experts}));
  }
  const int64_t T = c.group_tokens, G = c.groups, N = G * T, d = c.config.d_model;
  const int64_t E = c.config.num_experts, k = c.config.top_k;
  const int64_t step = 5, first_token = 1000;
  Tensor h = Normal({N, d}, 1, 1.0f);
  MoEForward out = layer.Forward(h, T, c.training, step, first_token);
  Reference ref = ReferenceForward(layer, h, T, c.training, step, first_token);

  // The decisions must be far from flipping for the comparison to be meaningful.
  std::printf("[ %s ] top-k margin %.3g, gate gap %.3g, random margin %.3g, dropped %lld of %lld\n",
              c.name.c_str(), ref.topk_margin, ref.gate_gap, ref.random_margin,
              static_cast<long long>(ref.dropped), static_cast<long long>(N * k));
  ASSERT_GT(ref.topk_margin, 1e-4);
  ASSERT_GT(ref.gate_gap, 1e-5);
  ASSERT_GT(ref.random_margin, 1e-5);
  if (c.expect_drops) {
    EXPECT_GT(ref.dropped, 0) << "the case is meant to drop assignments";
  }

  ASSERT_EQ(out.acts.router.size(), static_cast<size_t>(G));
  for (int64_t g = 0; g < G; ++g) {
    std::vector<int32_t> idx = out.acts.router[g].indices.ToVector<int32_t>();
    for (int64_t i = 0; i < T * k; ++i) ASSERT_EQ(idx[i], ref.indices[g * T * k + i]) << "group " << g;
  }
  const float* gates = out.acts.gates.data<float>();
  for (int64_t i = 0; i < N * k; ++i) EXPECT_NEAR(gates[i], ref.gates[i], 1e-6) << "gate " << i;
  // The kept set, from the dispatch plan.
  std::vector<uint8_t> kept(N * k, 0);
  for (int64_t s : out.acts.plan->slot()) kept[s] = 1;
  EXPECT_EQ(kept, ref.kept);
  EXPECT_EQ(out.groups.tokens_per_expert_kept, ref.kept_counts);
  EXPECT_EQ(out.stats.tokens_per_expert, ref.counts);
  EXPECT_EQ(out.stats.dropped(), ref.dropped);

  const float* y = out.y.data<float>();
  double max_err = 0;
  for (int64_t i = 0; i < N * d; ++i) {
    const double err = std::abs(y[i] - ref.y[i]) / std::max(1.0, std::abs(ref.y[i]));
    max_err = std::max(max_err, err);
    EXPECT_LE(err, 1e-5) << "y[" << i / d << ", " << i % d << "] = " << y[i] << " vs " << ref.y[i];
  }
  // A token with every assignment dropped (and no shared experts) gives exactly zero.
  if (!layer.shared()) {
    for (int64_t t = 0; t < N; ++t) {
      bool any = false;
      for (int64_t j = 0; j < k; ++j) any |= ref.kept[t * k + j] != 0;
      if (any) continue;
      for (int64_t i = 0; i < d; ++i) EXPECT_EQ(y[t * d + i], 0.0f) << "all-dropped token " << t;
    }
  }
  for (int64_t g = 0; g < G; ++g) {
    EXPECT_NEAR(out.groups.aux[g], ref.aux[g], 1e-6 * std::max(1.0, ref.aux[g])) << "aux of group " << g;
    EXPECT_NEAR(out.groups.z[g], ref.z[g], 1e-6 * std::max(1.0, ref.z[g])) << "z of group " << g;
  }
  EXPECT_NEAR(out.stats.entropy_sum, ref.entropy_sum, 1e-5 * ref.entropy_sum);
  std::printf("[ %s ] max relative error of y %.3g\n", c.name.c_str(), max_err);
  (void)E;
}

INSTANTIATE_TEST_SUITE_P(Configs, MoELayerForwardTest, ::testing::ValuesIn(ForwardCases()),
                         [](const auto& info) { return info.param.name; });

// ---- Gradients vs finite differences ---------------------------------------------------

struct Param {
  std::string name;
  Tensor value, grad;
};

std::vector<Param> AllParams(MoELayer& layer) {
  std::vector<Param> ps = {{"router.weight", layer.router_weight(), layer.grad_router_weight()}};
  for (const NamedParameter& p : layer.experts().Parameters())
    ps.push_back({"experts." + p.name, p.value, p.grad});
  if (layer.shared()) {
    for (const NamedParameter& p : layer.shared()->experts().Parameters())
      ps.push_back({"shared." + p.name, p.value, p.grad});
  }
  return ps;
}

// Everything a perturbation could flip: each token's chosen experts and which of them were
// kept (as a set: the order inside the top-k does not change the function when k = E).
std::vector<int64_t> RoutingSignature(const MoEForward& f) {
  const int64_t k = f.acts.gates.dim(1), n = f.acts.gates.dim(0);
  std::vector<int32_t> idx;
  for (const RouterOutput& r : f.acts.router) {
    for (int32_t i : r.indices.ToVector<int32_t>()) idx.push_back(i);
  }
  std::vector<uint8_t> kept(n * k, 0);
  for (int64_t s : f.acts.plan->slot()) kept[s] = 1;
  std::vector<int64_t> sig;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int64_t> tok;
    for (int64_t j = 0; j < k; ++j) tok.push_back(2 * idx[t * k + j] + kept[t * k + j]);
    std::sort(tok.begin(), tok.end());
    sig.insert(sig.end(), tok.begin(), tok.end());
  }
  return sig;
}

struct GradCase {
  std::string name;
  MoEConfig config;
  bool training = true;
};

GradCase MakeGradCase(const std::string& name, const MoEConfig& config) {
  GradCase c;
  c.name = name;
  c.config = config;
  return c;
}

std::vector<GradCase> GradCases() {
  std::vector<GradCase> cases;
  {
    GradCase c = MakeGradCase("top1_gelu_cf1_aux_z", Config(4, 1, Activation::kGelu));
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeGradCase("top2_swiglu_normalised_dropless", Config(4, 2, Activation::kSwiglu));
    c.config.normalize_gates = true;
    c.config.capacity_factor = 0.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeGradCase("top2_gelu_unnormalised_cf1", Config(4, 2, Activation::kGelu));
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeGradCase("relu_bias_shared_jitter", Config(4, 2, Activation::kRelu));
    c.config.bias = true;
    c.config.normalize_gates = true;
    c.config.num_shared_experts = 2;
    c.config.d_shared = 3;
    c.config.jitter_eps = 0.2f;
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeGradCase("swiglu_bias_shared_jitter_unnormalised", Config(4, 2, Activation::kSwiglu));
    c.config.bias = true;
    c.config.num_shared_experts = 1;
    c.config.jitter_eps = 0.2f;
    c.config.capacity_factor = 0.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeGradCase("top2_probability_drop", Config(4, 2, Activation::kGelu));
    c.config.drop_policy = DropPolicy::kProbability;
    c.config.normalize_gates = true;
    c.config.capacity_factor = 0.75f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeGradCase("k_equals_E_normalised", Config(3, 3, Activation::kGelu));
    c.config.normalize_gates = true;
    c.config.capacity_factor = 0.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  return cases;
}

void PrintTo(const GradCase& c, std::ostream* os) { *os << c.name; }

class MoELayerGradientTest : public ::testing::TestWithParam<GradCase> {};

// Central differences with step 2e-3 (parameters and inputs are O(0.1..1)), L accumulated
// in double from the f32 outputs. Tolerance per element: |fd - an| <= 5e-3 * |an| + 5e-4
// * max(1, max |an| over the tensor); the float rounding of L divided by the step and the
// O(step^2) truncation error are ~1e-4 here. The test prints the largest fraction of that
// tolerance used per tensor.
//
// The input h is the first of a fixed list of streams whose routing is far from every
// decision boundary: k-th vs (k+1)-th score apart by > 2e-3 (a step moves a prob by at most
// ~5e-4 here) and, for the probability policy, gates apart by > 1e-3. Every perturbed
// Forward's routing is compared with the base anyway (`flips` must stay 0).
TEST_P(MoELayerGradientTest, MatchesFiniteDifferences) {
  const GradCase& c = GetParam();
  auto ep = dist::MakeLocalCommunicator();
  MoELayer layer = MakeLayer(c.config, ep.get());
  const int64_t G = 2, T = 8, N = G * T, d = c.config.d_model;
  const int64_t step = 11, first_token = 640;
  Tensor h;
  uint64_t stream = 100;
  for (; stream < 200; ++stream) {
    h = Normal({N, d}, stream, 1.0f);
    Reference ref = ReferenceForward(layer, h, T, c.training, step, first_token);
    if (ref.topk_margin > 2e-3 && ref.gate_gap > 1e-3) {
      std::printf("[ %s ] input stream %llu: top-k margin %.3g, gate gap %.3g, dropped %lld\n",
                  c.name.c_str(), static_cast<unsigned long long>(stream), ref.topk_margin,
                  ref.gate_gap, static_cast<long long>(ref.dropped));
      break;
    }
  }
  ASSERT_LT(stream, 200u) << "no input with routing margins large enough";
  Tensor dy = Normal({N, d}, 3, 1.0f);
  const std::vector<float> daux = {0.7f, 1.3f}, dz = {0.9f, -0.4f};

  auto loss = [&]() {
    MoEForward f = layer.Forward(h, T, c.training, step, first_token);
    const float* y = f.y.data<float>();
    const float* w = dy.data<float>();
    double l = 0;
    for (int64_t i = 0; i < N * d; ++i) l += static_cast<double>(y[i]) * w[i];
    for (int64_t g = 0; g < G; ++g) l += static_cast<double>(daux[g]) * f.groups.aux[g] +
                                         static_cast<double>(dz[g]) * f.groups.z[g];
    return std::make_pair(l, RoutingSignature(f));
  };

  layer.ZeroGrad();
  MoEForward base = layer.Forward(h, T, c.training, step, first_token);
  const std::vector<int64_t> signature = RoutingSignature(base);
  Tensor dh = layer.Backward(base.acts, dy, daux, dz);

  std::vector<Param> params = AllParams(layer);
  params.insert(params.begin(), Param{"h", h, dh});
  const double eps = 2e-3;
  int flips = 0;
  for (Param& p : params) {
    ASSERT_EQ(p.value.numel(), p.grad.numel()) << p.name;
    float* v = p.value.data<float>();
    const float* an = p.grad.data<float>();
    double scale = 1.0;
    for (int64_t i = 0; i < p.value.numel(); ++i) scale = std::max(scale, std::abs(double(an[i])));
    double used = 0;
    for (int64_t i = 0; i < p.value.numel(); ++i) {
      const float saved = v[i];
      v[i] = static_cast<float>(saved + eps);
      const double up_eps = double(v[i]) - saved;
      auto [lp, sp] = loss();
      v[i] = static_cast<float>(saved - eps);
      const double down_eps = saved - double(v[i]);
      auto [lm, sm] = loss();
      v[i] = saved;
      if (sp != signature || sm != signature) {
        ++flips;
        continue;
      }
      const double fd = (lp - lm) / (up_eps + down_eps);
      const double tol = 5e-3 * std::abs(an[i]) + 5e-4 * scale;
      used = std::max(used, std::abs(fd - an[i]) / tol);
      EXPECT_NEAR(fd, an[i], tol) << c.name << " " << p.name << "[" << i << "]";
    }
    std::printf("[ %s ] %-16s max |grad| %.3g, tolerance used %.3f\n", c.name.c_str(),
                p.name.c_str(), scale, used);
  }
  EXPECT_EQ(flips, 0) << "perturbations flipped routing decisions: pick other inputs";

  // Gradients accumulate: a second Backward doubles every parameter gradient (up to the
  // rounding of the accumulating GEMMs).
  std::vector<std::vector<float>> once;
  for (const Param& p : AllParams(layer)) once.push_back(p.grad.ToVector<float>());
  layer.Backward(base.acts, dy, daux, dz);
  size_t i = 0;
  for (const Param& p : AllParams(layer)) {
    std::vector<float> twice = p.grad.ToVector<float>();
    for (size_t j = 0; j < twice.size(); ++j)
      ASSERT_NEAR(twice[j], 2 * once[i][j], 1e-5 * std::max(1.0f, std::abs(twice[j])))
          << p.name << "[" << j << "]";
    ++i;
  }
  layer.ZeroGrad();
  for (const Param& p : AllParams(layer)) {
    for (float g : p.grad.ToVector<float>()) ASSERT_EQ(g, 0.0f) << p.name << " after ZeroGrad";
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, MoELayerGradientTest, ::testing::ValuesIn(GradCases()),
                         [](const auto& info) { return info.param.name; });

// Several micro-batches in flight (the caller keeps each Forward's activations): backward
// in reverse order gives the same gradients as one at a time, and zero tokens routed is
// allowed (a rank whose micro-batch is empty still joins the collectives).
TEST(MoELayerInFlightTest, InterleavedMicroBatchesMatchSequential) {
  auto ep = dist::MakeLocalCommunicator();
  MoEConfig c = Config(4, 2, Activation::kSwiglu);
  c.bias = true;
  c.num_shared_experts = 1;
  c.jitter_eps = 0.1f;
  c.capacity_factor = 1.0f;
  c.aux_loss_coef = 0.1f;
  c.z_loss_coef = 0.01f;
  MoELayer layer = MakeLayer(c, ep.get());
  const int64_t T = 8, d = c.d_model;
  Tensor ha = Normal({2 * T, d}, 8, 1.0f), hb = Normal({3 * T, d}, 9, 1.0f);
  Tensor dya = Normal({2 * T, d}, 10, 1.0f), dyb = Normal({3 * T, d}, 11, 1.0f);
  const std::vector<float> da = {0.5f, 0.25f}, db = {1.0f, 0.5f, 0.125f};

  MoEForward fa = layer.Forward(ha, T, true, 1, 0);
  Tensor dha = layer.Backward(fa.acts, dya, da, da);
  MoEForward fb = layer.Forward(hb, T, true, 1, 2 * T);
  Tensor dhb = layer.Backward(fb.acts, dyb, db, db);
  std::vector<std::vector<float>> sequential;
  for (const Param& p : AllParams(layer)) sequential.push_back(p.grad.ToVector<float>());

  layer.ZeroGrad();
  MoEForward ia = layer.Forward(ha, T, true, 1, 0);
  MoEForward ib = layer.Forward(hb, T, true, 1, 2 * T);
  Tensor idhb = layer.Backward(ib.acts, dyb, db, db);
  Tensor idha = layer.Backward(ia.acts, dya, da, da);
  EXPECT_EQ(ia.y.ToVector<float>(), fa.y.ToVector<float>());
  EXPECT_EQ(ib.y.ToVector<float>(), fb.y.ToVector<float>());
  EXPECT_EQ(idha.ToVector<float>(), dha.ToVector<float>());
  EXPECT_EQ(idhb.ToVector<float>(), dhb.ToVector<float>());
  size_t i = 0;
  for (const Param& p : AllParams(layer)) {
    std::vector<float> g = p.grad.ToVector<float>();
    for (size_t j = 0; j < g.size(); ++j)
      EXPECT_NEAR(g[j], sequential[i][j], 1e-5 * std::max(1.0f, std::abs(g[j]))) << p.name << "[" << j << "]";
    ++i;
  }

  // An empty micro-batch: no groups, no output, no gradient.
  layer.ZeroGrad();
  MoEForward empty = layer.Forward(Tensor::Empty({0, d}, DType::kF32), T, true, 1, 0);
  EXPECT_EQ(empty.y.dim(0), 0);
  EXPECT_EQ(empty.stats.tokens, 0);
  EXPECT_EQ(empty.stats.groups, 0);
  EXPECT_EQ(empty.stats.dropped(), 0);
  Tensor dh0 = layer.Backward(empty.acts, Tensor::Empty({0, d}, DType::kF32), {}, {});
  EXPECT_EQ(dh0.dim(0), 0);
  for (const Param& p : AllParams(layer)) {
    for (float g : p.grad.ToVector<float>()) ASSERT_EQ(g, 0.0f) << p.name;
  }
}

// ---- Statistics ------------------------------------------------------------------------

void ExpectStatsConsistent(const MoEForward& out, const MoEConfig& c, int64_t G, int64_t T) {
  const MoEStats& s = out.stats;
  const int64_t E = c.num_experts, k = c.top_k;
  ASSERT_EQ(s.tokens_per_expert.size(), static_cast<size_t>(E));
  ASSERT_EQ(s.tokens_per_expert_kept.size(), static_cast<size_t>(E));
  EXPECT_EQ(s.tokens, G * T);
  EXPECT_EQ(s.assignments, G * T * k);
  EXPECT_EQ(s.groups, G);
  const int64_t before = std::accumulate(s.tokens_per_expert.begin(), s.tokens_per_expert.end(), int64_t{0});
  const int64_t kept = std::accumulate(s.tokens_per_expert_kept.begin(), s.tokens_per_expert_kept.end(), int64_t{0});
  EXPECT_EQ(before, s.tokens * k);
  EXPECT_EQ(s.dropped(), s.assignments - kept);
  EXPECT_DOUBLE_EQ(s.dropped_fraction(), static_cast<double>(s.assignments - kept) / s.assignments);
  for (int64_t e = 0; e < E; ++e) EXPECT_LE(s.tokens_per_expert_kept[e], s.tokens_per_expert[e]);

  // Per-group values add up to the totals.
  ASSERT_EQ(out.groups.aux.size(), static_cast<size_t>(G));
  ASSERT_EQ(out.groups.z.size(), static_cast<size_t>(G));
  ASSERT_EQ(out.groups.dropped.size(), static_cast<size_t>(G));
  ASSERT_EQ(out.groups.tokens_per_expert_kept.size(), static_cast<size_t>(G * E));
  std::vector<int64_t> per_expert(E, 0);
  int64_t dropped = 0;
  double aux = 0, z = 0;
  for (int64_t g = 0; g < G; ++g) {
    int64_t group_kept = 0;
    for (int64_t e = 0; e < E; ++e) {
      per_expert[e] += out.groups.tokens_per_expert_kept[g * E + e];
      group_kept += out.groups.tokens_per_expert_kept[g * E + e];
    }
    EXPECT_EQ(out.groups.dropped[g], T * k - group_kept) << "group " << g;
    dropped += out.groups.dropped[g];
    aux += out.groups.aux[g];
    z += out.groups.z[g];
  }
  EXPECT_EQ(per_expert, s.tokens_per_expert_kept);
  EXPECT_EQ(dropped, s.dropped());
  EXPECT_NEAR(s.aux_sum, aux, 1e-12 * std::max(1.0, aux));
  EXPECT_NEAR(s.z_sum, z, 1e-12 * std::max(1.0, z));
  EXPECT_DOUBLE_EQ(s.aux_mean(), s.aux_sum / G);
  EXPECT_DOUBLE_EQ(s.z_mean(), s.z_sum / G);

  for (int64_t ep = 1; ep <= E; ++ep) {
    if (E % ep != 0) continue;
    std::vector<int64_t> per_rank = s.TokensPerEpRank(ep);
    ASSERT_EQ(per_rank.size(), static_cast<size_t>(ep));
    EXPECT_EQ(std::accumulate(per_rank.begin(), per_rank.end(), int64_t{0}), kept) << "ep " << ep;
    for (int64_t r = 0; r < ep; ++r) {
      int64_t want = 0;
      for (int64_t e = r * (E / ep); e < (r + 1) * (E / ep); ++e) want += s.tokens_per_expert_kept[e];
      EXPECT_EQ(per_rank[r], want) << "ep " << ep << " rank " << r;
    }
  }

  EXPECT_GE(s.router_entropy(), 0.0);
  EXPECT_LE(s.router_entropy(), std::log(static_cast<double>(E)) + 1e-9);
  EXPECT_LE(s.min_load_share(), s.mean_load_share());
  EXPECT_LE(s.mean_load_share(), s.max_load_share());
  if (kept > 0) {
    const auto [mn, mx] = std::minmax_element(s.tokens_per_expert_kept.begin(), s.tokens_per_expert_kept.end());
    EXPECT_DOUBLE_EQ(s.min_load_share(), static_cast<double>(*mn) / kept);
    EXPECT_DOUBLE_EQ(s.max_load_share(), static_cast<double>(*mx) / kept);
    EXPECT_DOUBLE_EQ(s.mean_load_share(), 1.0 / E);
  }
}

TEST(MoELayerStatsTest, StatisticsAddUp) {
  auto ep = dist::MakeLocalCommunicator();
  for (int variant = 0; variant < 4; ++variant) {
    MoEConfig c = Config(8, variant == 0 ? 1 : 2, Activation::kGelu);
    c.capacity_factor = variant == 2 ? 0.0f : 1.0f;
    c.aux_loss_coef = 0.01f;
    c.z_loss_coef = 0.001f;
    if (variant == 3) c.second_expert_policy = SecondExpertPolicy::kRandom;
    MoELayer layer = MakeLayer(c, ep.get());
    const int64_t G = 4, T = 24;
    Tensor h = Normal({G * T, c.d_model}, 4, 1.0f);
    MoEForward out = layer.Forward(h, T, true, 0, 0);
    SCOPED_TRACE(StrCat("variant ", variant));
    ExpectStatsConsistent(out, c, G, T);
    if (variant != 2) {
      EXPECT_GT(out.stats.dropped(), 0) << "capacity 1.0 over 8 experts should drop";
    } else {
      EXPECT_EQ(out.stats.dropped(), 0) << "dropless";
    }
  }
}

TEST(MoELayerStatsTest, StatsOfAllDroppedAreZeroShares) {
  // No kept assignment anywhere: shares are 0, not NaN.
  MoEStats s;
  s.tokens_per_expert = {3, 1};
  s.tokens_per_expert_kept = {0, 0};
  s.tokens = 4;
  s.assignments = 4;
  EXPECT_EQ(s.dropped(), 4);
  EXPECT_EQ(s.min_load_share(), 0.0);
  EXPECT_EQ(s.max_load_share(), 0.0);
  EXPECT_EQ(MoEStats().router_entropy(), 0.0);
  EXPECT_EQ(MoEStats().dropped_fraction(), 0.0);
}

// An empty MoEStats is the identity of Add, on either side.
TEST(MoELayerStatsTest, AddingEmptyStatsChangesNothing) {
  MoEStats s;
  s.tokens_per_expert = {3, 1};
  s.tokens_per_expert_kept = {2, 1};
  s.tokens = 2;
  s.assignments = 4;
  s.entropy_sum = 1.5;
  s.aux_sum = 0.25;
  s.z_sum = 0.125;
  s.groups = 1;
  MoEStats total;
  total.Add(s);
  total.Add(MoEStats());
  EXPECT_EQ(total.tokens_per_expert, s.tokens_per_expert);
  EXPECT_EQ(total.tokens_per_expert_kept, s.tokens_per_expert_kept);
  EXPECT_EQ(total.tokens, 2);
  EXPECT_EQ(total.assignments, 4);
  EXPECT_EQ(total.groups, 1);
  EXPECT_EQ(total.entropy_sum, 1.5);
  EXPECT_EQ(total.dropped(), 1);
  total.Add(s);
  EXPECT_EQ(total.tokens_per_expert, (std::vector<int64_t>{6, 2}));
  EXPECT_EQ(total.dropped(), 2);
  MoEStats other;
  other.tokens_per_expert = {1, 1, 1};
  other.tokens_per_expert_kept = {1, 1, 1};
  EXPECT_DEATH(total.Add(other), "3 experts into 2");
}

// Capacity is per group, so routing the groups in two calls and adding the statistics
// equals routing them all at once (and so do the outputs).
TEST(MoELayerStatsTest, HalvesAddUpToTheWhole) {
  auto ep = dist::MakeLocalCommunicator();
  for (float cf : {0.0f, 1.0f}) {
    MoEConfig c = Config(4, 2, Activation::kSwiglu);
    c.capacity_factor = cf;
    c.normalize_gates = true;
    c.jitter_eps = 0.1f;  // keyed by the global token: first_token must carry it
    c.aux_loss_coef = 0.01f;
    c.z_loss_coef = 0.001f;
    MoELayer layer = MakeLayer(c, ep.get());
    const int64_t G = 6, T = 10, d = c.d_model, first = 300;
    Tensor h = Normal({G * T, d}, 5, 1.0f);
    MoEForward whole = layer.Forward(h, T, true, 2, first);
    MoEForward lo = layer.Forward(h.Slice(0, G / 2 * T), T, true, 2, first);
    MoEForward hi = layer.Forward(h.Slice(G / 2 * T, G * T), T, true, 2, first + G / 2 * T);
    MoEStats sum;
    sum.Add(lo.stats);
    sum.Add(hi.stats);
    SCOPED_TRACE(StrCat("capacity_factor ", cf));
    if (cf > 0) {
      EXPECT_GT(whole.stats.dropped(), 0);
    }
    EXPECT_EQ(sum.tokens_per_expert, whole.stats.tokens_per_expert);
    EXPECT_EQ(sum.tokens_per_expert_kept, whole.stats.tokens_per_expert_kept);
    EXPECT_EQ(sum.tokens, whole.stats.tokens);
    EXPECT_EQ(sum.assignments, whole.stats.assignments);
    EXPECT_EQ(sum.groups, whole.stats.groups);
    EXPECT_EQ(sum.dropped(), whole.stats.dropped());
    EXPECT_NEAR(sum.entropy_sum, whole.stats.entropy_sum, 1e-12 * whole.stats.entropy_sum);
    EXPECT_NEAR(sum.aux_sum, whole.stats.aux_sum, 1e-12 * whole.stats.aux_sum);
    EXPECT_NEAR(sum.z_sum, whole.stats.z_sum, 1e-12 * whole.stats.z_sum);
    for (int64_t g = 0; g < G; ++g) {
      const MoEGroupValues& part = g < G / 2 ? lo.groups : hi.groups;
      const int64_t pg = g % (G / 2);
      EXPECT_EQ(part.aux[pg], whole.groups.aux[g]);
      EXPECT_EQ(part.z[pg], whole.groups.z[g]);
      EXPECT_EQ(part.dropped[pg], whole.groups.dropped[g]);
    }
    std::vector<float> y = whole.y.ToVector<float>(), y0 = lo.y.ToVector<float>(), y1 = hi.y.ToVector<float>();
    y0.insert(y0.end(), y1.begin(), y1.end());
    ASSERT_EQ(y.size(), y0.size());
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y0[i], y[i], 1e-6 * std::max(1.0f, std::abs(y[i])));
  }
}

// ---- Errors ------------------------------------------------------------------------------

std::string Message(const Status& s) { return std::string(s.message()); }

TEST(MoEConfigErrorsTest, NamesTheKeyAndTheValue) {
  MoEConfig c = Config(2, 3, Activation::kGelu);
  Status s = c.Validate();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(Message(s).find("moe.top_k=3"), std::string::npos) << Message(s);
  EXPECT_NE(Message(s).find("moe.num_experts=2"), std::string::npos) << Message(s);

  c = Config(6, 2, Activation::kGelu);
  EXPECT_TRUE(c.Validate().ok());
  StatusOr<int64_t> per = c.ExpertsPerRank(4);
  ASSERT_FALSE(per.ok());
  EXPECT_NE(Message(per.status()).find("moe.num_experts=6"), std::string::npos) << Message(per.status());
  EXPECT_NE(Message(per.status()).find("parallel.ep=4"), std::string::npos) << Message(per.status());
  per = c.ExpertsPerRank(0);
  ASSERT_FALSE(per.ok());
  EXPECT_NE(Message(per.status()).find("parallel.ep=0"), std::string::npos) << Message(per.status());
  EXPECT_EQ(c.ExpertsPerRank(3).value(), 2);
  EXPECT_EQ(c.ExpertsPerRank(6).value(), 1);

  // Capacity factors: <= 0 is dropless (valid); NaN and infinity are not capacities.
  for (float cf : {-1.0f, 0.0f, 0.5f, 1.25f}) {
    c.capacity_factor = cf;
    c.eval_capacity_factor = cf;
    EXPECT_TRUE(c.Validate().ok()) << cf;
  }
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  for (float bad : {nan, inf, -inf}) {
    c.capacity_factor = bad;
    c.eval_capacity_factor = 1.0f;
    s = c.Validate();
    ASSERT_FALSE(s.ok()) << "capacity_factor " << bad;
    EXPECT_NE(Message(s).find("moe.capacity_factor"), std::string::npos) << Message(s);
    EXPECT_NE(Message(s).find(StrCat(bad)), std::string::npos) << Message(s);
    c.capacity_factor = 1.0f;
    c.eval_capacity_factor = bad;
    s = c.Validate();
    ASSERT_FALSE(s.ok()) << "eval_capacity_factor " << bad;
    EXPECT_NE(Message(s).find("moe.eval_capacity_factor"), std::string::npos) << Message(s);
    EXPECT_NE(Message(s).find(StrCat(bad)), std::string::npos) << Message(s);
  }
}

TEST(MoELayerErrorsTest, RejectsBadInputShapes) {
  auto ep = dist::MakeLocalCommunicator();
  MoEConfig c = Config(4, 2, Activation::kGelu);
  MoELayer layer = MakeLayer(c, ep.get());
  Tensor h = Normal({10, c.d_model}, 6, 1.0f);
  EXPECT_DEATH(layer.Forward(h, 3, true, 0, 0), "is not \\(G \\* 3, 6\\)");
  MoEForward out = layer.Forward(h, 5, true, 0, 0);
  std::vector<float> one = {1.0f};
  EXPECT_DEATH(layer.Backward(out.acts, Normal({10, c.d_model}, 7, 1.0f), one, one),
               "one value per group \\(2\\)");
}

}  // namespace
}  // namespace switchyard::moe
