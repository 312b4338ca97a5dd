#include "engine/parallel/nonfinite.h"

#include <cmath>

#include "engine/core/status.h"
#include "engine/dist/agreement.h"

namespace switchyard::parallel {

std::string FirstNonFiniteGrad(const parallel::ParameterRegistry& registry,
                               const parallel::ZeroShards* zero) {
  const bool sharded = zero != nullptr && zero->stage() > 0;
  for (const HeldGrad& h : HeldGrads(registry, zero)) {
    const parallel::Parameter& p = registry.params()[h.index];
    const Tensor& grad = h.grad;
    const Tensor host = grad.ToHost("nonfinite_grads");
    const std::vector<float> v = host.Reshape({host.numel()}).ToVector<float>();
    for (size_t k = 0; k < v.size(); ++k) {
      if (std::isfinite(v[k])) continue;
      // The element's row in the box: dim 0 of a routed expert weight (the expert view) is
      // the expert.
      const bool expert = p.view == dist::View::kExpert && !p.global_shape.empty();
      if (!expert) return p.name;
      const Shape& box = p.BoxShape();
      const int64_t per_row = box.empty() || box[0] == 0 ? 1 : NumElements(box) / box[0];
      const int64_t flat = (sharded ? p.flat_begin : 0) + static_cast<int64_t>(k);
      return StrCat(p.name, " (expert ", p.OffsetAt(0) + flat / std::max<int64_t>(per_row, 1), ")");
    }
  }
  return "";
}

std::string AgreeFirstNonFiniteGrad(const parallel::ParameterRegistry& registry,
                                    const parallel::ZeroShards* zero, dist::Communicator& world) {
  for (const std::string& name : dist::AllGatherStrings(FirstNonFiniteGrad(registry, zero), world)) {
    if (!name.empty()) return name;
  }
  return "";
}

}  // namespace switchyard::parallel
