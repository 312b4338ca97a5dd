// kernels/gemm.h on CUDA (cuBLAS) against the CPU reference (OpenBLAS) on the same random
// inputs: every transpose combination with alpha and beta, f32 and bf16 mode, operands that
// are bf16 tensors already, k = 0 and empty outputs, and the grouped products with empty,
// one-row and uneven groups. The row-exact product equals the CPU's bit for bit. GemmBias
// (cuBLASLt with the bias in its epilogue) against the CPU's Gemm then AddBias, also on an
// operand whose address is only 4-byte aligned.
//
// The device-sized grouped products (offsets on the GPU, kernels/cuda/grouped_gemm.cu) are
// checked against the CPU's host-sized ones on the same rows within a bound that holds by
// construction (see DeviceSizedBound below), and leave the rows past offsets[G] untouched.
//
// Tolerance, per element: |gpu - cpu| <= kRel * (|alpha| sum_p |a_ip| |b_pj| + |beta| |c_ij|).
// Both sides read the same values (in bf16 mode both round the operands to bf16 the same
// way, and bf16 x bf16 products are exact in f32), so they differ only in the order of the
// f32 sums: a random walk of k roundings of ~6e-8 of that magnitude, ~2e-6 for k = 1000.
// Where the magnitude is 0 (beta = 0 with k = 0) the results must be equal.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"
#include "kernels/random.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/grouped_gemm_bound.h"

namespace switchyard::kernels {
namespace {

using grouped_test::Gamma;
using grouped_test::ReadValues;

constexpr double kRel = 1e-5;  // of sum |a||b| (+ |beta c|): f32 sums in another order

// Uniform [-1, 1) host values, f32 or bf16.
Tensor RandomHost(const Shape& shape, uint64_t stream, DType dtype = DType::kF32) {
  Tensor t = Tensor::Empty(shape, dtype);
  FillUniform(t, RngKey{31, stream}, 0, -1.0f, 1.0f);
  return t;
}

// |t| element-wise (a host copy, same dtype).
Tensor Abs(const Tensor& t) {
  Tensor out = t.Clone();
  if (t.dtype() == DType::kBF16) {
    BFloat16* p = out.data<BFloat16>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i].bits &= 0x7fffu;
  } else {
    float* p = out.data<float>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = std::fabs(p[i]);
  }
  return out;
}

// got (device, read back in ctx's stream order) against want (host) within kRel * mag per
// element; prints the fraction of the tolerance used.
void ExpectWithin(const Tensor& got, const Tensor& want, const Tensor& mag, DeviceContext* ctx,
                  const std::string& what) {
  const std::vector<float> g = got.To(Device::Cpu(), ctx).ToVector<float>();
  const std::vector<float> w = want.ToVector<float>(), m = mag.ToVector<float>();
  ASSERT_EQ(g.size(), w.size()) << what;
  ASSERT_EQ(m.size(), w.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    const double tol = kRel * m[i];
    const double used = err <= tol ? (tol > 0 ? err / tol : 0.0) : INFINITY;  // NaN: INFINITY
    if (used > worst) worst = used, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " is " << g[worst_i]
                        << ", expected " << w[worst_i] << " (magnitude " << m[worst_i] << ")";
  std::printf("  %-60s tolerance used %.3f\n", what.c_str(), worst);
}

struct Contexts {
  std::unique_ptr<DeviceContext> cpu = DeviceContext::Create(Device::Cpu());
  std::unique_ptr<DeviceContext> gpu = DeviceContext::Create(Device::Cuda(0));
  explicit Contexts(DType matmul_dtype) {
    cpu->set_matmul_dtype(matmul_dtype);
    gpu->set_matmul_dtype(matmul_dtype);
  }
  Tensor Up(const Tensor& host) const { return host.To(Device::Cuda(0), gpu.get()); }
};

// "Op m=.. n=.. k=.. ta=.. tb=.. mode=..": one product's case in a failure message.
std::string CaseName(const char* op, int64_t m, int64_t n, int64_t k, bool ta, bool tb,
                     DType mode) {
  return std::string(op) + " m=" + std::to_string(m) + " n=" + std::to_string(n) +
         " k=" + std::to_string(k) + " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb) +
         " mode=" + std::string(DTypeName(mode));
}

// Gemm on the GPU vs the CPU for one shape, every transpose combination.
void CheckGemm(int64_t m, int64_t n, int64_t k, float alpha, float beta, DType matmul_dtype,
               DType operand_dtype, uint64_t seed) {
  Contexts ctx(matmul_dtype);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::string what = CaseName("Gemm", m, n, k, ta, tb, matmul_dtype) +
                               " beta=" + std::to_string(beta) +
                               " operands=" + std::string(DTypeName(operand_dtype));
      Tensor a = RandomHost(ta ? Shape{k, m} : Shape{m, k}, seed, operand_dtype);
      Tensor b = RandomHost(tb ? Shape{n, k} : Shape{k, n}, seed + 1, operand_dtype);
      Tensor c = RandomHost({m, n}, seed + 2);
      if (beta == 0.0f) {  // beta = 0 must not read c
        float* p = c.data<float>();
        for (int64_t i = 0; i < c.numel(); ++i) p[i] = NAN;
      }
      Tensor c_gpu = ctx.Up(c);
      Gemm(ctx.Up(a), ta, ctx.Up(b), tb, c_gpu, alpha, beta, ctx.gpu.get());
      Gemm(a, ta, b, tb, c, alpha, beta, ctx.cpu.get());
      // mag = |alpha| |a| |b| + |beta| |c0| (c0 is NaN only where beta = 0).
      Tensor mag = beta == 0.0f ? Tensor::Zeros({m, n}, DType::kF32)
                                : Abs(RandomHost({m, n}, seed + 2));
      Gemm(Abs(a), ta, Abs(b), tb, mag, std::fabs(alpha), std::fabs(beta), ctx.cpu.get());
      ExpectWithin(c_gpu, c, mag, ctx.gpu.get(), what);
    }
  }
}

