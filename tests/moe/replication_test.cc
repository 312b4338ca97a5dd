// The replica plan of hot-expert replication (moe/replication.h): hand-computed
// water-filling cases, the virtual dispatch layout, the row split's quotas, the planner's
// window, and the relief the plan promises under a skewed load.
#include "moe/replication.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace switchyard::moe {
namespace {

constexpr int32_t Q = kReplicaQuota;

double MaxOverMean(const std::vector<double>& loads) {
  const double sum = std::accumulate(loads.begin(), loads.end(), 0.0);
  return *std::max_element(loads.begin(), loads.end()) / (sum / loads.size());
}

TEST(ReplicaPlanTest, NoneWithoutHotExpertsOrWithOneRank) {
  const std::vector<int64_t> counts = {100, 1, 1, 1};
  EXPECT_TRUE(ReplicaPlan::Balance(counts, 4, 0).empty());
  EXPECT_TRUE(ReplicaPlan::Balance(counts, 1, 3).empty());
  // The hottest expert already sits on the least loaded rank once it is taken off: no
  // replica (its rank takes everything back).
  const std::vector<int64_t> even = {10, 10, 10, 10};
  const ReplicaPlan p = ReplicaPlan::Balance(even, 4, 1);
  EXPECT_TRUE(p.empty()) << p.ToString();
  EXPECT_EQ(p.slots(), 0);
}

TEST(ReplicaPlanTest, OneHotExpertSpreadsOverEveryRank) {
  // E = 4, ep = 4: taken off rank 0, expert 0's 100 rows fill four empty ranks to 25 each.
  const std::vector<int64_t> counts = {100, 0, 0, 0};
  const ReplicaPlan p = ReplicaPlan::Balance(counts, 4, 1);
  ASSERT_EQ(p.replicated().size(), 1u);
  const ReplicatedExpert& r = p.replicated()[0];
  EXPECT_EQ(r.expert, 0);
  ASSERT_EQ(r.copies.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(r.copies[i].rank, i);
    EXPECT_EQ(r.copies[i].slot, i == 0 ? -1 : 0);
    EXPECT_EQ(r.copies[i].upto, Q / 4 * (i + 1));
  }
  EXPECT_EQ(p.slots(), 1);
  EXPECT_EQ(p.PlannedLoads(counts), (std::vector<double>{25, 25, 25, 25}));
  EXPECT_EQ(p.ExpertInSlot(2, 0), 0);
  EXPECT_EQ(p.ExpertInSlot(0, 0), -1);
}

TEST(ReplicaPlanTest, WaterFillingHandCase) {
  // Loads without expert 0: {0, 20, 10, 10}; 60 rows fill them to the level 25: shares
  // 25 (owner), 5, 15, 15. Quotas round(Q * cumulative / 60).
  const std::vector<int64_t> counts = {60, 20, 10, 10};
  const ReplicaPlan p = ReplicaPlan::Balance(counts, 4, 1);
  ASSERT_EQ(p.replicated().size(), 1u);
  const std::vector<ExpertCopy>& c = p.replicated()[0].copies;
  ASSERT_EQ(c.size(), 4u);
  EXPECT_EQ(c[0].upto, std::llround(Q * 25.0 / 60));
  EXPECT_EQ(c[1].upto, std::llround(Q * 30.0 / 60));
  EXPECT_EQ(c[2].upto, std::llround(Q * 45.0 / 60));
  EXPECT_EQ(c[3].upto, Q);
  for (double load : p.PlannedLoads(counts)) EXPECT_NEAR(load, 25.0, 60.0 / Q);
}

TEST(ReplicaPlanTest, TiesByExpertThenRank) {
  // Two equally hot experts on ranks 0 and 1 of 4 (E_l = 2): expert 0 goes first (the
  // smaller index) and fills ranks 2 and 3 before expert 2 is placed.
  const std::vector<int64_t> counts = {40, 0, 40, 0, 0, 0, 0, 0};
  const ReplicaPlan p = ReplicaPlan::Balance(counts, 4, 2);
  ASSERT_EQ(p.replicated().size(), 2u) << p.ToString();
  EXPECT_EQ(p.replicated()[0].expert, 0);
  EXPECT_EQ(p.replicated()[1].expert, 2);
  for (double load : p.PlannedLoads(counts)) EXPECT_NEAR(load, 20.0, 1e-3);
  // Deterministic: the same counts give the same plan.
  EXPECT_TRUE(p == ReplicaPlan::Balance(counts, 4, 2));
}

TEST(ReplicaPlanTest, VirtualLayout) {
  // E = 8 over ep = 4 (E_l = 2), expert 0 replicated on ranks 1..3 (one slot each): rank r's
  // local slots are [3r, 3r + 3), its own two experts first, then the replica slot.
  const std::vector<int64_t> counts = {400, 1, 1, 1, 1, 1, 1, 1};
  const ReplicaPlan p = ReplicaPlan::Balance(counts, 4, 1);
  ASSERT_EQ(p.slots(), 1);
  EXPECT_EQ(p.local_slots(), 3);
  EXPECT_EQ(p.virtual_experts(), 12);
  EXPECT_EQ(p.Destination(3, 0), 4);   // rank 1, local expert 1
  EXPECT_EQ(p.Destination(7, 0), 10);  // rank 3, local expert 1
  const std::vector<ExpertCopy>& c = p.replicated()[0].copies;
  EXPECT_EQ(p.Destination(0, 0), 0);                 // the owner's interval first
  EXPECT_EQ(p.Destination(0, c[1].upto - 1), 3 + 2);  // rank 1's replica slot
  EXPECT_EQ(p.Destination(0, Q - 1), 9 + 2);          // rank 3's replica slot
}

TEST(ReplicaPlanTest, KeysSplitRowsByTheQuotas) {
  // 200000 assignments (tokens x top-2 slots): each copy's fraction is its quota within
  // 1% (about 4.5 standard deviations of a binomial at these sizes; the hash is fixed, so
  // the test is deterministic).
  const std::vector<int64_t> counts = {60, 20, 10, 10};
  const ReplicaPlan p = ReplicaPlan::Balance(counts, 4, 1);
  std::vector<int64_t> hits(p.virtual_experts(), 0);
  const int64_t tokens = 100000, k = 2;
  for (int64_t t = 0; t < tokens; ++t)
    for (int64_t j = 0; j < k; ++j) ++hits[p.Destination(0, ReplicaKey(t, j, k))];
  int32_t previous = 0;
  for (const ExpertCopy& c : p.replicated()[0].copies) {
    const int64_t v = c.rank * p.local_slots() + (c.slot < 0 ? 0 : 1 + c.slot);
    const double want = static_cast<double>(c.upto - previous) / Q;
    EXPECT_NEAR(static_cast<double>(hits[v]) / (tokens * k), want, 0.01) << "rank " << c.rank;
    previous = c.upto;
  }
}

TEST(ReplicaPlanTest, DestinationsOfATensor) {
  const std::vector<int64_t> counts = {400, 1, 1, 1, 1, 1, 1, 1};
  const ReplicaPlan p = ReplicaPlan::Balance(counts, 4, 1);
  const std::vector<int32_t> experts = {0, 3, 7, 0, 0, 5};
  const std::vector<int64_t> tokens = {10, 11, 12};
  const Tensor out = ReplicaDestinations(p, Tensor::FromVector(experts, {3, 2}), tokens);
  const std::vector<int32_t> got = out.ToVector<int32_t>();
  for (int64_t t = 0; t < 3; ++t)
    for (int64_t j = 0; j < 2; ++j)
      EXPECT_EQ(got[t * 2 + j], p.Destination(experts[t * 2 + j], ReplicaKey(tokens[t], j, 2)));
}

TEST(ReplicaPlanTest, RelievesAZipfSkew) {
  // 64 experts over 8 ranks with Zipf(1) loads: the busiest rank carries several times the mean
  // unreplicated (about 4.6x); 8 hot experts bring the plan's loads within 1.15x of the mean.
  std::vector<int64_t> counts(64);
  for (int64_t e = 0; e < 64; ++e) counts[e] = std::llround(100000.0 / (e + 1));
  const ReplicaPlan none = ReplicaPlan::Balance(counts, 8, 0);
  const ReplicaPlan p = ReplicaPlan::Balance(counts, 8, 8);
  const double before = MaxOverMean(none.PlannedLoads(counts));
  const double after = MaxOverMean(p.PlannedLoads(counts));
  std::printf("  Zipf(1), 64 experts, ep 8: max/mean %.3f -> %.3f (%s)\n", before, after,
              p.ToString().c_str());
  EXPECT_GT(before, 2.0);
  EXPECT_LE(after, 1.15);
}

TEST(ReplicaPlannerTest, PlansEveryNStepsFromTheWindowSums) {
  ReplicaPlanner planner(/*hot=*/1, /*every=*/2, /*ep=*/2);
  // Step 1 alone would put the hot expert on rank 1; the sum of steps 1 and 2 on rank 0.
  EXPECT_TRUE(planner.AddStep({{0, 0, 50, 0}}).empty());
  const std::vector<ReplicaPlan> plans = planner.AddStep({{200, 0, 0, 0}});
  ASSERT_EQ(plans.size(), 1u);
  EXPECT_TRUE(plans[0] == ReplicaPlan::Balance(std::vector<int64_t>{200, 0, 50, 0}, 2, 1));
  EXPECT_EQ(plans[0].replicated().at(0).expert, 0);
  // A new window: step 3 alone plans nothing yet, steps 3 + 4 do.
  EXPECT_TRUE(planner.AddStep({{0, 0, 10, 0}}).empty());
  const std::vector<ReplicaPlan> next = planner.AddStep({{0, 0, 10, 0}});
  ASSERT_EQ(next.size(), 1u);
  EXPECT_TRUE(next[0] == ReplicaPlan::Balance(std::vector<int64_t>{0, 0, 20, 0}, 2, 1));
}

}  // namespace
}  // namespace switchyard::moe
