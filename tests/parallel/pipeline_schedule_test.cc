// engine/parallel/pipeline_schedule.h: hand-written action lists of small cases of every
// schedule compared element by element; every schedule for pp in {1, 2, 3, 4, 8} and 1..16
// micro-batches (interleaved: v in {2, 3} where m % pp == 0) validated, with its peak
// in-flight count and its simulated makespan and bubble against the formulas; broken lists
// rejected with a message naming the rank, action and reason; impossible settings rejected
// one by one; exact timeline charts of two small cases.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/parallel/pipeline_schedule.h"

namespace switchyard::parallel {
namespace {

using Lists = std::vector<std::vector<Action>>;

// Shorthands for hand-written lists: F(mb, chunk), B(mb, chunk), and the four messages
// with their peer.
Action F(int mb, int chunk = 0) { return {ActionKind::kForward, mb, chunk, -1}; }
Action B(int mb, int chunk = 0) { return {ActionKind::kBackward, mb, chunk, -1}; }
Action SendAct(int mb, int chunk, int peer) {
  return {ActionKind::kSendActivation, mb, chunk, peer};
}
Action RecvAct(int mb, int chunk, int peer) {
  return {ActionKind::kRecvActivation, mb, chunk, peer};
}
Action SendGrad(int mb, int chunk, int peer) {
  return {ActionKind::kSendGradient, mb, chunk, peer};
}
Action RecvGrad(int mb, int chunk, int peer) {
  return {ActionKind::kRecvGradient, mb, chunk, peer};
}

Lists AllRanks(PipelineSchedule schedule, int pp, int m, int v) {
  Lists ranks;
  for (int r = 0; r < pp; ++r) ranks.push_back(ScheduleActions(schedule, pp, m, v, r));
  return ranks;
}

// Element-by-element comparison that prints the first differing action.
void ExpectActions(const std::vector<Action>& got, const std::vector<Action>& want,
                   const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i], want[i]) << what << ", action " << i << ": got " << FormatAction(got[i])
                               << ", want " << FormatAction(want[i]);
  }
}

TEST(PipelineScheduleTest, NamesRoundTrip) {
  for (PipelineSchedule s : {PipelineSchedule::kGPipe, PipelineSchedule::kOneFOneB,
                             PipelineSchedule::kInterleaved}) {
    StatusOr<PipelineSchedule> parsed = ParsePipelineSchedule(PipelineScheduleName(s));
    ASSERT_TRUE(parsed.ok());
    EXPECT_EQ(*parsed, s);
  }
  EXPECT_EQ(PipelineScheduleName(PipelineSchedule::kOneFOneB), "1f1b");
  StatusOr<PipelineSchedule> bad = ParsePipelineSchedule("1F1B");
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().message(),
            "unknown pipeline schedule \"1F1B\" (expected gpipe, 1f1b or interleaved)");
}

TEST(PipelineScheduleTest, FormatAction) {
  EXPECT_EQ(FormatAction(F(3, 1)), "forward mb 3 chunk 1");
  EXPECT_EQ(FormatAction(RecvAct(3, 0, 2)), "recv-activation mb 3 chunk 0 from rank 2");
  EXPECT_EQ(FormatAction(SendGrad(0, 0, 1)), "send-gradient mb 0 chunk 0 to rank 1");
}

TEST(PipelineScheduleTest, GPipeTwoStagesTwoMicroBatches) {
  ExpectActions(ScheduleActions(PipelineSchedule::kGPipe, 2, 2, 1, 0),
                {F(0), SendAct(0, 0, 1), F(1), SendAct(1, 0, 1), RecvGrad(0, 0, 1), B(0),
                 RecvGrad(1, 0, 1), B(1)},
                "rank 0");
  ExpectActions(ScheduleActions(PipelineSchedule::kGPipe, 2, 2, 1, 1),
                {RecvAct(0, 0, 0), F(0), RecvAct(1, 0, 0), F(1), B(0), SendGrad(0, 0, 0), B(1),
                 SendGrad(1, 0, 0)},
                "rank 1");
}

TEST(PipelineScheduleTest, OneStageHasNoMessages) {
  ExpectActions(ScheduleActions(PipelineSchedule::kGPipe, 1, 2, 1, 0), {F(0), F(1), B(0), B(1)},
                "gpipe");
  ExpectActions(ScheduleActions(PipelineSchedule::kOneFOneB, 1, 2, 1, 0),
                {F(0), B(0), F(1), B(1)}, "1f1b");
}

