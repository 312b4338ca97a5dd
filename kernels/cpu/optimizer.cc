// CPU reference implementation of kernels/optimizer.h: one pass over the elements, f32
// arithmetic per element (as PyTorch's fp32 optimizers), scalars formed in double
// (AdamWScalarsOf, kernels/optimizer.cc); vectorised and split over the compute threads.
// Sums of squares add fixed blocks in block order, so they do not depend on the thread
// count. Arguments are checked by kernels/optimizer.cc.
#include "kernels/optimizer.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/thread_pool.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/elementwise.h"

namespace switchyard::kernels::cpu {

namespace {

// Elements per chunk handed to another thread.
constexpr int64_t kAdamChunk = 32768;

struct AdamWConsts {
  float decay, step_size, bc2_sqrt, b1, b2, eps, one_minus_b1, one_minus_b2, grad_scale;
};

SY_VECTOR_CLONES void AdamWRange(float* p, const float* g, float* m, float* v, int64_t n,
                                 const AdamWConsts& c) {
  const float decay = c.decay, step_size = c.step_size, bc2_sqrt = c.bc2_sqrt;
  const float b1 = c.b1, b2 = c.b2, eps = c.eps;
  const float one_minus_b1 = c.one_minus_b1, one_minus_b2 = c.one_minus_b2;
  const float grad_scale = c.grad_scale;
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * grad_scale;
    const float mi = b1 * m[i] + one_minus_b1 * gi;
    const float vi = b2 * v[i] + one_minus_b2 * gi * gi;
    m[i] = mi;
    v[i] = vi;
    const float denom = std::sqrt(vi) / bc2_sqrt + eps;
    p[i] = p[i] * decay - step_size * mi / denom;
  }
}

// Sum of squares of x[0, n) in 16 f32 lanes, finished in double.
SY_VECTOR_CLONES double SumSquaresRange(const float* x, int64_t n) {
  constexpr int kLanes = 16;
  double lane[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int l = 0; l < kLanes; ++l) lane[l] += static_cast<double>(x[i + l]) * x[i + l];
  }
  double sum = 0.0;
  for (int l = 0; l < kLanes; ++l) sum += lane[l];
  for (; i < n; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

SY_VECTOR_CLONES void ScaleRange(float* x, float scale, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= scale;
}

}  // namespace

void AdamWUpdate(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                 const AdamWStep& hp) {
  const AdamWScalars s = AdamWScalarsOf(hp, hp.weight_decay);
  const AdamWConsts c{s.decay, s.step_size, s.bc2_sqrt, hp.beta1, hp.beta2, hp.eps,
                      1.0f - hp.beta1, 1.0f - hp.beta2, hp.grad_scale};
  float* p = param.data<float>();
  const float* g = grad.data<float>();
  float* m = exp_avg.data<float>();
  float* v = exp_avg_sq.data<float>();
  ParallelFor(param.numel(), kAdamChunk, [&](int64_t b, int64_t e) {
    AdamWRange(p + b, g + b, m + b, v + b, e - b, c);
  });
}

void AdamWUpdateMany(std::span<AdamWTensors> tensors, const AdamWStep& hp) {
  for (AdamWTensors& t : tensors) {
    AdamWStep one = hp;
    one.weight_decay = t.weight_decay;
    cpu::AdamWUpdate(t.param, t.grad, t.exp_avg, t.exp_avg_sq, one);
    if (t.shadow.defined()) cpu::Cast(t.param, t.shadow);  // CUDA writes it in the same pass
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
  constexpr int64_t kBlock = 65536;  // elements per partial sum
  const float* x = t.data<float>();
  const int64_t n = t.numel(), blocks = (n + kBlock - 1) / kBlock;
  std::vector<double> partial(static_cast<size_t>(blocks));
  ParallelFor(blocks, 1, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) {
      partial[i] = SumSquaresRange(x + i * kBlock, std::min(kBlock, n - i * kBlock));
    }
  });
  double sum = 0.0;
  for (double p : partial) sum += p;
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
  ParallelFor(t.numel(), kAdamChunk,
              [&](int64_t b, int64_t e) { ScaleRange(x + b, scale, e - b); });
}

void ScaleMany(std::span<Tensor> tensors, float scale) {
  for (Tensor& t : tensors) cpu::ScaleInPlace(t, scale);
}

}  // namespace switchyard::kernels::cpu
