// moe/experts.h: the forward against a naive per-token loop, every gradient against central
// finite differences of L = sum(y * dy), accumulation across micro-batches in flight, zero
// rows, layout-independent initialisation (an ep split holds the slices of the whole), and
// shared experts as one dense MLP equal to the sum of its copies.
#include "moe/experts.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <tuple>
#include <vector>

#include "engine/core/philox.h"
#include "kernels/random.h"
#include "tests/moe/moe_layer_test_util.h"
#include "tests/testing/tolerance.h"

namespace switchyard::moe {
namespace {

using testing::ExpectWithinBound;
using testing::MlpBound;
using testing::MlpWithBound;

constexpr int64_t kD = 4, kF = 6, kExperts = 3;
const std::vector<int64_t> kRows = {2, 0, 3};  // R = 5; expert 1 gets no rows
constexpr int64_t kR = 5;

// Central differences of the f32 forward with step 1e-2: truncation h^2/6 |L'''| and f32
// rounding of y (~1e-7 |y| per element over 2h) are both a few 1e-5 here; a missing or
// wrong gradient term is off by > 1e-2.
constexpr float kStep = 1e-2f;
constexpr double kFdAbsTol = 1e-4, kFdRelTol = 1e-3;

const Activation kActivations[] = {Activation::kGelu, Activation::kRelu, Activation::kSwiglu};

Tensor RandomTensor(const Shape& shape, uint64_t stream, float scale) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillUniform(t, RngKey{99, stream}, 0, -scale, scale);
  return t;
}

ExpertsOptions Options(Activation act, bool bias, int64_t first = 0, int64_t num = kExperts) {
  return ExpertsOptions{.d_model = kD,
                        .d_hidden = kF,
                        .activation = act,
                        .bias = bias,
                        .first = first,
                        .num_local = num};
}

// Experts with O(1) random parameters (the 0.02 init would make every gradient tiny).
Experts RandomExperts(Activation act, bool bias) {
  const int64_t l = kExperts;
  ExpertsParams p;
  p.w1 = RandomTensor({l, kD, kF}, 1, 0.8f);
  p.w2 = RandomTensor({l, kF, kD}, 2, 0.8f);
  if (act == Activation::kSwiglu) p.w3 = RandomTensor({l, kD, kF}, 3, 0.8f);
  if (bias) {
    p.b1 = RandomTensor({l, kF}, 4, 0.5f);
    p.b2 = RandomTensor({l, kD}, 5, 0.5f);
  }
  StatusOr<Experts> e = Experts::FromTensors(Options(act, bias), std::move(p));
  SY_CHECK_OK(e.status());
  return std::move(e).value();
}

std::string Name(Activation act, bool bias) {
  return StrCat(ActivationName(act), bias ? "+bias" : "");
}

// y = act(x W1[g] + b1[g]) W2[g] + b2[g] (swiglu: silu(x W1 + b1) * (x W3)), one token at
// a time in double, with the bound of any f32 evaluation (moe_layer_test_util.h).
MlpBound NaiveForward(const Experts& e, const Tensor& x, const std::vector<int64_t>& rows) {
  const int64_t d = e.options().d_model;
  MlpBound out;
  int64_t r = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    for (int64_t end = r + rows[g]; r < end; ++r) {
      const MlpBound row = MlpWithBound(e, static_cast<int64_t>(g), x.data<float>() + r * d);
      out.y.insert(out.y.end(), row.y.begin(), row.y.end());
      out.bound.insert(out.bound.end(), row.bound.begin(), row.bound.end());
    }
  }
  return out;
}

// Worst fraction of |got - want| <= abs + rel |want| used; prints and checks it.
void ExpectClose(const std::vector<float>& got, const std::vector<double>& want, double abs_tol,
                 double rel_tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double used = std::abs(got[i] - want[i]) / (abs_tol + rel_tol * std::abs(want[i]));
    if (used > worst) worst = used, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " is " << got[worst_i]
                        << ", expected " << want[worst_i];
  std::printf("%-22s tolerance used %.3f\n", what.c_str(), worst);
}

