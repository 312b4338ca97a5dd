// What dense layers share about their parameters. A layer lists its parameters as
// parallel::Parameter descriptions (engine/parallel/parameter.h: value, gradient and how
// this rank's box sits in the logical tensor). Names are relative to the layer ("weight",
// "q.bias"); the layer that owns a sub-layer prefixes its name ("o." + "weight"), and the
// model prefixes the layer's own name, so every parameter ends up with one stable full name.
#pragma once

#include <string>
#include <vector>

#include "engine/core/device.h"
#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/parallel/parameter.h"

namespace switchyard::dense {

using parallel::AppendPrefixed;
using parallel::Parameter;

// Checks one loaded parameter: f32, `shape`, on `device`. Errors name `what` (e.g.
// "linear.weight") and the shape, dtype or device rejected. An undefined tensor is "missing".
Status CheckParameter(const std::string& what, const Tensor& t, const Shape& shape, Device device);

// An f32 tensor of `shape` on `device` holding `value` everywhere.
Tensor Filled(const Shape& shape, float value, Device device, DeviceContext* ctx = nullptr);

}  // namespace switchyard::dense
