// Timing for the GPU benchmarks: CUDA events on the DeviceContext's stream, in the
// harness's convention (harness.h): -w warm-up calls, then -n timed calls in 5 blocks that
// alternate the ops (so every op sees the same clocks), and the median block's mean.
#pragma once

#include <functional>
#include <vector>

#include "engine/core/device_context.h"

namespace switchyard::bench {

// Milliseconds per call of each op (median over the blocks of each block's mean). Every op
// runs `warmup` times first.
std::vector<double> TimeGpuOps(const std::vector<std::function<void()>>& ops, int iters,
                               int warmup, DeviceContext* ctx);

}  // namespace switchyard::bench
