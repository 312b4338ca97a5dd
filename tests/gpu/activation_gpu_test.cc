// kernels/activation.h on CUDA against the CPU reference on the same random inputs: gelu,
// relu and swiglu forward and backward (no elements, one, odd sizes, over a million; in
// place), the bias add over rows and its gradient (flat and grouped, empty groups, no rows,
// a tall input cut into many chunks, more rows than a grid's y-dimension, beta 0 over NaN,
// 1 and 0.5; grouped with host- and device-sized groups), and run-to-run bit-identical bias
// gradients.
//
// Tolerances.
//   relu, AddBias, GroupedAddBias: exact (a select, or one f32 addition, on both devices).
//   gelu, swiglu: the kernels evaluate the CPU's f32 expression in its order without FMA
//     contraction, so they differ only through expf: CUDA's is within 2 ulp, the CPU's VecExp
//     within 2, i.e. 4.8e-7 relative, and each later rounding may then land on the other
//     neighbour (about 1.2e-7 each, four of them): |gpu - cpu| <= 2e-6 |cpu| (kActRel).
//   gelu', swiglu' (da): where terms cancel (gelu' = s + 2 v s (1 - s) u', zero near
//     x = -0.75; 1 + a (1 - s) near a = -1.28) the error is relative to the terms, not the
//     result, and 1 - s for s near 1 is quantised to the ulps of 1 (s may differ by two
//     of them, 2.5e-7): |gpu - cpu| <= |dy| (kActRel (|s| + |term|) + 2.5e-7 |2 v u'|) for
//     gelu, and the analogue for swiglu (written in SwigluDaTolerance).
//   BiasGrad, GroupedBiasGrad: column sums; the CPU adds R rows one by one in f32, the GPU
//     in chunks and lanes. |gpu - cpu| <= 1e-5 (|beta dbias| + sum_r |dy[r, j]|) (kSumRel),
//     about 100x the typical error of the CPU's own running sum on zero-mean data.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "kernels/activation.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::HostUniform;

const Device kCuda = Device::Cuda(0);
constexpr double kActRel = 2e-6;
constexpr double kTiny = 1e-30;      // absorbs underflow to 0 vs a denormal
constexpr double kOneUlps = 2.5e-7;  // two ulps of values just below 1
constexpr double kSumRel = 1e-5;
constexpr double kSqrt2OverPi = 0.79788456080286535588;
constexpr double kGeluCubic = 0.044715;

const std::vector<Shape> kShapes = {{0}, {1}, {5, 77}, {3, 1000}, {1049005}};

std::string Name(const char* op, const Shape& shape) {
  return std::string(op) + " " + ShapeString(shape);
}

// |got - want| <= tol[i] per element (NaN fails); prints the largest fraction used.
void ExpectWithin(const Tensor& got, const Tensor& want, const std::vector<double>& tol,
                  DeviceContext* ctx, const std::string& what) {
  const std::vector<float> g = gpu_test::ValuesOf<float>(got, ctx);
  const std::vector<float> w = gpu_test::ValuesOf<float>(want, ctx);
  ASSERT_EQ(g.size(), w.size()) << what;
  ASSERT_EQ(tol.size(), w.size()) << what;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    const double used = err <= tol[i] ? (tol[i] > 0 ? err / tol[i] : 0.0) : INFINITY;
    if (used > worst) worst = used, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " is " << g[worst_i] << ", expected "
                        << w[worst_i];
  std::printf("  %-56s tolerance used %.3f\n", what.c_str(), worst);
}

std::vector<double> RelativeTolerance(const Tensor& want, double rel) {
  std::vector<double> tol;
  for (float w : want.ToVector<float>()) tol.push_back(rel * std::fabs(w) + kTiny);
  return tol;
}

std::vector<double> GeluBackwardTolerance(const Tensor& x, const Tensor& dy) {
  const std::vector<float> xv = x.ToVector<float>(), dyv = dy.ToVector<float>();
  std::vector<double> tol;
  for (size_t i = 0; i < xv.size(); ++i) {
    const double v = xv[i];
    const double u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    const double s = 1.0 / (1.0 + std::exp(-2.0 * u));
    const double du = kSqrt2OverPi * (1.0 + 3.0 * kGeluCubic * v * v);
    const double term = 2.0 * v * s * (1.0 - s) * du;
    tol.push_back(std::fabs(dyv[i]) * (kActRel * (std::fabs(s) + std::fabs(term)) +
                                       kOneUlps * std::fabs(2 * v * du)) +
                  kTiny);
  }
  return tol;
}