double Loss(const Experts& e, const Tensor& x, const std::vector<int64_t>& rows,
            const std::vector<float>& dy) {
  const std::vector<float> y = e.Forward(x, rows).y.ToVector<float>();
  double loss = 0.0;
  for (size_t i = 0; i < y.size(); ++i) loss += static_cast<double>(y[i]) * dy[i];
  return loss;
}

// d Loss / d t for every element of t (a parameter of e, or x), by central differences,
// writing through t's storage and restoring it.
std::vector<double> FiniteDifference(const Experts& e, Tensor t, const Tensor& x,
                                     const std::vector<int64_t>& rows,
                                     const std::vector<float>& dy) {
  float* p = t.data<float>();
  std::vector<double> grad(t.numel());
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float orig = p[i];
    const float plus = orig + kStep, minus = orig - kStep;
    p[i] = plus;
    const double lp = Loss(e, x, rows, dy);
    p[i] = minus;
    const double lm = Loss(e, x, rows, dy);
    p[i] = orig;
    grad[i] = (lp - lm) / (static_cast<double>(plus) - minus);
  }
  return grad;
}

TEST(ExpertsTest, ForwardMatchesNaivePerTokenLoop) {
  for (Activation act : kActivations) {
    for (bool bias : {false, true}) {
      Experts e = RandomExperts(act, bias);
      Tensor x = RandomTensor({kR, kD}, 10, 1.0f);
      ExpertsActivations acts = e.Forward(x, kRows);
      ASSERT_EQ(acts.y.shape(), (Shape{kR, kD}));
      const MlpBound ref = NaiveForward(e, x, kRows);
      ExpectWithinBound(acts.y.ToVector<float>(), ref.y, ref.bound, Name(act, bias) + " forward");
    }
  }
}

TEST(ExpertsTest, GradientsMatchFiniteDifferences) {
  for (Activation act : kActivations) {
    for (bool bias : {false, true}) {
      const std::string name = Name(act, bias);
      Experts e = RandomExperts(act, bias);
      // relu: L is piecewise linear in every input, so central differences are exact unless
      // a step crosses the kink. A step moves a pre-activation by at most kStep (|x| <= 1,
      // |w1| <= 0.8), so pick the first input with every |a| > 2 kStep.
      Tensor x;
      ExpertsActivations acts;
      for (uint64_t stream = 11; stream < 11 + 100 && !x.defined(); ++stream) {
        Tensor candidate = RandomTensor({kR, kD}, stream, 1.0f);
        acts = e.Forward(candidate, kRows);
        bool clear = true;
        for (float a : acts.a.ToVector<float>()) clear = clear && std::abs(a) > 2 * kStep;
        if (clear || act != Activation::kRelu) x = candidate;
      }
      ASSERT_TRUE(x.defined()) << "no input keeps relu's pre-activations off the kink";
      Tensor dy = RandomTensor({kR, kD}, 12, 1.0f);
      const std::vector<float> dyv = dy.ToVector<float>();
      Tensor dx = e.Backward(acts, dy);
      ExpectClose(dx.ToVector<float>(), FiniteDifference(e, x, x, kRows, dyv), kFdAbsTol, kFdRelTol,
                  name + " dx");
      for (const parallel::Parameter& p : e.Parameters()) {
        ExpectClose(p.grad.ToVector<float>(), FiniteDifference(e, p.value, x, kRows, dyv),
                    kFdAbsTol, kFdRelTol, name + " d" + p.name);
      }
      // The expert without rows gets exactly zero weight gradients.
      const std::vector<float> gw1 = e.grad_w1().ToVector<float>();
      for (int64_t i = kD * kF; i < 2 * kD * kF; ++i) ASSERT_EQ(gw1[i], 0.0f) << name;
    }
  }
}

