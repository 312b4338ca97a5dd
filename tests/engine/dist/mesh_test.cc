// Mesh: golden group tables (Megatron-LM's documented example and hand-derived ones), an
// independent port of Megatron's generate_masked_orthogonal_rank_groups checked over every
// small layout, coordinates, pipeline neighbours, descriptions and every validation error.
#include "engine/dist/mesh.h"

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace switchyard::dist {
namespace {

using ::testing::HasSubstr;
using Groups = std::vector<std::vector<int>>;

constexpr Axis kTp = Axis::kTp;
constexpr Axis kCp = Axis::kCp;
constexpr Axis kEp = Axis::kEp;
constexpr Axis kDp = Axis::kDp;
constexpr Axis kPp = Axis::kPp;
constexpr View kDense = View::kDense;
constexpr View kExpert = View::kExpert;

Mesh MakeMesh(int world, MeshSizes sizes, std::string_view order = kDefaultMeshOrder) {
  StatusOr<Mesh> mesh = Mesh::Create(world, sizes, order);
  EXPECT_TRUE(mesh.ok()) << mesh.status();
  return *std::move(mesh);
}

std::string CreateError(int world, MeshSizes sizes, std::string_view order = kDefaultMeshOrder) {
  StatusOr<Mesh> mesh = Mesh::Create(world, sizes, order);
  EXPECT_FALSE(mesh.ok()) << "world " << world << " order " << order << " was accepted";
  if (mesh.ok()) return "";
  EXPECT_EQ(mesh.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(mesh.status().message());
  EXPECT_EQ(message.find('\n'), std::string::npos) << "more than one line: " << message;
  return message;
}

// ---- Golden tables -------------------------------------------------------------------

// Megatron-LM's documented example (initialize_model_parallel docstring): 16 ranks, tp=2,
// pp=4, hence dp=2, default order tp-cp-ep-dp-pp.
TEST(MeshTest, MegatronSixteenRankExample) {
  const Mesh mesh = MakeMesh(16, {.tp = 2, .pp = 4});
  EXPECT_EQ(mesh.dp(), 2);
  EXPECT_EQ(mesh.Groups(kDense, {kTp}),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(mesh.Groups(kDense, {kDp}),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(mesh.Groups(kDense, {kPp}),
            (Groups{{0, 4, 8, 12}, {1, 5, 9, 13}, {2, 6, 10, 14}, {3, 7, 11, 15}}));
  // The docstring's model-parallel (tp x pp) groups.
  EXPECT_EQ(mesh.Groups(kDense, {kTp, kPp}),
            (Groups{{0, 1, 4, 5, 8, 9, 12, 13}, {2, 3, 6, 7, 10, 11, 14, 15}}));
  EXPECT_EQ(mesh.Groups(kDense, {kCp}).size(), 16u);

  // etp defaults to tp and ep to 1, so the expert view is the dense one renamed.
  EXPECT_EQ(mesh.etp(), 2);
  EXPECT_EQ(mesh.ep(), 1);
  EXPECT_EQ(mesh.edp(), 2);
  EXPECT_EQ(mesh.Groups(kExpert, {kTp}), mesh.Groups(kDense, {kTp}));
  EXPECT_EQ(mesh.Groups(kExpert, {kDp}), mesh.Groups(kDense, {kDp}));
  EXPECT_EQ(mesh.Groups(kExpert, {kPp}), mesh.Groups(kDense, {kPp}));
  EXPECT_EQ(mesh.Groups(kExpert, {kEp}).size(), 16u);
}

// World 8, tp=2, ep=4, etp=1. Dense: tp=2 cp=1 dp=4 pp=1; strides tp 1, dp 2.
// Expert: etp=1 ep=4 edp=8/(1*4*1)=2; strides etp 1, cp 1, ep 1, edp 4. So ep takes the
// ranks tp and half of dp used: ep [0..3],[4..7]; edp strides by 4.
TEST(MeshTest, ExpertFoldingEtpOne) {
  const Mesh mesh = MakeMesh(8, {.tp = 2, .ep = 4, .etp = 1});
  EXPECT_EQ(mesh.dp(), 4);
  EXPECT_EQ(mesh.edp(), 2);
  EXPECT_EQ(mesh.Groups(kDense, {kTp}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.Groups(kDense, {kDp}), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(mesh.Groups(kDense, {kEp}), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kTp}), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kEp}), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kDp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kEp, kDp}), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kPp}), mesh.Groups(kDense, {kPp}));
}

