// kernels/elementwise.h on the CPU: hand-computed sums and products, in-place use, fills,
// Cast against BFloat16 (engine/core/dtype.h) on rounding ties, NaN, infinities, subnormals
// and the f32 maximum, ZeroMany over tensors of four dtypes, and the argument checks. Also the multi-tensor optimizer kernels of
// kernels/optimizer.h (AdamWUpdateMany, SumSquaresMany, ScaleMany) against their
// single-tensor forms, bit for bit.
#include "kernels/elementwise.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/core/counters.h"
#include "engine/core/dtype.h"
#include "engine/core/philox.h"
#include "kernels/optimizer.h"
#include "kernels/random.h"

namespace switchyard::kernels {
namespace {

Tensor F32(const std::vector<float>& values, const Shape& shape) {
  return Tensor::FromVector(values, shape);
}

std::vector<uint32_t> Bits(const std::vector<float>& values) {
  std::vector<uint32_t> bits;
  for (float v : values) bits.push_back(std::bit_cast<uint32_t>(v));
  return bits;
}

TEST(ElementwiseTest, AddMulAxpyMulAddAtHandComputedValues) {
  Tensor a = F32({1.0f, -2.0f, 0.5f, 3.0f, 0.0f, -0.25f}, {2, 3});
  Tensor b = F32({4.0f, 0.5f, -1.0f, 2.0f, 7.0f, 8.0f}, {2, 3});
  Tensor out = Tensor::Empty({2, 3}, DType::kF32);

  Add(a, b, out);
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{5.0f, -1.5f, -0.5f, 5.0f, 7.0f, 7.75f}));
  Mul(a, b, out);
  EXPECT_EQ(out.ToVector<float>(), (std::vector<float>{4.0f, -1.0f, -0.5f, 6.0f, 0.0f, -2.0f}));

  Tensor y = F32({1.0f, 1.0f, 1.0f, 1.0f, 1.0f, 1.0f}, {2, 3});
  Axpy(2.0f, a, y);  // y = 1 + 2 a
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{3.0f, -3.0f, 2.0f, 7.0f, 1.0f, 0.5f}));
  MulAdd(a, b, y);  // y += a b
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{7.0f, -4.0f, 1.5f, 13.0f, 1.0f, -1.5f}));
}

TEST(ElementwiseTest, AxpyAndMulAddRoundTheProductThenTheSum) {
  // 1 + 2^-12 is exact in f32 and (1 + 2^-12)^2 = 1 + 2^-11 + 2^-24: the product rounds
  // to 1 + 2^-11 (a tie to even), then minus (1 + 2^-11) gives exactly 0. A fused
  // multiply-add would keep the 2^-24.
  const float x = 1.0f + std::ldexp(1.0f, -12);
  const float minus = -(1.0f + std::ldexp(1.0f, -11));
  Tensor a = F32({x}, {1}), y = F32({minus}, {1});
  MulAdd(a, a, y);
  EXPECT_EQ(y.ToVector<float>()[0], 0.0f);
  Tensor y2 = F32({minus}, {1});
  Axpy(x, a, y2);
  EXPECT_EQ(y2.ToVector<float>()[0], 0.0f);
}