// |A||B| of the weight-gradient product that Backward(acts, dy) adds into parameter `name`
// (grad_w = X^T D summed over each expert's rows, grad_b = the column sums of D), in double.
// Where D is the backward's internal da (w1, b1) or db (w3), |D| is replaced by an upper
// bound: dh = dy W2^T has |dh| <= (1 + gamma_f) |dy||W2^T|, da = act'(a) dh with |act'| <= 1.13
// (gelu), 1 (relu), 1.1 |b| (swiglu), db = silu(a) dh with |silu(a)| <= |a|; the factor 1.01
// covers the f32 roundings of dh and of the derivative.
std::vector<double> WeightGradScale(const Experts& e, const ExpertsActivations& acts,
                                    const Tensor& dy, const std::string& name) {
  const ExpertsOptions& o = e.options();
  const int64_t d = o.d_model, f = o.d_hidden, R = dy.dim(0);
  const std::vector<float> x = acts.x.ToVector<float>(), h = acts.h.ToVector<float>(),
                           a = acts.a.ToVector<float>(), g = dy.ToVector<float>(),
                           w2 = e.w2().ToVector<float>();
  const std::vector<float> b =
      acts.b.defined() ? acts.b.ToVector<float>() : std::vector<float>();
  // |D| (R, cols) for this parameter, and the X it multiplies (nullptr: a bias, X = 1).
  const bool hidden = name == "w1" || name == "b1" || name == "w3";
  const int64_t cols = hidden ? f : d;
  std::vector<double> D(R * cols);
  int64_t r = 0;
  for (size_t ex = 0; ex < acts.rows.size(); ++ex) {
    for (int64_t end = r + acts.rows[ex]; r < end; ++r) {
      for (int64_t j = 0; j < cols; ++j) {
        if (!hidden) {
          D[r * cols + j] = std::abs(g[r * d + j]);
          continue;
        }
        double dh = 0;  // (|dy||W2^T|)_rj
        for (int64_t i = 0; i < d; ++i) dh += std::abs(g[r * d + i] * w2[(ex * f + j) * d + i]);
        double slope = 1.0;
        if (name == "w3") {
          slope = std::abs(a[r * f + j]);
        } else if (o.activation == Activation::kGelu) {
          slope = testing::kGeluSlope;
        } else if (o.activation == Activation::kSwiglu) {
          slope = testing::kSiluSlope * std::abs(b[r * f + j]);
        }
        D[r * cols + j] = 1.01 * slope * dh;
      }
    }
  }
  const std::vector<float>* X = name == "w2" ? &h : name[0] == 'w' ? &x : nullptr;
  const int64_t xcols = name == "w2" ? f : d;
  const int64_t n = static_cast<int64_t>(acts.rows.size());
  std::vector<double> scale(X ? n * xcols * cols : n * cols, 0.0);
  r = 0;
  for (int64_t ex = 0; ex < n; ++ex) {
    for (int64_t end = r + acts.rows[ex]; r < end; ++r) {
      for (int64_t i = 0; i < (X ? xcols : 1); ++i) {
        const double xv = X ? std::abs((*X)[r * xcols + i]) : 1.0;
        for (int64_t j = 0; j < cols; ++j) {
          scale[(ex * (X ? xcols : 1) + i) * cols + j] += xv * D[r * cols + j];
        }
      }
    }
  }
  return scale;
}

