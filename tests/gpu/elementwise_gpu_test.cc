// kernels/elementwise.h on CUDA against the CPU reference on the same random inputs: Add,
// Mul, Axpy, MulAdd (out of place and in place), Fill (f32, bf16) and Cast (f32 -> bf16 on
// arbitrary bit patterns — NaNs with payloads, infinities, subnormals — bf16 -> f32, and
// copies within one dtype), on no elements, one, odd sizes and more than a million.
//
// Tolerances: none. Every op is one or two correctly rounded f32 operations per element
// (the CUDA kernels use __fadd_rn / __fmul_rn, which are never contracted into an FMA) or
// an integer rounding of the bits, identical on both devices: bit-for-bit equality.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <iterator>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/dtype.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::HostUniform;

const Device kCuda = Device::Cuda(0);

// numel 0, 1, odd 2-d, a multiple of 256 plus 3, and more than 2^20 (thousands of blocks).
const std::vector<Shape> kShapes = {{0}, {1}, {7, 33}, {257, 3}, {1, 1049001}};

std::string Name(const char* op, const Shape& shape) {
  return std::string(op) + " " + ShapeString(shape);
}

// Expects equal 16-bit patterns (bf16).
void ExpectBits16Equal(const Tensor& got, const Tensor& want, DeviceContext* ctx,
                       const std::string& what) {
  const std::vector<BFloat16> g = gpu_test::ValuesOf<BFloat16>(got, ctx);
  const std::vector<BFloat16> w = gpu_test::ValuesOf<BFloat16>(want, ctx);
  ASSERT_EQ(g.size(), w.size()) << what;
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i].bits != w[i].bits && mismatches++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " elements differ, the first at "
                           << first;
  std::printf("  %-56s bit-identical: %s\n", what.c_str(), mismatches == 0 ? "yes" : "NO");
}

TEST(ElementwiseGpuTest, ArithmeticMatchesTheCpuBitForBit) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  uint64_t seed = 100;
  for (const Shape& shape : kShapes) {
    const Tensor a = HostUniform(shape, seed++, -3.0f, 3.0f);
    const Tensor b = HostUniform(shape, seed++, -3.0f, 3.0f);
    const Tensor y0 = HostUniform(shape, seed++, -1.0f, 1.0f);
    const Tensor da = a.To(kCuda, c), db = b.To(kCuda, c);

    Tensor out = Tensor::Empty(shape, DType::kF32), dout = Tensor::Empty(shape, DType::kF32, kCuda);
    Add(a, b, out);
    Add(da, db, dout, c);
    ExpectBitEqual(dout, out, c, Name("Add", shape));
    Mul(a, b, out);
    Mul(da, db, dout, c);
    ExpectBitEqual(dout, out, c, Name("Mul", shape));

    Tensor y = y0.Clone(), dy = y0.To(kCuda, c);
    Axpy(-0.37f, a, y);
    Axpy(-0.37f, da, dy, c);
    ExpectBitEqual(dy, y, c, Name("Axpy", shape));
    MulAdd(a, b, y);
    MulAdd(da, db, dy, c);
    ExpectBitEqual(dy, y, c, Name("MulAdd", shape));

    // In place: the output is an input.
    Tensor ya = a.Clone(), dya = a.To(kCuda, c);
    Add(ya, b, ya);
    Add(dya, db, dya, c);
    Mul(b, ya, ya);
    Mul(db, dya, dya, c);
    MulAdd(ya, ya, ya);
    MulAdd(dya, dya, dya, c);
    Axpy(0.5f, ya, ya);
    Axpy(0.5f, dya, dya, c);
    ExpectBitEqual(dya, ya, c, Name("in place chain", shape));
  }
}

