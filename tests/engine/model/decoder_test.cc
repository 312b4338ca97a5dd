// The decoder end to end on one rank: every parameter's gradient against central finite
// differences of the total loss (cross-entropy mean + aux + z), for a Switch-style and a
// Mixtral-style configuration; registry names and shapes; tied vs untied heads.
#include "engine/model/decoder.h"

#include <cmath>

#include <gtest/gtest.h>

#include "engine/core/philox.h"
#include "tests/engine/model/model_test_util.h"

namespace switchyard::model {
namespace {

using testing::LlamaLike;
using testing::MixtralLike;

using parallel::Parameter;
using parallel::ParameterRegistry;

struct Case {
  const char* name;
  ModelConfig model;
  moe::MoEConfig moe;
};

std::vector<Case> Cases() {
  ModelConfig gpt{.vocab_size = 13, .seq_len = 5, .d_model = 8, .n_layers = 2, .n_heads = 2,
                  .d_ff = 12};
  moe::MoEConfig sw{.num_experts = 4, .layer_freq = 2, .top_k = 1, .d_expert = 6,
                    .capacity_factor = 0.0f, .eval_capacity_factor = 0.0f, .aux_loss_coef = 0.1f, .z_loss_coef = 0.01f};
  const ModelConfig llama = LlamaLike(gpt);
  const moe::MoEConfig mix = MixtralLike(sw);
  return {{"switch", gpt, sw}, {"mixtral", llama, mix}};
}

DecoderInput Batch(int64_t vocab) {
  std::vector<int32_t> tokens(2 * 5), targets(2 * 5);
  for (int i = 0; i < 10; ++i) {
    tokens[i] = static_cast<int32_t>(RandomBitsAt({5, 1}, i) % vocab);
    targets[i] = static_cast<int32_t>(RandomBitsAt({5, 2}, i) % vocab);
  }
  targets[3] = -1;  // a masked position
  DecoderInput in;
  in.tokens = Tensor::FromVector(tokens, {2, 5});
  in.targets = Tensor::FromVector(targets, {2, 5});
  in.ce_grad_scale = 1.0f / 9;
  in.aux_grad_scale = 1.0f;
  return in;
}

// The total loss, and the routing decisions it was computed with (a finite difference
// across a routing change measures the jump, not the gradient).
double Loss(Decoder& dec, const DecoderInput& in, std::vector<int32_t>* routing) {
  DecoderInput eval = in;
  eval.training = false;  // same routing (no jitter, dropless) and no gradient work
  DecoderOutput out = dec.Forward(eval);
  routing->clear();
  for (const BlockActivations& b : out.acts.blocks) {
    if (!b.moe) continue;
    for (const moe::RouterOutput& r : b.moe->acts.router) {
      auto v = r.indices.ToVector<int32_t>();
      routing->insert(routing->end(), v.begin(), v.end());
    }
  }
  return out.ce_sum * in.ce_grad_scale + in.aux_grad_scale * (out.aux_sum + out.z_sum);
}

TEST(DecoderTest, GradientsMatchFiniteDifferences) {
  for (const Case& c : Cases()) {
    SCOPED_TRACE(c.name);
    auto ep = dist::MakeLocalCommunicator();
    auto dec = Decoder::Create(c.model, c.moe, 42, ep.get());
    ASSERT_TRUE(dec.ok()) << dec.status();
    // Spread the router logits so that routing has clear margins.
    for (Parameter& p : (*dec)->registry().params()) {
      if (p.name.find("router.weight") == std::string::npos) continue;
      for (int64_t i = 0; i < p.value.numel(); ++i) p.value.data<float>()[i] *= 40.0f;
    }
    DecoderInput in = Batch(c.model.vocab_size);
    std::vector<int32_t> base_routing, routing;
    Loss(**dec, in, &base_routing);
    int checked = 0, skipped = 0;
    DecoderOutput out = (*dec)->Forward(in);
    EXPECT_EQ(out.ce_count, 9);
    (*dec)->Backward(in, out);
    double worst = 0;
    for (Parameter& p : (*dec)->registry().params()) {
      if (!p.trainable) continue;
      float* v = p.value.data<float>();
      const float* g = p.grad.data<float>();
      for (int sample = 0; sample < 3; ++sample) {
        const int64_t i = RandomBitsAt({9, StreamId(p.name)}, sample) % p.value.numel();
        const float saved = v[i], h = 2e-3f;
        v[i] = saved + h;
        double up = Loss(**dec, in, &routing);
        bool same = routing == base_routing;
        v[i] = saved - h;
        double down = Loss(**dec, in, &routing);
        same = same && routing == base_routing;
        v[i] = saved;
        if (!same) {
          ++skipped;
          continue;
        }
        ++checked;
        double fd = (up - down) / (2 * h);
        double tol = 2e-4 + 2e-3 * std::fabs(fd);
        worst = std::max(worst, std::fabs(fd - g[i]) / tol);
        EXPECT_NEAR(g[i], fd, tol) << p.name << "[" << i << "]";
      }
    }
    std::printf("[%s] %d elements checked, %d skipped (routing changed); worst gradient error: "
                "%.3f of the tolerance\n", c.name, checked, skipped, worst);
    EXPECT_LT(skipped, checked / 10) << "too many samples flip routing to test anything";
  }
}

TEST(DecoderTest, RegistryNamesAndShapes) {
  Case c = Cases()[0];
  auto ep = dist::MakeLocalCommunicator();
  auto dec = Decoder::Create(c.model, c.moe, 1, ep.get());
  ASSERT_TRUE(dec.ok());
  ParameterRegistry& reg = (*dec)->registry();
  ASSERT_NE(reg.Find("embed.wte"), nullptr);
  EXPECT_EQ(reg.Find("embed.wte")->global_shape, (Shape{13, 8}));
  EXPECT_EQ(reg.Find("embed.wpe")->global_shape, (Shape{5, 8}));
  EXPECT_NE(reg.Find("layers.0.mlp.w1.weight"), nullptr);
  const Parameter* w1 = reg.Find("layers.1.moe.experts.w1");
  ASSERT_NE(w1, nullptr);
  EXPECT_EQ(w1->global_shape, (Shape{4, 8, 6}));
  EXPECT_EQ(w1->view, dist::View::kExpert);
  EXPECT_EQ(w1->grad_sum, parallel::AxisSet{dist::Axis::kDp});
  EXPECT_EQ(reg.Find("layers.1.moe.router.weight")->global_shape, (Shape{8, 4}));
  EXPECT_EQ(reg.Find("head.weight"), nullptr);  // tied
  EXPECT_FALSE(reg.Find("layers.0.norm1.weight")->weight_decay);
  EXPECT_TRUE(reg.Find("layers.0.attn.q.weight")->weight_decay);
  EXPECT_EQ((*dec)->moe_layer_ids(), (std::vector<int64_t>{1}));
  // moe.router_lr_scale reaches the routers' parameters alone.
  c.moe.router_lr_scale = 10.0f;
  auto scaled = Decoder::Create(c.model, c.moe, 1, ep.get());
  ASSERT_TRUE(scaled.ok());
  for (const Parameter& p : (*scaled)->registry().params()) {
    EXPECT_EQ(p.lr_scale, p.name.ends_with(".moe.router.weight") ? 10.0f : 1.0f) << p.name;
  }
}

TEST(DecoderTest, BadConfigsAreRejected) {
  Case c = Cases()[0];
  auto ep = dist::MakeLocalCommunicator();
  c.model.n_heads = 3;
  auto dec = Decoder::Create(c.model, c.moe, 1, ep.get());
  ASSERT_FALSE(dec.ok());
  EXPECT_EQ(dec.status().message(),
            "model.n_heads=3 does not divide model.d_model=8 (or set model.head_dim)");
  // An explicit head width: 3 heads of 4 on d 8 build; an odd width under rope, or a
  // negative one, is refused by name.
  c.model.explicit_head_dim = 4;
  EXPECT_TRUE(c.model.Validate().ok());
  EXPECT_TRUE(Decoder::Create(c.model, c.moe, 1, ep.get()).ok());
  c.model.explicit_head_dim = 5;
  c.model.position = Position::kRope;
  EXPECT_EQ(c.model.Validate().message(), "model.position=rope needs an even head dim, got model.head_dim = 5");
  c.model.explicit_head_dim = -1;
  EXPECT_EQ(c.model.Validate().message(), "model.head_dim=-1 must be >= 0 (0: d_model / n_heads)");
}

}  // namespace
}  // namespace switchyard::model
