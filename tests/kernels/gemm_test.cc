// kernels/gemm.h against naive triple loops in double: every transpose combination with
// alpha and beta, the grouped products with an empty group, and k = 0, each within the
// forward-error bound of a product (tests/testing/tolerance.h), whatever OpenBLAS's kernel. The bf16 mode
// (DeviceContext::matmul_dtype) is sgemm on operands rounded to bf16, exactly, and bf16
// operand tensors give the same results as f32 ones in bf16 mode.
#include "kernels/gemm.h"

#include <gtest/gtest.h>

#include <unistd.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/counters.h"
#include "engine/core/device_context.h"
#include "kernels/elementwise.h"
#include "kernels/activation.h"
#include "engine/core/philox.h"
#include "engine/core/thread_pool.h"
#include "kernels/random.h"
#include "tests/testing/address_space.h"
#include "tests/testing/tolerance.h"

namespace switchyard::kernels {
namespace {

Tensor RandomTensor(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  FillUniform(t, RngKey{7, stream}, 0, -1.0f, 1.0f);
  return t;
}

// |got - want| <= 2 (k + 3) u scale elementwise, scale = |alpha| |A||B| + |beta| |C0| (the
// product bound of tests/testing/tolerance.h: it holds for any summation order, so for any
// OpenBLAS kernel); want is the double sum.
void ExpectClose(const Tensor& got, const std::vector<double>& want,
                 const std::vector<double>& scale, int64_t k, const std::string& what) {
  test_util::ExpectWithinProductBound(got.ToVector<float>(), want, scale, k, what);
}

// a[i, j] of a row-major (rows, cols) matrix stored transposed or not.
double At(const std::vector<float>& m, int64_t cols, bool trans, int64_t i, int64_t j) {
  return trans ? m[j * cols + i] : m[i * cols + j];
}

TEST(GemmTest, AllTransposesWithAlphaBeta) {
  const int64_t m = 5, n = 7, k = 3;
  const float alpha = 0.75f, beta = -0.5f;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor a = RandomTensor(ta ? Shape{k, m} : Shape{m, k}, 1);
      Tensor b = RandomTensor(tb ? Shape{n, k} : Shape{k, n}, 2);
      Tensor c = RandomTensor({m, n}, 3);
      const std::vector<float> av = a.ToVector<float>(), bv = b.ToVector<float>(),
                               c0 = c.ToVector<float>();
      std::vector<double> want(m * n), scale(m * n);
      for (int64_t i = 0; i < m; ++i) {
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0.0, mag = 0.0;
          for (int64_t p = 0; p < k; ++p) {
            acc += At(av, a.dim(1), ta, i, p) * At(bv, b.dim(1), tb, p, j);
            mag += std::abs(At(av, a.dim(1), ta, i, p) * At(bv, b.dim(1), tb, p, j));
          }
          want[i * n + j] = alpha * acc + beta * c0[i * n + j];
          scale[i * n + j] = std::abs(alpha) * mag + std::abs(beta * c0[i * n + j]);
        }
      }
      Gemm(a, ta, b, tb, c, alpha, beta);
      ExpectClose(c, want, scale, k,
                  "trans_a=" + std::to_string(ta) + " trans_b=" + std::to_string(tb));
    }
  }
}

TEST(GemmTest, BetaZeroIgnoresNaNInOutput) {
  Tensor a = RandomTensor({2, 3}, 4), b = RandomTensor({3, 2}, 5);
  Tensor c = Tensor::FromVector<float>({NAN, NAN, NAN, NAN}, {2, 2});
  Gemm(a, false, b, false, c);
  for (float v : c.ToVector<float>()) EXPECT_TRUE(std::isfinite(v));
}

