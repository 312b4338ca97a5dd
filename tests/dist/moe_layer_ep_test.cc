// The MoE layer over expert parallelism (run with 2, 4 and 8 ranks): MODEL.md section 4's
// layout invariance. Every rank builds the same G = 2 * world routing groups; rank r routes
// groups [r * G / R, (r + 1) * G / R) through a layer whose experts are split over an ep
// group, and also runs a one-rank reference layer (ep = 1, every expert) over ALL groups.
// Layouts: ep = world (the world communicator is the ep group), and a mesh with
// ep = world / 2, edp = 2 (ParallelContext: expert gradients are summed over edp).
//
// Checked against the reference: Init gives every rank the slice of the same model; y and
// dh of my groups; the router-weight and shared-expert gradients summed over the world; the
// expert gradients summed over edp against the reference's slice; aux, z, kept counts and
// drops of every group; MoEStats::AllReduce over the world against the reference's stats;
// the rows each ep rank's experts received against TokensPerEpRank.
//
// Tolerances: routing, counts, aux and z are identical (the same f32 computation on the
// same group). y: each side is an f32 evaluation of the same layer on the same rows, within
// ReferenceForward's y_bound (tests/moe/moe_layer_test_util.h) of the exact value whatever
// the row split and summation order, so |y - y_ref| <= 2 y_bound. Gradients: the layout adds
// the same per-token terms (the same kernels on the same routing and activations) in
// another order (its own rows, then the sum over ranks), so by the "Accumulation bounds" of
// tests/moe/moe_layer_grad_test.cc both are within gamma_m S of the exact sum of the terms,
// S = TermScale (sum over tokens of |token t's contribution|), m <= N + G + R (N tokens,
// G router GEMMs, R - 1 additions of the sum over ranks): |g - g_ref| <= 2 (m + 3) u S.
// dh: 1e-5 in relative norm (tests/testing/tolerance.h), each element 1e-5 of the largest.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "engine/dist/parallel_context.h"
#include "engine/dist/process.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"
#include "tests/moe/moe_layer_test_util.h"
#include "tests/testing/tolerance.h"

