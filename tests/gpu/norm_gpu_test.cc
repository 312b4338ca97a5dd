// kernels/norm.h on CUDA against the CPU reference on the same random inputs: LayerNorm (with
// and without bias) and RmsNorm, forward and backward, on rows of width 1, 31, 33, 64, 1000
// and 4096, one row to 1000 rows, a 3-d input, no rows at all, in place (y = x, dx = dy),
// accumulation into non-zero dweight / dbias, run-to-run bit-identical gradients (the
// column sums are deterministic), and dx added into a gradient (Write::kAdd) bit for bit
// as dx then Axpy.
//
// Tolerances. Both devices reduce each row in double and round the statistics to f32, and
// the GPU evaluates the CPU's f32 expressions without FMA contraction, so the outputs match
// unless a statistic rounds to the neighbouring float (reduction order), which moves an
// output by a few ulps:
//   y, mean, rstd: |gpu - cpu| <= 1e-6 + 1e-6 |cpu|                          (kFwdTol)
//   dx:            |gpu - cpu| <= 1e-6 + 1e-5 |cpu|   (g - mean_g - xhat mean_gx cancels)
// dweight / dbias are column sums over N rows; the CPU adds N f32 terms one by one, the GPU
// sums them in double in chunks: |gpu - cpu| <= 1e-5 (|initial| + sum_r |term_r|), about
// ten times the typical error of the CPU's own f32 running sum at N = 1000.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::ExpectNear;
using gpu_test::HostUniform;

constexpr float kEps = 1e-5f;
constexpr double kFwdTol = 1e-6;
constexpr double kDxAbs = 1e-6, kDxRel = 1e-5;
constexpr double kColumnRel = 1e-5;  // of |initial| + sum over rows of |term|

const Device kCuda = Device::Cuda(0);

