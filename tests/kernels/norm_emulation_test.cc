// The norms' device code (kernels/cuda/norm_kernels.cuh: the LayerNorm and RmsNorm forward,
// with and without the residual add, their dx written or added into dx, and the two stages of
// the dweight / dbias column sums) run on the CPU, without a GPU, through the host model of
// CUDA in tests/kernels/cuda_emulation.h, with norm.cu's launch shapes (RowShapeOf,
// ColumnShapeOf; their caps lowered to run the grid-stride loops and chunks of more than
// kChunkRows rows), against the CPU ops of kernels/norm.h.
//
// What is exact, and what is bounded (u = 2^-24, g(m) = m 2^-53 / (1 - m 2^-53)):
//  - the residual sum x + r: the CPU's bits;
//  - the row statistics are double sums in another order than the CPU's, rounded to f32:
//    a double sum of m terms is within g(m) sum |term| of the exact sum, so mean, rstd (forward)
//    and mean(g), mean(g xhat), mean(g x) (dx) are each one of the floats nearest a value
//    within that bound of the exact statistic (computed here in long double). The forward's
//    statistics are outputs and are checked so; the elementwise outputs must then be the CPU's
//    f32 expression at the kernel's statistics, bit for bit (dx: at one admissible pair of
//    statistics for the whole row), and the CPU's own bits where the statistics are the CPU's;
//  - inputs on a grid of 2^-q with widths 256 and 4096 make every double sum of the forward
//    exact: there the outputs are the CPU's bits (memcmp);
//  - stage 1's chunk sums: within (u [LayerNorm's f32 product] + 2 g(rows + 2)) sum |term| of
//    the exact chunk sum; stage 2: the bits of its definition (the chunks added in order in
//    double, then one rounding); dweight / dbias within 2 (u + g) (|initial| + sum |term|) of
//    the exact value and 4 (u + g) of that of the CPU (which rounds the sum to f32 before
//    adding it: two roundings each);
//  - y in place of x, sum in place of x, dx in place of dy: the out-of-place kernel's bits;
//    inputs the kernels must not write are checked unchanged, outputs start as NaN.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <initializer_list>
#include <iterator>
#include <limits>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/norm.h"
#include "kernels/random.h"
// Last: the host model defines CUDA's qualifiers as macros. The norm kernels declare their
// shared arrays inside the kernel: static, they are one array for the CTA's threads (which
// the host model does not refill with NaN between CTAs).
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

// CUDA's min of two 64-bit integers (ColumnPartialKernel's row end), which the host model lacks.
inline int64_t min(int64_t a, int64_t b) { return a < b ? a : b; }

#include "kernels/cuda/norm_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace nd = cuda::norm_dev;

constexpr float kEps = 1e-5f;
constexpr long double kU32 = 0x1p-24L;
const float kNaN = std::numeric_limits<float>::quiet_NaN();
unsigned char unused_smem[1];  // the kernels' shared arrays are static, none dynamic

long double Gamma53(int64_t m) {
  const long double u = 0x1p-53L;
  return m * u / (1 - m * u);
}

