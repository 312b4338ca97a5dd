// kernels/activation.h: values at hand-computed points, every backward against central
// finite differences of the f32 forward kernel, in-place use, and the bias add and its
// gradient against explicit sums.
#include "kernels/activation.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "kernels/random.h"

namespace switchyard::kernels {
namespace {

// Central differences of the f32 forward with step h = 1e-2: truncation h^2/6 |f'''|
// <= ~3e-5 for these functions on [-3, 3], f32 rounding ~1e-7 / h = 1e-5. The tolerance
// below leaves ~5x headroom; a wrong derivative term is off by > 1e-2.
constexpr float kStep = 1e-2f;
constexpr double kFdAbsTol = 5e-5;
constexpr double kFdRelTol = 5e-4;

Tensor RandomTensor(const Shape& shape, uint64_t stream, float lo = -3.0f, float hi = 3.0f) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  FillUniform(t, RngKey{11, stream}, 0, lo, hi);
  return t;
}

// Worst |got - want| / (abs + rel |want|) over the elements (<= 1 passes), with its index.
struct Used {
  double fraction = 0.0;
  size_t index = 0;
};
Used ToleranceUsed(const std::vector<float>& got, const std::vector<double>& want, double abs_tol,
                   double rel_tol) {
  Used worst;
  for (size_t i = 0; i < got.size(); ++i) {
    const double used = std::abs(got[i] - want[i]) / (abs_tol + rel_tol * std::abs(want[i]));
    if (used > worst.fraction) worst = {used, i};
  }
  return worst;
}

// The finite-difference gradient of L = sum(forward(x) * dy) with respect to x, computed
// element by element through the f32 forward kernel (elementwise, so one perturbation of
// the whole tensor per sign suffices).
std::vector<double> FiniteDifference(const std::function<void(const Tensor&, Tensor&)>& forward,
                                     const Tensor& x, const Tensor& dy) {
  const std::vector<float> xv = x.ToVector<float>(), dyv = dy.ToVector<float>();
  std::vector<float> plus(xv), minus(xv);
  for (size_t i = 0; i < xv.size(); ++i) plus[i] += kStep, minus[i] -= kStep;
  Tensor xp = Tensor::FromVector(plus, x.shape()), xm = Tensor::FromVector(minus, x.shape());
  Tensor yp = Tensor::Empty(x.shape(), DType::kF32), ym = Tensor::Empty(x.shape(), DType::kF32);
  forward(xp, yp);
  forward(xm, ym);
  const std::vector<float> ypv = yp.ToVector<float>(), ymv = ym.ToVector<float>();
  std::vector<double> grad(xv.size());
  for (size_t i = 0; i < xv.size(); ++i) {
    // The actual f32 step, not 2h: x +- h rounds.
    const double step = static_cast<double>(plus[i]) - minus[i];
    grad[i] = (static_cast<double>(ypv[i]) - ymv[i]) / step * dyv[i];
  }
  return grad;
}

void ExpectMatchesFiniteDifference(const Tensor& analytic, const std::vector<double>& numeric,
                                   const std::string& what) {
  Used used = ToleranceUsed(analytic.ToVector<float>(), numeric, kFdAbsTol, kFdRelTol);
  EXPECT_LE(used.fraction, 1.0) << what << ": element " << used.index << " analytic "
                                << analytic.ToVector<float>()[used.index] << " vs numeric "
                                << numeric[used.index];
  std::printf("%-24s finite-difference tolerance used: %.3f\n", what.c_str(), used.fraction);
}

TEST(ActivationTest, GeluAtHandComputedPoints) {
  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) evaluated in double.
  Tensor x = Tensor::FromVector<float>({0.0f, 1.0f, -1.0f, 2.0f, -3.0f, 0.5f}, {2, 3});
  const std::vector<double> want = {0.0,          0.8411919906,  -0.1588080094,
                                    1.9545976941, -0.0036373921, 0.3457140098};
  Tensor y = Tensor::Empty({2, 3}, DType::kF32);
  GeluForward(x, y);
  const std::vector<float> got = y.ToVector<float>();
  EXPECT_EQ(got[0], 0.0f);
  for (size_t i = 0; i < want.size(); ++i)
    EXPECT_NEAR(got[i], want[i], 1e-6) << "x=" << x.ToVector<float>()[i];
}

