// The router's score functions and node-limited routing (moe/router.h, docs/model.md "The
// MoE layer" steps 1-3), against a float64 reference written here from the page:
//   - sigmoid scores, probs = scores / their sum, gates from the unbiased scores (raw and
//     normalised), on hand-picked logits and on 64 random tokens;
//   - node-limited routing on a hand case where the best expert sits in a losing group, and
//     on 200 random tokens (G = 4 groups of 2, M = 2, k = 3, with an expert bias) for
//     softmax and sigmoid: the chosen experts equal the reference's exactly;
//   - the softmax router with route_groups = G, route_group_topk = G is the plain one, bit
//     for bit;
//   - the validation errors of moe.score, moe.route_groups and moe.route_group_topk.
// The sigmoid gradients are checked against finite differences in aux_loss_test.cc.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "moe/router.h"

namespace switchyard::moe {
namespace {

MoEConfig Config(int64_t E, int64_t k) {
  MoEConfig c;
  c.d_model = 1;
  c.num_experts = E;
  c.top_k = k;
  c.d_expert = 4;
  return c;
}

// A router whose logits are given: d = 1, h = 1, Wr = the logits row (the row-exact product
// of 1 * l is l).
RouterOutput RouteOne(const std::vector<float>& logits, const MoEConfig& config,
                      const Tensor& bias = Tensor()) {
  const int64_t E = config.num_experts;
  return RouterForward(Tensor::FromVector(std::vector<float>{1.0f}, {1, 1}),
                       Tensor::FromVector(logits, {1, E}), bias, config, false, RouterRng{});
}

// T tokens with h = identity rows of E features and Wr = I: the logits are the inputs.
RouterOutput RouteRows(const std::vector<float>& logits, int64_t T, const MoEConfig& config,
                       const Tensor& bias = Tensor()) {
  const int64_t E = config.num_experts;
  std::vector<float> eye(E * E, 0.0f);
  for (int64_t e = 0; e < E; ++e) eye[e * E + e] = 1.0f;
  MoEConfig c = config;
  c.d_model = E;
  return RouterForward(Tensor::FromVector(logits, {T, E}), Tensor::FromVector(eye, {E, E}), bias,
                       c, false, RouterRng{});
}

// The float64 reference of one token: scores (softmax or sigmoid), the choice scores
// c = f32(scores) + bias in f32 (what the page defines the choice on), the group limit and
// the top-k (ties to the smaller index).
struct RefToken {
  std::vector<double> scores, probs;
  std::vector<int32_t> idx;
};
RefToken Reference(const float* l, const MoEConfig& c, const float* bias) {
  const int64_t E = c.num_experts, G = c.route_groups, M = c.route_group_topk;
  RefToken r;
  r.scores.resize(E);
  r.probs.resize(E);
  double sum = 0;
  if (c.score == ScoreFunction::kSigmoid) {
    for (int64_t e = 0; e < E; ++e) sum += r.scores[e] = 1.0 / (1.0 + std::exp(-double(l[e])));
  } else {
    const double m = *std::max_element(l, l + E);
    for (int64_t e = 0; e < E; ++e) sum += r.scores[e] = std::exp(double(l[e]) - m);
    for (double& s : r.scores) s /= sum;
    sum = 1.0;
  }
  for (int64_t e = 0; e < E; ++e) r.probs[e] = r.scores[e] / sum;
  std::vector<float> choice(E);
  for (int64_t e = 0; e < E; ++e) {
    choice[e] = static_cast<float>(r.scores[e]) + (bias ? bias[e] : 0.0f);
  }
  std::vector<bool> allowed(E, true);
  if (G > 0) {
    const int64_t n = E / G;
    std::vector<float> group(G);
    for (int64_t g = 0; g < G; ++g) {
      std::vector<float> v(choice.begin() + g * n, choice.begin() + (g + 1) * n);
      std::sort(v.rbegin(), v.rend());
      group[g] = n >= 2 ? v[0] + v[1] : v[0];
    }
    std::vector<int32_t> order(G);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return group[a] > group[b]; });
    for (int64_t i = M; i < G; ++i) {
      for (int64_t e = 0; e < n; ++e) allowed[order[i] * n + e] = false;
    }
  }
  std::vector<int32_t> order;
  for (int32_t e = 0; e < E; ++e) {
    if (allowed[e]) order.push_back(e);
  }
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return choice[a] > choice[b]; });
  r.idx.assign(order.begin(), order.begin() + c.top_k);
  return r;
}

