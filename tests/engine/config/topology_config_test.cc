// parallel.ranks_per_node and moe.dispatcher: parsing, the round trip through the resolved
// YAML, and every error of the topology check (ParallelConfig::Validate), one line each.
#include <gtest/gtest.h>

#include "engine/config/config.h"

namespace switchyard::config {
namespace {

constexpr char kYaml[] = R"(
model:
  d_model: 16
  n_heads: 4
moe:
  num_experts: 8
  d_expert: 32
parallel:
  ep: 4
)";

std::string Error(std::vector<std::string> overrides, int world = 8) {
  auto c = ParseConfig(kYaml, "x.yaml", overrides);
  if (!c.ok()) return std::string(c.status().message());
  Status s = c->Validate(world);
  return s.ok() ? "" : std::string(s.message());
}

TEST(TopologyConfigTest, KeysParseAndRoundTrip) {
  auto c = ParseConfig(kYaml, "x.yaml", {"parallel.ranks_per_node=4", "moe.dispatcher=hierarchical"});
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->parallel.ranks_per_node, 4);
  EXPECT_EQ(c->moe.dispatcher, moe::Dispatcher::kHierarchical);
  EXPECT_EQ(c->parallel.MeshSizes().ranks_per_node, 4);
  auto back = ParseConfig(c->ToYaml(), "resolved.yaml", {});
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->parallel.ranks_per_node, 4);
  EXPECT_EQ(back->moe.dispatcher, moe::Dispatcher::kHierarchical);
  auto defaults = ParseConfig(kYaml, "x.yaml", {});
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->parallel.ranks_per_node, 0);
  EXPECT_EQ(defaults->moe.dispatcher, moe::Dispatcher::kFlat);
}

TEST(TopologyConfigTest, GoodLayouts) {
  EXPECT_EQ(Error({"parallel.ranks_per_node=4", "moe.dispatcher=hierarchical"}), "");
  EXPECT_EQ(Error({"parallel.ranks_per_node=2", "parallel.tp=2", "moe.dispatcher=hierarchical"}), "");
  EXPECT_EQ(Error({"parallel.ranks_per_node=8"}), "");
  // Without declared nodes nothing is checked here (the trainer detects them).
  EXPECT_EQ(Error({"parallel.tp=4", "parallel.etp=1", "moe.dispatcher=hierarchical"}), "");
}

TEST(TopologyConfigTest, EveryBadInputNamesTheKey) {
  EXPECT_EQ(Error({"moe.dispatcher=tree"}),
            "--set: moe.dispatcher='tree' is not one of flat, hierarchical");
  EXPECT_EQ(Error({"parallel.ranks_per_node=-2"}),
            "parallel.ranks_per_node=-2 must be >= 0 (0: detected at start-up)");
  EXPECT_EQ(Error({"parallel.ranks_per_node=3"}),
            "parallel.ranks_per_node=3 does not divide the world size 8 (every node holds the "
            "same number of ranks)");
  EXPECT_EQ(Error({"parallel.ranks_per_node=2", "parallel.tp=4", "parallel.etp=1"}),
            "parallel.ranks_per_node=2: tp=4 does not fit in a node of 2 ranks: its group "
            "[0, 1, 2, 3] spans nodes 0-1; use tp <= 2 to keep it inside a node");
  EXPECT_EQ(Error({"parallel.ranks_per_node=2", "parallel.ep=2", "parallel.etp=4",
                   "parallel.tp=1"}),
            "parallel.ranks_per_node=2: etp=4 does not fit in a node of 2 ranks: its group "
            "[0, 1, 2, 3] spans nodes 0-1; use etp <= 2 to keep it inside a node");
  EXPECT_EQ(Error({"parallel.ranks_per_node=2", "parallel.tp=2", "parallel.order=dp-tp-cp-ep-pp"}),
            "parallel.ranks_per_node=2: order \"dp-tp-cp-ep-pp\" puts the tp group [0, 4] across "
            "nodes 0-2 of 2 ranks; put tp first in the order (the default tp-cp-ep-dp-pp) so "
            "that tp groups stay inside a node");
}

// parallel.order is checked with or without declared nodes, and with no world given (plan),
// by the mesh of the smallest world the sizes allow.
TEST(TopologyConfigTest, OrderIsCheckedForEveryWorld) {
  for (int world : {8, 0}) {
    EXPECT_EQ(Error({"parallel.order=tp-dp-pp"}, world),
              "parallel.order \"tp-dp-pp\": axis \"cp\" is missing; expected a permutation of "
              "tp-cp-ep-dp-pp")
        << world;
    EXPECT_EQ(Error({"parallel.order=tp-cp-ep-dp-xp"}, world),
              "parallel.order \"tp-cp-ep-dp-xp\": unknown axis \"xp\"; expected a permutation "
              "of tp-cp-ep-dp-pp")
        << world;
    EXPECT_EQ(Error({"parallel.order=dp-tp-cp-ep-pp"}, world), "") << world;
    // pp not last: the views' pipeline groups differ (at world 8, the smallest these sizes
    // allow, as at any: pp strides of 1 and ep = 4).
    EXPECT_EQ(Error({"model.n_layers=2", "parallel.pp=2", "parallel.order=tp-cp-ep-pp-dp"}, world),
              "parallel.order \"tp-cp-ep-pp-dp\" gives the dense and expert views different "
              "pipeline groups (rank 0: [0, 1] dense vs [0, 4] expert); they must be equal, e.g. "
              "with pp last in the order")
        << world;
  }
}

TEST(TopologyConfigTest, HierarchicalNeedsEvenEpNodes) {
  // world 12, ep 6 (dp 2), nodes of 4: the ep group [0..5] has 4 ranks on node 0, 2 on 1.
  auto c = ParseConfig(kYaml, "x.yaml",
                       {"moe.num_experts=12", "parallel.ep=6", "parallel.ranks_per_node=4",
                        "moe.dispatcher=hierarchical"});
  ASSERT_TRUE(c.ok()) << c.status();
  Status s = c->Validate(12);
  EXPECT_EQ(s.message(),
            "moe.dispatcher=hierarchical with parallel.ranks_per_node=4: ep group [0, 1, 2, 3, "
            "4, 5]: the group's nodes hold different numbers of its members (node 0: 4, node "
            "1: 2); the hierarchical all-to-all needs the same number on every node");
  c->moe.dispatcher = moe::Dispatcher::kFlat;
  EXPECT_TRUE(c->Validate(12).ok());
}

}  // namespace
}  // namespace switchyard::config