// pp 2, m 3: rank 0 warms up with one forward, rank 1 (the last stage) with none.
TEST(PipelineScheduleTest, OneFOneBTwoStagesThreeMicroBatches) {
  ExpectActions(ScheduleActions(PipelineSchedule::kOneFOneB, 2, 3, 1, 0),
                {F(0), SendAct(0, 0, 1),                                        // warm-up
                 F(1), SendAct(1, 0, 1), RecvGrad(0, 0, 1), B(0),               // 1F1B
                 F(2), SendAct(2, 0, 1), RecvGrad(1, 0, 1), B(1),               // 1F1B
                 RecvGrad(2, 0, 1), B(2)},                                      // cool-down
                "rank 0");
  ExpectActions(ScheduleActions(PipelineSchedule::kOneFOneB, 2, 3, 1, 1),
                {RecvAct(0, 0, 0), F(0), B(0), SendGrad(0, 0, 0),
                 RecvAct(1, 0, 0), F(1), B(1), SendGrad(1, 0, 0),
                 RecvAct(2, 0, 0), F(2), B(2), SendGrad(2, 0, 0)},
                "rank 1");
}

// pp 2, m 4, v 2: stages 0, 1, 2, 3 on ranks 0, 1, 0, 1 (chunk 0, 0, 1, 1). Forwards go
// through the chunks in groups of pp = 2 micro-batches: (0,c0) (1,c0) (0,c1) (1,c1) (2,c0)
// (3,c0) (2,c1) (3,c1); backwards through the chunks in reverse: (0,c1) (1,c1) (0,c0)
// (1,c0) (2,c1) ... Warm-up: rank 0 (2-0-1)*2 + (2-1)*2 = 4 forwards, rank 1 2.
TEST(PipelineScheduleTest, InterleavedTwoStagesFourMicroBatchesTwoChunks) {
  ExpectActions(
      ScheduleActions(PipelineSchedule::kInterleaved, 2, 4, 2, 0),
      {F(0, 0), SendAct(0, 0, 1),  // warm-up: 4 forwards
       F(1, 0), SendAct(1, 0, 1),
       RecvAct(0, 1, 1), F(0, 1), SendAct(0, 1, 1),
       RecvAct(1, 1, 1), F(1, 1), SendAct(1, 1, 1),
       F(2, 0), SendAct(2, 0, 1), RecvGrad(0, 1, 1), B(0, 1), SendGrad(0, 1, 1),  // steady
       F(3, 0), SendAct(3, 0, 1), RecvGrad(1, 1, 1), B(1, 1), SendGrad(1, 1, 1),
       RecvAct(2, 1, 1), F(2, 1), SendAct(2, 1, 1), RecvGrad(0, 0, 1), B(0, 0),
       RecvAct(3, 1, 1), F(3, 1), SendAct(3, 1, 1), RecvGrad(1, 0, 1), B(1, 0),
       RecvGrad(2, 1, 1), B(2, 1), SendGrad(2, 1, 1),  // cool-down: 4 backwards
       RecvGrad(3, 1, 1), B(3, 1), SendGrad(3, 1, 1),
       RecvGrad(2, 0, 1), B(2, 0),
       RecvGrad(3, 0, 1), B(3, 0)},
      "rank 0");
  ExpectActions(
      ScheduleActions(PipelineSchedule::kInterleaved, 2, 4, 2, 1),
      {RecvAct(0, 0, 0), F(0, 0), SendAct(0, 0, 0),  // warm-up: 2 forwards
       RecvAct(1, 0, 0), F(1, 0), SendAct(1, 0, 0),
       RecvAct(0, 1, 0), F(0, 1), B(0, 1), SendGrad(0, 1, 0),  // steady: 6 pairs
       RecvAct(1, 1, 0), F(1, 1), B(1, 1), SendGrad(1, 1, 0),
       RecvAct(2, 0, 0), F(2, 0), SendAct(2, 0, 0), RecvGrad(0, 0, 0), B(0, 0),
       SendGrad(0, 0, 0),
       RecvAct(3, 0, 0), F(3, 0), SendAct(3, 0, 0), RecvGrad(1, 0, 0), B(1, 0),
       SendGrad(1, 0, 0),
       RecvAct(2, 1, 0), F(2, 1), B(2, 1), SendGrad(2, 1, 0),
       RecvAct(3, 1, 0), F(3, 1), B(3, 1), SendGrad(3, 1, 0),
       RecvGrad(2, 0, 0), B(2, 0), SendGrad(2, 0, 0),  // cool-down: 2 backwards
       RecvGrad(3, 0, 0), B(3, 0), SendGrad(3, 0, 0)},
      "rank 1");
}