TEST(GemmTest, EmptyInnerDimensionScalesByBeta) {
  Tensor a = Tensor::Empty({3, 0}, DType::kF32), b = Tensor::Empty({0, 2}, DType::kF32);
  Tensor c = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Gemm(a, false, b, false, c, 1.0f, 0.5f);
  EXPECT_EQ(c.ToVector<float>(), (std::vector<float>{0.5f, 1, 1.5f, 2, 2.5f, 3}));
  Gemm(a, false, b, false, c, 1.0f, 0.0f);
  EXPECT_EQ(c.ToVector<float>(), std::vector<float>(6, 0.0f));
}

// GemmBias on the CPU is Gemm then AddBias, bit for bit, in f32 and bf16 mode (NaN in c not
// read); a bias that does not fit c's columns is refused.
TEST(GemmTest, GemmBiasIsGemmThenAddBias) {
  for (DType mode : {DType::kF32, DType::kBF16}) {
    auto ctx = DeviceContext::Create(Device::Cpu());
    ctx->set_matmul_dtype(mode);
    for (bool tb : {false, true}) {
      const Tensor a = RandomTensor({6, 9}, 20), bias = RandomTensor({5}, 22);
      const Tensor b = RandomTensor(tb ? Shape{5, 9} : Shape{9, 5}, 21);
      Tensor want = Tensor::Empty({6, 5}, DType::kF32);
      Gemm(a, false, b, tb, want, 1.0f, 0.0f, ctx.get());
      AddBias(want, bias, ctx.get());
      Tensor got = Tensor::FromVector(std::vector<float>(30, NAN), {6, 5});
      GemmBias(a, false, b, tb, bias, got, ctx.get());
      EXPECT_EQ(got.ToVector<float>(), want.ToVector<float>()) << DTypeName(mode) << " " << tb;
    }
  }
  Tensor c = Tensor::Empty({2, 3}, DType::kF32);
  EXPECT_DEATH(GemmBias(RandomTensor({2, 4}, 1), false, RandomTensor({4, 3}, 2), false,
                        RandomTensor({4}, 3), c),
               "GemmBias: bias");
}

// A bf16 tensor's bit patterns.
std::vector<uint16_t> Bits(const Tensor& t) {
  std::vector<uint16_t> out;
  for (const BFloat16& v : t.ToVector<BFloat16>()) out.push_back(v.bits);
  return out;
}

// A bf16 c (bf16 mode, beta 0) holds the f32 result rounded once: Gemm's (with alpha) and
// GemmBias's (with the bias) bits, then Cast, exactly; nothing is counted as a conversion (on
// CUDA the product writes bf16 itself); k = 0 gives zeros. A bf16 c in f32 mode, or with a
// beta other than 0, is refused with one line naming why.
TEST(GemmTest, Bf16OutputIsTheF32ResultRoundedOnce) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  ctx->set_matmul_dtype(DType::kBF16);
  for (bool tb : {false, true}) {
    const Tensor a = RandomTensor({7, 33}, 30), bias = RandomTensor({6}, 32);
    const Tensor b = RandomTensor(tb ? Shape{6, 33} : Shape{33, 6}, 31);
    Tensor f32 = Tensor::Empty({7, 6}, DType::kF32), want = Tensor::Empty({7, 6}, DType::kBF16);
    Tensor got = Tensor::Empty({7, 6}, DType::kBF16);
    const DeviceCounts before = counters::Snapshot();
    Gemm(a, false, b, tb, got, -0.75f, 0.0f, ctx.get());
    EXPECT_EQ(counters::Snapshot().Minus(before).conversion_calls[static_cast<int>(DType::kF32)]
                                                                  [static_cast<int>(DType::kBF16)],
              2)
        << "the product's two f32 operands, not its output";
    Gemm(a, false, b, tb, f32, -0.75f, 0.0f, ctx.get());
    Cast(f32, want, ctx.get());
    EXPECT_EQ(Bits(got), Bits(want)) << "Gemm " << tb;
    GemmBias(a, false, b, tb, bias, got, ctx.get());
    GemmBias(a, false, b, tb, bias, f32, ctx.get());
    Cast(f32, want, ctx.get());
    EXPECT_EQ(Bits(got), Bits(want)) << "GemmBias " << tb;
  }
  Tensor c = Tensor::Empty({2, 3}, DType::kBF16);
  Gemm(Tensor::Empty({2, 0}, DType::kF32), false, Tensor::Empty({0, 3}, DType::kF32), false, c,
       1.0f, 0.0f, ctx.get());
  Tensor c32 = Tensor::Empty({2, 3}, DType::kF32);
  Cast(c, c32);
  EXPECT_EQ(c32.ToVector<float>(), std::vector<float>(6, 0.0f));
  EXPECT_DEATH(Gemm(RandomTensor({2, 4}, 1), false, RandomTensor({4, 3}, 2), false, c, 1.0f,
                    1.0f, ctx.get()),
               "Gemm: a bf16 c needs a product in bf16 mode with beta 0");
  auto f32_ctx = DeviceContext::Create(Device::Cpu());
  EXPECT_DEATH(GemmBias(RandomTensor({2, 4}, 1), false, RandomTensor({4, 3}, 2), false,
                        RandomTensor({3}, 3), c, f32_ctx.get()),
               "GemmBias: a bf16 c needs a product in bf16 mode with beta 0");
}