TEST(ExpertsTest, GradientsAccumulateAcrossMicroBatchesInFlight) {
  for (Activation act : kActivations) {
    Experts e = RandomExperts(act, /*bias=*/true);
    const std::vector<int64_t> rows_b = {0, 3, 1};
    Tensor xa = RandomTensor({kR, kD}, 20, 1.0f), dya = RandomTensor({kR, kD}, 21, 1.0f);
    Tensor xb = RandomTensor({4, kD}, 22, 1.0f), dyb = RandomTensor({4, kD}, 23, 1.0f);

    // Each micro-batch alone.
    std::vector<std::vector<float>> alone;
    for (auto [x, rows, dy] : {std::tuple{xa, kRows, dya}, std::tuple{xb, rows_b, dyb}}) {
      e.ZeroGrad();
      e.Backward(e.Forward(x, rows), dy);
      for (const parallel::Parameter& p : e.Parameters()) alone.push_back(p.grad.ToVector<float>());
    }
    // Both in flight, backward in reverse order.
    e.ZeroGrad();
    ExpertsActivations a = e.Forward(xa, kRows);
    ExpertsActivations b = e.Forward(xb, rows_b);
    e.Backward(b, dyb);
    e.Backward(a, dya);
    // The last Backward computes fl(P_a + G_b) with G_b = b's gradient (bit for bit b's
    // alone: the same products into zeros); `alone` holds fl(P_a). Each is within
    // gamma_{k+2} (|A||B| + |G_b|) of its exact value, k <= the most rows of one expert in
    // a: the product bound with scale |A||B| + |G_b| (tolerance.h, c = 2).
    const std::vector<parallel::Parameter> params = e.Parameters();
    for (size_t i = 0; i < params.size(); ++i) {
      const std::vector<float> got = params[i].grad.ToVector<float>();
      const std::vector<float>& g_b = alone[params.size() + i];
      std::vector<double> want(got.size());
      for (size_t j = 0; j < got.size(); ++j) want[j] = static_cast<double>(alone[i][j]) + g_b[j];
      std::vector<double> scale = WeightGradScale(e, a, dya, params[i].name);
      test_util::AddAbsScaled(scale, 1.0, g_b);
      test_util::ExpectWithinProductBound(got, want, scale, /*k=*/*std::max_element(kRows.begin(), kRows.end()),
                                          Name(act, true) + " sum d" + params[i].name);
    }
  }
}

TEST(ExpertsTest, ZeroGradClearsEveryGradient) {
  Experts e = RandomExperts(Activation::kSwiglu, true);
  Tensor x = RandomTensor({kR, kD}, 30, 1.0f);
  e.Backward(e.Forward(x, kRows), RandomTensor({kR, kD}, 31, 1.0f));
  e.ZeroGrad();
  for (const parallel::Parameter& p : e.Parameters()) {
    for (float v : p.grad.ToVector<float>()) ASSERT_EQ(v, 0.0f) << p.name;
  }
}

TEST(ExpertsTest, NoRowsAtAll) {
  for (Activation act : kActivations) {
    Experts e = RandomExperts(act, true);
    const std::vector<int64_t> rows = {0, 0, 0};
    ExpertsActivations acts = e.Forward(Tensor::Empty({0, kD}, DType::kF32), rows);
    EXPECT_EQ(acts.y.shape(), (Shape{0, kD}));
    Tensor dx = e.Backward(acts, Tensor::Empty({0, kD}, DType::kF32));
    EXPECT_EQ(dx.shape(), (Shape{0, kD}));
    for (const parallel::Parameter& p : e.Parameters()) {
      for (float v : p.grad.ToVector<float>()) ASSERT_EQ(v, 0.0f) << p.name;
    }
  }
}