// World 8, tp=2, ep=4, etp=2. Expert: etp=2 ep=4 edp=1; strides etp 1, cp 2, ep 2, edp 8.
TEST(MeshTest, ExpertFoldingEtpTwo) {
  const Mesh mesh = MakeMesh(8, {.tp = 2, .ep = 4, .etp = 2});
  EXPECT_EQ(mesh.edp(), 1);
  EXPECT_EQ(mesh.Groups(kExpert, {kTp}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kEp}), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kDp}), (Groups{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kTp, kEp}), (Groups{{0, 1, 2, 3, 4, 5, 6, 7}}));
}

// World 8, tp=2, cp=2 (dp=2). Dense strides: tp 1, cp 2, ep 4 (size 1), dp 4.
//   cp [0,2],[1,3],[4,6],[5,7]; dp [0,4],[1,5],[2,6],[3,7];
//   dp x cp (gradient sync): fixed tp; cp fastest inside: 0,2 (cp), then +4 (dp).
// Expert with ep=2 (etp=tp=2, edp=8/4=2): strides etp 1, cp 2 (size 1), ep 2, edp 4:
// ep folds onto the ranks cp uses.
TEST(MeshTest, ContextParallel) {
  const Mesh mesh = MakeMesh(8, {.tp = 2, .cp = 2, .ep = 2});
  EXPECT_EQ(mesh.dp(), 2);
  EXPECT_EQ(mesh.edp(), 2);
  EXPECT_EQ(mesh.Groups(kDense, {kTp}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.Groups(kDense, {kCp}), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.Groups(kDense, {kDp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.Groups(kDense, {kDp, kCp}), (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}}));
  // A set: the order the axes are named in does not matter.
  EXPECT_EQ(mesh.Groups(kDense, {kCp, kDp}), mesh.Groups(kDense, {kDp, kCp}));
  EXPECT_EQ(mesh.Groups(kDense, {kTp, kCp}), (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kTp}), (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kEp}), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kDp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kCp}).size(), 8u);
}

// Order tp-dp-cp-ep-pp, world 16, tp=2 cp=2 pp=2 (dp=2).
// Dense sizes in order (tp 2, dp 2, cp 2, ep 1, pp 2): strides tp 1, dp 2, cp 4, pp 8.
//   dp groups by (tp, cp, pp) index: [0,2],[1,3],[4,6],[5,7],[8,10],...
//   cp groups by (tp, dp, pp) index: [0,4],[1,5],[2,6],[3,7],[8,12],...
// Expert with ep=2, etp=1: edp=16/(1*2*2)=4; sizes in order (etp 1, edp 4, cp 1, ep 2,
// pp 2): strides edp 1, ep 4, pp 8.
TEST(MeshTest, NonDefaultOrderTpDpCp) {
  const Mesh mesh = MakeMesh(16, {.tp = 2, .cp = 2, .ep = 2, .etp = 1, .pp = 2},
                             "tp-dp-cp-ep-pp");
  EXPECT_EQ(mesh.OrderString(), "tp-dp-cp-ep-pp");
  EXPECT_EQ(mesh.Stride(kDense, kCp), 4);
  EXPECT_EQ(mesh.Stride(kExpert, kEp), 4);
  EXPECT_EQ(mesh.Groups(kDense, {kTp}),
            (Groups{{0, 1}, {2, 3}, {4, 5}, {6, 7}, {8, 9}, {10, 11}, {12, 13}, {14, 15}}));
  EXPECT_EQ(mesh.Groups(kDense, {kDp}),
            (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}, {8, 10}, {9, 11}, {12, 14}, {13, 15}}));
  EXPECT_EQ(mesh.Groups(kDense, {kCp}),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(mesh.Groups(kDense, {kDp, kCp}),
            (Groups{{0, 2, 4, 6}, {1, 3, 5, 7}, {8, 10, 12, 14}, {9, 11, 13, 15}}));
  EXPECT_EQ(mesh.Groups(kDense, {kPp}), (Groups{{0, 8}, {1, 9}, {2, 10}, {3, 11}, {4, 12},
                                                {5, 13}, {6, 14}, {7, 15}}));
  EXPECT_EQ(mesh.edp(), 4);
  EXPECT_EQ(mesh.Groups(kExpert, {kDp}),
            (Groups{{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kEp}),
            (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}, {8, 12}, {9, 13}, {10, 14}, {11, 15}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kPp}), mesh.Groups(kDense, {kPp}));
}