// MatmulOperandWithBiasGrad is MatmulOperand and BiasGrad, bit for bit: in f32 mode dy itself
// and its bias gradient; in bf16 mode dy's bf16 copy (one conversion) and the same gradient.
TEST(GemmTest, MatmulOperandWithBiasGradIsTheTwoCalls) {
  for (DType mode : {DType::kF32, DType::kBF16}) {
    auto ctx = DeviceContext::Create(Device::Cpu());
    ctx->set_matmul_dtype(mode);
    const Tensor dy = RandomTensor({70, 9}, 40), db0 = RandomTensor({9}, 41);
    Tensor want_db = db0.Clone(), got_db = db0.Clone();
    BiasGrad(dy, want_db, 1.0f, ctx.get());
    const Tensor want = MatmulOperand(dy, ctx.get());
    const DeviceCounts before = counters::Snapshot();
    const Tensor got = MatmulOperandWithBiasGrad(dy, got_db, 1.0f, ctx.get());
    EXPECT_EQ(counters::Snapshot().Minus(before).conversions(), mode == DType::kBF16 ? 1 : 0);
    EXPECT_EQ(got_db.ToVector<float>(), want_db.ToVector<float>()) << DTypeName(mode);
    ASSERT_EQ(got.dtype(), mode);
    if (mode == DType::kF32) {
      EXPECT_EQ(got.raw_data(), dy.raw_data()) << "f32 mode reads dy itself";
    } else {
      EXPECT_EQ(Bits(got), Bits(want));
    }
  }
}

