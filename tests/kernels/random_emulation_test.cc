// The random fills' device code (kernels/cuda/random_kernels.cuh: FillKernel for uniform and
// normal values in f32 and bf16, with the key's stream and first index given or read from
// device memory, and BitsKernel) run on the CPU, without a GPU, through the host model of
// CUDA in tests/kernels/cuda_emulation.h, with random.cu's 256-thread blocks on
// device_common.cuh's GridFor (its cap lowered so that the grid-stride loops stride), against
// the CPU twin (kernels/cpu/random.cc).
//
// What it checks, all bit for bit (memcmp): Philox is the same integer arithmetic on both
// sides, and the uniform scaling the same f32 operations in the same order (lo + (hi - lo) u,
// rounded step by step), so uniform fills and raw bits equal the CPU's, f32 and bf16 (rounded
// to nearest even). Normal fills equal the CPU's here too: the kernel calls engine/core/
// philox.h's NormalAt, which in the host model takes the C library's logf, cosf and sqrtf as
// the CPU does (on a GPU they are CUDA's: within their ulps, which the GPU tests bound).
//  - sizes 1, 1000 (not a multiple of the block), 5000 on 1, 3 and 20 blocks (the loop
//    strides), first indices 0, 7 (not a multiple of Philox's 4 words: the CPU's f32 uniform
//    path takes a block per 4 indices), 2^40 + 3 (the counter's high word), streams and seeds
//    past 32 bits; every grid the same bits;
//  - the DeviceRng form (the stream and first token read from `at`, with token_offset and
//    per_token): the same bits as the CPU's fill at that key and first index;
//  - MulUniformKernel (x times the uniform value, set or added; the router's jitter drawn where
//    it is used): the bits of the CPU's fill then Mul / MulAdd, which cpu::MulUniform equals;
//  - a launch over zero elements writes nothing.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/dtype.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"
// Last: the host model defines CUDA's qualifiers as macros.
#include "tests/kernels/cuda_emulation.h"

#include "kernels/cuda/random_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace rnd = cuda::random_dev;
using rnd::Dist;

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

template <typename Kernel>
void RunKernel(int64_t n, int64_t cap, Kernel kernel) {
  unsigned char unused_smem[1];
  emu::Launch(EmuDim3{cuda::GridFor(n, rnd::kThreads, cap), 1, 1}, rnd::kThreads, unused_smem, 0,
              0, kernel);
}

// FillKernel<T, D> as random.cu launches it (at null: key and first as given). The output
// starts as 0xFF bytes (a NaN in both types): every element must be written.
template <typename T, Dist D>
std::vector<T> DeviceFill(int64_t n, RngKey key, int64_t first, float a, float b, int64_t cap,
                          const int64_t* at = nullptr, int64_t token_offset = 0,
                          int64_t per_token = 1) {
  std::vector<T> out(static_cast<size_t>(n));
  if (n > 0) std::memset(static_cast<void*>(out.data()), 0xFF, out.size() * sizeof(T));
  RunKernel(n, cap, [&] {
    rnd::FillKernel<T, D>(out.data(), n, key, first, a, b, at, token_offset, per_token);
  });
  return out;
}

template <typename T, Dist D>
std::vector<T> CpuFill(int64_t n, RngKey key, int64_t first, float a, float b) {
  Tensor t = Tensor::Empty({n}, DTypeOf<T>());
  if (D == Dist::kUniform) {
    cpu::FillUniform(t, key, first, a, b);
  } else {
    cpu::FillNormal(t, key, first, a, b);
  }
  return t.ToVector<T>();
}

struct FillCase {
  int64_t n, first;
  RngKey key;
  int64_t cap;
};

std::string Name(const FillCase& c, const char* what) {
  return std::string(what) + " n " + std::to_string(c.n) + " first " + std::to_string(c.first) +
         " seed " + std::to_string(c.key.seed) + " stream " + std::to_string(c.key.stream) +
         " cap " + std::to_string(c.cap);
}

const FillCase kCases[] = {
    {1, 0, {1, 0}, 1000},
    {1000, 7, {42, 3}, 1000},                                // 4 blocks, the last short
    {5000, 1, {0x123456789abcull, 0xfedcba9876ull}, 3},      // 3 blocks: the loop strides
    {5000, (int64_t{1} << 40) + 3, {7, 0x100000001ull}, 1},  // one block
    {257, 0, {~0ull, ~0ull}, 20},                            // 2 blocks, the second one value
};