// GemmBias (cuBLASLt, the bias in the epilogue) on the GPU vs the CPU's Gemm then AddBias,
// every transpose combination, with mag = |a| |b| + |bias|; `offset` rows of a skipped (a
// view whose address the heuristic may not assume 256-byte aligned), and `offset` elements of
// the bias (off 16 bytes: the product and the bias add apart).
void CheckGemmBias(int64_t m, int64_t n, int64_t k, DType matmul_dtype, int64_t offset,
                   uint64_t seed) {
  Contexts ctx(matmul_dtype);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const std::string what = CaseName("GemmBias", m, n, k, ta, tb, matmul_dtype) +
                               " offset=" + std::to_string(offset);
      const Shape sa = ta ? Shape{k, m} : Shape{m, k};
      const Tensor a_all = RandomHost({sa[0] + offset, sa[1]}, seed);
      const Tensor a = a_all.Slice(offset, offset + sa[0]);
      const Tensor b = RandomHost(tb ? Shape{n, k} : Shape{k, n}, seed + 1);
      const Tensor bias_all = RandomHost({n + offset}, seed + 2);
      const Tensor bias = bias_all.Slice(offset, offset + n);
      Tensor c(Tensor::Empty({m, n}, DType::kF32)), c_gpu = ctx.Up(c);
      const Tensor a_gpu = ctx.Up(a_all).Slice(offset, offset + sa[0]);
      const Tensor bias_gpu = ctx.Up(bias_all).Slice(offset, offset + n);
      GemmBias(a_gpu, ta, ctx.Up(b), tb, bias_gpu, c_gpu, ctx.gpu.get());
      GemmBias(a, ta, b, tb, bias, c, ctx.cpu.get());
      Tensor mag = Tensor::Empty({m, n}, DType::kF32);
      Gemm(Abs(a), ta, Abs(b), tb, mag, 1.0f, 0.0f, ctx.cpu.get());
      AddBias(mag, Abs(bias), ctx.cpu.get());
      ExpectWithin(c_gpu, c, mag, ctx.gpu.get(), what);
    }
  }
}

TEST(GemmGpuTest, GemmBiasMatchesCpu) {
  SY_REQUIRE_GPU();
  uint64_t seed = 700;
  for (DType mode : {DType::kF32, DType::kBF16}) {
    CheckGemmBias(1, 1, 1, mode, 0, seed += 10);
    CheckGemmBias(65, 129, 257, mode, 0, seed += 10);
    CheckGemmBias(200, 300, 1000, mode, 1, seed += 10);  // a's address off by 1000 floats
    CheckGemmBias(33, 37, 7, mode, 1, seed += 10);       // off by 7 floats: 4-byte aligned
  }
}