// RowExactGemm is the f32 loop its contract spells out, bit for bit; every row of a call
// over a block of rows equals that row of the call over all rows (what sgemm does not
// promise); and it is sgemm's product to f32 rounding.
TEST(RowExactGemmTest, EachRowIsItsOwnOrderedSumWhateverRowsShareTheCall) {
  const int64_t m = 70, k = 131, n = 9;
  Tensor a = RandomTensor({m, k}, 50), b = RandomTensor({k, n}, 51);
  Tensor c = Tensor::Empty({m, n}, DType::kF32);
  RowExactGemm(a, b, c);
  const std::vector<float> av = a.ToVector<float>(), bv = b.ToVector<float>();
  const std::vector<float> cv = c.ToVector<float>();
  std::vector<double> want(m * n), scale(m * n);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      float acc = 0.0f;
      double exact = 0.0, mag = 0.0;
      for (int64_t p = 0; p < k; ++p) {
        const float prod = av[i * k + p] * bv[p * n + j];
        acc = acc + prod;
        exact += static_cast<double>(av[i * k + p]) * bv[p * n + j];
        mag += std::abs(static_cast<double>(av[i * k + p]) * bv[p * n + j]);
      }
      ASSERT_EQ(cv[i * n + j], acc) << "row " << i << " column " << j;
      want[i * n + j] = exact;
      scale[i * n + j] = mag;
    }
  }
  ExpectClose(c, want, scale, k, "RowExactGemm vs double");
  for (const auto& [lo, hi] : {std::pair<int64_t, int64_t>{0, 1}, {3, 19}, {16, 70}, {69, 70}}) {
    Tensor block = Tensor::Empty({hi - lo, n}, DType::kF32);
    RowExactGemm(a.Slice(lo, hi).Clone(), b, block);
    EXPECT_EQ(block.ToVector<float>(), c.Slice(lo, hi).ToVector<float>())
        << "rows [" << lo << ", " << hi << ")";
  }
  Tensor empty_k = Tensor::Empty({2, 3}, DType::kF32);
  RowExactGemm(Tensor::Empty({2, 0}, DType::kF32), Tensor::Empty({0, 3}, DType::kF32), empty_k);
  EXPECT_EQ(empty_k.ToVector<float>(), std::vector<float>(6, 0.0f)) << "k = 0 gives zeros";
}

TEST(GroupedGemmTest, MatchesPerGroupLoopWithEmptyGroup) {
  const std::vector<int64_t> rows = {2, 0, 3, 1};
  const int64_t g = 4, r = 6, k = 4, n = 5;
  const float alpha = 1.5f, beta = 0.25f;
  for (bool trans_w : {false, true}) {
    Tensor x = RandomTensor({r, k}, 10);
    Tensor w = RandomTensor(trans_w ? Shape{g, n, k} : Shape{g, k, n}, 11);
    Tensor out = RandomTensor({r, n}, 12);
    const std::vector<float> xv = x.ToVector<float>(), wv = w.ToVector<float>(),
                             o0 = out.ToVector<float>();
    std::vector<double> want(r * n), scale(r * n);
    int64_t row = 0;
    for (int64_t e = 0; e < g; ++e) {
      const std::vector<float> we(wv.begin() + e * k * n, wv.begin() + (e + 1) * k * n);
      for (int64_t end = row + rows[e]; row < end; ++row) {
        for (int64_t j = 0; j < n; ++j) {
          double acc = 0.0, mag = 0.0;
          for (int64_t p = 0; p < k; ++p) {
            acc += xv[row * k + p] * At(we, trans_w ? k : n, trans_w, p, j);
            mag += std::abs(xv[row * k + p] * At(we, trans_w ? k : n, trans_w, p, j));
          }
          want[row * n + j] = alpha * acc + beta * o0[row * n + j];
          scale[row * n + j] = std::abs(alpha) * mag + std::abs(beta * o0[row * n + j]);
        }
      }
    }
    GroupedGemm(x, rows, w, trans_w, out, alpha, beta);
    ExpectClose(out, want, scale, k, "trans_w=" + std::to_string(trans_w));
  }
}