template <typename T, Dist D>
void CheckFill(const FillCase& c, float a, float b, const char* what) {
  const std::vector<T> got = DeviceFill<T, D>(c.n, c.key, c.first, a, b, c.cap);
  EXPECT_TRUE(SameBits(got, CpuFill<T, D>(c.n, c.key, c.first, a, b))) << Name(c, what);
  // Another grid: the same bits.
  EXPECT_TRUE(SameBits(got, DeviceFill<T, D>(c.n, c.key, c.first, a, b, 2)))
      << Name(c, what) << " on 2 blocks";
}

TEST(RandomEmulationTest, UniformIsTheCpusBits) {
  for (const FillCase& c : kCases) {
    CheckFill<float, Dist::kUniform>(c, -0.5f, 0.25f, "uniform f32");
    CheckFill<float, Dist::kUniform>(c, 0.0f, 1.0f, "uniform f32 [0, 1)");
    CheckFill<BFloat16, Dist::kUniform>(c, -3.0f, 7.0f, "uniform bf16");
  }
}

TEST(RandomEmulationTest, NormalIsTheCpusBits) {
  for (const FillCase& c : kCases) {
    CheckFill<float, Dist::kNormal>(c, 0.0f, 1.0f, "normal f32");
    CheckFill<float, Dist::kNormal>(c, 0.5f, 0.02f, "normal f32 mean 0.5 std 0.02");
    CheckFill<BFloat16, Dist::kNormal>(c, -1.0f, 3.0f, "normal bf16");
  }
}

TEST(RandomEmulationTest, BitsAreTheCpusBits) {
  for (const FillCase& c : kCases) {
    std::vector<int32_t> got(static_cast<size_t>(c.n), 0x5a5a5a5a);
    RunKernel(c.n, c.cap, [&] { rnd::BitsKernel(got.data(), c.n, c.key, c.first); });
    Tensor want = Tensor::Empty({c.n}, DType::kI32);
    cpu::FillRandomBits(want, c.key, c.first);
    EXPECT_TRUE(SameBits(got, want.ToVector<int32_t>())) << Name(c, "bits");
  }
}

TEST(RandomEmulationTest, DeviceRngReadsItsStreamAndFirstToken) {
  // {stream, first_token} in device memory; element i draws at (first_token + token_offset)
  // * per_token + i under RngKey{seed, stream}. The key's stream and `first` passed in are
  // what random.cu passes (0): they must be replaced.
  struct AtCase {
    int64_t n, stream, first_token, token_offset, per_token, cap;
  };
  const AtCase cases[] = {
      {1000, 5, 3, 0, 1, 1000},
      {777, 0x7fffffffffffll, 12, 4, 6, 2},  // per_token 6: first index 96, not a multiple of 4
      {64, 1, 0, 0, 64, 1},
  };
  const uint64_t seed = 0xabcdef12345ull;
  for (const AtCase& c : cases) {
    const std::string name = "DeviceRng n " + std::to_string(c.n) + " stream " +
                             std::to_string(c.stream) + " token " +
                             std::to_string(c.first_token) + " + " +
                             std::to_string(c.token_offset) + " x " + std::to_string(c.per_token);
    const int64_t at[2] = {c.stream, c.first_token};
    const RngKey key{seed, static_cast<uint64_t>(c.stream)};
    const int64_t first = (c.first_token + c.token_offset) * c.per_token;
    const std::vector<float> got = DeviceFill<float, Dist::kUniform>(
        c.n, RngKey{seed, 0}, 0, 0.0f, 1.0f, c.cap, at, c.token_offset, c.per_token);
    EXPECT_TRUE(SameBits(got, CpuFill<float, Dist::kUniform>(c.n, key, first, 0.0f, 1.0f)))
        << name;
    const std::vector<BFloat16> got16 = DeviceFill<BFloat16, Dist::kUniform>(
        c.n, RngKey{seed, 0}, 0, -1.0f, 1.0f, c.cap, at, c.token_offset, c.per_token);
    EXPECT_TRUE(
        SameBits(got16, CpuFill<BFloat16, Dist::kUniform>(c.n, key, first, -1.0f, 1.0f)))
        << name << " bf16";
  }
}

