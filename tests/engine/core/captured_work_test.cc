// The CPU emulation of a capture (engine/core/captured_work.h): kernels and tensor copies
// queued with a capturing context are recorded, not run; a replay runs them on whatever the
// tensors hold then, with the arguments they had at capture; nothing may wait for the device
// while capturing.
#include "engine/core/captured_work.h"

#include <gtest/gtest.h>

#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "kernels/elementwise.h"

namespace switchyard {
namespace {

TEST(CapturedWorkTest, ReplayRunsTheRecordedOpsOnTheTensorsValuesThen) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  Tensor x = Tensor::FromVector<float>({1, 2, 3}, {3});
  Tensor y = Tensor::FromVector<float>({10, 20, 30}, {3});
  Tensor out = Tensor::FromVector<float>({0, 0, 0}, {3});
  Tensor scratch = Tensor::FromVector<float>({0, 0, 0}, {3});
  ctx->BeginCapture();
  EXPECT_TRUE(ctx->capturing());
  EXPECT_EQ(capture::Current(), ctx.get());
  kernels::Add(x, y, scratch, ctx.get());                    // scratch = x + y
  out.CopyFrom(scratch, ctx.get());                          // out = scratch
  kernels::Axpy(2.0f, x, out, ctx.get());                    // out += 2 x
  scratch.SetZero(ctx.get());
  std::unique_ptr<CapturedWork> work = ctx->EndCapture();
  EXPECT_FALSE(ctx->capturing());
  EXPECT_EQ(capture::Current(), nullptr);
  EXPECT_EQ(work->operations(), 4);
  // Nothing ran while capturing.
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{0, 0, 0}));
  work->Replay(ctx.get());
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{13, 26, 39}));
  EXPECT_EQ(scratch.ToVector<float>(), (std::vector<float>{0, 0, 0}));
  // New inputs written into the captured tensors: the replay reads them.
  x.CopyFrom(Tensor::FromVector<float>({-1, 0, 1}, {3}));
  work->Replay(ctx.get());
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{7, 20, 33}));
}

TEST(CapturedWorkTest, AHostSourceIsReadAsItWasAtCapture) {
  // A copy from a host tensor the capture was given keeps that tensor's values (CUDA copies
  // it into pinned memory the graph keeps): a per-step value must not travel this way.
  auto ctx = DeviceContext::Create(Device::Cpu());
  Tensor dst = Tensor::Zeros({2}, DType::kF32);
  ctx->BeginCapture();
  dst.CopyFrom(Tensor::FromVector<float>({5, 6}, {2}), ctx.get());
  std::unique_ptr<CapturedWork> work = ctx->EndCapture();
  work->Replay(ctx.get());
  EXPECT_EQ(dst.ToVector<float>(), (std::vector<float>{5, 6}));
}

TEST(CapturedWorkDeathTest, NothingWaitsForTheDeviceWhileCapturing) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  Tensor x = Tensor::FromVector<float>({1, 2}, {2});
  EXPECT_DEATH(
      {
        ctx->BeginCapture();
        (void)x.ToHost("test.site", ctx.get());
      },
      "a readback \\(test.site\\) while the step's device work is captured");
  EXPECT_DEATH(
      {
        ctx->BeginCapture();
        ctx->Synchronize();
      },
      "a readback \\(synchronize\\)");
  EXPECT_DEATH(
      {
        ctx->BeginCapture();
        ctx->BeginCapture();
      },
      "capturing already");
  EXPECT_DEATH((void)ctx->EndCapture(), "EndCapture without BeginCapture");
}

}  // namespace
}  // namespace switchyard