// The device-sized overloads (group sizes as an offsets tensor) on the CPU: the host-sized
// product's bits on the grouped rows, in f32 and bf16; the rows after the last group are not
// written (out) and not read (dw); bad offsets are refused with the op's name.
TEST(GroupedGemmTest, DeviceSizedEqualsHostSizedBitForBit) {
  const std::vector<int64_t> rows = {3, 0, 2, 4};
  const int64_t g = 4, used = 9, r = 12, k = 5, n = 6;  // rows 9..11 in no group
  const Tensor offsets = Tensor::FromVector<int64_t>({0, 3, 3, 5, 9}, {g + 1});
  for (DType mode : {DType::kF32, DType::kBF16}) {
    auto owned = DeviceContext::Create(Device::Cpu());
    DeviceContext& ctx = *owned;
    ctx.set_matmul_dtype(mode);
    for (bool trans_w : {false, true}) {
      SCOPED_TRACE(std::string(DTypeName(mode)) + (trans_w ? " trans_w" : ""));
      Tensor x = RandomTensor({r, k}, 30);
      Tensor w = RandomTensor(trans_w ? Shape{g, n, k} : Shape{g, k, n}, 31);
      Tensor out = RandomTensor({r, n}, 32);
      Tensor want = out.Clone();
      Tensor want_used = want.Slice(0, used);
      GroupedGemm(x.Slice(0, used), rows, w, trans_w, want_used, 1.5f, 0.25f, &ctx);
      GroupedGemm(x, offsets, w, trans_w, out, 1.5f, 0.25f, &ctx);
      EXPECT_EQ(out.ToVector<float>(), want.ToVector<float>());

      Tensor dy = RandomTensor({r, n}, 33);
      // NaN in the rows outside every group: read, it would poison dw.
      for (int64_t i = used * n; i < r * n; ++i) dy.data<float>()[i] = NAN;
      Tensor dw = RandomTensor({g, k, n}, 34);
      Tensor dw_want = dw.Clone();
      GroupedGemmWeightGrad(x.Slice(0, used), dy.Slice(0, used), rows, dw_want, 0.5f, 1.0f,
                            &ctx);
      GroupedGemmWeightGrad(x, dy, offsets, dw, 0.5f, 1.0f, &ctx);
      EXPECT_EQ(dw.ToVector<float>(), dw_want.ToVector<float>());
    }
  }
  Tensor x = RandomTensor({r, k}, 30), w = RandomTensor({g, k, n}, 31);
  Tensor out = Tensor::Empty({r, n}, DType::kF32);
  EXPECT_DEATH(GroupedGemm(x, Tensor::FromVector<int64_t>({0, 3, 2, 5, 9}, {g + 1}), w, false,
                           out),
               "GroupedGemm: offsets\\[2\\] = 2 after 3");
  EXPECT_DEATH(GroupedGemm(x, Tensor::FromVector<int64_t>({0, 3, 3, 5, 13}, {g + 1}), w, false,
                           out),
               "GroupedGemm: offsets\\[4\\] = 13");
  EXPECT_DEATH(GroupedGemm(x, Tensor::FromVector<int64_t>({0, 3, 9}, {3}), w, false, out),
               "GroupedGemm: offsets must be \\(5\\) i64");
}

TEST(GroupedGemmTest, WeightGradMatchesPerGroupLoop) {
  const std::vector<int64_t> rows = {3, 0, 2};
  const int64_t g = 3, r = 5, k = 4, n = 3;
  const float alpha = 0.5f, beta = 1.0f;
  Tensor x = RandomTensor({r, k}, 20), dy = RandomTensor({r, n}, 21);
  Tensor dw = RandomTensor({g, k, n}, 22);
  const std::vector<float> xv = x.ToVector<float>(), dyv = dy.ToVector<float>(),
                           dw0 = dw.ToVector<float>();
  std::vector<double> want(g * k * n), scale(g * k * n);
  int64_t begin = 0;
  for (int64_t e = 0; e < g; ++e) {
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t j = 0; j < n; ++j) {
        double acc = 0.0, mag = 0.0;
        for (int64_t row = begin; row < begin + rows[e]; ++row) {
          acc += xv[row * k + p] * dyv[row * n + j];
          mag += std::abs(xv[row * k + p] * dyv[row * n + j]);
        }
        const int64_t i = (e * k + p) * n + j;
        want[i] = alpha * acc + beta * dw0[i];  // the empty group keeps beta * dw
        scale[i] = std::abs(alpha) * mag + std::abs(beta * dw0[i]);
      }
    }
    begin += rows[e];
  }
  GroupedGemmWeightGrad(x, dy, rows, dw, alpha, beta);
  ExpectClose(dw, want, scale, /*k=*/3, "GroupedGemmWeightGrad");  // the largest group
}

