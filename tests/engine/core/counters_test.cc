// engine/core/counters.h, engine/core/weight_shadows.h and the profiler's counts:
//  - each kernel call through kernels/dispatch.h counts one dispatch, under the op's name, and
//    so does each Tensor::SetZero and Tensor::CopyFrom that moves bytes; an op that returns a
//    host value and Tensor::ToHost count one readback each, named by site, on the host too;
//  - a bf16-mode product counts one f32 -> bf16 conversion per f32 operand (none in f32
//    mode, none for an empty product); kernels::Cast counts its own;
//  - a registered weight read inside an open window is converted once (its shadow) however
//    many products read it (slices included), and the products give the same bits as
//    converting per product; outside the window every product converts it again;
//  - a shadow the AdamW update wrote (WeightShadows::UpdateTarget) is fresh in the next window
//    only (no conversion, the per-call product's bits); Invalidate forgets it;
//  - Profiler: the first skip_steps steps are not profiled, and each profiled step records
//    the counts between its BeginStep and EndStep.
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/counters.h"
#include "engine/core/device_context.h"
#include "engine/core/profile.h"
#include "engine/core/weight_shadows.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/optimizer.h"

namespace switchyard {
namespace {

constexpr int kF32 = static_cast<int>(DType::kF32);
constexpr int kBF16 = static_cast<int>(DType::kBF16);

Tensor Ramp(const Shape& shape, float scale) {
  std::vector<float> v(NumElements(shape));
  // Values that need rounding to bf16 (13 significant bits and more).
  for (size_t i = 0; i < v.size(); ++i) v[i] = scale * (1.0f + 0.001953125f * i + 1e-4f * i * i);
  return Tensor::FromVector(v, shape);
}

TEST(CountersTest, DispatchesAndReadbacksBySite) {
  const DeviceCounts before = counters::Snapshot();
  Tensor x = Ramp({4, 8}, 0.5f);
  kernels::Fill(x, 1.0f);
  (void)kernels::SumSquares(x);  // returns a host value
  (void)x.ToHost("test.site");   // a host tensor: still one readback
  (void)x.ToHost("test.site");
  const DeviceCounts d = counters::Snapshot().Minus(before);
  EXPECT_EQ(d.dispatches, 2);  // Fill, SumSquares
  const std::map<std::string, int64_t> ops = {{"Fill", 1}, {"SumSquares", 1}};
  EXPECT_EQ(d.dispatch_ops, ops);
  EXPECT_EQ(d.readbacks, 3);
  EXPECT_EQ(d.readback_sites.at("sum_squares"), 1);
  EXPECT_EQ(d.readback_sites.at("test.site"), 2);
  EXPECT_EQ(d.conversions(), 0);
  const std::string json = d.Json();
  EXPECT_NE(json.find("\"readbacks\": 3"), std::string::npos) << json;
  EXPECT_NE(json.find("\"test.site\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"dispatch_ops\": {\"Fill\": 1, \"SumSquares\": 1}"), std::string::npos)
      << json;
}

// A tensor's memset and copy are device operations too (a GPU launches each): one dispatch
// each, named SetZero and CopyFrom; an empty tensor's, or a copy onto itself, none; inside a
// dispatched op (counters::DispatchScope, which kernels/dispatch.h opens), none.
TEST(CountersTest, MemsetsAndCopiesCountAsDispatches) {
  const DeviceCounts before = counters::Snapshot();
  Tensor a = Tensor::Zeros({4, 8}, DType::kF32);  // one SetZero
  Tensor b = Ramp({4, 8}, 2.0f);
  a.CopyFrom(b);
  a.CopyFrom(a);  // itself: nothing to do
  Tensor empty = Tensor::Zeros({0}, DType::kF32);
  b.SetZero();
  const DeviceCounts d = counters::Snapshot().Minus(before);
  const std::map<std::string, int64_t> ops = {{"CopyFrom", 1}, {"SetZero", 2}};
  EXPECT_EQ(d.dispatch_ops, ops);
  EXPECT_EQ(d.dispatches, 3);
  // Inside a dispatched op they are the op's own work: only the op counts.
  const DeviceCounts before_op = counters::Snapshot();
  {
    counters::CountDispatch("TestOp");
    const counters::DispatchScope scope;
    a.SetZero();
    a.CopyFrom(b);
  }
  const std::map<std::string, int64_t> op_only = {{"TestOp", 1}};
  EXPECT_EQ(counters::Snapshot().Minus(before_op).dispatch_ops, op_only);
}

TEST(CountersTest, Bf16ProductsCountTheirConversions) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  Tensor a = Ramp({3, 5}, 1.0f), b = Ramp({5, 4}, -0.25f);
  Tensor c = Tensor::Empty({3, 4}, DType::kF32);
  DeviceCounts before = counters::Snapshot();
  kernels::Gemm(a, false, b, false, c, 1.0f, 0.0f, ctx.get());  // f32: nothing to convert
  EXPECT_EQ(counters::Snapshot().Minus(before).conversions(), 0);
  ctx->set_matmul_dtype(DType::kBF16);
  before = counters::Snapshot();
  kernels::Gemm(a, false, b, false, c, 1.0f, 0.0f, ctx.get());
  DeviceCounts d = counters::Snapshot().Minus(before);
  EXPECT_EQ(d.conversion_calls[kF32][kBF16], 2);
  EXPECT_EQ(d.conversion_elements[kF32][kBF16], 15 + 20);
  EXPECT_EQ(d.weight_conversion_calls, 0);
  // An empty product converts nothing; Cast counts itself.
  Tensor e = Tensor::Empty({0, 4}, DType::kF32);
  Tensor a0 = Tensor::Empty({0, 5}, DType::kF32);
  Tensor b16 = Tensor::Empty({5, 4}, DType::kBF16);
  before = counters::Snapshot();
  kernels::Gemm(a0, false, b, false, e, 1.0f, 0.0f, ctx.get());
  kernels::Cast(b, b16, ctx.get());
  d = counters::Snapshot().Minus(before);
  EXPECT_EQ(d.conversion_calls[kF32][kBF16], 1);
  EXPECT_EQ(d.conversion_elements[kF32][kBF16], 20);
}

TEST(WeightShadowsTest, ConvertedOncePerWindowAndBitIdentical) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  ctx->set_matmul_dtype(DType::kBF16);
  Tensor w = Ramp({3, 6, 4}, 0.3f);  // like grouped experts' (E, k, n)
  Tensor x = Ramp({5, 6}, -0.7f);
  WeightShadows& shadows = ctx->weight_shadows();
  shadows.Register(w);
  shadows.Register(w);  // again: a no-op
  EXPECT_EQ(shadows.size(), 1);
  // Three products over slices of w, per call (window closed) and through the shadow.
  auto run = [&](std::vector<Tensor>& outs) {
    outs.clear();
    for (int64_t g = 0; g < 3; ++g) {
      Tensor out = Tensor::Empty({5, 4}, DType::kF32);
      kernels::Gemm(x, false, w.Slice(g, g + 1).Reshape({6, 4}), false, out, 1.0f, 0.0f,
                    ctx.get());
      outs.push_back(out);
    }
  };
  std::vector<Tensor> per_call, shadowed;
  DeviceCounts before = counters::Snapshot();
  run(per_call);
  DeviceCounts d = counters::Snapshot().Minus(before);
  EXPECT_EQ(d.weight_conversion_calls, 3);  // each product converts its slice
  EXPECT_EQ(d.weight_conversion_elements, 3 * 24);
  shadows.Activate();
  before = counters::Snapshot();
  run(shadowed);
  d = counters::Snapshot().Minus(before);
  EXPECT_EQ(d.weight_conversion_calls, 1);  // the whole weight, once
  EXPECT_EQ(d.weight_conversion_elements, 72);
  EXPECT_EQ(d.conversion_calls[kF32][kBF16], 1 + 3);  // the shadow and x per product
  for (int g = 0; g < 3; ++g) {
    EXPECT_EQ(std::memcmp(per_call[g].raw_data(), shadowed[g].raw_data(), per_call[g].nbytes()), 0)
        << "product " << g;
  }
  // A new window writes the shadow again (the weight may have changed in between).
  shadows.Deactivate();
  w.data<float>()[0] = 123.456f;
  shadows.Activate();
  before = counters::Snapshot();
  run(shadowed);
  EXPECT_EQ(counters::Snapshot().Minus(before).weight_conversion_calls, 1);
  shadows.Deactivate();
  run(per_call);
  EXPECT_EQ(std::memcmp(per_call[0].raw_data(), shadowed[0].raw_data(), per_call[0].nbytes()), 0);
  // Disabled: a window never opens.
  shadows.set_enabled(false);
  shadows.Activate();
  EXPECT_FALSE(shadows.active());
  shadows.Clear();
  EXPECT_TRUE(shadows.empty());
}

