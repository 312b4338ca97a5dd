#include "kernels/random.h"

#include "engine/core/thread_pool.h"

namespace switchyard::kernels::cpu {
namespace {

// Elements per chunk handed to another thread.
constexpr int64_t kRandomChunk = 16384;

// Writes f(global_index) into out (f32 or bf16). Each value depends only on its index (a
// counter-based generator), so the elements are filled in parallel.
template <typename F>
void FillFloat(Tensor& out, int64_t first_index, F f) {
  const int64_t n = out.numel();
  if (out.dtype() == DType::kF32) {
    float* p = out.data<float>();
    ParallelFor(n, kRandomChunk, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = f(static_cast<uint64_t>(first_index + i));
    });
  } else {
    SY_CHECK(out.dtype() == DType::kBF16) << "random fill of " << DTypeName(out.dtype());
    BFloat16* p = out.data<BFloat16>();
    ParallelFor(n, kRandomChunk, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) p[i] = BFloat16(f(static_cast<uint64_t>(first_index + i)));
    });
  }
}

// f(i, u) for i in [0, n), u = lo + (hi - lo) * UniformAt(key, first_index + i) as f32: the
// same values as UniformAt, one Philox block per 4 consecutive indices, in parallel.
template <typename F>
void ForEachUniform(int64_t n, RngKey key, int64_t first_index, float lo, float hi, F f) {
  ParallelFor(n, kRandomChunk, [&](int64_t b, int64_t e) {
    uint64_t block = ~uint64_t{0};
    PhiloxBlock bits{};
    for (int64_t i = b; i < e; ++i) {
      const uint64_t index = static_cast<uint64_t>(first_index + i);
      if ((index >> 2) != block) block = index >> 2, bits = PhiloxAt(key, block);
      f(i, lo + (hi - lo) * UniformFromBits(bits.v[index & 3]));
    }
  });
}

}  // namespace

void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi) {
  if (out.dtype() != DType::kF32) {
    FillFloat(out, first_index, [&](uint64_t i) { return lo + (hi - lo) * UniformAt(key, i); });
    return;
  }
  float* p = out.data<float>();
  ForEachUniform(out.numel(), key, first_index, lo, hi, [&](int64_t i, float u) { p[i] = u; });
}

void MulUniform(const Tensor& x, Tensor& out, RngKey key, int64_t first_index, float lo,
                float hi, Write write) {
  // FillUniform's f32 values, each multiplied into x's element as Mul / MulAdd do.
  const float* px = x.data<float>();
  float* p = out.data<float>();
  if (write == Write::kSet) {
    ForEachUniform(out.numel(), key, first_index, lo, hi,
                   [&](int64_t i, float u) { p[i] = px[i] * u; });
  } else {
    ForEachUniform(out.numel(), key, first_index, lo, hi,
                   [&](int64_t i, float u) { p[i] += px[i] * u; });
  }
}

void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std) {
  FillFloat(out, first_index, [&](uint64_t i) { return mean + std * NormalAt(key, i); });
}

void FillRandomBits(Tensor& out, RngKey key, int64_t first_index) {
  int32_t* p = out.data<int32_t>();
  for (int64_t i = 0; i < out.numel(); ++i) {
    p[i] = static_cast<int32_t>(RandomBitsAt(key, static_cast<uint64_t>(first_index + i)));
  }
}

}  // namespace switchyard::kernels::cpu