TEST(ActivationTest, ReluAndSwigluAtHandComputedPoints) {
  Tensor x = Tensor::FromVector<float>({-2.0f, 0.0f, 1.5f}, {3});
  Tensor y = Tensor::Empty({3}, DType::kF32);
  ReluForward(x, y);
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{0.0f, 0.0f, 1.5f}));

  // silu(1) = 1 / (1 + e^-1) = 0.7310585786, silu(-2) = -2 / (1 + e^2) = -0.2384058440.
  Tensor a = Tensor::FromVector<float>({1.0f, -2.0f, 0.0f}, {3});
  Tensor b = Tensor::FromVector<float>({2.0f, 1.0f, 5.0f}, {3});
  Tensor out = Tensor::Empty({3}, DType::kF32);
  SwigluForward(a, b, out);
  const std::vector<float> got = out.ToVector<float>();
  EXPECT_NEAR(got[0], 1.4621171573, 1e-6);
  EXPECT_NEAR(got[1], -0.2384058440, 1e-6);
  EXPECT_EQ(got[2], 0.0f);
}

TEST(ActivationTest, GeluBackwardMatchesFiniteDifferences) {
  Tensor x = RandomTensor({7, 9}, 1), dy = RandomTensor({7, 9}, 2, -1.0f, 1.0f);
  Tensor dx = Tensor::Empty(x.shape(), DType::kF32);
  GeluBackward(x, dy, dx);
  ExpectMatchesFiniteDifference(
      dx, FiniteDifference([](const Tensor& in, Tensor& out) { GeluForward(in, out); }, x, dy),
      "gelu");
}

TEST(ActivationTest, ReluBackwardMatchesFiniteDifferences) {
  Tensor x = RandomTensor({5, 11}, 3), dy = RandomTensor({5, 11}, 4, -1.0f, 1.0f);
  // Central differences straddle the kink only within kStep of 0; keep the points away.
  for (float v : x.ToVector<float>())
    ASSERT_GT(std::abs(v), 2 * kStep) << "test input too close to 0";
  Tensor dx = Tensor::Empty(x.shape(), DType::kF32);
  ReluBackward(x, dy, dx);
  ExpectMatchesFiniteDifference(
      dx, FiniteDifference([](const Tensor& in, Tensor& out) { ReluForward(in, out); }, x, dy),
      "relu");
  // At exactly 0 the subgradient is 0.
  Tensor zero = Tensor::FromVector<float>({0.0f}, {1}),
         one = Tensor::FromVector<float>({1.0f}, {1});
  Tensor dz = Tensor::Empty({1}, DType::kF32);
  ReluBackward(zero, one, dz);
  EXPECT_EQ(dz.ToVector<float>()[0], 0.0f);
}

TEST(ActivationTest, SwigluBackwardMatchesFiniteDifferences) {
  Tensor a = RandomTensor({6, 8}, 5), b = RandomTensor({6, 8}, 6);
  Tensor dout = RandomTensor({6, 8}, 7, -1.0f, 1.0f);
  Tensor da = Tensor::Empty(a.shape(), DType::kF32), db = Tensor::Empty(a.shape(), DType::kF32);
  SwigluBackward(a, b, dout, da, db);
  ExpectMatchesFiniteDifference(
      da,
      FiniteDifference([&](const Tensor& in, Tensor& out) { SwigluForward(in, b, out); }, a, dout),
      "swiglu da");
  ExpectMatchesFiniteDifference(
      db,
      FiniteDifference([&](const Tensor& in, Tensor& out) { SwigluForward(a, in, out); }, b, dout),
      "swiglu db");
}

