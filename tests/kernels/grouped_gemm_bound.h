// What the device-sized grouped products' tests (tests/kernels/grouped_gemm_emulation_test.cc on
// the CPU, tests/gpu/gemm_gpu_test.cc on a GPU) bound their results by: both sides read the
// same operand values (bf16 mode rounds them the same way, and bf16 x bf16 products are exact
// in f32), so each result is within gamma(K + 2) (|alpha| sum_p |a_p b_p| + |beta c|) of the
// exact one and the two differ by at most twice that.
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels::grouped_test {

// gamma(m) = m u / (1 - m u), u = 2^-24: the relative error bound of m f32 roundings.
inline double Gamma(int64_t m) {
  const double mu = static_cast<double>(m) * std::ldexp(1.0, -24);
  return mu / (1.0 - mu);
}

// The values a product reads from host tensor t: bf16 widened, f32 rounded to bf16 in bf16
// mode (the magnitudes of the bound are summed from these).
inline std::vector<double> ReadValues(const Tensor& t, DType mode) {
  std::vector<double> v(static_cast<size_t>(t.numel()));
  for (size_t i = 0; i < v.size(); ++i) {
    if (t.dtype() == DType::kBF16) {
      v[i] = static_cast<float>(t.data<BFloat16>()[i]);
    } else {
      const float f = t.data<float>()[i];
      v[i] = mode == DType::kBF16 ? static_cast<float>(BFloat16(f)) : f;
    }
  }
  return v;
}

// The forward's bound for each element of out's grouped rows (offsets[G] x n, row-major):
// groups [offsets[e], offsets[e + 1]), xv (rows, k) and wv (G, k, n), or (G, n, k) when
// trans_w, as ReadValues gives them, out0 the output before the product (read for beta != 0).
inline std::vector<double> ForwardBound(const std::vector<double>& xv,
                                        const std::vector<double>& wv,
                                        const std::vector<int64_t>& offsets, int64_t k, int64_t n,
                                        bool trans_w, float alpha, float beta, const float* out0) {
  const int64_t groups = static_cast<int64_t>(offsets.size()) - 1;
  std::vector<double> bound(static_cast<size_t>(offsets.back() * n), 0.0);
  for (int64_t e = 0; e < groups; ++e) {
    for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0.0;
        for (int64_t p = 0; p < k; ++p) {
          const int64_t at = trans_w ? (e * n + j) * k + p : (e * k + p) * n + j;
          s += std::fabs(xv[i * k + p] * wv[at]);
        }
        const double c = beta == 0.0f ? 0.0 : std::fabs(beta * out0[i * n + j]);
        bound[i * n + j] = 2.0 * Gamma(k + 2) * (std::fabs(alpha) * s + c);
      }
    }
  }
  return bound;
}

}  // namespace switchyard::kernels::grouped_test
