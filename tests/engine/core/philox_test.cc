// The counter-based generator: the published Philox4x32-10 known answers, and the property
// the engine relies on — a value depends only on (seed, stream, global index), never on
// how a tensor is chunked.
#include "engine/core/philox.h"

#include <cmath>
#include <set>

#include <gtest/gtest.h>

#include "engine/core/thread_pool.h"
#include "kernels/random.h"

namespace switchyard {
namespace {

// Known-answer vectors of Random123 (kat_vectors, philox4x32_10).
TEST(PhiloxTest, KnownAnswers) {
  struct Case {
    PhiloxBlock ctr;
    uint32_t k0, k1;
    PhiloxBlock expected;
  };
  const Case cases[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}}},
      {{{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}}, 0xffffffff, 0xffffffff,
       {{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}}},
      {{{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}}, 0xa4093822, 0x299f31d0,
       {{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}}},
  };
  for (const Case& c : cases) {
    PhiloxBlock out = Philox4x32(c.ctr, c.k0, c.k1);
    for (int i = 0; i < 4; ++i) EXPECT_EQ(out.v[i], c.expected.v[i]) << "word " << i;
  }
}

TEST(PhiloxTest, ElementsMapToCounterWords) {
  RngKey key{0x0123456789abcdefull, 42};
  PhiloxBlock block = Philox4x32({{5, 0, 42, 0}}, 0x89abcdefu, 0x01234567u);
  for (int w = 0; w < 4; ++w) EXPECT_EQ(RandomBitsAt(key, 5 * 4 + w), block.v[w]);
}

std::vector<float> FillInChunks(void (*fill)(Tensor&, RngKey, int64_t, float, float,
                                             DeviceContext*),
                                RngKey key, int64_t n, const std::vector<int64_t>& cuts,
                                float a, float b) {
  Tensor whole = Tensor::Empty({n}, DType::kF32);
  int64_t begin = 0;
  for (size_t i = 0; i <= cuts.size(); ++i) {
    int64_t end = i < cuts.size() ? cuts[i] : n;
    Tensor chunk = whole.Slice(begin, end);
    fill(chunk, key, begin, a, b, nullptr);
    begin = end;
  }
  return whole.ToVector<float>();
}

TEST(PhiloxTest, FillsDoNotDependOnChunking) {
  RngKey key{1234, StreamId("layers.0.mlp.w1")};
  const int64_t n = 1001;
  for (auto fill : {&kernels::FillUniform, &kernels::FillNormal}) {
    std::vector<float> once = FillInChunks(fill, key, n, {}, 0.0f, 1.0f);
    std::vector<float> chunked = FillInChunks(fill, key, n, {1, 2, 3, 7, 8, 500, 999}, 0.0f, 1.0f);
    ASSERT_EQ(once, chunked);  // bitwise
  }
  // A shard filled at its global offset equals the same slice of the whole tensor.
  Tensor shard = Tensor::Empty({3, 7}, DType::kF32);
  kernels::FillNormal(shard, key, 21 * 4, 0.0f, 0.02f);
  Tensor whole = Tensor::Empty({20, 7}, DType::kF32);
  kernels::FillNormal(whole, key, 0, 0.0f, 0.02f);
  EXPECT_EQ(shard.ToVector<float>(), whole.Slice(12, 15).ToVector<float>());
}

TEST(PhiloxTest, FillUniformIsUniformAtOnAnyThreadCountAndOffset) {
  // FillUniform draws one Philox block per 4 indices; an odd offset and length start and
  // end mid-block. 40001 elements split over the compute threads.
  RngKey key{99, StreamId("router.jitter")};
  for (int threads : {1, 2, 3}) {
    SetComputeThreads(threads);
    for (int64_t first : {int64_t{0}, int64_t{3}, int64_t{4097}}) {
      Tensor t = Tensor::Empty({40001}, DType::kF32);
      kernels::FillUniform(t, key, first, 0.99f, 1.01f);
      const std::vector<float> got = t.ToVector<float>();
      int64_t wrong = 0;
      for (int64_t i = 0; i < 40001; ++i) {
        wrong += got[i] != 0.99f + (1.01f - 0.99f) * UniformAt(key, static_cast<uint64_t>(first + i));
      }
      EXPECT_EQ(wrong, 0) << threads << " threads, first index " << first;
    }
  }
  SetComputeThreads(1);
}

TEST(PhiloxTest, StreamsAndSeedsAreIndependent) {
  const int64_t n = 64;
  auto bits = [&](RngKey key) {
    Tensor t = Tensor::Empty({n}, DType::kI32);
    kernels::FillRandomBits(t, key, 0);
    return t.ToVector<int32_t>();
  };
  auto a = bits({1, StreamId("a")});
  EXPECT_NE(a, bits({1, StreamId("b")}));
  EXPECT_NE(a, bits({2, StreamId("a")}));
  EXPECT_EQ(a, bits({1, StreamId("a")}));
  EXPECT_EQ(std::set<int32_t>(a.begin(), a.end()).size(), a.size());
  static_assert(StreamId("") == 0xcbf29ce484222325ull);  // FNV-1a offset basis
}

TEST(PhiloxTest, DistributionsHaveTheRightMoments) {
  const int64_t n = 200000;
  Tensor u = Tensor::Empty({n}, DType::kF32);
  kernels::FillUniform(u, {7, 1}, 0, -1.0f, 3.0f);
  Tensor g = Tensor::Empty({n}, DType::kF32);
  kernels::FillNormal(g, {7, 2}, 0, 1.0f, 2.0f);
  double su = 0, sg = 0, sg2 = 0;
  float umin = 10, umax = -10;
  for (float x : u.ToVector<float>()) {
    su += x;
    umin = std::min(umin, x);
    umax = std::max(umax, x);
  }
  for (float x : g.ToVector<float>()) {
    ASSERT_TRUE(std::isfinite(x));
    sg += x;
    sg2 += x * x;
  }
  double gmean = sg / n, gvar = sg2 / n - gmean * gmean;
  // Standard errors: uniform mean 1.15/sqrt(n) ~ 0.0026; normal mean 2/sqrt(n) ~ 0.0045.
  EXPECT_NEAR(su / n, 1.0, 0.015);
  EXPECT_GE(umin, -1.0f);
  EXPECT_LT(umax, 3.0f);
  EXPECT_NEAR(gmean, 1.0, 0.025);
  EXPECT_NEAR(std::sqrt(gvar), 2.0, 0.03);
}

TEST(PhiloxTest, Bf16FillIsTheRoundedF32Fill) {
  Tensor f = Tensor::Empty({100}, DType::kF32);
  Tensor h = Tensor::Empty({100}, DType::kBF16);
  kernels::FillNormal(f, {3, 3}, 0, 0.0f, 1.0f);
  kernels::FillNormal(h, {3, 3}, 0, 0.0f, 1.0f);
  auto fv = f.ToVector<float>();
  auto hv = h.ToVector<BFloat16>();
  for (int i = 0; i < 100; ++i) EXPECT_EQ(hv[i].bits, BFloat16(fv[i]).bits);
}

}  // namespace
}  // namespace switchyard
