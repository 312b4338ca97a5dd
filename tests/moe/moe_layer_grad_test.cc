// The MoE layer's backward (ep = 1) against central finite differences of
//   L = sum(y * dy) + sum_g (daux_g * aux_g + dz_g * z_g)
// for h, the router weight and every expert and shared-expert parameter. Inputs are chosen
// so that no perturbation flips a routing or admission decision: the margins are asserted
// before, and every perturbed Forward's routing is compared with the base one. Also:
// several micro-batches in flight accumulate like sequential ones, and
// moe.routed_scaling_factor 4 scales the output and every gradient by exactly 4.
#include "moe/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <span>
#include <string>
#include <vector>

#include "tests/moe/moe_layer_test_util.h"

namespace switchyard::moe {
namespace {

using namespace testing;  // switchyard::moe::testing: the shared helpers

// ---- Gradients vs finite differences ---------------------------------------------------


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

// ---- Accumulation bounds ------------------------------------------------------------------
// A Backward adds into each parameter gradient element a fixed list of terms t_1..t_m: rows of
// the weight-gradient GEMMs (x_r * delta_r, OpenBLAS adding its one k-block into the
// gradient: k + 1 roundings), rows of the bias gradients (summed in order into it), the
// router's per-group GEMMs (G of them, T + 1 roundings each). Its terms are the same values
// whichever gradient they are added into (the same kernels on the same activations), so in
// any summation tree, with S = sum |t| (Higham eq. 3.13):
//   one Backward from 0:        g1 = sum t + e1,           |e1| <= gamma_m S;
//   a second into g1:           g2 = g1 + sum t + e2,      |e2| <= gamma_m (|g1| + S),
// so |g2 - 2 g1| <= gamma_m (3 + gamma_m) S < 3 (m + 3) u S, m <= N + G (N rows, G groups).
// Two micro-batches A and B accumulated in either order are both within gamma_{mA+mB}
// (S_A + S_B) of the exact sum: |AB - BA| <= 2 (mA + mB + 3) u (S_A + S_B).
// S itself comes from the engine: every term belongs to one token t (a row of dy, the
// router's input row x_t times its dlogits row), so a Backward with dy and the router's
// input zeroed except row t (daux and dz kept: they only reach the router through dlogits_t)
// leaves exactly token t's terms in the gradients, and S = sum_t |that gradient|.

// TermScale (moe_layer_test_util.h) gives S per parameter, ParamsOf order.

using GradCase = LayerCase;

std::vector<GradCase> GradCases() {
  std::vector<GradCase> cases;
  {
    GradCase c = MakeCase("top1_gelu_cf1_aux_z", Config(4, 1, Activation::kGelu));
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeCase("top2_swiglu_normalised_dropless", Config(4, 2, Activation::kSwiglu));
    c.config.normalize_gates = true;
    c.config.capacity_factor = 0.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeCase("top2_gelu_unnormalised_cf1", Config(4, 2, Activation::kGelu));
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeCase("relu_bias_shared_jitter", Config(4, 2, Activation::kRelu));
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
    GradCase c = MakeCase("swiglu_bias_shared_jitter_unnormalised", Config(4, 2, Activation::kSwiglu));
    c.config.bias = true;
    c.config.num_shared_experts = 1;
    c.config.jitter_eps = 0.2f;
    c.config.capacity_factor = 0.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeCase("top2_probability_drop", Config(4, 2, Activation::kGelu));
    c.config.drop_policy = DropPolicy::kProbability;
    c.config.normalize_gates = true;
    c.config.capacity_factor = 0.75f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeCase("routed_scaling_normalised_shared", Config(4, 2, Activation::kSwiglu));
    c.config.routed_scaling_factor = 2.5f;
    c.config.normalize_gates = true;
    c.config.num_shared_experts = 1;
    c.config.capacity_factor = 1.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  {
    GradCase c = MakeCase("k_equals_E_normalised", Config(3, 3, Activation::kGelu));
    c.config.normalize_gates = true;
    c.config.capacity_factor = 0.0f;
    c.config.aux_loss_coef = 0.3f;
    c.config.z_loss_coef = 0.1f;
    cases.push_back(c);
  }
  return cases;
}

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
  LocalLayer local(c.config);
  MoELayer& layer = local.layer;
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

  std::vector<Param> params = ParamsOf(layer);
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

  // Gradients accumulate: a second Backward doubles every parameter gradient, up to the
  // rounding of the accumulation (see "Accumulation bounds": |g2 - 2 g1| <= 3 (m + 3) u S,
  // m = N + G). Exactly double where one term list is added once into 0 and once into g1
  // (2 fl(s) is exact); the bias and router gradients add several pieces, so not there.
  std::vector<std::vector<float>> once, twice;
  for (const Param& p : ParamsOf(layer)) once.push_back(p.grad.ToVector<float>());
  layer.Backward(base.acts, dy, daux, dz);
  for (const Param& p : ParamsOf(layer)) twice.push_back(p.grad.ToVector<float>());
  const std::vector<std::vector<double>> terms = TermScale(layer, base.acts, dy, daux, dz);
  size_t i = 0;
  for (const Param& p : ParamsOf(layer)) {
    std::vector<double> doubled(once[i].begin(), once[i].end());
    for (double& g : doubled) g *= 2;
    test_util::ExpectWithinProductBound(twice[i], doubled, terms[i], N + G,
                                        c.name + " 2nd Backward " + p.name, /*c=*/3.0);
    ++i;
  }
  layer.ZeroGrad();
  for (const Param& p : ParamsOf(layer)) {
    for (float g : p.grad.ToVector<float>()) ASSERT_EQ(g, 0.0f) << p.name << " after ZeroGrad";
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, MoELayerGradientTest, ::testing::ValuesIn(GradCases()),
                         [](const auto& info) { return info.param.name; });

// Several micro-batches in flight (the caller keeps each Forward's activations): backward
// in reverse order gives the same gradients as one at a time, and zero tokens routed is
// allowed (a rank whose micro-batch is empty still joins the collectives).
TEST(MoELayerInFlightTest, InterleavedMicroBatchesMatchSequential) {
  MoEConfig c = Config(4, 2, Activation::kSwiglu);
  c.bias = true;
  c.num_shared_experts = 1;
  c.jitter_eps = 0.1f;
  c.capacity_factor = 1.0f;
  c.aux_loss_coef = 0.1f;
  c.z_loss_coef = 0.01f;
  LocalLayer local(c);
  MoELayer& layer = local.layer;
  const int64_t T = 8, d = c.d_model;
  Tensor ha = Normal({2 * T, d}, 8, 1.0f), hb = Normal({3 * T, d}, 9, 1.0f);
  Tensor dya = Normal({2 * T, d}, 10, 1.0f), dyb = Normal({3 * T, d}, 11, 1.0f);
  const std::vector<float> da = {0.5f, 0.25f}, db = {1.0f, 0.5f, 0.125f};

  MoEForward fa = layer.Forward(ha, T, true, 1, 0);
  Tensor dha = layer.Backward(fa.acts, dya, da, da);
  MoEForward fb = layer.Forward(hb, T, true, 1, 2 * T);
  Tensor dhb = layer.Backward(fb.acts, dyb, db, db);
  std::vector<std::vector<float>> sequential;
  for (const Param& p : ParamsOf(layer)) sequential.push_back(p.grad.ToVector<float>());

  layer.ZeroGrad();
  MoEForward ia = layer.Forward(ha, T, true, 1, 0);
  MoEForward ib = layer.Forward(hb, T, true, 1, 2 * T);
  Tensor idhb = layer.Backward(ib.acts, dyb, db, db);
  Tensor idha = layer.Backward(ia.acts, dya, da, da);
  EXPECT_EQ(ia.y.ToVector<float>(), fa.y.ToVector<float>());
  EXPECT_EQ(ib.y.ToVector<float>(), fb.y.ToVector<float>());
  EXPECT_EQ(idha.ToVector<float>(), dha.ToVector<float>());
  EXPECT_EQ(idhb.ToVector<float>(), dhb.ToVector<float>());
  // B then A against A then B: the same terms added in another order, so (see "Accumulation
  // bounds") within 2 (mA + mB + 3) u (S_A + S_B), m = rows + groups of each micro-batch.
  std::vector<std::vector<float>> interleaved;
  for (const Param& p : ParamsOf(layer)) interleaved.push_back(p.grad.ToVector<float>());
  std::vector<std::vector<double>> terms = TermScale(layer, ia.acts, dya, da, da);
  const std::vector<std::vector<double>> terms_b = TermScale(layer, ib.acts, dyb, db, db);
  const int64_t m = (2 * T + 2) + (3 * T + 3);
  size_t i = 0;
  for (const Param& p : ParamsOf(layer)) {
    for (size_t j = 0; j < terms[i].size(); ++j) terms[i][j] += terms_b[i][j];
    test_util::ExpectWithinProductBound(interleaved[i], sequential[i], terms[i], m,
                                        "in flight " + p.name);
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
  for (const Param& p : ParamsOf(layer)) {
    for (float g : p.grad.ToVector<float>()) ASSERT_EQ(g, 0.0f) << p.name;
  }
}

// moe.routed_scaling_factor s multiplies the routed experts' combined output. At s = 4, a
// power of two (every product and sum then scales exactly), with no shared experts and no
// aux or z loss, the output, dh and every parameter gradient are exactly 4 times those at
// s = 1, with unnormalised and normalised gates, under capacity and jitter.
TEST(MoELayerScalingTest, PowerOfTwoFactorScalesEverythingExactly) {
  for (bool normalize : {false, true}) {
    SCOPED_TRACE(normalize ? "normalised gates" : "unnormalised gates");
    MoEConfig c = Config(4, 2, Activation::kSwiglu);
    c.normalize_gates = normalize;
    c.capacity_factor = 1.0f;
    c.jitter_eps = 0.1f;
    LocalLayer one(c);
    c.routed_scaling_factor = 4.0f;
    LocalLayer four(c);
    const int64_t T = 8, d = c.d_model;
    Tensor h = Normal({2 * T, d}, 12, 1.0f), dy = Normal({2 * T, d}, 13, 1.0f);
    const std::vector<float> zero = {0.0f, 0.0f};
    MoEForward f1 = one.layer.Forward(h, T, true, 1, 0);
    MoEForward f4 = four.layer.Forward(h, T, true, 1, 0);
    EXPECT_GT(f1.stats.dropped(), 0);  // capacity 1.0 drops some: the mask is scaled alike
    Tensor dh1 = one.layer.Backward(f1.acts, dy, zero, zero);
    Tensor dh4 = four.layer.Backward(f4.acts, dy, zero, zero);
    auto times4 = [](std::vector<float> v) {
      for (float& x : v) x *= 4.0f;
      return v;
    };
    EXPECT_EQ(f4.y.ToVector<float>(), times4(f1.y.ToVector<float>()));
    EXPECT_EQ(dh4.ToVector<float>(), times4(dh1.ToVector<float>()));
    const std::vector<Param> p1 = ParamsOf(one.layer), p4 = ParamsOf(four.layer);
    ASSERT_EQ(p1.size(), p4.size());
    for (size_t i = 0; i < p1.size(); ++i) {
      const std::vector<float> g1 = p1[i].grad.ToVector<float>();
      EXPECT_EQ(p4[i].grad.ToVector<float>(), times4(g1)) << p1[i].name;
      EXPECT_NE(std::count(g1.begin(), g1.end(), 0.0f), static_cast<long>(g1.size())) << p1[i].name;
    }
  }
}

}  // namespace
}  // namespace switchyard::moe
