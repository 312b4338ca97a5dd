// Bounds by construction for the CUDA cross-entropy kernel (kernels/cuda/cross_entropy.cu)
// against the exact values of its f32 inputs, shared by its emulation test (the device code
// on the host model, tests/kernels/embedding_emulation_test.cc) and its GPU test
// (tests/gpu/cross_entropy_gpu_test.cc). Per counted row of x (V logits), target t:
//  - the loss: S = sum of expf(fl(x - max)) in double, each term within (4u + u R) relative
//    (expf's 2 ulp; the rounded difference, R = max |x - max|); |log S' - log S| is within
//    S's relative error (1% added for the second-order terms), and the double operations
//    after it add a few units of 2^-53 of the magnitudes (`slack`);
//  - dlogits[j] = fl(scale expf(fl(x_j - float(lse)))), relative to scale p_j
//    (p = exp(x - lse)): the loss's error, lse rounded to f32 (u |lse|), x_j - lse_f rounded
//    (u |x_j - lse|), expf (4u), the product and the scale's cast to f32 (2u); at the target
//    the subtraction of the f32 scale adds u of the result and u of the scale.
// u = 2^-24. (The CPU twin sums in 16 f32 lanes first, whose worst case is gamma(V / 16 + 1):
// 1.9e-4 at V = 50257, so the GPU test compares with these exact values, not with the CPU.)
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

namespace switchyard::kernels::ce_bound {

constexpr double kU = 0x1p-24;   // f32 unit roundoff
constexpr double kUd = 0x1p-53;  // f64 unit roundoff

// gamma(m) = m u / (1 - m u): a sum of m terms' relative error.
inline double Gamma(double m, double u = kU) { return m * u / (1.0 - m * u); }

// One counted row's exact values (double) and the kernel's bounds.
struct RowBounds {
  double lse = 0.0, loss = 0.0;  // exact
  double range = 0.0;            // max |x - max|
  double log_gpu = 0.0;          // S's relative error, so log S's absolute error
  double slack = 0.0;            // the double operations after the sum
  double loss_bound() const { return log_gpu + slack; }
};

inline RowBounds BoundsOf(const float* x, int64_t v, int32_t t) {
  float max = x[0];
  for (int64_t j = 1; j < v; ++j) max = std::max(max, x[j]);
  double sum = 0.0, range = 0.0;
  for (int64_t j = 0; j < v; ++j) {
    sum += std::exp(static_cast<double>(x[j]) - max);
    range = std::max(range, static_cast<double>(max) - x[j]);
  }
  RowBounds b;
  b.lse = max + std::log(sum);
  b.loss = b.lse - x[t];
  b.range = range;
  b.log_gpu = 1.01 * (4 * kU + kU * range);
  b.slack = 8 * kUd * (std::fabs(max) + std::fabs(std::log(sum)) + std::fabs(x[t]) + 1.0);
  return b;
}

// The kernel's gradient element j of a counted row: its exact value and its bound, given
// the value `got` (|got| enters the target's subtraction).
struct GradBound {
  double exact = 0.0, bound = 0.0;
};
inline GradBound GpuGradBound(const RowBounds& b, float xj, double scale, bool target,
                              float got) {
  const double p = std::exp(static_cast<double>(xj) - b.lse);
  const double eps = 1.01 * (b.loss_bound() + kU * std::fabs(b.lse) +
                             kU * std::fabs(xj - b.lse) + 6 * kU);
  GradBound g;
  g.exact = scale * (p - (target ? 1.0 : 0.0));
  g.bound = eps * scale * p + (target ? kU * std::fabs(got) + kU * scale : 0.0);
  return g;
}

// The loss sum's bound: the rows' bounds plus the double sum's gamma(n) sum |loss| (twice:
// two sums in different orders are compared, or one against the exact sum with room).
inline double SumBound(double row_bounds, double loss_magnitude, int64_t n) {
  return row_bounds + 2 * Gamma(static_cast<double>(n), kUd) * loss_magnitude;
}

}  // namespace switchyard::kernels::ce_bound