TEST(WeightShadowsTest, AnUpdateWrittenShadowIsFreshInTheNextWindowOnly) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  ctx->set_matmul_dtype(DType::kBF16);
  Tensor w = Ramp({6, 4}, 0.3f), x = Ramp({5, 6}, -0.7f);
  WeightShadows& shadows = ctx->weight_shadows();
  shadows.Register(w);
  auto product = [&] {
    Tensor out = Tensor::Empty({5, 4}, DType::kF32);
    kernels::Gemm(x, false, w, false, out, 1.0f, 0.0f, ctx.get());
    return out;
  };
  auto weight_conversions = [&](auto&& work) {
    const DeviceCounts before = counters::Snapshot();
    work();
    return counters::Snapshot().Minus(before).weight_conversion_calls;
  };
  // Never read: no shadow for an update to write.
  EXPECT_FALSE(shadows.UpdateTarget(w).defined());
  shadows.Activate();
  EXPECT_EQ(weight_conversions(product), 1);  // written at its first use
  shadows.Deactivate();
  EXPECT_FALSE(shadows.UpdateTarget(w.Slice(0, 3)).defined());  // not the whole weight
  // An AdamW update writes the new values and their shadow in one pass.
  Tensor grad = Ramp({6, 4}, 0.1f), m = Tensor::Zeros({6, 4}, DType::kF32),
         v = Tensor::Zeros({6, 4}, DType::kF32);
  std::vector<kernels::AdamWTensors> update = {{w, grad, m, v, 0.0f, shadows.UpdateTarget(w)}};
  ASSERT_TRUE(update[0].shadow.defined());
  EXPECT_EQ(weight_conversions([&] { kernels::AdamWUpdateMany(update, {.lr = 0.1f}); }), 1);
  // The next window converts nothing, and its product is the per-call product's bits.
  shadows.Activate();
  Tensor through_shadow;
  EXPECT_EQ(weight_conversions([&] { through_shadow = product(); }), 0);
  shadows.Deactivate();
  Tensor per_call = product();
  EXPECT_EQ(std::memcmp(per_call.raw_data(), through_shadow.raw_data(), per_call.nbytes()), 0);
  // Only that window: the one after writes it at its first use again.
  shadows.Activate();
  EXPECT_EQ(weight_conversions(product), 1);
  shadows.Deactivate();
  // Invalidate (weights loaded between the update and the window) forgets the update.
  update[0].shadow = shadows.UpdateTarget(w);
  kernels::AdamWUpdateMany(update, {.lr = 0.1f, .step = 2});
  shadows.Invalidate();
  shadows.Activate();
  EXPECT_EQ(weight_conversions(product), 1);
}

