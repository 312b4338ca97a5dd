// RoutingByLabel (engine/train/metrics.h), the (label, expert) counts behind
// routing_by_language.json: a hand-counted case; in a training step (the step's readback open
// on the context) the counts are made on the device into the readback, nothing is read back
// until the step's end, and after Resolve they are the counts Add makes from the same
// choices read back at once; a broken expert index stops at Resolve with a message. The CUDA
// kernel against the CPU: tests/kernels/routing_emulation_test.cc and
// tests/gpu/step_readback_gpu_test.cc; through `switchyard train`:
// tests/cli/routing_log_cli_test.sh.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/counters.h"
#include "engine/core/device_context.h"
#include "engine/core/step_readback.h"
#include "engine/core/tensor.h"
#include "engine/train/metrics.h"

namespace switchyard::train {
namespace {

Tensor I32(const std::vector<int32_t>& v, const Shape& shape) {
  return Tensor::FromVector(v, shape);
}

// Choices (T, k) in [0, E) and labels in [-1, L] (both ends outside the labels), from a
// fixed integer recurrence.
void MakeChoices(int64_t T, int64_t k, int64_t E, int64_t L, uint32_t seed,
                 std::vector<int32_t>& idx, std::vector<int32_t>& labels) {
  uint32_t x = seed;
  auto next = [&x] { return x = x * 1664525u + 1013904223u; };
  idx.resize(T * k);
  labels.resize(T);
  for (int32_t& i : idx) i = static_cast<int32_t>((next() >> 8) % E);
  for (int32_t& l : labels) l = static_cast<int32_t>((next() >> 8) % (L + 2)) - 1;
}

TEST(RoutingByLabelTest, CountsAHandCountedCase) {
  RoutingByLabel r({"de", "en"}, {1}, 4);
  // Tokens: de -> (0, 1), en -> (2, 2), de -> (1, 3), unlabelled (-1) -> (0, 0).
  r.Add(0, I32({0, 1, 2, 2, 1, 3, 0, 0}, {4, 2}), I32({0, 1, 0, -1}, {4}));
  EXPECT_EQ(r.counts(0), (std::vector<int64_t>{1, 2, 0, 1,    // de
                                               0, 0, 2, 0}));  // en
}

// Two layers, three micro-batches each, top-2 over 5 experts, 3 labels: AddInStep under an
// open step readback gives Add's counts after Resolve, reads nothing back before the step's
// end, and accumulates over steps; without a window it is Add.
TEST(RoutingByLabelTest, InAStepTheReadbackCarriesAddsCounts) {
  const std::vector<std::string> labels = {"de", "en", "es"};
  const int64_t E = 5, k = 2, T = 37;
  auto ctx = DeviceContext::Create(Device::Cpu());
  RoutingByLabel host(labels, {0, 2}, E), in_step(labels, {0, 2}, E), no_window(labels, {0, 2}, E);
  uint32_t seed = 7;
  for (int step = 0; step < 2; ++step) {
    StepReadback readback;
    ctx->set_step_readback(&readback);
    // A value of the step's own, reserved before the counts (they need not come first).
    StepReadback::Slots other = readback.Reserve(3, Device::Cpu(), ctx.get());
    const DeviceCounts before = counters::Snapshot();
    for (int micro = 0; micro < 3; ++micro) {
      for (size_t layer = 0; layer < 2; ++layer) {
        std::vector<int32_t> idx, lab;
        MakeChoices(T, k, E, static_cast<int64_t>(labels.size()), seed += 11, idx, lab);
        const Tensor i = I32(idx, {T, k}), l = I32(lab, {T});
        host.Add(layer, i, l);
        in_step.AddInStep(layer, i, l, ctx.get());
      }
    }
    const DeviceCounts during = counters::Snapshot().Minus(before);
    EXPECT_EQ(during.readbacks, 0) << "step " << step << ": the counts wait for the step's end";
    // One slot range per layer and step: 2 x (3 labels x 5 experts + 1) after the 3 others.
    EXPECT_EQ(readback.size(), 3 + 2 * (3 * E + 1));
    ctx->set_step_readback(nullptr);
    const std::vector<double> slots = readback.ReadBack(ctx.get());
    in_step.Resolve(slots);
    for (size_t layer = 0; layer < 2; ++layer) {
      EXPECT_EQ(in_step.counts(layer), host.counts(layer)) << "step " << step << " layer " << layer;
    }
  }
  int64_t total = 0;
  for (int64_t c : host.counts(0)) total += c;
  EXPECT_GT(total, 0);
  EXPECT_LT(total, 2 * 3 * T * k) << "tokens labelled -1 and 3 are not counted";

  // No window: read back at once, as Add.
  std::vector<int32_t> idx, lab;
  MakeChoices(T, k, E, 3, 99, idx, lab);
  const DeviceCounts before = counters::Snapshot();
  no_window.AddInStep(1, I32(idx, {T, k}), I32(lab, {T}), ctx.get());
  EXPECT_EQ(counters::Snapshot().Minus(before).readbacks, 1);
  RoutingByLabel want(labels, {0, 2}, E);
  want.Add(1, I32(idx, {T, k}), I32(lab, {T}));
  EXPECT_EQ(no_window.counts(1), want.counts(1));
}

TEST(RoutingByLabelDeathTest, AnExpertIndexOutOfRangeStopsAtResolve) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  RoutingByLabel r({"de"}, {0}, 4);
  StepReadback readback;
  ctx->set_step_readback(&readback);
  r.AddInStep(0, I32({1, 4}, {2, 1}), I32({0, 0}, {2}), ctx.get());
  ctx->set_step_readback(nullptr);
  const std::vector<double> slots = readback.ReadBack(ctx.get());
  EXPECT_DEATH(r.Resolve(slots), "expert indices outside \\[0, 4\\)");
}

}  // namespace
}  // namespace switchyard::train