// MulUniform (the router's jitter): x times the uniform value, set or added, on the CPU the
// bits of FillUniform then Mul / MulAdd (kernels/elementwise.h), and MulUniformKernel the
// CPU's bits on every grid, with the key given or read from `at`.
TEST(RandomEmulationTest, MulUniformIsTheFillThenTheProduct) {
  for (const FillCase& c : kCases) {
    const float lo = 0.9f, hi = 1.1f;
    Tensor x = Tensor::Empty({c.n}, DType::kF32), y0 = Tensor::Empty({c.n}, DType::kF32);
    cpu::FillUniform(x, RngKey{5, 6}, 0, -3.0f, 3.0f);
    cpu::FillUniform(y0, RngKey{5, 7}, 0, -1.0f, 1.0f);
    Tensor noise = Tensor::Empty({c.n}, DType::kF32);
    cpu::FillUniform(noise, c.key, c.first, lo, hi);
    Tensor want_set = Tensor::Empty({c.n}, DType::kF32), want_add = y0.Clone();
    cpu::Mul(x, noise, want_set);
    cpu::MulAdd(x, noise, want_add);
    Tensor set = Tensor::Empty({c.n}, DType::kF32), add = y0.Clone();
    cpu::MulUniform(x, set, c.key, c.first, lo, hi, Write::kSet);
    cpu::MulUniform(x, add, c.key, c.first, lo, hi, Write::kAdd);
    EXPECT_TRUE(SameBits(set.ToVector<float>(), want_set.ToVector<float>())) << Name(c, "mul set");
    EXPECT_TRUE(SameBits(add.ToVector<float>(), want_add.ToVector<float>())) << Name(c, "mul add");
    const std::vector<float> xv = x.ToVector<float>();
    for (int64_t cap : {c.cap, int64_t{2}}) {
      std::vector<float> got_set(static_cast<size_t>(c.n), -9.0f), got_add = y0.ToVector<float>();
      RunKernel(c.n, cap, [&] {
        rnd::MulUniformKernel<false>(xv.data(), got_set.data(), c.n, c.key, c.first, lo, hi);
      });
      RunKernel(c.n, cap, [&] {
        rnd::MulUniformKernel<true>(xv.data(), got_add.data(), c.n, c.key, c.first, lo, hi);
      });
      EXPECT_TRUE(SameBits(got_set, want_set.ToVector<float>())) << Name(c, "kernel set") << cap;
      EXPECT_TRUE(SameBits(got_add, want_add.ToVector<float>())) << Name(c, "kernel add") << cap;
    }
    // The key's stream and first token read from `at` (token_offset 2, per_token 1; the
    // index arithmetic with per_token > 1 is FillKernel's, checked above).
    if (c.first >= 2) {
      const int64_t at[2] = {static_cast<int64_t>(c.key.stream), c.first - 2};
      std::vector<float> got(static_cast<size_t>(c.n), -9.0f);
      RunKernel(c.n, c.cap, [&] {
        rnd::MulUniformKernel<false>(xv.data(), got.data(), c.n, RngKey{c.key.seed, 0}, 0, lo, hi,
                                     at, 2, 1);
      });
      EXPECT_TRUE(SameBits(got, want_set.ToVector<float>())) << Name(c, "kernel at");
    }
  }
}

TEST(RandomEmulationTest, ZeroElementsWriteNothing) {
  std::vector<float> f(4, 3.0f);
  std::vector<int32_t> bits(4, 9);
  RunKernel(0, 1000, [&] {
    rnd::FillKernel<float, Dist::kUniform>(f.data(), 0, RngKey{1, 2}, 0, 0.0f, 1.0f);
  });
  RunKernel(0, 1000, [&] {
    rnd::FillKernel<float, Dist::kNormal>(f.data(), 0, RngKey{1, 2}, 0, 0.0f, 1.0f);
  });
  RunKernel(0, 1000, [&] { rnd::BitsKernel(bits.data(), 0, RngKey{1, 2}, 0); });
  EXPECT_EQ(f, std::vector<float>(4, 3.0f));
  EXPECT_EQ(bits, std::vector<int32_t>(4, 9));
}

}  // namespace
}  // namespace switchyard::kernels