// Order dp-tp-cp-ep-pp, world 4, tp=2 (dp=2): dp is fastest (stride 1), tp stride 2.
TEST(MeshTest, NonDefaultOrderDpFirst) {
  const Mesh mesh = MakeMesh(4, {.tp = 2}, "dp-tp-cp-ep-pp");
  EXPECT_EQ(mesh.Groups(kDense, {kDp}), (Groups{{0, 1}, {2, 3}}));
  EXPECT_EQ(mesh.Groups(kDense, {kTp}), (Groups{{0, 2}, {1, 3}}));
  EXPECT_EQ(mesh.CoordsOf(1, kDense), (MeshCoords{0, 0, 0, 1, 0}));
  EXPECT_EQ(mesh.CoordsOf(2, kDense), (MeshCoords{1, 0, 0, 0, 0}));
}

// pp not last but dp == edp and equal pipeline groups: Megatron accepts it.
// Order tp-pp-cp-ep-dp, world 8, tp=2 pp=2: strides tp 1, pp 2, dp 4.
TEST(MeshTest, PipelineNotLastWhenViewsAgree) {
  const Mesh mesh = MakeMesh(8, {.tp = 2, .pp = 2}, "tp-pp-cp-ep-dp");
  EXPECT_EQ(mesh.Groups(kDense, {kPp}), (Groups{{0, 2}, {1, 3}, {4, 6}, {5, 7}}));
  EXPECT_EQ(mesh.Groups(kDense, {kDp}), (Groups{{0, 4}, {1, 5}, {2, 6}, {3, 7}}));
  EXPECT_EQ(mesh.Groups(kExpert, {kPp}), mesh.Groups(kDense, {kPp}));
}

TEST(MeshTest, OneRank) {
  const Mesh mesh = MakeMesh(1, {});
  for (View view : {kDense, kExpert}) {
    for (Axis axis : kAllAxes) {
      EXPECT_EQ(mesh.Size(view, axis), 1);
      EXPECT_EQ(mesh.Groups(view, {axis}), (Groups{{0}}));
    }
  }
  EXPECT_EQ(mesh.Describe(0),
            "rank 0: TP(0/1) CP(0/1) DP(0/1) PP(0/1) | ETP(0/1) EP(0/1) EDP(0/1)");
  const PipelineNeighbors p = mesh.PipelineOf(0);
  EXPECT_EQ(p.prev, 0);
  EXPECT_EQ(p.next, 0);
  EXPECT_TRUE(p.is_first);
  EXPECT_TRUE(p.is_last);
}

