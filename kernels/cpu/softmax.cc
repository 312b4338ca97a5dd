// CPU reference implementation of kernels/softmax.h: the max-subtracted form, sums in double.
#include "kernels/softmax.h"

#include <cmath>

#include "kernels/cpu/cpu_check.h"

namespace switchyard::kernels {
namespace cpu {

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

}  // namespace cpu

namespace {

int64_t Columns(const Tensor& t, const char* op) {
  SY_CHECK(t.ndim() >= 1 && t.dim(-1) >= 1)
      << op << ": needs a non-empty last dimension, got " << ShapeString(t.shape());
  return t.dim(-1);
}

}  // namespace

void SoftmaxForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  constexpr const char* kOp = "SoftmaxForward";
  cpu::CheckCpuF32(x, kOp, "x");
  cpu::CheckCpuF32(y, kOp, "y");
  SY_CHECK(x.shape() == y.shape())
      << kOp << ": x " << ShapeString(x.shape()) << ", y " << ShapeString(y.shape());
  if (x.numel() == 0) return;
  const int64_t c = Columns(x, kOp), n = x.numel() / c;
  for (int64_t r = 0; r < n; ++r)
    cpu::SoftmaxRow(x.data<float>() + r * c, y.data<float>() + r * c, c);
}

void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  constexpr const char* kOp = "SoftmaxBackward";
  cpu::CheckCpuF32(y, kOp, "y");
  cpu::CheckCpuF32(dy, kOp, "dy");
  cpu::CheckCpuF32(dx, kOp, "dx");
  SY_CHECK(y.shape() == dy.shape() && y.shape() == dx.shape())
      << kOp << ": y " << ShapeString(y.shape()) << ", dy " << ShapeString(dy.shape()) << ", dx "
      << ShapeString(dx.shape());
  if (y.numel() == 0) return;
  const int64_t c = Columns(y, kOp), n = y.numel() / c;
  for (int64_t r = 0; r < n; ++r) {
    cpu::SoftmaxRowBackward(y.data<float>() + r * c, dy.data<float>() + r * c,
                            dx.data<float>() + r * c, c);
  }
}

}  // namespace switchyard::kernels
