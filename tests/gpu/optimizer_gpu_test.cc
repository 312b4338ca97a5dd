// kernels/optimizer.h on CUDA against the CPU reference on the same random inputs: AdamW
// over several steps with and without weight decay, SGD with and without momentum, scaling
// and sums of squares, single-tensor and multi-tensor ("Many") forms, on no elements, one,
// odd sizes, chunk-boundary sizes (65536, 65537) and over a million elements.
//
// Tolerances.
//   AdamW, SGD, scale: exact, 0 ulps. Both devices form the scalars on the host
//     (AdamWScalarsOf) and evaluate each element with the same sequence of correctly
//     rounded f32 operations (the CUDA kernels use __fmul_rn / __fadd_rn / __fsub_rn /
//     __fdiv_rn / __fsqrt_rn, never contracted into an FMA; the CPU build has no FMA), and
//     neither flushes subnormals. A failure here means the expressions diverged.
//   AdamWUpdateMany, ScaleMany on CUDA: bit-identical to the single-tensor CUDA kernels
//     (the same per-element device function) and so to the CPU; the bf16 weight shadows
//     AdamWUpdateMany writes, bit-identical to the CPU's (the same rounding of the same bits).
//   SumSquares, SumSquaresMany: both accumulate exact products in double, in different
//     orders; the error of either is at most n * 2^-53 of the (non-negative) sum, so
//     |gpu - cpu| <= 1e-9 |cpu| (kSumSqRel) for n up to a few million. Each GPU result is
//     deterministic: a second call returns the same bits.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "kernels/optimizer.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::HostUniform;
using gpu_test::ValuesOf;

const Device kCuda = Device::Cuda(0);
constexpr double kSumSqRel = 1e-9;

const std::vector<Shape> kShapes = {{0}, {1}, {3, 333}, {65536}, {65537}, {1100007}};

std::string Name(const std::string& op, const Shape& shape) {
  return op + " " + ShapeString(shape);
}

// Of the 307 tensors of ManyFormsMatchTheSingleForms, those whose results are printed (the
// large ones and a sample of the small ones); the rest are checked without a line each.
bool Printed(size_t k) { return k < 8 || k % 50 == 0; }

void ExpectSumNear(double got, double want, const std::string& what) {
  const double tol = kSumSqRel * std::fabs(want);
  EXPECT_LE(std::fabs(got - want), tol) << what << ": " << got << " vs " << want;
  std::printf("  %-56s tolerance used %.3f\n", what.c_str(),
              tol > 0 ? std::fabs(got - want) / tol : (got == want ? 0.0 : INFINITY));
}

// Host tensors of one AdamW state: param, grad, m, v (v >= 0).
AdamWTensors HostAdamW(const Shape& shape, uint64_t seed, float weight_decay) {
  return {HostUniform(shape, seed, -1.0f, 1.0f), HostUniform(shape, seed + 1, -1.0f, 1.0f),
          HostUniform(shape, seed + 2, -0.1f, 0.1f), HostUniform(shape, seed + 3, 0.0f, 1e-2f),
          weight_decay, Tensor()};
}

AdamWTensors ToDevice(const AdamWTensors& t, DeviceContext* c) {
  return {t.param.To(kCuda, c), t.grad.To(kCuda, c), t.exp_avg.To(kCuda, c),
          t.exp_avg_sq.To(kCuda, c), t.weight_decay, Tensor()};
}

void ExpectStateEqual(const AdamWTensors& got, const AdamWTensors& want, DeviceContext* c,
                      const std::string& what) {
  ExpectBitEqual(got.param, want.param, c, what + " param");
  ExpectBitEqual(got.exp_avg, want.exp_avg, c, what + " exp_avg");
  ExpectBitEqual(got.exp_avg_sq, want.exp_avg_sq, c, what + " exp_avg_sq");
}

