// kernels/permute.h on the CPU: a hand-computed routing through every op, the edge cases
// (nothing kept, N = 0), the argument checks, and on random routings the sort against
// std::stable_sort and the sums against the dispatcher's original loop over permuted
// rows (bit for bit: the CPU reference must keep its numerics).
#include "kernels/permute.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "engine/core/philox.h"
#include "kernels/random.h"

namespace switchyard::kernels {
namespace {

struct Sorted {
  std::vector<int64_t> counts, token, slot, inverse;
};

Sorted Sort(const std::vector<int32_t>& experts, const std::vector<uint8_t>& kept, int64_t n,
            int64_t k, int64_t e) {
  Tensor token = Tensor::Empty({n * k}, DType::kI64), slot = Tensor::Empty({n * k}, DType::kI64),
         inverse = Tensor::Empty({n * k}, DType::kI64);
  Sorted s;
  s.counts = SortAssignments(Tensor::FromVector(experts, {n, k}), Tensor::FromVector(kept, {n, k}),
                             e, token, slot, inverse);
  s.token = token.ToVector<int64_t>();
  s.slot = slot.ToVector<int64_t>();
  s.inverse = inverse.ToVector<int64_t>();
  return s;
}

// The hand-computed case: N = 3, k = 2, E = 3,
//   slot  s: 0  1  2  3  4  5
//   token t: 0  0  1  1  2  2
//   expert : 2  0  0  1  1  2
//   kept   : 1  1  1  0  1  1
// (expert, token, slot) order: s1 s2 (e0), s4 (e1), s0 s5 (e2); s3 dropped.
const std::vector<int32_t> kExperts = {2, 0, 0, 1, 1, 2};
const std::vector<uint8_t> kKept = {1, 1, 1, 0, 1, 1};

TEST(PermuteTest, SortAssignmentsHandCase) {
  Sorted s = Sort(kExperts, kKept, 3, 2, 3);
  EXPECT_EQ(s.counts, (std::vector<int64_t>{2, 1, 2}));
  EXPECT_EQ(s.slot, (std::vector<int64_t>{1, 2, 4, 0, 5, 3}));
  EXPECT_EQ(s.token, (std::vector<int64_t>{0, 1, 2, 0, 2, 1}));
  EXPECT_EQ(s.inverse, (std::vector<int64_t>{3, 0, 1, -1, 2, 4}));
}

// Without host counts: the same order, and the counts as offsets (the experts' rows).
TEST(PermuteTest, SortAssignmentsToOffsetsHandCase) {
  Tensor token = Tensor::Empty({6}, DType::kI64), slot = Tensor::Empty({6}, DType::kI64),
         inverse = Tensor::Empty({6}, DType::kI64), offsets = Tensor::Empty({4}, DType::kI64);
  SortAssignmentsToOffsets(Tensor::FromVector(kExperts, {3, 2}), Tensor::FromVector(kKept, {3, 2}),
                           3, token, slot, inverse, offsets);
  const Sorted s = Sort(kExperts, kKept, 3, 2, 3);
  EXPECT_EQ(offsets.ToVector<int64_t>(), (std::vector<int64_t>{0, 2, 3, 5}));
  EXPECT_EQ(slot.ToVector<int64_t>(), s.slot);
  EXPECT_EQ(token.ToVector<int64_t>(), s.token);
  EXPECT_EQ(inverse.ToVector<int64_t>(), s.inverse);
  Tensor short_offsets = Tensor::Empty({3}, DType::kI64);
  EXPECT_DEATH(SortAssignmentsToOffsets(Tensor::FromVector(kExperts, {3, 2}),
                                        Tensor::FromVector(kKept, {3, 2}), 3, token, slot,
                                        inverse, short_offsets),
               "offsets needs E \\+ 1 entries");
}

TEST(PermuteTest, GatherRowsHandCase) {
  Tensor h = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor index = Tensor::FromVector<int64_t>({0, 1, 2, 0, 2}, {5});
  Tensor rows = Tensor::Empty({5, 2}, DType::kF32);
  GatherRows(h, index, rows);
  EXPECT_EQ(rows.ToVector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6, 1, 2, 5, 6}));
}

