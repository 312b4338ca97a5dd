// kernels/softmax.h: rows sum to one and match exp(x) / sum exp(x) in double, large logits
// stay finite (the max is subtracted), the backward against central finite differences, and
// the row helpers' logsumexp.
#include "kernels/softmax.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "tests/kernels/grad_check.h"

namespace switchyard::kernels {
namespace {

using testing::Dot;
using testing::ExpectClose;
using testing::NumericGradient;
using testing::RandomTensor;

constexpr int64_t kN = 4, kC = 9;
// exp and one division per element in f32: a few ulp.
constexpr double kFwdAbsTol = 1e-7, kFwdRelTol = 1e-6;
// Central differences with step 1e-2 of the f32 forward: truncation h^2/6 |L'''| ~ 1e-6 for
// probabilities of O(0.1); f32 rounding of L over 2h ~ 1e-5.
constexpr float kStep = 1e-2f;
constexpr double kFdAbsTol = 5e-5, kFdRelTol = 1e-3;

std::vector<double> NaiveSoftmax(const std::vector<float>& x, int64_t c) {
  std::vector<double> y(x.size());
  for (size_t r = 0; r < x.size() / c; ++r) {
    double sum = 0.0;
    for (int64_t j = 0; j < c; ++j) sum += std::exp(static_cast<double>(x[r * c + j]));
    for (int64_t j = 0; j < c; ++j)
      y[r * c + j] = std::exp(static_cast<double>(x[r * c + j])) / sum;
  }
  return y;
}

TEST(SoftmaxTest, RowsSumToOneAndMatchExpOverSum) {
  Tensor x = RandomTensor({kN, kC}, 1, -3.0f, 3.0f);
  Tensor y = Tensor::Empty({kN, kC}, DType::kF32);
  SoftmaxForward(x, y);
  const std::vector<float> yv = y.ToVector<float>();
  ExpectClose(yv, NaiveSoftmax(x.ToVector<float>(), kC), kFwdAbsTol, kFwdRelTol,
              "softmax vs exp/sum");
  std::vector<double> sums(kN, 0.0);
  for (int64_t r = 0; r < kN; ++r)
    for (int64_t j = 0; j < kC; ++j) sums[r] += yv[r * kC + j];
  ExpectClose(sums, std::vector<double>(kN, 1.0), 1e-6, 0.0, "softmax row sums");
}

TEST(SoftmaxTest, LargeLogitsStayFinite) {
  // exp(1000) overflows f32 and double; shifted by the max the row is [e^-2, e^-1, 1] / sum.
  Tensor x = Tensor::FromVector<float>({998.0f, 999.0f, 1000.0f}, {1, 3});
  Tensor y = Tensor::Empty({1, 3}, DType::kF32);
  SoftmaxForward(x, y);
  const double s = std::exp(-2.0) + std::exp(-1.0) + 1.0;
  ExpectClose(y.ToVector<float>(),
              std::vector<double>{std::exp(-2.0) / s, std::exp(-1.0) / s, 1 / s}, kFwdAbsTol,
              kFwdRelTol, "softmax of large logits");
}

TEST(SoftmaxTest, RowHelperReturnsLogSumExp) {
  const std::vector<float> x = {0.5f, -1.0f, 2.0f, 0.0f};
  std::vector<float> y(4);
  const float lse = cpu::SoftmaxRow(x.data(), y.data(), 4);
  double sum = 0.0;
  for (float v : x) sum += std::exp(static_cast<double>(v));
  EXPECT_NEAR(lse, std::log(sum), 1e-6);
}

TEST(SoftmaxTest, BackwardMatchesFiniteDifferences) {
  Tensor x = RandomTensor({kN, kC}, 2, -2.0f, 2.0f);
  const std::vector<float> dy = RandomTensor({kN, kC}, 3).ToVector<float>();
  auto loss = [&] {
    Tensor y = Tensor::Empty({kN, kC}, DType::kF32);
    SoftmaxForward(x, y);
    return Dot(y, dy);
  };
  Tensor y = Tensor::Empty({kN, kC}, DType::kF32);
  SoftmaxForward(x, y);
  Tensor dyt = Tensor::FromVector(dy, {kN, kC});
  Tensor dx = Tensor::Empty({kN, kC}, DType::kF32);
  SoftmaxBackward(y, dyt, dx);
  ExpectClose(dx.ToVector<float>(), NumericGradient(x, loss, kStep), kFdAbsTol, kFdRelTol,
              "softmax dx");
  // In place: dx written over dy.
  SoftmaxBackward(y, dyt, dyt);
  EXPECT_EQ(dyt.ToVector<float>(), dx.ToVector<float>());
  // In place forward.
  Tensor inplace = x.Clone();
  SoftmaxForward(inplace, inplace);
  EXPECT_EQ(inplace.ToVector<float>(), y.ToVector<float>());
}

}  // namespace
}  // namespace switchyard::kernels
