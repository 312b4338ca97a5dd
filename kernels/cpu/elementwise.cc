// CPU reference implementation of kernels/elementwise.h: one loop per op over contiguous
// elements, vectorised and split over the compute threads (each element is computed alone,
// so the bits do not depend on the split). Arguments are checked by kernels/elementwise.cc.
// The build has -ffp-contract=off, so even the AVX2 / AVX-512 clones (which have FMA)
// compute `y + alpha * x` as two roundings, as the CUDA kernels do with __fmul_rn /
// __fadd_rn.
#include "kernels/elementwise.h"

#include <cstring>

#include "engine/core/dtype.h"
#include "engine/core/thread_pool.h"
#include "kernels/cpu/vec_math.h"

namespace switchyard::kernels::cpu {

namespace {

// Elements per chunk handed to another thread.
constexpr int64_t kElementwiseChunk = 32768;

SY_VECTOR_CLONES void AddRange(const float* a, const float* b, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = a[i] + b[i];
}
SY_VECTOR_CLONES void AxpyRange(float alpha, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}
SY_VECTOR_CLONES void MulRange(const float* a, const float* b, float* o, int64_t n) {
  for (int64_t i = 0; i < n; ++i) o[i] = a[i] * b[i];
}
SY_VECTOR_CLONES void MulAddRange(const float* a, const float* b, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a[i] * b[i];
}

}  // namespace

void Add(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  ParallelFor(out.numel(), kElementwiseChunk,
              [&](int64_t s, int64_t e) { AddRange(pa + s, pb + s, po + s, e - s); });
}

void Axpy(float alpha, const Tensor& x, Tensor& y) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  ParallelFor(y.numel(), kElementwiseChunk,
              [&](int64_t s, int64_t e) { AxpyRange(alpha, px + s, py + s, e - s); });
}

void Mul(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  ParallelFor(out.numel(), kElementwiseChunk,
              [&](int64_t s, int64_t e) { MulRange(pa + s, pb + s, po + s, e - s); });
}

void MulAdd(const Tensor& a, const Tensor& b, Tensor& y) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* py = y.data<float>();
  ParallelFor(y.numel(), kElementwiseChunk,
              [&](int64_t s, int64_t e) { MulAddRange(pa + s, pb + s, py + s, e - s); });
}

void ZeroMany(std::span<Tensor> tensors) {
  for (Tensor& t : tensors) {
    char* p = static_cast<char*>(t.raw_data());
    ParallelFor(static_cast<int64_t>(t.nbytes()), int64_t{1} << 20, [p](int64_t b, int64_t e) {
      std::memset(p + b, 0, static_cast<size_t>(e - b));
    });
  }
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
