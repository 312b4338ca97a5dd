// `switchyard mesh`: prints every process group of a layout, in both views of the mesh
// (dense: tp, cp, dp, pp; expert: etp, ep, edp, pp), whether each axis's groups cross
// nodes, and the node of every rank (--ranks-per-node; default one node), as a table or
// as one JSON object:
//   {"dense": {"tp": [[0,1],...], "cp": ..., "dp": ..., "pp": ...},
//    "expert": {"etp": ..., "ep": ..., "edp": ..., "pp": ...},
//    "nodes": [0, 0, 1, 1, ...], "crosses_nodes": {"dense": {"tp": false, ...},
//                                                  "expert": {...}}}
#include <cstdio>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/dist/mesh.h"

namespace switchyard::cli {
namespace {

using dist::Axis;
using dist::FormatGroup;
using dist::Mesh;
using dist::View;

constexpr char kCommand[] = "switchyard mesh";
constexpr Axis kDenseAxes[] = {Axis::kTp, Axis::kCp, Axis::kDp, Axis::kPp};
constexpr Axis kExpertAxes[] = {Axis::kTp, Axis::kEp, Axis::kDp, Axis::kPp};
constexpr size_t kLineWidth = 100;


// One view as rows "  axis  size  groups", groups wrapped under the groups column.
std::string ViewTable(const Mesh& mesh, View view, std::span<const Axis> axes) {
  const std::string indent(23, ' ');
  std::string out = "  axis  size  nodes    groups\n";
  for (Axis axis : axes) {
    const int size = mesh.Size(view, axis);
    char head[32];
    std::snprintf(head, sizeof(head), "  %-4.*s %5d  %-7s  ",
                  static_cast<int>(dist::AxisName(axis, view).size()),
                  dist::AxisName(axis, view).data(), size,
                  mesh.GroupsCrossNodes(view, {axis}) ? "crosses" : "inside");
    std::string line = head;
    if (size == 1) {
      out += line + "every rank alone\n";
      continue;
    }
    bool first = true;
    for (const std::vector<int>& group : mesh.Groups(view, {axis})) {
      const std::string text = FormatGroup(group);
      if (!first && line.size() + 1 + text.size() > kLineWidth) {
        out += line + "\n";
        line = indent;
        first = true;
      }
      if (!first) line += " ";
      line += text;
      first = false;
    }
    out += line + "\n";
  }
  return out;
}

std::string Table(const Mesh& mesh) {
  std::string out = mesh.Summary() + "\n\n";
  out += "dense view (attention, dense MLPs, embeddings)\n";
  out += ViewTable(mesh, View::kDense, kDenseAxes);
  out += "\nexpert view (expert MLPs)\n";
  out += ViewTable(mesh, View::kExpert, kExpertAxes);
  if (Status s = dist::CheckTensorParallelInsideNodes(mesh); !s.ok()) {
    out += "\nnote: " + std::string(s.message()) + "\n";
  }
  out += "\nranks (nodes of " + std::to_string(mesh.ranks_per_node()) + " ranks)\n";
  for (int rank = 0; rank < mesh.world(); ++rank) {
    out += "  " + mesh.Describe(rank) + " | node " + std::to_string(mesh.NodeOf(rank)) + "\n";
  }
  return out;
}

nlohmann::ordered_json Json(const Mesh& mesh) {
  nlohmann::ordered_json out;
  for (const auto& [view, axes, key] :
       {std::tuple{View::kDense, std::span<const Axis>(kDenseAxes), "dense"},
        std::tuple{View::kExpert, std::span<const Axis>(kExpertAxes), "expert"}}) {
    nlohmann::ordered_json groups = nlohmann::ordered_json::object();
    for (Axis axis : axes) {
      groups[std::string(dist::AxisName(axis, view))] = mesh.Groups(view, {axis});
    }
    out[key] = std::move(groups);
  }
  std::vector<int> nodes;
  for (int rank = 0; rank < mesh.world(); ++rank) nodes.push_back(mesh.NodeOf(rank));
  out["nodes"] = nodes;
  nlohmann::ordered_json crosses;
  for (const auto& [view, axes, key] :
       {std::tuple{View::kDense, std::span<const Axis>(kDenseAxes), "dense"},
        std::tuple{View::kExpert, std::span<const Axis>(kExpertAxes), "expert"}}) {
    for (Axis axis : axes) {
      crosses[key][std::string(dist::AxisName(axis, view))] = mesh.GroupsCrossNodes(view, {axis});
    }
  }
  out["crosses_nodes"] = std::move(crosses);
  return out;
}

}  // namespace

int RunMesh(const std::vector<std::string>& args) {
  int world = 0;
  int tp = 1, cp = 1, ep = 1, etp = 1, pp = 1, ranks_per_node = 0;
  std::string order(dist::kDefaultMeshOrder);
  bool json = false;
  FlagSet flags(kCommand,
                "Prints every process group of a parallel layout in both views of the mesh:\n"
                "dense (tp, cp, dp, pp) and expert (etp, ep, edp, pp), with dp = world / "
                "(tp*cp*pp)\nand edp = world / (etp*ep*pp), as in Megatron-LM. See "
                "docs/mesh.md.");
  flags.AddInt("world", &world, "number of ranks", /*required=*/true);
  flags.AddInt("tp", &tp, "tensor parallel size (default 1)");
  flags.AddInt("cp", &cp, "context parallel size (default 1)");
  flags.AddInt("ep", &ep, "expert parallel size (default 1)");
  flags.AddInt("etp", &etp, "expert tensor parallel size (default: same as --tp)");
  flags.AddInt("pp", &pp, "pipeline parallel size (default 1)");
  flags.AddInt("ranks-per-node", &ranks_per_node,
               "ranks of one node, placed in blocks (default: one node holds the world)");
  flags.AddString("order", &order, "axis order, fastest first (default tp-cp-ep-dp-pp)");
  flags.AddBool("json", &json, "print one JSON object instead of the table");
  if (Status status = flags.Parse(args); !status.ok()) {
    return UsageError(kCommand, std::string(status.message()));
  }
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return kExitOk;
  }
  if (Status s = CheckWorldFlag("world", world); !s.ok()) {
    return UsageError(kCommand, std::string(s.message()));
  }
  dist::MeshSizes sizes{.tp = tp, .cp = cp, .ep = ep, .pp = pp, .ranks_per_node = ranks_per_node};
  if (flags.IsSet("etp")) sizes.etp = etp;
  StatusOr<Mesh> mesh = Mesh::Create(world, sizes, order);
  if (!mesh.ok()) return UsageError(kCommand, std::string(mesh.status().message()));

  const std::string text = json ? Json(*mesh).dump() + "\n" : Table(*mesh);
  std::fputs(text.c_str(), stdout);
  return kExitOk;
}

}  // namespace switchyard::cli