// |got - want| <= rel * mag per element (mag on the host).
void ExpectWithinMagnitude(const Tensor& got, const Tensor& want, const std::vector<double>& mag,
                           double rel, DeviceContext* ctx, const std::string& what) {
  const std::vector<float> g = gpu_test::ValuesOf<float>(got, ctx), w = want.ToVector<float>();
  ASSERT_EQ(g.size(), w.size()) << what;
  ASSERT_EQ(mag.size(), w.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    const double tol = rel * mag[i];
    const double used = err <= tol ? (tol > 0 ? err / tol : 0.0) : INFINITY;
    if (used > worst) worst = used, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " is " << g[worst_i] << ", expected "
                        << w[worst_i];
  std::printf("  %-56s tolerance used %.3f\n", what.c_str(), worst);
}

// Per column j: |initial_j| + sum over rows of |dy * xhat| (dweight) or |dy| (dbias), with
// xhat = (x - mean) * rstd (mean null: RmsNorm, xhat = x * rstd).
std::vector<double> ColumnMagnitude(const Tensor& x, const Tensor& dy, const float* mean,
                                    const float* rstd, const Tensor& initial, bool bias_term) {
  const int64_t d = initial.numel(), n = d == 0 ? 0 : x.numel() / d;
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  std::vector<double> mag(static_cast<size_t>(d));
  for (int64_t j = 0; j < d; ++j) mag[j] = std::fabs(initial.data<float>()[j]);
  for (int64_t r = 0; r < n; ++r) {
    for (int64_t j = 0; j < d; ++j) {
      const double g = pdy[r * d + j];
      const double xhat = (px[r * d + j] - (mean ? mean[r] : 0.0f)) * rstd[r];
      mag[j] += bias_term ? std::fabs(g) : std::fabs(g * xhat);
    }
  }
  return mag;
}

std::string Name(const char* norm, const Shape& shape) {
  return std::string(norm) + " x" + ShapeString(shape);
}

void CheckLayerNorm(const Shape& shape, bool with_bias, uint64_t seed) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const int64_t d = shape.back();
  const int64_t n = d == 0 ? 0 : NumElements(shape) / d;
  const std::string name = Name(with_bias ? "layernorm" : "layernorm (no bias)", shape);
  Tensor x = HostUniform(shape, seed, -2.0f, 3.0f);
  Tensor w = HostUniform({d}, seed + 1, 0.5f, 1.5f);
  Tensor b = with_bias ? HostUniform({d}, seed + 2) : Tensor();
  Tensor y = Tensor::Empty(shape, DType::kF32);
  Tensor mean = Tensor::Empty({n}, DType::kF32), rstd = Tensor::Empty({n}, DType::kF32);
  LayerNormForward(x, w, b, kEps, y, mean, rstd);

  Tensor x_d = x.To(kCuda, gpu), w_d = w.To(kCuda, gpu);
  Tensor b_d = with_bias ? b.To(kCuda, gpu) : Tensor();
  Tensor y_d = Tensor::Empty(shape, DType::kF32, kCuda);
  Tensor mean_d = Tensor::Empty({n}, DType::kF32, kCuda);
  Tensor rstd_d = Tensor::Empty({n}, DType::kF32, kCuda);
  LayerNormForward(x_d, w_d, b_d, kEps, y_d, mean_d, rstd_d, gpu);
  ExpectNear(y_d, y, kFwdTol, kFwdTol, gpu, name + " y");
  ExpectNear(mean_d, mean, kFwdTol, kFwdTol, gpu, name + " mean");
  ExpectNear(rstd_d, rstd, kFwdTol, kFwdTol, gpu, name + " rstd");
  // In place: y = x.
  Tensor inplace_d = x.To(kCuda, gpu);
  LayerNormForward(inplace_d, w_d, b_d, kEps, inplace_d, mean_d, rstd_d, gpu);
  ExpectNear(inplace_d, y, kFwdTol, kFwdTol, gpu, name + " y in place");

  // Backward from the CPU's statistics on both sides, into non-zero dweight / dbias.
  Tensor dy = HostUniform(shape, seed + 3);
  Tensor dw0 = HostUniform({d}, seed + 4), db0 = HostUniform({d}, seed + 5);
  Tensor dx = Tensor::Empty(shape, DType::kF32), dw = dw0.Clone();
  Tensor db = with_bias ? db0.Clone() : Tensor();
  LayerNormBackward(x, w, mean, rstd, dy, dx, dw, db);
  Tensor mean_c = mean.To(kCuda, gpu), rstd_c = rstd.To(kCuda, gpu), dy_d = dy.To(kCuda, gpu);
  Tensor dx_d = Tensor::Empty(shape, DType::kF32, kCuda), dw_d = dw0.To(kCuda, gpu);
  Tensor db_d = with_bias ? db0.To(kCuda, gpu) : Tensor();
  LayerNormBackward(x_d, w_d, mean_c, rstd_c, dy_d, dx_d, dw_d, db_d, gpu);
  ExpectNear(dx_d, dx, kDxAbs, kDxRel, gpu, name + " dx");
  const std::vector<double> mag_w =
      ColumnMagnitude(x, dy, mean.data<float>(), rstd.data<float>(), dw0, false);
  ExpectWithinMagnitude(dw_d, dw, mag_w, kColumnRel, gpu, name + " dweight");
  if (with_bias) {
    const std::vector<double> mag_b =
        ColumnMagnitude(x, dy, mean.data<float>(), rstd.data<float>(), db0, true);
    ExpectWithinMagnitude(db_d, db, mag_b, kColumnRel, gpu, name + " dbias");
  }

  // In place (dx = dy), and the same bits as the first GPU run.
  Tensor again_d = dy.To(kCuda, gpu), dw2_d = dw0.To(kCuda, gpu);
  Tensor db2_d = with_bias ? db0.To(kCuda, gpu) : Tensor();
  LayerNormBackward(x_d, w_d, mean_c, rstd_c, again_d, again_d, dw2_d, db2_d, gpu);
  ExpectBitEqual(again_d, dx_d, gpu, name + " dx in place vs out of place");
  ExpectBitEqual(dw2_d, dw_d, gpu, name + " dweight run to run");
  if (with_bias) ExpectBitEqual(db2_d, db_d, gpu, name + " dbias run to run");

  // Added into a residual gradient (Write::kAdd): the bits of dx then Axpy(1, dx, acc).
  const Tensor acc0 = HostUniform(shape, seed + 6, -3.0f, 3.0f);
  Tensor want_d = acc0.To(kCuda, gpu), added_d = acc0.To(kCuda, gpu);
  Axpy(1.0f, dx_d, want_d, gpu);
  Tensor dw3_d = dw0.To(kCuda, gpu), db3_d = with_bias ? db0.To(kCuda, gpu) : Tensor();
  LayerNormBackward(x_d, w_d, mean_c, rstd_c, dy_d, added_d, dw3_d, db3_d, gpu, Write::kAdd);
  ExpectBitEqual(added_d, want_d, gpu, name + " dx added into a gradient vs Axpy");
  ExpectBitEqual(dw3_d, dw_d, gpu, name + " dweight, dx added");
}

