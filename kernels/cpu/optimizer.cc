// CPU reference implementation of kernels/optimizer.h: one pass over the elements, f32
// arithmetic per element (as PyTorch's fp32 optimizers), scalars formed in double
// (AdamWScalarsOf, kernels/optimizer.cc). Arguments are checked by kernels/optimizer.cc.
#include "kernels/optimizer.h"

#include <cmath>

namespace switchyard::kernels::cpu {

void AdamWUpdate(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                 const AdamWStep& hp) {
  const AdamWScalars s = AdamWScalarsOf(hp, hp.weight_decay);
  const float decay = s.decay, step_size = s.step_size, bc2_sqrt = s.bc2_sqrt;
  const float b1 = hp.beta1, b2 = hp.beta2, eps = hp.eps;
  const float one_minus_b1 = 1.0f - b1, one_minus_b2 = 1.0f - b2;
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  const int64_t n = param.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = b1 * m[i] + one_minus_b1 * gi;
    const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * mi / denom;
  }
}

void AdamWUpdateMany(std::span<AdamWTensors> tensors, const AdamWStep& hp) {
  for (AdamWTensors& t : tensors) {
    AdamWStep one = hp;
    one.weight_decay = t.weight_decay;
    cpu::AdamWUpdate(t.param, t.grad, t.exp_avg, t.exp_avg_sq, one);
  }
}

void SgdUpdate(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum,
               float weight_decay) {
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  const int64_t n = param.numel();
  if (momentum == 0.0f) {
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + weight_decay * p[i]);
    return;
  }
  float* b = momentum_buf.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + weight_decay * p[i];
    b[i] = momentum * b[i] + d;
    p[i] -= lr * b[i];
  }
}

double SumSquares(const Tensor& t) {
  const float* x = t.data<float>();
  double sum = 0.0;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

std::vector<double> SumSquaresMany(std::span<const Tensor> tensors) {
  std::vector<double> sums;
  sums.reserve(tensors.size());
  for (const Tensor& t : tensors) sums.push_back(cpu::SumSquares(t));
  return sums;
}

void ScaleInPlace(Tensor& t, float scale) {
  float* x = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) x[i] *= scale;
}

void ScaleMany(std::span<Tensor> tensors, float scale) {
  for (Tensor& t : tensors) cpu::ScaleInPlace(t, scale);
}

}  // namespace switchyard::kernels::cpu
