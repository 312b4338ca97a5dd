// benchmarks/calibration_ops.h on the CPU: every call is one the kernels accept as training
// makes it (their argument checks are the device-agnostic wrappers, so a call the GPU would
// refuse fails here too: plan_calibrate_gpu runs these only on a GPU), and the element counts
// are the cost model's for a layer of that shape.
#include "benchmarks/calibration_ops.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "engine/core/counters.h"

namespace switchyard::bench {
namespace {

TEST(CalibrationOpsTest, EveryOpRunsAndCountsTheModelsElements) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  ctx->set_matmul_dtype(DType::kBF16);
  const int64_t t = 8, d = 16, ff = 64;
  const std::vector<MemoryOp> ops = MemoryBoundOps(t, d, ff, ctx.get());
  std::map<std::string, double> elements;
  for (const MemoryOp& op : ops) {
    const DeviceCounts before = counters::Snapshot();
    op.run();
    op.run();  // in place (bias + gelu's a, the added dx): a second call is still valid
    EXPECT_EQ(counters::Snapshot().Minus(before).dispatches, 2) << op.name << ": one kernel a call";
    elements[op.name] = op.elements;
  }
  const std::map<std::string, double> want = {{"add + layernorm forward", 4.0 * t * d},
                                              {"layernorm backward (dx added)", 4.0 * t * d},
                                              {"bias + gelu forward", 3.0 * t * ff},
                                              {"gelu backward + bias gradient", 3.0 * t * ff},
                                              {"cast f32 -> bf16", 2.0 * t * d}};
  EXPECT_EQ(elements, want);
}

// Attention as the layer runs it: the fused path's bf16 q, k, v and kept output at head width
// 64 (the CPU twin), the exact f32 path at 16; the backward is the delta, then the kernels.
TEST(CalibrationOpsTest, AttentionRunsOnBothPaths) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  ctx->set_matmul_dtype(DType::kBF16);
  for (int64_t hd : {64, 16}) {
    const AttentionOps ops = MakeAttentionOps(2, 16, 2, hd, ctx.get());
    EXPECT_EQ(ops.bf16_inputs, hd == 64);
    const DeviceCounts before = counters::Snapshot();
    ops.forward.run();
    ops.backward.run();
    ops.backward.run();
    const int64_t dispatches = counters::Snapshot().Minus(before).dispatches;
    EXPECT_EQ(dispatches, 1 + 2 * 2) << "hd " << hd << ": forward, then delta and backward twice";
  }
}

}  // namespace
}  // namespace switchyard::bench