TEST(ActivationTest, InPlaceMatchesOutOfPlace) {
  Tensor x = RandomTensor({4, 5}, 8), dy = RandomTensor({4, 5}, 9, -1.0f, 1.0f);
  Tensor y = Tensor::Empty(x.shape(), DType::kF32), dx = Tensor::Empty(x.shape(), DType::kF32);
  GeluForward(x, y);
  GeluBackward(x, dy, dx);
  Tensor inplace = x.Clone();
  GeluForward(inplace, inplace);
  EXPECT_EQ(inplace.ToVector<float>(), y.ToVector<float>());
  Tensor dinplace = dy.Clone();
  GeluBackward(x, dinplace, dinplace);
  EXPECT_EQ(dinplace.ToVector<float>(), dx.ToVector<float>());

  // Swiglu's da written over dout, as the experts' backward does.
  Tensor b = RandomTensor({4, 5}, 10);
  Tensor da = Tensor::Empty(x.shape(), DType::kF32), db = Tensor::Empty(x.shape(), DType::kF32);
  SwigluBackward(x, b, dy, da, db);
  Tensor da_inplace = dy.Clone(), db2 = Tensor::Empty(x.shape(), DType::kF32);
  SwigluBackward(x, b, da_inplace, da_inplace, db2);
  EXPECT_EQ(da_inplace.ToVector<float>(), da.ToVector<float>());
  EXPECT_EQ(db2.ToVector<float>(), db.ToVector<float>());
}

TEST(ActivationTest, BiasAddAndGrad) {
  Tensor out = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  AddBias(out, Tensor::FromVector<float>({10, 20}, {2}));
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{11, 22, 13, 24, 15, 26}));

  Tensor dy = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor db = Tensor::FromVector<float>({100, 200}, {2});
  BiasGrad(dy, db);  // beta = 0 overwrites
  EXPECT_EQ(db.ToVector<float>(), (std::vector<float>{9, 12}));
  BiasGrad(dy, db, 1.0f);  // beta = 1 accumulates
  EXPECT_EQ(db.ToVector<float>(), (std::vector<float>{18, 24}));
}

TEST(ActivationTest, GroupedBiasAddAndGradWithEmptyGroup) {
  const std::vector<int64_t> rows = {1, 0, 2};
  Tensor out = Tensor::Zeros({3, 2}, DType::kF32);
  Tensor bias = Tensor::FromVector<float>({1, 2, 30, 40, 5, 6}, {3, 2});
  GroupedAddBias(out, rows, bias);
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{1, 2, 5, 6, 5, 6}));

  Tensor dy = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor db = Tensor::FromVector<float>({NAN, NAN, 7, 7, NAN, NAN}, {3, 2});
  GroupedBiasGrad(dy, rows, db);  // beta = 0: NaNs overwritten, the empty group zeroed
  EXPECT_EQ(db.ToVector<float>(), (std::vector<float>{1, 2, 0, 0, 8, 10}));
  Tensor acc = Tensor::FromVector<float>({1, 1, 7, 7, 1, 1}, {3, 2});
  GroupedBiasGrad(dy, rows, acc, 1.0f);  // the empty group keeps its value
  EXPECT_EQ(acc.ToVector<float>(), (std::vector<float>{2, 3, 7, 7, 9, 11}));
}

// The device-sized overloads: the same values on the grouped rows; the row after the last
// group neither gets a bias nor adds to one.
TEST(ActivationTest, GroupedBiasByOffsetsLeavesRowsOutsideTheGroups) {
  const Tensor offsets = Tensor::FromVector<int64_t>({0, 1, 1, 3}, {4});
  Tensor out = Tensor::Zeros({4, 2}, DType::kF32);
  Tensor bias = Tensor::FromVector<float>({1, 2, 30, 40, 5, 6}, {3, 2});
  GroupedAddBias(out, offsets, bias);
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{1, 2, 5, 6, 5, 6, 0, 0}));

  Tensor dy = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6, NAN, NAN}, {4, 2});
  Tensor db = Tensor::FromVector<float>({NAN, NAN, 7, 7, NAN, NAN}, {3, 2});
  GroupedBiasGrad(dy, offsets, db);
  EXPECT_EQ(db.ToVector<float>(), (std::vector<float>{1, 2, 0, 0, 8, 10}));
  Tensor acc = Tensor::FromVector<float>({1, 1, 7, 7, 1, 1}, {3, 2});
  GroupedBiasGrad(dy, offsets, acc, 1.0f);
  EXPECT_EQ(acc.ToVector<float>(), (std::vector<float>{2, 3, 7, 7, 9, 11}));
  EXPECT_DEATH(GroupedAddBias(out, Tensor::FromVector<int64_t>({0, 1, 1, 5}, {4}), bias),
               "GroupedAddBias: offsets\\[3\\] = 5");
}

}  // namespace
}  // namespace switchyard::kernels