TEST(MeshTest, TwoRanks) {
  const Mesh data = MakeMesh(2, {});
  EXPECT_EQ(data.Groups(kDense, {kDp}), (Groups{{0, 1}}));
  EXPECT_EQ(data.Groups(kDense, {kTp}), (Groups{{0}, {1}}));
  EXPECT_EQ(data.Groups(kExpert, {kDp}), (Groups{{0, 1}}));

  const Mesh tensor = MakeMesh(2, {.tp = 2});
  EXPECT_EQ(tensor.Groups(kDense, {kTp}), (Groups{{0, 1}}));
  EXPECT_EQ(tensor.Groups(kDense, {kDp}), (Groups{{0}, {1}}));

  const Mesh expert = MakeMesh(2, {.ep = 2});
  EXPECT_EQ(expert.Groups(kDense, {kDp}), (Groups{{0, 1}}));
  EXPECT_EQ(expert.Groups(kExpert, {kEp}), (Groups{{0, 1}}));
  EXPECT_EQ(expert.Groups(kExpert, {kDp}), (Groups{{0}, {1}}));

  const Mesh pipe = MakeMesh(2, {.pp = 2});
  EXPECT_EQ(pipe.Groups(kDense, {kPp}), (Groups{{0, 1}}));
  const PipelineNeighbors first = pipe.PipelineOf(0);
  EXPECT_EQ(first.stage, 0);
  EXPECT_EQ(first.num_stages, 2);
  EXPECT_EQ(first.prev, 1);
  EXPECT_EQ(first.next, 1);
  EXPECT_TRUE(first.is_first);
  EXPECT_FALSE(first.is_last);
  const PipelineNeighbors last = pipe.PipelineOf(1);
  EXPECT_EQ(last.stage, 1);
  EXPECT_FALSE(last.is_first);
  EXPECT_TRUE(last.is_last);
}

// ---- Pipeline neighbours and descriptions --------------------------------------------

TEST(MeshTest, PipelineNeighbors) {
  const Mesh mesh = MakeMesh(16, {.tp = 2, .pp = 4});  // pp groups [1,5,9,13], ...
  const PipelineNeighbors middle = mesh.PipelineOf(5);
  EXPECT_EQ(middle.stage, 1);
  EXPECT_EQ(middle.num_stages, 4);
  EXPECT_EQ(middle.prev, 1);
  EXPECT_EQ(middle.next, 9);
  EXPECT_FALSE(middle.is_first);
  EXPECT_FALSE(middle.is_last);
  const PipelineNeighbors first = mesh.PipelineOf(1);
  EXPECT_EQ(first.stage, 0);
  EXPECT_TRUE(first.is_first);
  EXPECT_EQ(first.prev, 13);  // wraps around, as in Megatron-LM
  EXPECT_EQ(first.next, 5);
  const PipelineNeighbors last = mesh.PipelineOf(14);
  EXPECT_EQ(last.stage, 3);
  EXPECT_TRUE(last.is_last);
  EXPECT_EQ(last.prev, 10);
  EXPECT_EQ(last.next, 2);
}

TEST(MeshTest, Describe) {
  const Mesh mesh = MakeMesh(16, {.tp = 2, .pp = 4});
  EXPECT_EQ(mesh.Describe(5),
            "rank 5: TP(1/2) CP(0/1) DP(0/2) PP(1/4) | ETP(1/2) EP(0/1) EDP(0/2)");
  EXPECT_EQ(mesh.Describe(15),
            "rank 15: TP(1/2) CP(0/1) DP(1/2) PP(3/4) | ETP(1/2) EP(0/1) EDP(1/2)");
  // Rank 5 of world 8, tp=2 ep=4 etp=1: dense tp 5%2=1, dp 5/2=2; expert ep 5%4=1, edp 5/4=1.
  const Mesh folded = MakeMesh(8, {.tp = 2, .ep = 4, .etp = 1});
  EXPECT_EQ(folded.Describe(5),
            "rank 5: TP(1/2) CP(0/1) DP(2/4) PP(0/1) | ETP(0/1) EP(1/4) EDP(1/2)");
  EXPECT_EQ(folded.Summary(),
            "world 8: tp 2 x cp 1 x dp 4 x pp 1 | etp 1 x ep 4 x edp 2 x pp 1, order "
            "tp-cp-ep-dp-pp");
}

TEST(MeshTest, AxisNames) {
  EXPECT_EQ(AxisName(kTp, kDense), "tp");
  EXPECT_EQ(AxisName(kTp, kExpert), "etp");
  EXPECT_EQ(AxisName(kDp, kExpert), "edp");
  EXPECT_EQ(AxisName(kEp, kExpert), "ep");
  EXPECT_EQ(*ParseAxis("PP"), kPp);
  EXPECT_FALSE(ParseAxis("xp").ok());
}

