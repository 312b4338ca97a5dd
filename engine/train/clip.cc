#include "engine/train/clip.h"

#include "engine/dist/ordered_sum.h"

#include <cmath>

#include "kernels/optimizer.h"

namespace switchyard::train {

double GlobalGradNorm(const parallel::ParameterRegistry& registry,
                      const dist::ParallelContext& pc, DeviceContext* ctx) {
  // The gradients this rank owns, summed in one multi-tensor reduction (one copy back on a
  // GPU).
  std::vector<Tensor> grads;
  for (const parallel::Parameter& p : registry.params()) {
    if (!p.trainable || !p.grad.defined()) continue;
    const dist::MeshCoords coords = pc.mesh().CoordsOf(pc.rank(), p.view);
    bool owner = true;
    for (dist::Axis a : p.replicated.Axes()) owner = owner && coords[static_cast<int>(a)] == 0;
    if (owner) grads.push_back(p.grad);
  }
  double local = 0.0;
  for (double s : kernels::SumSquaresMany(grads, ctx)) local += s;
  const double mine[1] = {local};
  return std::sqrt(dist::AllReduceDoubles(pc.world(), mine)[0]);
}

double ClipGradNorm(parallel::ParameterRegistry& registry, double max_norm,
                    const dist::ParallelContext& pc, DeviceContext* ctx) {
  const double norm = GlobalGradNorm(registry, pc, ctx);
  if (max_norm > 0.0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    std::vector<Tensor> grads;
    for (parallel::Parameter& p : registry.params()) {
      if (p.trainable && p.grad.defined()) grads.push_back(p.grad);
    }
    kernels::ScaleMany(grads, scale, ctx);
  }
  return norm;
}

}  // namespace switchyard::train