namespace switchyard::moe {
namespace {

constexpr uint64_t kDataSeed = 777;
constexpr uint64_t kModelSeed = 31;
constexpr int64_t kLayer = 1;
constexpr float kInitStd = 0.3f;  // O(1) router logits and expert outputs

// The same tensor on every rank.
Tensor GlobalNormal(const Shape& shape, uint64_t stream, float std = 1.0f) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillNormal(t, RngKey{kDataSeed, stream}, 0, 0.0f, std);
  return t;
}

// Init leaves biases at zero; give them values keyed by the global expert (like Init does
// for the weights) so that every layout holds the same model.
void FillBiases(MoELayer& layer) {
  auto fill = [](Experts& ex, const std::string& name) {
    const ExpertsOptions& o = ex.options();
    if (Tensor b1 = ex.b1(); b1.defined())
      kernels::FillNormal(b1, RngKey{kModelSeed, StreamId(name + ".b1")}, o.first * o.d_hidden, 0.0f, 0.2f);
    if (Tensor b2 = ex.b2(); b2.defined())
      kernels::FillNormal(b2, RngKey{kModelSeed, StreamId(name + ".b2")}, o.first * o.d_model, 0.0f, 0.2f);
  };
  fill(layer.experts(), "test.experts");
  if (layer.shared()) fill(layer.shared()->experts(), "test.shared");
}

MoELayer MakeLayer(const MoEConfig& config, dist::Communicator* ep,
                   const std::vector<float>& expert_bias) {
  MoELayer layer = MoELayer::Init(config, kLayer, ep, kModelSeed, kInitStd);
  FillBiases(layer);
  if (!expert_bias.empty()) {
    layer.expert_bias().CopyFrom(
        Tensor::FromVector(expert_bias, {static_cast<int64_t>(expert_bias.size())}));
  }
  return layer;
}

// ||got - want|| / ||want|| <= rtol (2-norms): a bound on the whole tensor, which summation
// order (OpenBLAS's kernel for this machine, the row blocking, the reduction over ranks) cannot
// break where an element cancels, as an elementwise relative error with a tiny floor can; a
// wrong or missing row moves it by far more. Each element is also held to `atol_scale` of the
// tensor's largest (a floor at the scale of the tensor, not of the element).
void ExpectClose(const Tensor& got, const Tensor& want, double rtol, double atol_scale,
                 const std::string& what) {
  ASSERT_EQ(got.numel(), want.numel()) << what;
  std::vector<float> g = got.ToVector<float>(), w = want.ToVector<float>();
  double scale = 0;
  for (float v : w) scale = std::max(scale, double(std::abs(v)));
  const double rel = test_util::RelativeNormError(g, w);
  EXPECT_LE(rel, rtol) << what << ": relative norm error " << rel;
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double tol = atol_scale * scale;
    const double err = std::abs(double(g[i]) - w[i]);
    if (!(err <= tol) && bad++ < 5) {
      ADD_FAILURE() << what << "[" << i << "] = " << g[i] << ", reference " << w[i] << " (tol " << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size() << " elements off";
  if (dist::WorldRank() == 0) std::printf("    %-28s tolerance used %.3f\n", what.c_str(), rel / rtol);
}

struct Case {
  std::string name;
  MoEConfig config;
  bool training = true;
  bool expect_drops = false;
  std::vector<float> expert_bias;  // aux-loss-free bias values (expert_bias_rate > 0)
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

MoEConfig BaseConfig() {
  MoEConfig c;
  c.d_model = 8;
  c.num_experts = 16;  // divisible by ep = 1, 2, 4, 8
  c.d_expert = 6;
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  return c;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  {
    Case c;
    c.name = "top1_gelu_cf1";
    c.config = BaseConfig();
    c.config.top_k = 1;
    c.config.capacity_factor = 1.0f;  // C = 2 per group: drops
    c.expect_drops = true;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "top2_swiglu_normalised";
    c.config = BaseConfig();
    c.config.top_k = 2;
    c.config.activation = Activation::kSwiglu;
    c.config.normalize_gates = true;
    c.config.capacity_factor = 1.25f;
    cases.push_back(c);
  }
  {
    Case c;
    c.name = "shared_bias_jitter_train";
    c.config = BaseConfig();
    c.config.top_k = 2;
    c.config.activation = Activation::kRelu;
    c.config.bias = true;
    c.config.num_shared_experts = 2;
    c.config.d_shared = 4;
    c.config.jitter_eps = 0.1f;
    c.config.capacity_factor = 1.0f;
    c.expect_drops = true;
    cases.push_back(c);
  }
  {
    // GShard's random second choice (keyed by the global token) in evaluation, with the
    // eval capacity and the probability drop policy.
    Case c;
    c.name = "top2_random_probability_eval";
    c.config = BaseConfig();
    c.config.top_k = 2;
    c.config.second_expert_policy = SecondExpertPolicy::kRandom;
    c.config.drop_policy = DropPolicy::kProbability;
    c.config.eval_capacity_factor = 0.75f;
    c.training = false;
    c.expect_drops = true;
    cases.push_back(c);
  }
  {
    // Every token's choices forced onto experts 0 and 1 by the aux-loss-free bias: ep rank
    // 0 receives every row, the other ranks' experts receive none (empty expert GEMMs).
    Case c;
    c.name = "hot_top2_dropless";
    c.config = BaseConfig();
    c.config.top_k = 2;
    c.config.capacity_factor = 0.0f;
    c.config.expert_bias_rate = 0.001f;
    c.expert_bias.assign(16, 0.0f);
    c.expert_bias[0] = 2.0f;
    c.expert_bias[1] = 1.0f;
    cases.push_back(c);
    c.name = "hot_top1_cf1";  // and nearly everything dropped
    c.config.top_k = 1;
    c.config.capacity_factor = 1.0f;
    c.expect_drops = true;
    cases.push_back(c);
  }
  return cases;
}

// Sums `t` over `comm` into a new tensor.
Tensor Summed(const Tensor& t, dist::Communicator& comm) {
  Tensor s = t.Clone();
  comm.AllReduce(s, dist::ReduceOp::kSum);
  return s;
}

// One layout: ep is the expert-parallel group of this rank, edp (or null when it has one
// rank) sums the expert gradients.
void CheckLayout(const Case& c, dist::Communicator& world, dist::Communicator& ep,
                 dist::Communicator* edp, const std::string& layout) {
  const int R = world.size(), me = world.rank();
  const int64_t T = 32, G = 2 * R, N = G * T, d = c.config.d_model, E = c.config.num_experts;
  const int64_t step = 3;
  SCOPED_TRACE(c.name + " " + layout);
  if (me == 0) std::printf("[ %s, %s ]\n", c.name.c_str(), layout.c_str());

  // The whole problem, on every rank.
  Tensor h_all = GlobalNormal({N, d}, 1);
  Tensor dy_all = GlobalNormal({N, d}, 2);
  const std::vector<float> d_all(G, 1.0f / G);

  auto local = dist::MakeLocalCommunicator();
  MoELayer ref = MakeLayer(c.config, local.get(), c.expert_bias);
  MoEForward ref_out = ref.Forward(h_all, T, c.training, step, /*first_token=*/0);
  const testing::Reference bounds =
      testing::ReferenceForward(ref, h_all, T, c.training, step, /*first_token=*/0);
  // TermScale clobbers the gradients: before the reference's Backward.
  const std::vector<std::vector<double>> terms =
      testing::TermScale(ref, ref_out.acts, dy_all, d_all, d_all);
  Tensor ref_dh = ref.Backward(ref_out.acts, dy_all, d_all, d_all);
  const int64_t m = N + G + R;  // roundings per gradient term, either side

  MoELayer layer = MakeLayer(c.config, &ep, c.expert_bias);
  const int64_t per_rank = E / ep.size(), first = ep.rank() * per_rank;
  // (EXPECT, not ASSERT, from here on: every rank must reach every collective.)
  EXPECT_EQ(layer.first_expert(), first);
  EXPECT_EQ(layer.experts().options().num_local, per_rank);

  // Init is layout independent: my slice equals the one-rank model's.
  EXPECT_EQ(layer.router_weight().ToVector<float>(), ref.router_weight().ToVector<float>());
  {
    std::vector<parallel::Parameter> mine = layer.experts().Parameters();
    std::vector<parallel::Parameter> all = ref.experts().Parameters();
    EXPECT_EQ(mine.size(), all.size());
    for (size_t i = 0; i < std::min(mine.size(), all.size()); ++i) {
      EXPECT_EQ(mine[i].value.ToVector<float>(),
                all[i].value.Slice(first, first + per_rank).ToVector<float>())
          << "experts." << mine[i].name << " slice [" << first << ", +" << per_rank << ")";
    }
    if (layer.shared()) {
      std::vector<parallel::Parameter> s = layer.shared()->experts().Parameters();
      std::vector<parallel::Parameter> rs = ref.shared()->experts().Parameters();
      for (size_t i = 0; i < s.size(); ++i)
        EXPECT_EQ(s[i].value.ToVector<float>(), rs[i].value.ToVector<float>()) << "shared." << s[i].name;
    }
  }

  // My groups.
  const int64_t g0 = me * G / R, g1 = (me + 1) * G / R, n = (g1 - g0) * T;
  MoEForward out = layer.Forward(h_all.Slice(g0 * T, g1 * T), T, c.training, step, g0 * T);
  const std::vector<float> d_mine(g1 - g0, 1.0f / G);
  Tensor dh = layer.Backward(out.acts, dy_all.Slice(g0 * T, g1 * T), d_mine, d_mine);

  // Routing, counts and per-group values: the same computation on the same group.
  for (int64_t g = g0; g < g1; ++g) {
    EXPECT_EQ(out.groups.aux[g - g0], ref_out.groups.aux[g]) << "aux of group " << g;
    EXPECT_EQ(out.groups.z[g - g0], ref_out.groups.z[g]) << "z of group " << g;
    EXPECT_EQ(out.groups.dropped[g - g0], ref_out.groups.dropped[g]) << "dropped in group " << g;
    std::vector<int64_t> got(out.groups.tokens_per_expert_kept.begin() + (g - g0) * E,
                             out.groups.tokens_per_expert_kept.begin() + (g - g0 + 1) * E);
    std::vector<int64_t> want(ref_out.groups.tokens_per_expert_kept.begin() + g * E,
                              ref_out.groups.tokens_per_expert_kept.begin() + (g + 1) * E);
    EXPECT_EQ(got, want) << "kept per expert in group " << g;
  }
  testing::ExpectWithinBound(
      out.y.ToVector<float>(), ref_out.y.Slice(g0 * T, g1 * T).ToVector<float>(),
      std::vector<double>(bounds.y_bound.begin() + g0 * T * d, bounds.y_bound.begin() + g1 * T * d),
      "y", /*factor=*/2.0);
  ExpectClose(dh, ref_dh.Slice(g0 * T, g1 * T), 1e-5, 1e-5, "dh");
  EXPECT_EQ(out.y.dim(0), n);

  // Gradients: the router (and shared experts) are replicated, so their gradients are
  // summed over every rank; each expert's gradient is summed over the ranks holding it.
  test_util::ExpectWithinProductBound(Summed(layer.grad_router_weight(), world).ToVector<float>(),
                                      ref.grad_router_weight().ToVector<float>(), terms[0], m,
                                      "router.weight grad");
  {
    std::vector<parallel::Parameter> mine = layer.experts().Parameters();
    std::vector<parallel::Parameter> all = ref.experts().Parameters();
    for (size_t i = 0; i < mine.size(); ++i) {
      Tensor g = edp ? Summed(mine[i].grad, *edp) : mine[i].grad;
      const std::vector<double>& t = terms[1 + i];  // ParamsOf order: router, experts, shared
      const size_t per = t.size() / E;               // elements per expert
      test_util::ExpectWithinProductBound(
          g.ToVector<float>(), all[i].grad.Slice(first, first + per_rank).ToVector<float>(),
          std::vector<double>(t.begin() + first * per, t.begin() + (first + per_rank) * per), m,
          "experts." + mine[i].name + " grad");
    }
    if (layer.shared()) {
      std::vector<parallel::Parameter> s = layer.shared()->experts().Parameters();
      std::vector<parallel::Parameter> rs = ref.shared()->experts().Parameters();
      for (size_t i = 0; i < s.size(); ++i)
        test_util::ExpectWithinProductBound(Summed(s[i].grad, world).ToVector<float>(),
                                            rs[i].grad.ToVector<float>(),
                                            terms[1 + all.size() + i], m,
                                            "shared." + s[i].name + " grad");
    }
  }

  // Statistics summed over the world are the reference's.
  MoEStats stats = out.stats;
  stats.AllReduce(world);
  const MoEStats& want = ref_out.stats;
  EXPECT_EQ(stats.tokens_per_expert, want.tokens_per_expert);
  EXPECT_EQ(stats.tokens_per_expert_kept, want.tokens_per_expert_kept);
  EXPECT_EQ(stats.tokens, want.tokens);
  EXPECT_EQ(stats.assignments, want.assignments);
  EXPECT_EQ(stats.groups, want.groups);
  EXPECT_EQ(stats.dropped(), want.dropped());
  EXPECT_NEAR(stats.entropy_sum, want.entropy_sum, 1e-6 * want.entropy_sum);
  EXPECT_NEAR(stats.aux_sum, want.aux_sum, 1e-6 * want.aux_sum);
  EXPECT_NEAR(stats.z_sum, want.z_sum, 1e-6 * want.z_sum);
  EXPECT_NEAR(stats.router_entropy(), want.router_entropy(), 1e-6 * want.router_entropy());
  EXPECT_NEAR(stats.aux_mean(), want.aux_mean(), 1e-6 * want.aux_mean());
  EXPECT_EQ(stats.min_load_share(), want.min_load_share());
  EXPECT_EQ(stats.max_load_share(), want.max_load_share());
  if (c.expect_drops) {
    EXPECT_GT(want.dropped(), 0) << "the case is meant to drop assignments";
  }

  // Rows my experts received, summed over the ep groups (edp), are TokensPerEpRank's.
  Tensor received = Tensor::FromVector<int64_t>({out.acts.plan->received_rows()}, {1});
  if (edp) edp->AllReduce(received, dist::ReduceOp::kSum);
  EXPECT_EQ(received.data<int64_t>()[0], stats.TokensPerEpRank(ep.size())[ep.rank()]);
  if (me == 0) {
    std::printf("    dropped %lld of %lld assignments, entropy %.4f, aux mean %.5f\n",
                static_cast<long long>(want.dropped()), static_cast<long long>(want.assignments),
                want.router_entropy(), want.aux_mean());
  }
}

class MoELayerEpTest : public ::testing::TestWithParam<Case> {};

TEST_P(MoELayerEpTest, WorldIsTheEpGroup) {
  auto world = dist::WorldCommunicator();
  CheckLayout(GetParam(), *world, *world, nullptr, StrCat("ep=", world->size()));
}

TEST_P(MoELayerEpTest, MeshWithEdp2) {
  auto world = dist::WorldCommunicator();
  const int R = world->size();
  if (R < 2) GTEST_SKIP() << "needs 2 ranks for edp = 2";
  auto mesh = dist::Mesh::Create(R, {.ep = R / 2});
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  auto pc = dist::ParallelContext::Create(*world, *mesh);
  ASSERT_TRUE(pc.ok()) << pc.status();
  ASSERT_EQ((*pc)->edp().size(), 2);
  ASSERT_EQ((*pc)->ep().size(), R / 2);
  CheckLayout(GetParam(), *world, (*pc)->ep(), &(*pc)->edp(),
              StrCat("ep=", R / 2, " edp=2 (", (*pc)->Describe(), ")"));
}

INSTANTIATE_TEST_SUITE_P(Configs, MoELayerEpTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace switchyard::moe
