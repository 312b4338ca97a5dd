// The fused elementwise ops on CUDA: bit-identical to the unfused CUDA sequences they
// replace (tests/kernels/fused_ops_check.h), which tests/gpu/activation_gpu_test.cc and
// norm_gpu_test.cc check against the CPU reference; and the fused CUDA ops within those
// files' tolerances of the fused CPU ops, here for the forward outputs.
#include <gtest/gtest.h>

#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/fused_ops_check.h"

namespace switchyard::kernels {
namespace {

TEST(FusedOpsGpuTest, BiasActivationsEqualTheUnfusedSequence) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(Device::Cuda(0));
  fused_check::CheckBiasActivations(Device::Cuda(0), context.get());
}

TEST(FusedOpsGpuTest, GroupedBiasActivationsEqualTheUnfusedSequence) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(Device::Cuda(0));
  fused_check::CheckGroupedBiasActivations(Device::Cuda(0), context.get());
}

TEST(FusedOpsGpuTest, ResidualAddNormEqualsAddThenNorm) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(Device::Cuda(0));
  fused_check::CheckAddNorms(Device::Cuda(0), context.get());
}

// Across devices: gelu forward within 2e-6 relative (expf's ulps; activation_gpu_test.cc's
// kActRel), the bias add exact; layernorm within 1e-5 absolute + relative (the row
// statistics' reduction order, in double, then f32 roundings).
TEST(FusedOpsGpuTest, ForwardMatchesTheCpu) {
  SY_REQUIRE_GPU();
  const Device cuda = Device::Cuda(0);
  auto context = DeviceContext::Create(cuda);
  DeviceContext* ctx = context.get();
  const Shape s = {300, 1000};
  const Tensor a0 = gpu_test::HostUniform(s, 7, -3.0f, 3.0f), bias = gpu_test::HostUniform({1000}, 8);
  Tensor a_cpu = a0.Clone(), h_cpu = Tensor::Empty(s, DType::kF32);
  BiasGeluForward(a_cpu, bias, h_cpu);
  Tensor a_gpu = a0.To(cuda, ctx), h_gpu = Tensor::Empty(s, DType::kF32, cuda);
  BiasGeluForward(a_gpu, bias.To(cuda, ctx), h_gpu, ctx);
  gpu_test::ExpectBitEqual(a_gpu, a_cpu, ctx, "BiasGeluForward a: cuda vs cpu");
  gpu_test::ExpectNear(h_gpu, h_cpu, 1e-30, 2e-6, ctx, "BiasGeluForward h: cuda vs cpu");

  const Tensor x = gpu_test::HostUniform(s, 9), r = gpu_test::HostUniform(s, 10);
  const Tensor w = gpu_test::HostUniform({1000}, 11, 0.5f, 1.5f);
  Tensor sum = Tensor::Empty(s, DType::kF32), y = Tensor::Empty(s, DType::kF32);
  Tensor m = Tensor::Empty({300}, DType::kF32), rs = Tensor::Empty({300}, DType::kF32);
  AddLayerNormForward(x, r, w, bias, 1e-5f, sum, y, m, rs);
  Tensor gsum = Tensor::Empty(s, DType::kF32, cuda), gy = Tensor::Empty(s, DType::kF32, cuda);
  Tensor gm = Tensor::Empty({300}, DType::kF32, cuda), grs = Tensor::Empty({300}, DType::kF32, cuda);
  AddLayerNormForward(x.To(cuda, ctx), r.To(cuda, ctx), w.To(cuda, ctx), bias.To(cuda, ctx),
                      1e-5f, gsum, gy, gm, grs, ctx);
  gpu_test::ExpectBitEqual(gsum, sum, ctx, "AddLayerNormForward sum: cuda vs cpu");
  gpu_test::ExpectNear(gy, y, 1e-5, 1e-5, ctx, "AddLayerNormForward y: cuda vs cpu");
}

}  // namespace
}  // namespace switchyard::kernels