TEST(ExpertsTest, InitDoesNotDependOnTheSplit) {
  const int64_t num = 4;
  for (Activation act : kActivations) {
    Experts whole = Experts::Init(Options(act, true, 0, num), 1234, "layers.2.moe.experts");
    Experts lo = Experts::Init(Options(act, true, 0, num / 2), 1234, "layers.2.moe.experts");
    Experts hi = Experts::Init(Options(act, true, num / 2, num / 2), 1234, "layers.2.moe.experts");
    const std::vector<parallel::Parameter> pw = whole.Parameters(), pl = lo.Parameters(),
                                      ph = hi.Parameters();
    ASSERT_EQ(pw.size(), act == Activation::kSwiglu ? 5u : 4u);
    for (size_t i = 0; i < pw.size(); ++i) {
      SCOPED_TRACE(pw[i].name);
      EXPECT_EQ(pl[i].value.ToVector<float>(), pw[i].value.Slice(0, num / 2).ToVector<float>());
      EXPECT_EQ(ph[i].value.ToVector<float>(), pw[i].value.Slice(num / 2, num).ToVector<float>());
    }
    // Weights are N(0, 0.02^2) and differ between w1 and w2; biases start at zero.
    const std::vector<float> w1 = whole.w1().ToVector<float>(), w2 = whole.w2().ToVector<float>();
    double sum_sq = 0.0;
    for (float v : w1) sum_sq += static_cast<double>(v) * v;
    EXPECT_NEAR(std::sqrt(sum_sq / w1.size()), 0.02, 0.004);
    EXPECT_NE(w1, w2);
    for (float v : whole.b1().ToVector<float>()) ASSERT_EQ(v, 0.0f);
    for (float v : whole.b2().ToVector<float>()) ASSERT_EQ(v, 0.0f);
    // A different seed or name gives different weights.
    EXPECT_NE(Experts::Init(Options(act, true, 0, num), 1235, "layers.2.moe.experts")
                  .w1()
                  .ToVector<float>(),
              w1);
    EXPECT_NE(Experts::Init(Options(act, true, 0, num), 1234, "layers.3.moe.experts")
                  .w1()
                  .ToVector<float>(),
              w1);

    // The split computes what the whole computes.
    const std::vector<int64_t> rows = {2, 1, 0, 3};
    Tensor x = RandomTensor({6, kD}, 40, 1.0f);
    const std::vector<float> y = whole.Forward(x, rows).y.ToVector<float>();
    const std::vector<int64_t> rows_lo = {2, 1}, rows_hi = {0, 3};
    std::vector<float> y_split = lo.Forward(x.Slice(0, 3), rows_lo).y.ToVector<float>();
    const std::vector<float> y_hi = hi.Forward(x.Slice(3, 6), rows_hi).y.ToVector<float>();
    y_split.insert(y_split.end(), y_hi.begin(), y_hi.end());
    // Two f32 evaluations of the same MLPs (only the row counts of the products differ):
    // apart by at most twice the bound of one.
    ExpectWithinBound(y_split, y, NaiveForward(whole, x, rows).bound,
                      StrCat(ActivationName(act), " split forward"), /*factor=*/2.0);
  }
}

TEST(ExpertsTest, FromTensorsRejectsWhatDoesNotFit) {
  auto params = [](Activation act) {
    ExpertsParams p;
    p.w1 = Tensor::Zeros({kExperts, kD, kF}, DType::kF32);
    p.w2 = Tensor::Zeros({kExperts, kF, kD}, DType::kF32);
    if (act == Activation::kSwiglu) p.w3 = Tensor::Zeros({kExperts, kD, kF}, DType::kF32);
    return p;
  };
  EXPECT_TRUE(
      Experts::FromTensors(Options(Activation::kGelu, false), params(Activation::kGelu)).ok());

  ExpertsParams bad = params(Activation::kGelu);
  bad.w2 = Tensor::Zeros({kExperts, kD, kF}, DType::kF32);  // transposed
  Status s = Experts::FromTensors(Options(Activation::kGelu, false), bad).status();
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.message()).find("experts.w2 has shape (3, 4, 6), expected (3, 6, 4)"),
            std::string::npos)
      << s;

  s = Experts::FromTensors(Options(Activation::kSwiglu, false), params(Activation::kGelu)).status();
  EXPECT_NE(std::string(s.message()).find("experts.w3 is missing"), std::string::npos) << s;
  s = Experts::FromTensors(Options(Activation::kGelu, true), params(Activation::kGelu)).status();
  EXPECT_NE(std::string(s.message()).find("experts.b1 is missing"), std::string::npos) << s;
  s = Experts::FromTensors(Options(Activation::kGelu, false), params(Activation::kSwiglu)).status();
  EXPECT_NE(std::string(s.message()).find("experts.w3 given but not used"), std::string::npos) << s;

  ExpertsOptions o = Options(Activation::kGelu, false);
  o.d_hidden = 0;
  s = o.Validate();
  EXPECT_NE(std::string(s.message()).find("experts.d_hidden=0"), std::string::npos) << s;
}

