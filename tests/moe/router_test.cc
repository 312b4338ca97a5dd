// The router (moe/router.h): top-k ties, k = E, gate normalisation, the expert bias, the
// jitter noise keyed by the global token index, the GShard random second choice recomputed
// from the generator, and the aux-loss-free bias update. Gradients are checked against
// finite differences in aux_loss_test.cc (through softmax, gates, aux and z together).
#include "moe/router.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace switchyard::moe {
namespace {

MoEConfig Config(int64_t d, int64_t E, int64_t k) {
  MoEConfig c;
  c.d_model = d;
  c.num_experts = E;
  c.top_k = k;
  c.d_expert = 4;
  return c;
}

// (n) values in [-scale, scale) from a Philox stream.
std::vector<float> RandomValues(int64_t n, uint64_t stream, float scale) {
  std::vector<float> v(n);
  for (int64_t i = 0; i < n; ++i) v[i] = scale * (2.0f * UniformAt({99, stream}, i) - 1.0f);
  return v;
}

// A router whose logits are given: d = 1, h = 1, Wr = the logits row.
RouterOutput RouteLogits(const std::vector<float>& logits, int64_t T, const MoEConfig& config,
                         const Tensor& bias = Tensor()) {
  const int64_t E = config.num_experts;
  std::vector<float> h(T, 1.0f);
  return RouterForward(Tensor::FromVector(h, {T, 1}), Tensor::FromVector(logits, {1, E}), bias,
                       config, /*training=*/false, RouterRng{});
}

TEST(RouterTest, SoftmaxAndLogits) {
  const int64_t T = 3, d = 4, E = 5;
  MoEConfig config = Config(d, E, 2);
  Tensor h = Tensor::FromVector(RandomValues(T * d, 1, 1.0f), {T, d});
  Tensor wr = Tensor::FromVector(RandomValues(d * E, 2, 1.0f), {d, E});
  RouterOutput out = RouterForward(h, wr, Tensor(), config, false, RouterRng{});
  const float* hp = h.data<float>();
  const float* wp = wr.data<float>();
  for (int64_t t = 0; t < T; ++t) {
    double lse_sum = 0.0;
    std::vector<double> l(E);
    for (int64_t e = 0; e < E; ++e) {
      for (int64_t j = 0; j < d; ++j) l[e] += static_cast<double>(hp[t * d + j]) * wp[j * E + e];
      EXPECT_NEAR(out.logits.data<float>()[t * E + e], l[e], 1e-6);
      lse_sum += std::exp(l[e]);
    }
    for (int64_t e = 0; e < E; ++e) {
      EXPECT_NEAR(out.probs.data<float>()[t * E + e], std::exp(l[e]) / lse_sum, 1e-6);
    }
  }
}

TEST(RouterTest, TiesGoToTheLowerIndex) {
  // Token 0: all equal. Token 1: experts 1 and 2 tie for the top, 0 and 3 for third.
  MoEConfig config = Config(1, 4, 3);
  // Two tokens with different logits: route each alone (d = 1 routes one logits row).
  RouterOutput all_equal = RouteLogits({0.5f, 0.5f, 0.5f, 0.5f}, 1, config);
  EXPECT_EQ(all_equal.indices.ToVector<int32_t>(), (std::vector<int32_t>{0, 1, 2}));
  RouterOutput pairs = RouteLogits({1.0f, 2.0f, 2.0f, 1.0f}, 1, config);
  EXPECT_EQ(pairs.indices.ToVector<int32_t>(), (std::vector<int32_t>{1, 2, 0}));
  config.top_k = 1;
  EXPECT_EQ(RouteLogits({1.0f, 2.0f, 2.0f, 1.0f}, 1, config).indices.ToVector<int32_t>(),
            (std::vector<int32_t>{1}));
  // A tie on probs + bias: equal probs, equal bias on experts 0 and 2.
  RouterOutput level =
      RouteLogits({0.0f, 0.0f, 0.0f, 0.0f}, 1, config,
                  Tensor::FromVector(std::vector<float>{0.0f, -1.0f, 0.0f, -1.0f}, {4}));
  EXPECT_EQ(level.indices.ToVector<int32_t>(), (std::vector<int32_t>{0}));
}

TEST(RouterTest, TopKEqualsE) {
  MoEConfig config = Config(1, 4, 4);
  config.normalize_gates = true;
  RouterOutput out = RouteLogits({0.3f, -1.0f, 2.0f, 0.7f}, 2, config);
  EXPECT_EQ(out.indices.ToVector<int32_t>(), (std::vector<int32_t>{2, 3, 0, 1, 2, 3, 0, 1}));
  std::vector<float> g = out.gates.ToVector<float>();
  std::vector<float> p = out.probs.ToVector<float>();
  float sum = 0.0f;
  for (int j = 0; j < 4; ++j) sum += g[j];
  EXPECT_NEAR(sum, 1.0f, 1e-6f);
  // With k = E the normalised gates are the probs themselves (they already sum to 1).
  EXPECT_NEAR(g[0], p[2], 1e-6f);
  EXPECT_NEAR(g[3], p[1], 1e-6f);
}

TEST(RouterTest, NormalizeGates) {
  const std::vector<float> logits = {1.0f, 0.2f, -0.5f, 0.8f, 0.0f};
  MoEConfig config = Config(1, 5, 2);
  RouterOutput raw = RouteLogits(logits, 1, config);
  config.normalize_gates = true;
  RouterOutput norm = RouteLogits(logits, 1, config);
  const std::vector<float> p = raw.probs.ToVector<float>();
  EXPECT_EQ(raw.indices.ToVector<int32_t>(), (std::vector<int32_t>{0, 3}));
  EXPECT_EQ(norm.indices.ToVector<int32_t>(), (std::vector<int32_t>{0, 3}));
  // Without normalisation the gates are the probs exactly.
  EXPECT_EQ(raw.gates.ToVector<float>(), (std::vector<float>{p[0], p[3]}));
  const std::vector<float> g = norm.gates.ToVector<float>();
  EXPECT_FLOAT_EQ(g[0], p[0] / (p[0] + p[3]));
  EXPECT_FLOAT_EQ(g[1], p[3] / (p[0] + p[3]));
  // Top-1 normalised gates are 1.
  config.top_k = 1;
  EXPECT_EQ(RouteLogits(logits, 1, config).gates.ToVector<float>(), (std::vector<float>{1.0f}));
}

TEST(RouterTest, BiasChangesTheChoiceButNotTheGates) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f};
  MoEConfig config = Config(1, 3, 1);
  RouterOutput plain = RouteLogits(logits, 1, config);
  EXPECT_EQ(plain.indices.ToVector<int32_t>(), (std::vector<int32_t>{0}));
  Tensor bias = Tensor::FromVector(std::vector<float>{0.0f, 0.5f, 0.0f}, {3});
  RouterOutput biased = RouteLogits(logits, 1, config, bias);
  EXPECT_EQ(biased.indices.ToVector<int32_t>(), (std::vector<int32_t>{1}));
  const std::vector<float> p = biased.probs.ToVector<float>();
  EXPECT_EQ(biased.probs.ToVector<float>(), plain.probs.ToVector<float>());
  EXPECT_EQ(biased.gates.ToVector<float>(), (std::vector<float>{p[1]}));  // unbiased prob
  // Top-2, normalised: the gates come from the unbiased probs of the chosen experts.
  config.top_k = 2;
  config.normalize_gates = true;
  Tensor bias2 = Tensor::FromVector(std::vector<float>{0.0f, -0.6f, 0.5f}, {3});
  RouterOutput b2 = RouteLogits(logits, 1, config, bias2);
  EXPECT_EQ(b2.indices.ToVector<int32_t>(), (std::vector<int32_t>{0, 2}));
  const std::vector<float> g = b2.gates.ToVector<float>();
  EXPECT_FLOAT_EQ(g[0], p[0] / (p[0] + p[2]));
  EXPECT_FLOAT_EQ(g[1], p[2] / (p[0] + p[2]));
}

