// What the host-model tests of the dispatch family's kernels share (admission_emulation_test,
// dispatch_emulation_test): the host model of CUDA with static __shared__ arrays (EntropyKernel
// declares its array inside the kernel: static, it is one array for the CTA's threads), the
// CUDA built-ins the model lacks (float4, min / max of 64-bit integers), a seeded generator,
// and the bounds' unit roundoffs. Include it before the .cuh files under test.
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <vector>

// Last of the includes above the kernels: the host model defines CUDA's qualifiers as macros.
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

struct alignas(16) float4 {
  float x, y, z, w;
};
inline float4 make_float4(float x, float y, float z, float w) { return float4{x, y, z, w}; }
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }
inline int64_t max(int64_t a, int64_t b) { return a > b ? a : b; }

namespace switchyard::kernels::dispatch_emu {

inline constexpr float kNan = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kUnwritten = -777.0f;  // where a kernel must not write (NaN could be)
inline constexpr unsigned kNoCap = ~0u;       // no cap on a grid
inline unsigned char no_smem[1];              // no kernel of the family uses dynamic shared memory

inline double Gamma(int64_t m, double u) { return m * u / (1.0 - m * u); }
inline const double kU32 = std::ldexp(1.0, -24), kU64 = std::ldexp(1.0, -53);

struct Rng {
  std::mt19937_64 g;
  explicit Rng(uint64_t seed) : g(seed) {}
  int64_t Int(int64_t n) { return static_cast<int64_t>(g() % static_cast<uint64_t>(n)); }
  float Uniform(float lo, float hi) {
    return lo + (hi - lo) * static_cast<float>(static_cast<double>(g() >> 40) * 0x1p-24);
  }
  std::vector<float> Floats(int64_t n, float lo = -1.0f, float hi = 1.0f) {
    std::vector<float> v(n);
    for (float& x : v) x = Uniform(lo, hi);
    return v;
  }
};

}  // namespace switchyard::kernels::dispatch_emu
