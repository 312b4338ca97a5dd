#include "engine/dist/parallel_context.h"

#include <algorithm>
#include <utility>
#include <vector>

namespace switchyard::dist {

StatusOr<std::unique_ptr<ParallelContext>> ParallelContext::Create(Communicator& world,
                                                                   const Mesh& mesh) {
  if (world.size() != mesh.world()) {
    return InvalidArgument("the mesh is for ", mesh.world(), " ranks but ", world.size(),
                           " were launched");
  }
  std::unique_ptr<ParallelContext> ctx(new ParallelContext(mesh, world.rank()));
  auto split = [&](View view, std::initializer_list<Axis> axes) {
    return world.Split(mesh.Groups(view, axes));
  };
  ctx->tp_ = split(View::kDense, {Axis::kTp});
  ctx->cp_ = split(View::kDense, {Axis::kCp});
  ctx->dp_ = split(View::kDense, {Axis::kDp});
  ctx->pp_ = split(View::kDense, {Axis::kPp});
  ctx->dp_cp_ = split(View::kDense, {Axis::kDp, Axis::kCp});
  ctx->dp_cp_tp_ = split(View::kDense, {Axis::kDp, Axis::kCp, Axis::kTp});
  std::vector<std::vector<int>> tp_cp = mesh.Groups(View::kDense, {Axis::kTp, Axis::kCp});
  for (std::vector<int>& g : tp_cp) {
    std::sort(g.begin(), g.end(), [&](int a, int b) {
      const auto key = [&](int r) {
        return std::pair(mesh.Coord(r, View::kDense, Axis::kCp), mesh.Coord(r, View::kDense, Axis::kTp));
      };
      return key(a) < key(b);
    });
  }
  ctx->tp_cp_ = world.Split(tp_cp);
  ctx->etp_ = split(View::kExpert, {Axis::kTp});
  ctx->ep_ = split(View::kExpert, {Axis::kEp});
  ctx->edp_ = split(View::kExpert, {Axis::kDp});
  ctx->edp_etp_ = split(View::kExpert, {Axis::kDp, Axis::kTp});
  ctx->world_ = &world;
  // Every ep rank takes the same branch: the node layout is the same arithmetic on all.
  std::vector<int> nodes;
  for (int r : mesh.GroupOf(world.rank(), View::kExpert, {Axis::kEp})) nodes.push_back(mesh.NodeOf(r));
  auto hier = HierarchicalCommunicator::Create(*ctx->ep_, nodes);
  if (hier.ok()) {
    ctx->ep_hierarchical_ = *std::move(hier);
  } else {
    ctx->ep_hierarchical_status_ =
        InvalidArgument("the ep group ", FormatGroup(mesh.GroupOf(world.rank(), View::kExpert,
                                                                  {Axis::kEp})),
                        " on nodes of ", mesh.ranks_per_node(), " ranks: ",
                        hier.status().message());
  }
  return ctx;
}

StatusOr<Communicator*> ParallelContext::ep_hierarchical() const {
  if (!ep_hierarchical_) return ep_hierarchical_status_;
  return ep_hierarchical_.get();
}

}  // namespace switchyard::dist