TEST(RouterTest, JitterIsKeyedByTheGlobalTokenIndex) {
  const int64_t T = 5, d = 8, E = 4;
  MoEConfig config = Config(d, E, 2);
  config.jitter_eps = 0.1f;
  Tensor h = Tensor::FromVector(RandomValues(T * d, 3, 1.0f), {T, d});
  Tensor wr = Tensor::FromVector(RandomValues(d * E, 4, 1.0f), {d, E});
  const RouterRng rng{config.seed, /*step=*/17, /*layer=*/3, /*first_token=*/100};
  RouterOutput group = RouterForward(h, wr, Tensor(), config, true, rng);
  ASSERT_TRUE(group.jitter.on);
  const std::vector<float> noise = JitterNoise(group).ToVector<float>();
  const std::vector<float> x = group.input.ToVector<float>();
  const std::vector<float> hv = h.ToVector<float>();
  const RngKey key = JitterRngKey(config.seed, 17, 3);
  bool any_not_one = false;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t j = 0; j < d; ++j) {
      const float n = noise[t * d + j];
      const float lo = 1.0f - config.jitter_eps, hi = 1.0f + config.jitter_eps;
      const float expected = lo + (hi - lo) * UniformAt(key, (100 + t) * d + j);
      EXPECT_EQ(n, expected) << "t=" << t << " j=" << j;
      EXPECT_GE(n, lo);
      EXPECT_LE(n, hi);
      EXPECT_EQ(x[t * d + j], hv[t * d + j] * n);
      any_not_one |= n != 1.0f;
    }
  }
  EXPECT_TRUE(any_not_one);

  // Token 3 routed alone, as the first token of its own group: the same noise.
  RouterRng alone_rng = rng;
  alone_rng.first_token = 103;
  RouterOutput alone = RouterForward(h.Slice(3, 4), wr, Tensor(), config, true, alone_rng);
  const std::vector<float> alone_noise = JitterNoise(alone).ToVector<float>();
  for (int64_t j = 0; j < d; ++j) EXPECT_EQ(alone_noise[j], noise[3 * d + j]);
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_NEAR(alone.logits.data<float>()[e], group.logits.data<float>()[3 * E + e], 1e-6f);
  }
  // Routed as the group's second piece (tokens 2..4 starting at global 102).
  RouterRng piece_rng = rng;
  piece_rng.first_token = 102;
  RouterOutput piece = RouterForward(h.Slice(2, 5), wr, Tensor(), config, true, piece_rng);
  const std::vector<float> piece_noise = JitterNoise(piece).ToVector<float>();
  for (int64_t i = 0; i < 3 * d; ++i) EXPECT_EQ(piece_noise[i], noise[2 * d + i]);

  // Another step or layer draws other noise.
  RouterRng other = rng;
  other.step = 18;
  EXPECT_NE(JitterNoise(RouterForward(h, wr, Tensor(), config, true, other)).ToVector<float>(), noise);
  other = rng;
  other.layer = 5;
  EXPECT_NE(JitterNoise(RouterForward(h, wr, Tensor(), config, true, other)).ToVector<float>(), noise);

  // Not training: no noise, the input is h itself.
  RouterOutput eval = RouterForward(h, wr, Tensor(), config, false, rng);
  EXPECT_FALSE(eval.jitter.on);
  EXPECT_TRUE(eval.input.SharesStorageWith(h));
  EXPECT_EQ(eval.input.ToVector<float>(), hv);
  // jitter_eps = 0 in training: no noise either.
  config.jitter_eps = 0.0f;
  EXPECT_FALSE(RouterForward(h, wr, Tensor(), config, true, rng).jitter.on);
}