// Every schedule, every pp in {1, 2, 3, 4, 8} and m in 1..16 (interleaved: v in {2, 3},
// m a multiple of pp): the lists validate, hold the documented number of micro-batches at
// their peak, and the simulated step takes (v m + pp - 1)(f + b) time units for uniform
// costs f, b, i.e. a bubble of (pp - 1)(f + b) on every rank; SimulateBubble agrees.
TEST(PipelineScheduleTest, EveryScheduleValidatesWithKnownPeakAndMakespan) {
  int cases = 0;
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::kOneFOneB,
                                    PipelineSchedule::kInterleaved}) {
    const bool interleaved = schedule == PipelineSchedule::kInterleaved;
    for (int pp : {1, 2, 3, 4, 8}) {
      for (int m = 1; m <= 16; ++m) {
        for (int v : interleaved ? std::vector<int>{2, 3} : std::vector<int>{1}) {
          if (interleaved && (pp < 2 || m % pp != 0)) continue;
          const std::string what = StrCat(PipelineScheduleName(schedule), " pp ", pp, " m ", m,
                                          " v ", v);
          ASSERT_TRUE(CheckScheduleArgs(schedule, pp, m, v).ok()) << what;
          const Status valid = ValidateSchedules(schedule, pp, m, v);
          EXPECT_TRUE(valid.ok()) << what << ": " << valid;
          ++cases;
          for (int r = 0; r < pp; ++r) {
            const int peak = MaxInFlight(ScheduleActions(schedule, pp, m, v, r));
            switch (schedule) {
              case PipelineSchedule::kGPipe:
                EXPECT_EQ(peak, m) << what << " rank " << r;
                break;
              case PipelineSchedule::kOneFOneB:
                EXPECT_EQ(peak, std::min(pp - r, m)) << what << " rank " << r;
                EXPECT_LE(peak, pp - r) << what << " rank " << r;
                break;
              case PipelineSchedule::kInterleaved:
                EXPECT_EQ(peak, std::min((pp - r - 1) * 2 + (v - 1) * pp + 1, v * m))
                    << what << " rank " << r;
                break;
            }
          }
          for (const auto& [f, b] : {std::pair{1, 1}, std::pair{1, 2}, std::pair{2, 3}}) {
            const Timeline t = SimulateTimeline(schedule, pp, m, v, f, b);
            EXPECT_EQ(t.makespan, (v * m + pp - 1) * (f + b)) << what << " f " << f << " b " << b;
            // The planner's bubble (no timeline kept) is the timeline's, bit for bit.
            EXPECT_EQ(SimulateBubble(schedule, pp, m, v, f, b), t.bubble)
                << what << " f " << f << " b " << b;
            for (int r = 0; r < pp; ++r) {
              EXPECT_DOUBLE_EQ(t.idle_fraction[r], t.bubble) << what << " rank " << r;
            }
            if (interleaved) {
              EXPECT_NEAR(t.bubble, LiteratureInterleavedBubble(pp, m, v), 1e-12) << what;
              EXPECT_GT(t.bubble, AnalyticBubble(schedule, pp, m, v)) << what;
            } else {
              EXPECT_NEAR(t.bubble, AnalyticBubble(schedule, pp, m, v), 1e-12) << what;
            }
          }
        }
      }
    }
  }
  EXPECT_EQ(cases, 2 * 5 * 16 + 2 * (8 + 5 + 4 + 2));
}

