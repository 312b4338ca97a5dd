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

}  // namespace switchyard::kernels::grouped_test
