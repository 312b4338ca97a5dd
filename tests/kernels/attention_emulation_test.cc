// The exact f32 attention's device code (kernels/cuda/attention_kernels.cuh: the masked row
// softmax of the forward, the masked exp and the masked softmax backward of the backward, and
// the warp-per-row delta and merge of ring attention's blocks) run on the CPU, without a GPU,
// through the host model of CUDA in tests/kernels/cuda_emulation.h, with attention.cu's launch
// shapes (a block of RowThreads(S) per score row; MaskedExpKernel on device_common.cuh's
// GridFor with its cap lowered so that the loop strides; a warp per (b, i, h) row, 8 a block),
// against the CPU twin's operations on the same rows (kernels/cpu/attention.cc, which runs
// cpu::SoftmaxRow, cpu::ExpShiftRow and cpu::SoftmaxRowBackward per score row). The cuBLAS
// products between the kernels, and with them the GQA head mapping (kv head h / (Hq / Hkv)),
// are host code that only the GPU tests run; the kernels see (nb, Hq, S, S) score rows and
// (B, S, Hq, hd) output rows, taken here with Hq 1 to 5 and nb 1 or 2.
//
// What it checks (u = 2^-24, gamma(m) = m u / (1 - m u); u_d, gamma_d the same in double):
//  - the masked softmax: masked keys (j > i under kCausal) +0; each visible p within its bound
//    of the exact softmax (double): expf's 2 ulp (4u) and the rounded x - max (u R, R the row's
//    range) per term, gamma(len) of the f32 block sum, the f32 reciprocal and product (2u);
//    and within that plus the CPU's own bound (VecExp's 2 ulp, 16 f32 lanes) of cpu::
//    SoftmaxRow's p; lse within the sum's relative error, logf's ulp and the f32 addition of
//    the exact logsumexp, and so of the CPU's lse; rows of 1, 5, 40, 130 and 300 keys (32 to
//    256 threads, causal rows shorter than the block, rows longer), kCausal and kFull;
//  - the masked exp: +0 on masked keys; within (4u + u |x - lse|) exp(x - lse) of the exact
//    value on both sides (expf; VecExp), so within twice that of cpu::ExpShiftRow's;
//  - the masked softmax backward: with delta, ds = p (dp - delta) is the CPU's expression, bit
//    for bit; without, the f32 dot is within gamma(len) sum |p dp| of the exact one and the
//    CPU's within u |D| + gamma(len / 16 + 1) sum |p dp|, which bound |ds - ds_cpu| by
//    |p| |dot - dot_cpu| + gamma(2) |p| (|dp - dot| + |dp - dot_cpu|); on inputs on a grid of
//    2^-8 every sum is exact and ds is cpu::SoftmaxRowBackward's bits; masked keys +0;
//  - delta (out f32 and bf16): each within u |D| + 2 gamma_d(hd) sum |dout out| of the exact
//    D, twice that of the CPU's; on a grid of 2^-8 the CPU's bits; rows not a multiple of the
//    block's 8 warps, hd 1, 8, 40 and 100 (lanes striding);
//  - the merge: cpu::AttentionMerge's bits (the same f32 expressions; the host model's expf
//    and log1pf are the C library's, which the CPU calls), with rows whose running lse is
//    -inf (the block's values taken), whose block lse is -inf, both, and equal lse. On a GPU
//    these bits are not promised: CUDA's expf and log1pf, and nvcc contracts o wa + ob wb
//    into one fma (the kernel has no _rn intrinsics; the host model compiles with
//    -ffp-contract=off), as it does the f32 dot of the masked softmax backward (within the
//    bound above all the same).
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

#include "engine/core/dtype.h"
#include "engine/core/tensor.h"
#include "kernels/attention.h"
#include "kernels/cpu/rows.h"
#include "kernels/softmax.h"
// Last: the host model defines CUDA's qualifiers as macros. The row kernels declare their
// shared arrays inside the kernel: static, they are one array for the CTA's threads.
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

#include "kernels/cuda/attention_kernels.cuh"
#include "tests/kernels/emulation_test_util.h"

