// engine/core/profile.h: phases are charged exclusively (a nested phase pauses its outer
// one), nothing is recorded outside BeginStep/EndStep, and the phases plus "other" add up
// to the step time given to EndStep. Sleeps give the phases known minimum lengths; the
// checks are orderings and sums, never a speed.
#include "engine/core/profile.h"

#include <chrono>
#include <string>
#include <thread>

#include <gtest/gtest.h>

namespace switchyard {
namespace {

using Clock = std::chrono::steady_clock;

void SleepMs(int ms) { std::this_thread::sleep_for(std::chrono::milliseconds(ms)); }

double Since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double SumOfPhases(const Profiler& p) {
  double sum = 0.0;
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) sum += p.seconds(static_cast<Phase>(i));
  return sum;
}

TEST(ProfileTest, OffRecordsNothingAndCostsNoProfiler) {
  EXPECT_EQ(Profiler::Recording(), nullptr);
  Profiler p;
  {
    ScopedPhase phase(Phase::kAttention);  // no step begun: not recorded
    SleepMs(2);
  }
  EXPECT_EQ(p.seconds(Phase::kAttention), 0.0);
  EXPECT_EQ(p.steps(), 0);
}

TEST(ProfileTest, NestedPhasesAreExclusiveAndSumToTheStep) {
  Profiler p;
  const Clock::time_point t0 = Clock::now();
  p.BeginStep();
  EXPECT_EQ(Profiler::Recording(), &p);
  {
    ScopedPhase experts(Phase::kExperts);
    SleepMs(20);
    {
      ScopedPhase comm(Phase::kCommunication);  // pauses experts
      SleepMs(30);
    }
    SleepMs(10);
  }
  SleepMs(15);  // inside no phase: "other"
  {
    ScopedPhase opt(Phase::kOptimizer);
    SleepMs(5);
  }
  const double step = Since(t0);
  p.EndStep(step);
  EXPECT_EQ(Profiler::Recording(), nullptr);
  EXPECT_EQ(p.steps(), 1);
  EXPECT_DOUBLE_EQ(p.step_seconds(), step);
  // Each phase got at least its own sleeps; the experts did not also get the communication
  // nested inside them (inclusive timing would make these three exceed the step).
  EXPECT_GE(p.seconds(Phase::kExperts), 0.030);
  EXPECT_GE(p.seconds(Phase::kCommunication), 0.030);
  EXPECT_GE(p.seconds(Phase::kOptimizer), 0.005);
  EXPECT_LE(p.seconds(Phase::kExperts) + p.seconds(Phase::kCommunication) +
                p.seconds(Phase::kOptimizer),
            step);
  EXPECT_EQ(p.seconds(Phase::kAttention), 0.0);
  EXPECT_GE(p.other_seconds(), 0.015);
  EXPECT_NEAR(SumOfPhases(p) + p.other_seconds(), step, 1e-12);
}

TEST(ProfileTest, StepsAccumulateAndPhasesOutsideStepsAreNotCounted) {
  Profiler p;
  for (int s = 0; s < 3; ++s) {
    const Clock::time_point t0 = Clock::now();
    p.BeginStep();
    {
      ScopedPhase a(Phase::kAttention);
      SleepMs(2);
    }
    p.EndStep(Since(t0));
    ScopedPhase between(Phase::kAttention);  // e.g. validation between steps
    SleepMs(5);
  }
  EXPECT_EQ(p.steps(), 3);
  EXPECT_GE(p.seconds(Phase::kAttention), 0.006);
  EXPECT_LE(p.seconds(Phase::kAttention), p.step_seconds());  // the 15 ms between are not in
}

TEST(ProfileTest, TableAndJsonNameEveryPhase) {
  Profiler p;
  p.BeginStep();
  p.EndStep(0.5);
  const std::string table = p.Table(), json = p.Json();
  for (const char* name : {"embedding_head_loss", "attention", "norms", "dense_mlp", "router",
                           "dispatch", "experts", "combine", "communication", "optimizer",
                           "other"}) {
    EXPECT_NE(table.find(name), std::string::npos) << name;
    EXPECT_NE(json.find(std::string("\"") + name + "\""), std::string::npos) << name;
  }
  EXPECT_NE(json.find("\"steps\": 1"), std::string::npos) << json;
  EXPECT_DOUBLE_EQ(p.other_seconds(), 0.5);
}

// The token all-to-alls: overlapped exchanges add their time in flight and their time
// waited; one nothing overlapped (ScopedAllToAll) is exposed whole; hidden is the rest.
TEST(ProfileTest, AllToAllExposedAndHidden) {
  Profiler p;
  p.BeginStep();
  p.AddAllToAll(0.75, 0.25);
  p.AddAllToAll(0.5, 0.5);
  { ScopedAllToAll nothing(/*active=*/false); }
  { ScopedAllToAll timed; }
  p.EndStep(2.0);
  { ScopedAllToAll between; }  // not recording: not counted
  const double scoped = p.all_to_all_seconds() - 1.25;
  EXPECT_GE(scoped, 0.0);
  EXPECT_DOUBLE_EQ(p.all_to_all_exposed_seconds(), 0.75 + scoped);
  EXPECT_DOUBLE_EQ(p.all_to_all_hidden_seconds(), 0.5);
  EXPECT_NE(p.Table().find("token all-to-all:"), std::string::npos) << p.Table();
  EXPECT_NE(p.Json().find("\"all_to_all\": {\"in_flight_s\": "), std::string::npos) << p.Json();
  Profiler q;  // more waited than in flight (a late wake-up): hidden is zero, not negative
  q.AddAllToAll(0.1, 0.2);
  EXPECT_EQ(q.all_to_all_hidden_seconds(), 0.0);
}

}  // namespace
}  // namespace switchyard