TEST(RouterTest, RandomSecondExpertKeepsIffUBelowTwiceG2) {
  const int64_t T = 400, d = 6, E = 4;
  MoEConfig config = Config(d, E, 2);
  config.second_expert_policy = SecondExpertPolicy::kRandom;
  Tensor h = Tensor::FromVector(RandomValues(T * d, 5, 1.0f), {T, d});
  Tensor wr = Tensor::FromVector(RandomValues(d * E, 6, 1.5f), {d, E});
  const RouterRng rng{config.seed, 9, 2, 5000};
  for (bool normalize : {false, true}) {
    config.normalize_gates = normalize;
    RouterOutput out = RouterForward(h, wr, Tensor(), config, true, rng);
    const std::vector<float> p = out.probs.ToVector<float>();
    const std::vector<int32_t> idx = out.indices.ToVector<int32_t>();
    const std::vector<uint8_t> keep = out.keep.ToVector<uint8_t>();
    const RngKey key = SecondExpertRngKey(config.seed, 9, 2);
    int kept = 0;
    for (int64_t t = 0; t < T; ++t) {
      const float p1 = p[t * E + idx[2 * t]], p2 = p[t * E + idx[2 * t + 1]];
      const float g2 = p2 / (p1 + p2);
      const float u = UniformAt(key, 5000 + t);
      EXPECT_EQ(keep[2 * t], 1);
      EXPECT_EQ(keep[2 * t + 1], u < 2.0f * g2 ? 1 : 0) << "t=" << t << " u=" << u << " g2=" << g2;
      kept += keep[2 * t + 1];
    }
    // Both outcomes occur, so the test sees the rule at work.
    EXPECT_GT(kept, T / 10);
    EXPECT_LT(kept, T - T / 10);
  }
  // Policy `all` keeps every second choice.
  config.second_expert_policy = SecondExpertPolicy::kAll;
  RouterOutput all = RouterForward(h, wr, Tensor(), config, true, rng);
  EXPECT_EQ(all.keep.ToVector<uint8_t>(), std::vector<uint8_t>(2 * T, 1));
}