namespace switchyard::kernels {
namespace {

namespace ad = cuda::attention_dev;

constexpr float kInf = std::numeric_limits<float>::infinity();

// Multiples of 2^-8 (products and sums of a few hundred of them are exact in f32).
std::vector<float> OnGrid(std::vector<float> x) {
  for (float& v : x) v = std::round(v * 256.0f) / 256.0f;
  return x;
}

bool IsPlusZero(float v) { return v == 0.0f && !std::signbit(v); }

// ---- The score-row kernels: rows r of (nb, Hq, S, S), query position r % S.

struct RowCase {
  int64_t nb, hq, s;
  bool causal;
  int64_t rows() const { return nb * hq * s; }
  int64_t len(int64_t r) const { return causal ? r % s + 1 : s; }
};

std::string Name(const RowCase& c, const char* what) {
  return std::string(what) + " (" + std::to_string(c.nb) + ", " + std::to_string(c.hq) + ", " +
         std::to_string(c.s) + ")" + (c.causal ? " causal" : " full");
}

// Rows of 1 to 300 keys: 32 to 256 threads, causal rows shorter than the block, and rows past
// it (S = 300: the threads stride over the keys).
const RowCase kRowCases[] = {
    {1, 1, 1, true},   {2, 3, 5, true},   {2, 3, 5, false},   {1, 2, 40, true},
    {2, 1, 40, false}, {1, 1, 300, true}, {1, 1, 130, false},
};

// The exact statistics of a row's first len scores.
struct RowStats {
  float max = 0.0f;
  double sum = 0.0, range = 0.0;  // sum of exp(x - max); max |x - max|
};
RowStats StatsOf(const float* x, int64_t len) {
  RowStats st;
  st.max = *std::max_element(x, x + len);
  for (int64_t j = 0; j < len; ++j) {
    st.sum += std::exp(double(x[j]) - st.max);
    st.range = std::max(st.range, double(st.max) - x[j]);
  }
  return st;
}

void CheckMaskedSoftmax(const RowCase& c, uint32_t seed) {
  const std::string name = Name(c, "masked softmax");
  const int64_t s = c.s, rows = c.rows();
  const std::vector<float> scores = Uniform(rows * s, seed, -6.0f, 6.0f);
  std::vector<float> p = scores, lse(static_cast<size_t>(rows), kNaN);
  RunKernel(static_cast<unsigned>(rows), ad::RowThreads(s),
            [&] { ad::MaskedSoftmaxKernel(p.data(), lse.data(), s, c.causal); });
  double used = 0.0, used_lse = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = c.len(r);
    const float* x = scores.data() + r * s;
    std::vector<float> cpu_p(x, x + len);
    const float cpu_lse = cpu::SoftmaxRow(cpu_p.data(), cpu_p.data(), len);
    const RowStats st = StatsOf(x, len);
    const double a = 4 * kU + kU * st.range;  // one term's relative error, either side
    const double exact_err = Gamma(len + 8, kUd);
    const double sum_gpu = 1.01 * (a + Gamma(len)), sum_cpu =
        1.01 * (a + Gamma(len / 16 + 1) + Gamma(16 + len % 16, kUd));
    const double gpu = 1.01 * (a + sum_gpu + 2 * kU) + exact_err;
    const double cpu = 1.01 * (a + sum_cpu + 2 * kU + kUd) + exact_err;
    for (int64_t j = 0; j < len; ++j) {
      const double exact = std::exp(double(x[j]) - st.max) / st.sum, got = p[r * s + j];
      ASSERT_LE(std::fabs(got - exact), gpu * exact) << name << " row " << r << " key " << j;
      ASSERT_LE(std::fabs(got - cpu_p[j]), (gpu + cpu) * exact)
          << name << " vs cpu, row " << r << " key " << j;
      used = std::max(used, std::fabs(got - exact) / (gpu * exact));
    }
    for (int64_t j = len; j < s; ++j) {
      ASSERT_TRUE(IsPlusZero(p[r * s + j])) << name << " masked row " << r << " key " << j;
    }
    const double log_sum = std::log(st.sum), exact_lse = st.max + log_sum;
    const double add = kU * (std::fabs(st.max) + log_sum) + 4 * kUd * (std::fabs(exact_lse) + 1);
    const double lse_gpu = 1.01 * sum_gpu + 2 * kU * log_sum + add;  // logf: 1 ulp
    const double lse_cpu = 1.01 * sum_cpu + kU * log_sum + add;     // double log, then f32
    ASSERT_LE(std::fabs(lse[r] - exact_lse), lse_gpu) << name << " lse of row " << r;
    ASSERT_LE(std::fabs(double(lse[r]) - cpu_lse), lse_gpu + lse_cpu)
        << name << " lse vs cpu, row " << r;
    used_lse = std::max(used_lse, std::fabs(lse[r] - exact_lse) / lse_gpu);
  }
  std::printf("  %-40s bound used: p %.3f, lse %.3f\n", name.c_str(), used, used_lse);
}

TEST(AttentionEmulationTest, MaskedSoftmaxWithinBoundsOfTheCpu) {
  uint32_t seed = 100;
  for (const RowCase& c : kRowCases) CheckMaskedSoftmax(c, ++seed);
}

void CheckMaskedExp(const RowCase& c, int64_t cap, uint32_t seed) {
  const std::string name = Name(c, "masked exp") + " cap " + std::to_string(cap);
  const int64_t s = c.s, rows = c.rows(), n = rows * s;
  const std::vector<float> scores = Uniform(n, seed, -6.0f, 6.0f);
  // Each row's lse as the forward leaves it (the CPU's, for its visible keys).
  std::vector<float> lse(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> row(scores.begin() + r * s, scores.begin() + r * s + c.len(r));
    lse[r] = cpu::SoftmaxRow(row.data(), row.data(), c.len(r));
  }
  std::vector<float> p = scores;
  RunKernel(cuda::GridFor(n, ad::kThreads, cap), ad::kThreads,
            [&] { ad::MaskedExpKernel(p.data(), lse.data(), s, n, c.causal); });
  double used = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    std::vector<float> cpu_p(scores.begin() + r * s, scores.begin() + (r + 1) * s);
    cpu::ExpShiftRow(cpu_p.data(), lse[r], cpu_p.data(), c.len(r));
    for (int64_t j = 0; j < s; ++j) {
      const float got = p[r * s + j];
      if (j >= c.len(r)) {
        ASSERT_TRUE(IsPlusZero(got)) << name << " masked row " << r << " key " << j;
        continue;
      }
      const double z = double(scores[r * s + j]) - lse[r], exact = std::exp(z);
      const double bound = 1.01 * (4 * kU + kU * std::fabs(z)) * exact + 2 * kUd * exact;
      ASSERT_LE(std::fabs(got - exact), bound) << name << " row " << r << " key " << j;
      ASSERT_LE(std::fabs(double(got) - cpu_p[j]), 2 * bound)
          << name << " vs cpu, row " << r << " key " << j;
      used = std::max(used, std::fabs(got - exact) / bound);
    }
  }
  std::printf("  %-40s bound used %.3f\n", name.c_str(), used);
}