// Costs of 2^31 - 1 units: the clock and the makespan are 64-bit (a 32-bit clock wrapped
// to a negative makespan, and the chart then wrote outside its lines: `switchyard pipeline
// --forward-cost 2147483647` ended in a double free).
TEST(PipelineScheduleTest, LargestCostsDoNotOverflow) {
  const int big = std::numeric_limits<int>::max();
  for (PipelineSchedule schedule : {PipelineSchedule::kGPipe, PipelineSchedule::kOneFOneB}) {
    const Timeline t = SimulateTimeline(schedule, 4, 4, 1, big, big);
    EXPECT_EQ(t.makespan, int64_t{4 + 4 - 1} * 2 * big);
    EXPECT_NEAR(t.bubble, AnalyticBubble(schedule, 4, 4, 1), 1e-12);
    for (const auto& rank : t.ranks) {
      for (const TimedAction& a : rank) EXPECT_EQ(a.end - a.start, big);
    }
  }
}

// 30000 stages: the validator and the simulator keep only the channels the lists use (a
// table of pp^2 channels needed 9 * 10^8 entries, 23 GB) and visit each action once.
TEST(PipelineScheduleTest, ManyStagesValidateAndSimulate) {
  const int pp = 30000, m = 4;
  EXPECT_TRUE(ValidateSchedules(PipelineSchedule::kOneFOneB, pp, m, 1).ok());
  const Timeline t = SimulateTimeline(PipelineSchedule::kOneFOneB, pp, m, 1);
  EXPECT_EQ(t.makespan, int64_t{m + pp - 1} * 3);
  EXPECT_NEAR(t.bubble, AnalyticBubble(PipelineSchedule::kOneFOneB, pp, m, 1), 1e-9);
  EXPECT_EQ(SimulateBubble(PipelineSchedule::kOneFOneB, pp, m, 1), t.bubble);
}

// The figures the docs quote: simulated (forward 1, backward 2) against the formulas.
TEST(PipelineScheduleTest, BubbleTable) {
  std::printf("schedule     pp   m  v  makespan  measured  analytic  literature\n");
  for (const auto& [schedule, pp, m, v] :
       {std::tuple{PipelineSchedule::kGPipe, 4, 8, 1},
        std::tuple{PipelineSchedule::kOneFOneB, 4, 8, 1},
        std::tuple{PipelineSchedule::kOneFOneB, 8, 16, 1},
        std::tuple{PipelineSchedule::kInterleaved, 4, 8, 2},
        std::tuple{PipelineSchedule::kInterleaved, 4, 8, 4},
        std::tuple{PipelineSchedule::kInterleaved, 8, 16, 2}}) {
    const Timeline t = SimulateTimeline(schedule, pp, m, v);
    const double literature = LiteratureInterleavedBubble(pp, m, v);
    std::printf("%-11s %3d %3d %2d %9lld  %8.4f  %8.4f  %10.4f\n",
                std::string(PipelineScheduleName(schedule)).c_str(), pp, m, v,
                static_cast<long long>(t.makespan),
                t.bubble, AnalyticBubble(schedule, pp, m, v), literature);
    EXPECT_NEAR(t.bubble, literature, 1e-12);
  }
  EXPECT_DOUBLE_EQ(AnalyticBubble(PipelineSchedule::kOneFOneB, 4, 8, 1), 3.0 / 11);
  EXPECT_DOUBLE_EQ(AnalyticBubble(PipelineSchedule::kInterleaved, 4, 8, 2), 3.0 / 22);
  EXPECT_DOUBLE_EQ(LiteratureInterleavedBubble(4, 8, 2), 3.0 / 19);
}