TEST(RouterScoringTest, SigmoidScoresAndGatesByHand) {
  // sigmoid(0) = 1/2, sigmoid(ln 3) = 3/4, sigmoid(-ln 3) = 1/4: probs (2, 3, 1) / 6.
  const float ln3 = std::log(3.0f);
  MoEConfig c = Config(3, 2);
  c.score = ScoreFunction::kSigmoid;
  RouterOutput raw = RouteOne({0.0f, ln3, -ln3}, c);
  const std::vector<float> s = raw.scores.ToVector<float>();
  EXPECT_EQ(s[0], 0.5f);
  EXPECT_NEAR(s[1], 0.75, 1e-7);
  EXPECT_NEAR(s[2], 0.25, 1e-7);
  const std::vector<float> p = raw.probs.ToVector<float>();
  EXPECT_NEAR(p[0], 2.0 / 6, 1e-7);
  EXPECT_NEAR(p[1], 3.0 / 6, 1e-7);
  EXPECT_NEAR(p[2], 1.0 / 6, 1e-7);
  EXPECT_EQ(raw.indices.ToVector<int32_t>(), (std::vector<int32_t>{1, 0}));
  // Raw gates are the scores themselves (not the probs).
  EXPECT_EQ(raw.gates.ToVector<float>(), (std::vector<float>{s[1], s[0]}));
  // Normalised: s / (s1 + s0) = (0.6, 0.4).
  c.normalize_gates = true;
  const std::vector<float> g = RouteOne({0.0f, ln3, -ln3}, c).gates.ToVector<float>();
  EXPECT_NEAR(g[0], 0.6, 1e-7);
  EXPECT_NEAR(g[1], 0.4, 1e-7);
  // Top-1 normalised gates are exactly 1 (DeepSeek-V3 with one expert would not train the
  // router through the gates).
  c.top_k = 1;
  EXPECT_EQ(RouteOne({0.0f, ln3, -ln3}, c).gates.ToVector<float>(), (std::vector<float>{1.0f}));
  // The bias moves the choice, not the gates: +0.3 on expert 2 (0.25 + 0.3 > 0.75? no;
  // +0.6: 0.85 > 0.75 yes).
  c.top_k = 1;
  c.normalize_gates = false;
  Tensor bias = Tensor::FromVector(std::vector<float>{0.0f, 0.0f, 0.6f}, {3});
  RouterOutput biased = RouteOne({0.0f, ln3, -ln3}, c, bias);
  EXPECT_EQ(biased.indices.ToVector<int32_t>(), (std::vector<int32_t>{2}));
  EXPECT_EQ(biased.gates.ToVector<float>(), (std::vector<float>{s[2]}));
}

TEST(RouterScoringTest, BestExpertInALosingGroupIsNotChosen) {
  // Sigmoid scores: group 0 = (0.9, ~0) sums 0.9, group 1 = (0.5, 0.5) sums 1.0. With one
  // group allowed, the best single expert (0) is out: the choice is expert 2 (tie to the
  // smaller index). With both groups, expert 0.
  MoEConfig c = Config(4, 1);
  c.score = ScoreFunction::kSigmoid;
  c.route_groups = 2;
  c.route_group_topk = 1;
  const std::vector<float> logits = {std::log(9.0f), -12.0f, 0.0f, 0.0f};
  EXPECT_EQ(RouteOne(logits, c).indices.ToVector<int32_t>(), (std::vector<int32_t>{2}));
  c.route_group_topk = 2;
  EXPECT_EQ(RouteOne(logits, c).indices.ToVector<int32_t>(), (std::vector<int32_t>{0}));
  // Groups of one expert score their one expert: G = E, M = 2, k = 2 is the plain top-2.
  c.route_groups = 4;
  c.top_k = 2;
  EXPECT_EQ(RouteOne(logits, c).indices.ToVector<int32_t>(), (std::vector<int32_t>{0, 2}));
  // The same hand case with softmax: probs (9, e^-12, 1, 1) / 11.
  c.score = ScoreFunction::kSoftmax;
  c.route_groups = 2;
  c.route_group_topk = 1;
  c.top_k = 1;
  EXPECT_EQ(RouteOne(logits, c).indices.ToVector<int32_t>(), (std::vector<int32_t>{0}));
}