// ---- Every small layout against an independent port of Megatron ------------------------

// A literal port of Megatron-LM's generate_masked_orthogonal_rank_groups
// (megatron/core/parallel_state.py): parallel_size and mask in order, fastest first.
Groups MegatronGroups(int world, const std::vector<int>& parallel_size,
                      const std::vector<bool>& mask) {
  auto prefix_product = [](const std::vector<int>& a) {
    std::vector<int> r = {1};
    for (int v : a) r.push_back(r.back() * v);
    return r;
  };
  auto decompose = [&](int index, const std::vector<int>& shape) {
    const std::vector<int> stride = prefix_product(shape);
    std::vector<int> idx;
    for (size_t i = 0; i < shape.size(); ++i) idx.push_back((index / stride[i]) % shape[i]);
    return idx;
  };
  auto inner_product = [](const std::vector<int>& a, const std::vector<int>& b) {
    int sum = 0;
    for (size_t i = 0; i < a.size(); ++i) sum += a[i] * b[i];
    return sum;
  };
  std::vector<int> masked_shape, unmasked_shape, masked_stride, unmasked_stride;
  const std::vector<int> global_stride = prefix_product(parallel_size);
  for (size_t i = 0; i < parallel_size.size(); ++i) {
    (mask[i] ? masked_shape : unmasked_shape).push_back(parallel_size[i]);
    (mask[i] ? masked_stride : unmasked_stride).push_back(global_stride[i]);
  }
  const int group_size = prefix_product(masked_shape).back();
  Groups ranks;
  for (int group_index = 0; group_index < world / group_size; ++group_index) {
    const std::vector<int> group_idx = decompose(group_index, unmasked_shape);
    std::vector<int> rank;
    for (int rank_in_group = 0; rank_in_group < group_size; ++rank_in_group) {
      rank.push_back(inner_product(decompose(rank_in_group, masked_shape), masked_stride) +
                     inner_product(group_idx, unmasked_stride));
    }
    ranks.push_back(rank);
  }
  return ranks;
}

std::vector<int> Divisors(int n) {
  std::vector<int> out;
  for (int d = 1; d <= n; ++d) {
    if (n % d == 0) out.push_back(d);
  }
  return out;
}

// Checks one mesh: groups equal Megatron's for all 32 axis sets in both views, each
// rank once per group list, GroupOf agrees with Groups, members share the fixed
// coordinates, and coordinates round-trip.
void CheckAgainstMegatron(const Mesh& mesh) {
  const int world = mesh.world();
  for (View view : {kDense, kExpert}) {
    std::vector<int> ordered_size;
    for (Axis axis : mesh.order()) ordered_size.push_back(mesh.Size(view, axis));
    for (int rank = 0; rank < world; ++rank) {
      ASSERT_EQ(mesh.RankAt(view, mesh.CoordsOf(rank, view)), rank);
    }
    for (int bits = 0; bits < (1 << kNumAxes); ++bits) {
      std::vector<Axis> axes;
      std::vector<bool> mask;
      for (Axis axis : mesh.order()) {
        const bool in = (bits >> static_cast<int>(axis)) & 1;
        mask.push_back(in);
        if (in) axes.push_back(axis);
      }
      const Groups groups = mesh.Groups(view, axes);
      ASSERT_EQ(groups, MegatronGroups(world, ordered_size, mask))
          << mesh.Summary() << " view " << static_cast<int>(view) << " mask " << bits;
      std::vector<int> seen(world, 0);
      for (const std::vector<int>& group : groups) {
        const MeshCoords first = mesh.CoordsOf(group[0], view);
        for (int rank : group) {
          ++seen[rank];
          ASSERT_EQ(mesh.GroupOf(rank, view, axes), group);
          const MeshCoords coords = mesh.CoordsOf(rank, view);
          for (Axis axis : kAllAxes) {
            if (std::find(axes.begin(), axes.end(), axis) == axes.end()) {
              ASSERT_EQ(coords[static_cast<int>(axis)], first[static_cast<int>(axis)]);
            }
          }
        }
      }
      ASSERT_EQ(seen, std::vector<int>(world, 1)) << mesh.Summary() << " mask " << bits;
    }
  }
  for (int rank = 0; rank < world; ++rank) {
    const PipelineNeighbors p = mesh.PipelineOf(rank);
    const std::vector<int> group = mesh.GroupOf(rank, kDense, {kPp});
    ASSERT_EQ(group[p.stage], rank);
    ASSERT_EQ(group, mesh.GroupOf(rank, kExpert, {kPp}));
    ASSERT_EQ(mesh.PipelineOf(p.next).prev, rank);
  }
}

