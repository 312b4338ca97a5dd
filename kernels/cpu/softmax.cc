// CPU reference implementation of kernels/softmax.h: the max-subtracted form, sums in double.
// The arguments of SoftmaxForward / SoftmaxBackward were checked by kernels/softmax.cc.
#include "kernels/softmax.h"

#include <cmath>

namespace switchyard::kernels::cpu {

float SoftmaxRow(const float* x, float* y, int64_t n) {
  float max = x[0];
  for (int64_t j = 1; j < n; ++j) max = x[j] > max ? x[j] : max;
  double sum = 0.0;
  for (int64_t j = 0; j < n; ++j) {
    const float e = std::exp(x[j] - max);
    y[j] = e;
    sum += e;
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t j = 0; j < n; ++j) y[j] *= inv;
  return max + static_cast<float>(std::log(sum));
}

void SoftmaxRowBackward(const float* y, const float* dy, float* dx, int64_t n) {
  double dot = 0.0;
  for (int64_t j = 0; j < n; ++j) dot += static_cast<double>(dy[j]) * y[j];
  const float d = static_cast<float>(dot);
  for (int64_t j = 0; j < n; ++j) dx[j] = y[j] * (dy[j] - d);
}

void SoftmaxForward(const Tensor& x, Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t c = x.dim(-1), n = x.numel() / c;
  for (int64_t r = 0; r < n; ++r) SoftmaxRow(x.data<float>() + r * c, y.data<float>() + r * c, c);
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (y.numel() == 0) return;
  const int64_t c = y.dim(-1), n = y.numel() / c;
  for (int64_t r = 0; r < n; ++r) {
    SoftmaxRowBackward(y.data<float>() + r * c, dy.data<float>() + r * c, dx.data<float>() + r * c,
                       c);
  }
}

}  // namespace switchyard::kernels::cpu