TEST(ExpertsTest, ParameterNamesFollowTheOptions) {
  auto names = [](Activation act, bool bias) {
    std::vector<std::string> out;
    for (const parallel::Parameter& p : Experts(Options(act, bias)).Parameters()) out.push_back(p.name);
    return out;
  };
  EXPECT_EQ(names(Activation::kGelu, false), (std::vector<std::string>{"w1", "w2"}));
  EXPECT_EQ(names(Activation::kSwiglu, true),
            (std::vector<std::string>{"w1", "w2", "w3", "b1", "b2"}));
}

// Columns [c0, c0 + n) of the trailing dim of a (1, rows, cols) tensor -> (1, rows, n).
Tensor Columns(const Tensor& t, int64_t c0, int64_t n) {
  const int64_t rows = t.dim(1), cols = t.dim(2);
  const std::vector<float> v = t.ToVector<float>();
  std::vector<float> out;
  for (int64_t i = 0; i < rows; ++i)
    out.insert(out.end(), v.begin() + i * cols + c0, v.begin() + i * cols + c0 + n);
  return Tensor::FromVector(out, {1, rows, n});
}

// dx = dA W1^T (+ dB W3^T) of the one-expert MLP `e` for the rows x, dy, in double, with
// `bound`: |dx_f32 - dx| <= bound for the engine's f32 evaluation (experts.cc: dH = dY W2^T,
// the activation's backward, dx = dA W1^T, for swiglu + dB W3^T accumulated into it):
//   a, b: |da| <= gamma_{d+1} (|x||W1| + |b1|), |db| <= gamma_d |x||W3| (MlpWithBound);
//   dH:   |ddH| <= gamma_d |dy||W2^T|;
//   dA = dH g(a) (gelu, relu), dA = dH b g(a), dB = dH silu(a) (swiglu), g = act':
//     |ddA| <= |ddH| |g| + |dH| (|g'| |da| + e_g) (+ the b terms), first order, with
//     |gelu''| <= 0.8, |silu''| <= 0.5, |silu'| <= 1.1; e_g the f32 g's own error:
//     gelu: s = 1 / (1 + exp(-2 v)), g = s + 2 x s (1 - s) du: (12 |v| + 5) u on s as in
//     the forward, ~6 more roundings on the second term: (16 |v| + 16) u (s + |2 x s (1 - s)
//     du|), one more for the product with dH; swiglu: sigmoid 4u, then ~6 roundings: 16 u
//     (s + |a s (1 - s)|) |b|; relu: the mask is exact while |a| > |da| (asserted);
//   dx:   |ddx| <= gamma_{2f+1} (|dA||W1^T| + |dB||W3^T|) + |ddA||W1^T| + |ddB||W3^T|.
struct DxBound {
  std::vector<double> dx, bound;  // (rows, d)
};
DxBound NaiveInputGrad(const Experts& e, const Tensor& x, const Tensor& dy) {
  using testing::Gamma;
  using testing::kU;
  const ExpertsOptions& o = e.options();
  const int64_t d = o.d_model, f = o.d_hidden, R = x.dim(0);
  const float* w1 = e.w1().data<float>();
  const float* w2 = e.w2().data<float>();
  const float* w3 = e.w3().defined() ? e.w3().data<float>() : nullptr;
  const float* b1 = o.bias ? e.b1().data<float>() : nullptr;
  const std::vector<float> xv = x.ToVector<float>(), dyv = dy.ToVector<float>();
  const double c = std::sqrt(2.0 / M_PI);
  DxBound r{std::vector<double>(R * d, 0.0), std::vector<double>(R * d, 0.0)};
  for (int64_t t = 0; t < R; ++t) {
    const float* xt = &xv[t * d];
    const float* dyt = &dyv[t * d];
    std::vector<double> dA(f), dB(f, 0.0), edA(f), edB(f, 0.0);
    for (int64_t j = 0; j < f; ++j) {
      double a = b1 ? b1[j] : 0.0, sa = b1 ? std::abs(b1[j]) : 0.0, b = 0, sb = 0, dh = 0,
             sh = 0;
      for (int64_t i = 0; i < d; ++i) {
        a += double(xt[i]) * w1[i * f + j];
        sa += std::abs(double(xt[i]) * w1[i * f + j]);
        if (w3) b += double(xt[i]) * w3[i * f + j], sb += std::abs(double(xt[i]) * w3[i * f + j]);
        dh += double(dyt[i]) * w2[j * d + i];
        sh += std::abs(double(dyt[i]) * w2[j * d + i]);
      }
      const double ea = Gamma(b1 ? d + 1 : d) * sa, eb = Gamma(d) * sb, eh = Gamma(d) * sh;
      const double adh = std::abs(dh) + eh;  // |dH| of the f32 evaluation, at most
      switch (o.activation) {
        case Activation::kGelu: {
          const double v = c * (a + 0.044715 * a * a * a);
          const double s = 1.0 / (1.0 + std::exp(-2.0 * v));
          const double du = c * (1.0 + 3.0 * 0.044715 * a * a);
          const double second = 2.0 * a * s * (1.0 - s) * du, g = s + second;
          const double eg = (16 * std::abs(v) + 16) * kU * (s + std::abs(second));
          dA[j] = dh * g;
          edA[j] = eh * std::abs(g) + adh * (0.8 * ea + eg) + kU * adh * (std::abs(g) + eg);
          break;
        }
        case Activation::kRelu:
          EXPECT_GT(std::abs(a), 2 * ea) << "relu input too close to 0 for an exact mask";
          dA[j] = a > 0 ? dh : 0.0;
          edA[j] = a > 0 ? eh : 0.0;
          break;
        case Activation::kSwiglu: {
          const double s = 1.0 / (1.0 + std::exp(-a));
          const double g = s * (1.0 + a * (1.0 - s));  // silu'(a)
          const double ab = std::abs(b) + eb;
          dA[j] = dh * b * g;
          dB[j] = dh * a * s;
          edA[j] = eh * ab * std::abs(g) + adh * eb * std::abs(g) + adh * ab * 0.5 * ea +
                   16 * kU * adh * ab * (s + std::abs(a * s * (1.0 - s)));
          edB[j] = eh * std::abs(a * s) + adh * 1.1 * ea + 8 * kU * adh * std::abs(a * s);
          break;
        }
      }
    }
    for (int64_t i = 0; i < d; ++i) {
      double v = 0, mag = 0, carried = 0;
      for (int64_t j = 0; j < f; ++j) {
        v += dA[j] * w1[i * f + j] + (w3 ? dB[j] * w3[i * f + j] : 0.0);
        mag += (std::abs(dA[j]) + edA[j]) * std::abs(w1[i * f + j]) +
               (w3 ? (std::abs(dB[j]) + edB[j]) * std::abs(w3[i * f + j]) : 0.0);
        carried += edA[j] * std::abs(w1[i * f + j]) + (w3 ? edB[j] * std::abs(w3[i * f + j]) : 0.0);
      }
      r.dx[t * d + i] = v;
      r.bound[t * d + i] = testing::kSecondOrder * (Gamma(w3 ? 2 * f + 1 : f) * mag + carried);
    }
  }
  return r;
}