// When the runner releases each send, by hand from the chart of RenderOneFOneB below (pp 2,
// 3 micro-batches, forward 1, backward 2): rank 0's activation of micro-batch 1 is posted
// at 2 and taken at 4 (rank 1 ends B0 then), so it is held until B0 of rank 0 ends at 6
// (action 5); rank 1's last gradient is taken at 10, when rank 1 has nothing left to run:
// it is held to the end of the step (12, the list's size).
TEST(PipelineScheduleTest, SendReleases) {
  EXPECT_EQ(SendReleases(PipelineSchedule::kOneFOneB, 2, 3, 1, 0),
            (std::vector<int>{-1, 2, -1, 5, -1, -1, -1, 9, -1, -1, -1, -1}));
  EXPECT_EQ(SendReleases(PipelineSchedule::kOneFOneB, 2, 3, 1, 1),
            (std::vector<int>{-1, -1, -1, 5, -1, -1, -1, 9, -1, -1, -1, 12}));
  // Every send of every schedule is released after it, and no later than the step's end.
  for (PipelineSchedule s : {PipelineSchedule::kGPipe, PipelineSchedule::kOneFOneB,
                             PipelineSchedule::kInterleaved}) {
    const int v = s == PipelineSchedule::kInterleaved ? 2 : 1;
    for (int r = 0; r < 4; ++r) {
      const std::vector<Action> actions = ScheduleActions(s, 4, 8, v, r);
      const std::vector<int> release = SendReleases(s, 4, 8, v, r);
      ASSERT_EQ(release.size(), actions.size());
      for (size_t i = 0; i < actions.size(); ++i) {
        const bool send = actions[i].kind == ActionKind::kSendActivation ||
                          actions[i].kind == ActionKind::kSendGradient;
        if (!send) {
          EXPECT_EQ(release[i], -1) << i;
          continue;
        }
        EXPECT_GT(release[i], static_cast<int>(i)) << "rank " << r << " action " << i;
        EXPECT_LE(release[i], static_cast<int>(actions.size())) << "rank " << r << " action " << i;
      }
    }
  }
}

TEST(PipelineScheduleTest, RenderOneFOneB) {
  const Timeline t = SimulateTimeline(PipelineSchedule::kOneFOneB, 2, 3, 1);
  ASSERT_EQ(t.ranks[0].size(), 6u);
  EXPECT_EQ(t.ranks[0][2].action, B(0));
  EXPECT_EQ(t.ranks[0][2].start, 4);  // the gradient of micro-batch 0 arrives at 1 + 1 + 2
  EXPECT_EQ(t.ranks[0][2].end, 6);
  EXPECT_EQ(RenderTimeline(t),
            "1f1b: pp 2, 3 micro-batches, forward 1 / backward 2 time units per stage\n"
            "rank 0   |ab..AAcBB.CC|\n"
            "rank 1   |.aAAbBBcCC..|\n"
            "legend: a-z forward of micro-batch 0-25, A-Z its backward (letters wrap after "
            "26), one letter per time unit, '.' idle\n"
            "makespan 12 time units\n"
            "bubble (idle share of the step): measured 0.2500, analytic (p-1)/(m+p-1) = "
            "0.2500\n");
}

// pp 2, m 2, v 2: rank 0 warms up with all 4 forwards; worked out by hand.
TEST(PipelineScheduleTest, RenderInterleaved) {
  EXPECT_EQ(RenderTimeline(SimulateTimeline(PipelineSchedule::kInterleaved, 2, 2, 2)),
            "interleaved: pp 2, 2 micro-batches, 2 virtual stages, forward 1 / backward 2 "
            "time units per chunk\n"
            "rank 0   |abab..AA.BBAABB|\n"
            "   chunk |0011  11 110000|\n"
            "rank 1   |.abaAAbBBAABB..|\n"
            "   chunk | 001111110000  |\n"
            "legend: a-z forward of micro-batch 0-25, A-Z its backward (letters wrap after "
            "26), one letter per time unit, '.' idle\n"
            "makespan 15 time units\n"
            "bubble (idle share of the step): measured 0.2000, analytic (p-1)/(v(m+p-1)) = "
            "0.1667, literature (p-1)/(vm+p-1) = 0.2000\n");
}

TEST(PipelineScheduleTest, CheckScheduleArgsNamesEachImpossibleSetting) {
  struct Case {
    PipelineSchedule schedule;
    int pp, m, v;
    std::string message;
  };
  const PipelineSchedule gpipe = PipelineSchedule::kGPipe, one = PipelineSchedule::kOneFOneB,
                         inter = PipelineSchedule::kInterleaved;
  const Case cases[] = {
      {one, 0, 4, 1, "pp must be >= 1, got 0"},
      {gpipe, -2, 4, 1, "pp must be >= 1, got -2"},
      {one, 4, 0, 1, "micro-batches must be >= 1, got 0"},
      {inter, 4, 8, 0, "virtual stages must be >= 1, got 0"},
      {one, 4, 8, 2,
       "virtual stages = 2 need the interleaved schedule; the 1f1b schedule has one chunk "
       "per rank"},
      {gpipe, 4, 8, 3,
       "virtual stages = 3 need the interleaved schedule; the gpipe schedule has one chunk "
       "per rank"},
      {inter, 4, 8, 1, "the interleaved schedule needs virtual stages >= 2, got 1"},
      {inter, 1, 8, 2, "the interleaved schedule needs pp >= 2, got 1"},
      {inter, 4, 6, 2,
       "the interleaved schedule needs micro-batches divisible by pp: 6 micro-batches, pp 4"},
      {one, 1024, 1025, 1,
       "pp * virtual stages * micro-batches = 1049600 exceeds the limit of 1048576"},
  };
  for (const Case& c : cases) {
    const Status status = CheckScheduleArgs(c.schedule, c.pp, c.m, c.v);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.message;
    EXPECT_EQ(status.message(), c.message);
    EXPECT_EQ(ValidateSchedules(c.schedule, c.pp, c.m, c.v), status);
  }
  EXPECT_TRUE(CheckScheduleArgs(one, 1024, 1024, 1).ok());
}

