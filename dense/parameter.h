// A layer's parameters as a list: each one's name, its value and its gradient (the same
// idea as moe::NamedParameter). Names are relative to the layer ("weight", "q.bias"); the
// layer that owns a sub-layer prefixes its name ("o." + "weight"), and the model prefixes
// the layer's own name, so every parameter ends up with one stable full name.
#pragma once

#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"

namespace switchyard::dense {

struct NamedParameter {
  std::string name;
  Tensor value;
  Tensor grad;  // same shape, dtype and device as value
};

// Appends `params` to `out` with each name prefixed by "<prefix>.".
void AppendPrefixed(const std::string& prefix, const std::vector<NamedParameter>& params,
                    std::vector<NamedParameter>& out);

// Checks one loaded parameter: f32, `shape`, on `device`. Errors name `what` (e.g.
// "linear.weight") and the shape, dtype or device rejected. An undefined tensor is "missing".
Status CheckParameter(const std::string& what, const Tensor& t, const Shape& shape, Device device);

// An f32 tensor of `shape` on `device` holding `value` everywhere.
Tensor Filled(const Shape& shape, float value, Device device, DeviceContext* ctx = nullptr);

}  // namespace switchyard::dense