TEST(ExpertsTest, SharedExpertsAreOneDenseMlpEqualToTheSumOfTheCopies) {
  for (Activation act : kActivations) {
    for (bool bias : {false, true}) {
      MoEConfig config;
      config.d_model = kD;
      config.d_expert = 5;
      config.activation = act;
      config.bias = bias;
      config.num_shared_experts = 2;
      config.d_shared = 3;
      const ExpertsOptions shared = SharedExpertsOptions(config);
      ASSERT_EQ(shared.d_hidden, 6);
      ASSERT_EQ(shared.num_local, 1);
      DenseMlp mlp(Experts::Init(shared, 7, "layers.0.moe.shared", /*std=*/0.5f));
      const Experts& e = mlp.experts();
      if (bias) {                         // non-zero biases so they take part
        Tensor b1 = e.b1(), b2 = e.b2();  // handles sharing the parameters' storage
        kernels::FillUniform(b1, RngKey{1, 1}, 0, -0.5f, 0.5f);
        kernels::FillUniform(b2, RngKey{1, 2}, 0, -0.5f, 0.5f);
      }

      // The two copies, each of hidden 3: hidden units [3c, 3c + 3); copy 0 carries b2.
      ExpertsOptions copy_options = shared;
      copy_options.d_hidden = 3;
      Tensor x = RandomTensor({5, kD}, 50, 1.0f), dy = RandomTensor({5, kD}, 51, 1.0f);
      std::vector<double> y_sum(5 * kD, 0.0), dx_sum(5 * kD, 0.0);
      // |y - y_sum| <= the whole's forward bound + each copy's (all evaluate the same sum).
      std::vector<double> y_bound = NaiveForward(e, x, {5}).bound;
      // |dx - dx_sum| <= the whole's backward bound + each copy's (NaiveInputGrad).
      std::vector<double> dx_bound = NaiveInputGrad(e, x, dy).bound;
      for (int64_t c = 0; c < 2; ++c) {
        ExpertsParams p;
        p.w1 = Columns(e.w1(), 3 * c, 3);
        p.w2 = e.w2().Reshape({6, kD}).Slice(3 * c, 3 * c + 3).Clone().Reshape({1, 3, kD});
        if (act == Activation::kSwiglu) p.w3 = Columns(e.w3(), 3 * c, 3);
        if (bias) {
          p.b1 = Columns(e.b1().Reshape({1, 1, 6}), 3 * c, 3).Reshape({1, 3});
          p.b2 = c == 0 ? e.b2().Clone() : Tensor::Zeros({1, kD}, DType::kF32);
        }
        StatusOr<Experts> copy = Experts::FromTensors(copy_options, std::move(p));
        ASSERT_TRUE(copy.ok()) << copy.status();
        DenseMlp copy_mlp(std::move(copy).value());
        ExpertsActivations acts = copy_mlp.Forward(x);
        const std::vector<double> copy_bound = NaiveForward(copy_mlp.experts(), x, {5}).bound;
        const std::vector<double> copy_dx_bound = NaiveInputGrad(copy_mlp.experts(), x, dy).bound;
        for (size_t i = 0; i < y_bound.size(); ++i) {
          y_bound[i] += copy_bound[i];
          dx_bound[i] += copy_dx_bound[i];
        }
        const std::vector<float> y = acts.y.ToVector<float>(),
                                 dx = copy_mlp.Backward(acts, dy).ToVector<float>();
        for (size_t i = 0; i < y.size(); ++i) y_sum[i] += y[i], dx_sum[i] += dx[i];
      }
      ExpertsActivations acts = mlp.Forward(x);
      const std::string name = Name(act, bias);
      ExpectWithinBound(acts.y.ToVector<float>(), y_sum, y_bound, name + " shared y");
      ExpectWithinBound(mlp.Backward(acts, dy).ToVector<float>(), dx_sum, dx_bound,
                        name + " shared dx");
    }
  }
}

}  // namespace
}  // namespace switchyard::moe
