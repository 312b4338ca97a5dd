// The hierarchical all-to-all (engine/dist/hierarchical_communicator.h) against the flat one
// on virtual nodes of the world (run with 2, 4 and 8 ranks): every node layout whose nodes
// hold 2 or more ranks (2x2 on 4 ranks; 2x4 and 4x2 on 8), in block placement and
// interleaved (node = rank % N, so the group order is not node-major and every reorder
// moves rows). Checked bit for bit (memcmp) for random counts with zeros, a skewed split
// (most rows to member 0), all-empty sends, AllToAll and the reverse exchange; and the
// inter-node traffic of a uniform exchange against the formulas of docs/moe-layer.md:
// flat (N - 1) L messages, hierarchical N - 1, both (N - 1) L B bytes per rank.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "engine/dist/counting_communicator.h"
#include "engine/dist/hierarchical_communicator.h"
#include "engine/dist/process.h"

namespace switchyard::dist {
namespace {

struct Case {
  std::string name;
  std::vector<int> node_of_member;
};

std::vector<Case> NodeCases(int n) {
  std::vector<Case> cases;
  for (int per_node = 2; per_node < n; ++per_node) {
    if (n % per_node != 0) continue;
    const int nodes = n / per_node;
    Case block{StrCat(nodes, "x", per_node, " block"), {}};
    Case interleaved{StrCat(nodes, "x", per_node, " interleaved"), {}};
    for (int r = 0; r < n; ++r) {
      block.node_of_member.push_back(r / per_node);
      interleaved.node_of_member.push_back(nodes - 1 - r % nodes);
    }
    cases.push_back(block);
    cases.push_back(interleaved);
  }
  // Degenerate layouts fall back to the flat exchange; they must still agree.
  cases.push_back({"one node", std::vector<int>(n, 7)});
  return cases;
}

// Rows member `src` sends member `dst` under `split`, the same on every rank.
int64_t Rows(const std::string& split, int src, int dst, int n) {
  if (split == "empty") return 0;
  if (split == "uniform") return 2;
  if (split == "skewed") return dst == 0 ? 9 + src : (src + dst) % 2;
  const PhiloxBlock b = Philox4x32(PhiloxBlock{{static_cast<uint32_t>(src * n + dst), 0, 0, 0}},
                                   99, 0);
  return b.v[0] % 5;  // 0..4, zeros included
}

template <typename T>
Tensor Pattern(int64_t rows, int64_t width, int me, DType dtype) {
  Tensor t = Tensor::Empty({rows, width}, dtype);
  T* p = t.data<T>();
  for (int64_t i = 0; i < rows * width; ++i) p[i] = static_cast<T>(me * 100003 + i * 7 + 1);
  return t;
}

bool SameBytes(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

TEST(HierarchicalAllToAllTest, EqualsFlatBitForBit) {
  std::unique_ptr<Communicator> world = WorldCommunicator();
  const int n = world->size(), me = world->rank();
  for (const Case& c : NodeCases(n)) {
    auto hier = HierarchicalCommunicator::Create(*world, c.node_of_member);
    ASSERT_TRUE(hier.ok()) << hier.status();
    for (const std::string split : {"random", "skewed", "empty", "uniform"}) {
      SCOPED_TRACE(c.name + ", " + split);
      std::vector<int64_t> send(n), recv(n);
      int64_t send_total = 0, recv_total = 0;
      for (int p = 0; p < n; ++p) {
        send[p] = Rows(split, me, p, n), recv[p] = Rows(split, p, me, n);
        send_total += send[p], recv_total += recv[p];
      }
      for (DType dtype : {DType::kF32, DType::kI64}) {
        const Tensor in = dtype == DType::kF32 ? Pattern<float>(send_total, 5, me, dtype)
                                               : Pattern<int64_t>(send_total, 3, me, dtype);
        Shape out_shape = in.shape();
        out_shape[0] = recv_total;
        Tensor flat = Tensor::Zeros(out_shape, dtype), got = Tensor::Zeros(out_shape, dtype);
        world->AllToAllV(in, send, flat, recv);
        (*hier)->AllToAllV(in, send, got, recv);
        EXPECT_TRUE(SameBytes(flat, got)) << DTypeName(dtype);
        // The reverse exchange (the combine) brings back exactly in.
        Tensor back = Tensor::Zeros(in.shape(), dtype);
        (*hier)->AllToAllV(got, recv, back, send);
        EXPECT_TRUE(SameBytes(back, in)) << "reverse, " << DTypeName(dtype);
      }
      if (split == "uniform") {
        const Tensor in = Pattern<float>(2 * n, 4, me, DType::kF32);
        Tensor flat = Tensor::Zeros(in.shape(), DType::kF32);
        Tensor got = Tensor::Zeros(in.shape(), DType::kF32);
        world->AllToAll(in, flat);
        (*hier)->AllToAll(in, got);
        EXPECT_TRUE(SameBytes(flat, got)) << "AllToAll";
      }
    }
  }
}

TEST(HierarchicalAllToAllTest, InterNodeTrafficOfAUniformExchange) {
  auto peers = std::make_shared<PeerTraffic>();
  CountingCommunicator world(WorldCommunicator(), peers);
  const int n = world.size(), me = world.rank();
  constexpr int64_t kRows = 3, kWidth = 4, kBlockBytes = kRows * kWidth * sizeof(float);
  for (const Case& c : NodeCases(n)) {
    SCOPED_TRACE(c.name);
    auto hier = HierarchicalCommunicator::Create(world, c.node_of_member);
    ASSERT_TRUE(hier.ok()) << hier.status();
    const NodeLayout& layout = (*hier)->layout();
    const int nodes = layout.nodes, per_node = layout.per_node;
    // World rank w of this world is member w.
    const auto other_node = [&](int w) { return layout.node[w] != layout.node[me]; };
    const auto same_node = [&](int w) { return w != me && !other_node(w); };
    const std::vector<int64_t> rows(n, kRows);
    const Tensor in = Pattern<float>(kRows * n, kWidth, me, DType::kF32);
    Tensor out = Tensor::Empty(in.shape(), DType::kF32);

    peers->Reset();
    world.AllToAllV(in, rows, out, rows);
    EXPECT_EQ(peers->MessagesTo(other_node), (nodes - 1) * per_node);
    EXPECT_EQ(peers->BytesTo(other_node), (nodes - 1) * per_node * kBlockBytes);
    EXPECT_EQ(peers->MessagesTo(same_node), per_node - 1);

    peers->Reset();
    (*hier)->AllToAllV(in, rows, out, rows);
    if (nodes > 1 && per_node > 1) {
      EXPECT_EQ(peers->MessagesTo(other_node), nodes - 1);
      EXPECT_EQ(peers->BytesTo(other_node), (nodes - 1) * per_node * kBlockBytes);
      // Step 1 sends each other local member its rows for every node.
      EXPECT_EQ(peers->MessagesTo(same_node), per_node - 1);
      EXPECT_EQ(peers->BytesTo(same_node), (per_node - 1) * nodes * kBlockBytes);
    }
  }
}

TEST(HierarchicalAllToAllTest, RejectsUnevenNodes) {
  std::unique_ptr<Communicator> world = WorldCommunicator();
  const int n = world->size();
  if (n < 3) GTEST_SKIP() << "needs 3 or more ranks for uneven nodes";
  std::vector<int> nodes(n, 1);
  nodes[0] = 0;  // node 0 holds one member, node 1 the rest
  auto hier = HierarchicalCommunicator::Create(*world, nodes);
  ASSERT_FALSE(hier.ok());
  EXPECT_EQ(hier.status().message(),
            StrCat("the group's nodes hold different numbers of its members (node 0: 1, node "
                   "1: ", n - 1, "); the hierarchical all-to-all needs the same number on "
                   "every node"));
}

}  // namespace
}  // namespace switchyard::dist
