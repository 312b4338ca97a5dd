#include "engine/parallel/clip.h"

#include "engine/dist/ordered_sum.h"

#include <cmath>

#include "engine/core/step_readback.h"
#include "kernels/optimizer.h"

namespace switchyard::parallel {

namespace {

// The gradients clipping reads on this rank: the owned elements of each trainable
// parameter (everything without ZeRO). With `counted_only`, only those this rank counts in
// the norm (see the header).
std::vector<Tensor> OwnedGrads(const parallel::ParameterRegistry& registry,
                               const dist::ParallelContext& pc, const parallel::ZeroShards* zero,
                               bool counted_only) {
  const bool sharded = zero != nullptr && zero->stage() > 0;
  std::vector<Tensor> grads;
  for (HeldGrad& h : HeldGrads(registry, zero)) {
    const parallel::Parameter& p = registry.params()[h.index];
    if (counted_only) {
      const parallel::AxisSet shard = sharded ? zero->ShardAxes(h.index) : parallel::AxisSet();
      const dist::MeshCoords coords = pc.mesh().CoordsOf(pc.rank(), p.view);
      bool owner = true;
      for (dist::Axis a : p.replicated.Axes())
        owner = owner && (shard.Has(a) || coords[static_cast<int>(a)] == 0);
      if (!owner) continue;
    }
    grads.push_back(std::move(h.grad));
  }
  return grads;
}

}  // namespace

double GlobalGradNorm(const parallel::ParameterRegistry& registry,
                      const dist::ParallelContext& pc, DeviceContext* ctx,
                      const parallel::ZeroShards* zero) {
  // The gradients this rank counts, summed in one multi-tensor reduction (one copy back on
  // a GPU).
  std::vector<Tensor> grads = OwnedGrads(registry, pc, zero, /*counted_only=*/true);
  double local = 0.0;
  for (double s : kernels::SumSquaresMany(grads, ctx)) local += s;
  const double mine[1] = {local};
  return std::sqrt(dist::AllReduceDoubles(pc.world(), mine)[0]);
}

double GlobalGradNormAtStepEnd(const parallel::ParameterRegistry& registry,
                               const dist::ParallelContext& pc, DeviceContext* ctx,
                               const parallel::ZeroShards* zero, std::vector<double>* slots) {
  StepReadback* readback = ctx != nullptr ? ctx->step_readback() : nullptr;
  if (readback == nullptr) {
    slots->clear();
    return GlobalGradNorm(registry, pc, ctx, zero);
  }
  std::vector<Tensor> grads = OwnedGrads(registry, pc, zero, /*counted_only=*/true);
  const Device device = grads.empty() ? ctx->device() : grads.front().device();
  if (readback->size() > 0 && readback->device() != device) {
    // Gradients on another device than the step's values: read apart.
    *slots = readback->ReadBack(ctx);
    return GlobalGradNorm(registry, pc, ctx, zero);
  }
  // SumSquaresMany's partial sums into the step's buffer, then the buffer's one copy.
  const std::vector<int64_t> first = kernels::SumSquaresPartition(grads, device);
  int64_t base = 0;
  if (first.back() > 0) {
    StepReadback::Slots s = readback->Reserve(first.back(), device, ctx);
    base = s.first;
    kernels::SumSquaresPartials(grads, s.values, ctx);
  }
  *slots = readback->ReadBack(ctx);
  // SumSquaresMany's per-tensor sums, and GlobalGradNorm's sum of them, in their order.
  double local = 0.0;
  for (size_t k = 0; k < grads.size(); ++k) {
    double sum = 0.0;
    for (int64_t c = first[k]; c < first[k + 1]; ++c) sum += (*slots)[base + c];
    local += sum;
  }
  const double mine[1] = {local};
  return std::sqrt(dist::AllReduceDoubles(pc.world(), mine)[0]);
}

float ClipScale(double norm, double max_norm) {
  return max_norm > 0.0 && norm > max_norm ? static_cast<float>(max_norm / (norm + 1e-6)) : 1.0f;
}

double ClipGradNorm(parallel::ParameterRegistry& registry, double max_norm,
                    const dist::ParallelContext& pc, DeviceContext* ctx,
                    const parallel::ZeroShards* zero) {
  const double norm = GlobalGradNorm(registry, pc, ctx, zero);
  if (const float scale = ClipScale(norm, max_norm); scale != 1.0f) {
    std::vector<Tensor> grads = OwnedGrads(registry, pc, zero, /*counted_only=*/false);
    kernels::ScaleMany(grads, scale, ctx);
  }
  return norm;
}

}  // namespace switchyard::parallel
