// The mesh's topology (engine/dist/mesh.h): node of every rank under block placement,
// which groups cross nodes (hand-derived tables), the rule that tp and etp stay inside a
// node with its three messages, and ranks_per_node's validation.
#include <string>
#include <vector>

#include "engine/dist/mesh.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace switchyard::dist {
namespace {

using ::testing::HasSubstr;

Mesh MakeMesh(int world, MeshSizes sizes, std::string_view order = kDefaultMeshOrder) {
  StatusOr<Mesh> mesh = Mesh::Create(world, sizes, order);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return *std::move(mesh);
}

TEST(TopologyTest, DefaultIsOneNode) {
  const Mesh mesh = MakeMesh(8, {.tp = 2, .ep = 4});
  EXPECT_EQ(mesh.ranks_per_node(), 8);
  EXPECT_EQ(mesh.num_nodes(), 1);
  for (int r = 0; r < 8; ++r) EXPECT_EQ(mesh.NodeOf(r), 0);
  EXPECT_FALSE(mesh.GroupsCrossNodes(View::kDense, {Axis::kDp}));
  EXPECT_EQ(mesh.Summary().find("nodes"), std::string::npos) << mesh.Summary();
}

TEST(TopologyTest, BlockPlacement) {
  const Mesh mesh = MakeMesh(8, {.ep = 4, .ranks_per_node = 2});
  EXPECT_EQ(mesh.num_nodes(), 4);
  const std::vector<int> want = {0, 0, 1, 1, 2, 2, 3, 3};
  for (int r = 0; r < 8; ++r) EXPECT_EQ(mesh.NodeOf(r), want[r]) << "rank " << r;
  EXPECT_THAT(mesh.Summary(), HasSubstr(", 4 nodes of 2 ranks"));
}

// world 8, tp 2, ep 2 (expert view etp 2 x ep 2 x edp 2), 2 nodes of 4 ranks:
//   tp  [0,1] [2,3] [4,5] [6,7]        inside
//   dp  [0,2,4,6] [1,3,5,7]            crosses (4 and 6 are on node 1)
//   ep  [0,2] [1,3] [4,6] [5,7]        inside
//   edp [0,4] [1,5] [2,6] [3,7]        crosses
TEST(TopologyTest, WhichGroupsCross) {
  const Mesh mesh = MakeMesh(8, {.tp = 2, .ep = 2, .ranks_per_node = 4});
  EXPECT_FALSE(mesh.GroupsCrossNodes(View::kDense, {Axis::kTp}));
  EXPECT_TRUE(mesh.GroupsCrossNodes(View::kDense, {Axis::kDp}));
  EXPECT_FALSE(mesh.GroupsCrossNodes(View::kExpert, {Axis::kTp}));
  EXPECT_FALSE(mesh.GroupsCrossNodes(View::kExpert, {Axis::kEp}));
  EXPECT_TRUE(mesh.GroupsCrossNodes(View::kExpert, {Axis::kDp}));
  EXPECT_FALSE(mesh.CrossesNodes({4, 6}));
  EXPECT_TRUE(mesh.CrossesNodes({2, 6}));
  EXPECT_TRUE(CheckTensorParallelInsideNodes(mesh).ok());
}

TEST(TopologyTest, TensorParallelLargerThanANode) {
  const Mesh mesh = MakeMesh(8, {.tp = 4, .ranks_per_node = 2});
  const Status s = CheckTensorParallelInsideNodes(mesh);
  EXPECT_EQ(s.message(),
            "tp=4 does not fit in a node of 2 ranks: its group [0, 1, 2, 3] spans nodes 0-1; "
            "use tp <= 2 to keep it inside a node");
}

TEST(TopologyTest, ExpertTensorParallelNotDividingTheNode) {
  // etp 3 over nodes of 4: the etp group [3, 4, 5] straddles nodes 0 and 1.
  const Mesh mesh = MakeMesh(12, {.tp = 1, .etp = 3, .ranks_per_node = 4});
  const Status s = CheckTensorParallelInsideNodes(mesh);
  EXPECT_EQ(s.message(),
            "etp=3 does not divide the 4 ranks of a node: its group [3, 4, 5] spans nodes 0-1; "
            "use a etp that divides ranks_per_node");
}

TEST(TopologyTest, OrderThatStridesTensorParallel) {
  // dp fastest (dp = 4): tp groups are [0, 4], [1, 5], ...; [0, 4] spans nodes 0-2.
  const Mesh mesh = MakeMesh(8, {.tp = 2, .ranks_per_node = 2}, "dp-tp-cp-ep-pp");
  const Status s = CheckTensorParallelInsideNodes(mesh);
  EXPECT_THAT(s.message(), HasSubstr("order \"dp-tp-cp-ep-pp\" puts the tp group [0, 4]"));
  EXPECT_THAT(s.message(), HasSubstr("put tp first in the order"));
}

TEST(TopologyTest, RejectsBadRanksPerNode) {
  StatusOr<Mesh> m = Mesh::Create(8, {.ranks_per_node = 3});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(),
            "world size 8 is not divisible by ranks_per_node = 3 (every node holds the same "
            "number of ranks)");
  m = Mesh::Create(8, {.ranks_per_node = -1});
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "ranks_per_node must be >= 0 (0: one node), got -1");
}

}  // namespace
}  // namespace switchyard::dist
