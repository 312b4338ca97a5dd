// The device code of the rotary embeddings (kernels/cuda/rope_kernels.cuh) and of the row
// softmax (kernels/cuda/softmax_kernels.cuh) run on the CPU, without a GPU, through the host
// model of CUDA in tests/kernels/cuda_emulation.h, with the .cu files' launch shapes (rope's
// grid-stride kernels on device_common.cuh's GridFor with its cap lowered so that the loops
// stride; the softmax's RowThreads and RowBlocks, the row grid capped lower so that the row
// loop strides), against the CPU twins (kernels/cpu/rope.cc, kernels/cpu/softmax.cc).
//
// What it checks (u = 2^-24, gamma(m) = m u / (1 - m u), u_d and gamma_d the same in double):
//  - rope's table: each cos and sign * sin entry within one f32 ulp of the CPU's (both round
//    to f32 a double that the C library's sin, cos and sincos give within 1 ulp of the same
//    angle, the same pow and product on both sides); the rotation on the CPU's table: the
//    CPU's bits (memcmp); the whole op (the kernel's table, then the rotation): the CPU's
//    bits where the pair's table entries are the CPU's, within |x| |dtable| + gamma(2) of both
//    products elsewhere; offsets 0, 7 and 100000 (large angles), sign +1 and -1, bases 1e4 and
//    5e5, hd 2 (one pair), 8, 64 and 66 (half not a power of two), pair counts not a multiple
//    of the block, y in place of x (the same bits), and a launch over zero elements writes
//    nothing;
//  - the softmax forward: each y within its bound of the exact softmax (computed here in
//    double): expf's 2 ulp (4u) and the rounded x - max (u |x - max|) per term, the double sum,
//    the f32 reciprocal and product (2u); and within that bound plus the CPU twin's of the
//    CPU's y (the twin's VecExp has the same 2 ulp, its sum gamma(c / 16 + 1) of 16 f32 lanes);
//    rows of 1, 5, 33, 1000 and 5000 values (32 to 1024 threads, not multiples of the block),
//    rows past the grid, a constant row, y in place of x (the same bits);
//  - the softmax backward: on random inputs dx within |y| |d - d_cpu| + gamma(2) |y| (|dy - d|
//    + |dy - d_cpu|) of the CPU's, with d and d_cpu each within u |D| + their sums' error
//    bounds of the exact D = sum dy y; on inputs on a grid of 2^-8, where every sum is exact
//    in any order, the CPU's bits; dx in place of dy (the same bits).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/tensor.h"
#include "kernels/rope.h"
#include "kernels/softmax.h"
// Last: the host model defines CUDA's qualifiers as macros. The softmax kernels declare their
// shared arrays inside the kernel: static, they are one array for the CTA's threads.
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

#include "kernels/cuda/rope_kernels.cuh"
#include "kernels/cuda/softmax_kernels.cuh"
#include "tests/kernels/emulation_test_util.h"

