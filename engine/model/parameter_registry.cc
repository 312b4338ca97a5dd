#include "engine/model/parameter_registry.h"

#include "engine/core/check.h"

namespace switchyard::model {

void ParameterRegistry::Add(Parameter p) {
  SY_CHECK(Find(p.name) == nullptr) << "parameter '" << p.name << "' registered twice";
  SY_CHECK(p.value.defined()) << "parameter '" << p.name << "' has no value";
  Shape local = p.global_shape;
  if (p.is_sharded()) {
    SY_CHECK(p.shard_dim < static_cast<int>(local.size())) << p.name << ": shard_dim";
    local[p.shard_dim] = p.value.dim(p.shard_dim);
    SY_CHECK(p.shard_offset >= 0 && p.shard_offset + local[p.shard_dim] <= p.global_shape[p.shard_dim])
        << p.name << ": slice [" << p.shard_offset << ", +" << local[p.shard_dim] << ") of "
        << ShapeString(p.global_shape);
  }
  SY_CHECK(p.value.shape() == local) << p.name << ": value " << ShapeString(p.value.shape())
                                     << " is not the slice " << ShapeString(local);
  SY_CHECK(!p.trainable || (p.grad.defined() && p.grad.shape() == local))
      << p.name << ": a trainable parameter needs a gradient of its shape";
  params_.push_back(std::move(p));
}

Parameter* ParameterRegistry::Find(const std::string& name) {
  for (Parameter& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

const Parameter* ParameterRegistry::Find(const std::string& name) const {
  for (const Parameter& p : params_)
    if (p.name == name) return &p;
  return nullptr;
}

void ParameterRegistry::ZeroGrad(DeviceContext* ctx) {
  for (Parameter& p : params_)
    if (p.grad.defined()) p.grad.SetZero(ctx);
}

int64_t ParameterRegistry::GlobalElements(bool trainable_only) const {
  int64_t n = 0;
  for (const Parameter& p : params_)
    if (p.trainable || !trainable_only) n += NumElements(p.global_shape);
  return n;
}

}  // namespace switchyard::model
