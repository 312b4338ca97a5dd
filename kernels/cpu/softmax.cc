// CPU reference implementation of kernels/softmax.h: the max-subtracted form, sums in f32
// lanes finished in double (kernels/cpu/rows.h); rows in parallel. The arguments of
// SoftmaxForward / SoftmaxBackward were checked by kernels/softmax.cc.
#include "kernels/softmax.h"

#include <algorithm>
#include <cmath>

#include "engine/core/thread_pool.h"
#include "kernels/cpu/rows.h"

namespace switchyard::kernels::cpu {
float SoftmaxRow(const float* x, float* y, int64_t n) {
  const float max = RowMax(x, n);
  const double sum = ExpShiftRow(x, max, y, n);
  ScaleRow(y, static_cast<float>(1.0 / sum), n);
  return max + static_cast<float>(std::log(sum));
}

void SoftmaxRowBackward(const float* y, const float* dy, float* dx, int64_t n) {
  const float d = static_cast<float>(DotRow(dy, y, n));
  for (int64_t j = 0; j < n; ++j) dx[j] = y[j] * (dy[j] - d);
}

void SoftmaxForward(const Tensor& x, Tensor& y) {
  if (x.numel() == 0) return;
  const int64_t c = x.dim(-1), n = x.numel() / c;
  const float* px = x.data<float>();
  float* py = y.data<float>();
  ParallelFor(n, RowsPerChunk(c, 4096), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) SoftmaxRow(px + r * c, py + r * c, c);
  });
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx) {
  if (y.numel() == 0) return;
  const int64_t c = y.dim(-1), n = y.numel() / c;
  const float* py = y.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  ParallelFor(n, RowsPerChunk(c, 4096), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) SoftmaxRowBackward(py + r * c, pdy + r * c, pdx + r * c, c);
  });
}

}  // namespace switchyard::kernels::cpu