// i32 and u8 rows move bit for bit (a routing group's choices and admission put in token
// order, moe/group_routing.h).
TEST(PermuteTest, GatherRowsOfIntegersAndBytes) {
  Tensor index = Tensor::FromVector<int64_t>({2, 0, 2}, {3});
  Tensor ints = Tensor::FromVector<int32_t>({1, -2, 3, -4, 2147483647, -2147483647 - 1}, {3, 2});
  Tensor ints_out = Tensor::Empty({3, 2}, DType::kI32);
  GatherRows(ints, index, ints_out);
  EXPECT_EQ(ints_out.ToVector<int32_t>(),
            (std::vector<int32_t>{2147483647, -2147483647 - 1, 1, -2, 2147483647, -2147483647 - 1}));
  Tensor bytes = Tensor::FromVector<uint8_t>({0, 1, 255, 7, 8, 9}, {3, 2});
  Tensor bytes_out = Tensor::Empty({3, 2}, DType::kU8);
  GatherRows(bytes, index, bytes_out);
  EXPECT_EQ(bytes_out.ToVector<uint8_t>(), (std::vector<uint8_t>{8, 9, 0, 1, 8, 9}));
  Tensor wrong = Tensor::Empty({3, 2}, DType::kF32);
  EXPECT_DEATH(GatherRows(ints, index, wrong), "GatherRows");
}

TEST(PermuteTest, ScatterAddRowsHandCase) {
  Tensor drows = Tensor::FromVector<float>({1, 10, 2, 20, 3, 30, 4, 40, 5, 50}, {5, 2});
  Tensor inverse = Tensor::FromVector<int64_t>({3, 0, 1, -1, 2, 4}, {3, 2});
  Tensor dh = Tensor::FromVector<float>({100, 100, 200, 200, 300, 300}, {3, 2});
  ScatterAddRows(drows, inverse, dh, Write::kAdd);
  EXPECT_EQ(dh.ToVector<float>(), (std::vector<float>{105, 150, 202, 220, 308, 380}));
  // kSet: what was there is not read (NaN stays out); each token's sum starts at +0, so a
  // -0 row gives +0, as adding it to a zeroed dh did.
  Tensor rows0 = Tensor::FromVector<float>({1, 10, 2, 20, 3, 30, 4, 40, -0.0f, -0.0f}, {5, 2});
  Tensor inverse0 = Tensor::FromVector<int64_t>({3, 0, 1, -1, 4, -1}, {3, 2});
  Tensor set = Tensor::FromVector<float>({NAN, NAN, NAN, NAN, NAN, NAN}, {3, 2});
  ScatterAddRows(rows0, inverse0, set, Write::kSet);
  EXPECT_EQ(set.ToVector<float>(), (std::vector<float>{5, 50, 2, 20, 0, 0}));
  EXPECT_FALSE(std::signbit(set.ToVector<float>()[4]));
}

TEST(PermuteTest, CombineHandCase) {
  Tensor out = Tensor::FromVector<float>({1, 10, 2, 20, 3, 30, 4, 40, 5, 50}, {5, 2});
  Tensor gates = Tensor::FromVector<float>({0.5f, 0.25f, 2, 3, 1, -1}, {3, 2});
  Tensor inverse = Tensor::FromVector<int64_t>({3, 0, 1, -1, 2, 4}, {3, 2});
  Tensor y = Tensor::Empty({3, 2}, DType::kF32);
  Combine(out, gates, inverse, Tensor(), y);
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{2.25f, 22.5f, 4, 40, -2, -20}));
  Tensor extra = Tensor::FromVector<float>({1, 1, 1, 1, 1, 1}, {3, 2});
  Combine(out, gates, inverse, extra, y);
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{3.25f, 23.5f, 5, 41, -1, -19}));
}