TEST(AttentionEmulationTest, MaskedExpWithinBoundsOfTheCpu) {
  CheckMaskedExp(kRowCases[1], 1000, 121);  // 150 elements, one block
  CheckMaskedExp(kRowCases[2], 1000, 122);
  CheckMaskedExp(kRowCases[3], 3, 123);     // 3200 elements over 3 blocks: the loop strides
  CheckMaskedExp(kRowCases[6], 1, 124);     // 16900 elements, one block
}

// The backward's bound on random inputs without delta (see the file comment).
void CheckBackwardRow(const float* p, const float* dp, const float* ds, const float* ds_cpu,
                      int64_t len, double& used, const std::string& where) {
  double dot = 0.0, mag = 0.0;
  for (int64_t j = 0; j < len; ++j) {
    dot += double(p[j]) * dp[j];
    mag += std::fabs(double(p[j]) * dp[j]);
  }
  const double err_gpu = 1.01 * (Gamma(len) + Gamma(len, kUd)) * mag;
  const double err_cpu =
      kU * std::fabs(dot) + 1.01 * (Gamma(len / 16 + 1) + 2 * Gamma(len + 16, kUd)) * mag;
  for (int64_t j = 0; j < len; ++j) {
    const double pj = std::fabs(p[j]);
    const double bound = pj * (err_gpu + err_cpu) +
                         Gamma(2) * pj * (2 * std::fabs(dp[j] - dot) + err_gpu + err_cpu);
    const double diff = std::fabs(double(ds[j]) - ds_cpu[j]);
    ASSERT_LE(diff, bound) << where << " key " << j;
    if (bound > 0) used = std::max(used, diff / bound);
  }
}