TEST(OptimizerGpuTest, AdamWMatchesTheCpuBitForBit) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  uint64_t seed = 600;
  for (const Shape& shape : kShapes) {
    for (float wd : {0.0f, 0.1f}) {
      AdamWTensors cpu = HostAdamW(shape, seed, wd);
      seed += 4;
      AdamWTensors gpu = ToDevice(cpu, c);
      AdamWStep hp{
          .lr = 3e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = wd, .step = 1};
      for (; hp.step <= 3; ++hp.step) {  // a new gradient each step
        cpu.grad = HostUniform(shape, seed++, -1.0f, 1.0f);
        gpu.grad = cpu.grad.To(kCuda, c);
        AdamWUpdate(cpu.param, cpu.grad, cpu.exp_avg, cpu.exp_avg_sq, hp);
        AdamWUpdate(gpu.param, gpu.grad, gpu.exp_avg, gpu.exp_avg_sq, hp, c);
      }
      ExpectStateEqual(gpu, cpu, c, Name("AdamW wd " + std::to_string(wd), shape));
    }
  }
}

TEST(OptimizerGpuTest, SgdMatchesTheCpuBitForBit) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  uint64_t seed = 700;
  for (const Shape& shape : kShapes) {
    for (float momentum : {0.0f, 0.9f}) {
      for (float wd : {0.0f, 0.01f}) {
        Tensor p = HostUniform(shape, seed++, -1.0f, 1.0f);
        Tensor b = Tensor::Zeros(shape, DType::kF32);
        Tensor dp = p.To(kCuda, c), dbuf = b.To(kCuda, c);
        for (int step = 0; step < 3; ++step) {
          const Tensor g = HostUniform(shape, seed++, -1.0f, 1.0f);
          SgdUpdate(p, g, b, 0.05f, momentum, wd);
          SgdUpdate(dp, g.To(kCuda, c), dbuf, 0.05f, momentum, wd, c);
        }
        const std::string what =
            "SGD momentum " + std::to_string(momentum) + " wd " + std::to_string(wd);
        ExpectBitEqual(dp, p, c, Name(what + " param", shape));
        ExpectBitEqual(dbuf, b, c, Name(what + " buffer", shape));
      }
    }
  }
  // momentum 0: the buffer may be undefined.
  Tensor p = HostUniform({100}, 799), dp = p.To(kCuda, c), none;
  const Tensor g = HostUniform({100}, 798);
  SgdUpdate(p, g, none, 0.1f, 0.0f, 0.0f);
  SgdUpdate(dp, g.To(kCuda, c), none, 0.1f, 0.0f, 0.0f, c);
  ExpectBitEqual(dp, p, c, "SGD without a buffer");
}

TEST(OptimizerGpuTest, ScaleAndSumSquaresMatchTheCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  uint64_t seed = 800;
  for (const Shape& shape : kShapes) {
    Tensor t = HostUniform(shape, seed++, -3.0f, 3.0f);
    Tensor dt = t.To(kCuda, c);
    const double want = SumSquares(t);
    const double got = SumSquares(dt, c);
    ExpectSumNear(got, want, Name("SumSquares", shape));
    EXPECT_EQ(SumSquares(dt, c), got) << "SumSquares run to run";
    ScaleInPlace(t, 0.37f);
    ScaleInPlace(dt, 0.37f, c);
    ExpectBitEqual(dt, t, c, Name("ScaleInPlace", shape));
  }
}

