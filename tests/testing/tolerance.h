// Floating-point tolerances that hold by construction, whatever the summation order (the
// OpenBLAS core type, its block sizes, the number of threads, a layout's partial sums).
//
// A matrix product's forward error (Higham, "Accuracy and Stability of Numerical
// Algorithms", Theorem 3.5 / eq. 3.13): computed in any order, with or without FMA,
//   |fl(A B) - A B| <= gamma_k |A| |B|,   gamma_k = k u / (1 - k u) ~ k u,
// elementwise, with u = 2^-24 for f32. Two computed results (one thread vs three, one
// core type vs another, a layout vs one rank) differ by at most twice that. So each
// element is checked against c k u (|A| |B|)_ij, c = 2 by default, never against |C_ij|
// (which is ~0 where the sum cancels: an elementwise relative error there measures noise).
// Where no such scale is at hand, ‖got - want‖ / ‖want‖ is the other bound that means
// something. The checks report the worst fraction of the bound used (llm.c style).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

namespace switchyard::test_util {

// Unit roundoff of f32 (round to nearest): half its machine epsilon.
inline constexpr double kF32Unit = 0x1p-24;

// |op(A)| |op(B)| in double, (m, n) row-major, for row-major op(A) (m, k) and op(B) (k, n);
// trans_a: `a` is stored (k, m); trans_b: `b` is stored (n, k).
template <typename T>
std::vector<double> AbsProduct(const std::vector<T>& a, bool trans_a, const std::vector<T>& b,
                               bool trans_b, int64_t m, int64_t n, int64_t k) {
  std::vector<double> out(static_cast<size_t>(m * n), 0.0);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t p = 0; p < k; ++p) {
      const double x = std::abs(static_cast<double>(trans_a ? a[p * m + i] : a[i * k + p]));
      if (x == 0) continue;
      double* row = &out[i * n];
      for (int64_t j = 0; j < n; ++j) {
        row[j] += x * std::abs(static_cast<double>(trans_b ? b[j * k + p] : b[p * n + j]));
      }
    }
  }
  return out;
}

// out += |s| |c| elementwise (the beta C term of C = alpha A B + beta C).
template <typename T>
void AddAbsScaled(std::vector<double>& out, double s, const std::vector<T>& c) {
  for (size_t i = 0; i < out.size(); ++i) out[i] += std::abs(s) * std::abs(double(c[i]));
}

// The worst |got - want| / bound_i over the elements, bound_i = factor * scale_i, and where.
// A zero bound admits only equality; a non-finite value on either side uses infinity.
struct BoundUsed {
  double fraction = 0;
  size_t index = 0;
};

template <typename G, typename W>
BoundUsed WorstFractionOfBound(const std::vector<G>& got, const std::vector<W>& want,
                               const std::vector<double>& scale, double factor) {
  BoundUsed worst;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    const double diff = std::abs(g - w);
    double used;
    if (!std::isfinite(g) || !std::isfinite(w)) {
      used = std::numeric_limits<double>::infinity();
    } else if (diff == 0) {
      used = 0;
    } else {
      const double bound = factor * scale[i];
      used = bound > 0 ? diff / bound : std::numeric_limits<double>::infinity();
    }
    if (used > worst.fraction) worst = {used, i};
  }
  return worst;
}

// A product's forward-error bound: each |got - want| <= c (k + extra) u scale_i, where
// scale = |alpha| |A| |B| (+ |beta| |C0|) and k is the inner dimension. Each term of
// alpha A B + beta C0 takes at most k + 2 roundings on its way into the result in any
// summation tree (its product, alpha or beta, and at most k additions, OpenBLAS's k-blocks
// added into C included): gamma_{k+2}; `extra` = 3 adds one of slack for gamma's 1/(1 - nu).
// Fails with the worst element; prints the fraction of the bound used.
template <typename G, typename W>
void ExpectWithinProductBound(const std::vector<G>& got, const std::vector<W>& want,
                              const std::vector<double>& scale, int64_t k,
                              const std::string& what, double c = 2.0, int64_t extra = 3) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(scale.size(), want.size()) << what;
  const double factor = c * static_cast<double>(k + extra) * kF32Unit;
  const BoundUsed used = WorstFractionOfBound(got, want, scale, factor);
  if (want.empty()) return;
  EXPECT_LE(used.fraction, 1.0) << what << ": element " << used.index << " is "
                                << static_cast<double>(got[used.index]) << ", expected "
                                << static_cast<double>(want[used.index]) << ", bound "
                                << factor * scale[used.index] << " (" << c << " (k=" << k
                                << " + " << extra << ") u |A||B|)";
  std::printf("  %-40s product bound used %.3f\n", what.c_str(), used.fraction);
}

// ‖got - want‖ / ‖want‖ (2-norms, in double); 0 when equal, infinity when a value is not
// finite or want is all zeros and got is not.
template <typename G, typename W>
double RelativeNormError(const std::vector<G>& got, const std::vector<W>& want) {
  double d2 = 0, w2 = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    const double g = static_cast<double>(got[i]), w = static_cast<double>(want[i]);
    if (!std::isfinite(g) || !std::isfinite(w)) return std::numeric_limits<double>::infinity();
    d2 += (g - w) * (g - w);
    w2 += w * w;
  }
  if (d2 == 0) return 0;
  return w2 > 0 ? std::sqrt(d2 / w2) : std::numeric_limits<double>::infinity();
}

// ‖got - want‖ / ‖want‖ <= tol; prints the fraction of tol used.
template <typename G, typename W>
void ExpectRelativeNormWithin(const std::vector<G>& got, const std::vector<W>& want, double tol,
                              const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  const double rel = RelativeNormError(got, want);
  EXPECT_LE(rel, tol) << what << ": relative norm error " << rel;
  std::printf("  %-40s relative norm error %.3g (%.3f of %.1g)\n", what.c_str(), rel, rel / tol,
              tol);
}

}  // namespace switchyard::test_util
