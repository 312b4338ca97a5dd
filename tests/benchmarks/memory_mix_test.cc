// benchmarks/memory_mix.h on the CPU: every op is one the kernels accept as training calls
// it (their argument checks are the device-agnostic wrappers, so a call the GPU would refuse
// fails here too: plan_calibrate_gpu runs these only on a GPU), and the element counts are the
// cost model's for a layer of that shape.
#include "benchmarks/memory_mix.h"

#include <gtest/gtest.h>

#include <map>
#include <string>

#include "engine/core/counters.h"

namespace switchyard::bench {
namespace {

TEST(MemoryMixTest, EveryOpRunsAndCountsTheModelsElements) {
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

}  // namespace
}  // namespace switchyard::bench
