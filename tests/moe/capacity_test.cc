// Capacity and admission (moe/capacity.h): the capacity formula, hand-computed kept masks
// for both drop policies, the edge cases, and admission of a group split into pieces with
// priority offsets equal to admitting it whole.
#include "moe/capacity.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/core/philox.h"

namespace switchyard::moe {
namespace {

Tensor Indices(const std::vector<int32_t>& v, int64_t T, int64_t k) {
  return Tensor::FromVector(v, {T, k});
}
Tensor Gates(const std::vector<float>& v, int64_t T, int64_t k) {
  return Tensor::FromVector(v, {T, k});
}
Tensor Mask(const std::vector<uint8_t>& v, int64_t T, int64_t k) {
  return Tensor::FromVector(v, {T, k});
}
std::vector<int> Kept(const Admission& a) {
  std::vector<int> out;
  for (uint8_t b : a.kept.ToVector<uint8_t>()) out.push_back(b);
  return out;
}

TEST(ExpertCapacityTest, Formula) {
  struct Case {
    double cf;
    int64_t T, k, E, expected;
  };
  const Case cases[] = {
      {1.0, 6, 2, 3, 4},          // exact 4
      {1.25, 8, 1, 8, 2},         // 1.25 -> 2
      {1.25, 64, 2, 8, 20},       // exact 20
      {1.25, 8, 1, 10, 1},        // exact 1.0
      {2.0, 7, 1, 4, 4},          // 3.5 -> 4
      {1.0, 1, 1, 8, 1},          // 0.125 -> 1
      {1.5, 1024, 2, 64, 48},     // exact 48
      {1e-3, 16, 1, 4, 1},        // any positive cf admits at least one
      {1.0, 0, 2, 4, 0},          // empty group
      {1.1f, 10, 1, 11, 1},       // float 1.1 is 1.10000002: still exactly 1
      {0.1f, 30, 1, 3, 1},        // float 0.1 is 0.100000001: still exactly 1
      {1.2f, 10, 1, 12, 1},       // float 1.2 is 1.20000005: still exactly 1
      {1.2f, 10, 1, 11, 2},       // 1.0909 -> 2
      {1.25f, 4096, 2, 128, 80},  // exact 80
  };
  for (const Case& c : cases) {
    EXPECT_EQ(ExpertCapacity(c.cf, c.T, c.k, c.E), c.expected)
        << "cf=" << c.cf << " T=" << c.T << " k=" << c.k << " E=" << c.E;
  }
  EXPECT_EQ(ExpertCapacity(0.0, 8, 1, 4), kDropless);
  EXPECT_EQ(ExpertCapacity(-1.0, 8, 1, 4), kDropless);
}

// T=6, E=3, k=2, C = ceil(1.0 * 6 * 2 / 3) = 4; expert 0 is everyone's favourite.
struct Skewed {
  Tensor indices = Indices({0, 1,  //
                            0, 2,  //
                            0, 1,  //
                            0, 2,  //
                            0, 1,  //
                            1, 0},
                           6, 2);
  Tensor gates = Gates({0.6f, 0.3f,    //
                        0.5f, 0.4f,    //
                        0.7f, 0.2f,    //
                        0.9f, 0.05f,   //
                        0.95f, 0.03f,  //
                        0.5f, 0.45f},
                       6, 2);
  int64_t capacity = ExpertCapacity(1.0, 6, 2, 3);
};

TEST(AdmissionTest, PositionPolicyByHand) {
  Skewed s;
  ASSERT_EQ(s.capacity, 4);
  Admission a = AdmitToCapacity(s.indices, s.gates, Tensor(), 3, s.capacity, DropPolicy::kPosition);
  // First choices: expert 0 takes t0..t3, t4 is its 5th -> dropped; t5 -> expert 1.
  // Second choices: expert 1 takes t0, t2, t4 (ranks 1..3); expert 2 takes t1, t3;
  // t5's second choice is expert 0's 6th -> dropped.
  EXPECT_EQ(Kept(a), (std::vector<int>{1, 1, 1, 1, 1, 1, 1, 1, 0, 1, 1, 0}));
  EXPECT_EQ(a.position.ToVector<int64_t>(),
            (std::vector<int64_t>{0, 1, 1, 0, 2, 2, 3, 1, -1, 3, 0, -1}));
  EXPECT_EQ(a.counts_before, (std::vector<int64_t>{6, 4, 2}));
  EXPECT_EQ(a.counts_after, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(a.dropped, 2);
  EXPECT_EQ(a.removed, 0);
}

TEST(AdmissionTest, ProbabilityPolicyByHand) {
  Skewed s;
  Admission a =
      AdmitToCapacity(s.indices, s.gates, Tensor(), 3, s.capacity, DropPolicy::kProbability);
  // Expert 0 by gate: t4 .95, t3 .9, t2 .7, t0 .6 | t1 .5, t5(slot 1) .45 dropped.
  // Expert 1: t5 .5, t0 .3, t2 .2, t4 .03 (all four fit). Expert 2: t1 .4, t3 .05.
  EXPECT_EQ(Kept(a), (std::vector<int>{1, 1, 0, 1, 1, 1, 1, 1, 1, 1, 1, 0}));
  EXPECT_EQ(a.position.ToVector<int64_t>(),
            (std::vector<int64_t>{3, 1, -1, 0, 2, 2, 1, 1, 0, 3, 0, -1}));
  EXPECT_EQ(a.counts_before, (std::vector<int64_t>{6, 4, 2}));
  EXPECT_EQ(a.counts_after, (std::vector<int64_t>{4, 4, 2}));
  EXPECT_EQ(a.dropped, 2);
}

TEST(AdmissionTest, ProbabilityTiesByTokenThenSlot) {
  // Equal gates; expert 0 is t0's second choice and t1's first: token order wins (t0).
  Tensor idx = Indices({1, 0, 0, 1}, 2, 2);
  Tensor g = Gates({0.5f, 0.5f, 0.5f, 0.5f}, 2, 2);
  EXPECT_EQ(Kept(AdmitToCapacity(idx, g, Tensor(), 2, 1, DropPolicy::kProbability)),
            (std::vector<int>{1, 1, 0, 0}));
  // Position: first choices first.
  EXPECT_EQ(Kept(AdmitToCapacity(idx, g, Tensor(), 2, 1, DropPolicy::kPosition)),
            (std::vector<int>{1, 0, 1, 0}));
  // Equal gates on one expert: token order.
  Tensor one = Indices({0, 0, 0}, 3, 1);
  Tensor flat = Gates({0.5f, 0.5f, 0.5f}, 3, 1);
  EXPECT_EQ(Kept(AdmitToCapacity(one, flat, Tensor(), 1, 2, DropPolicy::kProbability)),
            (std::vector<int>{1, 1, 0}));
}

TEST(AdmissionTest, ExpertWithNoTokensAndEveryTokenToOneExpert) {
  // E = 4, every token to expert 0: experts 1..3 receive nothing.
  Tensor idx = Indices({0, 0, 0, 0, 0}, 5, 1);
  Tensor g = Gates({0.1f, 0.5f, 0.3f, 0.9f, 0.2f}, 5, 1);
  const int64_t C = ExpertCapacity(2.0, 5, 1, 4);  // ceil(2.5) = 3
  ASSERT_EQ(C, 3);
  Admission pos = AdmitToCapacity(idx, g, Tensor(), 4, C, DropPolicy::kPosition);
  EXPECT_EQ(Kept(pos), (std::vector<int>{1, 1, 1, 0, 0}));
  EXPECT_EQ(pos.counts_before, (std::vector<int64_t>{5, 0, 0, 0}));
  EXPECT_EQ(pos.counts_after, (std::vector<int64_t>{3, 0, 0, 0}));
  EXPECT_EQ(pos.dropped, 2);
  Admission prob = AdmitToCapacity(idx, g, Tensor(), 4, C, DropPolicy::kProbability);
  EXPECT_EQ(Kept(prob), (std::vector<int>{0, 1, 1, 1, 0}));
}

TEST(AdmissionTest, CapacityLargerThanGroupAndDropless) {
  Skewed s;
  for (DropPolicy policy : {DropPolicy::kPosition, DropPolicy::kProbability}) {
    for (int64_t C : {int64_t{100}, int64_t{12}, kDropless}) {
      Admission a = AdmitToCapacity(s.indices, s.gates, Tensor(), 3, C, policy);
      EXPECT_EQ(Kept(a), std::vector<int>(12, 1)) << DropPolicyName(policy) << " C=" << C;
      EXPECT_EQ(a.dropped, 0);
      EXPECT_EQ(a.counts_after, a.counts_before);
    }
  }
  // cf <= 0 through the formula.
  Admission a = AdmitToCapacity(s.indices, s.gates, Tensor(), 3, ExpertCapacity(0.0, 6, 2, 3),
                                DropPolicy::kPosition);
  EXPECT_EQ(a.dropped, 0);
}

TEST(AdmissionTest, SingleExpert) {
  Tensor idx = Indices({0, 0, 0, 0}, 4, 1);
  Tensor g = Gates({1, 1, 1, 1}, 4, 1);
  const int64_t C = ExpertCapacity(0.5, 4, 1, 1);
  ASSERT_EQ(C, 2);
  EXPECT_EQ(Kept(AdmitToCapacity(idx, g, Tensor(), 1, C, DropPolicy::kPosition)),
            (std::vector<int>{1, 1, 0, 0}));
  EXPECT_EQ(Kept(AdmitToCapacity(idx, g, Tensor(), 1, C, DropPolicy::kProbability)),
            (std::vector<int>{1, 1, 0, 0}));
}

TEST(AdmissionTest, TopKEqualsE) {
  // E = k = 2: every token goes to both experts.
  Tensor idx = Indices({0, 1, 1, 0, 0, 1}, 3, 2);
  Tensor g = Gates({0.6f, 0.4f, 0.7f, 0.3f, 0.55f, 0.45f}, 3, 2);
  EXPECT_EQ(ExpertCapacity(1.0, 3, 2, 2), 3);
  EXPECT_EQ(Kept(AdmitToCapacity(idx, g, Tensor(), 2, 3, DropPolicy::kPosition)),
            std::vector<int>(6, 1));
  const int64_t C = ExpertCapacity(0.5, 3, 2, 2);  // ceil(1.5) = 2
  ASSERT_EQ(C, 2);
  // Expert 0: t0(1st), t2(1st), t1(2nd, dropped). Expert 1: t1(1st), t0(2nd), t2(2nd, dropped).
  EXPECT_EQ(Kept(AdmitToCapacity(idx, g, Tensor(), 2, C, DropPolicy::kPosition)),
            (std::vector<int>{1, 1, 1, 0, 1, 0}));
  // Expert 0 by gate: t0 .6, t2 .55 | t1 .3. Expert 1: t1 .7, t2 .45 | t0 .4.
  EXPECT_EQ(Kept(AdmitToCapacity(idx, g, Tensor(), 2, C, DropPolicy::kProbability)),
            (std::vector<int>{1, 0, 1, 0, 1, 1}));
}

TEST(AdmissionTest, RemovedAssignmentsTakeNoSlot) {
  // t0's second choice (expert 1) was removed by the random policy; C = 1.
  Tensor idx = Indices({0, 1, 0, 1}, 2, 2);
  Tensor g = Gates({0.6f, 0.45f, 0.55f, 0.4f}, 2, 2);
  Tensor keep = Mask({1, 0, 1, 1}, 2, 2);
  for (DropPolicy policy : {DropPolicy::kPosition, DropPolicy::kProbability}) {
    Admission a = AdmitToCapacity(idx, g, keep, 2, 1, policy);
    // Expert 0: t0 kept, t1 dropped. Expert 1: t1's second choice gets the free slot.
    EXPECT_EQ(Kept(a), (std::vector<int>{1, 0, 0, 1})) << DropPolicyName(policy);
    EXPECT_EQ(a.counts_before, (std::vector<int64_t>{2, 1}));
    EXPECT_EQ(a.counts_after, (std::vector<int64_t>{1, 1}));
    EXPECT_EQ(a.dropped, 1);
    EXPECT_EQ(a.removed, 1);
    // Without the removal, t0's second choice takes expert 1's slot (first in both orders).
    EXPECT_EQ(Kept(AdmitToCapacity(idx, g, Tensor(), 2, 1, policy)),
              (std::vector<int>{1, 1, 0, 0}));
  }
}

// A random top-2 routing over E experts with some second choices removed.
struct RandomRouting {
  Tensor indices, gates, keep;
};
RandomRouting MakeRandomRouting(int64_t T, int64_t E, uint64_t seed) {
  std::vector<int32_t> idx(T * 2);
  std::vector<float> g(T * 2);
  std::vector<uint8_t> keep(T * 2, 1);
  RngKey key{seed, StreamId("capacity_test")};
  for (int64_t t = 0; t < T; ++t) {
    // Skewed towards low experts.
    const float u = UniformAt(key, 4 * t);
    const int32_t e0 = static_cast<int32_t>(u * u * E);
    const int32_t e1 = (e0 + 1 + static_cast<int32_t>(UniformAt(key, 4 * t + 1) * (E - 1))) % E;
    idx[2 * t] = e0;
    idx[2 * t + 1] = e1;
    g[2 * t] = 0.5f + 0.5f * UniformAt(key, 4 * t + 2);
    g[2 * t + 1] = 1.0f - g[2 * t];
    keep[2 * t + 1] = UniformAt(key, 4 * t + 3) < 0.8f;
  }
  return {Tensor::FromVector(idx, {T, 2}), Tensor::FromVector(g, {T, 2}),
          Tensor::FromVector(keep, {T, 2})};
}

// In a training step the admitted counts go to the step's readback (no wait): the same
// kept and position as AdmitToCapacity's, and its counts_after in the slots, with the
// out-of-range count 0 after them; both policies, removed assignments, capacity and
// dropless.
TEST(AdmissionTest, IntoTheStepReadbackEqualsTheHostAdmission) {
  const int64_t T = 40, E = 5;
  const RandomRouting r = MakeRandomRouting(T, E, 11);
  for (DropPolicy policy : {DropPolicy::kPosition, DropPolicy::kProbability}) {
    for (int64_t capacity : {int64_t{3}, int64_t{9}, kDropless}) {
      SCOPED_TRACE(std::string(DropPolicyName(policy)) + " C=" + std::to_string(capacity));
      const Admission want = AdmitToCapacity(r.indices, r.gates, r.keep, E, capacity, policy);
      StepReadback readback;
      readback.Reserve(2, Device::Cpu(), nullptr);  // slots before the group's, as in a step
      const Admission got =
          AdmitToCapacityInto(r.indices, r.gates, r.keep, E, capacity, policy, readback, nullptr);
      EXPECT_EQ(got.kept_slot, 2);
      EXPECT_TRUE(got.counts_after.empty());
      EXPECT_EQ(Kept(got), Kept(want));
      EXPECT_EQ(got.position.ToVector<int64_t>(), want.position.ToVector<int64_t>());
      const std::vector<double> slots = readback.ReadBack(nullptr);
      ASSERT_EQ(slots.size(), static_cast<size_t>(2 + E + 1));
      for (int64_t e = 0; e < E; ++e) {
        EXPECT_EQ(slots[2 + e], static_cast<double>(want.counts_after[e])) << "expert " << e;
      }
      EXPECT_EQ(slots[2 + E], 0.0);
      if (capacity == 3) {
        EXPECT_GT(want.dropped, 0) << "the case drops";
      }
    }
  }
}

TEST(AdmissionTest, SplitGroupWithOffsetsEqualsWholeGroup) {
  const int64_t T = 37, E = 5, k = 2;
  RandomRouting r = MakeRandomRouting(T, E, 7);
  const int64_t C = ExpertCapacity(0.6, T, k, E);  // ceil(8.88) = 9: drops happen
  Admission whole = AdmitToCapacity(r.indices, r.gates, r.keep, E, C, DropPolicy::kPosition);
  ASSERT_GT(whole.dropped, 0);

  const std::vector<int64_t> cuts = {0, 10, 10, 11, 25, 37};  // includes an empty piece
  std::vector<std::vector<int64_t>> piece_counts;
  std::vector<int64_t> total(k * E, 0);
  for (size_t p = 0; p + 1 < cuts.size(); ++p) {
    piece_counts.push_back(SlotExpertCounts(r.indices.Slice(cuts[p], cuts[p + 1]),
                                            r.keep.Slice(cuts[p], cuts[p + 1]), E));
    for (int64_t i = 0; i < k * E; ++i) total[i] += piece_counts.back()[i];
  }
  std::vector<int> kept, kept_without_offsets;
  std::vector<int64_t> position;
  std::vector<int64_t> prefix(k * E, 0), after(E, 0);
  int64_t dropped = 0;
  for (size_t p = 0; p + 1 < cuts.size(); ++p) {
    Tensor idx = r.indices.Slice(cuts[p], cuts[p + 1]);
    Tensor keep = r.keep.Slice(cuts[p], cuts[p + 1]);
    Admission a = AdmitToCapacity(idx, Tensor(), keep, E, C, DropPolicy::kPosition,
                                  PositionOffsets(prefix, total, k, E));
    for (int v : Kept(a)) kept.push_back(v);
    for (int64_t v : a.position.ToVector<int64_t>()) position.push_back(v);
    for (int64_t e = 0; e < E; ++e) after[e] += a.counts_after[e];
    dropped += a.dropped;
    for (int64_t i = 0; i < k * E; ++i) prefix[i] += piece_counts[p][i];
    for (int v : Kept(AdmitToCapacity(idx, Tensor(), keep, E, C, DropPolicy::kPosition))) {
      kept_without_offsets.push_back(v);
    }
  }
  EXPECT_EQ(kept, Kept(whole));
  EXPECT_EQ(position, whole.position.ToVector<int64_t>());
  EXPECT_EQ(after, whole.counts_after);
  EXPECT_EQ(dropped, whole.dropped);
  // The offsets matter: pieces admitted alone keep more.
  EXPECT_NE(kept_without_offsets, kept);
}

}  // namespace
}  // namespace switchyard::moe
