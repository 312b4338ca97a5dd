// Bounds for the cross-entropy gradient g_j = s (p_j - [j = target]), p = softmax(x), that
// scale with what each element is computed from (p_j, |p_j - onehot|), never an elementwise
// relative error (p_j is ~0 for most columns) nor an absolute floor.
//
// The CPU evaluations, u = 2^-24, m the row max (exact in f32), Lambda = max_k |x_k - m|:
//   kernels/cpu/cross_entropy.cc: e_j = VecExp(x_j - m) (the argument's rounding u |x_j - m|,
//     VecExp's 2 ulps: 4u), the sum in f32 lanes then double (gamma_V), the factor
//     f32(s / sum) and its product (2u), then the target's - s (u |g_j|):
//     |dg_j| <= s (p_j ((|x_j - m| + V + 8) u) + u |p_j - [j = t]|);
//   kernels/cpu/vocab_parallel.cc (any number R of shards): e_j = exp(f32(x_j - m)) in double
//     (u |x_j - m|), each shard's sum rounded to f32 and the R of them added in f32
//     ((R + 1) u + Lambda u relative on the sum, from every term's argument), p_j = f32(e_j) /
//     sum (2u), then - [j = t] (u |p_j - [j = t]|) and * s (u |g_j|):
//     |dg_j| <= s (p_j ((|x_j - m| + Lambda + R + 4) u) + 2u |p_j - [j = t]|).
// Two evaluations differ by at most the sum; with x 1.01 for second order, bound_j =
//   1.01 |s| (p_j (2 Lambda + V + R + 12) u + 3u |p_j - [j = t]|).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "tests/testing/tolerance.h"

namespace switchyard::test_util {

// (n, V) bound on |g_a - g_b| for two of the evaluations above of the rows of x (n, V) with
// targets t (ignored rows: 0, both write zeros), `shards` = R.
inline std::vector<double> CrossEntropyGradBound(const std::vector<float>& x, int64_t n,
                                                 int64_t v, const std::vector<int32_t>& t,
                                                 double grad_scale, int32_t ignore_index,
                                                 int64_t shards) {
  const double u = kF32Unit;
  std::vector<double> bound(n * v, 0.0);
  for (int64_t r = 0; r < n; ++r) {
    if (t[r] == ignore_index) continue;
    const float* row = x.data() + r * v;
    const double m = *std::max_element(row, row + v), lo = *std::min_element(row, row + v);
    const double lambda = m - lo;
    double sum = 0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(row[j] - m);
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(row[j] - m) / sum, onehot = j == t[r] ? 1.0 : 0.0;
      bound[r * v + j] = 1.01 * std::abs(grad_scale) *
                         (p * (2 * lambda + v + shards + 12) * u + 3 * u * std::abs(p - onehot));
    }
  }
  return bound;
}

// |got_i - want_i| <= bound_i; prints the worst fraction of the bound used.
template <typename G, typename W>
void ExpectWithinElementBound(const std::vector<G>& got, const std::vector<W>& want,
                              const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(bound.size(), want.size()) << what;
  if (want.empty()) return;
  const BoundUsed used = WorstFractionOfBound(got, want, bound, 1.0);
  EXPECT_LE(used.fraction, 1.0) << what << ": element " << used.index << " is "
                                << static_cast<double>(got[used.index]) << ", expected "
                                << static_cast<double>(want[used.index]) << ", bound "
                                << bound[used.index];
  std::printf("  %-40s bound used %.3f\n", what.c_str(), used.fraction);
}

}  // namespace switchyard::test_util