// Gemm (alpha -0.5) and GemmBias into a bf16 c (bf16 mode: the f32 result rounded once, on
// the GPU by cuBLAS as it writes) against the CPU's, every transpose combination. Each side
// rounds its own f32 result, and those differ by at most kRel * mag; rounding to nearest
// moves each by at most half a bf16 ulp, at most 2^-8 of |result| <= mag: so
// |gpu - cpu| <= (kRel + 2^-7) * mag, checked as ExpectWithin's kRel * (scaled mag).
void CheckBf16Output(int64_t m, int64_t n, int64_t k, uint64_t seed) {
  Contexts ctx(DType::kBF16);
  const float scale = static_cast<float>(1.0 + std::ldexp(1.0, -7) / kRel);
  for (bool ta : {false, true}) {
    for (bool tb : {false, true}) {
      const Tensor a = RandomHost(ta ? Shape{k, m} : Shape{m, k}, seed);
      const Tensor b = RandomHost(tb ? Shape{n, k} : Shape{k, n}, seed + 1);
      const Tensor bias = RandomHost({n}, seed + 2);
      for (bool with_bias : {false, true}) {
        const std::string what =
            CaseName(with_bias ? "GemmBias" : "Gemm", m, n, k, ta, tb, DType::kBF16) +
            " into bf16";
        Tensor c = Tensor::Empty({m, n}, DType::kBF16), c_gpu = ctx.Up(c);
        Tensor mag = Tensor::Empty({m, n}, DType::kF32);
        if (with_bias) {
          GemmBias(ctx.Up(a), ta, ctx.Up(b), tb, ctx.Up(bias), c_gpu, ctx.gpu.get());
          GemmBias(a, ta, b, tb, bias, c, ctx.cpu.get());
          Gemm(Abs(a), ta, Abs(b), tb, mag, 1.0f, 0.0f, ctx.cpu.get());
          AddBias(mag, Abs(bias), ctx.cpu.get());
        } else {
          Gemm(ctx.Up(a), ta, ctx.Up(b), tb, c_gpu, -0.5f, 0.0f, ctx.gpu.get());
          Gemm(a, ta, b, tb, c, -0.5f, 0.0f, ctx.cpu.get());
          Gemm(Abs(a), ta, Abs(b), tb, mag, 0.5f, 0.0f, ctx.cpu.get());
        }
        Tensor mag_scaled = Tensor::Empty({m, n}, DType::kF32);
        Fill(mag_scaled, 0.0f);
        Axpy(scale, mag, mag_scaled);
        Tensor got = Tensor::Empty({m, n}, DType::kF32, c_gpu.device()), want = Tensor::Empty({m, n}, DType::kF32);
        Cast(c_gpu, got, ctx.gpu.get());
        Cast(c, want);
        ExpectWithin(got, want, mag_scaled, ctx.gpu.get(), what);
      }
    }
  }
}

TEST(GemmGpuTest, Bf16OutputMatchesCpu) {
  SY_REQUIRE_GPU();
  CheckBf16Output(1, 1, 1, 900);
  CheckBf16Output(65, 129, 257, 910);
  CheckBf16Output(256, 192, 1024, 920);  // attention's q, k, v projections' kind of shape
  // k = 0: zeros, as on the CPU.
  Contexts ctx(DType::kBF16);
  Tensor c = ctx.Up(Tensor::Empty({3, 5}, DType::kBF16));
  Gemm(ctx.Up(Tensor::Empty({3, 0}, DType::kF32)), false, ctx.Up(Tensor::Empty({0, 5}, DType::kF32)),
       false, c, 1.0f, 0.0f, ctx.gpu.get());
  Tensor c32 = Tensor::Empty({3, 5}, DType::kF32);
  Cast(c.To(Device::Cpu(), ctx.gpu.get()), c32);
  EXPECT_EQ(c32.ToVector<float>(), std::vector<float>(15, 0.0f));
}

struct GemmShape {
  int64_t m, n, k;
};
// 1 row/column, widths that are not multiples of 32, a long k, and large widths.
const GemmShape kShapes[] = {{1, 1, 1},   {1, 37, 5},    {33, 1, 70},
                             {65, 129, 257}, {200, 300, 1000}, {3, 1030, 64}};

TEST(GemmGpuTest, F32MatchesCpuForEveryTranspose) {
  SY_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const GemmShape& s : kShapes) {
    CheckGemm(s.m, s.n, s.k, 0.75f, -0.5f, DType::kF32, DType::kF32, seed += 10);
    CheckGemm(s.m, s.n, s.k, 1.0f, 0.0f, DType::kF32, DType::kF32, seed += 10);
  }
}

TEST(GemmGpuTest, Bf16ModeMatchesCpuBf16Mode) {
  SY_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const GemmShape& s : kShapes) {
    CheckGemm(s.m, s.n, s.k, 0.75f, -0.5f, DType::kBF16, DType::kF32, seed += 10);
    CheckGemm(s.m, s.n, s.k, 1.0f, 0.0f, DType::kBF16, DType::kF32, seed += 10);
  }
}

