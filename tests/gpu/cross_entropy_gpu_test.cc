// kernels/cross_entropy.h on CUDA against the exact values of its inputs (double on the
// host), within the bounds by construction of tests/kernels/cross_entropy_bound.h, on random
// inputs: vocabularies of 1, 31, 33, 1000 and 50257, one row to 300 rows, a (B, S, V) tensor,
// no rows, some / all / no targets ignored, another ignore_index, dlogits in place over the
// logits (the same bits), CountTargets (the CPU's count) and CrossEntropyMean; and a target
// outside the vocabulary, fatal naming it as on the CPU. Ignored rows are 0 exactly. (Not
// against the CPU twin: its f32 lane sums may be off by gamma(V / 16 + 1), 1.9e-4 at
// V = 50257, which would bound the twin, not the kernel.)
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
#include "tests/kernels/cross_entropy_bound.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::HostUniform;


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

// The exact values of the counted rows and the kernel's bounds.
struct Exact {
  std::vector<ce_bound::RowBounds> rows;  // per row (counted rows only)
  double loss_sum = 0, sum_bound = 0;
  int64_t count = 0;
};

Exact ExactOf(const Tensor& logits, const Tensor& targets, int32_t ignore_index) {
  const int64_t v = logits.shape().back(), n = targets.numel();
  const float* x = logits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  Exact ex;
  ex.rows.resize(n);
  double row_bounds = 0, magnitude = 0;
  for (int64_t r = 0; r < n; ++r) {
    if (t[r] == ignore_index) continue;
    ex.rows[r] = ce_bound::BoundsOf(x + r * v, v, t[r]);
    ex.loss_sum += ex.rows[r].loss;
    row_bounds += ex.rows[r].loss_bound();
    magnitude += std::fabs(ex.rows[r].loss);
    ++ex.count;
  }
  ex.sum_bound = ce_bound::SumBound(row_bounds, magnitude, n);
  return ex;
}

void ExpectSumsNear(const CrossEntropySums& gpu, const Exact& ex, const std::string& what) {
  EXPECT_EQ(gpu.count, ex.count) << what;
  const double err = std::fabs(gpu.loss_sum - ex.loss_sum);
  EXPECT_LE(err, ex.sum_bound) << what << ": loss_sum " << gpu.loss_sum;
  std::printf("  %-56s loss bound used %.3f\n", what.c_str(),
              ex.sum_bound > 0 ? err / ex.sum_bound : 0.0);
}

// dlogits (on any device) against scale (softmax - onehot) within the kernel's bound; scale
// as the kernel has it (f32). Ignored rows: 0.
void ExpectGradNear(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                    const Exact& ex, float scale, int32_t ignore_index, DeviceContext* ctx,
                    const std::string& what) {
  const std::vector<float> g = gpu_test::ValuesOf<float>(dlogits, ctx);
  const int64_t v = logits.shape().back(), n = targets.numel();
  const float* x = logits.data<float>();
  const int32_t* t = targets.data<int32_t>();
  double worst = 0;
  int64_t worst_i = 0;
  for (int64_t i = 0; i < n * v; ++i) {
    const int64_t r = i / v, j = i % v;
    ce_bound::GradBound b;
    if (t[r] != ignore_index) b = ce_bound::GpuGradBound(ex.rows[r], x[i], scale, j == t[r], g[i]);
    const double err = std::fabs(static_cast<double>(g[i]) - b.exact);
    const double used = err <= b.bound ? (b.bound > 0 ? err / b.bound : 0.0) : INFINITY;
    if (used > worst) worst = used, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " is " << g[worst_i];
  std::printf("  %-56s bound used %.3f\n", what.c_str(), worst);
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
  const Exact ex = ExactOf(logits, targets, c.ignore_index);
  ExpectSumsNear(CrossEntropyForward(logits_d, targets_d, c.ignore_index, gpu), ex,
                 name + " forward");

  const double scale = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;
  // NaN-filled: every element must be written (ignored rows with 0).
  Tensor dlogits_d =
      Tensor::FromVector(std::vector<float>(logits.numel(), NAN), shape).To(kCuda, gpu);
  const CrossEntropySums got =
      CrossEntropyForwardBackward(logits_d, targets_d, dlogits_d, scale, c.ignore_index, gpu);
  ExpectSumsNear(got, ex, name + " forward-backward");
  ExpectGradNear(dlogits_d, logits, targets, ex, static_cast<float>(scale), c.ignore_index,
                 gpu, name + " dlogits");

  // In place over the logits, as the decoder calls it: the same bits as out of place.
  const CrossEntropySums in_place =
      CrossEntropyForwardBackward(logits_d, targets_d, logits_d, scale, c.ignore_index, gpu);
  EXPECT_EQ(in_place.loss_sum, got.loss_sum) << name;
  ExpectBitEqual(logits_d, dlogits_d, gpu, name + " dlogits in place vs out of place");

  // CrossEntropyMean: the sums over the count (one more double division).
  Tensor mean_grad_d = Tensor::Empty(shape, DType::kF32, kCuda);
  const double mean_gpu =
      CrossEntropyMean(logits.To(kCuda, gpu), targets_d, mean_grad_d, c.ignore_index, gpu);
  if (count > 0) {
    const double mean = ex.loss_sum / static_cast<double>(count);
    EXPECT_LE(std::fabs(mean_gpu - mean),
              ex.sum_bound / static_cast<double>(count) + std::ldexp(std::fabs(mean), -51))
        << name << ": mean " << mean_gpu;
  }
  ExpectGradNear(mean_grad_d, logits, targets, ex, static_cast<float>(scale), c.ignore_index,
                 gpu, name + " mean dlogits");
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
