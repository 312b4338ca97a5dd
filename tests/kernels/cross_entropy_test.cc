// kernels/cross_entropy.h: log(V) for uniform logits, the loss against -log softmax in
// double, ignored targets excluded from the sum, the count and the gradient, the fused
// gradient against central finite differences of the mean, in-place use, and large logits.
#include "kernels/cross_entropy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/kernels/grad_check.h"

namespace switchyard::kernels {
namespace {

using testing::ExpectClose;
using testing::NumericGradient;
using testing::RandomTensor;

constexpr int64_t kN = 6, kV = 7;
// The loss is a double sum of f32 log-sum-exps: relative error ~1e-7.
constexpr double kLossTol = 1e-6;
// Central differences of the mean loss (accumulated in double from f32 logits), step 1e-2:
// truncation h^2/6 |L'''| ~ 1e-6 for probabilities of O(0.1) over N = 6 rows.
constexpr float kStep = 1e-2f;
constexpr double kFdAbsTol = 2e-5, kFdRelTol = 1e-3;

// -log softmax(x)[t] for one row in double.
double NaiveRowLoss(const std::vector<float>& x, int64_t r, int32_t t) {
  double sum = 0.0;
  for (int64_t j = 0; j < kV; ++j) sum += std::exp(static_cast<double>(x[r * kV + j]));
  return std::log(sum) - x[r * kV + t];
}

TEST(CrossEntropyTest, UniformLogitsGiveLogV) {
  Tensor logits = Tensor::Zeros({kN, kV}, DType::kF32);
  for (int64_t i = 0; i < logits.numel(); ++i) logits.data<float>()[i] = 3.25f;
  Tensor targets = Tensor::FromVector<int32_t>({0, 6, 3, 3, 1, 2}, {kN});
  CrossEntropySums sums = CrossEntropyForward(logits, targets);
  EXPECT_EQ(sums.count, kN);
  EXPECT_NEAR(sums.Mean(), std::log(static_cast<double>(kV)), kLossTol);
  std::printf("  uniform logits: loss %.9f, log V %.9f\n", sums.Mean(), std::log(7.0));
}

TEST(CrossEntropyTest, MatchesNegativeLogSoftmaxAndSkipsIgnoredTargets) {
  Tensor logits = RandomTensor({2, 3, kV}, 1, -4.0f, 4.0f);  // (B, S, V) read as N = 6 rows
  const std::vector<int32_t> t = {2, -1, 0, 6, -1, 4};
  Tensor targets = Tensor::FromVector(t, {2, 3});
  const std::vector<float> x = logits.ToVector<float>();
  double want = 0.0;
  for (int64_t r = 0; r < kN; ++r)
    if (t[r] != -1) want += NaiveRowLoss(x, r, t[r]);
  want /= 4.0;  // four counted targets
  Tensor dlogits = Tensor::Empty(logits.shape(), DType::kF32);
  const double mean = CrossEntropyMean(logits, targets, dlogits);
  EXPECT_EQ(CountTargets(targets), 4);
  ExpectClose(std::vector<double>{mean}, std::vector<double>{want}, 0.0, kLossTol, "mean loss");
  // Ignored rows have no gradient; counted rows sum to zero (softmax minus one-hot).
  const std::vector<float> g = dlogits.ToVector<float>();
  for (int64_t r = 0; r < kN; ++r) {
    double row = 0.0;
    for (int64_t j = 0; j < kV; ++j) {
      row += g[r * kV + j];
      if (t[r] == -1) {
        EXPECT_EQ(g[r * kV + j], 0.0f) << "row " << r;
      }
    }
    EXPECT_NEAR(row, 0.0, 1e-7);
  }
  // Another ignore index: -1 is then an error, so use 3 as the masked target.
  Tensor t3 = Tensor::FromVector<int32_t>({2, 3, 0, 6, 3, 4}, {kN});
  CrossEntropySums s3 = CrossEntropyForward(logits, t3, /*ignore_index=*/3);
  EXPECT_EQ(s3.count, 4);
  EXPECT_NEAR(s3.Mean(), want, kLossTol);
}

TEST(CrossEntropyTest, GradientMatchesFiniteDifferencesOfTheMean) {
  Tensor logits = RandomTensor({kN, kV}, 2, -2.0f, 2.0f);
  Tensor targets = Tensor::FromVector<int32_t>({1, 4, -1, 0, 6, 6}, {kN});
  Tensor dlogits = Tensor::Empty({kN, kV}, DType::kF32);
  CrossEntropyMean(logits, targets, dlogits);
  auto loss = [&] { return CrossEntropyForward(logits, targets).Mean(); };
  ExpectClose(dlogits.ToVector<float>(), NumericGradient(logits, loss, kStep), kFdAbsTol, kFdRelTol,
              "cross-entropy dlogits");

  // grad_scale scales; in place (dlogits = logits) gives the same values.
  Tensor scaled = Tensor::Empty({kN, kV}, DType::kF32);
  CrossEntropySums sums = CrossEntropyForwardBackward(logits, targets, scaled, 0.5);
  Tensor inplace = logits.Clone();
  CrossEntropySums sums2 = CrossEntropyForwardBackward(inplace, targets, inplace, 0.5);
  EXPECT_EQ(sums.loss_sum, sums2.loss_sum);
  EXPECT_EQ(inplace.ToVector<float>(), scaled.ToVector<float>());
  const std::vector<float> a = dlogits.ToVector<float>(), b = scaled.ToVector<float>();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(b[i], a[i] * 5 * 0.5, 1e-7);  // mean: 1/5
}

TEST(CrossEntropyTest, LargeLogitsAndAllIgnored) {
  Tensor logits = Tensor::FromVector<float>({1000.0f, 0.0f, -1000.0f}, {1, 3});
  Tensor target = Tensor::FromVector<int32_t>({1}, {1});
  EXPECT_NEAR(CrossEntropyForward(logits, target).Mean(), 1000.0, 1e-9);
  Tensor ignored = Tensor::FromVector<int32_t>({-1}, {1});
  Tensor d = Tensor::Empty({1, 3}, DType::kF32);
  EXPECT_EQ(CrossEntropyMean(logits, ignored, d), 0.0);
  EXPECT_EQ(d.ToVector<float>(), std::vector<float>(3, 0.0f));
}

TEST(CrossEntropyDeathTest, TargetOutsideTheVocabularyIsFatal) {
  Tensor logits = Tensor::Zeros({1, 3}, DType::kF32);
  Tensor target = Tensor::FromVector<int32_t>({3}, {1});
  EXPECT_DEATH(CrossEntropyForward(logits, target), "outside the vocabulary");
}

}  // namespace
}  // namespace switchyard::kernels
