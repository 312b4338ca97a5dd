// The 5D process mesh: which ranks form the tensor-, context-, expert-, data- and
// pipeline-parallel groups of a world. Pure arithmetic, no MPI; ParallelContext turns the
// groups into communicators.
//
// One world, two views of it (Megatron-LM's "MoE parallel folding"):
//   dense  view: axes (tp, cp, ep=1, dp,  pp),  dp  = world / (tp * cp * pp)
//   expert view: axes (etp, 1,   ep,  edp, pp), edp = world / (etp * ep * pp)
// Both views lay the axes out with the same order string (default "tp-cp-ep-dp-pp", the
// first axis varies fastest); in the expert view the "tp" slot holds etp, the "cp" slot has
// size 1 and the "dp" slot holds edp. A rank is
//   rank = sum_axis coord[axis] * stride[axis],  stride[axis] = product of the sizes of
//          the axes before it in the order,
// and both views must give the same pipeline groups. The group lists follow Megatron's
// RankGenerator / generate_masked_orthogonal_rank_groups exactly, so a layout here has the
// same groups, in the same order, as the same layout in Megatron-LM.
//
//   SY_ASSIGN_OR_RETURN(Mesh mesh, Mesh::Create(16, {.tp = 2, .pp = 4}));
//   mesh.Groups(View::kDense, {Axis::kDp, Axis::kCp});  // dense gradient sync groups
//   mesh.GroupOf(rank, View::kExpert, {Axis::kEp});      // this rank's all-to-all group
#pragma once

#include <array>
#include <initializer_list>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "engine/core/status.h"

namespace switchyard::dist {

// The five mesh axes. In the expert view kTp means etp, kDp means edp and kCp has size 1;
// in the dense view kEp has size 1.
enum class Axis { kTp = 0, kCp = 1, kEp = 2, kDp = 3, kPp = 4 };
inline constexpr int kNumAxes = 5;
inline constexpr std::array<Axis, kNumAxes> kAllAxes = {Axis::kTp, Axis::kCp, Axis::kEp,
                                                        Axis::kDp, Axis::kPp};

// Which layout of the world a group or a coordinate refers to.
enum class View {
  kDense,   // attention, dense MLPs, embeddings: (tp, cp, dp, pp)
  kExpert,  // expert MLPs: (etp, ep, edp, pp)
};

// Megatron-LM's default order: tp fastest, then cp, ep, dp, and pp slowest.
inline constexpr std::string_view kDefaultMeshOrder = "tp-cp-ep-dp-pp";

// The axis name in a view: "tp", "cp", "ep", "dp", "pp" in the dense view and "etp",
// "cp", "ep", "edp", "pp" in the expert view.
std::string_view AxisName(Axis axis, View view);

// Parses a dense-view axis name ("tp", "cp", "ep", "dp", "pp"; case-insensitive).
StatusOr<Axis> ParseAxis(std::string_view name);

// The parallel sizes a user chooses; dp and edp follow from the world size.
struct MeshSizes {
  int tp = 1;  // tensor parallel ranks of the dense layers
  int cp = 1;  // context (sequence) parallel ranks
  int ep = 1;  // expert parallel ranks: the experts are split over them
  // Tensor parallel ranks of each expert; unset (the default) means the same as tp, as in
  // Megatron-LM's --expert-tensor-parallel-size.
  std::optional<int> etp = std::nullopt;
  int pp = 1;  // pipeline stages
  // Ranks of one node (the machine whose ranks share memory), ranks placed in blocks: the
  // node of rank r is r / ranks_per_node. 0 (the default) means one node holds the world.
  int ranks_per_node = 0;

  // etp resolved: the same as tp when unset.
  int expert_tp() const { return etp.value_or(tp); }
};

// What every mesh keeps of its sizes: the world and each size >= 1, the world divisible by
// tp*cp*pp and by etp*ep*pp, ranks_per_node >= 0 and dividing the world. One line naming the numbers ("world size 12 is not divisible
// by tp*cp*pp = 2*1*8 = 16"); Mesh::Create and config::ParallelConfig::Validate both ask it.
Status CheckMeshSizes(int world, const MeshSizes& sizes);

// A rank's coordinates in one view, indexed by Axis (coords[int(Axis::kDp)] is its data
// parallel index). Dense: coords[kEp] == 0; expert: coords[kCp] == 0.
using MeshCoords = std::array<int, kNumAxes>;

// A rank's place in its pipeline group (identical in both views).
struct PipelineNeighbors {
  int stage = 0;       // index of this rank's stage, 0 <= stage < num_stages
  int num_stages = 1;  // pp
  // Ranks of the previous and next stage in this rank's pipeline group. They wrap around
  // as in Megatron-LM (the first stage's prev is the last stage), which interleaved
  // schedules use; check is_first / is_last before sending activations.
  int prev = 0;
  int next = 0;
  bool is_first = true;
  bool is_last = true;
};

// An immutable mesh over `world` ranks. Cheap to copy.
class Mesh {
 public:
  // Validates the layout and builds the mesh. Errors (InvalidArgument, one line naming the
  // numbers): a size or the world < 1; world not divisible by tp*cp*pp or by etp*ep*pp;
  // an order that is not a permutation of tp, cp, ep, dp, pp; and, as Megatron-LM
  // requires, dense and expert views with different pipeline groups, or (when pp is not
  // last in the order and pp > 1) different dp and edp.
  static StatusOr<Mesh> Create(int world, MeshSizes sizes,
                               std::string_view order = kDefaultMeshOrder);

