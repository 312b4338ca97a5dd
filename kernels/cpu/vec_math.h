// Elementwise math for the CPU kernels' inner loops, written so that the compiler turns a
// loop over it into vector code: branch-free, no library calls. SY_VECTOR_CLONES compiles a
// function for AVX-512, AVX2 and plain x86-64 and picks one at load time (GCC's
// target_clones), so the build stays portable while the loops use the widest registers the
// machine has. Not under ThreadSanitizer, whose runtime is not yet set up when the loader
// runs the clones' resolvers.
#pragma once

#include <bit>
#include <cstdint>

#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__) && !defined(__CUDACC__) && \
    !defined(__SANITIZE_THREAD__)
#define SY_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define SY_VECTOR_CLONES
#endif

namespace switchyard::kernels::cpu {

// exp(x) in f32 to within 2 ulp over the whole range where it is a normal number: x = n ln2
// + r with |r| <= ln2 / 2, e^r by a degree-7 polynomial (Cephes' expf coefficients), 2^n
// built in the exponent bits. Inputs are clamped to [-87.3, 88.0], so exp of a very
// negative x is about 1e-38 rather than a denormal or 0, and of a very large x 1.65e38
// rather than inf; NaN stays NaN.
inline float VecExp(float x) {
  x = x > 88.0f ? 88.0f : x;  // comparisons false for NaN: it passes through
  x = x < -87.3f ? -87.3f : x;
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kRound;
  const float n = t - kRound;
  const int32_t ni = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  float r = x - n * 0.693359375f;  // ln 2 in two parts: the first exact in 9 bits
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  return p * std::bit_cast<float>((ni + 127) << 23);
}

// 1 / (1 + e^-x).
inline float VecSigmoid(float x) { return 1.0f / (1.0f + VecExp(-x)); }

}  // namespace switchyard::kernels::cpu