TEST(GroupedGemmTest, EmptyGroupWeightGradWithBetaZeroIsZero) {
  const std::vector<int64_t> rows = {0, 2};
  Tensor x = RandomTensor({2, 3}, 30), dy = RandomTensor({2, 2}, 31);
  Tensor dw = Tensor::FromVector<float>(std::vector<float>(12, NAN), {2, 3, 2});
  GroupedGemmWeightGrad(x, dy, rows, dw);
  std::vector<float> v = dw.ToVector<float>();
  for (int i = 0; i < 6; ++i) EXPECT_EQ(v[i], 0.0f) << i;
  for (int i = 6; i < 12; ++i) EXPECT_TRUE(std::isfinite(v[i])) << i;
}

TEST(GroupedGemmTest, NoRowsAtAll) {
  const std::vector<int64_t> rows = {0, 0};
  Tensor x = Tensor::Empty({0, 3}, DType::kF32), w = RandomTensor({2, 3, 4}, 40);
  Tensor out = Tensor::Empty({0, 4}, DType::kF32);
  GroupedGemm(x, rows, w, false, out);
  Tensor dw = RandomTensor({2, 3, 4}, 41);
  const std::vector<float> before = dw.ToVector<float>();
  GroupedGemmWeightGrad(x, out, rows, dw, 1.0f, 1.0f);
  EXPECT_EQ(dw.ToVector<float>(), before);
}

// The values of t rounded to bf16 (round to nearest even), as f32.
std::vector<float> RoundedToBf16(const Tensor& t) {
  std::vector<float> v = t.ToVector<float>();
  for (float& x : v) x = BFloat16::ToFloat(BFloat16::FromFloat(x));
  return v;
}

// t converted to a bf16 tensor (the same rounding).
Tensor ToBf16Tensor(const Tensor& t) {
  const std::vector<float> v = t.ToVector<float>();
  std::vector<BFloat16> b(v.size());
  for (size_t i = 0; i < v.size(); ++i) b[i] = BFloat16(v[i]);
  return Tensor::FromVector(b, t.shape());
}

std::unique_ptr<DeviceContext> Bf16Context() {
  auto ctx = DeviceContext::Create(Device::Cpu());
  ctx->set_matmul_dtype(DType::kBF16);
  return ctx;
}

TEST(GemmBf16Test, Bf16ModeIsSgemmOnRoundedOperandsExactly) {
  auto ctx = Bf16Context();
  const int64_t m = 9, n = 11, k = 300;  // long enough that rounding changes the sums
  const float alpha = 0.75f, beta = -0.5f;
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      Tensor a = RandomTensor(ta ? Shape{k, m} : Shape{m, k}, 50);
      Tensor b = RandomTensor(tb ? Shape{n, k} : Shape{k, n}, 51);
      Tensor c = RandomTensor({m, n}, 52);
      std::vector<float> want = c.ToVector<float>(), f32 = want;
      const std::vector<float> ar = RoundedToBf16(a), br = RoundedToBf16(b);
      cpu::Sgemm(ta, tb, m, n, k, alpha, ar.data(), a.dim(1), br.data(), b.dim(1), beta,
                 want.data(), n);
      cpu::Sgemm(ta, tb, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(), b.dim(1),
                 beta, f32.data(), n);
      Gemm(a, ta, b, tb, c, alpha, beta, ctx.get());
      EXPECT_EQ(c.ToVector<float>(), want) << "ta=" << ta << " tb=" << tb;
      EXPECT_NE(c.ToVector<float>(), f32) << "bf16 mode should differ from f32 at k=" << k;
    }
  }
}