  int world() const { return world_; }
  int tp() const { return dense_sizes_[0]; }
  int cp() const { return dense_sizes_[1]; }
  int dp() const { return dense_sizes_[3]; }
  int pp() const { return dense_sizes_[4]; }
  int etp() const { return expert_sizes_[0]; }
  int ep() const { return expert_sizes_[2]; }
  int edp() const { return expert_sizes_[3]; }

  // The axis size in a view: dense (tp, cp, 1, dp, pp), expert (etp, 1, ep, edp, pp).
  int Size(View view, Axis axis) const;
  // The axes from fastest to slowest varying.
  const std::array<Axis, kNumAxes>& order() const { return order_; }
  // The order as a string, e.g. "tp-cp-ep-dp-pp".
  std::string OrderString() const;
  // The distance between ranks whose coordinates differ by one along `axis`.
  int Stride(View view, Axis axis) const;

  // Coordinates of `rank` (0 <= rank < world) in a view.
  MeshCoords CoordsOf(int rank, View view) const;
  // One coordinate of `rank`: mesh.Coord(r, View::kExpert, Axis::kEp) is its ep index.
  int Coord(int rank, View view, Axis axis) const;
  // The rank at `coords` (each within its axis size); inverse of CoordsOf.
  int RankAt(View view, const MeshCoords& coords) const;

  // Every group that varies exactly `axes` (a set: order and repeats do not matter) with
  // the other axes fixed, as Megatron's generate_masked_orthogonal_rank_groups lists them:
  // groups by the index of the fixed axes, fastest first in the order; inside a group,
  // ranks by the index of the varying axes, fastest first. No axes: one group per rank.
  std::vector<std::vector<int>> Groups(View view, std::span<const Axis> axes) const;
  std::vector<std::vector<int>> Groups(View view, std::initializer_list<Axis> axes) const {
    return Groups(view, std::span<const Axis>(axes.begin(), axes.size()));
  }
  // The group of `rank` among Groups(view, axes), in the same rank order.
  std::vector<int> GroupOf(int rank, View view, std::span<const Axis> axes) const;
  std::vector<int> GroupOf(int rank, View view, std::initializer_list<Axis> axes) const {
    return GroupOf(rank, view, std::span<const Axis>(axes.begin(), axes.size()));
  }

  // Topology. Ranks per node (the world when MeshSizes::ranks_per_node was 0), the number of
  // nodes, and the node of `rank`: rank / ranks_per_node.
  int ranks_per_node() const { return ranks_per_node_; }
  int num_nodes() const { return world_ / ranks_per_node_; }
  int NodeOf(int rank) const;
  // Whether the ranks of `group` lie on more than one node.
  bool CrossesNodes(const std::vector<int>& group) const;
  // Whether any group of Groups(view, axes) crosses nodes.
  bool GroupsCrossNodes(View view, std::initializer_list<Axis> axes) const;

  // Previous / next pipeline stage of `rank`.
  PipelineNeighbors PipelineOf(int rank) const;

  // One line, index/size per axis of both views:
  //   "rank 5: TP(1/2) CP(0/1) DP(0/2) PP(1/4) | ETP(1/2) EP(0/1) EDP(0/2)"
  std::string Describe(int rank) const;

  // "world 16: tp 2 x cp 1 x dp 2 x pp 4 | etp 2 x ep 1 x edp 2 x pp 4, order tp-cp-ep-dp-pp"
  // (with ", 2 nodes of 8 ranks" appended when there is more than one node)
  std::string Summary() const;

 private:
  Mesh(int world, std::array<Axis, kNumAxes> order, std::array<int, kNumAxes> dense_sizes,
       std::array<int, kNumAxes> expert_sizes, int ranks_per_node);

  const std::array<int, kNumAxes>& SizesOf(View view) const {
    return view == View::kDense ? dense_sizes_ : expert_sizes_;
  }

  int world_;
  std::array<Axis, kNumAxes> order_;         // fastest first
  std::array<int, kNumAxes> dense_sizes_;    // indexed by Axis
  std::array<int, kNumAxes> expert_sizes_;   // indexed by Axis
  int ranks_per_node_;
};

// The layout rule of docs/mesh.md "Topology": the groups that talk most, tp and etp, stay
// inside a node. OK when every tp group of the dense view and every etp group of the
// expert view lies on one node; else one line naming the group, its nodes and the fix
// (tp or etp larger than a node, or an order that strides them across nodes).
Status CheckTensorParallelInsideNodes(const Mesh& mesh);

// "[0, 2, 4]": a rank list as the mesh prints it.
std::string FormatGroup(const std::vector<int>& group);

}  // namespace switchyard::dist