TEST(ElementwiseGpuTest, FillMatchesTheCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  for (const Shape& shape : kShapes) {
    Tensor f = Tensor::Empty(shape, DType::kF32), df = Tensor::Empty(shape, DType::kF32, kCuda);
    Fill(f, -2.75f);
    Fill(df, -2.75f, c);
    ExpectBitEqual(df, f, c, Name("Fill f32", shape));
    Tensor h = Tensor::Empty(shape, DType::kBF16), dh = Tensor::Empty(shape, DType::kBF16, kCuda);
    Fill(h, 1.0f / 3.0f);
    Fill(dh, 1.0f / 3.0f, c);
    ExpectBits16Equal(dh, h, c, Name("Fill bf16", shape));
  }
}

TEST(ElementwiseGpuTest, CastMatchesTheCpuBitForBit) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(kCuda);
  DeviceContext* c = ctx.get();
  uint64_t stream = 7;
  for (const Shape& shape : kShapes) {
    // Arbitrary 32-bit patterns as f32: every class of value, NaNs with random payloads
    // (1 in 256 patterns), infinities rarely, subnormals (1 in 256), many rounding ties
    // only by luck — so the hand-picked tricky patterns go in front.
    Tensor bits = Tensor::Empty(shape, DType::kI32);
    FillRandomBits(bits, RngKey{3, stream++}, 0);
    std::vector<int32_t> raw = bits.ToVector<int32_t>();
    const uint32_t tricky[] = {0x3f808000u, 0x3f818000u, 0x7f7fffffu, 0xff7fffffu,
                               0x7f800000u, 0xff800000u, 0x7f800001u, 0xffc00001u,
                               0x00008000u, 0x00018000u, 0x007fffffu, 0x80000000u};
    for (size_t i = 0; i < raw.size() && i < std::size(tricky); ++i) {
      raw[i] = static_cast<int32_t>(tricky[i]);
    }
    std::vector<float> values(raw.size());
    if (!raw.empty()) std::memcpy(values.data(), raw.data(), raw.size() * sizeof(float));
    const Tensor src = Tensor::FromVector(values, shape);
    const Tensor dsrc = src.To(kCuda, c);

    Tensor h = Tensor::Empty({src.numel()}, DType::kBF16);  // another shape, same numel
    Tensor dh = Tensor::Empty({src.numel()}, DType::kBF16, kCuda);
    Cast(src, h);
    Cast(dsrc, dh, c);
    ExpectBits16Equal(dh, h, c, Name("Cast f32->bf16", shape));

    Tensor back = Tensor::Empty(shape, DType::kF32),
           dback = Tensor::Empty(shape, DType::kF32, kCuda);
    Cast(h, back);
    Cast(dh, dback, c);
    ExpectBitEqual(dback, back, c, Name("Cast bf16->f32", shape));

    Tensor copy = Tensor::Empty(shape, DType::kF32, kCuda);
    Cast(dsrc, copy, c);
    ExpectBitEqual(copy, src, c, Name("Cast f32->f32 (copy)", shape));
    const Tensor dbits = bits.To(kCuda, c);
    Tensor bits_copy = Tensor::Empty({bits.numel()}, DType::kI32, kCuda);
    Cast(dbits, bits_copy, c);
    ExpectBitEqual(bits_copy, bits, c, Name("Cast i32->i32 (copy)", shape));
  }
}

TEST(ElementwiseGpuDeathTest, InputOnAnotherDeviceIsFatal) {
  SY_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // the child re-runs the test from main
  auto ctx = DeviceContext::Create(kCuda);
  Tensor a = Tensor::Zeros({4}, DType::kF32);
  Tensor b = Tensor::Zeros({4}, DType::kF32, kCuda, ctx.get());
  Tensor out = Tensor::Empty({4}, DType::kF32, kCuda);
  EXPECT_DEATH(Add(a, b, out, ctx.get()), "Add: a is on cpu but the output is on cuda:0");
  EXPECT_DEATH(Add(b, b, out, nullptr), "needs the DeviceContext of cuda:0");
}

}  // namespace
}  // namespace switchyard::kernels