TEST(RouterTest, CountAssignments) {
  Tensor idx = Tensor::FromVector(std::vector<int32_t>{0, 2, 2, 1, 0, 2}, {3, 2});
  std::vector<int64_t> counts(4, 1);
  CountAssignments(idx, counts);
  EXPECT_EQ(counts, (std::vector<int64_t>{3, 2, 4, 1}));
}

TEST(RouterTest, UpdateExpertBiasByHand) {
  // counts (9, 3, 6, 6, 0, 12): mean 6 -> signs (-, +, 0, 0, +, -).
  Tensor b = Tensor::FromVector(std::vector<float>{0.1f, 0.0f, -0.2f, 0.5f, 0.0f, 0.0f}, {6});
  const std::vector<int64_t> counts = {9, 3, 6, 6, 0, 12};
  UpdateExpertBias(b, counts, 0.01f);
  const std::vector<float> v = b.ToVector<float>();
  EXPECT_FLOAT_EQ(v[0], 0.09f);
  EXPECT_FLOAT_EQ(v[1], 0.01f);
  EXPECT_EQ(v[2], -0.2f);
  EXPECT_EQ(v[3], 0.5f);
  EXPECT_FLOAT_EQ(v[4], 0.01f);
  EXPECT_FLOAT_EQ(v[5], -0.01f);
  // A non-integer mean: counts (1, 2), mean 1.5.
  Tensor b2 = Tensor::Zeros({2}, DType::kF32);
  UpdateExpertBias(b2, std::vector<int64_t>{1, 2}, 0.5f);
  EXPECT_EQ(b2.ToVector<float>(), (std::vector<float>{0.5f, -0.5f}));
}

TEST(RouterTest, UpdateExpertBiasProportionalByHand) {
  // counts (6, 2, 4, 4): mean 4, relative errors (4 - c) / 4 = (-0.5, 0.5, 0, 0); rate 0.1
  // moves (1, 0, -0.25, 0.5) by (-0.05, +0.05, 0, 0). The sign rule would move by 0.1.
  Tensor b = Tensor::FromVector(std::vector<float>{1.0f, 0.0f, -0.25f, 0.5f}, {4});
  UpdateExpertBiasProportional(b, std::vector<int64_t>{6, 2, 4, 4}, 0.1f);
  EXPECT_EQ(b.ToVector<float>(), (std::vector<float>{0.95f, 0.05f, -0.25f, 0.5f}));
  // Twice the tokens, the same loads: the same move (the rate is per relative deviation).
  Tensor b2 = Tensor::Zeros({4}, DType::kF32);
  UpdateExpertBiasProportional(b2, std::vector<int64_t>{12, 4, 8, 8}, 0.1f);
  EXPECT_EQ(b2.ToVector<float>(), (std::vector<float>{-0.05f, 0.05f, 0.0f, 0.0f}));
  // counts (1, 2): mean 1.5, errors (1/3, -1/3); rate 0.3 -> (0.1, -0.1) in f32.
  Tensor b3 = Tensor::Zeros({2}, DType::kF32);
  UpdateExpertBiasProportional(b3, std::vector<int64_t>{1, 2}, 0.3f);
  EXPECT_EQ(b3.ToVector<float>(), (std::vector<float>{static_cast<float>(0.3f * (1.0 / 3.0)),
                                                      static_cast<float>(-0.3f * (1.0 / 3.0))}));
  // No tokens: no change.
  Tensor b4 = Tensor::FromVector(std::vector<float>{0.5f, -0.5f}, {2});
  UpdateExpertBiasProportional(b4, std::vector<int64_t>{0, 0}, 0.3f);
  EXPECT_EQ(b4.ToVector<float>(), (std::vector<float>{0.5f, -0.5f}));
}

}  // namespace
}  // namespace switchyard::moe
