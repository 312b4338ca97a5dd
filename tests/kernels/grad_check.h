// Test helpers shared by the kernel and dense-layer tests: random inputs from the Philox
// generator, closeness against a double reference with the fraction of the tolerance used
// printed (llm.c style), and central finite differences of a scalar loss.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/random.h"

namespace switchyard::testing {

// Uniform [lo, hi) f32 values keyed by `stream`.
inline Tensor RandomTensor(const Shape& shape, uint64_t stream, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillUniform(t, RngKey{2024, stream}, 0, lo, hi);
  return t;
}

// sum_i a[i] * w[i] in double: the scalar loss L = sum(y * dy) whose gradient with respect to
// y is dy.
inline double Dot(const Tensor& a, const std::vector<float>& w) {
  const std::vector<float> v = a.ToVector<float>();
  EXPECT_EQ(v.size(), w.size());
  double s = 0.0;
  for (size_t i = 0; i < v.size() && i < w.size(); ++i) s += static_cast<double>(v[i]) * w[i];
  return s;
}

// Worst |got - want| / (abs_tol + rel_tol |want|) over the elements; fails above 1 and prints
// the fraction used. Returns it.
template <typename Got, typename Want>
double ExpectClose(const std::vector<Got>& got, const std::vector<Want>& want, double abs_tol,
                   double rel_tol, const std::string& what) {
  EXPECT_EQ(got.size(), want.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < got.size() && i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double used = std::abs(g - w) / (abs_tol + rel_tol * std::abs(w));
    if (!(used <= worst)) worst = used, worst_i = i;  // NaN counts as worst
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " is "
                        << (got.empty() ? 0.0 : static_cast<double>(got[worst_i])) << ", expected "
                        << (want.empty() ? 0.0 : static_cast<double>(want[worst_i]));
  std::printf("  %-34s tolerance used %.3f\n", what.c_str(), worst);
  return worst;
}

// d loss / d t for every element of t by central differences with step h, writing through
// t's storage (so `loss` must read t) and restoring it. The denominator is the actual f32
// step, not 2h.
inline std::vector<double> NumericGradient(Tensor t, const std::function<double()>& loss, float h) {
  float* p = t.data<float>();
  std::vector<double> grad(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float orig = p[i];
    const float plus = orig + h, minus = orig - h;
    p[i] = plus;
    const double lp = loss();
    p[i] = minus;
    const double lm = loss();
    p[i] = orig;
    grad[i] = (lp - lm) / (static_cast<double>(plus) - minus);
  }
  return grad;
}

}  // namespace switchyard::testing