// Lists that break each rule, each reported with the rank, action and reason.
TEST(PipelineScheduleTest, ValidateRejectsBrokenLists) {
  const Lists good = AllRanks(PipelineSchedule::kGPipe, 2, 2, 1);
  ASSERT_TRUE(ValidateActionLists(good, 2, 2, 1).ok());
  struct Case {
    std::string name;
    Lists ranks;
    std::string message;
  };
  std::vector<Case> cases;
  // (b) rank 1 receives micro-batch 1 before micro-batch 0 (still each before its forward).
  cases.push_back({"recvs swapped",
                   {good[0],
                    {RecvAct(1, 0, 0), RecvAct(0, 0, 0), F(0), F(1), B(0), SendGrad(0, 0, 0),
                     B(1), SendGrad(1, 0, 0)}},
                   "rank 1, action 0 (recv-activation mb 1 chunk 0 from rank 0): message 0 "
                   "from rank 0 is its send-activation mb 0 chunk 0 to rank 1 (action 1): the "
                   "sends and recvs between the two ranks are in different orders"});
  // (c) rank 0 waits for the gradient of micro-batch 0 before sending the activation of
  // micro-batch 1, which rank 1 needs before it starts backwards.
  cases.push_back({"deadlock",
                   {{F(0), SendAct(0, 0, 1), F(1), RecvGrad(0, 0, 1), SendAct(1, 0, 1), B(0),
                     RecvGrad(1, 0, 1), B(1)},
                    good[1]},
                   "deadlock: rank 0, action 3 (recv-gradient mb 0 chunk 0 from rank 1) waits "
                   "for a send that is never posted; rank 1, action 2 (recv-activation mb 1 "
                   "chunk 0 from rank 0) waits for a send that is never posted"});
  // (a) the forward runs before its input arrives.
  cases.push_back({"forward before its recv",
                   {good[0],
                    {F(0), RecvAct(0, 0, 0), RecvAct(1, 0, 0), F(1), B(0), SendGrad(0, 0, 0),
                     B(1), SendGrad(1, 0, 0)}},
                   "rank 1, action 0 (forward mb 0 chunk 0): runs before its activation "
                   "arrives"});
  // (a) the activation is sent before it is computed.
  cases.push_back({"send before its forward",
                   {{SendAct(0, 0, 1), F(0), F(1), SendAct(1, 0, 1), RecvGrad(0, 0, 1), B(0),
                     RecvGrad(1, 0, 1), B(1)},
                    good[1]},
                   "rank 0, action 0 (send-activation mb 0 chunk 0 to rank 1): sent before its "
                   "forward runs"});
  // (a) backward before forward (the last stage has no gradient to wait for).
  cases.push_back({"backward before forward",
                   {good[0],
                    {RecvAct(0, 0, 0), RecvAct(1, 0, 0), B(0), F(0), F(1), SendGrad(0, 0, 0),
                     B(1), SendGrad(1, 0, 0)}},
                   "rank 1, action 2 (backward mb 0 chunk 0): runs before its forward"});
  // (a) a micro-batch computed twice, one never.
  cases.push_back({"repeated forward",
                   {{F(0), SendAct(0, 0, 1), F(0), SendAct(1, 0, 1), RecvGrad(0, 0, 1), B(0),
                     RecvGrad(1, 0, 1), B(1)},
                    good[1]},
                   "rank 0, action 2 (forward mb 0 chunk 0): repeats action 0"});
  cases.push_back({"missing backward",
                   {{F(0), SendAct(0, 0, 1), F(1), SendAct(1, 0, 1), RecvGrad(0, 0, 1), B(0),
                     RecvGrad(1, 0, 1)},
                    good[1]},
                   "rank 0: micro-batch 1 on stage 0 (chunk 0) has no backward"});
  // (a) messages to the wrong rank or on a stage that has no such neighbour.
  cases.push_back({"wrong peer",
                   {good[0],
                    {RecvAct(0, 0, 1), F(0), RecvAct(1, 0, 0), F(1), B(0), SendGrad(0, 0, 0),
                     B(1), SendGrad(1, 0, 0)}},
                   "rank 1, action 0 (recv-activation mb 0 chunk 0 from rank 1): the peer of "
                   "stage 1 is rank 0"});
  cases.push_back({"gradient sent from the first stage",
                   {{F(0), SendAct(0, 0, 1), F(1), SendAct(1, 0, 1), RecvGrad(0, 0, 1), B(0),
                     SendGrad(0, 0, 1), RecvGrad(1, 0, 1), B(1)},
                    good[1]},
                   "rank 0, action 6 (send-gradient mb 0 chunk 0 to rank 1): stage 0 has no "
                   "previous stage"});
  cases.push_back({"micro-batch out of range",
                   {good[0], {RecvAct(2, 0, 0)}},
                   "rank 1, action 0 (recv-activation mb 2 chunk 0 from rank 0): micro-batch "
                   "out of range [0, 2)"});
  cases.push_back({"too few ranks", {good[0]}, "expected the lists of 2 ranks, got 1"});
  for (const Case& c : cases) {
    const Status status = ValidateActionLists(c.ranks, 2, 2, 1);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_EQ(status.message(), c.message) << c.name;
  }
}

