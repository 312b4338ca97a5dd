// The MoE layer (moe/moe_layer.h) on one process (ep = 1, a local communicator), against
// MODEL.md sections 2 and 3:
//  - Forward against an independent naive reference written here in double (softmax of
//    h @ Wr, top-k with ties to the lower index, gates, capacity admission recomputed by
//    hand for both drop policies, GShard's random second choice, per-expert MLPs,
//    gate-weighted sum, shared experts, aux and z per group, router entropy).
//  (gradients: moe_layer_grad_test.cc; statistics and errors: moe_layer_stats_test.cc)
#include "moe/moe_layer.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "tests/moe/moe_layer_test_util.h"

namespace switchyard::moe {
namespace {

using namespace testing;  // switchyard::moe::testing: the shared helpers

// ---- Forward vs the reference ----------------------------------------------------------

using Case = LayerCase;

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

class MoELayerForwardTest : public ::testing::TestWithParam<Case> {};

TEST_P(MoELayerForwardTest, MatchesTheReference) {
  const Case& c = GetParam();
  LocalLayer local(c.config);
  MoELayer& layer = local.layer;
  if (!c.expert_bias.empty()) {
    ASSERT_TRUE(layer.expert_bias().defined());
    layer.expert_bias().CopyFrom(Tensor::FromVector(c.expert_bias, {c.config.num_experts}));
  }
  const int64_t T = c.group_tokens, G = c.groups, N = G * T, d = c.config.d_model;
  const int64_t k = c.config.top_k;
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
  // Values: within the bounds of any f32 evaluation (ReferenceForward's comment).
  ExpectWithinBound(out.acts.gates.ToVector<float>(), ref.gates, ref.gate_bound, c.name + " gates");
  // The kept set, from the dispatch plan.
  std::vector<uint8_t> kept(N * k, 0);
  for (int64_t s : out.acts.plan->slot()) kept[s] = 1;
  EXPECT_EQ(kept, ref.kept);
  EXPECT_EQ(out.groups.tokens_per_expert_kept, ref.kept_counts);
  EXPECT_EQ(out.stats.tokens_per_expert, ref.counts);
  EXPECT_EQ(out.stats.dropped(), ref.dropped);

  ExpectWithinBound(out.y.ToVector<float>(), ref.y, ref.y_bound, c.name + " y");
  const float* y = out.y.data<float>();
  // A token with every assignment dropped (and no shared experts) gives exactly zero.
  if (!layer.shared()) {
    for (int64_t t = 0; t < N; ++t) {
      bool any = false;
      for (int64_t j = 0; j < k; ++j) any |= ref.kept[t * k + j] != 0;
      if (any) continue;
      for (int64_t i = 0; i < d; ++i) EXPECT_EQ(y[t * d + i], 0.0f) << "all-dropped token " << t;
    }
  }
  ExpectWithinBound(out.groups.aux, ref.aux, ref.aux_bound, c.name + " aux per group");
  ExpectWithinBound(out.groups.z, ref.z, ref.z_bound, c.name + " z per group");
  // A scalar sum of O(N log E) positive terms: relative 1e-5.
  EXPECT_NEAR(out.stats.entropy_sum, ref.entropy_sum, 1e-5 * ref.entropy_sum);
}

INSTANTIATE_TEST_SUITE_P(Configs, MoELayerForwardTest, ::testing::ValuesIn(ForwardCases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace switchyard::moe
