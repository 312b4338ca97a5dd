// CPU reference implementation of kernels/cross_entropy.h: per row one max, one sum of
// exponentials in double, then (optionally) the gradient written over the row. Shapes were
// checked by kernels/cross_entropy.cc; the targets are checked against V here.
#include "kernels/cross_entropy.h"

#include <cmath>
#include <cstring>

#include "engine/core/check.h"

namespace switchyard::kernels::cpu {

int64_t CountTargets(const Tensor& targets, int32_t ignore_index) {
  const int32_t* t = targets.data<int32_t>();
  int64_t count = 0;
  for (int64_t i = 0; i < targets.numel(); ++i) count += t[i] != ignore_index;
  return count;
}

CrossEntropySums CrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits,
                              double grad_scale, int32_t ignore_index, const char* op) {
  const int64_t n = targets.numel();
  const int64_t v = logits.dim(-1);
  const int32_t* t = targets.data<int32_t>();
  const float scale = static_cast<float>(grad_scale);
  CrossEntropySums sums;
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits.data<float>() + r * v;
    float* dx = dlogits ? dlogits->data<float>() + r * v : nullptr;
    if (t[r] == ignore_index) {
      if (dx) std::memset(dx, 0, static_cast<size_t>(v) * sizeof(float));
      continue;
    }
    SY_CHECK(t[r] >= 0 && t[r] < v)
        << op << ": target " << t[r] << " at row " << r << " is outside the vocabulary of " << v
        << " (ignore_index=" << ignore_index << ")";
    float max = x[0];
    for (int64_t j = 1; j < v; ++j) max = x[j] > max ? x[j] : max;
    double sum = 0.0;
    for (int64_t j = 0; j < v; ++j) sum += std::exp(static_cast<double>(x[j] - max));
    const double lse = static_cast<double>(max) + std::log(sum);
    const float target_logit = x[t[r]];
    sums.loss_sum += lse - static_cast<double>(target_logit);
    ++sums.count;
    if (dx) {
      const float lse_f = static_cast<float>(lse);
      for (int64_t j = 0; j < v; ++j) dx[j] = scale * std::exp(x[j] - lse_f);  // x read first
      dx[t[r]] -= scale;
    }
  }
  return sums;
}

}  // namespace switchyard::kernels::cpu
