// Row indices and row gathers that several moe files share (the group routing, the expert
// tensor-parallel split, the chunked exchange): host-built index vectors moved to the rows'
// device, and the rows they pick as a new tensor.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::moe {

// `index` as an i64 tensor (n) on `device` (the host tensor itself on the CPU).
Tensor IndexOn(const std::vector<int64_t>& index, Device device, DeviceContext* ctx);

// Rows `index` of t (R, d) as a new (index.numel(), d) tensor on t's device: out[i] =
// t[index[i]]. An empty index gives an empty tensor.
Tensor RowsAt(const Tensor& t, const Tensor& index, DeviceContext* ctx);

}  // namespace switchyard::moe