TEST(RouterScoringTest, RandomTokensMatchTheFloat64Reference) {
  const int64_t T = 200, E = 8;
  std::vector<float> logits(T * E);
  for (int64_t i = 0; i < T * E; ++i) logits[i] = 4.0f * UniformAt({3, 7}, i) - 2.0f;
  const std::vector<float> bias = {0.02f, -0.01f, 0.0f, 0.03f, -0.02f, 0.01f, 0.0f, -0.03f};
  Tensor bias_t = Tensor::FromVector(bias, {E});
  for (ScoreFunction score : {ScoreFunction::kSoftmax, ScoreFunction::kSigmoid}) {
    for (bool normalize : {false, true}) {
      for (int64_t groups : {0, 4}) {
        SCOPED_TRACE(testing::Message() << ScoreFunctionName(score) << " normalize=" << normalize
                                        << " groups=" << groups);
        MoEConfig c = Config(E, 3);
        c.score = score;
        c.normalize_gates = normalize;
        c.route_groups = groups;
        c.route_group_topk = groups > 0 ? 2 : 0;
        ASSERT_TRUE(c.Validate().ok()) << c.Validate();
        RouterOutput out = RouteRows(logits, T, c, bias_t);
        const std::vector<int32_t> idx = out.indices.ToVector<int32_t>();
        const std::vector<float> s = out.scores.ToVector<float>(), p = out.probs.ToVector<float>();
        const std::vector<float> g = out.gates.ToVector<float>();
        int64_t limited = 0;  // tokens whose plain top-3 left the groups
        for (int64_t t = 0; t < T; ++t) {
          // The scores and probs to a few f32 ulps; the choice exactly.
          const RefToken r = Reference(&logits[t * E], c, bias.data());
          for (int64_t e = 0; e < E; ++e) {
            EXPECT_NEAR(s[t * E + e], r.scores[e], 2e-7 * r.scores[e]) << t << "," << e;
            EXPECT_NEAR(p[t * E + e], r.probs[e], 4e-7 * r.probs[e]) << t << "," << e;
          }
          ASSERT_EQ(std::vector<int32_t>(idx.begin() + t * 3, idx.begin() + t * 3 + 3), r.idx)
              << "token " << t;
          double chosen = 0;
          for (int32_t e : r.idx) chosen += r.scores[e];
          for (int64_t j = 0; j < 3; ++j) {
            const double want = r.scores[r.idx[j]] / (normalize ? chosen : 1.0);
            EXPECT_NEAR(g[t * 3 + j], want, 4e-7 * want) << t << "," << j;
          }
          MoEConfig plain = c;
          plain.route_groups = plain.route_group_topk = 0;
          if (Reference(&logits[t * E], plain, bias.data()).idx != r.idx) ++limited;
        }
        // The limit must matter for some tokens, else this test checks nothing of it.
        if (groups > 0) {
          EXPECT_GT(limited, 10);
        }
      }
    }
  }
}

TEST(RouterScoringTest, AllGroupsAllowedIsThePlainRouter) {
  const int64_t T = 50, E = 6;
  std::vector<float> logits(T * E);
  for (int64_t i = 0; i < T * E; ++i) logits[i] = 3.0f * UniformAt({4, 1}, i) - 1.5f;
  MoEConfig c = Config(E, 2);
  c.normalize_gates = true;
  RouterOutput plain = RouteRows(logits, T, c);
  c.route_groups = 3;
  c.route_group_topk = 3;
  RouterOutput grouped = RouteRows(logits, T, c);
  EXPECT_EQ(grouped.probs.ToVector<float>(), plain.probs.ToVector<float>());
  EXPECT_EQ(grouped.indices.ToVector<int32_t>(), plain.indices.ToVector<int32_t>());
  EXPECT_EQ(grouped.gates.ToVector<float>(), plain.gates.ToVector<float>());
}

TEST(RouterScoringTest, ValidationNamesTheKey) {
  auto error = [](MoEConfig c) { return std::string(c.Validate().message()); };
  MoEConfig c = Config(8, 2);
  c.route_groups = 3;
  c.route_group_topk = 1;
  EXPECT_EQ(error(c), "moe.route_groups=3 does not divide moe.num_experts=8");
  c.route_groups = 4;
  c.route_group_topk = 5;
  EXPECT_EQ(error(c), "moe.route_group_topk=5 must be in [1, 4] (moe.route_groups=4)");
  c.route_group_topk = 0;
  EXPECT_EQ(error(c), "moe.route_group_topk=0 must be in [1, 4] (moe.route_groups=4)");
  c.route_group_topk = 1;
  c.top_k = 3;
  EXPECT_EQ(error(c), "moe.top_k=3 exceeds the 2 experts of moe.route_group_topk=1 groups of 2 "
                      "(moe.num_experts / moe.route_groups)");
  c.route_groups = -1;
  EXPECT_EQ(error(c), "moe.route_groups=-1 must be >= 0 (0: off)");
  c.route_groups = 0;
  c.route_group_topk = 2;
  EXPECT_EQ(error(c), "moe.route_group_topk=2 needs moe.route_groups > 0 (node-limited routing is off)");
  EXPECT_EQ(std::string(ParseScoreFunction("tanh").status().message()),
            "moe.score='tanh' is not one of softmax, sigmoid");
  EXPECT_EQ(std::string(ParseAuxLossScope("batch").status().message()),
            "moe.aux_loss_scope='batch' is not one of group, sequence, global");
}

}  // namespace
}  // namespace switchyard::moe
