// The parameter registry: every trainable (and non-learned, persistent) tensor of the
// model under a stable name, with its logical (global) shape, how this rank's tensor is a
// slice of it, and which group reduces its gradient. Initialisation, gradient sync,
// clipping, the optimizer, ZeRO and checkpoints all work from this list, so none of them
// needs to know the layout.
#pragma once

#include <string>
#include <vector>

#include "engine/core/tensor.h"

namespace switchyard::model {

// Which ranks hold replicas whose gradients must be combined.
enum class GradGroup {
  kDense,   // replicated over dp x cp (attention, embeddings, norms, router, dense MLPs)
  kExpert,  // replicated over edp (routed experts; sharded over ep)
};

struct Parameter {
  std::string name;       // stable, layout-independent: "layers.1.moe.experts.w1"
  Shape global_shape;     // the whole logical tensor, e.g. (E, d, f)
  int shard_dim = -1;     // the dim split over ranks, -1 when this rank holds it whole
  int64_t shard_offset = 0;  // first index of this rank's slice along shard_dim
  GradGroup group = GradGroup::kDense;
  bool trainable = true;  // false: persistent state the optimizer skips (expert bias)
  bool weight_decay = true;  // AdamW decay applies (off for biases and norm weights)
  Tensor value;           // this rank's slice (shares storage with the layer)
  Tensor grad;            // same shape as value; undefined when not trainable

  // The rank's slice shape implied by global_shape and the shard: value.shape() must match.
  bool is_sharded() const { return shard_dim >= 0; }
};

// An ordered list of parameters (registration order is the model's order).
class ParameterRegistry {
 public:
  // Adds a parameter; names must be unique (checked).
  void Add(Parameter p);
  std::vector<Parameter>& params() { return params_; }
  const std::vector<Parameter>& params() const { return params_; }
  // The parameter called `name`, or null.
  Parameter* Find(const std::string& name);
  const Parameter* Find(const std::string& name) const;
  // Sets every gradient to zero.
  // Zeroes every gradient, ordered on ctx's stream for device tensors.
  void ZeroGrad(DeviceContext* ctx = nullptr);
  // Elements of the whole model (global shapes, every parameter counted once).
  int64_t GlobalElements(bool trainable_only = true) const;

 private:
  std::vector<Parameter> params_;
};

}  // namespace switchyard::model
