// kernels/rope.h: the rotate-half pairing by hand (element i turns with element i + hd/2),
// position 0 is the identity, every pair keeps its norm, q_m . k_n depends only on m - n,
// Backward is the inverse rotation and matches central finite differences.
#include "kernels/rope.h"

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

constexpr int64_t kB = 2, kS = 6, kH = 3, kHd = 8, kHalf = kHd / 2;
// Central differences of a linear map: exact up to f32 rounding of L (B S H hd = 288 terms,
// ~1e-7 each) over 2h = 2e-2, i.e. ~1e-5.
constexpr float kStep = 1e-2f;
constexpr double kFdAbsTol = 1e-4, kFdRelTol = 1e-3;

Tensor Rope(const Tensor& x, int64_t offset = 0) {
  Tensor y = Tensor::Empty(x.shape(), DType::kF32);
  RopeForward(x, y, kRopeBase, offset);
  return y;
}

TEST(RopeTest, RotateHalfPairsByHand) {
  // hd = 4: theta_0 = 10000^0 = 1, theta_1 = 10000^(-2/4) = 0.01. At position 1, e_0 turns
  // into (cos 1) e_0 + (sin 1) e_2 and e_3 into -(sin 0.01) e_1 + (cos 0.01) e_3.
  // x (1, 2, 2, 4): sequence index 1 holds heads e_0 and e_3; index 0 is all zeros.
  std::vector<float> xv(16, 0.0f);
  xv[8 + 0] = 1.0f;      // (s=1, h=0, i=0)
  xv[8 + 4 + 3] = 1.0f;  // (s=1, h=1, i=3)
  Tensor x = Tensor::FromVector(xv, {1, 2, 2, 4});
  const std::vector<float> y = Rope(x).ToVector<float>();
  std::vector<double> want(16, 0.0);
  want[8 + 0] = std::cos(1.0);
  want[8 + 2] = std::sin(1.0);
  want[8 + 4 + 1] = -std::sin(0.01);
  want[8 + 4 + 3] = std::cos(0.01);
  ExpectClose(y, want, 1e-7, 1e-6, "rope pairs (i, i + hd/2)");
}

TEST(RopeTest, PositionZeroIsTheIdentity) {
  Tensor x = RandomTensor({kB, 1, kH, kHd}, 1);
  EXPECT_EQ(Rope(x).ToVector<float>(), x.ToVector<float>());
}

TEST(RopeTest, RotationPreservesPairNorms) {
  Tensor x = RandomTensor({kB, kS, kH, kHd}, 2);
  const std::vector<float> xv = x.ToVector<float>();
  const std::vector<float> yv = Rope(x, /*offset=*/100).ToVector<float>();
  std::vector<double> got, want;
  for (int64_t r = 0; r < kB * kS * kH; ++r) {
    for (int64_t i = 0; i < kHalf; ++i) {
      const int64_t a = r * kHd + i, b = a + kHalf;
      got.push_back(static_cast<double>(yv[a]) * yv[a] + static_cast<double>(yv[b]) * yv[b]);
      want.push_back(static_cast<double>(xv[a]) * xv[a] + static_cast<double>(xv[b]) * xv[b]);
    }
  }
  ExpectClose(got, want, 1e-7, 1e-6, "rope pair norms");
}

TEST(RopeTest, ScoresDependOnlyOnRelativePosition) {
  Tensor q = RandomTensor({1, 1, 1, kHd}, 3), k = RandomTensor({1, 1, 1, kHd}, 4);
  auto score = [&](int64_t m, int64_t n) { return Dot(Rope(q, m), Rope(k, n).ToVector<float>()); };
  for (int64_t delta : {0, 1, 3, 17}) {
    const double reference = score(delta, 0);
    std::vector<double> got;
    for (int64_t n : {1, 5, 40, 333}) got.push_back(score(n + delta, n));
    // f32 rotations of O(1) vectors at angles up to ~400 rad: cos/sin rounded to f32 move
    // each element by ~1e-7 relative.
    ExpectClose(got, std::vector<double>(got.size(), reference), 2e-6, 0.0,
                "q_m.k_n, m-n=" + std::to_string(delta));
  }
  // And it does depend on m - n.
  EXPECT_GT(std::abs(score(1, 0) - score(0, 0)), 1e-3);
}

TEST(RopeTest, BackwardIsTheInverseAndMatchesFiniteDifferences) {
  Tensor x = RandomTensor({kB, kS, kH, kHd}, 5);
  Tensor back = Rope(x, 7);
  RopeBackward(back, back, kRopeBase, 7);  // in place
  ExpectClose(back.ToVector<float>(), x.ToVector<float>(), 1e-6, 0.0, "rope^T rope x = x");

  const std::vector<float> dy = RandomTensor(x.shape(), 6).ToVector<float>();
  Tensor dx = Tensor::Empty(x.shape(), DType::kF32);
  RopeBackward(Tensor::FromVector(dy, x.shape()), dx, kRopeBase, 7);
  auto loss = [&] { return Dot(Rope(x, 7), dy); };
  ExpectClose(dx.ToVector<float>(), NumericGradient(x, loss, kStep), kFdAbsTol, kFdRelTol,
              "rope dx");
}

TEST(RopeDeathTest, OddHeadDimIsFatal) {
  Tensor x = Tensor::Zeros({1, 2, 1, 3}, DType::kF32);
  EXPECT_DEATH(Rope(x), "hd even");
}

}  // namespace
}  // namespace switchyard::kernels
