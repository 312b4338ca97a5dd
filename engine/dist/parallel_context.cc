#include "engine/dist/parallel_context.h"

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
  ctx->etp_ = split(View::kExpert, {Axis::kTp});
  ctx->ep_ = split(View::kExpert, {Axis::kEp});
  ctx->edp_ = split(View::kExpert, {Axis::kDp});
  ctx->edp_etp_ = split(View::kExpert, {Axis::kDp, Axis::kTp});
  ctx->world_ = &world;
  return ctx;
}

}  // namespace switchyard::dist