TEST(MeshTest, EveryLayoutMatchesMegatron) {
  const std::vector<std::string> orders = {"tp-cp-ep-dp-pp", "tp-dp-cp-ep-pp",
                                           "dp-tp-cp-ep-pp", "tp-ep-cp-dp-pp",
                                           "cp-tp-dp-ep-pp", "tp-pp-cp-ep-dp"};
  int checked = 0, rejected = 0;
  for (int world : {1, 2, 4, 6, 8, 12, 16}) {
    for (const std::string& order : orders) {
      for (int tp : Divisors(world)) {
        for (int cp : Divisors(world / tp)) {
          for (int pp : Divisors(world / tp / cp)) {
            for (int ep : Divisors(world / pp)) {
              for (int etp : Divisors(world / pp / ep)) {
                StatusOr<Mesh> mesh = Mesh::Create(
                    world, {.tp = tp, .cp = cp, .ep = ep, .etp = etp, .pp = pp}, order);
                if (!mesh.ok()) {
                  // Only Megatron's cross-view rules may reject a divisible layout:
                  // different pp group lists, or pp not last with dp != edp.
                  ASSERT_NE(order.substr(order.size() - 2), "pp") << mesh.status();
                  const int dp = world / (tp * cp * pp), edp = world / (etp * ep * pp);
                  const std::map<std::string, int> dense = {
                      {"tp", tp}, {"cp", cp}, {"ep", 1}, {"dp", dp}, {"pp", pp}};
                  const std::map<std::string, int> expert = {
                      {"tp", etp}, {"cp", 1}, {"ep", ep}, {"dp", edp}, {"pp", pp}};
                  std::vector<int> dense_size, expert_size;
                  std::vector<bool> pp_mask;
                  for (size_t at = 0; at < order.size(); at += 3) {
                    const std::string name = order.substr(at, 2);
                    dense_size.push_back(dense.at(name));
                    expert_size.push_back(expert.at(name));
                    pp_mask.push_back(name == "pp");
                  }
                  ASSERT_TRUE(MegatronGroups(world, dense_size, pp_mask) !=
                                  MegatronGroups(world, expert_size, pp_mask) ||
                              dp != edp)
                      << mesh.status();
                  ++rejected;
                  continue;
                }
                CheckAgainstMegatron(*mesh);
                ++checked;
              }
            }
          }
        }
      }
    }
  }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(rejected, 10);
}

// ---- Validation ------------------------------------------------------------------------

TEST(MeshTest, RejectsSizesBelowOne) {
  EXPECT_EQ(CreateError(0, {}), "world size must be >= 1, got 0");
  EXPECT_EQ(CreateError(8, {.tp = 0}), "tp must be >= 1, got 0");
  EXPECT_EQ(CreateError(8, {.cp = -1}), "cp must be >= 1, got -1");
  EXPECT_EQ(CreateError(8, {.ep = 0}), "ep must be >= 1, got 0");
  EXPECT_EQ(CreateError(8, {.etp = 0}), "etp must be >= 1, got 0");
  EXPECT_EQ(CreateError(8, {.pp = 0}), "pp must be >= 1, got 0");
}

