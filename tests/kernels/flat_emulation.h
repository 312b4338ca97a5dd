// Helpers of the emulation tests of the one-dimensional kernel families, the optimizer's
// (optimizer_emulation_test.cc) and the elementwise ops' (elementwise_emulation_test.cc): their
// inputs, a CTA launcher over the host model and the sizes both run. Include it after
// tests/kernels/cuda_emulation.h and the kernels' .cuh files.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/random.h"

namespace switchyard::kernels::flat_emulation {

inline constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
inline constexpr float kInf = std::numeric_limits<float>::infinity();

inline std::vector<float> Uniform(int64_t n, uint64_t stream, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::Empty({n}, DType::kF32);
  FillUniform(t, RngKey{57, stream}, 0, lo, hi);
  return t.ToVector<float>();
}

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}

// A CPU tensor over caller-owned f32 memory.
inline Tensor Wrap(float* x, int64_t n) { return Tensor::Wrap(x, {n}, DType::kF32, Device::Cpu()); }

// Runs `kernel` (a call of one __global__ function) over `blocks` CTAs of `threads`.
template <typename Kernel>
void Launch(unsigned blocks, int threads, Kernel kernel) {
  unsigned char unused_smem[1];
  emu::Launch(EmuDim3{blocks, 1, 1}, threads, unused_smem, 0, 0, kernel);
}

using emu::ExpectSameBits;

// Sizes of the single-tensor cases and the grid caps they run under (0: the .cu's grid):
// one element, a block less one, a block plus one, 3.9 blocks, and 6.3 blocks' worth on
// three blocks (each thread loops two or three times).
struct Sized {
  int64_t n, max_blocks;
};
inline const std::vector<Sized> kSingle = {{1, 0}, {255, 0}, {257, 0}, {1000, 0}, {1613, 3}};

// Random values with infinities, zeros of both signs and denormals among them.
inline std::vector<float> WithSpecials(int64_t n, uint64_t stream) {
  std::vector<float> x = Uniform(n, stream, -3.0f, 3.0f);
  const float specials[] = {kInf, -kInf, 0.0f, -0.0f, FromBits(1), FromBits(0x807fffffu),
                            std::numeric_limits<float>::max(), 1e-39f};
  for (int64_t i = 0; i < n; i += 13) x[i] = specials[(i / 13) % 8];
  return x;
}

}  // namespace switchyard::kernels::flat_emulation
