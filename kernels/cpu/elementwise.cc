// CPU reference implementation of kernels/elementwise.h: one loop per op over contiguous
// elements. Arguments are checked by kernels/elementwise.cc. The build targets baseline
// x86-64, which has no FMA instruction, so `y + alpha * x` is two roundings, as the CUDA
// kernels compute it with __fmul_rn / __fadd_rn. (GCC contracts a * b + c in C++ by default
// where FMA exists: a -march=native build would need -ffp-contract=off to stay exact.)
#include "kernels/elementwise.h"

#include <cstring>

#include "engine/core/dtype.h"

namespace switchyard::kernels::cpu {

void Add(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = pa[i] + pb[i];
}

void Axpy(float alpha, const Tensor& x, Tensor& y) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  for (int64_t i = 0, n = y.numel(); i < n; ++i) py[i] += alpha * px[i];
}

void Mul(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  for (int64_t i = 0, n = out.numel(); i < n; ++i) po[i] = pa[i] * pb[i];
}

void MulAdd(const Tensor& a, const Tensor& b, Tensor& y) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
  for (int64_t i = 0, n = y.numel(); i < n; ++i) py[i] += pa[i] * pb[i];
}

void Fill(Tensor& t, float value) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::kBF16) {
    BFloat16* p = t.data<BFloat16>();
    const BFloat16 v(value);
    for (int64_t i = 0; i < n; ++i) p[i] = v;
    return;
  }
  float* p = t.data<float>();
  for (int64_t i = 0; i < n; ++i) p[i] = value;
}

void Cast(const Tensor& src, Tensor& dst) {
  const int64_t n = dst.numel();
  if (src.dtype() == dst.dtype()) {
    if (n > 0 && src.raw_data() != dst.raw_data())
      std::memmove(dst.raw_data(), src.raw_data(), dst.nbytes());
    return;
  }
  if (src.dtype() == DType::kF32) {  // f32 -> bf16
    const float* ps = src.data<float>();
    BFloat16* pd = dst.data<BFloat16>();
    for (int64_t i = 0; i < n; ++i) pd[i] = BFloat16(ps[i]);
    return;
  }
  const BFloat16* ps = src.data<BFloat16>();  // bf16 -> f32
  float* pd = dst.data<float>();
  for (int64_t i = 0; i < n; ++i) pd[i] = static_cast<float>(ps[i]);
}

}  // namespace switchyard::kernels::cpu
