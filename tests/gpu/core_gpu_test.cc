// engine/core and the random kernels on a CUDA device against the host reference.
#include <gtest/gtest.h>

#include "engine/core/device_context.h"
#include "kernels/random.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard {
namespace {

TEST(CoreGpuTest, TensorRoundTripsThroughTheDevice) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(Device::Cuda(0));
  std::vector<float> values(1000);
  for (int i = 0; i < 1000; ++i) values[i] = 0.5f * i - 3;
  Tensor host = Tensor::FromVector(values, {10, 100});
  Tensor dev = host.To(Device::Cuda(0), ctx.get());
  EXPECT_EQ(dev.device(), Device::Cuda(0));
  Tensor slice = dev.Slice(2, 4).Clone(ctx.get());
  EXPECT_EQ(slice.ToVector<float>(), host.Slice(2, 4).ToVector<float>());
  dev.Slice(0, 1).SetZero(ctx.get());
  ctx->Synchronize();
  auto back = dev.ToVector<float>();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(back[i], 0.0f);
  for (int i = 100; i < 1000; ++i) EXPECT_EQ(back[i], values[i]);
}

TEST(CoreGpuTest, CachingAllocatorReusesFreedBlocks) {
  SY_REQUIRE_GPU();
  Allocator* alloc = GetAllocator(Device::Cuda(0));
  void* first;
  {
    Tensor t = Tensor::Empty({1 << 20}, DType::kF32, Device::Cuda(0));
    first = t.raw_data();
  }
  EXPECT_GE(alloc->stats().cached, size_t{4} << 20);
  Tensor again = Tensor::Empty({(1 << 20) - 100}, DType::kF32, Device::Cuda(0));
  EXPECT_EQ(again.raw_data(), first);
}

// kernels::DeviceRng (runtime.cuda_graphs): the key's stream and first token read from device
// memory give the CPU's host-keyed numbers, bit for bit.
TEST(CoreGpuTest, DeviceKeyedFillMatchesTheCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(Device::Cuda(0));
  const RngKey key{99, StreamId("gpu-test-device-key")};
  const int64_t first_token = 37, offset = 5, per_token = 24, n = 24 * 50;
  Tensor want = Tensor::Empty({n}, DType::kF32);
  kernels::FillUniform(want, key, (first_token + offset) * per_token, 0.99f, 1.01f);
  const Tensor values = Tensor::FromVector<int64_t>(
      {static_cast<int64_t>(key.stream), first_token}, {2}).To(Device::Cuda(0), ctx.get());
  Tensor got = Tensor::Empty({n}, DType::kF32, Device::Cuda(0));
  kernels::FillUniform(got,
                       kernels::DeviceRng{.seed = key.seed, .values = values,
                                          .token_offset = offset, .per_token = per_token},
                       0.99f, 1.01f, ctx.get());
  EXPECT_EQ(got.ToVector<float>(), want.ToVector<float>());
}

TEST(CoreGpuTest, PhiloxFillsMatchTheCpuBitForBit) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(Device::Cuda(0));
  RngKey key{99, StreamId("gpu-test")};
  const int64_t n = 100003, first = 12345;
  Tensor cpu_bits = Tensor::Empty({n}, DType::kI32);
  Tensor gpu_bits = Tensor::Empty({n}, DType::kI32, Device::Cuda(0));
  kernels::FillRandomBits(cpu_bits, key, first);
  kernels::FillRandomBits(gpu_bits, key, first, ctx.get());
  EXPECT_EQ(gpu_bits.ToVector<int32_t>(), cpu_bits.ToVector<int32_t>());

  for (DType dtype : {DType::kF32, DType::kBF16}) {
    Tensor cu = Tensor::Empty({n}, dtype), gu = Tensor::Empty({n}, dtype, Device::Cuda(0));
    kernels::FillUniform(cu, key, first, -2.0f, 2.0f);
    kernels::FillUniform(gu, key, first, -2.0f, 2.0f, ctx.get());
    if (dtype == DType::kF32) {
      EXPECT_EQ(gu.ToVector<float>(), cu.ToVector<float>());  // exact: same float ops
    }
    Tensor cn = Tensor::Empty({n}, DType::kF32), gn = Tensor::Empty({n}, DType::kF32, Device::Cuda(0));
    kernels::FillNormal(cn, key, first, 0.0f, 1.0f);
    kernels::FillNormal(gn, key, first, 0.0f, 1.0f, ctx.get());
    auto c = cn.ToVector<float>(), g = gn.ToVector<float>();
    // Same uniforms; device logf/cosf differ from the host libm by a few ulp.
    for (int64_t i = 0; i < n; ++i) ASSERT_NEAR(g[i], c[i], 2e-6f * (1 + std::fabs(c[i]))) << i;
  }
}

}  // namespace
}  // namespace switchyard