TEST(ElementwiseTest, OutputsMayBeTheInputs) {
  Tensor a = F32({1.0f, 2.0f, 3.0f}, {3}), b = F32({10.0f, 20.0f, 30.0f}, {3});
  Add(a, b, a);  // out is a
  EXPECT_EQ(a.ToVector<float>(), (std::vector<float>{11.0f, 22.0f, 33.0f}));
  Mul(a, b, b);  // out is b
  EXPECT_EQ(b.ToVector<float>(), (std::vector<float>{110.0f, 440.0f, 990.0f}));
  Add(a, a, a);  // all three the same
  EXPECT_EQ(a.ToVector<float>(), (std::vector<float>{22.0f, 44.0f, 66.0f}));
  Axpy(-1.0f, a, a);  // y -= y
  EXPECT_EQ(a.ToVector<float>(), (std::vector<float>{0.0f, 0.0f, 0.0f}));
  Tensor c = F32({1.0f, 2.0f, -3.0f}, {3});
  MulAdd(c, c, c);  // c += c * c
  EXPECT_EQ(c.ToVector<float>(), (std::vector<float>{2.0f, 6.0f, 6.0f}));

  // A view into a larger buffer (a slice) works like a whole tensor.
  Tensor whole = F32({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor rows = whole.Slice(1, 3);
  Fill(rows, 0.5f);
  EXPECT_EQ(whole.ToVector<float>(), (std::vector<float>{1, 2, 0.5f, 0.5f, 0.5f, 0.5f}));
}

TEST(ElementwiseTest, EmptyTensorsAreNoOps) {
  Tensor a = Tensor::Empty({0, 4}, DType::kF32), b = Tensor::Empty({0, 4}, DType::kF32);
  Add(a, b, a);
  Mul(a, b, b);
  Axpy(3.0f, a, b);
  MulAdd(a, b, a);
  Fill(a, 1.0f);
  Tensor h = Tensor::Empty({0}, DType::kBF16);
  Cast(a, h);
  EXPECT_EQ(a.numel(), 0);
}

// ZeroMany: each tensor's bytes 0 whatever its dtype (a view's only: its neighbours keep
// theirs), empty tensors skipped, in one counted dispatch; no tensors, no dispatch.
TEST(ElementwiseTest, ZeroManyZeroesEachTensorInOneDispatch) {
  Tensor whole = F32({1, 2, 3, 4, 5, 6}, {6});
  Tensor view = whole.Slice(2, 5);
  Tensor h = Tensor::Empty({3}, DType::kBF16);
  Fill(h, 7.0f);
  Tensor bytes = Tensor::FromVector(std::vector<uint8_t>{9, 9, 9}, {3});
  Tensor ints = Tensor::FromVector(std::vector<int64_t>{-1, 5}, {2});
  Tensor empty = Tensor::Empty({0}, DType::kF32);
  std::vector<Tensor> all = {view, h, bytes, empty, ints};
  const DeviceCounts before = counters::Snapshot();
  ZeroMany(all);
  const DeviceCounts d = counters::Snapshot().Minus(before);
  EXPECT_EQ(d.dispatches, 1);
  EXPECT_EQ(d.dispatch_ops.at("ZeroMany"), 1);
  EXPECT_EQ(whole.ToVector<float>(), (std::vector<float>{1, 2, 0, 0, 0, 6}));
  Tensor h32 = Tensor::Empty({3}, DType::kF32);
  Cast(h, h32);
  EXPECT_EQ(h32.ToVector<float>(), (std::vector<float>{0, 0, 0}));
  EXPECT_EQ(bytes.ToVector<uint8_t>(), (std::vector<uint8_t>{0, 0, 0}));
  EXPECT_EQ(ints.ToVector<int64_t>(), (std::vector<int64_t>{0, 0}));
  std::vector<Tensor> none;
  const DeviceCounts before_none = counters::Snapshot();
  ZeroMany(none);
  EXPECT_EQ(counters::Snapshot().Minus(before_none).dispatches, 0);
}

TEST(ElementwiseTest, FillF32AndBf16) {
  Tensor t = Tensor::Empty({2, 2}, DType::kF32);
  Fill(t, -1.5f);
  EXPECT_EQ(t.ToVector<float>(), (std::vector<float>{-1.5f, -1.5f, -1.5f, -1.5f}));
  Tensor h = Tensor::Empty({3}, DType::kBF16);
  Fill(h, 1.0f / 3.0f);
  for (BFloat16 v : h.ToVector<BFloat16>()) EXPECT_EQ(v.bits, BFloat16(1.0f / 3.0f).bits);
}

// f32 bit patterns chosen to exercise every branch of round-to-nearest-even to bf16.
const std::vector<uint32_t> kTrickyBits = {
    0x3f800000u,  // 1
    0x3f808000u,  // 1 + 2^-8: a tie between 1 and 1 + 2^-7, to even (down)
    0x3f818000u,  // a tie with an odd lower neighbour (up)
    0x3f808001u,  // just above a tie (up)
    0x3f807fffu,  // just below a tie (down)
    0xbf808000u,  // negative tie
    0x7f7fffffu,  // f32 max: rounds up to +inf
    0xff7fffffu,  // -max: -inf
    0x7f7f7fffu,  // the largest that stays finite
    0x7f800000u,  // +inf
    0xff800000u,  // -inf
    0x7fc00000u,  // quiet NaN
    0xffc00001u,  // negative NaN with a low payload bit
    0x7f800001u,  // signalling NaN whose payload lies in the low 16 bits only
    0x7fa00000u,  // signalling NaN with a high payload
    0x00000000u,  // +0
    0x80000000u,  // -0
    0x00000001u,  // smallest subnormal: rounds to 0
    0x00008000u,  // subnormal tie, to even (0)
    0x00018000u,  // subnormal tie, to even (up)
    0x007fffffu,  // largest subnormal: rounds up to the smallest normal
    0x00800000u,  // smallest normal
    0x3eaaaaabu,  // 1/3
};

TEST(ElementwiseTest, CastToBf16MatchesBFloat16Conversion) {
  std::vector<float> values;
  for (uint32_t b : kTrickyBits) values.push_back(std::bit_cast<float>(b));
  Tensor src = F32(values, {static_cast<int64_t>(values.size())});
  Tensor dst = Tensor::Empty({static_cast<int64_t>(values.size())}, DType::kBF16);
  Cast(src, dst);
  const std::vector<BFloat16> got = dst.ToVector<BFloat16>();
  for (size_t i = 0; i < values.size(); ++i) {
    EXPECT_EQ(got[i].bits, BFloat16::FromFloat(values[i]))
        << "f32 bits 0x" << std::hex << kTrickyBits[i];
  }
  // A few written out, so a change in BFloat16 itself would show here too.
  EXPECT_EQ(got[1].bits, 0x3f80u);   // tie to even, down
  EXPECT_EQ(got[2].bits, 0x3f82u);   // tie to even, up
  EXPECT_EQ(got[3].bits, 0x3f81u);   // above the tie
  EXPECT_EQ(got[6].bits, 0x7f80u);   // max -> +inf
  EXPECT_EQ(got[8].bits, 0x7f7fu);   // stays finite
  EXPECT_EQ(got[16].bits, 0x8000u);  // -0 keeps its sign
  EXPECT_EQ(got[20].bits, 0x0080u);  // largest subnormal -> smallest normal
  for (size_t i : {11u, 12u, 13u, 14u}) {
    EXPECT_TRUE(std::isnan(static_cast<float>(got[i]))) << "NaN stays NaN, index " << i;
  }
  EXPECT_EQ(got[12].bits & 0x8000u, 0x8000u);  // the NaN's sign survives
}

TEST(ElementwiseTest, CastFromBf16IsExactAndRoundTrips) {
  // Every bf16 bit pattern -> f32 -> bf16 gives the pattern back (NaNs stay NaN, made quiet).
  std::vector<BFloat16> all(65536);
  for (uint32_t b = 0; b < 65536; ++b) all[b].bits = static_cast<uint16_t>(b);
  Tensor h = Tensor::FromVector(all, {256, 256});
  Tensor f = Tensor::Empty({65536}, DType::kF32);  // another shape, same numel
  Cast(h, f);
  Tensor back = Tensor::Empty({256, 256}, DType::kBF16);
  Cast(f, back);
  const std::vector<float> fv = f.ToVector<float>();
  const std::vector<BFloat16> bv = back.ToVector<BFloat16>();
  for (uint32_t b = 0; b < 65536; ++b) {
    ASSERT_EQ(std::bit_cast<uint32_t>(fv[b]), b << 16) << "bf16 0x" << std::hex << b;
    const bool nan = (b & 0x7fffu) > 0x7f80u;
    ASSERT_EQ(bv[b].bits, nan ? (b | 0x40u) : b) << "bf16 0x" << std::hex << b;
  }
}

TEST(ElementwiseTest, CastWithinOneDtypeCopies) {
  Tensor src = F32({1.0f, -0.0f, std::numeric_limits<float>::quiet_NaN(), 4.0f}, {2, 2});
  Tensor dst = Tensor::Empty({4}, DType::kF32);
  Cast(src, dst);
  EXPECT_EQ(Bits(dst.ToVector<float>()), Bits(src.ToVector<float>()));
  Tensor ids = Tensor::FromVector<int32_t>({7, -1, 3}, {3});
  Tensor ids_copy = Tensor::Empty({3}, DType::kI32);
  Cast(ids, ids_copy);
  EXPECT_EQ(ids_copy.ToVector<int32_t>(), (std::vector<int32_t>{7, -1, 3}));
  Cast(ids, ids);  // onto itself: unchanged
  EXPECT_EQ(ids.ToVector<int32_t>(), (std::vector<int32_t>{7, -1, 3}));
}

TEST(ElementwiseDeathTest, ShapeDtypeAndDeviceErrorsAreFatal) {
  Tensor a = Tensor::Zeros({2, 3}, DType::kF32), b = Tensor::Zeros({3, 2}, DType::kF32);
  Tensor out = Tensor::Empty({2, 3}, DType::kF32);
  EXPECT_DEATH(Add(a, b, out), "Add: b \\(3, 2\\), output \\(2, 3\\)");
  EXPECT_DEATH(Axpy(1.0f, b, out), "Axpy: x");
  Tensor ints = Tensor::Zeros({2, 3}, DType::kI32);
  EXPECT_DEATH(Mul(a, ints, out), "Mul: b is i32, expected f32");
  EXPECT_DEATH(MulAdd(a, a, ints), "MulAdd: the output is i32");
  EXPECT_DEATH(Add(a, Tensor(), out), "Add: b is undefined");
  EXPECT_DEATH(Fill(ints, 1.0f), "Fill: the tensor is i32");
  Tensor small = Tensor::Empty({5}, DType::kBF16);
  EXPECT_DEATH(Cast(a, small), "Cast: src \\(2, 3\\) has 6 elements, dst \\(5\\) has 5");
  EXPECT_DEATH(Cast(ints, out), "Cast from i32 to f32 is not supported");
}

// ---- multi-tensor optimizer kernels (kernels/optimizer.h) ---------------------------------

Tensor Random(const Shape& shape, uint64_t stream, float lo, float hi) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  FillUniform(t, RngKey{5, stream}, 0, lo, hi);
  return t;
}

TEST(OptimizerManyTest, AdamWUpdateManyEqualsAdamWUpdatePerTensor) {
  const std::vector<Shape> shapes = {{3, 5}, {0}, {1}, {70000}, {4, 33}};
  const std::vector<float> decays = {0.1f, 0.0f, 0.05f, 0.01f, 0.0f};
  AdamWStep hp{.lr = 3e-3f,
               .beta1 = 0.9f,
               .beta2 = 0.95f,
               .eps = 1e-8f,
               .weight_decay = 123.0f /* ignored by the Many form */,
               .step = 7};
  std::vector<AdamWTensors> many;
  std::vector<AdamWTensors> single;
  for (size_t k = 0; k < shapes.size(); ++k) {
    AdamWTensors t{Random(shapes[k], 10 * k, -1, 1), Random(shapes[k], 10 * k + 1, -1, 1),
                   Random(shapes[k], 10 * k + 2, -0.1f, 0.1f),
                   Random(shapes[k], 10 * k + 3, 0.0f, 0.01f), decays[k], Tensor()};
    single.push_back(t);
    // Every other tensor has a bf16 weight shadow, which gets the new values.
    Tensor shadow = k % 2 == 0 ? Tensor::Zeros(shapes[k], DType::kBF16) : Tensor();
    many.push_back({t.param.Clone(), t.grad.Clone(), t.exp_avg.Clone(), t.exp_avg_sq.Clone(),
                    decays[k], shadow});
  }
  // Each entry's own weight_decay replaces hp's (123 would blow every parameter up).
  for (int step = 0; step < 2; ++step, ++hp.step) {
    AdamWUpdateMany(many, hp);
    for (AdamWTensors& t : single) {
      AdamWStep one = hp;
      one.weight_decay = t.weight_decay;
      AdamWUpdate(t.param, t.grad, t.exp_avg, t.exp_avg_sq, one);
    }
  }
  for (size_t k = 0; k < shapes.size(); ++k) {
    EXPECT_EQ(Bits(many[k].param.ToVector<float>()), Bits(single[k].param.ToVector<float>()))
        << "tensor " << k;
    EXPECT_EQ(Bits(many[k].exp_avg.ToVector<float>()), Bits(single[k].exp_avg.ToVector<float>()));
    EXPECT_EQ(Bits(many[k].exp_avg_sq.ToVector<float>()),
              Bits(single[k].exp_avg_sq.ToVector<float>()));
    if (!many[k].shadow.defined()) continue;
    // The shadow: the bits Cast gives of the updated parameter.
    Tensor want = Tensor::Empty(shapes[k], DType::kBF16);
    Cast(single[k].param, want);
    const std::vector<BFloat16> got = many[k].shadow.ToVector<BFloat16>(),
                                wanted = want.ToVector<BFloat16>();
    ASSERT_EQ(got.size(), wanted.size());
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_EQ(got[i].bits, wanted[i].bits) << "shadow " << k << " element " << i;
    }
  }
}