TEST(WeightShadowsTest, FindsOnlyOperandsInsideAWeight) {
  WeightShadows shadows;
  Tensor w = Tensor::Zeros({4, 4}, DType::kF32);
  shadows.Register(w);
  EXPECT_NE(shadows.Find(w.Slice(1, 3)).shadow, nullptr);
  EXPECT_EQ(shadows.Find(w.Slice(1, 3)).offset, 4);
  Tensor other = Tensor::Zeros({4, 4}, DType::kF32);
  EXPECT_EQ(shadows.Find(other).shadow, nullptr);
  EXPECT_DEATH(shadows.Register(w.Slice(1, 2)), "overlaps");
}

TEST(ProfilerCountsTest, SkipsWarmUpStepsAndCountsEachStep) {
  Profiler p;
  p.set_skip_steps(2);
  Tensor x = Ramp({2, 2}, 1.0f);
  for (int step = 0; step < 4; ++step) {
    p.BeginStep();
    EXPECT_EQ(Profiler::Recording(), step < 2 ? nullptr : &p);
    for (int i = 0; i <= step; ++i) kernels::Fill(x, 0.0f);
    (void)x.ToHost("test.step_end");
    p.EndStep(0.001);
  }
  EXPECT_EQ(p.steps(), 2);
  EXPECT_EQ(p.skipped_steps(), 2);
  ASSERT_EQ(p.step_counts().size(), 2u);
  EXPECT_EQ(p.step_counts()[0].dispatches, 3);
  EXPECT_EQ(p.step_counts()[1].dispatches, 4);
  EXPECT_EQ(p.step_counts()[1].readbacks, 1);
  EXPECT_EQ(p.total_counts().dispatches, 7);
  EXPECT_EQ(p.total_counts().dispatch_ops.at("Fill"), 7);
  const std::string json = p.Json();
  EXPECT_NE(json.find("\"skipped_steps\": 2"), std::string::npos) << json;
  EXPECT_NE(json.find("\"counts_per_step\": {\"dispatches\": 3.5"), std::string::npos) << json;
  EXPECT_NE(p.Table().find("the first 2 step(s) skipped"), std::string::npos);
  EXPECT_NE(p.Table().find("dispatches by op: Fill 3.5"), std::string::npos) << p.Table();
}

}  // namespace
}  // namespace switchyard