void CheckRmsNorm(const Shape& shape, uint64_t seed) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const int64_t d = shape.back();
  const int64_t n = d == 0 ? 0 : NumElements(shape) / d;
  const std::string name = Name("rmsnorm", shape);
  Tensor x = HostUniform(shape, seed, -2.0f, 3.0f);
  Tensor w = HostUniform({d}, seed + 1, 0.5f, 1.5f);
  Tensor y = Tensor::Empty(shape, DType::kF32), rstd = Tensor::Empty({n}, DType::kF32);
  RmsNormForward(x, w, kEps, y, rstd);

  Tensor x_d = x.To(kCuda, gpu), w_d = w.To(kCuda, gpu);
  Tensor y_d = Tensor::Empty(shape, DType::kF32, kCuda);
  Tensor rstd_d = Tensor::Empty({n}, DType::kF32, kCuda);
  RmsNormForward(x_d, w_d, kEps, y_d, rstd_d, gpu);
  ExpectNear(y_d, y, kFwdTol, kFwdTol, gpu, name + " y");
  ExpectNear(rstd_d, rstd, kFwdTol, kFwdTol, gpu, name + " rstd");
  Tensor inplace_d = x.To(kCuda, gpu);
  RmsNormForward(inplace_d, w_d, kEps, inplace_d, rstd_d, gpu);
  ExpectNear(inplace_d, y, kFwdTol, kFwdTol, gpu, name + " y in place");

  Tensor dy = HostUniform(shape, seed + 3), dw0 = HostUniform({d}, seed + 4);
  Tensor dx = Tensor::Empty(shape, DType::kF32), dw = dw0.Clone();
  RmsNormBackward(x, w, rstd, dy, dx, dw);
  Tensor rstd_c = rstd.To(kCuda, gpu), dy_d = dy.To(kCuda, gpu);
  Tensor dx_d = Tensor::Empty(shape, DType::kF32, kCuda), dw_d = dw0.To(kCuda, gpu);
  RmsNormBackward(x_d, w_d, rstd_c, dy_d, dx_d, dw_d, gpu);
  ExpectNear(dx_d, dx, kDxAbs, kDxRel, gpu, name + " dx");
  const std::vector<double> mag = ColumnMagnitude(x, dy, nullptr, rstd.data<float>(), dw0, false);
  ExpectWithinMagnitude(dw_d, dw, mag, kColumnRel, gpu, name + " dweight");

  Tensor again_d = dy.To(kCuda, gpu), dw2_d = dw0.To(kCuda, gpu);
  RmsNormBackward(x_d, w_d, rstd_c, again_d, again_d, dw2_d, gpu);
  ExpectBitEqual(again_d, dx_d, gpu, name + " dx in place vs out of place");
  ExpectBitEqual(dw2_d, dw_d, gpu, name + " dweight run to run");

  const Tensor acc0 = HostUniform(shape, seed + 6, -3.0f, 3.0f);
  Tensor want_d = acc0.To(kCuda, gpu), added_d = acc0.To(kCuda, gpu), dw3_d = dw0.To(kCuda, gpu);
  Axpy(1.0f, dx_d, want_d, gpu);
  RmsNormBackward(x_d, w_d, rstd_c, dy_d, added_d, dw3_d, gpu, Write::kAdd);
  ExpectBitEqual(added_d, want_d, gpu, name + " dx added into a gradient vs Axpy");
  ExpectBitEqual(dw3_d, dw_d, gpu, name + " dweight, dx added");
}

const Shape kShapes[] = {
    {1, 1},     {1, 64},   {7, 31},   {5, 33},    {300, 64},
    {1000, 33}, {3, 1000}, {9, 4096}, {2, 5, 64}, {0, 64},
};

TEST(NormGpuTest, LayerNormMatchesCpu) {
  SY_REQUIRE_GPU();
  uint64_t seed = 100;
  for (const Shape& shape : kShapes) CheckLayerNorm(shape, /*with_bias=*/true, seed += 10);
}

TEST(NormGpuTest, LayerNormWithoutBiasMatchesCpu) {
  SY_REQUIRE_GPU();
  uint64_t seed = 200;
  for (const Shape& shape : {Shape{1, 31}, Shape{64, 1000}})
    CheckLayerNorm(shape, false, seed += 10);
}

TEST(NormGpuTest, RmsNormMatchesCpu) {
  SY_REQUIRE_GPU();
  uint64_t seed = 300;
  for (const Shape& shape : kShapes) CheckRmsNorm(shape, seed += 10);
}

TEST(NormGpuTest, ManyRowsSpanSeveralColumnChunks) {
  SY_REQUIRE_GPU();
  // 1000 rows: four chunks of 256 rows in the dweight / dbias column sums, the last partial.
  CheckLayerNorm({1000, 96}, true, 400);
  CheckRmsNorm({1000, 96}, 410);
}

TEST(NormGpuTest, MoreRowsThanOneGridPass) {
  SY_REQUIRE_GPU();
  // The row kernels launch at most 65535 * 16 = 1048560 blocks and stride over the rest;
  // 1100000 rows also make 4297 column chunks of 256 rows.
  CheckLayerNorm({1100000, 2}, true, 420);
  CheckRmsNorm({1100000, 2}, 430);
}

}  // namespace
}  // namespace switchyard::kernels