// mode 0: delta given; 1: random inputs, no delta; 2: inputs on a grid, no delta.
void CheckMaskedBackward(const RowCase& c, int mode, uint32_t seed) {
  const char* what[] = {"backward with delta", "backward", "backward on a grid"};
  const std::string name = Name(c, what[mode]);
  const int64_t s = c.s, rows = c.rows(), n = rows * s;
  std::vector<float> p = Uniform(n, seed, 0.0f, 1.0f), dp0 = Uniform(n, seed + 1);
  if (mode == 2) p = OnGrid(p), dp0 = OnGrid(dp0);
  const std::vector<float> delta = Uniform(rows, seed + 2);
  std::vector<float> dp = dp0;
  RunKernel(static_cast<unsigned>(rows), ad::RowThreads(s), [&] {
    ad::MaskedSoftmaxBackwardKernel(p.data(), dp.data(), mode == 0 ? delta.data() : nullptr, s,
                                    c.causal);
  });
  double used = 0.0;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t len = c.len(r);
    const float* pr = p.data() + r * s;
    const float* dpr = dp0.data() + r * s;
    std::vector<float> want(dpr, dpr + len);
    if (mode == 0) {  // kernels/cpu/attention.cc's loop with delta
      for (int64_t j = 0; j < len; ++j) want[j] = pr[j] * (want[j] - delta[r]);
    } else {
      cpu::SoftmaxRowBackward(pr, want.data(), want.data(), len);
    }
    const std::string where = name + " row " + std::to_string(r);
    if (mode == 1) {
      CheckBackwardRow(pr, dpr, dp.data() + r * s, want.data(), len, used, where);
    } else {
      ASSERT_TRUE(SameBits(dp.data() + r * s, want.data(), len)) << where;
    }
    for (int64_t j = len; j < s; ++j) ASSERT_TRUE(IsPlusZero(dp[r * s + j])) << where << " " << j;
  }
  if (mode == 1) std::printf("  %-40s bound used %.3f\n", name.c_str(), used);
}

TEST(AttentionEmulationTest, MaskedSoftmaxBackwardAgainstTheCpu) {
  uint32_t seed = 140;
  for (const RowCase& c : kRowCases) {
    for (int mode = 0; mode < 3; ++mode) CheckMaskedBackward(c, mode, seed += 3);
  }
}

// ---- The warp-per-row kernels: rows (b, i, h) of (B, S, Hq, hd); lse, delta (B, Hq, S).

struct HeadCase {
  int64_t b, s, hq, hd;
  int64_t rows() const { return b * s * hq; }
  unsigned blocks() const {
    return static_cast<unsigned>((rows() + ad::kWarpsPerBlock - 1) / ad::kWarpsPerBlock);
  }
  std::string name(const char* what) const {
    return std::string(what) + " (" + std::to_string(b) + ", " + std::to_string(s) + ", " +
           std::to_string(hq) + ", " + std::to_string(hd) + ")";
  }
};

const HeadCase kHeadCases[] = {
    {1, 1, 1, 1},    // one row, one lane busy
    {1, 5, 3, 8},    // 15 rows: two blocks, the second 7 warps idle
    {2, 3, 4, 40},   // 24 rows, lanes 0-7 take two elements
    {2, 2, 5, 100},  // 20 rows, 100 = 3 x 32 + 4
};