TEST(GemmGpuTest, Bf16OperandsMatchCpu) {
  SY_REQUIRE_GPU();
  // bf16 tensors run in bf16 mode whatever the context says.
  uint64_t seed = 300;
  for (const GemmShape& s : kShapes) {
    CheckGemm(s.m, s.n, s.k, 0.5f, 1.0f, DType::kF32, DType::kBF16, seed += 10);
    CheckGemm(s.m, s.n, s.k, 1.0f, 0.0f, DType::kBF16, DType::kBF16, seed += 10);
  }
}

TEST(GemmGpuTest, OneBf16OperandRoundsTheOther) {
  SY_REQUIRE_GPU();
  Contexts ctx(DType::kF32);
  const int64_t m = 19, n = 45, k = 77;
  Tensor a = RandomHost({m, k}, 400, DType::kBF16), b = RandomHost({k, n}, 401);
  Tensor c = Tensor::Zeros({m, n}, DType::kF32), c_gpu = ctx.Up(c);
  Gemm(ctx.Up(a), false, ctx.Up(b), false, c_gpu, 1.0f, 0.0f, ctx.gpu.get());
  Gemm(a, false, b, false, c, 1.0f, 0.0f, ctx.cpu.get());
  Tensor mag = Tensor::Zeros({m, n}, DType::kF32);
  Gemm(Abs(a), false, Abs(b), false, mag, 1.0f, 0.0f, ctx.cpu.get());
  ExpectWithin(c_gpu, c, mag, ctx.gpu.get(), "a bf16, b f32");
}

TEST(GemmGpuTest, EmptyInnerDimensionScalesByBetaAndEmptyOutputsAreNoOps) {
  SY_REQUIRE_GPU();
  for (DType mode : {DType::kF32, DType::kBF16}) {
    CheckGemm(7, 5, 0, 1.0f, 0.5f, mode, DType::kF32, 500);  // c = 0.5 c exactly
    CheckGemm(7, 5, 0, 1.0f, 0.0f, mode, DType::kF32, 510);  // c = 0 (NaN overwritten)
    CheckGemm(0, 5, 3, 1.0f, 0.5f, mode, DType::kF32, 520);
    CheckGemm(4, 0, 3, 1.0f, 0.5f, mode, DType::kF32, 530);
  }
}

// GroupedGemm and GroupedGemmWeightGrad on the GPU vs the CPU for one split.
void CheckGrouped(const std::vector<int64_t>& rows, int64_t k, int64_t n, float alpha,
                  float beta, DType matmul_dtype, DType operand_dtype, uint64_t seed) {
  Contexts ctx(matmul_dtype);
  const int64_t g = static_cast<int64_t>(rows.size());
  int64_t r = 0;
  std::string split;
  for (int64_t x : rows) r += x, split += std::to_string(x) + ",";
  const std::string tag = " rows=" + split + " k=" + std::to_string(k) + " n=" +
                          std::to_string(n) + " beta=" + std::to_string(beta) + " mode=" +
                          std::string(DTypeName(matmul_dtype)) + " operands=" +
                          std::string(DTypeName(operand_dtype));
  Tensor x = RandomHost({r, k}, seed, operand_dtype);
  for (bool trans_w : {false, true}) {
    Tensor w = RandomHost(trans_w ? Shape{g, n, k} : Shape{g, k, n}, seed + 1, operand_dtype);
    Tensor out0 = RandomHost({r, n}, seed + 2), out = out0.Clone(), out_gpu = ctx.Up(out0);
    GroupedGemm(ctx.Up(x), rows, ctx.Up(w), trans_w, out_gpu, alpha, beta, ctx.gpu.get());
    GroupedGemm(x, rows, w, trans_w, out, alpha, beta, ctx.cpu.get());
    Tensor mag = Abs(out0);
    GroupedGemm(Abs(x), rows, Abs(w), trans_w, mag, std::fabs(alpha), std::fabs(beta),
                ctx.cpu.get());
    ExpectWithin(out_gpu, out, mag, ctx.gpu.get(),
                 "GroupedGemm trans_w=" + std::to_string(trans_w) + tag);
  }
  Tensor dy = RandomHost({r, n}, seed + 3, operand_dtype);
  Tensor dw0 = RandomHost({g, k, n}, seed + 4);
  if (beta == 0.0f) {  // beta = 0 must not read dw, empty groups included
    float* p = dw0.data<float>();
    for (int64_t i = 0; i < dw0.numel(); ++i) p[i] = NAN;
  }
  Tensor dw = dw0.Clone(), dw_gpu = ctx.Up(dw0);
  GroupedGemmWeightGrad(ctx.Up(x), ctx.Up(dy), rows, dw_gpu, alpha, beta, ctx.gpu.get());
  GroupedGemmWeightGrad(x, dy, rows, dw, alpha, beta, ctx.cpu.get());
  Tensor mag = beta == 0.0f ? Tensor::Zeros({g, k, n}, DType::kF32) : Abs(dw0);
  GroupedGemmWeightGrad(Abs(x), Abs(dy), rows, mag, std::fabs(alpha), std::fabs(beta),
                        ctx.cpu.get());
  ExpectWithin(dw_gpu, dw, mag, ctx.gpu.get(), "GroupedGemmWeightGrad" + tag);
}