// da = g b s (1 + a (1 - s)): relative to |g b s| (1 + |a (1 - s)|), plus 1 - s quantised.
std::vector<double> SwigluDaTolerance(const Tensor& a, const Tensor& b, const Tensor& dout) {
  const std::vector<float> av = a.ToVector<float>(), bv = b.ToVector<float>(),
                           gv = dout.ToVector<float>();
  std::vector<double> tol;
  for (size_t i = 0; i < av.size(); ++i) {
    const double s = 1.0 / (1.0 + std::exp(-static_cast<double>(av[i])));
    const double base = std::fabs(static_cast<double>(gv[i]) * bv[i] * s);
    tol.push_back(
        base * (kActRel * (1.0 + std::fabs(av[i] * (1.0 - s))) + kOneUlps * std::fabs(av[i])) +
        kTiny);
  }
  return tol;
}

TEST(ActivationGpuTest, GeluAndReluMatchTheCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  uint64_t seed = 200;
  for (const Shape& shape : kShapes) {
    const Tensor x = HostUniform(shape, seed++, -8.0f, 8.0f);
    const Tensor dy = HostUniform(shape, seed++, -1.0f, 1.0f);
    const Tensor dx_dev = x.To(kCuda, c), ddy = dy.To(kCuda, c);
    Tensor y = Tensor::Empty(shape, DType::kF32), dyd = Tensor::Empty(shape, DType::kF32, kCuda);

    GeluForward(x, y);
    GeluForward(dx_dev, dyd, c);
    ExpectWithin(dyd, y, RelativeTolerance(y, kActRel), c, Name("GeluForward", shape));
    Tensor inplace = x.To(kCuda, c);
    GeluForward(inplace, inplace, c);
    ExpectBitEqual(inplace, dyd, c, Name("GeluForward in place = out of place", shape));

    Tensor dx = Tensor::Empty(shape, DType::kF32), ddx = Tensor::Empty(shape, DType::kF32, kCuda);
    GeluBackward(x, dy, dx);
    GeluBackward(dx_dev, ddy, ddx, c);
    ExpectWithin(ddx, dx, GeluBackwardTolerance(x, dy), c, Name("GeluBackward", shape));
    Tensor grad_inplace = dy.To(kCuda, c);
    GeluBackward(dx_dev, grad_inplace, grad_inplace, c);
    ExpectBitEqual(grad_inplace, ddx, c, Name("GeluBackward in place = out of place", shape));

    ReluForward(x, y);
    ReluForward(dx_dev, dyd, c);
    ExpectBitEqual(dyd, y, c, Name("ReluForward", shape));
    ReluBackward(x, dy, dx);
    ReluBackward(dx_dev, ddy, ddx, c);
    ExpectBitEqual(ddx, dx, c, Name("ReluBackward", shape));
  }
}

TEST(ActivationGpuTest, SwigluMatchesTheCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  uint64_t seed = 300;
  for (const Shape& shape : kShapes) {
    const Tensor a = HostUniform(shape, seed++, -8.0f, 8.0f);
    const Tensor b = HostUniform(shape, seed++, -3.0f, 3.0f);
    const Tensor dout = HostUniform(shape, seed++, -1.0f, 1.0f);
    const Tensor da_dev = a.To(kCuda, c), db_dev = b.To(kCuda, c), ddout = dout.To(kCuda, c);

    Tensor out = Tensor::Empty(shape, DType::kF32),
           dout_fwd = Tensor::Empty(shape, DType::kF32, kCuda);
    SwigluForward(a, b, out);
    SwigluForward(da_dev, db_dev, dout_fwd, c);
    ExpectWithin(dout_fwd, out, RelativeTolerance(out, kActRel), c, Name("SwigluForward", shape));

    Tensor ga = Tensor::Empty(shape, DType::kF32), gb = Tensor::Empty(shape, DType::kF32);
    Tensor dga = Tensor::Empty(shape, DType::kF32, kCuda),
           dgb = Tensor::Empty(shape, DType::kF32, kCuda);
    SwigluBackward(a, b, dout, ga, gb);
    SwigluBackward(da_dev, db_dev, ddout, dga, dgb, c);
    ExpectWithin(dga, ga, SwigluDaTolerance(a, b, dout), c, Name("SwigluBackward da", shape));
    ExpectWithin(dgb, gb, RelativeTolerance(gb, kActRel), c, Name("SwigluBackward db", shape));

    // da written over dout, as the experts' backward does.
    Tensor over = dout.To(kCuda, c), db2 = Tensor::Empty(shape, DType::kF32, kCuda);
    SwigluBackward(da_dev, db_dev, over, over, db2, c);
    ExpectBitEqual(over, dga, c, Name("SwigluBackward da over dout", shape));
    ExpectBitEqual(db2, dgb, c, Name("SwigluBackward db (da over dout)", shape));
  }
}