TEST(MeshTest, RejectsIndivisibleWorld) {
  EXPECT_EQ(CreateError(12, {.tp = 2, .pp = 8}),
            "world size 12 is not divisible by tp*cp*pp = 2*1*8 = 16");
  EXPECT_EQ(CreateError(12, {.tp = 4, .cp = 2}),
            "world size 12 is not divisible by tp*cp*pp = 4*2*1 = 8");
  EXPECT_EQ(CreateError(12, {.ep = 8}),
            "world size 12 is not divisible by etp*ep*pp = 1*8*1 = 8 (etp*ep = 8 must divide "
            "tp*cp*dp = 12)");
  EXPECT_EQ(CreateError(8, {.tp = 2, .ep = 8}),
            "world size 8 is not divisible by etp*ep*pp = 2*8*1 = 16 (etp*ep = 16 must divide "
            "tp*cp*dp = 8)");
  // Sizes whose product overflows int are rejected, not wrapped.
  EXPECT_THAT(CreateError(8, {.tp = 1 << 20, .cp = 1 << 20, .pp = 1 << 20}),
              HasSubstr("is not divisible by tp*cp*pp"));
}

TEST(MeshTest, RejectsBadOrder) {
  EXPECT_EQ(CreateError(8, {}, "tp-cp-xx-dp-pp"),
            "order \"tp-cp-xx-dp-pp\": unknown axis \"xx\"; expected a permutation of "
            "tp-cp-ep-dp-pp");
  EXPECT_EQ(CreateError(8, {}, "tp-cp-dp-pp"),
            "order \"tp-cp-dp-pp\": axis \"ep\" is missing; expected a permutation of "
            "tp-cp-ep-dp-pp");
  EXPECT_EQ(CreateError(8, {}, "tp-tp-ep-dp-pp"),
            "order \"tp-tp-ep-dp-pp\": axis \"tp\" appears more than once; expected a "
            "permutation of tp-cp-ep-dp-pp");
  EXPECT_THAT(CreateError(8, {}, "tp-cp-ep-dp-pp-tp"), HasSubstr("\"tp\" appears more than once"));
  EXPECT_THAT(CreateError(8, {}, ""), HasSubstr("unknown axis \"\""));
  EXPECT_THAT(CreateError(8, {}, "tp,cp,ep,dp,pp"), HasSubstr("unknown axis \"tp,cp,ep,dp,pp\""));
  // Names are case-insensitive, as in Megatron-LM.
  EXPECT_EQ(MakeMesh(8, {.tp = 2}, "TP-CP-EP-DP-PP").OrderString(), "tp-cp-ep-dp-pp");
}

// Order tp-pp-cp-ep-dp, world 8, tp=2 etp=1 ep=2 pp=2 (dp = edp = 2): the pp stride is
// tp=2 in the dense view but etp=1 in the expert view, so rank 0's pipeline group is
// [0, 2] in one and [0, 1] in the other.
TEST(MeshTest, RejectsDifferentPipelineGroups) {
  EXPECT_EQ(CreateError(8, {.tp = 2, .ep = 2, .etp = 1, .pp = 2}, "tp-pp-cp-ep-dp"),
            "order \"tp-pp-cp-ep-dp\" gives the dense and expert views different pipeline "
            "groups (rank 0: [0, 2] dense vs [0, 1] expert); they must be equal, e.g. with pp "
            "last in the order");
  // The same sizes with pp last are fine.
  MakeMesh(8, {.tp = 2, .ep = 2, .etp = 1, .pp = 2}, "tp-cp-ep-dp-pp");
}

// Order tp-pp-cp-ep-dp, world 8, tp=etp=2 ep=2 pp=2: pipeline groups agree (stride 2 in
// both views) but dp=2 != edp=1, which Megatron-LM rejects unless pp is last.
TEST(MeshTest, RejectsDifferentDataParallelWhenPipelineNotLast) {
  EXPECT_EQ(CreateError(8, {.tp = 2, .ep = 2, .pp = 2}, "tp-pp-cp-ep-dp"),
            "order \"tp-pp-cp-ep-dp\" does not end with pp, so with pp = 2 the dense and "
            "expert data parallel sizes must be equal (dp = 2, edp = 1)");
}

}  // namespace
}  // namespace switchyard::dist