// Empty groups (first, middle, last), one-row groups and uneven blocks.
const std::vector<int64_t> kSplits[] = {
    {0, 1, 17, 0, 64, 3, 0}, {5}, {1, 1, 1, 1}, {0, 0, 130}, {0, 0}, {200, 0, 1, 33}};

TEST(GroupedGemmGpuTest, F32MatchesCpu) {
  SY_REQUIRE_GPU();
  uint64_t seed = 600;
  for (const auto& rows : kSplits) {
    CheckGrouped(rows, 96, 80, 1.5f, 0.25f, DType::kF32, DType::kF32, seed += 10);
    CheckGrouped(rows, 33, 129, 1.0f, 0.0f, DType::kF32, DType::kF32, seed += 10);
    CheckGrouped(rows, 70, 45, 0.5f, 1.0f, DType::kF32, DType::kF32, seed += 10);
  }
}

TEST(GroupedGemmGpuTest, Bf16ModeAndBf16OperandsMatchCpu) {
  SY_REQUIRE_GPU();
  uint64_t seed = 700;
  for (const auto& rows : kSplits) {
    CheckGrouped(rows, 96, 80, 1.5f, 0.25f, DType::kBF16, DType::kF32, seed += 10);
    CheckGrouped(rows, 33, 129, 1.0f, 0.0f, DType::kBF16, DType::kF32, seed += 10);
    CheckGrouped(rows, 70, 45, 0.5f, 1.0f, DType::kF32, DType::kBF16, seed += 10);
  }
}

// RowExactGemm: the CUDA kernel gives the CPU's bits exactly (both sum each element's
// products in ascending k with separate roundings), for ragged tile edges and k = 0.
TEST(RowExactGemmGpuTest, BitIdenticalToCpu) {
  SY_REQUIRE_GPU();
  Contexts ctx(DType::kF32);
  uint64_t seed = 900;
  for (const GemmShape& s : kShapes) {
    Tensor a = RandomHost({s.m, s.k}, seed += 10), b = RandomHost({s.k, s.n}, seed + 1);
    Tensor c = Tensor::Empty({s.m, s.n}, DType::kF32);
    Tensor c_gpu = Tensor::Empty({s.m, s.n}, DType::kF32, Device::Cuda(0));
    RowExactGemm(a, b, c);
    RowExactGemm(ctx.Up(a), ctx.Up(b), c_gpu, ctx.gpu.get());
    EXPECT_EQ(c_gpu.To(Device::Cpu(), ctx.gpu.get()).ToVector<float>(), c.ToVector<float>())
        << "m=" << s.m << " n=" << s.n << " k=" << s.k;
  }
  Tensor z = Tensor::Empty({5, 4}, DType::kF32, Device::Cuda(0));
  RowExactGemm(Tensor::Empty({5, 0}, DType::kF32, Device::Cuda(0)),
               Tensor::Empty({0, 4}, DType::kF32, Device::Cuda(0)), z, ctx.gpu.get());
  EXPECT_EQ(z.To(Device::Cpu(), ctx.gpu.get()).ToVector<float>(), std::vector<float>(20, 0.0f));
}

TEST(GroupedGemmGpuTest, EmptyInnerDimension) {
  SY_REQUIRE_GPU();
  CheckGrouped({2, 0, 3}, 0, 8, 1.0f, 0.5f, DType::kF32, DType::kF32, 800);
  CheckGrouped({2, 0, 3}, 0, 8, 1.0f, 0.0f, DType::kBF16, DType::kF32, 810);
}

