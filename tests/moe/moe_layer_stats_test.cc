// The MoE layer's statistics (MODEL.md section 3) add up, two Forward calls over the two
// halves of the groups Add() up to one Forward over all of them, the expert bias steers the
// choice (not the gates) in training and evaluation alike, and bad settings are rejected
// with messages that name the key and the value.
#include "moe/moe_layer.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/step_readback.h"
#include "moe/router.h"
#include "tests/moe/moe_layer_test_util.h"

namespace switchyard::moe {
namespace {

using namespace testing;  // switchyard::moe::testing: the shared helpers

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
  for (int variant = 0; variant < 4; ++variant) {
    MoEConfig c = Config(8, variant == 0 ? 1 : 2, Activation::kGelu);
    c.capacity_factor = variant == 2 ? 0.0f : 1.0f;
    c.aux_loss_coef = 0.01f;
    c.z_loss_coef = 0.001f;
    if (variant == 3) c.second_expert_policy = SecondExpertPolicy::kRandom;
    LocalLayer local(c);
    MoELayer& layer = local.layer;
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

// A training step's Forward leaves its values in the step's readback (balance sums, admitted
// counts, entropy, aux, z); read back and resolved, the statistics are the ones a Forward
// without the window computes at once, for capacity (both policies, the random second
// choice) and dropless routing.
TEST(MoELayerStatsTest, StatisticsFromTheStepReadbackEqualTheImmediateOnes) {
  for (int variant = 0; variant < 4; ++variant) {
    SCOPED_TRACE(StrCat("variant ", variant));
    MoEConfig c = Config(8, variant == 0 ? 1 : 2, Activation::kGelu);
    c.capacity_factor = variant == 2 ? 0.0f : 1.0f;
    c.aux_loss_coef = 0.01f;
    c.z_loss_coef = 0.001f;
    if (variant == 1) c.drop_policy = DropPolicy::kProbability;
    if (variant == 3) c.second_expert_policy = SecondExpertPolicy::kRandom;
    LocalLayer local(c);
    const int64_t G = 4, T = 24;
    Tensor h = Normal({G * T, c.d_model}, 4, 1.0f);
    const MoEForward want = local.layer.Forward(h, T, true, 0, 0);
    auto ctx = DeviceContext::Create(Device::Cpu());
    StepReadback readback;
    ctx->set_step_readback(&readback);
    MoEForward got = local.layer.Forward(h, T, true, 0, 0, ctx.get());
    ctx->set_step_readback(nullptr);
    EXPECT_FALSE(got.stats.pending_counts.empty()) << "the counts waited for the readback";
    got.stats.Resolve(readback.ReadBack(nullptr));
    EXPECT_EQ(got.stats.tokens_per_expert, want.stats.tokens_per_expert);
    EXPECT_EQ(got.stats.tokens_per_expert_kept, want.stats.tokens_per_expert_kept);
    EXPECT_EQ(got.stats.dropped(), want.stats.dropped());
    EXPECT_EQ(static_cast<double>(got.stats.aux_sum), static_cast<double>(want.stats.aux_sum));
    EXPECT_EQ(got.y.ToVector<float>(), want.y.ToVector<float>());
    if (variant != 2) {
      EXPECT_GT(want.stats.dropped(), 0);
    }
  }
}

// router_lse_sq is the mean over groups of the mean over tokens of logsumexp(logits)^2,
// computed from the router's logits by hand here (in double, the kernel's f32 result being
// one rounding of that), and it is kept whatever moe.z_loss_coef is: with the coefficient
// 0 (no z-loss) it has the same value as with 1e-3, and with 1e-3 it is z / coef to f32
// rounding.
TEST(MoELayerStatsTest, RouterLogsumexpSquaredIsKeptWithoutZLoss) {
  const int64_t G = 3, T = 16;
  double with_z = 0.0;
  for (float coef : {0.0f, 0.001f}) {
    MoEConfig c = Config(8, 2, Activation::kGelu);
    c.z_loss_coef = coef;
    LocalLayer local(c);
    Tensor h = Normal({G * T, c.d_model}, 4, 1.0f);
    MoEForward out = local.layer.Forward(h, T, true, 0, 0);
    SCOPED_TRACE(StrCat("z_loss_coef ", coef));
    ASSERT_EQ(out.acts.router.size(), static_cast<size_t>(G));
    double want = 0.0;
    for (int64_t g = 0; g < G; ++g) {
      const std::vector<float> l = out.acts.router[g].logits.ToVector<float>();
      const int64_t E = c.num_experts;
      ASSERT_EQ(l.size(), static_cast<size_t>(T * E));
      double group = 0.0;
      for (int64_t t = 0; t < T; ++t) {
        double m = l[t * E], sum = 0.0;
        for (int64_t e = 1; e < E; ++e) m = std::max(m, static_cast<double>(l[t * E + e]));
        for (int64_t e = 0; e < E; ++e) sum += std::exp(l[t * E + e] - m);
        const double lse = m + std::log(sum);
        group += lse * lse;
      }
      want += group / T;
    }
    want /= G;
    const double got = out.stats.router_lse_sq();
    ASSERT_GT(want, 0.0);
    // Each group's value is rounded to f32 once (relative 2^-24) after a double sum.
    EXPECT_NEAR(got, want, 1e-6 * want);
    if (coef == 0.0f) {
      EXPECT_EQ(out.stats.z_mean(), 0.0);
      with_z = got;
    } else {
      // The same weights and input: the same logits, so the same statistic, bit for bit.
      EXPECT_EQ(got, with_z);
      EXPECT_NEAR(out.stats.z_mean() / coef, got, 1e-6 * got);
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
  for (float cf : {0.0f, 1.0f}) {
    MoEConfig c = Config(4, 2, Activation::kSwiglu);
    c.capacity_factor = cf;
    c.normalize_gates = true;
    c.jitter_eps = 0.1f;  // keyed by the global token: first_token must carry it
    c.aux_loss_coef = 0.01f;
    c.z_loss_coef = 0.001f;
    LocalLayer local(c);
    MoELayer& layer = local.layer;
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
    // The outputs: both are f32 evaluations of the same function whose row counts differ, so
    // they differ by at most twice the reference's bound of one (ReferenceForward).
    std::vector<float> y = whole.y.ToVector<float>(), y0 = lo.y.ToVector<float>(), y1 = hi.y.ToVector<float>();
    y0.insert(y0.end(), y1.begin(), y1.end());
    const Reference ref = ReferenceForward(layer, h, T, true, 2, first);
    EXPECT_EQ(ref.kept_counts, whole.groups.tokens_per_expert_kept) << "the bound's routing";
    ExpectWithinBound(y0, y, ref.y_bound, StrCat("halves' y, cf ", cf), /*factor=*/2.0);
  }
}

// Aux-loss-free balancing (MODEL.md section 2) end to end through the layer, in training
// and in evaluation alike: a bias of +2 on expert 5 (more than any probability difference)
// sends every token there, the gates stay the unbiased probabilities, and the update from
// the layer's own counts (before dropping) is the hand-computed one.
TEST(MoELayerStatsTest, ExpertBiasSteersTrainingAndEvalAlike) {
  for (ScoreFunction score : {ScoreFunction::kSoftmax, ScoreFunction::kSigmoid}) {
    MoEConfig c = Config(8, 1, Activation::kGelu);
    c.score = score;
    c.expert_bias_rate = 0.001f;
    c.capacity_factor = 1.0f;  // capacity T / 8: the counts must be those before dropping
    c.eval_capacity_factor = 1.0f;
    LocalLayer local(c);
    MoELayer& layer = local.layer;
    Tensor bias = layer.expert_bias();
    ASSERT_TRUE(bias.defined());
    const int64_t G = 2, T = 16, E = c.num_experts, hot = 5;
    Tensor h = Normal({G * T, c.d_model}, 6, 1.0f);
    SCOPED_TRACE(score == ScoreFunction::kSigmoid ? "sigmoid" : "softmax");

    // Unbiased: the tokens spread (so a bias that eval ignored would show).
    const MoEForward plain = layer.Forward(h, T, /*training=*/false, 0, 0);
    int64_t used = 0;
    for (int64_t n : plain.stats.tokens_per_expert) used += n > 0 ? 1 : 0;
    ASSERT_GE(used, 3) << "the unbiased router should use several experts";

    std::vector<float> b(E, 0.0f);
    b[hot] = 2.0f;
    bias.CopyFrom(Tensor::FromVector(b, {E}));
    std::vector<int64_t> all_hot(E, 0);
    all_hot[hot] = G * T;
    for (bool training : {false, true}) {
      SCOPED_TRACE(training ? "training" : "eval");
      const MoEForward out = layer.Forward(h, T, training, 0, 0);
      EXPECT_EQ(out.stats.tokens_per_expert, all_hot);
      std::vector<int64_t> kept(E, 0);
      kept[hot] = G * (T / E);  // C = ceil(1.0 * T * 1 / E) per group
      EXPECT_EQ(out.stats.tokens_per_expert_kept, kept);
      // Gate of token t = its unbiased score of the hot expert (the probability under
      // softmax, the sigmoid without normalize_gates), bit for bit.
      const std::vector<float> gates = out.acts.gates.ToVector<float>();
      for (int64_t g = 0; g < G; ++g) {
        const std::vector<float> s = plain.acts.router[g].scores.ToVector<float>();
        for (int64_t t = 0; t < T; ++t) {
          EXPECT_EQ(gates[g * T + t], s[t * E + hot]) << "group " << g << " token " << t;
        }
      }
    }

    // The update from the training Forward's counts: their mean 4 exceeds the seven idle
    // experts' 0 (raised) and falls short of the hot one's 32 (lowered), in f32 steps.
    const MoEForward trained = layer.Forward(h, T, /*training=*/true, 1, 0);
    UpdateExpertBias(bias, trained.stats.tokens_per_expert, c.expert_bias_rate);
    std::vector<float> want(E, 0.0f + 0.001f);
    want[hot] = 2.0f - 0.001f;
    Tensor updated = bias;
    EXPECT_EQ(updated.ToVector<float>(), want);
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
  MoEConfig c = Config(4, 2, Activation::kGelu);
  LocalLayer local(c);
  MoELayer& layer = local.layer;
  Tensor h = Normal({10, c.d_model}, 6, 1.0f);
  EXPECT_DEATH(layer.Forward(h, 3, true, 0, 0), "is not \\(G \\* 3, 6\\)");
  MoEForward out = layer.Forward(h, 5, true, 0, 0);
  std::vector<float> one = {1.0f};
  EXPECT_DEATH(layer.Backward(out.acts, Normal({10, c.d_model}, 7, 1.0f), one, one),
               "one value per group \\(2\\)");
}

}  // namespace
}  // namespace switchyard::moe
