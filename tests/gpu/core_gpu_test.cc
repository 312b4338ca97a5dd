// engine/core and the random kernels on a CUDA device against the host reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <thread>
#include <vector>

#include "engine/core/device_context.h"
#include "kernels/random.h"
#include "tests/gpu/gpu_test_util.h"

#ifdef SY_HAVE_CUDA
#include "engine/core/cuda_check.h"
#endif

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

#ifdef SY_HAVE_CUDA
// A host-to-device copy on a context (Tensor::CopyFrom through DeviceContext::StageToDevice)
// does not wait for the stream: with the stream held by a host function until the copy has
// returned, it returns (a copy that waited would be freed only by the 10 s release below,
// and the test fails instead of hanging); the device gets the bytes of the call even when
// the host buffer changes right after; blocks are reused once their copy has run; a copy
// over kMaxStagedBytes is not staged and still arrives.
TEST(CoreGpuTest, HostToDeviceCopiesDoNotWaitForTheStream) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(Device::Cuda(0));
  cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream());
  Tensor dev = Tensor::Empty({32768}, DType::kI32, Device::Cuda(0));
  // The pool's first block (cudaMallocHost) before the stream is held: training has its
  // blocks from the first step on.
  dev.CopyFrom(Tensor::Zeros({32768}, DType::kI32), ctx.get());
  ctx->Synchronize();
  // Holds the stream until the gate opens (or 10 s pass: then by_timeout).
  struct Gate {
    std::atomic<bool> open{false};
    std::atomic<bool> by_timeout{false};
  } gate;
  const cudaHostFn_t hold = [](void* arg) {
    auto* g = static_cast<Gate*>(arg);
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (!g->open.load()) {
      if (std::chrono::steady_clock::now() > until) {
        g->by_timeout = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::microseconds(50));
    }
  };
  SY_CUDA_CHECK(cudaLaunchHostFunc(stream, hold, &gate));
  std::vector<int32_t> values(32768);
  for (size_t i = 0; i < values.size(); ++i) values[i] = static_cast<int32_t>(i * 7 - 5);
  const std::vector<int32_t> sent = values;
  Tensor host = Tensor::FromVector(values, {32768});
  dev.CopyFrom(host, ctx.get());
  const bool returned_first = !gate.by_timeout.load();
  std::fill(host.data<int32_t>(), host.data<int32_t>() + 32768, -1);  // after the call
  gate.open = true;
  EXPECT_TRUE(returned_first) << "the copy waited for the stream";
  ctx->Synchronize();
  EXPECT_FALSE(gate.by_timeout.load()) << "the copy waited for the stream";
  EXPECT_EQ(dev.ToVector<int32_t>(), sent);
  EXPECT_EQ(ctx->staging_blocks(), 1u);
  // Done copies free their blocks: many more copies, one block.
  for (int i = 0; i < 50; ++i) {
    Tensor small = Tensor::FromVector(std::vector<int32_t>{i, i + 1, i + 2}, {3});
    Tensor d = small.To(Device::Cuda(0), ctx.get());
    ctx->Synchronize();
    ASSERT_EQ(d.ToVector<int32_t>(), (std::vector<int32_t>{i, i + 1, i + 2}));
  }
  EXPECT_EQ(ctx->staging_blocks(), 1u);
  // Past the staging limit: not staged, copied all the same.
  const int64_t big = static_cast<int64_t>(DeviceContext::kMaxStagedBytes / 4) + 1;
  Tensor large = Tensor::Zeros({big}, DType::kI32);
  large.data<int32_t>()[big - 1] = 12345;
  const Tensor large_dev = large.To(Device::Cuda(0), ctx.get());
  EXPECT_EQ(large_dev.Slice(big - 1, big).ToVector<int32_t>(), std::vector<int32_t>{12345});
  EXPECT_EQ(ctx->staging_blocks(), 1u);
  // A burst of copies with the stream held (a model's parameters going to the device): the
  // pool stops at kMaxStagingPool bytes, and the copies past it still arrive.
  Gate burst;
  SY_CUDA_CHECK(cudaLaunchHostFunc(stream, hold, &burst));
  const int64_t n = static_cast<int64_t>(DeviceContext::kMaxStagedBytes / 4);  // 16 MiB each
  std::vector<Tensor> sent_big;
  for (int i = 0; i < 8; ++i) {
    Tensor h = Tensor::Zeros({n}, DType::kI32);
    h.data<int32_t>()[0] = i;
    sent_big.push_back(h.To(Device::Cuda(0), ctx.get()));
    // The next copy would not fit: it goes the pageable way, which may wait for the stream.
    if (ctx->staging_bytes() + DeviceContext::kMaxStagedBytes > DeviceContext::kMaxStagingPool) {
      burst.open = true;
    }
  }
  burst.open = true;
  ctx->Synchronize();
  EXPECT_FALSE(burst.by_timeout);
  EXPECT_GE(ctx->staging_bytes(), 3 * DeviceContext::kMaxStagedBytes);
  EXPECT_LE(ctx->staging_bytes(), DeviceContext::kMaxStagingPool);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(sent_big[i].Slice(0, 1).ToVector<int32_t>(), std::vector<int32_t>{i});
  }
}
#endif

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