// ---- The device-sized grouped products against the CPU's host-sized ones.
//
// DeviceSizedBound: both sides read the same operand values (bf16 mode rounds f32 operands to
// bf16 the same way, and bf16 x bf16 products are exact in f32), so each is within
// gamma(K + 2) (|alpha| sum_p |a_p b_p| + |beta c|) of the exact result, gamma(m) =
// m u / (1 - m u), u = 2^-24 (K sums or fmas, then alpha, beta and their sum), and they differ
// by at most twice that. K = k for the forward, the group's rows for dw. The magnitudes are
// summed in double from the rounded operands; alpha is a power of two (exact scaling).

constexpr uint32_t kSentinel = 0x7fc12345u;  // a NaN payload: out's rows past offsets[G]



// Rows from `from` on of a host 2-d tensor set to NaN (f32 or bf16): a kernel that reads them
// shows it.
void NanRowsFrom(Tensor& t, int64_t from) {
  for (int64_t i = from * t.dim(1); i < t.numel(); ++i) {
    if (t.dtype() == DType::kBF16) {
      t.data<BFloat16>()[i] = BFloat16(NAN);
    } else {
      t.data<float>()[i] = NAN;
    }
  }
}

// got (device) against want (host) within bound[i] for i < checked (equal where the bound is
// 0; NaN fails); from `checked` on got holds kSentinel's bits. Prints the fraction used.
void ExpectWithinBound(const Tensor& got, const Tensor& want, const std::vector<double>& bound,
                       int64_t checked, DeviceContext* ctx, const std::string& what) {
  const Tensor host = got.To(Device::Cpu(), ctx);
  const float* g = host.data<float>();
  const float* w = want.data<float>();
  double worst = 0.0;
  int64_t bad = 0, first_bad = -1, written = 0;
  for (int64_t i = 0; i < checked; ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    if (!(err <= bound[i])) {
      if (bad++ == 0) first_bad = i;
    } else if (bound[i] > 0) {
      worst = std::max(worst, err / bound[i]);
    }
  }
  for (int64_t i = checked; i < host.numel(); ++i) {
    uint32_t bits;
    std::memcpy(&bits, &g[i], 4);
    written += bits != kSentinel;
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements outside the bound, the first at "
                    << first_bad;
  EXPECT_EQ(written, 0) << what << ": rows past offsets[G] written";
  std::printf("  %-90s bound used %.4f\n", what.c_str(), worst);
}

// Forward (both orientations of w) and weight gradient on the GPU with the offsets there,
// against the CPU's host-sized products on the first offsets[G] rows of R = sum + extra.
void CheckDeviceSized(const std::vector<int64_t>& rows, int64_t extra, int64_t k, int64_t n,
                      float alpha, float beta, DType mode, DType operand_dtype, uint64_t seed) {
  Contexts ctx(mode);
  if (operand_dtype == DType::kBF16) mode = DType::kBF16;
  const int64_t g = static_cast<int64_t>(rows.size());
  std::vector<int64_t> offsets(1, 0);
  for (int64_t r : rows) offsets.push_back(offsets.back() + r);
  const int64_t used = offsets.back(), r = used + extra;
  const Tensor offsets_gpu = ctx.Up(Tensor::FromVector(offsets, {g + 1}));
  std::string tag = " rows=";
  for (int64_t x : rows) tag += std::to_string(x) + ",";
  tag += " +" + std::to_string(extra) + " k=" + std::to_string(k) + " n=" + std::to_string(n) +
         " beta=" + std::to_string(beta) + " mode=" + std::string(DTypeName(mode)) +
         " operands=" + std::string(DTypeName(operand_dtype));
  Tensor x = RandomHost({r, k}, seed, operand_dtype);
  NanRowsFrom(x, used);
  const std::vector<double> xv = ReadValues(x, mode);
  for (bool trans_w : {false, true}) {
    const Tensor w =
        RandomHost(trans_w ? Shape{g, n, k} : Shape{g, k, n}, seed + 1, operand_dtype);
    const std::vector<double> wv = ReadValues(w, mode);
    Tensor out0 = RandomHost({r, n}, seed + 2);
    float* o0 = out0.data<float>();
    for (int64_t i = 0; i < r * n; ++i) {
      if (i >= used * n) std::memcpy(&o0[i], &kSentinel, 4);
      else if (beta == 0.0f) o0[i] = NAN;  // beta = 0 must not read out
    }
    Tensor want = out0.Clone(), got = ctx.Up(out0), want_rows = want.Slice(0, used);
    GroupedGemm(ctx.Up(x), offsets_gpu, ctx.Up(w), trans_w, got, alpha, beta, ctx.gpu.get());
    GroupedGemm(x.Slice(0, used), rows, w, trans_w, want_rows, alpha, beta, ctx.cpu.get());
    const std::vector<double> bound =
        grouped_test::ForwardBound(xv, wv, offsets, k, n, trans_w, alpha, beta, o0);
    ExpectWithinBound(got, want, bound, used * n, ctx.gpu.get(),
                      "device-sized GroupedGemm trans_w=" + std::to_string(trans_w) + tag);
  }
  Tensor dy = RandomHost({r, n}, seed + 3, operand_dtype);
  NanRowsFrom(dy, used);
  const std::vector<double> dyv = ReadValues(dy, mode);
  Tensor dw0 = RandomHost({g, k, n}, seed + 4);
  float* d0 = dw0.data<float>();
  for (int64_t i = 0; beta == 0.0f && i < dw0.numel(); ++i) d0[i] = NAN;  // not read
  Tensor want = dw0.Clone(), got = ctx.Up(dw0);
  GroupedGemmWeightGrad(ctx.Up(x), ctx.Up(dy), offsets_gpu, got, alpha, beta, ctx.gpu.get());
  GroupedGemmWeightGrad(x.Slice(0, used), dy.Slice(0, used), rows, want, alpha, beta,
                        ctx.cpu.get());
  std::vector<double> bound(static_cast<size_t>(dw0.numel()));
  for (int64_t e = 0; e < g; ++e) {
    for (int64_t p = 0; p < k; ++p) {
      for (int64_t j = 0; j < n; ++j) {
        double s = 0.0;
        for (int64_t i = offsets[e]; i < offsets[e + 1]; ++i) {
          s += std::fabs(xv[i * k + p] * dyv[i * n + j]);
        }
        const int64_t at = (e * k + p) * n + j;
        const double c = beta == 0.0f ? 0.0 : std::fabs(beta * d0[at]);
        bound[at] = 2.0 * Gamma(rows[e] + 2) * (std::fabs(alpha) * s + c);
      }
    }
  }
  ExpectWithinBound(got, want, bound, dw0.numel(), ctx.gpu.get(),
                    "device-sized GroupedGemmWeightGrad" + tag);
}

// Empty groups first, in the middle and last, one-row groups, groups smaller than a 128-row
// tile and spanning several; k and n off the tiles (and off 4: element-wise loads) or on
// them (16-byte loads); several column tiles and K steps.
const std::vector<int64_t> kRaggedRows = {0, 1, 17, 0, 300, 3, 0};

// GroupedGemmBiasGelu (the product's tiles write h and the kept a) against the two ops it
// fuses, GroupedGemm then GroupedBiasGeluForward, on the GPU: the same bits on the groups'
// rows (the same sums, then the bias kernel's expressions); the fused op leaves the rows past
// offsets[G]. bf16 operands (the cp.async tiles) and f32 x (the register pipeline).
void CheckFusedBiasGelu(const std::vector<int64_t>& rows, int64_t extra, int64_t k, int64_t n,
                        DType x_dtype, uint64_t seed) {
  Contexts ctx(DType::kBF16);
  const int64_t g = static_cast<int64_t>(rows.size());
  std::vector<int64_t> offsets(1, 0);
  for (int64_t r : rows) offsets.push_back(offsets.back() + r);
  const int64_t used = offsets.back(), r = used + extra;
  const Tensor offsets_gpu = ctx.Up(Tensor::FromVector(offsets, {g + 1}));
  const Tensor x = ctx.Up(RandomHost({r, k}, seed, x_dtype));
  const Tensor w = ctx.Up(RandomHost({g, k, n}, seed + 1, DType::kBF16));
  const Tensor bias = ctx.Up(RandomHost({g, n}, seed + 2));
  Tensor sentinel = Tensor::Empty({r, n}, DType::kBF16);
  std::memset(sentinel.raw_data(), 0xA5, sentinel.nbytes());
  Tensor h = ctx.Up(sentinel), kept = ctx.Up(sentinel);
  GroupedGemmBiasGelu(x, offsets_gpu, w, bias, h, kept, ctx.gpu.get());
  Tensor a = Tensor::Empty({r, n}, DType::kF32, Device::Cuda(0));
  Tensor h2 = ctx.Up(sentinel), kept2 = ctx.Up(sentinel);
  GroupedGemm(x, offsets_gpu, w, false, a, 1.0f, 0.0f, ctx.gpu.get());
  GroupedBiasGeluForward(a, RowGroups{{}, offsets_gpu}, bias, h2, ctx.gpu.get(), {.a = &kept2});
  const std::string tag = "fused bias + gelu k=" + std::to_string(k) + " n=" +
                          std::to_string(n) + " x " + std::string(DTypeName(x_dtype));
  auto bits = [&](const Tensor& t) {
    std::vector<uint16_t> out;
    for (const BFloat16& v : gpu_test::ValuesOf<BFloat16>(t, ctx.gpu.get())) out.push_back(v.bits);
    return out;
  };
  const std::vector<uint16_t> hv = bits(h), kv = bits(kept), h2v = bits(h2), k2v = bits(kept2);
  int64_t differ = 0, past = 0;
  for (int64_t i = 0; i < used * n; ++i) differ += hv[i] != h2v[i] || kv[i] != k2v[i];
  for (int64_t i = used * n; i < r * n; ++i) past += hv[i] != 0xA5A5 || kv[i] != 0xA5A5;
  EXPECT_EQ(differ, 0) << tag << ": elements of h or kept that differ from the two ops'";
  EXPECT_EQ(past, 0) << tag << ": rows past offsets[G] written";
}

TEST(DeviceSizedGroupedGemmGpuTest, FusedBiasGeluEqualsTheTwoOps) {
  SY_REQUIRE_GPU();
  CheckFusedBiasGelu(kRaggedRows, 5, 96, 80, DType::kBF16, 1400);
  CheckFusedBiasGelu({200, 0, 1, 333}, 3, 1000, 304, DType::kBF16, 1410);
  CheckFusedBiasGelu(kRaggedRows, 5, 70, 45, DType::kF32, 1420);
}

TEST(DeviceSizedGroupedGemmGpuTest, Bf16ModeMatchesCpu) {
  SY_REQUIRE_GPU();
  CheckDeviceSized(kRaggedRows, 5, 96, 80, 1.0f, 0.0f, DType::kBF16, DType::kF32, 1000);
  CheckDeviceSized(kRaggedRows, 5, 70, 45, 0.5f, 1.0f, DType::kBF16, DType::kF32, 1010);
  CheckDeviceSized({200, 0, 1, 333}, 0, 1000, 300, -2.0f, 0.25f, DType::kBF16, DType::kF32, 1020);
}

TEST(DeviceSizedGroupedGemmGpuTest, Bf16OperandsMatchCpu) {
  SY_REQUIRE_GPU();
  CheckDeviceSized(kRaggedRows, 5, 96, 80, 1.0f, 0.0f, DType::kF32, DType::kBF16, 1100);
  CheckDeviceSized({5, 130}, 2, 33, 129, 0.5f, 1.0f, DType::kBF16, DType::kBF16, 1110);
  // Both bf16 with 16-byte rows: the cp.async kernels (3 and 32 K steps, ragged groups).
  CheckDeviceSized(kRaggedRows, 5, 96, 80, 1.0f, 0.0f, DType::kBF16, DType::kBF16, 1120);
  CheckDeviceSized({200, 0, 1, 333}, 3, 1000, 304, -2.0f, 0.25f, DType::kBF16, DType::kBF16,
                   1130);
}

TEST(DeviceSizedGroupedGemmGpuTest, F32ModeMatchesCpu) {
  SY_REQUIRE_GPU();
  CheckDeviceSized(kRaggedRows, 5, 96, 80, 1.0f, 0.0f, DType::kF32, DType::kF32, 1200);
  CheckDeviceSized(kRaggedRows, 5, 70, 45, 0.5f, 1.0f, DType::kF32, DType::kF32, 1210);
  CheckDeviceSized({200, 0, 1, 333}, 0, 1000, 300, -2.0f, 0.25f, DType::kF32, DType::kF32, 1220);
}

TEST(DeviceSizedGroupedGemmGpuTest, ManyGroupsEmptyRowsAndNoInnerDimension) {
  SY_REQUIRE_GPU();
  std::vector<int64_t> many(300, 0);  // the kernels scan the offsets 256 groups at a time
  many[0] = 2, many[255] = 130, many[256] = 1, many[299] = 9;
  CheckDeviceSized(many, 3, 40, 24, 1.0f, 0.0f, DType::kBF16, DType::kF32, 1300);
  CheckDeviceSized(many, 3, 40, 24, 0.5f, 1.0f, DType::kF32, DType::kF32, 1310);
  CheckDeviceSized({2, 0, 3}, 4, 0, 8, 1.0f, 0.5f, DType::kBF16, DType::kF32, 1320);  // k = 0
  CheckDeviceSized({0, 0}, 6, 20, 12, 1.0f, 0.0f, DType::kF32, DType::kF32, 1330);    // no rows
}

}  // namespace
}  // namespace switchyard::kernels
