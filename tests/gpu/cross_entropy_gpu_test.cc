// kernels/cross_entropy.h on CUDA against the CPU reference on the same random inputs:
// vocabularies of 1, 31, 33, 1000 and 50257, one row to 300 rows, a (B, S, V) tensor, no
// rows, some / all / no targets ignored, another ignore_index, dlogits in place over the
// logits, CountTargets and CrossEntropyMean; and a target outside the vocabulary, fatal
// naming it as on the CPU.
//
// Tolerances. The CPU takes exp in double where the GPU takes CUDA's expf (<= 2 ulp), and
// the sums run in another order; the per-row lse then differs by <= ~3e-7 (the sum's relative
// error), so:
//   loss_sum: |gpu - cpu| <= 5e-7 count + 1e-9 |cpu|;  count: equal.
//   dlogits:  |gpu - cpu| <= 5e-6 grad_scale + 5e-6 |cpu|: exp(x - lse_f) moves by one ulp
//             of lse_f (~1e-6 relative at lse ~ 11) when lse rounds to the other float;
//             at the target, g - grad_scale cancels to an absolute error of that size.
//             Ignored rows are 0 on both.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "kernels/cross_entropy.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::ExpectNear;
using gpu_test::HostUniform;

constexpr double kLossPerRow = 5e-7, kLossRel = 1e-9;
constexpr double kGradTol = 5e-6;  // of grad_scale (absolute) and of |cpu| (relative)

const Device kCuda = Device::Cuda(0);

// n targets in [0, v), each replaced by ignore_index with probability p_ignore.
Tensor RandomTargets(int64_t n, int64_t v, double p_ignore, int32_t ignore_index, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(v - 1));
  std::bernoulli_distribution drop(p_ignore);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& target : t) target = drop(rng) ? ignore_index : pick(rng);
  return Tensor::FromVector(t, {n});
}

void ExpectSumsNear(const CrossEntropySums& gpu, const CrossEntropySums& cpu,
                    const std::string& what) {
  EXPECT_EQ(gpu.count, cpu.count) << what;
  const double tol =
      kLossPerRow * static_cast<double>(cpu.count) + kLossRel * std::fabs(cpu.loss_sum);
  EXPECT_NEAR(gpu.loss_sum, cpu.loss_sum, tol) << what;
  std::printf("  %-56s loss tolerance used %.3f\n", what.c_str(),
              tol > 0 ? std::fabs(gpu.loss_sum - cpu.loss_sum) / tol : 0.0);
}

struct Case {
  Shape logits_shape;
  double p_ignore;
  int32_t ignore_index = kIgnoreIndex;
};

void CheckCase(const Case& c, uint64_t seed) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const Shape& shape = c.logits_shape;
  const int64_t v = shape.back(), n = NumElements(shape) / v;
  const std::string name = "cross entropy logits" + ShapeString(shape) + " p_ignore " +
                           std::to_string(c.p_ignore) + " ignore " + std::to_string(c.ignore_index);
  Tensor logits = HostUniform(shape, seed, -4.0f, 4.0f);
  Tensor targets = RandomTargets(n, v, c.p_ignore, c.ignore_index, static_cast<uint32_t>(seed));
  Tensor logits_d = logits.To(kCuda, gpu), targets_d = targets.To(kCuda, gpu);

  const int64_t count = CountTargets(targets, c.ignore_index);
  EXPECT_EQ(CountTargets(targets_d, c.ignore_index, gpu), count) << name;
  ExpectSumsNear(CrossEntropyForward(logits_d, targets_d, c.ignore_index, gpu),
                 CrossEntropyForward(logits, targets, c.ignore_index), name + " forward");

  const double scale = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
  Tensor dlogits = Tensor::Empty(shape, DType::kF32);
  const CrossEntropySums cpu =
      CrossEntropyForwardBackward(logits, targets, dlogits, scale, c.ignore_index);
  // NaN-filled: every element must be written (ignored rows with 0).
  Tensor dlogits_d =
      Tensor::FromVector(std::vector<float>(logits.numel(), NAN), shape).To(kCuda, gpu);
  const CrossEntropySums got =
      CrossEntropyForwardBackward(logits_d, targets_d, dlogits_d, scale, c.ignore_index, gpu);
  ExpectSumsNear(got, cpu, name + " forward-backward");
  ExpectNear(dlogits_d, dlogits, kGradTol * scale, kGradTol, gpu, name + " dlogits");

  // In place over the logits, as the decoder calls it: the same bits as out of place.
  const CrossEntropySums in_place =
      CrossEntropyForwardBackward(logits_d, targets_d, logits_d, scale, c.ignore_index, gpu);
  EXPECT_EQ(in_place.loss_sum, got.loss_sum) << name;
  ExpectBitEqual(logits_d, dlogits_d, gpu, name + " dlogits in place vs out of place");

  // CrossEntropyMean: the same as the sums over the count.
  Tensor mean_grad = Tensor::Empty(shape, DType::kF32);
  Tensor mean_grad_d = Tensor::Empty(shape, DType::kF32, kCuda);
  const double mean_cpu = CrossEntropyMean(logits, targets, mean_grad, c.ignore_index);
  const double mean_gpu =
      CrossEntropyMean(logits.To(kCuda, gpu), targets_d, mean_grad_d, c.ignore_index, gpu);
  EXPECT_NEAR(mean_gpu, mean_cpu, kLossPerRow + kLossRel * std::fabs(mean_cpu)) << name;
  ExpectNear(mean_grad_d, mean_grad, kGradTol * scale, kGradTol, gpu, name + " mean dlogits");
}

TEST(CrossEntropyGpuTest, MatchesCpuOnChosenShapes) {
  SY_REQUIRE_GPU();
  const Case cases[] = {
      {{1, 1}, 0.0},      {{1, 31}, 0.0},    {{7, 33}, 0.3},      {{300, 1000}, 0.25},
      {{64, 50257}, 0.1}, {{1, 50257}, 0.0}, {{2, 9, 1000}, 0.5}, {{5, 31}, 1.0},
      {{40, 1000}, 1.0},  {{0, 17}, 0.0},    {{50, 33}, 0.4, 3},  {{20, 1000}, 0.2, 999},
  };
  uint64_t seed = 1100;
  for (const Case& c : cases) CheckCase(c, seed += 10);
}

void RunWithBadTarget() {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  Tensor logits = Tensor::Zeros({4, 10}, DType::kF32, kCuda, gpu);
  Tensor targets = Tensor::FromVector<int32_t>({3, -1, 50, 12}, {4}).To(kCuda, gpu);
  CrossEntropyForward(logits, targets, kIgnoreIndex, gpu);
}

TEST(CrossEntropyGpuDeathTest, TargetOutsideTheVocabularyIsFatalNamingIt) {
  SY_REQUIRE_GPU();
  // The child process re-executes the binary (a forked CUDA context is unusable).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(RunWithBadTarget(),
               "CrossEntropyForward: target 50 at row 2 is outside the vocabulary of 10");
}

}  // namespace
}  // namespace switchyard::kernels
