// kernels/norm.h: layernorm and rmsnorm on a 1x4 row computed by hand, the forward against a
// double reference on random rows, every backward against central finite differences of the
// f32 forward, gradient accumulation (+=) and in-place use.
#include "kernels/norm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "kernels/elementwise.h"
#include "tests/kernels/grad_check.h"

namespace switchyard::kernels {
namespace {

using testing::Dot;
using testing::ExpectClose;
using testing::NumericGradient;
using testing::RandomTensor;

constexpr float kEps = 1e-5f;
constexpr int64_t kN = 5, kD = 7;
// Forward vs the double reference: a handful of f32 operations per element on O(1) values.
constexpr double kFwdAbsTol = 1e-5, kFwdRelTol = 1e-5;
// Central differences of the f32 forward, step 1e-2: truncation h^2/6 |L'''| ~ 1e-5 for rows
// with rstd ~ 2, and f32 rounding of L (35 terms of ~1e-7 each) over 2h ~ 2e-5. A wrong term
// in a gradient is off by > 1e-2.
constexpr float kStep = 1e-2f;
constexpr double kFdAbsTol = 1e-4, kFdRelTol = 1e-3;

Tensor F32(const Shape& shape) { return Tensor::Zeros(shape, DType::kF32); }

TEST(NormTest, LayerNormOneRowByHand) {
  // x = [1, 2, 3, 4]: mean 2.5, biased variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25.
  Tensor x = Tensor::FromVector<float>({1, 2, 3, 4}, {1, 4});
  Tensor w = Tensor::FromVector<float>({1.0f, 2.0f, 0.5f, -1.0f}, {4});
  Tensor b = Tensor::FromVector<float>({0.0f, 0.1f, -0.2f, 0.3f}, {4});
  Tensor y = F32({1, 4}), mean = F32({1}), rstd = F32({1});
  LayerNormForward(x, w, b, kEps, y, mean, rstd);
  const double r = 1.0 / std::sqrt(1.25 + 1e-5);
  const std::vector<double> want = {-1.5 * r * 1.0 + 0.0, -0.5 * r * 2.0 + 0.1, 0.5 * r * 0.5 - 0.2,
                                    1.5 * r * -1.0 + 0.3};
  ExpectClose(y.ToVector<float>(), want, 1e-6, 1e-6, "layernorm 1x4 by hand");
  EXPECT_FLOAT_EQ(mean.ToVector<float>()[0], 2.5f);
  EXPECT_NEAR(rstd.ToVector<float>()[0], r, 1e-6);
}

TEST(NormTest, RmsNormOneRowByHand) {
  // x = [1, 2, 3, 4]: mean square (1 + 4 + 9 + 16) / 4 = 7.5.
  Tensor x = Tensor::FromVector<float>({1, 2, 3, 4}, {1, 4});
  Tensor w = Tensor::FromVector<float>({1.0f, 2.0f, 0.5f, -1.0f}, {4});
  Tensor y = F32({1, 4}), rstd = F32({1});
  RmsNormForward(x, w, kEps, y, rstd);
  const double r = 1.0 / std::sqrt(7.5 + 1e-5);
  ExpectClose(y.ToVector<float>(), std::vector<double>{1 * r, 4 * r, 1.5 * r, -4 * r}, 1e-6, 1e-6,
              "rmsnorm 1x4 by hand");
  EXPECT_NEAR(rstd.ToVector<float>()[0], r, 1e-6);
}

// Row-by-row double reference of either norm.
std::vector<double> NaiveNorm(bool layernorm, const Tensor& x, const Tensor& w, const Tensor& b) {
  const std::vector<float> xv = x.ToVector<float>(), wv = w.ToVector<float>();
  const std::vector<float> bv = b.defined() ? b.ToVector<float>() : std::vector<float>(kD, 0.0f);
  std::vector<double> y(xv.size());
  for (int64_t r = 0; r < kN; ++r) {
    double mu = 0.0, var = 0.0;
    if (layernorm) {
      for (int64_t j = 0; j < kD; ++j) mu += xv[r * kD + j];
      mu /= kD;
    }
    for (int64_t j = 0; j < kD; ++j) var += (xv[r * kD + j] - mu) * (xv[r * kD + j] - mu);
    const double s = 1.0 / std::sqrt(var / kD + kEps);
    for (int64_t j = 0; j < kD; ++j) y[r * kD + j] = (xv[r * kD + j] - mu) * s * wv[j] + bv[j];
  }
  return y;
}

TEST(NormTest, ForwardMatchesDoubleReference) {
  Tensor x = RandomTensor({kN, kD}, 1, -2.0f, 2.0f);
  Tensor w = RandomTensor({kD}, 2, 0.5f, 1.5f), b = RandomTensor({kD}, 3);
  Tensor y = F32({kN, kD}), mean = F32({kN}), rstd = F32({kN});
  LayerNormForward(x, w, b, kEps, y, mean, rstd);
  ExpectClose(y.ToVector<float>(), NaiveNorm(true, x, w, b), kFwdAbsTol, kFwdRelTol,
              "layernorm forward");
  LayerNormForward(x, w, Tensor(), kEps, y, mean, rstd);
  ExpectClose(y.ToVector<float>(), NaiveNorm(true, x, w, Tensor()), kFwdAbsTol, kFwdRelTol,
              "layernorm forward, no bias");
  RmsNormForward(x, w, kEps, y, rstd);
  ExpectClose(y.ToVector<float>(), NaiveNorm(false, x, w, Tensor()), kFwdAbsTol, kFwdRelTol,
              "rmsnorm forward");
}

TEST(NormTest, LayerNormGradientsMatchFiniteDifferences) {
  Tensor x = RandomTensor({kN, kD}, 4, -2.0f, 2.0f);
  Tensor w = RandomTensor({kD}, 5, 0.5f, 1.5f), b = RandomTensor({kD}, 6);
  const std::vector<float> dy = RandomTensor({kN, kD}, 7).ToVector<float>();
  auto loss = [&] {
    Tensor y = F32({kN, kD}), mean = F32({kN}), rstd = F32({kN});
    LayerNormForward(x, w, b, kEps, y, mean, rstd);
    return Dot(y, dy);
  };
  Tensor y = F32({kN, kD}), mean = F32({kN}), rstd = F32({kN});
  LayerNormForward(x, w, b, kEps, y, mean, rstd);
  Tensor dx = F32({kN, kD}), dw = F32({kD}), db = F32({kD});
  Tensor dyt = Tensor::FromVector(dy, {kN, kD});
  LayerNormBackward(x, w, mean, rstd, dyt, dx, dw, db);
  ExpectClose(dx.ToVector<float>(), NumericGradient(x, loss, kStep), kFdAbsTol, kFdRelTol,
              "layernorm dx");
  ExpectClose(dw.ToVector<float>(), NumericGradient(w, loss, kStep), kFdAbsTol, kFdRelTol,
              "layernorm dweight");
  ExpectClose(db.ToVector<float>(), NumericGradient(b, loss, kStep), kFdAbsTol, kFdRelTol,
              "layernorm dbias");

  // A second backward accumulates into dweight/dbias and rewrites dx; in place (dx = dy) too.
  const std::vector<float> dw1 = dw.ToVector<float>(), db1 = db.ToVector<float>();
  const std::vector<float> dx1 = dx.ToVector<float>();
  Tensor inplace = dyt.Clone();
  LayerNormBackward(x, w, mean, rstd, inplace, inplace, dw, db);
  const std::vector<float> dw2 = dw.ToVector<float>(), db2 = db.ToVector<float>();
  for (int64_t j = 0; j < kD; ++j) {
    EXPECT_FLOAT_EQ(dw2[j], 2 * dw1[j]);
    EXPECT_FLOAT_EQ(db2[j], 2 * db1[j]);
  }
  EXPECT_EQ(inplace.ToVector<float>(), dx1);
}

TEST(NormTest, RmsNormGradientsMatchFiniteDifferences) {
  Tensor x = RandomTensor({kN, kD}, 8, -2.0f, 2.0f);
  Tensor w = RandomTensor({kD}, 9, 0.5f, 1.5f);
  const std::vector<float> dy = RandomTensor({kN, kD}, 10).ToVector<float>();
  auto loss = [&] {
    Tensor y = F32({kN, kD}), rstd = F32({kN});
    RmsNormForward(x, w, kEps, y, rstd);
    return Dot(y, dy);
  };
  Tensor y = F32({kN, kD}), rstd = F32({kN});
  RmsNormForward(x, w, kEps, y, rstd);
  Tensor dx = F32({kN, kD}), dw = F32({kD});
  Tensor dyt = Tensor::FromVector(dy, {kN, kD});
  RmsNormBackward(x, w, rstd, dyt, dx, dw);
  ExpectClose(dx.ToVector<float>(), NumericGradient(x, loss, kStep), kFdAbsTol, kFdRelTol,
              "rmsnorm dx");
  ExpectClose(dw.ToVector<float>(), NumericGradient(w, loss, kStep), kFdAbsTol, kFdRelTol,
              "rmsnorm dweight");
  Tensor inplace = dyt.Clone();
  RmsNormBackward(x, w, rstd, inplace, inplace, dw);
  EXPECT_EQ(inplace.ToVector<float>(), dx.ToVector<float>());
}

// Write::kAdd: dx += the gradient in the backward's own pass, the same bits as a fresh dx
// then Axpy(1, dx, acc) (the decoder's residual gradient), with the weight gradients as a
// fresh backward's; and refused when dx is dy's memory. 37 columns: the CPU's lane loop and
// its tail.
TEST(NormTest, BackwardAddingIntoDxEqualsBackwardThenAxpy) {
  constexpr int64_t n = 9, d = 37;
  const Tensor x = RandomTensor({n, d}, 20, -2.0f, 2.0f), w = RandomTensor({d}, 21, 0.5f, 1.5f);
  const Tensor b = RandomTensor({d}, 22), dy = RandomTensor({n, d}, 23);
  const Tensor acc0 = RandomTensor({n, d}, 24, -3.0f, 3.0f);
  for (bool layer : {true, false}) {
    Tensor y = F32({n, d}), mean = F32({n}), rstd = F32({n});
    if (layer) {
      LayerNormForward(x, w, b, kEps, y, mean, rstd);
    } else {
      RmsNormForward(x, w, kEps, y, rstd);
    }
    auto backward = [&](const Tensor& g, Tensor& dx, Tensor& dw, Tensor& db, Write write) {
      if (layer) {
        LayerNormBackward(x, w, mean, rstd, g, dx, dw, db, nullptr, write);
      } else {
        RmsNormBackward(x, w, rstd, g, dx, dw, nullptr, write);
      }
    };
    Tensor fresh = F32({n, d}), dw_fresh = F32({d}), db_fresh = F32({d});
    backward(dy, fresh, dw_fresh, db_fresh, Write::kSet);
    Tensor want = acc0.Clone();
    Axpy(1.0f, fresh, want);
    Tensor got = acc0.Clone(), dw = F32({d}), db = F32({d});
    backward(dy, got, dw, db, Write::kAdd);
    const char* name = layer ? "layernorm" : "rmsnorm";
    EXPECT_EQ(got.ToVector<float>(), want.ToVector<float>()) << name;
    EXPECT_EQ(dw.ToVector<float>(), dw_fresh.ToVector<float>()) << name;
    EXPECT_EQ(db.ToVector<float>(), db_fresh.ToVector<float>()) << name;
    Tensor same = dy.Clone();
    EXPECT_DEATH(backward(same, same, dw, db, Write::kAdd), "share memory") << name;
  }
}

TEST(NormTest, InPlaceForwardAndThreeDimensionalInput) {
  Tensor x = RandomTensor({2, 3, kD}, 11);
  Tensor w = RandomTensor({kD}, 12), b = RandomTensor({kD}, 13);
  Tensor y = F32({2, 3, kD}), mean = F32({6}), rstd = F32({6});
  LayerNormForward(x, w, b, kEps, y, mean, rstd);
  Tensor inplace = x.Clone();
  LayerNormForward(inplace, w, b, kEps, inplace, mean, rstd);
  EXPECT_EQ(inplace.ToVector<float>(), y.ToVector<float>());
}

TEST(NormDeathTest, WrongWeightSizeIsFatal) {
  Tensor x = F32({2, 4}), w = F32({3}), y = F32({2, 4}), rstd = F32({2});
  EXPECT_DEATH(RmsNormForward(x, w, kEps, y, rstd), "RmsNormForward");
}

}  // namespace
}  // namespace switchyard::kernels
