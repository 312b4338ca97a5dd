// The 5D process mesh; see mesh.h. The group enumeration is Megatron-LM's
// generate_masked_orthogonal_rank_groups (megatron/core/parallel_state.py) written over
// coordinates instead of index lists.
#include "engine/dist/mesh.h"

#include <cctype>
#include <cstdint>
#include <string>
#include <tuple>
#include <utility>

#include "engine/core/check.h"

namespace switchyard::dist {
namespace {

constexpr std::array<std::string_view, kNumAxes> kDenseNames = {"tp", "cp", "ep", "dp", "pp"};
constexpr std::array<std::string_view, kNumAxes> kExpertNames = {"etp", "cp", "ep", "edp",
                                                                 "pp"};

using AxisOrder = std::array<Axis, kNumAxes>;

int Index(Axis axis) { return static_cast<int>(axis); }

std::string Lower(std::string_view text) {
  std::string out(text);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}


// Parses "tp-cp-ep-dp-pp" (any permutation of the five names) into axes, fastest first.
StatusOr<AxisOrder> ParseOrder(std::string_view order) {
  const std::string lower = Lower(order);
  AxisOrder axes{};
  std::array<bool, kNumAxes> seen{};
  int count = 0;
  size_t start = 0;
  while (true) {
    const size_t dash = lower.find('-', start);
    const std::string token =
        lower.substr(start, dash == std::string::npos ? std::string::npos : dash - start);
    StatusOr<Axis> axis = ParseAxis(token);
    if (!axis.ok()) {
      return InvalidArgument("order \"", order, "\": unknown axis \"", token,
                             "\"; expected a permutation of tp-cp-ep-dp-pp");
    }
    if (seen[Index(*axis)]) {
      return InvalidArgument("order \"", order, "\": axis \"", token,
                             "\" appears more than once; expected a permutation of "
                             "tp-cp-ep-dp-pp");
    }
    seen[Index(*axis)] = true;
    axes[count++] = *axis;
    if (dash == std::string::npos) break;
    start = dash + 1;
  }
  for (Axis axis : kAllAxes) {
    if (!seen[Index(axis)]) {
      return InvalidArgument("order \"", order, "\": axis \"", kDenseNames[Index(axis)],
                             "\" is missing; expected a permutation of tp-cp-ep-dp-pp");
    }
  }
  return axes;
}

}  // namespace

std::string FormatGroup(const std::vector<int>& group) {
  std::string out = "[";
  for (size_t i = 0; i < group.size(); ++i) {
    if (i > 0) out += ", ";
    out += std::to_string(group[i]);
  }
  return out + "]";
}

std::string_view AxisName(Axis axis, View view) {
  return view == View::kDense ? kDenseNames[Index(axis)] : kExpertNames[Index(axis)];
}

StatusOr<Axis> ParseAxis(std::string_view name) {
  const std::string lower = Lower(name);
  for (Axis axis : kAllAxes) {
    if (lower == kDenseNames[Index(axis)]) return axis;
  }
  return InvalidArgument("unknown mesh axis \"", name, "\"; expected tp, cp, ep, dp or pp");
}

Status CheckMeshSizes(int world, const MeshSizes& sizes) {
  if (world < 1) return InvalidArgument("world size must be >= 1, got ", world);
  const int etp = sizes.expert_tp();
  const std::pair<std::string_view, int> named_sizes[] = {
      {"tp", sizes.tp}, {"cp", sizes.cp}, {"ep", sizes.ep}, {"etp", etp}, {"pp", sizes.pp}};
  for (const auto& [name, size] : named_sizes) {
    if (size < 1) return InvalidArgument(name, " must be >= 1, got ", size);
  }
  // int64 so that absurd sizes cannot overflow before the divisibility test rejects them.
  const int64_t dense_model = int64_t{sizes.tp} * sizes.cp * sizes.pp;
  if (world % dense_model != 0) {
    return InvalidArgument("world size ", world, " is not divisible by tp*cp*pp = ", sizes.tp,
                           "*", sizes.cp, "*", sizes.pp, " = ", dense_model);
  }
  if (sizes.ranks_per_node < 0) {
    return InvalidArgument("ranks_per_node must be >= 0 (0: one node), got ", sizes.ranks_per_node);
  }
  if (sizes.ranks_per_node > 0 && world % sizes.ranks_per_node != 0) {
    return InvalidArgument("world size ", world, " is not divisible by ranks_per_node = ",
                           sizes.ranks_per_node, " (every node holds the same number of ranks)");
  }
  const int64_t expert_model = int64_t{etp} * sizes.ep * sizes.pp;
  if (world % expert_model != 0) {
    return InvalidArgument("world size ", world, " is not divisible by etp*ep*pp = ", etp, "*",
                           sizes.ep, "*", sizes.pp, " = ", expert_model,
                           " (etp*ep = ", int64_t{etp} * sizes.ep,
                           " must divide tp*cp*dp = ", world / sizes.pp, ")");
  }
  return OkStatus();
}

StatusOr<Mesh> Mesh::Create(int world, MeshSizes sizes, std::string_view order) {
  SY_RETURN_IF_ERROR(CheckMeshSizes(world, sizes));
  SY_ASSIGN_OR_RETURN(const AxisOrder axes, ParseOrder(order));
  const int etp = sizes.expert_tp();
  const int dp = world / (sizes.tp * sizes.cp * sizes.pp);
  const int edp = world / (etp * sizes.ep * sizes.pp);

  Mesh mesh(world, axes, {sizes.tp, sizes.cp, 1, dp, sizes.pp},
            {etp, 1, sizes.ep, edp, sizes.pp},
            sizes.ranks_per_node > 0 ? sizes.ranks_per_node : world);

  // Megatron-LM's two consistency rules between the views (initialize_model_parallel):
  // the pipeline groups must be the same, and pp must be last unless dp == edp. A pp group
  // is {base + k * stride}, so the group lists are equal exactly when the pp strides are
  // (or pp == 1); rank 0's group shows the difference.
  const int dense_pp_stride = mesh.Stride(View::kDense, Axis::kPp);
  const int expert_pp_stride = mesh.Stride(View::kExpert, Axis::kPp);
  if (sizes.pp > 1 && dense_pp_stride != expert_pp_stride) {
    const std::string dense = FormatGroup(mesh.GroupOf(0, View::kDense, {Axis::kPp}));
    const std::string expert = FormatGroup(mesh.GroupOf(0, View::kExpert, {Axis::kPp}));
    return InvalidArgument("order \"", order,
                           "\" gives the dense and expert views different pipeline groups "
                           "(rank 0: ", dense, " dense vs ", expert,
                           " expert); they must be equal, e.g. with pp last in the order");
  }
  if (axes.back() != Axis::kPp && sizes.pp > 1 && dp != edp) {
    return InvalidArgument("order \"", order, "\" does not end with pp, so with pp = ",
                           sizes.pp, " the dense and expert data parallel sizes must be equal "
                           "(dp = ", dp, ", edp = ", edp, ")");
  }
  return mesh;
}

Mesh::Mesh(int world, std::array<Axis, kNumAxes> order, std::array<int, kNumAxes> dense_sizes,
           std::array<int, kNumAxes> expert_sizes, int ranks_per_node)
    : world_(world),
      order_(order),
      dense_sizes_(dense_sizes),
      expert_sizes_(expert_sizes),
      ranks_per_node_(ranks_per_node) {}

int Mesh::NodeOf(int rank) const {
  SY_CHECK(rank >= 0 && rank < world_) << "rank " << rank << " outside world " << world_;
  return rank / ranks_per_node_;
}

bool Mesh::CrossesNodes(const std::vector<int>& group) const {
  for (int r : group) {
    if (NodeOf(r) != NodeOf(group.front())) return true;
  }
  return false;
}

bool Mesh::GroupsCrossNodes(View view, std::initializer_list<Axis> axes) const {
  for (const std::vector<int>& g : Groups(view, axes)) {
    if (CrossesNodes(g)) return true;
  }
  return false;
}

Status CheckTensorParallelInsideNodes(const Mesh& mesh) {
  const int per_node = mesh.ranks_per_node();
  for (const auto& [view, name, size] : {std::tuple{View::kDense, "tp", mesh.tp()},
                                         std::tuple{View::kExpert, "etp", mesh.etp()}}) {
    for (const std::vector<int>& g : mesh.Groups(view, {Axis::kTp})) {
      if (!mesh.CrossesNodes(g)) continue;
      const std::string nodes =
          StrCat("nodes ", mesh.NodeOf(g.front()), "-", mesh.NodeOf(g.back()));
      if (size > per_node) {
        return InvalidArgument(name, "=", size, " does not fit in a node of ", per_node,
                               " ranks: its group ", FormatGroup(g), " spans ", nodes,
                               "; use ", name, " <= ", per_node, " to keep it inside a node");
      }
      if (mesh.Stride(view, Axis::kTp) == 1) {
        return InvalidArgument(name, "=", size, " does not divide the ", per_node,
                               " ranks of a node: its group ", FormatGroup(g), " spans ", nodes,
                               "; use a ", name, " that divides ranks_per_node");
      }
      return InvalidArgument("order \"", mesh.OrderString(), "\" puts the ", name, " group ",
                             FormatGroup(g), " across ", nodes, " of ", per_node,
                             " ranks; put tp first in the order (the default tp-cp-ep-dp-pp) "
                             "so that ", name, " groups stay inside a node");
    }
  }
  return OkStatus();
}

int Mesh::Size(View view, Axis axis) const { return SizesOf(view)[Index(axis)]; }

std::string Mesh::OrderString() const {
  std::string out;
  for (Axis axis : order_) {
    if (!out.empty()) out += "-";
    out += kDenseNames[Index(axis)];
  }
  return out;
}

int Mesh::Stride(View view, Axis axis) const {
  int stride = 1;
  for (Axis a : order_) {
    if (a == axis) return stride;
    stride *= Size(view, a);
  }
  SY_CHECK(false) << "axis " << Index(axis) << " is not in the order";
  return 0;
}

MeshCoords Mesh::CoordsOf(int rank, View view) const {
  SY_CHECK(rank >= 0 && rank < world_) << "rank " << rank << " outside world " << world_;
  MeshCoords coords{};
  int rest = rank;
  for (Axis axis : order_) {
    const int size = Size(view, axis);
    coords[Index(axis)] = rest % size;
    rest /= size;
  }
  return coords;
}

int Mesh::Coord(int rank, View view, Axis axis) const {
  return CoordsOf(rank, view)[Index(axis)];
}

int Mesh::RankAt(View view, const MeshCoords& coords) const {
  int rank = 0;
  int stride = 1;
  for (Axis axis : order_) {
    const int size = Size(view, axis);
    const int c = coords[Index(axis)];
    SY_CHECK(c >= 0 && c < size) << AxisName(axis, view) << " coordinate " << c
                                 << " outside size " << size;
    rank += c * stride;
    stride *= size;
  }
  return rank;
}

std::vector<std::vector<int>> Mesh::Groups(View view, std::span<const Axis> axes) const {
  std::array<bool, kNumAxes> varies{};
  for (Axis axis : axes) varies[Index(axis)] = true;
  // Varying (masked) and fixed (unmasked) axes, each fastest first in the order.
  std::vector<Axis> varying, fixed;
  int group_size = 1;
  for (Axis axis : order_) {
    if (varies[Index(axis)]) {
      varying.push_back(axis);
      group_size *= Size(view, axis);
    } else {
      fixed.push_back(axis);
    }
  }
  const int num_groups = world_ / group_size;

  std::vector<std::vector<int>> groups(num_groups);
  MeshCoords coords{};
  for (int g = 0; g < num_groups; ++g) {
    int rest = g;
    for (Axis axis : fixed) {
      coords[Index(axis)] = rest % Size(view, axis);
      rest /= Size(view, axis);
    }
    groups[g].reserve(group_size);
    for (int i = 0; i < group_size; ++i) {
      rest = i;
      for (Axis axis : varying) {
        coords[Index(axis)] = rest % Size(view, axis);
        rest /= Size(view, axis);
      }
      groups[g].push_back(RankAt(view, coords));
    }
  }
  return groups;
}

std::vector<int> Mesh::GroupOf(int rank, View view, std::span<const Axis> axes) const {
  std::array<bool, kNumAxes> varies{};
  for (Axis axis : axes) varies[Index(axis)] = true;
  MeshCoords coords = CoordsOf(rank, view);
  int group_size = 1;
  for (Axis axis : order_) {
    if (varies[Index(axis)]) group_size *= Size(view, axis);
  }
  std::vector<int> group;
  group.reserve(group_size);
  for (int i = 0; i < group_size; ++i) {
    int rest = i;
    for (Axis axis : order_) {
      if (!varies[Index(axis)]) continue;
      coords[Index(axis)] = rest % Size(view, axis);
      rest /= Size(view, axis);
    }
    group.push_back(RankAt(view, coords));
  }
  return group;
}

PipelineNeighbors Mesh::PipelineOf(int rank) const {
  const std::vector<int> group = GroupOf(rank, View::kDense, {Axis::kPp});
  const int num_stages = static_cast<int>(group.size());
  const int stage = Coord(rank, View::kDense, Axis::kPp);
  SY_CHECK_EQ(group[stage], rank);
  PipelineNeighbors out;
  out.stage = stage;
  out.num_stages = num_stages;
  out.prev = group[(stage + num_stages - 1) % num_stages];
  out.next = group[(stage + 1) % num_stages];
  out.is_first = stage == 0;
  out.is_last = stage == num_stages - 1;
  return out;
}

std::string Mesh::Describe(int rank) const {
  const MeshCoords dense = CoordsOf(rank, View::kDense);
  const MeshCoords expert = CoordsOf(rank, View::kExpert);
  auto part = [&](std::string_view label, const MeshCoords& coords, View view, Axis axis) {
    return StrCat(label, "(", coords[Index(axis)], "/", Size(view, axis), ")");
  };
  return StrCat("rank ", rank, ": ", part("TP", dense, View::kDense, Axis::kTp), " ",
                part("CP", dense, View::kDense, Axis::kCp), " ",
                part("DP", dense, View::kDense, Axis::kDp), " ",
                part("PP", dense, View::kDense, Axis::kPp), " | ",
                part("ETP", expert, View::kExpert, Axis::kTp), " ",
                part("EP", expert, View::kExpert, Axis::kEp), " ",
                part("EDP", expert, View::kExpert, Axis::kDp));
}

std::string Mesh::Summary() const {
  return StrCat("world ", world_, ": tp ", tp(), " x cp ", cp(), " x dp ", dp(), " x pp ", pp(),
                " | etp ", etp(), " x ep ", ep(), " x edp ", edp(), " x pp ", pp(), ", order ",
                OrderString(),
                num_nodes() > 1 ? StrCat(", ", num_nodes(), " nodes of ", ranks_per_node_, " ranks")
                                : std::string());
}

}  // namespace switchyard::dist
