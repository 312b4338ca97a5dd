#include "engine/train/config.h"

#include <gtest/gtest.h>

namespace switchyard::train {
namespace {

constexpr char kYaml[] = R"(
model:
  d_model: 16
moe:
  num_experts: 8
  top_k: 2
  d_expert: 32
  activation: swiglu
  drop_policy: probability
  capacity_factor: 1.5
  normalize_gates: true
parallel:
  ep: 4
)";

std::string Error(const std::string& yaml, std::vector<std::string> overrides = {}) {
  auto c = ParseConfig(yaml, "x.yaml", overrides);
  if (!c.ok()) return std::string(c.status().message());
  Status s = c->Validate(8);
  return s.ok() ? "" : std::string(s.message());
}

TEST(ConfigTest, ParsesTypedSectionsWithDefaults) {
  auto c = ParseConfig(kYaml, "x.yaml");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model.d_model, 16);
  EXPECT_EQ(c->moe.d_model, 16);
  EXPECT_EQ(c->moe.top_k, 2);
  EXPECT_EQ(c->moe.activation, moe::Activation::kSwiglu);
  EXPECT_EQ(c->moe.drop_policy, moe::DropPolicy::kProbability);
  EXPECT_FLOAT_EQ(c->moe.capacity_factor, 1.5f);
  EXPECT_TRUE(c->moe.normalize_gates);
  EXPECT_FLOAT_EQ(c->moe.eval_capacity_factor, 2.0f);  // default
  EXPECT_EQ(c->parallel.ep, 4);
  EXPECT_TRUE(c->Validate(8).ok());
}

TEST(ConfigTest, OverridesApplyInOrder) {
  auto c = ParseConfig(kYaml, "x.yaml", {"moe.top_k=1", "parallel.ep=2", "moe.top_k=3"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->moe.top_k, 3);
  EXPECT_EQ(c->parallel.ep, 2);
}

TEST(ConfigTest, ResolvedYamlParsesBackToTheSameConfig) {
  auto c = ParseConfig(kYaml, "x.yaml", {"moe.jitter_eps=0.01"});
  ASSERT_TRUE(c.ok());
  auto again = ParseConfig(c->ToYaml(), "resolved");
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_EQ(again->ToYaml(), c->ToYaml());
  EXPECT_FLOAT_EQ(again->moe.jitter_eps, 0.01f);
}

TEST(ConfigTest, EveryBadInputNamesTheKeyAndValue) {
  EXPECT_EQ(Error("moe:\n  topk: 2\n"), "x.yaml: unknown key 'moe.topk'");
  EXPECT_EQ(Error("optim:\n  lr: 1\n"), "x.yaml: unknown section 'optim'");
  EXPECT_EQ(Error("moe:\n  top_k: two\n"), "x.yaml: moe.top_k: expected an integer, got 'two'");
  EXPECT_EQ(Error("moe:\n  normalize_gates: maybe\n"),
            "x.yaml: moe.normalize_gates: expected true or false, got 'maybe'");
  EXPECT_EQ(Error("moe:\n  activation: tanh\n"),
            "x.yaml: moe.activation='tanh' is not one of gelu, relu, swiglu");
  EXPECT_EQ(Error("moe: [1, 2]\n"), "x.yaml: section 'moe' must be a mapping");
  EXPECT_NE(Error("moe:\n  top_k: [1\n").find("YAML syntax error"), std::string::npos);
  EXPECT_EQ(Error(kYaml, {"moe.top_k=9"}), "moe.top_k=9 exceeds moe.num_experts=8");
  EXPECT_EQ(Error(kYaml, {"parallel.ep=3"}), "moe.num_experts=8 is not divisible by parallel.ep=3");
  EXPECT_EQ(Error(kYaml, {"parallel.ep=8", "parallel.pp=2"}),
            "world size 8 is not divisible by etp*ep*pp = 1*8*2");
  EXPECT_EQ(Error(kYaml, {"moe.second_expert_policy=random", "moe.top_k=1"}),
            "moe.second_expert_policy=random needs moe.top_k=2, got 1");
  EXPECT_EQ(Error(kYaml, {"top_k=2"}), "--set 'top_k=2': expected section.key=value");
  EXPECT_EQ(Error(kYaml, {"moe.nope=2"}), "--set: unknown key 'moe.nope'");
  EXPECT_EQ(Error("model:\n  d_model: 0\n"), "model.d_model=0 must be positive");
  auto missing = LoadConfig("/nonexistent/c.yaml");
  EXPECT_EQ(missing.status().message(), "/nonexistent/c.yaml: cannot open config file");
}

}  // namespace
}  // namespace switchyard::train