template <typename TO>
void CheckDelta(const HeadCase& c, bool on_grid, uint32_t seed) {
  const std::string name =
      c.name(sizeof(TO) == 4 ? "delta f32" : "delta bf16") + (on_grid ? " on a grid" : "");
  const int64_t rows = c.rows(), n = rows * c.hd;
  std::vector<float> out_f = Uniform(n, seed, -2.0f, 2.0f), dout = Uniform(n, seed + 1);
  if (on_grid) out_f = OnGrid(out_f), dout = OnGrid(dout);
  std::vector<TO> out(out_f.begin(), out_f.end());  // bf16: rounded to nearest even
  std::vector<float> delta(static_cast<size_t>(rows), kNaN);
  RunKernel(c.blocks(), 32 * ad::kWarpsPerBlock, [&] {
    ad::DeltaKernel<TO>(out.data(), dout.data(), delta.data(), c.s, c.hq, c.hd, rows);
  });
  Tensor want_t = Tensor::Empty({c.b, c.hq, c.s}, DType::kF32);
  cpu::AttentionBackwardDelta(Tensor::FromVector(out, {c.b, c.s, c.hq, c.hd}),
                              Tensor::FromVector(dout, {c.b, c.s, c.hq, c.hd}), want_t);
  const std::vector<float> want = want_t.ToVector<float>();
  if (on_grid) {
    EXPECT_TRUE(SameBits(delta.data(), want.data(), rows)) << name;
    return;
  }
  for (int64_t row = 0; row < rows; ++row) {
    const int64_t h = row % c.hq, i = (row / c.hq) % c.s, b = row / (c.hq * c.s);
    const int64_t at = (b * c.hq + h) * c.s + i;
    double dot = 0.0, mag = 0.0;
    for (int64_t e = 0; e < c.hd; ++e) {
      const double t = double(dout[row * c.hd + e]) * static_cast<float>(out[row * c.hd + e]);
      dot += t;
      mag += std::fabs(t);
    }
    const double bound = kU * std::fabs(dot) + 1.01 * 2 * Gamma(c.hd, kUd) * mag;
    ASSERT_LE(std::fabs(delta[at] - dot), bound) << name << " row " << row;
    ASSERT_LE(std::fabs(double(delta[at]) - want[at]), 2 * bound) << name << " vs cpu " << row;
  }
}

TEST(AttentionEmulationTest, DeltaAgainstTheCpu) {
  uint32_t seed = 200;
  for (const HeadCase& c : kHeadCases) {
    for (bool grid : {false, true}) {
      CheckDelta<float>(c, grid, seed += 2);
      CheckDelta<BFloat16>(c, grid, seed += 2);
    }
  }
}

void CheckMerge(const HeadCase& c, uint32_t seed) {
  const std::string name = c.name("merge");
  const int64_t rows = c.rows(), n = rows * c.hd;
  const std::vector<float> out0 = Uniform(n, seed), out_b = Uniform(n, seed + 1);
  std::vector<float> lse0 = Uniform(rows, seed + 2, -3.0f, 5.0f);
  std::vector<float> lse_b = Uniform(rows, seed + 3, -3.0f, 5.0f);
  // Rows by their lse index: nothing seen yet, an empty block, both, and equal lse.
  for (int64_t r = 0; r < rows; ++r) {
    if (r % 5 == 1) lse0[r] = -kInf;
    if (r % 7 == 2) lse_b[r] = -kInf;
    if (r % 11 == 3) lse0[r] = lse_b[r] = -kInf;
    if (r % 6 == 4) lse_b[r] = lse0[r];
  }
  std::vector<float> out = out0, lse = lse0;
  RunKernel(c.blocks(), 32 * ad::kWarpsPerBlock, [&] {
    ad::MergeKernel(out.data(), lse.data(), out_b.data(), lse_b.data(), c.s, c.hq, c.hd, rows);
  });
  Tensor want_out = Tensor::FromVector(out0, {c.b, c.s, c.hq, c.hd});
  Tensor want_lse = Tensor::FromVector(lse0, {c.b, c.hq, c.s});
  cpu::AttentionMerge(want_out, want_lse, Tensor::FromVector(out_b, {c.b, c.s, c.hq, c.hd}),
                      Tensor::FromVector(lse_b, {c.b, c.hq, c.s}));
  EXPECT_TRUE(SameBits(out.data(), want_out.ToVector<float>().data(), n)) << name << " out";
  EXPECT_TRUE(SameBits(lse.data(), want_lse.ToVector<float>().data(), rows)) << name << " lse";
}

TEST(AttentionEmulationTest, MergeIsTheCpusBits) {
  uint32_t seed = 300;
  for (const HeadCase& c : kHeadCases) CheckMerge(c, seed += 4);
}

}  // namespace
}  // namespace switchyard::kernels