TEST(OptimizerManyTest, SumSquaresManyAndScaleManyEqualTheSingleForms) {
  std::vector<Tensor> tensors = {Random({100}, 1, -2, 2), Tensor::Empty({0, 3}, DType::kF32),
                                 Random({70001}, 2, -1, 1), Random({1}, 3, -5, 5)};
  const std::vector<double> sums = SumSquaresMany(tensors);
  ASSERT_EQ(sums.size(), tensors.size());
  for (size_t k = 0; k < tensors.size(); ++k) EXPECT_EQ(sums[k], SumSquares(tensors[k])) << k;
  EXPECT_EQ(sums[1], 0.0);
  EXPECT_TRUE(SumSquaresMany({}).empty());

  std::vector<Tensor> copies;
  for (const Tensor& t : tensors) copies.push_back(t.Clone());
  ScaleMany(copies, 0.3f);
  for (size_t k = 0; k < tensors.size(); ++k) {
    ScaleInPlace(tensors[k], 0.3f);
    EXPECT_EQ(Bits(copies[k].ToVector<float>()), Bits(tensors[k].ToVector<float>())) << k;
  }
  ScaleMany({}, 2.0f);
}

TEST(OptimizerManyDeathTest, MismatchedTensorsAreFatal) {
  std::vector<AdamWTensors> list = {
      {Tensor::Zeros({2}, DType::kF32), Tensor::Zeros({3}, DType::kF32),
       Tensor::Zeros({2}, DType::kF32), Tensor::Zeros({2}, DType::kF32), 0.0f, Tensor()}};
  EXPECT_DEATH(AdamWUpdateMany(list, AdamWStep{}),
               "AdamWUpdateMany: grad \\(3\\), expected \\(2\\)");
  list[0].grad = Tensor::Zeros({2}, DType::kF32);
  list[0].shadow = Tensor::Zeros({2}, DType::kF32);
  EXPECT_DEATH(AdamWUpdateMany(list, AdamWStep{}), "AdamWUpdateMany: shadow is f32");
  list[0].shadow = Tensor::Zeros({3}, DType::kBF16);
  EXPECT_DEATH(AdamWUpdateMany(list, AdamWStep{}),
               "AdamWUpdateMany: shadow \\(3\\), expected \\(2\\)");
  list[0].shadow = Tensor();
  AdamWStep zero_step;
  zero_step.step = 0;
  EXPECT_DEATH(AdamWUpdateMany(list, zero_step), "steps count from 1");
  std::vector<Tensor> mixed = {Tensor::Zeros({2}, DType::kF32), Tensor::Zeros({2}, DType::kI32)};
  EXPECT_DEATH(SumSquaresMany(mixed), "SumSquaresMany: a tensor is i32");
  EXPECT_DEATH(ScaleMany(mixed, 1.0f), "ScaleMany: a tensor is i32");
}

}  // namespace
}  // namespace switchyard::kernels
