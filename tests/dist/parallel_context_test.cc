// ParallelContext under mpirun: every communicator holds exactly the mesh's group of this
// rank, in the mesh's order, and a collective inside it reaches exactly those ranks.
#include "engine/dist/parallel_context.h"

#include <numeric>

#include <gtest/gtest.h>

#include "engine/dist/process.h"

namespace switchyard::dist {
namespace {

struct Layout {
  MeshSizes sizes;
  const char* order;
};

void CheckGroup(Communicator& comm, const std::vector<int>& expected, const char* what) {
  ASSERT_EQ(comm.world_ranks(), expected) << what;
  // Each member contributes (world rank + 1) and its position; the sums show who took part.
  Tensor t = Tensor::FromVector<int64_t>({WorldRank() + 1, comm.rank()}, {2});
  comm.AllReduce(t, ReduceOp::kSum);
  const int64_t n = static_cast<int64_t>(expected.size());
  int64_t want = std::accumulate(expected.begin(), expected.end(), int64_t{0}) + n;
  EXPECT_EQ(t.data<int64_t>()[0], want) << what;
  EXPECT_EQ(t.data<int64_t>()[1], n * (n - 1) / 2) << what;
}

TEST(ParallelContextTest, CommunicatorsMatchTheMeshGroups) {
  auto world = WorldCommunicator();
  const int n = world->size(), me = world->rank();
  std::vector<Layout> layouts = {{{}, "tp-cp-ep-dp-pp"}};
  if (n >= 2) {
    layouts.push_back({{.tp = 2}, "tp-cp-ep-dp-pp"});
    layouts.push_back({{.ep = 2}, "tp-cp-ep-dp-pp"});
    layouts.push_back({{.pp = 2}, "tp-cp-ep-dp-pp"});
    layouts.push_back({{.ep = n}, "tp-cp-ep-dp-pp"});
  }
  if (n >= 4) {
    layouts.push_back({{.tp = 2, .ep = 2, .etp = 1}, "tp-cp-ep-dp-pp"});
    layouts.push_back({{.cp = 2, .ep = 2}, "tp-cp-ep-dp-pp"});
    layouts.push_back({{.tp = 2, .pp = 2}, "tp-dp-cp-ep-pp"});
  }
  if (n >= 8) {
    layouts.push_back({{.tp = 2, .cp = 2, .ep = 4, .etp = 1, .pp = 2}, "tp-cp-ep-dp-pp"});
    layouts.push_back({{.tp = 2, .ep = 2, .pp = 2}, "tp-cp-ep-dp-pp"});
    layouts.push_back({{.tp = 2, .cp = 2, .ep = 2}, "cp-dp-tp-ep-pp"});
  }
  for (const Layout& layout : layouts) {
    auto mesh = Mesh::Create(n, layout.sizes, layout.order);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto ctx = ParallelContext::Create(*world, *mesh);
    ASSERT_TRUE(ctx.ok()) << ctx.status();
    SCOPED_TRACE(mesh->Summary());
    const ParallelContext& pc = **ctx;
    CheckGroup(pc.tp(), mesh->GroupOf(me, View::kDense, {Axis::kTp}), "tp");
    CheckGroup(pc.cp(), mesh->GroupOf(me, View::kDense, {Axis::kCp}), "cp");
    CheckGroup(pc.dp(), mesh->GroupOf(me, View::kDense, {Axis::kDp}), "dp");
    CheckGroup(pc.pp(), mesh->GroupOf(me, View::kDense, {Axis::kPp}), "pp");
    CheckGroup(pc.dp_cp(), mesh->GroupOf(me, View::kDense, {Axis::kDp, Axis::kCp}), "dp_cp");
    // tp_cp: the tp x cp group ordered cp-major, tp-minor whatever the mesh order.
    std::vector<int> tp_cp = mesh->GroupOf(me, View::kDense, {Axis::kTp, Axis::kCp});
    std::vector<int> by_coords(tp_cp.size());
    for (int r : tp_cp) {
      by_coords[mesh->Coord(r, View::kDense, Axis::kCp) * mesh->tp() +
                mesh->Coord(r, View::kDense, Axis::kTp)] = r;
    }
    CheckGroup(pc.tp_cp(), by_coords, "tp_cp");
    CheckGroup(pc.etp(), mesh->GroupOf(me, View::kExpert, {Axis::kTp}), "etp");
    CheckGroup(pc.ep(), mesh->GroupOf(me, View::kExpert, {Axis::kEp}), "ep");
    CheckGroup(pc.edp(), mesh->GroupOf(me, View::kExpert, {Axis::kDp}), "edp");
    EXPECT_EQ(pc.ep().size(), mesh->ep());
    EXPECT_EQ(pc.edp().size(), mesh->edp());
  }
}

TEST(ParallelContextTest, RejectsAMeshForAnotherWorld) {
  auto world = WorldCommunicator();
  auto mesh = Mesh::Create(world->size() * 2, {});
  ASSERT_TRUE(mesh.ok());
  auto ctx = ParallelContext::Create(*world, *mesh);
  ASSERT_FALSE(ctx.ok());
  EXPECT_NE(std::string(ctx.status().message()).find("the mesh is for"), std::string::npos);
}

}  // namespace
}  // namespace switchyard::dist
