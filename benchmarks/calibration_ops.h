// The engine's device work plan_calibrate_gpu times for a hardware file, built here so that a
// CPU test (tests/benchmarks/calibration_ops_test.cc) runs the same calls through the kernels'
// own argument checks: a call the GPU would refuse fails there first.
//
// MemoryBoundOps: the memory-bound kernels of a decoder layer's training step, as training runs them with
// bf16 products and bf16 activation storage: the residual add fused with the next LayerNorm
// (f32 residual stream, bf16 normed output), LayerNorm's backward adding into the residual
// gradient, bias + GELU writing the bf16 activation and the kept bf16 pre-activation, GELU's
// backward with the bias gradient writing the bf16 gradient W1's product reads, and a
// gradient's f32 -> bf16 cast. plan_calibrate_gpu times them for the hardware file's
// elementwise_efficiency (engine/plan/hardware.h).
//
// `elements` is what the planner's cost model counts for an op (engine/plan/cost_model.cc,
// Elementwise): every element it reads or writes, once, whatever its dtype; the model prices
// each at 2 bytes, so the engine's f32 tensors show in the efficiency measured.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/device_context.h"

namespace switchyard::bench {

struct MemoryOp {
  std::string name;
  double elements = 0;
  std::function<void()> run;  // holds its tensors (on ctx's device), filled once
};

// The ops at `tokens` rows of d_model `d` and hidden width `ff`, on ctx's device.
std::vector<MemoryOp> MemoryBoundOps(int64_t tokens, int64_t d, int64_t ff, DeviceContext* ctx);

// Causal attention's forward and backward as the attention layer runs them (dense/attention.cc)
// at batch B, S, H heads of hd, with ctx's matmul dtype: on the fused path (bf16 products, hd
// 64 or 128) q, k, v and the kept output in bf16, as bf16 activation storage keeps them, and
// the backward's delta from the kept output; else f32. `elements` is unused (0).
struct AttentionOps {
  bool bf16_inputs = false;
  MemoryOp forward, backward;  // backward: AttentionBackwardDelta, then AttentionBackward
};
AttentionOps MakeAttentionOps(int64_t B, int64_t S, int64_t H, int64_t hd, DeviceContext* ctx);

}  // namespace switchyard::bench