// Column-sum tolerance per (group, column) of dbias (G, n).
std::vector<double> BiasGradTolerance(const Tensor& dy, const std::vector<int64_t>& rows,
                                      const Tensor& dbias0, float beta) {
  const int64_t n = dy.dim(1);
  const std::vector<float> dyv = dy.ToVector<float>(), d0 = dbias0.ToVector<float>();
  std::vector<double> tol(rows.size() * n, 0.0);
  int64_t r = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    for (int64_t j = 0; j < n; ++j) {
      tol[g * n + j] = beta == 0.0f ? 0.0 : std::fabs(static_cast<double>(beta) * d0[g * n + j]);
    }
    for (int64_t end = r + rows[g]; r < end; ++r) {
      for (int64_t j = 0; j < n; ++j) tol[g * n + j] += std::fabs(dyv[r * n + j]);
    }
  }
  for (double& t : tol) t = kSumRel * t + kTiny;
  return tol;
}

// The groups' offsets (G + 1) on the device, as the device-sized ops take them.
Tensor DeviceOffsets(const std::vector<int64_t>& rows, DeviceContext* c) {
  std::vector<int64_t> offsets(rows.size() + 1, 0);
  for (size_t g = 0; g < rows.size(); ++g) offsets[g + 1] = offsets[g] + rows[g];
  return Tensor::FromVector(offsets, {static_cast<int64_t>(offsets.size())}).To(kCuda, c);
}

// x (R, n) on the host followed by `extra` rows of NaN.
constexpr int64_t kPadRows = 5;
Tensor Padded(const Tensor& x, int64_t extra) {
  std::vector<float> v = x.ToVector<float>();
  v.resize(v.size() + extra * x.dim(1), std::numeric_limits<float>::quiet_NaN());
  return Tensor::FromVector(v, {x.dim(0) + extra, x.dim(1)});
}

// One grouped case: GroupedAddBias exactly, GroupedBiasGrad within kSumRel for beta 0 (over
// NaN), 1 and 0.5, and twice bit-identically; the device-sized ops (offsets on the device,
// rows past the groups) bit-identical to the host-sized ones.
void CheckGrouped(const std::vector<int64_t>& rows, int64_t n, uint64_t seed, DeviceContext* c) {
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  const int64_t groups = static_cast<int64_t>(rows.size());
  const std::string shape = ShapeString({total, n}) + " in " + std::to_string(groups) + " groups";

  const Tensor out0 = HostUniform({total, n}, seed, -1.0f, 1.0f);
  const Tensor bias = HostUniform({groups, n}, seed + 1, -1.0f, 1.0f);
  Tensor out = out0.Clone(), dout = out0.To(kCuda, c);
  GroupedAddBias(out, rows, bias);
  GroupedAddBias(dout, rows, bias.To(kCuda, c), c);
  ExpectBitEqual(dout, out, c, "GroupedAddBias " + shape);

  const Tensor dy = HostUniform({total, n}, seed + 2, -1.0f, 1.0f);
  const Tensor ddy = dy.To(kCuda, c);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (float beta : {0.0f, 1.0f, 0.5f}) {
    Tensor dbias0 = HostUniform({groups, n}, seed + 3, -1.0f, 1.0f);
    if (beta == 0.0f) {
      std::vector<float> nans(groups * n, nan);
      dbias0 = Tensor::FromVector(nans, {groups, n});  // beta 0 must not read it
    }
    Tensor db = dbias0.Clone(), ddb = dbias0.To(kCuda, c), again = dbias0.To(kCuda, c);
    GroupedBiasGrad(dy, rows, db, beta);
    GroupedBiasGrad(ddy, rows, ddb, beta, c);
    GroupedBiasGrad(ddy, rows, again, beta, c);
    const std::string what = "GroupedBiasGrad beta " + std::to_string(beta) + " " + shape;
    ExpectWithin(ddb, db, BiasGradTolerance(dy, rows, dbias0, beta), c, what);
    ExpectBitEqual(again, ddb, c, what + " run to run");
    if (groups == 0) continue;
    // Device-sized groups: the host-sized op's chunks, so its bits; and rows past
    // offsets[G] (NaN here) neither summed nor changed.
    Tensor sized = dbias0.To(kCuda, c), padded_db = dbias0.To(kCuda, c);
    GroupedBiasGrad(ddy, DeviceOffsets(rows, c), sized, beta, c);
    ExpectBitEqual(sized, ddb, c, what + " device-sized");
    GroupedBiasGrad(Padded(dy, kPadRows).To(kCuda, c), DeviceOffsets(rows, c), padded_db, beta, c);
    ExpectWithin(padded_db, db, BiasGradTolerance(dy, rows, dbias0, beta), c,
                 what + " device-sized, " + std::to_string(kPadRows) + " rows past the groups");
  }
  if (groups == 0) return;
  Tensor padded = Padded(out0, kPadRows).To(kCuda, c);
  GroupedAddBias(padded, DeviceOffsets(rows, c), bias.To(kCuda, c), c);
  ExpectBitEqual(padded.Slice(0, total), out, c, "GroupedAddBias device-sized " + shape);
  const std::vector<float> tail =
      gpu_test::ValuesOf<float>(padded.Slice(total, total + kPadRows), c);
  for (float v : tail) ASSERT_TRUE(std::isnan(v)) << "GroupedAddBias wrote past offsets[G] " << shape;
}