TEST(PermuteTest, CombineBackwardHandCase) {
  Tensor dy = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor out = Tensor::FromVector<float>({1, 10, 2, 20, 3, 30, 4, 40, 5, 50}, {5, 2});
  Tensor gates = Tensor::FromVector<float>({0.5f, 0.25f, 2, 3, 1, -1}, {3, 2});
  Tensor slot = Tensor::FromVector<int64_t>({1, 2, 4, 0, 5}, {5});
  Tensor dout = Tensor::Empty({5, 2}, DType::kF32);
  Tensor dgates = Tensor::FromVector<float>({9, 9, 9, 9, 9, 9}, {3, 2});  // overwritten
  CombineBackward(dy, out, gates, slot, dout, dgates);
  EXPECT_EQ(dout.ToVector<float>(),
            (std::vector<float>{0.25f, 0.5f, 6, 8, 5, 6, 0.5f, 1, -5, -6}));
  EXPECT_EQ(dgates.ToVector<float>(), (std::vector<float>{84, 21, 86, 0, 195, 325}));
}

TEST(PermuteTest, EntropySum) {
  Tensor probs = Tensor::FromVector<float>({0.5f, 0.5f, 0.0f, 1.0f}, {2, 2});
  EXPECT_NEAR(EntropySum(probs), std::log(2.0), 1e-7);
  EXPECT_EQ(EntropySum(Tensor::Empty({0, 4}, DType::kF32)), 0.0);
}

TEST(PermuteTest, NothingKept) {
  Sorted s = Sort({0, 1, 1, 0}, {0, 0, 0, 0}, 2, 2, 2);
  EXPECT_EQ(s.counts, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(s.slot, (std::vector<int64_t>{0, 1, 2, 3}));
  EXPECT_EQ(s.token, (std::vector<int64_t>{0, 0, 1, 1}));
  EXPECT_EQ(s.inverse, (std::vector<int64_t>{-1, -1, -1, -1}));
  Tensor inverse = Tensor::FromVector(s.inverse, {2, 2});
  Tensor out = Tensor::Empty({0, 3}, DType::kF32);
  Tensor gates = Tensor::FromVector<float>({1, 1, 1, 1}, {2, 2});
  Tensor y = Tensor::FromVector<float>({7, 7, 7, 7, 7, 7}, {2, 3});
  Combine(out, gates, inverse, Tensor(), y);
  EXPECT_EQ(y.ToVector<float>(), std::vector<float>(6, 0.0f));
  Tensor dh = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3});
  ScatterAddRows(out, inverse, dh, Write::kAdd);
  EXPECT_EQ(dh.ToVector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  ScatterAddRows(out, inverse, dh, Write::kSet);  // nothing kept: zeros
  EXPECT_EQ(dh.ToVector<float>(), std::vector<float>(6, 0.0f));
}

TEST(PermuteTest, NoTokens) {
  Sorted s = Sort({}, {}, 0, 2, 4);
  EXPECT_EQ(s.counts, std::vector<int64_t>(4, 0));
  EXPECT_TRUE(s.slot.empty());
}

TEST(PermuteTest, RejectsBadArguments) {
  EXPECT_DEATH(Sort({0, 5}, {1, 1}, 1, 2, 4), "expert index 5");
  // A dropped slot may hold anything.
  EXPECT_EQ(Sort({0, 5}, {1, 0}, 1, 2, 4).counts, (std::vector<int64_t>{1, 0, 0, 0}));
  Tensor h = Tensor::Empty({3, 2}, DType::kF32);
  Tensor rows = Tensor::Empty({2, 3}, DType::kF32);
  EXPECT_DEATH(GatherRows(h, Tensor::FromVector<int64_t>({0, 1}, {2}), rows), "GatherRows");
  Tensor rows2 = Tensor::Empty({1, 2}, DType::kF32);
  EXPECT_DEATH(GatherRows(h, Tensor::FromVector<int64_t>({3}, {1}), rows2), "index 3");
  Tensor y = Tensor::Empty({1, 2}, DType::kF32);
  EXPECT_DEATH(Combine(rows2, Tensor::FromVector<float>({1}, {1, 1}),
                       Tensor::FromVector<int32_t>({0}, {1, 1}), Tensor(), y),
               "inverse must be 2-d i64");
}

