// CPU reference implementation of kernels/optimizer.h: one pass over the elements, f32
// arithmetic per element (as PyTorch's fp32 optimizers), scalars formed in double.
#include "kernels/optimizer.h"

#include <cmath>

#include "kernels/cpu/cpu_check.h"

namespace switchyard::kernels {
namespace {

using cpu::CheckCpuF32;

void CheckSameShape(const Tensor& a, const Tensor& b, const char* op, const char* what) {
  CheckCpuF32(b, op, what);
  SY_CHECK(a.shape() == b.shape()) << op << ": " << what << " " << ShapeString(b.shape())
                                   << ", expected " << ShapeString(a.shape());
}

}  // namespace

void AdamWUpdate(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                 const AdamWStep& hp, DeviceContext* ctx) {
  constexpr const char* kOp = "AdamWUpdate";
  CheckCpuF32(param, kOp, "param");
  CheckSameShape(param, grad, kOp, "grad");
  CheckSameShape(param, exp_avg, kOp, "exp_avg");
  CheckSameShape(param, exp_avg_sq, kOp, "exp_avg_sq");
  SY_CHECK(hp.step >= 1) << kOp << ": step " << hp.step << " (steps count from 1)";
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  const float decay = static_cast<float>(1.0 - static_cast<double>(hp.lr) * hp.weight_decay);
  const float step_size = static_cast<float>(hp.lr / bc1);
  const float bc2_sqrt = static_cast<float>(std::sqrt(bc2));
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

void SgdUpdate(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr,
               float momentum, float weight_decay, DeviceContext* ctx) {
  constexpr const char* kOp = "SgdUpdate";
  CheckCpuF32(param, kOp, "param");
  CheckSameShape(param, grad, kOp, "grad");
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  const int64_t n = param.numel();
  if (momentum == 0.0f) {
    for (int64_t i = 0; i < n; ++i) p[i] -= lr * (g[i] + weight_decay * p[i]);
    return;
  }
  CheckSameShape(param, momentum_buf, kOp, "momentum_buf");
  float* b = momentum_buf.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float d = g[i] + weight_decay * p[i];
    b[i] = momentum * b[i] + d;
    p[i] -= lr * b[i];
  }
}

double SumSquares(const Tensor& t, DeviceContext* ctx) {
  CheckCpuF32(t, "SumSquares", "t");
  const float* x = t.data<float>();
  double sum = 0.0;
  for (int64_t i = 0, n = t.numel(); i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

void ScaleInPlace(Tensor& t, float scale, DeviceContext* ctx) {
  CheckCpuF32(t, "ScaleInPlace", "t");
  float* x = t.data<float>();
  for (int64_t i = 0, n = t.numel(); i < n; ++i) x[i] *= scale;
}

}  // namespace switchyard::kernels
