// engine/parallel/sync_plan.h by hand: the policy of every ZeRO stage (the trainer's former
// predicates: ordered accumulation, reduce during backward, streaming), the bucket keys,
// the packing of a small parameter list (reverse registration order, the size cap, a
// parameter larger than a bucket, a key change, dtypes apart, a group of one rank left
// out) and the launch order when parts finish in backward order.
#include <gtest/gtest.h>

#include <vector>

#include "engine/parallel/sync_plan.h"

namespace switchyard::parallel {
namespace {

using dist::Axis;
using dist::View;

TEST(SyncPlanTest, PolicyOfEachStage) {
  for (int stage = 0; stage <= 3; ++stage) {
    for (int pp : {1, 2}) {
      for (bool ordered : {false, true}) {
        for (bool tied : {false, true}) {
          SCOPED_TRACE(StrCat("stage ", stage, " pp ", pp, " ordered ", ordered, " tied ", tied));
          const SyncPolicy p = SyncPolicyFor({.zero_stage = stage, .pp = pp, .grad_accum = 4,
                                              .ordered_grad_accum = ordered,
                                              .tied_embeddings = tied});
          EXPECT_EQ(p.ordered_accum, ordered);
          EXPECT_EQ(p.reduce_scatter, stage >= 1);
          EXPECT_EQ(p.persistent_shard, stage >= 2);
          const bool stream = stage >= 2 && !ordered && !(pp > 1 && tied);
          EXPECT_EQ(p.stream, stream);
          EXPECT_EQ(p.reduce_during_backward, !ordered && !(stage == 1 && pp > 1));
          EXPECT_EQ(p.buckets_by_part, stage == 3 || stream);
          EXPECT_EQ(p.tied_alone, stage >= 1);
          EXPECT_EQ(p.max_in_flight, stream ? 1 : 2);
        }
      }
    }
  }
  // One micro-batch: nothing to order, so ZeRO-2 streams even with ordered_grad_accum.
  const SyncPolicy one = SyncPolicyFor({.zero_stage = 2, .grad_accum = 1, .ordered_grad_accum = true});
  EXPECT_FALSE(one.ordered_accum);
  EXPECT_TRUE(one.stream);
}

// Dense over dp (4 ranks), experts over edp (1 rank: no buckets), norms over dp x tp.
std::vector<SyncParam> Params() {
  const AxisSet dense{Axis::kDp, Axis::kCp}, tp{Axis::kDp, Axis::kCp, Axis::kTp};
  return {
      {.name = "embed.wte", .numel = 300, .grad_sum = dense, .part = 0, .tied = true},
      {.name = "l0.norm", .numel = 10, .grad_sum = tp, .part = 1},
      {.name = "l0.w", .numel = 100, .grad_sum = dense, .part = 1},
      {.name = "l0.experts", .numel = 50, .view = View::kExpert, .grad_sum = {Axis::kDp}, .part = 1},
      {.name = "l0.half", .numel = 40, .dtype = DType::kBF16, .grad_sum = dense, .part = 1},
      {.name = "l1.w", .numel = 60, .grad_sum = dense, .part = 2},
      {.name = "l1.bias", .numel = 30, .grad_sum = dense, .part = 2},
      {.name = "l1.state", .numel = 8, .grad_sum = dense, .trainable = false, .part = 2},
      {.name = "l1.norm", .numel = 10, .grad_sum = tp, .part = 2},
  };
}

int Sizes(View view, AxisSet axes) {
  if (view == View::kExpert) return 1;
  return axes.Has(Axis::kTp) ? 8 : 4;
}

// (group, names in packing order) of each bucket.
std::vector<std::vector<std::string>> Names(const std::vector<SyncGroup>& groups,
                                            const std::vector<SyncParam>& params) {
  std::vector<std::vector<std::string>> out;
  for (const SyncGroup& g : groups) {
    for (const SyncBucket& b : g.buckets) {
      std::vector<std::string> names;
      for (size_t i : b.params) names.push_back(params[i].name);
      out.push_back(names);
    }
  }
  return out;
}

TEST(SyncPlanTest, PacksInReverseOrderUpToTheCap) {
  const std::vector<SyncParam> params = Params();
  // 4-byte f32 elements, 512-byte buckets (128 f32 elements).
  const std::vector<SyncGroup> groups = PackBuckets(params, {}, 512, Sizes);
  ASSERT_EQ(groups.size(), 2u);  // dense, then dp x tp; the experts' group has one rank
  EXPECT_EQ(groups[0].size, 4);
  EXPECT_EQ(groups[1].size, 8);
  using Names2 = std::vector<std::vector<std::string>>;
  EXPECT_EQ(Names(groups, params),
            (Names2{{"l1.bias", "l1.w"},  // 90 elements; + 100 would pass 128
                    {"l0.half"},          // bf16 apart
                    {"l0.w"},             // 100; + 300 would pass
                    {"embed.wte"},        // larger than a bucket: its own
                    {"l1.norm", "l0.norm"}}));
  const SyncBucket& first = groups[0].buckets[0];
  EXPECT_EQ(first.offsets, (std::vector<int64_t>{0, 30}));
  EXPECT_EQ(first.elements, 90);
  EXPECT_EQ(groups[0].buckets[1].dtype, DType::kBF16);
  EXPECT_EQ(groups[0].buckets[1].bytes(), 80);
}

TEST(SyncPlanTest, KeysKeepPartsAndTiedWeightsApart) {
  const std::vector<SyncParam> params = Params();
  SyncPolicy by_part = SyncPolicyFor({.zero_stage = 3});
  const std::vector<int> keys = BucketKeys(by_part, params, 3);
  EXPECT_EQ(keys, (std::vector<int>{3, 1, 1, 1, 1, 2, 2, 2, 2}));
  const std::vector<int> stage1 = BucketKeys(SyncPolicyFor({.zero_stage = 1}), params, 3);
  EXPECT_EQ(stage1, (std::vector<int>{3, -1, -1, -1, -1, -1, -1, -1, -1}));
  using Names2 = std::vector<std::vector<std::string>>;
  // 25 MiB buckets: only the keys cut them.
  EXPECT_EQ(Names(PackBuckets(params, keys, int64_t{25} << 20, Sizes), params),
            (Names2{{"l1.bias", "l1.w"}, {"l0.half"}, {"l0.w"}, {"embed.wte"}, {"l1.norm"}, {"l0.norm"}}));
  EXPECT_EQ(Names(PackBuckets(params, stage1, int64_t{25} << 20, Sizes), params),
            (Names2{{"l1.bias", "l1.w", "l0.w"}, {"l0.half"}, {"embed.wte"}, {"l1.norm", "l0.norm"}}));
}

TEST(SyncPlanTest, LaunchOrderFollowsTheParts) {
  const std::vector<SyncParam> params = Params();
  const std::vector<SyncGroup> groups =
      PackBuckets(params, BucketKeys(SyncPolicyFor({.zero_stage = 3}), params, 3),
                  int64_t{25} << 20, Sizes);
  // Backward finishes part 2, then 1, then 0. Part 2 completes the dense group's bucket 0
  // and the norms' bucket 0; part 1 the dense buckets 1-2 and the norms' 1; part 0 the
  // table's (the dense group's 3).
  const std::vector<BucketRef> order = LaunchOrder(groups, params, {2, 1, 0});
  EXPECT_EQ(order, (std::vector<BucketRef>{{0, 0}, {1, 0}, {1, 1}, {0, 1}, {0, 2}, {0, 3}}));
  // Part 1 marks l0.norm (norms' bucket 1) before l0.w and l0.half: the norms' bucket goes
  // first. In the other order of parts, a group's buckets still go in bucket order: nothing
  // of the dense group launches before part 2's l1 bucket is ready.
  const std::vector<BucketRef> reversed = LaunchOrder(groups, params, {0, 1, 2});
  EXPECT_EQ(reversed, (std::vector<BucketRef>{{0, 0}, {0, 1}, {0, 2}, {0, 3}, {1, 0}, {1, 1}}));
}

TEST(SyncPlanTest, AtTheEndOfTheStepGroupByGroup) {
  const std::vector<SyncParam> params = Params();
  // ZeRO-1 under pipeline parallelism reduces once, after the schedule (GradSync::Finish):
  // every group in turn, in bucket order, whatever order the parts finished in.
  const SyncPolicy end = SyncPolicyFor({.zero_stage = 1, .pp = 2});
  ASSERT_FALSE(end.reduce_during_backward);
  const std::vector<SyncGroup> groups =
      PackBuckets(params, BucketKeys(end, params, 3), int64_t{25} << 20, Sizes);
  EXPECT_EQ(SyncLaunchOrder(end, groups, params, {2, 1, 0}),
            (std::vector<BucketRef>{{0, 0}, {0, 1}, {0, 2}, {1, 0}}));
  const SyncPolicy during = SyncPolicyFor({.zero_stage = 1, .pp = 1});
  EXPECT_EQ(SyncLaunchOrder(during, groups, params, {2, 1, 0}),
            LaunchOrder(groups, params, {2, 1, 0}));
}

}  // namespace
}  // namespace switchyard::parallel