// The dispatcher's original loops over permuted rows (before the per-token kernels).
void OldScatterAdd(const std::vector<float>& drows, const std::vector<int64_t>& token, int64_t d,
                   std::vector<float>& dh) {
  for (size_t a = 0; a < token.size(); ++a)
    for (int64_t j = 0; j < d; ++j) dh[token[a] * d + j] += drows[a * d + j];
}
std::vector<float> OldCombine(const std::vector<float>& out, const std::vector<float>& gates,
                              const std::vector<int64_t>& token, const std::vector<int64_t>& slot,
                              int64_t n, int64_t d) {
  std::vector<float> y(n * d, 0.0f);
  for (size_t a = 0; a < token.size(); ++a) {
    const float w = gates[slot[a]];
    for (int64_t j = 0; j < d; ++j) y[token[a] * d + j] += w * out[a * d + j];
  }
  return y;
}

TEST(PermuteTest, RandomRoutingsMatchStableSortAndTheOriginalLoops) {
  uint64_t stream = 1;
  for (int64_t k : {1, 2, 3, 4}) {
    for (int64_t e : {4, 8, 64}) {
      if (k > e) continue;
      const int64_t n = 37, d = 13;
      Tensor bits = Tensor::Empty({n * k * 2}, DType::kI32);
      FillRandomBits(bits, RngKey{5, stream++}, 0);
      std::vector<int32_t> r = bits.ToVector<int32_t>();
      std::vector<int32_t> experts(n * k);
      std::vector<uint8_t> kept(n * k);
      for (int64_t i = 0; i < n * k; ++i) {
        experts[i] = static_cast<int32_t>(static_cast<uint32_t>(r[i]) % e);
        kept[i] = static_cast<uint32_t>(r[n * k + i]) % 4 != 0;
      }
      Sorted s = Sort(experts, kept, n, k, e);
      // Reference: stable sort of the kept slots by expert, then the dropped slots.
      std::vector<int64_t> want(n * k);
      std::iota(want.begin(), want.end(), 0);
      std::stable_sort(want.begin(), want.end(), [&](int64_t a, int64_t b) {
        const int64_t ka = kept[a] ? experts[a] : e, kb = kept[b] ? experts[b] : e;
        return ka < kb;
      });
      ASSERT_EQ(s.slot, want) << "k=" << k << " E=" << e;
      int64_t a_count = 0;
      for (int64_t c : s.counts) a_count += c;
      for (int64_t a = 0; a < n * k; ++a) {
        EXPECT_EQ(s.token[a], s.slot[a] / k);
        EXPECT_EQ(s.inverse[s.slot[a]], a < a_count ? a : -1);
      }

      std::vector<int64_t> token(s.token.begin(), s.token.begin() + a_count);
      std::vector<int64_t> slot(s.slot.begin(), s.slot.begin() + a_count);
      Tensor rows = Tensor::Empty({a_count, d}, DType::kF32);
      FillNormal(rows, RngKey{6, stream++}, 0, 0.0f, 1.0f);
      Tensor gates = Tensor::Empty({n, k}, DType::kF32);
      FillUniform(gates, RngKey{7, stream++}, 0, 0.0f, 1.0f);
      Tensor dh = Tensor::Empty({n, d}, DType::kF32);
      FillNormal(dh, RngKey{8, stream++}, 0, 0.0f, 1.0f);
      Tensor inverse = Tensor::FromVector(s.inverse, {n, k});

      std::vector<float> want_dh = dh.ToVector<float>();
      OldScatterAdd(rows.ToVector<float>(), token, d, want_dh);
      ScatterAddRows(rows, inverse, dh, Write::kAdd);
      EXPECT_EQ(dh.ToVector<float>(), want_dh) << "k=" << k << " E=" << e;

      Tensor y = Tensor::Empty({n, d}, DType::kF32);
      Combine(rows, gates, inverse, Tensor(), y);
      EXPECT_EQ(y.ToVector<float>(),
                OldCombine(rows.ToVector<float>(), gates.ToVector<float>(), token, slot, n, d))
          << "k=" << k << " E=" << e;
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