bool SameBits(float a, float b) { return std::memcmp(&a, &b, sizeof(float)) == 0; }
bool SameBits(const float* a, const float* b, int64_t n) {
  return std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// n values in [lo, hi); quantum_bits >= 0: rounded to multiples of 2^-quantum_bits.
std::vector<float> Uniform(int64_t n, uint64_t stream, float lo, float hi, int quantum_bits = -1) {
  Tensor t = Tensor::Empty({n}, DType::kF32);
  FillUniform(t, RngKey{43, stream}, 0, lo, hi);
  std::vector<float> v = t.ToVector<float>();
  if (quantum_bits >= 0) {
    for (float& e : v) e = std::ldexp(std::round(std::ldexp(e, quantum_bits)), -quantum_bits);
  }
  return v;
}

// The floats that round-to-nearest gives for some value in [e - b, e + b] (at most 64).
std::vector<float> Nearest(long double e, long double b) {
  std::vector<float> out;
  const float hi = static_cast<float>(e + b);
  for (float f = static_cast<float>(e - b); f <= hi && out.size() < 64;
       f = std::nextafter(f, INFINITY)) {
    out.push_back(f);
  }
  return out;
}
bool IsNearest(float v, long double e, long double b) {
  return v >= static_cast<float>(e - b) && v <= static_cast<float>(e + b);
}

// ---- forward -------------------------------------------------------------------------------

struct Rows {
  int64_t n, d, max_blocks;  // rows, width, the row grid's cap
  int quantum_bits = -1;     // >= 0: inputs on a grid of 2^-q (exact double sums)
};

std::string NameOf(const char* what, const Rows& s) {
  return std::string(what) + " n " + std::to_string(s.n) + " d " + std::to_string(s.d) +
         " blocks " + std::to_string(nd::RowShapeOf(s.n, s.d, s.max_blocks).blocks);
}

// Launches as norm.cu's LaunchRows does: warp(vec) on the warp-row grid when the rows fit the
// warp-row kernels (counted in warp_launches), else block() on the block-per-row grid.
int warp_launches = 0, block_launches = 0;
template <typename Warp, typename Block>
void LaunchRows(const Rows& s, std::initializer_list<const void*> operands, Warp&& warp,
                Block&& block) {
  if (nd::UseWarpRows(s.d, operands)) {
    ++warp_launches;
    const nd::RowShape shape = nd::WarpRowShapeOf(s.n, s.max_blocks);
    nd::WithWarpVec(nd::WarpVecOf(s.d), [&](auto vec) {
      emu::Launch(EmuDim3{shape.blocks, 1, 1}, static_cast<int>(shape.threads), unused_smem, 0, 0,
                  [&] { warp(vec); });
    });
  } else {
    ++block_launches;
    const nd::RowShape shape = nd::RowShapeOf(s.n, s.d, s.max_blocks);
    emu::Launch(EmuDim3{shape.blocks, 1, 1}, static_cast<int>(shape.threads), unused_smem, 0, 0,
                block);
  }
}

// The operands of one forward: b empty (no bias) or (d); res empty (no residual) or (n, d).
struct FwdIn {
  bool layer;
  std::vector<float> x, res, w, b;
};
struct FwdOut {
  std::vector<float> y, mean, rstd, sum;  // mean empty for RmsNorm, sum without residual
};

// The forward kernel as norm.cu launches it; in_place: y in x's memory (without residual) or
// sum in x's memory (with residual).
FwdOut RunForward(const FwdIn& in, const Rows& s, bool in_place) {
  const int64_t n = s.n, d = s.d;
  std::vector<float> x = in.x;
  FwdOut o{std::vector<float>(n * d, kNaN), std::vector<float>(in.layer ? n : 0, kNaN),
           std::vector<float>(n, kNaN), std::vector<float>(in.res.empty() ? 0 : n * d, kNaN)};
  float* y = in_place && in.res.empty() ? x.data() : o.y.data();
  float* sum = in.res.empty() ? nullptr : (in_place ? x.data() : o.sum.data());
  const float* res = in.res.empty() ? nullptr : in.res.data();
  const float* b = in.b.empty() ? nullptr : in.b.data();
  LaunchRows(
      s, {x.data(), in.w.data(), b, y, res, sum},
      [&](auto vec) {
        constexpr int kVec = decltype(vec)::value;
        if (in.layer) {
          nd::LayerNormForwardWarpKernel<kVec>(x.data(), in.w.data(), b, kEps, y, o.mean.data(),
                                               o.rstd.data(), n, d, res, sum);
        } else {
          nd::RmsNormForwardWarpKernel<kVec>(x.data(), in.w.data(), kEps, y, o.rstd.data(), n, d,
                                             res, sum);
        }
      },
      [&] {
        if (in.layer) {
          nd::LayerNormForwardKernel(x.data(), in.w.data(), b, kEps, y, o.mean.data(),
                                     o.rstd.data(), n, d, res, sum);
        } else {
          nd::RmsNormForwardKernel(x.data(), in.w.data(), kEps, y, o.rstd.data(), n, d, res, sum);
        }
      });
  if (!in_place) {
    EXPECT_TRUE(SameBits(x.data(), in.x.data(), n * d)) << "x was written";
  } else if (in.res.empty()) {
    o.y = x;
  } else {
    o.sum = x;
  }
  return o;
}

// The CPU ops of kernels/norm.h on the same operands.
FwdOut CpuForward(const FwdIn& in, int64_t n, int64_t d) {
  const Tensor x = Tensor::FromVector(in.x, {n, d}), w = Tensor::FromVector(in.w, {d});
  const Tensor b = in.b.empty() ? Tensor() : Tensor::FromVector(in.b, {d});
  Tensor y = Tensor::Empty({n, d}, DType::kF32), sum = Tensor::Empty({n, d}, DType::kF32);
  Tensor mean = Tensor::Empty({n}, DType::kF32), rstd = Tensor::Empty({n}, DType::kF32);
  if (in.res.empty() && in.layer) LayerNormForward(x, w, b, kEps, y, mean, rstd);
  if (in.res.empty() && !in.layer) RmsNormForward(x, w, kEps, y, rstd);
  const Tensor r = in.res.empty() ? Tensor() : Tensor::FromVector(in.res, {n, d});
  if (!in.res.empty() && in.layer) AddLayerNormForward(x, r, w, b, kEps, sum, y, mean, rstd);
  if (!in.res.empty() && !in.layer) AddRmsNormForward(x, r, w, kEps, sum, y, rstd);
  return {y.ToVector<float>(), in.layer ? mean.ToVector<float>() : std::vector<float>(),
          rstd.ToVector<float>(), in.res.empty() ? std::vector<float>() : sum.ToVector<float>()};
}

// Row r's statistics within their bounds of the exact ones (file comment), and y the CPU's f32
// expression at them; returns whether they are the CPU's statistics.
bool CheckForwardRow(const FwdIn& in, const float* xr, int64_t r, int64_t d, const FwdOut& got,
                     const FwdOut& cpu, const std::string& name) {
  const float s = got.rstd[r], m = in.layer ? got.mean[r] : 0.0f;
  if (in.layer) {
    long double sum = 0, mag = 0;
    for (int64_t j = 0; j < d; ++j) sum += xr[j], mag += std::fabs(xr[j]);
    const long double mu = sum / d, b_mu = 2 * Gamma53(d + 2) * mag / d;
    EXPECT_TRUE(IsNearest(m, mu, b_mu)) << name << " row " << r << " mean " << m;
    long double var = 0;
    for (int64_t j = 0; j < d; ++j) var += (xr[j] - mu) * (xr[j] - mu);
    const long double rs = 1 / std::sqrt(var / d + kEps);
    // The device's var is that of x about its own mean, b_mu away: b_mu^2 more at most.
    EXPECT_TRUE(IsNearest(s, rs, rs * (2 * Gamma53(d + 8) + b_mu * b_mu / kEps)))
        << name << " row " << r << " rstd " << s;
  } else {
    long double ss = 0;
    for (int64_t j = 0; j < d; ++j) ss += static_cast<long double>(xr[j]) * xr[j];
    const long double rs = 1 / std::sqrt(ss / d + kEps);
    EXPECT_TRUE(IsNearest(s, rs, rs * 2 * Gamma53(d + 6))) << name << " row " << r << " rstd";
  }
  const float* yr = got.y.data() + r * d;
  for (int64_t j = 0; j < d; ++j) {
    float want = in.layer ? (xr[j] - m) * s * in.w[j] : xr[j] * s * in.w[j];
    if (!in.b.empty()) want = want + in.b[j];
    if (!SameBits(yr[j], want)) {
      ADD_FAILURE() << name << " y[" << r << ", " << j << "] " << yr[j] << ", want " << want;
      return false;
    }
  }
  const bool same_stats = SameBits(s, cpu.rstd[r]) && (!in.layer || SameBits(m, cpu.mean[r]));
  if (same_stats) {
    EXPECT_TRUE(SameBits(yr, cpu.y.data() + r * d, d)) << name << " row " << r;
  }
  return same_stats;
}

// A bf16 y (bf16 activation storage: the products' operand): the kernel stores the f32
// kernel's y rounded, element for element; the CPU op the CPU's f32 y rounded.
void CheckBf16Output(const FwdIn& in, const Rows& s, const FwdOut& got, const FwdOut& cpu,
                     const std::string& name) {
  const int64_t n = s.n, d = s.d;
  std::vector<BFloat16> y16(n * d, BFloat16(kNaN));
  std::vector<float> mean(n, kNaN), rstd(n, kNaN), sum(in.res.empty() ? 0 : n * d, kNaN);
  const float* res = in.res.empty() ? nullptr : in.res.data();
  float* sum_out = in.res.empty() ? nullptr : sum.data();
  const float* b = in.b.empty() ? nullptr : in.b.data();
  LaunchRows(
      s, {in.x.data(), in.w.data(), b, y16.data(), res, sum_out},
      [&](auto vec) {
        constexpr int kVec = decltype(vec)::value;
        if (in.layer) {
          nd::LayerNormForwardWarpKernel<kVec>(in.x.data(), in.w.data(), b, kEps, y16.data(),
                                               mean.data(), rstd.data(), n, d, res, sum_out);
        } else {
          nd::RmsNormForwardWarpKernel<kVec>(in.x.data(), in.w.data(), kEps, y16.data(),
                                             rstd.data(), n, d, res, sum_out);
        }
      },
      [&] {
        if (in.layer) {
          nd::LayerNormForwardKernel(in.x.data(), in.w.data(), b, kEps, y16.data(), mean.data(),
                                     rstd.data(), n, d, res, sum_out);
        } else {
          nd::RmsNormForwardKernel(in.x.data(), in.w.data(), kEps, y16.data(), rstd.data(), n, d,
                                   res, sum_out);
        }
      });
  EXPECT_TRUE(SameBits(rstd.data(), got.rstd.data(), n)) << name << " bf16 y: rstd";
  for (int64_t i = 0; i < n * d; ++i) {
    if (y16[i].bits != BFloat16(got.y[i]).bits) {
      ADD_FAILURE() << name << " bf16 y[" << i << "] " << float(y16[i]) << ", the f32 y "
                    << got.y[i] << " rounded is " << float(BFloat16(got.y[i]));
      break;
    }
  }
  // The CPU op into a bf16 y.
  const Tensor x = Tensor::FromVector(in.x, {n, d}), w = Tensor::FromVector(in.w, {d});
  const Tensor bt = in.b.empty() ? Tensor() : Tensor::FromVector(in.b, {d});
  const Tensor r = in.res.empty() ? Tensor() : Tensor::FromVector(in.res, {n, d});
  Tensor yc = Tensor::Empty({n, d}, DType::kBF16), st = Tensor::Empty({n, d}, DType::kF32);
  Tensor mt = Tensor::Empty({n}, DType::kF32), rt = Tensor::Empty({n}, DType::kF32);
  if (in.res.empty() && in.layer) LayerNormForward(x, w, bt, kEps, yc, mt, rt);
  if (in.res.empty() && !in.layer) RmsNormForward(x, w, kEps, yc, rt);
  if (!in.res.empty() && in.layer) AddLayerNormForward(x, r, w, bt, kEps, st, yc, mt, rt);
  if (!in.res.empty() && !in.layer) AddRmsNormForward(x, r, w, kEps, st, yc, rt);
  const std::vector<BFloat16> yv = yc.ToVector<BFloat16>();
  for (int64_t i = 0; i < n * d; ++i) {
    if (yv[i].bits != BFloat16(cpu.y[i]).bits) {
      ADD_FAILURE() << name << " CPU bf16 y[" << i << "] " << float(yv[i]) << ", want "
                    << float(BFloat16(cpu.y[i]));
      break;
    }
  }
}

// The kernel's forward against the CPU's; returns the rows whose statistics differ from the
// CPU's (reduction order).
int CheckForward(const FwdIn& in, const Rows& s, const std::string& name, bool in_place = true) {
  const int64_t n = s.n, d = s.d;
  const FwdOut got = RunForward(in, s, /*in_place=*/false);
  const FwdOut cpu = CpuForward(in, n, d);
  if (!in.res.empty()) {
    EXPECT_TRUE(SameBits(got.sum.data(), cpu.sum.data(), n * d)) << name << " sum";
  }
  CheckBf16Output(in, s, got, cpu, name);
  const std::vector<float>& xn = in.res.empty() ? in.x : cpu.sum;  // the rows normalised
  int differ = 0;
  for (int64_t r = 0; r < n; ++r) differ += !CheckForwardRow(in, &xn[r * d], r, d, got, cpu, name);
  if (s.quantum_bits >= 0) {  // every double sum exact: the CPU's bits throughout
    EXPECT_TRUE(SameBits(got.y.data(), cpu.y.data(), n * d)) << name << " y (exact sums)";
    EXPECT_TRUE(SameBits(got.rstd.data(), cpu.rstd.data(), n)) << name << " rstd (exact sums)";
    if (in.layer) {
      EXPECT_TRUE(SameBits(got.mean.data(), cpu.mean.data(), n)) << name << " mean (exact sums)";
    }
  }
  if (!in_place) return differ;
  const FwdOut again = RunForward(in, s, /*in_place=*/true);
  EXPECT_TRUE(SameBits(again.y.data(), got.y.data(), n * d)) << name << " in place";
  EXPECT_TRUE(SameBits(again.rstd.data(), got.rstd.data(), n)) << name << " in place";
  if (!in.res.empty()) {
    EXPECT_TRUE(SameBits(again.sum.data(), got.sum.data(), n * d)) << name << " sum in place";
  }
  return differ;
}

// One row of one column; widths not multiples of 32; wider than the 256 threads of a block;
// more rows than blocks (grid-stride); inputs on a grid (exact sums, forward only).
// Widths off 4 (the block-per-row kernels) and on it (the warp-row ones: d 64, 300, 1000, 128,
// 132 with one lane's quad past 128, 2048 the widest); caps that make either grid stride.
const Rows kRowShapes[] = {
    {1, 1, nd::kMaxRowBlocks}, {7, 31, nd::kMaxRowBlocks}, {5, 33, 2}, {3, 300, nd::kMaxRowBlocks},
    {2, 1000, 1},              {20, 64, 7},                {37, 128, 2}, {9, 132, 2},
    {3, 2048, 1},
};
const Rows kExactShapes[] = {{4, 256, nd::kMaxRowBlocks, 6}, {3, 4096, 2, 4}};

TEST(NormEmulationTest, ForwardIsTheCpuExpressionAtBoundedStatistics) {
  uint64_t stream = 0;
  int differ = 0, rows = 0;
  std::vector<Rows> shapes(std::begin(kRowShapes), std::end(kRowShapes));
  shapes.insert(shapes.end(), std::begin(kExactShapes), std::end(kExactShapes));
  for (const Rows& s : shapes) {
    const int q = s.quantum_bits;
    const std::vector<float> x = Uniform(s.n * s.d, ++stream, -2.0f, 3.0f, q);
    const std::vector<float> res = Uniform(s.n * s.d, ++stream, -2.0f, 3.0f, q);
    const std::vector<float> w = Uniform(s.d, ++stream, 0.5f, 1.5f, q);
    const std::vector<float> b = Uniform(s.d, ++stream, -1.0f, 1.0f, q);
    for (bool residual : {false, true}) {
      const std::vector<float> r = residual ? res : std::vector<float>();
      const char* tag = residual ? " residual" : "";
      differ += CheckForward({true, x, r, w, b}, s, NameOf("layernorm", s) + tag);
      differ += CheckForward({false, x, r, w, {}}, s, NameOf("rmsnorm", s) + tag);
      rows += 2 * static_cast<int>(s.n);
    }
    // Without a bias: only y's last addition differs (and the in-place runs are above).
    differ += CheckForward({true, x, {}, w, {}}, s, NameOf("layernorm (no bias)", s), false);
    rows += static_cast<int>(s.n);
  }
  std::printf("  forward: %d of %d rows with statistics other than the CPU's\n", differ, rows);
  EXPECT_GT(warp_launches, 0) << "no shape took the warp-row kernels";
  EXPECT_GT(block_launches, 0) << "no shape took the block-per-row kernels";
}

// ---- backward ----------------------------------------------------------------------------

// The operands of one backward (mean empty for RmsNorm); dx0: what dx holds before (kAdd).
struct BwdIn {
  bool layer;
  std::vector<float> x, w, mean, rstd, dy, dx0;
};

// The dx kernel as norm.cu launches it; dx starts as dx0 (add) or NaN, or dx_is_dy: in dy's
// memory.
std::vector<float> RunDx(const BwdIn& in, const Rows& s, bool add, bool dx_is_dy) {
  const int64_t n = s.n, d = s.d;
  std::vector<float> dy = in.dy;
  std::vector<float> dx = dx_is_dy ? std::vector<float>()
                                   : (add ? in.dx0 : std::vector<float>(n * d, kNaN));
  float* out = dx_is_dy ? dy.data() : dx.data();
  LaunchRows(
      s, {in.x.data(), in.w.data(), dy.data(), out},
      [&](auto vec) {
        constexpr int kVec = decltype(vec)::value;
        if (in.layer) {
          nd::LayerNormDxWarpKernel<kVec>(in.x.data(), in.w.data(), in.mean.data(),
                                          in.rstd.data(), dy.data(), out, n, d, add);
        } else {
          nd::RmsNormDxWarpKernel<kVec>(in.x.data(), in.w.data(), in.rstd.data(), dy.data(), out,
                                        n, d, add);
        }
      },
      [&] {
        if (in.layer) {
          nd::LayerNormDxKernel(in.x.data(), in.w.data(), in.mean.data(), in.rstd.data(),
                                dy.data(), out, n, d, add);
        } else {
          nd::RmsNormDxKernel(in.x.data(), in.w.data(), in.rstd.data(), dy.data(), out, n, d,
                              add);
        }
      });
  if (dx_is_dy) return dy;
  EXPECT_TRUE(SameBits(dy.data(), in.dy.data(), n * d)) << "dy was written";
  return dx;
}

// Row r of dx: the CPU's f32 expression, at one pair of admissible statistics for the whole row
// (file comment); returns whether the row is the CPU's.
bool CheckDxRow(const BwdIn& in, int64_t r, int64_t d, bool add, const float* got,
                const float* cpu, const std::string& name) {
  const float* xr = &in.x[r * d];
  const float* dyr = &in.dy[r * d];
  const float* dx0 = &in.dx0[r * d];
  const float s = in.rstd[r], m = in.layer ? in.mean[r] : 0.0f;
  long double sum_g = 0, mag_g = 0, sum_gx = 0, mag_gx = 0;  // RmsNorm: sum_gx only
  for (int64_t j = 0; j < d; ++j) {
    const float xhat = (xr[j] - m) * s, g = dyr[j] * in.w[j];
    const long double t = in.layer ? static_cast<long double>(g) * xhat
                                   : static_cast<double>(dyr[j]) * in.w[j] * xr[j];
    sum_g += g, mag_g += std::fabs(g), sum_gx += t, mag_gx += std::fabs(t);
  }
  const std::vector<float> means_g =
      in.layer ? Nearest(sum_g / d, 2 * Gamma53(d + 2) * mag_g / d) : std::vector<float>{0.0f};
  const std::vector<float> means_gx = Nearest(sum_gx / d, 2 * Gamma53(d + 2) * mag_gx / d);
  EXPECT_LT(means_g.size() * means_gx.size(), 64u) << name << " row " << r << ": bound too wide";
  int64_t first_wrong = 0;
  for (float mg : means_g) {
    for (float mgx : means_gx) {
      int64_t j = 0;
      for (; j < d; ++j) {
        const float xhat = (xr[j] - m) * s, g = dyr[j] * in.w[j];
        const float v = in.layer ? s * (g - mg - xhat * mgx) : s * (g - xr[j] * (mgx * s * s));
        if (!SameBits(got[j], add ? dx0[j] + v : v)) break;
      }
      if (j == d) return SameBits(got, cpu, d);
      first_wrong = std::max(first_wrong, j);
    }
  }
  ADD_FAILURE() << name << " dx row " << r << ": no admissible statistics give it; element "
                << first_wrong << " is " << got[first_wrong] << ", the CPU's "
                << cpu[first_wrong];
  return false;
}

// Stage 1's chunk sums and stage 2's result: dweight (bias false) or dbias (file comment).
struct ColumnRun {
  const std::vector<double>& partial;
  const std::vector<float>& init;
  const std::vector<float>& got;
  const std::vector<float>& cpu;
};
void CheckColumn(const BwdIn& in, int64_t n, int64_t d, const nd::ColumnShape& cs, bool bias,
                 const ColumnRun& run, const std::string& name) {
  const long double slack = 1 + 0x1p-20L;  // second-order terms
  const long double g = Gamma53(2 * n + 4);
  for (int64_t j = 0; j < d; ++j) {
    long double total = 0, total_mag = 0;
    double stage2 = 0;
    for (int64_t c = 0; c < cs.chunks; ++c) {
      long double sum = 0, mag = 0;
      const int64_t r0 = c * cs.chunk_rows, r1 = std::min(n, r0 + cs.chunk_rows);
      for (int64_t r = r0; r < r1; ++r) {
        const float dy = in.dy[r * d + j], x = in.x[r * d + j];
        const long double t = bias       ? dy
                              : in.layer ? static_cast<long double>(dy) * ((x - in.mean[r]) *
                                                                           in.rstd[r])
                                         : dy * x * in.rstd[r];
        sum += t, mag += std::fabs(t);
      }
      const long double term_u = in.layer && !bias ? kU32 : 0;  // LayerNorm's f32 product
      const double p = run.partial[c * d + j];
      ASSERT_LE(std::fabs(p - sum), (term_u + 2 * Gamma53(r1 - r0 + 2)) * mag * slack)
          << name << " chunk " << c << " column " << j;
      stage2 += p;
      total += sum, total_mag += mag;
    }
    const float want = static_cast<float>(static_cast<double>(run.init[j]) + stage2);
    ASSERT_TRUE(SameBits(run.got[j], want)) << name << " column " << j << ": " << run.got[j]
                                            << ", its chunks give " << want;
    const long double mag = std::fabs(run.init[j]) + total_mag;
    ASSERT_LE(std::fabs(run.got[j] - (run.init[j] + total)), 2 * (kU32 + g) * mag * slack)
        << name << " column " << j << " against the exact sum";
    ASSERT_LE(std::fabs(static_cast<long double>(run.got[j]) - run.cpu[j]),
              4 * (kU32 + g) * mag * slack)
        << name << " column " << j << " against the CPU";
  }
}

struct Backward {
  Rows rows;
  int64_t max_chunks = nd::kMaxGridY, max_finish = cuda::kMaxGridBlocks;
  bool dx = true;  // run the dx kernel too (many rows: only the column sums)
};

// One backward, every output checked: dweight, dbias (db0 non-empty) and, when asked, dx.
// Returns the dx rows other than the CPU's.
int column_quads = 0;  // column-sum launches with four columns a thread
int CheckBackward(const BwdIn& in, const Backward& c, const std::vector<float>& dw0,
                  const std::vector<float>& db0, bool add, const std::string& name) {
  const int64_t n = c.rows.n, d = c.rows.d;
  const Tensor x = Tensor::FromVector(in.x, {n, d}), w = Tensor::FromVector(in.w, {d});
  const Tensor rstd = Tensor::FromVector(in.rstd, {n}), dy = Tensor::FromVector(in.dy, {n, d});
  Tensor dx = Tensor::FromVector(in.dx0, {n, d}), dw = Tensor::FromVector(dw0, {d});
  Tensor db = db0.empty() ? Tensor() : Tensor::FromVector(db0, {d});
  const Write write = add ? Write::kAdd : Write::kSet;
  if (in.layer) {
    LayerNormBackward(x, w, Tensor::FromVector(in.mean, {n}), rstd, dy, dx, dw, db, nullptr, write);
  } else {
    RmsNormBackward(x, w, rstd, dy, dx, dw, nullptr, write);
  }

  // Both stages as norm.cu launches them (its caps lowered as the case says).
  const int cols = nd::ColumnQuadsFit(d, in.x.data(), in.dy.data()) ? 4 : 1;
  const nd::ColumnShape cs = nd::ColumnShapeOf(n, d, c.max_chunks, c.max_finish, cols);
  std::vector<double> part_w(cs.chunks * d, std::numeric_limits<double>::quiet_NaN());
  std::vector<double> part_b(db0.empty() ? 0 : cs.chunks * d, part_w[0]);
  std::vector<float> got_w = dw0, got_b = db0;
  column_quads += cols == 4;
  emu::Launch(EmuDim3{cs.tiles, static_cast<unsigned>(cs.chunks), 1},
              EmuDim3{nd::kColTile, nd::kRowLanes, 1}, unused_smem, 0, 0, [&] {
                const float* mean = in.layer ? in.mean.data() : nullptr;
                double* pb = db0.empty() ? nullptr : part_b.data();
                if (cols == 4) {
                  nd::ColumnPartialKernel<4>(in.x.data(), in.dy.data(), mean, in.rstd.data(), n,
                                             d, cs.chunk_rows, part_w.data(), pb);
                } else {
                  nd::ColumnPartialKernel<1>(in.x.data(), in.dy.data(), mean, in.rstd.data(), n,
                                             d, cs.chunk_rows, part_w.data(), pb);
                }
              });
  for (bool bias : {false, true}) {
    if (bias && db0.empty()) continue;
    std::vector<float>& out = bias ? got_b : got_w;
    const std::vector<double>& part = bias ? part_b : part_w;
    emu::Launch(EmuDim3{cs.finish_blocks, 1, 1}, nd::kFinishThreads, unused_smem, 0, 0,
                [&] { nd::ColumnFinishKernel(part.data(), cs.chunks, d, out.data()); });
    const std::vector<float> cpu = (bias ? db : dw).ToVector<float>();
    CheckColumn(in, n, d, cs, bias, {part, bias ? db0 : dw0, out, cpu},
                name + (bias ? " dbias" : " dweight"));
  }
  if (!c.dx) return 0;

  const std::vector<float> got = RunDx(in, c.rows, add, /*dx_is_dy=*/false);
  const std::vector<float> cpu = dx.ToVector<float>();
  int differ = 0;
  for (int64_t r = 0; r < n; ++r) {
    differ += !CheckDxRow(in, r, d, add, &got[r * d], &cpu[r * d], name);
  }
  if (!add) {
    const std::vector<float> again = RunDx(in, c.rows, false, /*dx_is_dy=*/true);
    EXPECT_TRUE(SameBits(again.data(), got.data(), n * d)) << name << " dx in place of dy";
  }
  return differ;
}

std::vector<Backward> BackwardCases() {
  std::vector<Backward> cases;
  for (const Rows& s : kRowShapes) cases.push_back({s});
  const int64_t rows_cap = nd::kMaxRowBlocks;
  // More rows than a stage-1 chunk: 4 chunks (the last partial) over 3 column tiles (the
  // last partial); 9 chunks; 3 chunks of 334 rows (the chunk grid capped at 3) and stage 2 on
  // one block of 256 threads for 300 columns (its grid-stride loop).
  cases.push_back({{1000, 77, rows_cap}, nd::kMaxGridY, cuda::kMaxGridBlocks, false});
  cases.push_back({{2100, 40, rows_cap}, nd::kMaxGridY, cuda::kMaxGridBlocks, false});
  cases.push_back({{1000, 300, rows_cap}, 3, 1, false});
  return cases;
}

TEST(NormEmulationTest, BackwardDxAndColumnSumsMatchTheCpu) {
  const int warp_before = warp_launches, block_before = block_launches;
  uint64_t stream = 100;
  int differ = 0, rows = 0;
  for (const Backward& c : BackwardCases()) {
    const int64_t n = c.rows.n, d = c.rows.d;
    const std::vector<float> x = Uniform(n * d, ++stream, -2.0f, 3.0f);
    const std::vector<float> w = Uniform(d, ++stream, 0.5f, 1.5f);
    const std::vector<float> dy = Uniform(n * d, ++stream, -1.0f, 1.0f);
    const std::vector<float> dx0 = Uniform(n * d, ++stream, -3.0f, 3.0f);
    const std::vector<float> dw0 = Uniform(d, ++stream, -1.0f, 1.0f);
    const std::vector<float> db0 = Uniform(d, ++stream, -1.0f, 1.0f);
    // The statistics of the CPU's forward, on both sides (as norm_gpu_test.cc).
    const FwdOut ln = CpuForward({true, x, {}, w, {}}, n, d);
    const FwdOut rms = CpuForward({false, x, {}, w, {}}, n, d);
    const BwdIn layer{true, x, w, ln.mean, ln.rstd, dy, dx0};
    const BwdIn rmsnorm{false, x, w, {}, rms.rstd, dy, dx0};
    const std::string shape = NameOf("", c.rows);
    for (bool add : {false, true}) {
      const std::string tag = add ? " (dx added)" : "";
      differ += CheckBackward(layer, c, dw0, db0, add, "layernorm" + shape + tag);
      differ += CheckBackward(rmsnorm, c, dw0, {}, add, "rmsnorm" + shape + tag);
      if (c.dx) rows += 2 * static_cast<int>(n);
    }
    // Without a bias: the same dx (checked above), no dbias stage.
    Backward no_bias = c;
    no_bias.dx = false;
    CheckBackward(layer, no_bias, dw0, {}, false, "layernorm (no bias)" + shape);
  }
  std::printf("  dx: %d of %d rows other than the CPU's\n", differ, rows);
  EXPECT_GT(warp_launches, warp_before) << "no shape took the warp-row dx kernels";
  EXPECT_GT(block_launches, block_before) << "no shape took the block-per-row dx kernels";
  EXPECT_GT(column_quads, 0) << "no shape took the four-column column sums";
}

}  // namespace
}  // namespace switchyard::kernels