TEST(GemmBf16Test, Bf16OperandsEqualBf16Mode) {
  auto ctx = Bf16Context();
  const int64_t m = 6, n = 10, k = 40;
  Tensor a = RandomTensor({m, k}, 60), b = RandomTensor({n, k}, 61);
  Tensor c_mode = RandomTensor({m, n}, 62), c_bf16 = c_mode.Clone(), c_mixed = c_mode.Clone();
  Gemm(a, false, b, true, c_mode, 1.25f, 0.5f, ctx.get());
  Gemm(ToBf16Tensor(a), false, ToBf16Tensor(b), true, c_bf16, 1.25f, 0.5f);  // f32 context
  Gemm(ToBf16Tensor(a), false, b, true, c_mixed, 1.25f, 0.5f);  // one bf16 operand
  EXPECT_EQ(c_bf16.ToVector<float>(), c_mode.ToVector<float>());
  EXPECT_EQ(c_mixed.ToVector<float>(), c_mode.ToVector<float>());
}

TEST(GemmBf16Test, GroupedBf16OperandsEqualBf16ModeAndRoundedSgemm) {
  auto ctx = Bf16Context();
  const std::vector<int64_t> rows = {3, 0, 5, 1};
  const int64_t g = 4, r = 9, k = 24, n = 7;
  Tensor x = RandomTensor({r, k}, 70), w = RandomTensor({g, k, n}, 71);
  Tensor out_mode = RandomTensor({r, n}, 72), out_bf16 = out_mode.Clone();
  std::vector<float> want = out_mode.ToVector<float>();
  const std::vector<float> xr = RoundedToBf16(x), wr = RoundedToBf16(w);
  for (int64_t e = 0, begin = 0; e < g; begin += rows[e], ++e) {
    cpu::Sgemm(false, false, rows[e], n, k, 1.0f, xr.data() + begin * k, k,
               wr.data() + e * k * n, n, 0.5f, want.data() + begin * n, n);
  }
  GroupedGemm(x, rows, w, false, out_mode, 1.0f, 0.5f, ctx.get());
  GroupedGemm(ToBf16Tensor(x), rows, ToBf16Tensor(w), false, out_bf16, 1.0f, 0.5f);
  EXPECT_EQ(out_mode.ToVector<float>(), want);
  EXPECT_EQ(out_bf16.ToVector<float>(), want);

  Tensor dy = RandomTensor({r, n}, 73);
  Tensor dw_mode = RandomTensor({g, k, n}, 74), dw_bf16 = dw_mode.Clone();
  GroupedGemmWeightGrad(x, dy, rows, dw_mode, 1.0f, 1.0f, ctx.get());
  GroupedGemmWeightGrad(ToBf16Tensor(x), ToBf16Tensor(dy), rows, dw_bf16, 1.0f, 1.0f);
  EXPECT_EQ(dw_bf16.ToVector<float>(), dw_mode.ToVector<float>());
}

#ifdef SY_HAVE_BLAS
// OpenBLAS retries a work buffer the system refuses forever (a hang under `ulimit -v`), so
// the first product checks that the compute threads' buffers fit first, and ends the process
// with one line and exit 5 when they do not (kernels/cpu/gemm.cc): the address space is
// capped 64 MiB above what the process maps once its compute threads run, less than one
// 128 MiB buffer. A fresh process (the threadsafe death test) has reserved none yet.
void ProductWithoutAddressSpace() {
  alarm(30);  // a product that hangs (OpenBLAS retrying) ends in SIGALRM: the test fails
  ComputeThreads();  // the workers' stacks, before the cap
  test_util::CapAddressSpace(64 << 20);
  const float a = 2.0f, b = 3.0f;
  float c = 0.0f;
  cpu::Sgemm(false, false, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
  std::_Exit(c == 6.0f ? 0 : 8);  // reached only if the buffers fit after all
}

TEST(GemmTest, ARefusedBlasBufferEndsTheProcessWithExitFive) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(ProductWithoutAddressSpace(), ::testing::ExitedWithCode(5),
              "could not reserve .* of memory for OpenBLAS's work buffers \\(128 MiB for each "
              "of [0-9]+ compute threads\\): the address-space limit \\(ulimit -v\\)");
}
#endif

}  // namespace
}  // namespace switchyard::kernels
