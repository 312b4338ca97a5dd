#include "engine/train/clip.h"

#include <cmath>

#include "kernels/optimizer.h"

namespace switchyard::train {
namespace {

// Sums `value` over `comm` (f32, the communicators' widest float); null: unchanged.
double SumOver(dist::Communicator* comm, double value) {
  if (comm == nullptr || comm->size() == 1) return value;
  Tensor t = Tensor::FromVector<float>({static_cast<float>(value)}, {1});
  if (!comm->device().is_cpu()) t = t.To(comm->device());
  comm->AllReduce(t, dist::ReduceOp::kSum);
  return static_cast<double>(t.ToVector<float>()[0]);
}

}  // namespace

GradNormGroups NormGroupsOf(const dist::ParallelContext& pc) {
  return {.tp = &pc.tp(), .ep = &pc.ep(), .pp = &pc.pp()};
}

double GlobalGradNorm(const model::ParameterRegistry& registry, const GradNormGroups& groups,
                      DeviceContext* ctx) {
  // Every gradient's sum of squares in one multi-tensor reduction (one copy back on a GPU).
  std::vector<const model::Parameter*> with_grad;
  std::vector<Tensor> grads;
  for (const model::Parameter& p : registry.params()) {
    if (!p.trainable || !p.grad.defined()) continue;
    with_grad.push_back(&p);
    grads.push_back(p.grad);
  }
  const std::vector<double> squares = kernels::SumSquaresMany(grads, ctx);
  double local = 0.0, dense_sharded = 0.0, expert_sharded = 0.0;
  for (size_t i = 0; i < with_grad.size(); ++i) {
    const model::Parameter& p = *with_grad[i];
    const double s = squares[i];
    if (!p.is_sharded()) {
      local += s;
    } else if (p.group == model::GradGroup::kDense) {
      dense_sharded += s;
    } else {
      expert_sharded += s;
    }
  }
  const double total = local + SumOver(groups.tp, dense_sharded) + SumOver(groups.ep, expert_sharded);
  return std::sqrt(SumOver(groups.pp, total));
}

double ClipGradNorm(model::ParameterRegistry& registry, double max_norm,
                    const GradNormGroups& groups, DeviceContext* ctx) {
  const double norm = GlobalGradNorm(registry, groups, ctx);
  if (max_norm > 0.0 && norm > max_norm) {
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    std::vector<Tensor> grads;
    for (model::Parameter& p : registry.params()) {
      if (p.trainable && p.grad.defined()) grads.push_back(p.grad);
    }
    kernels::ScaleMany(grads, scale, ctx);
  }
  return norm;
}

}  // namespace switchyard::train
