// What the host-model tests of the row and grid-stride kernels share: seeded inputs, a
// one-dimensional launch without dynamic shared memory, bit equality, and the unit roundoffs
// their bounds are written in. Include it after tests/kernels/cuda_emulation.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

namespace switchyard::kernels {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
// The unit roundoffs of f32 and f64, and gamma(m) = m u / (1 - m u).
inline constexpr double kU = 0x1p-24, kUd = 0x1p-53;
inline double Gamma(double m, double u = kU) { return m * u / (1.0 - m * u); }

// n floats uniform in [lo, hi) from a seeded generator.
inline std::vector<float> Uniform(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> pick(lo, hi);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& e : x) e = pick(rng);
  return x;
}

// kernel() on `blocks` CTAs of `threads` threads (static shared memory only).
template <typename Kernel>
void RunKernel(unsigned blocks, int threads, Kernel kernel) {
  unsigned char unused_smem[1];
  emu::Launch(EmuDim3{blocks, 1, 1}, threads, unused_smem, 0, 0, kernel);
}

inline bool SameBits(const float* a, const float* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}
inline bool SameBits(float a, float b) { return SameBits(&a, &b, 1); }

}  // namespace switchyard::kernels