namespace switchyard::kernels {
namespace {

namespace rd = cuda::rope_dev;
namespace sm = cuda::softmax_dev;

// One f32 ulp at the larger magnitude of a and b (the spacing above it).
double UlpAbove(float a, float b) {
  const float m = std::max(std::fabs(a), std::fabs(b));
  return static_cast<double>(std::nextafter(m, std::numeric_limits<float>::infinity())) - m;
}

// ---- Rope.

struct RopeCase {
  int64_t nb, s, nh, hd;
  float base;
  int64_t offset;
  float sign;
  int64_t cap;  // grid cap of both kernels
};

std::string Name(const RopeCase& c) {
  return "rope (" + std::to_string(c.nb) + ", " + std::to_string(c.s) + ", " +
         std::to_string(c.nh) + ", " + std::to_string(c.hd) + ") base " +
         std::to_string(static_cast<int64_t>(c.base)) + " offset " + std::to_string(c.offset) +
         (c.sign > 0 ? " sign +1" : " sign -1") + " cap " + std::to_string(c.cap);
}

// The CPU twin's table (kernels/cpu/rope.cc's expressions), laid out as the kernel's.
std::vector<float> CpuTable(const RopeCase& c) {
  const int64_t half = c.hd / 2, count = c.s * half;
  std::vector<float> table(static_cast<size_t>(2 * count));
  for (int64_t t = 0; t < c.s; ++t) {
    const double pos = static_cast<double>(c.offset + t);
    for (int64_t i = 0; i < half; ++i) {
      const double theta =
          std::pow(static_cast<double>(c.base), -2.0 * i / static_cast<double>(c.hd));
      table[t * half + i] = static_cast<float>(std::cos(pos * theta));
      table[count + t * half + i] = c.sign * static_cast<float>(std::sin(pos * theta));
    }
  }
  return table;
}

void RunRotate(const RopeCase& c, const float* x, float* y, const std::vector<float>& table) {
  const int64_t half = c.hd / 2, pairs = c.nb * c.s * c.nh * half;
  RunKernel(cuda::GridFor(pairs, rd::kThreads, c.cap), rd::kThreads, [&] {
    rd::RopeRotateKernel(x, y, table.data(), pairs, c.s, c.nh, half);
  });
}

void CheckRope(const RopeCase& c, uint32_t seed) {
  const std::string name = Name(c);
  const int64_t half = c.hd / 2, count = c.s * half, n = c.nb * c.s * c.nh * c.hd;
  // The table as rope.cu launches it; every entry must be written.
  std::vector<float> table(static_cast<size_t>(2 * count), kNaN);
  RunKernel(cuda::GridFor(count, rd::kThreads, c.cap), rd::kThreads, [&] {
    rd::RopeTableKernel(table.data(), c.s, half, c.hd, static_cast<double>(c.base), c.offset,
                        c.sign);
  });
  const std::vector<float> cpu_table = CpuTable(c);
  int64_t differ = 0;
  for (int64_t k = 0; k < 2 * count; ++k) {
    if (SameBits(table[k], cpu_table[k])) continue;
    ++differ;
    ASSERT_LE(std::fabs(double(table[k]) - cpu_table[k]), UlpAbove(table[k], cpu_table[k]))
        << name << " table entry " << k << ": " << table[k] << " vs " << cpu_table[k];
  }

  const std::vector<float> x = Uniform(n, seed, -3.0f, 3.0f);
  Tensor want_t = Tensor::Empty({c.nb, c.s, c.nh, c.hd}, DType::kF32);
  cpu::RopeRotate(Tensor::FromVector(x, {c.nb, c.s, c.nh, c.hd}), want_t, c.base, c.offset,
                  c.sign);
  const std::vector<float> want = want_t.ToVector<float>();

  // The rotation on the CPU's table: the CPU's bits.
  std::vector<float> y(static_cast<size_t>(n), kNaN);
  RunRotate(c, x.data(), y.data(), cpu_table);
  EXPECT_TRUE(SameBits(y.data(), want.data(), n)) << name << ": rotation on the CPU's table";

  // The whole op: the kernel's table, then the rotation, out of place and in place.
  RunRotate(c, x.data(), y.data(), table);
  std::vector<float> in_place = x;
  RunRotate(c, in_place.data(), in_place.data(), table);
  EXPECT_TRUE(SameBits(in_place.data(), y.data(), n)) << name << ": y in place of x";
  for (int64_t p = 0; p < n / 2; ++p) {
    const int64_t i = p % half, row = p / half, t = (row / c.nh) % c.s;
    const int64_t at = row * c.hd + i, e = t * half + i;
    const float ce = table[e], se = table[count + e], cc = cpu_table[e], sc = cpu_table[count + e];
    const double x1 = std::fabs(x[at]), x2 = std::fabs(x[at + half]);
    if (SameBits(ce, cc) && SameBits(se, sc)) {
      ASSERT_TRUE(SameBits(&y[at], &want[at], 1) && SameBits(&y[at + half], &want[at + half], 1))
          << name << " pair " << p << ": the CPU's table entries, other bits";
      continue;
    }
    const double dt = x1 * std::fabs(double(ce) - cc) + x2 * std::fabs(double(se) - sc);
    const double bound1 =
        dt + Gamma(2) * (x1 * std::fabs(ce) + x2 * std::fabs(se) + x1 * std::fabs(cc) +
                         x2 * std::fabs(sc));
    const double bound2 =
        x2 * std::fabs(double(ce) - cc) + x1 * std::fabs(double(se) - sc) +
        Gamma(2) * (x2 * std::fabs(ce) + x1 * std::fabs(se) + x2 * std::fabs(cc) +
                    x1 * std::fabs(sc));
    ASSERT_LE(std::fabs(double(y[at]) - want[at]), bound1) << name << " pair " << p;
    ASSERT_LE(std::fabs(double(y[at + half]) - want[at + half]), bound2) << name << " pair " << p;
  }
  std::printf("  %-64s table entries not the CPU's bits: %lld of %lld\n", name.c_str(),
              static_cast<long long>(differ), static_cast<long long>(2 * count));
}

TEST(RopeEmulationTest, TableAndRotationAgainstTheCpu) {
  const RopeCase cases[] = {
      {2, 5, 3, 8, 10000.0f, 0, 1.0f, 1000},        // one block each
      {1, 7, 2, 2, 10000.0f, 7, -1.0f, 1000},       // hd 2: one pair a row
      {3, 33, 4, 64, 10000.0f, 100, 1.0f, 5},       // 12672 pairs over 5 blocks of 256
      {2, 17, 3, 66, 500000.0f, 100000, -1.0f, 2},  // half 33, large angles, 3366 pairs
      {1, 300, 1, 8, 10000.0f, 0, 1.0f, 1},         // one block: both loops stride
  };
  uint32_t seed = 10;
  for (const RopeCase& c : cases) CheckRope(c, ++seed);
}

TEST(RopeEmulationTest, ZeroElementsWriteNothing) {
  std::vector<float> table(8, kNaN), y(8, kNaN);
  const std::vector<float> x(8, 1.0f);
  RunKernel(cuda::GridFor(0, rd::kThreads), rd::kThreads,
            [&] { rd::RopeTableKernel(table.data(), 0, 4, 8, 10000.0, 0, 1.0f); });
  RunKernel(cuda::GridFor(0, rd::kThreads), rd::kThreads,
            [&] { rd::RopeRotateKernel(x.data(), y.data(), table.data(), 0, 1, 1, 4); });
  for (int k = 0; k < 8; ++k) EXPECT_TRUE(std::isnan(table[k]) && std::isnan(y[k])) << k;
}

// ---- Softmax.

struct SoftmaxCase {
  int64_t n, c;
  int64_t cap;  // row grid cap
};

std::string Name(const SoftmaxCase& c) {
  return "softmax (" + std::to_string(c.n) + ", " + std::to_string(c.c) + ") row grid cap " +
         std::to_string(c.cap);
}

void RunForward(const SoftmaxCase& c, const float* x, float* y) {
  RunKernel(sm::RowBlocks(c.n, c.cap), sm::RowThreads(c.c),
            [&] { sm::SoftmaxForwardKernel(x, y, c.n, c.c); });
}
void RunBackward(const SoftmaxCase& c, const float* y, const float* dy, float* dx) {
  RunKernel(sm::RowBlocks(c.n, c.cap), sm::RowThreads(c.c),
            [&] { sm::SoftmaxBackwardKernel(y, dy, dx, c.n, c.c); });
}

// The kernel's and the CPU twin's y against the exact softmax, row by row (see the file
// comment): relative to the exact p_j, which no cancellation makes small.
void CheckForwardRows(const SoftmaxCase& c, const std::vector<float>& x,
                      const std::vector<float>& y, const std::vector<float>& y_cpu,
                      const std::string& name) {
  double used = 0.0, used_cpu = 0.0;
  for (int64_t r = 0; r < c.n; ++r) {
    const float* xr = x.data() + r * c.c;
    const float max = *std::max_element(xr, xr + c.c);
    double sum = 0.0, range = 0.0;
    for (int64_t j = 0; j < c.c; ++j) {
      sum += std::exp(double(xr[j]) - max);
      range = std::max(range, double(max) - xr[j]);
    }
    const double a = 4 * kU + kU * range;  // one term's relative error, either side
    // The reciprocal and the product, either side; the exact value's own double roundings.
    const double common = 2 * kU + kUd + Gamma(c.c + 8, kUd);
    const double gpu = 1.01 * (2 * a + Gamma(c.c, kUd) + common);
    const double cpu = 1.01 * (2 * a + Gamma(c.c / 16 + 1) + Gamma(16 + c.c % 16, kUd) + common);
    for (int64_t j = 0; j < c.c; ++j) {
      const double p = std::exp(double(xr[j]) - max) / sum;
      const double got = y[r * c.c + j], want = y_cpu[r * c.c + j];
      ASSERT_LE(std::fabs(got - p), gpu * p) << name << " row " << r << " column " << j;
      ASSERT_LE(std::fabs(got - want), (gpu + cpu) * p)
          << name << " vs cpu, row " << r << " column " << j;
      if (p > 0) {
        used = std::max(used, std::fabs(got - p) / (gpu * p));
        used_cpu = std::max(used_cpu, std::fabs(got - want) / ((gpu + cpu) * p));
      }
    }
  }
  std::printf("  %-50s bound used %.3f (vs cpu %.3f)\n", name.c_str(), used, used_cpu);
}

void CheckSoftmaxForward(const SoftmaxCase& c, uint32_t seed) {
  const std::string name = Name(c);
  const int64_t n = c.n * c.c;
  std::vector<float> x = Uniform(n, seed, -8.0f, 8.0f);
  if (c.n > 1) std::fill(x.begin() + c.c, x.begin() + 2 * c.c, 0.75f);  // a constant row
  std::vector<float> y(static_cast<size_t>(n), kNaN);
  RunForward(c, x.data(), y.data());
  Tensor want = Tensor::Empty({c.n, c.c}, DType::kF32);
  cpu::SoftmaxForward(Tensor::FromVector(x, {c.n, c.c}), want);
  CheckForwardRows(c, x, y, want.ToVector<float>(), name);
  std::vector<float> in_place = x;
  RunForward(c, in_place.data(), in_place.data());
  EXPECT_TRUE(SameBits(in_place.data(), y.data(), n)) << name << ": y in place of x";
}

TEST(SoftmaxEmulationTest, ForwardWithinBoundsOfTheCpu) {
  const SoftmaxCase cases[] = {
      {1, 1, 1000},   // one value: y = 1
      {3, 5, 1000},   // 32 threads, most idle
      {7, 33, 3},     // 32 threads, two values for one; rows past the grid
      {4, 1000, 4},   // 256 threads, 1000 = 3 x 256 + 232
      {2, 5000, 1},   // 1024 threads (the cap), 5000 = 4 x 1024 + 904; one block, two rows
  };
  uint32_t seed = 30;
  for (const SoftmaxCase& c : cases) CheckSoftmaxForward(c, ++seed);
}

// The backward's bound on random inputs (see the file comment).
void CheckBackwardRows(const SoftmaxCase& c, const std::vector<float>& y,
                       const std::vector<float>& dy, const std::vector<float>& dx,
                       const std::vector<float>& dx_cpu, const std::string& name) {
  double used = 0.0;
  for (int64_t r = 0; r < c.n; ++r) {
    const float* yr = y.data() + r * c.c;
    const float* dyr = dy.data() + r * c.c;
    double dot = 0.0, mag = 0.0;  // products exact in double; the sum within gamma_d(c) mag
    for (int64_t j = 0; j < c.c; ++j) {
      dot += double(dyr[j]) * yr[j];
      mag += std::fabs(double(dyr[j]) * yr[j]);
    }
    const double err_gpu = kU * std::fabs(dot) + 1.01 * 2 * Gamma(c.c, kUd) * mag;
    const double err_cpu = kU * std::fabs(dot) +
                           1.01 * (Gamma(c.c / 16 + 1) + 2 * Gamma(c.c + 16, kUd)) * mag;
    const double dd = 1.01 * (err_gpu + err_cpu);  // |d - d_cpu|
    for (int64_t j = 0; j < c.c; ++j) {
      const double yj = std::fabs(yr[j]);
      const double spread = 2 * std::fabs(dyr[j] - dot) + err_gpu + err_cpu;
      const double bound = yj * dd + Gamma(2) * yj * spread;
      const double diff = std::fabs(double(dx[r * c.c + j]) - dx_cpu[r * c.c + j]);
      ASSERT_LE(diff, bound) << name << " row " << r << " column " << j;
      if (bound > 0) used = std::max(used, diff / bound);
    }
  }
  std::printf("  %-50s backward bound used %.3f\n", name.c_str(), used);
}

void CheckSoftmaxBackward(const SoftmaxCase& c, uint32_t seed, bool on_grid) {
  const std::string name = Name(c) + (on_grid ? " backward on a grid" : " backward");
  const int64_t n = c.n * c.c;
  std::vector<float> y = Uniform(n, seed, 0.0f, 1.0f), dy = Uniform(n, seed + 1);
  if (on_grid) {  // multiples of 2^-8: every product and sum below is exact
    for (float& v : y) v = std::round(v * 256.0f) / 256.0f;
    for (float& v : dy) v = std::round(v * 256.0f) / 256.0f;
  }
  std::vector<float> dx(static_cast<size_t>(n), kNaN);
  RunBackward(c, y.data(), dy.data(), dx.data());
  Tensor want_t = Tensor::Empty({c.n, c.c}, DType::kF32);
  cpu::SoftmaxBackward(Tensor::FromVector(y, {c.n, c.c}), Tensor::FromVector(dy, {c.n, c.c}),
                       want_t);
  const std::vector<float> want = want_t.ToVector<float>();
  if (on_grid) {
    EXPECT_TRUE(SameBits(dx.data(), want.data(), n)) << name;
  } else {
    CheckBackwardRows(c, y, dy, dx, want, name);
  }
  std::vector<float> in_place = dy;
  RunBackward(c, y.data(), in_place.data(), in_place.data());
  EXPECT_TRUE(SameBits(in_place.data(), dx.data(), n)) << name << ": dx in place of dy";
}

TEST(SoftmaxEmulationTest, BackwardAgainstTheCpu) {
  const SoftmaxCase cases[] = {
      {1, 1, 1000}, {3, 5, 1000}, {7, 33, 3}, {4, 1000, 4}, {2, 5000, 1},
  };
  uint32_t seed = 50;
  for (const SoftmaxCase& c : cases) {
    CheckSoftmaxBackward(c, seed += 2, false);
    CheckSoftmaxBackward(c, seed += 2, true);
  }
}

}  // namespace
}  // namespace switchyard::kernels