// Interleaved, pp 2: rank 1 sends rank 0 both activations (stage 1 -> 2) and gradients
// (stage 1 -> 0) on one channel, so their relative order matters too.
TEST(PipelineScheduleTest, ValidateChecksOrderAcrossKindsOnOneChannel) {
  Lists ranks = AllRanks(PipelineSchedule::kInterleaved, 2, 4, 2);
  ASSERT_TRUE(ValidateActionLists(ranks, 2, 4, 2).ok());
  // Rank 1 sends rank 0: activation mb 0 (action 2), activation mb 1 (5), gradient mb 0 of
  // chunk 1 (9), ... Moving the second activation after the gradient keeps rule (a) and the
  // order of each kind, but rank 0 receives the activation first.
  std::vector<Action>& r1 = ranks[1];
  ASSERT_EQ(r1[2], SendAct(0, 0, 0));
  ASSERT_EQ(r1[5], SendAct(1, 0, 0));
  ASSERT_EQ(r1[9], SendGrad(0, 1, 0));
  const Action moved = r1[5];
  r1.erase(r1.begin() + 5);
  r1.insert(r1.begin() + 9, moved);  // right after send-gradient mb 0 chunk 1, now action 8
  const Status status = ValidateActionLists(ranks, 2, 4, 2);
  EXPECT_EQ(status.message(),
            "rank 0, action 7 (recv-activation mb 1 chunk 1 from rank 1): message 1 from rank "
            "1 is its send-gradient mb 0 chunk 1 to rank 0 (action 8): the sends and recvs "
            "between the two ranks are in different orders");
}

TEST(PipelineScheduleTest, MaxInFlightCountsChunks) {
  EXPECT_EQ(MaxInFlight({}), 0);
  EXPECT_EQ(MaxInFlight({F(0), B(0), F(1), B(1)}), 1);
  EXPECT_EQ(MaxInFlight({F(0), F(1), B(0), F(2), B(1), B(2)}), 2);
  EXPECT_EQ(MaxInFlight({F(0, 0), F(0, 1), B(0, 1), B(0, 0)}), 2);
  EXPECT_EQ(MaxInFlight(ScheduleActions(PipelineSchedule::kInterleaved, 2, 4, 2, 0)), 5);
  EXPECT_EQ(MaxInFlight(ScheduleActions(PipelineSchedule::kInterleaved, 2, 4, 2, 1)), 3);
}

}  // namespace
}  // namespace switchyard::parallel