TEST(OptimizerGpuTest, ManyFormsMatchTheSingleForms) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  // Chunk boundaries (65536 elements), empty tensors, and 300 small tensors (many chunks).
  std::vector<Shape> shapes = {{0}, {1}, {65536}, {65537}, {3, 70001}, {1100007}, {0, 4}};
  for (int k = 0; k < 300; ++k) shapes.push_back({17 + k % 5});
  std::vector<AdamWTensors> cpu, many, single;
  uint64_t seed = 900;
  for (size_t k = 0; k < shapes.size(); ++k) {
    cpu.push_back(HostAdamW(shapes[k], seed, k % 3 == 0 ? 0.0f : 0.01f * (k % 7)));
    seed += 4;
    many.push_back(ToDevice(cpu.back(), c));
    single.push_back(ToDevice(cpu.back(), c));
    // Every other tensor with a bf16 weight shadow (the update writes the new values there).
    if (k % 2 == 1) {
      cpu.back().shadow = Tensor::Zeros(shapes[k], DType::kBF16);
      many.back().shadow = Tensor::Zeros(shapes[k], DType::kBF16, kCuda, c);
    }
  }
  AdamWStep hp{.lr = 1e-3f,
               .beta1 = 0.9f,
               .beta2 = 0.999f,
               .eps = 1e-8f,
               .weight_decay = 5.0f /* ignored by the Many forms */,
               .step = 1};
  for (; hp.step <= 2; ++hp.step) {
    AdamWUpdateMany(cpu, hp);
    AdamWUpdateMany(many, hp, c);
    for (AdamWTensors& t : single) {
      AdamWStep one = hp;
      one.weight_decay = t.weight_decay;
      AdamWUpdate(t.param, t.grad, t.exp_avg, t.exp_avg_sq, one, c);
    }
  }
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (many[k].shadow.defined()) {
      const std::vector<BFloat16> got16 = ValuesOf<BFloat16>(many[k].shadow, c),
                                  want16 = cpu[k].shadow.ToVector<BFloat16>();
      ASSERT_EQ(got16.size(), want16.size()) << "shadow " << k;
      for (size_t i = 0; i < got16.size(); ++i) {
        ASSERT_EQ(got16[i].bits, want16[i].bits) << "shadow " << k << " element " << i;
      }
    }
    if (!Printed(k)) {  // checked quietly (float == is bit equality here: no NaN)
      const std::vector<float> got = ValuesOf<float>(many[k].param, c);
      ASSERT_EQ(got, ValuesOf<float>(single[k].param, c)) << "tensor " << k;
      ASSERT_EQ(got, cpu[k].param.ToVector<float>()) << "tensor " << k;
      ASSERT_EQ(ValuesOf<float>(many[k].exp_avg, c), cpu[k].exp_avg.ToVector<float>()) << k;
      ASSERT_EQ(ValuesOf<float>(many[k].exp_avg_sq, c), cpu[k].exp_avg_sq.ToVector<float>()) << k;
      continue;
    }
    const std::string what = "tensor " + std::to_string(k) + " " + ShapeString(shapes[k]);
    ExpectStateEqual(many[k], single[k], c, "AdamWUpdateMany = AdamWUpdate (GPU) " + what);
    ExpectStateEqual(many[k], cpu[k], c, "AdamWUpdateMany GPU = CPU " + what);
  }

  std::vector<Tensor> grads_cpu, grads_gpu;
  for (size_t k = 0; k < shapes.size(); ++k) {
    grads_cpu.push_back(HostUniform(shapes[k], seed++, -2.0f, 2.0f));
    grads_gpu.push_back(grads_cpu.back().To(kCuda, c));
  }
  const std::vector<double> want = SumSquaresMany(grads_cpu);
  const std::vector<double> got = SumSquaresMany(grads_gpu, c);
  ASSERT_EQ(got.size(), shapes.size());
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (!Printed(k)) {
      ASSERT_LE(std::fabs(got[k] - want[k]), kSumSqRel * want[k]) << "tensor " << k;
      continue;
    }
    ExpectSumNear(got[k], want[k], "SumSquaresMany tensor " + std::to_string(k));
  }
  EXPECT_EQ(SumSquaresMany(grads_gpu, c), got) << "SumSquaresMany run to run";

  ScaleMany(grads_cpu, -0.25f);
  ScaleMany(grads_gpu, -0.25f, c);
  for (size_t k = 0; k < shapes.size(); ++k) {
    if (!Printed(k)) {
      ASSERT_EQ(ValuesOf<float>(grads_gpu[k], c), grads_cpu[k].ToVector<float>()) << k;
      continue;
    }
    ExpectBitEqual(grads_gpu[k], grads_cpu[k], c, "ScaleMany tensor " + std::to_string(k));
  }
  std::vector<Tensor> none;
  EXPECT_TRUE(SumSquaresMany(none, c).empty());
  ScaleMany(none, 2.0f, c);
}

}  // namespace
}  // namespace switchyard::kernels