TEST(ActivationGpuTest, BiasAddAndGradMatchTheCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  // (rows, n): no rows, one element, one wide row, odd sizes, more rows than grid.y
  // (65535), a tall input (about 1024 chunks of 293 rows), over a million elements, and
  // rows wider than the AddBias grid's x-dimension covers in one pass (1024 x 256 columns).
  const std::vector<Shape> shapes = {{0, 5},       {1, 1},     {1, 1000},   {33, 31},
                                     {1000, 77},   {70000, 3}, {300000, 5}, {1100, 1000},
                                     {3, 300001}};
  uint64_t seed = 400;
  for (const Shape& shape : shapes) {
    const int64_t n = shape[1];
    const Tensor out0 = HostUniform(shape, seed++, -1.0f, 1.0f);
    const Tensor bias = HostUniform({n}, seed++, -1.0f, 1.0f);
    Tensor out = out0.Clone(), dout = out0.To(kCuda, c);
    AddBias(out, bias);
    AddBias(dout, bias.To(kCuda, c), c);
    ExpectBitEqual(dout, out, c, Name("AddBias", shape));

    const Tensor dy = HostUniform(shape, seed++, -1.0f, 1.0f);
    const Tensor ddy = dy.To(kCuda, c);
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      Tensor dbias0 = HostUniform({n}, seed++, -1.0f, 1.0f);
      if (beta == 0.0f) {
        std::vector<float> nans(n, std::numeric_limits<float>::quiet_NaN());
        dbias0 = Tensor::FromVector(nans, {n});
      }
      Tensor db = dbias0.Clone(), ddb = dbias0.To(kCuda, c), again = dbias0.To(kCuda, c);
      BiasGrad(dy, db, beta);
      BiasGrad(ddy, ddb, beta, c);
      BiasGrad(ddy, again, beta, c);
      const std::string what = "BiasGrad beta " + std::to_string(beta) + " " + ShapeString(shape);
      ExpectWithin(ddb, db, BiasGradTolerance(dy, {shape[0]}, dbias0.Reshape({1, n}), beta), c,
                   what);
      ExpectBitEqual(again, ddb, c, what + " run to run");
    }
  }
}

TEST(ActivationGpuTest, GroupedBiasAddAndGradMatchTheCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  CheckGrouped({0, 5, 0, 130, 1, 64, 0}, 77, 500, c);  // empty groups first, middle, last
  CheckGrouped({0, 0, 0}, 9, 510, c);                  // no rows at all
  CheckGrouped({}, 4, 520, c);                         // no groups
  CheckGrouped({1}, 1, 530, c);
  CheckGrouped({3000, 17, 0, 9000, 4500, 1, 800, 2222}, 96, 540, c);  // chunked groups
  CheckGrouped({200000, 3, 70000}, 6, 550, c);  // many chunks in one group, rows > grid.y
}

}  // namespace
}  // namespace switchyard::kernels
