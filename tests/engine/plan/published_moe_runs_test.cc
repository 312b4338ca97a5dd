// The planner against published MoE training runs on Hopper (docs/plan.md, "Published MoE
// runs"), as published_runs_test.cc does for the dense table: for each row, the predicted
// tokens/s per GPU at the published layout over the published figure stays inside its
// recorded band (the error docs/plan.md reports, +-3 points), rows the page does not call a
// miss stay within the page's bound (20%), whether the published layout fits the device in
// this engine's memory (PeakMemory, the dry-run's) is as recorded, and where it fits the
// planner's best layout for the same cluster is predicted at least as fast as the published
// one. Every row's source forced balanced routing, so every row runs at skew 1.
//
// And the skew term against the one published gap between forced-balanced and dropless
// routing (Megatron-Core, Qwen3-235B-A22B at 16k tokens a sequence on 256 H100: 295 against
// 237 TFLOP/s at the same layout): the throughput at a routing log's skew over the throughput
// at skew 1 stays within 10 points of 237 / 295.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>

#include "engine/config/config.h"
#include "engine/plan/dry_run.h"
#include "engine/plan/hardware.h"
#include "engine/plan/planner.h"

namespace switchyard::plan {
namespace {

struct Row {
  const char* name;       // configs/plan/published/<name>.yaml
  const char* gpu;        // configs/hardware/<gpu>.yaml
  int gpus;
  const char* precision;  // bf16, fp8 (block scales), fp8-cs (current scaling)
  double tokens;          // published tokens/s per GPU
  double recorded;        // predicted / published - 1, as docs/plan.md reports it
  bool miss;              // docs/plan.md explains why the row is outside the bound
  bool fits;              // the published layout fits the device in this engine's memory
};

constexpr Row kRows[] = {
    {"qwen3-30b-a3b", "h100", 8, "bf16", 12040, -0.239, true, true},
    {"deepseek-v3-h100", "h100", 256, "bf16", 1002, -0.354, true, false},
    {"qwen3-235b-a22b", "h100", 256, "fp8-cs", 1611, +0.005, false, false},
    {"qwen3-235b-a22b-bf16", "h100", 256, "bf16", 1663, -0.223, true, false},
    {"gpt-oss-120b", "h100", 64, "bf16", 5984, +0.619, true, true},
    {"deepseek-v3", "h800", 2048, "fp8", 1543, -0.088, false, false},
};
constexpr double kBand = 0.03;   // around the recorded error
constexpr double kBound = 0.20;  // the page's bound for a row that is not a miss

std::string Published(const std::string& file) {
  return StrCat(SWITCHYARD_SOURCE_DIR, "/configs/plan/published/", file);
}

PlanInputs Inputs(const config::Config& config, int gpus, const char* precision, int max_tp) {
  PlanInputs in;
  in.config = config;
  in.world = gpus;
  in.precision = precision;
  in.max_tp = max_tp;
  const Layout published = LayoutOf(config);
  in.global_batch = published.micro_batch_size * published.micro_batches * published.dp(gpus);
  return in;
}

TEST(PublishedMoeRunsTest, PredictionsStayInTheirBands) {
  for (const Row& row : kRows) {
    SCOPED_TRACE(row.name);
    auto config = config::LoadConfig(Published(StrCat(row.name, ".yaml")));
    ASSERT_TRUE(config.ok()) << config.status();
    auto hw = LoadHardware(row.gpu, SWITCHYARD_SOURCE_DIR "/configs/hardware");
    ASSERT_TRUE(hw.ok()) << hw.status();
    ASSERT_TRUE(config->parallel.Validate(config->model, config->moe, config->train.grad_accum, row.gpus).ok());
    const PlanInputs in = Inputs(*config, row.gpus, row.precision, hw->gpus_per_node);

    CostCache cache;
    const Candidate at = Evaluate(in, LayoutOf(*config), *hw, cache);
    const double error = at.tokens_per_s / row.gpus / row.tokens - 1;
    EXPECT_NEAR(error, row.recorded, kBand) << "predicted " << at.tokens_per_s / row.gpus
                                            << " tokens/s per GPU, published " << row.tokens;
    if (!row.miss) {
      EXPECT_LE(std::abs(error), kBound);
    }

    const int64_t peak = PeakMemory(in, LayoutOf(*config));
    EXPECT_EQ(peak <= hw->memory_bytes, row.fits) << "published layout's peak " << FormatBytes(peak);
    const PlanResult best = Plan(in, *hw, {.top = 1});
    ASSERT_EQ(best.best.size(), 1u);
    // The figures docs/plan.md's table records.
    std::printf("%-22s predicted %8.0f tokens/s/GPU (%+.1f%%; all-to-all %.0f%% of the step), "
                "peak %s; planner's choice %8.0f (%s)\n",
                row.name, at.tokens_per_s / row.gpus, 100 * error, 100 * at.time.ep / at.time.total(),
                FormatBytes(peak).c_str(),
                best.best[0].tokens_per_s / row.gpus, best.best[0].layout.Describe(row.gpus).c_str());
    if (row.fits) {
      EXPECT_LE(best.best[0].time.total(), at.time.total()) << best.best[0].layout.Describe(row.gpus);
    }
  }
}

TEST(PublishedMoeRunsTest, SkewPredictsTheDroplessGap) {
  auto config = config::LoadConfig(Published("qwen3-235b-16k.yaml"));
  ASSERT_TRUE(config.ok()) << config.status();
  auto hw = LoadHardware("h100", SWITCHYARD_SOURCE_DIR "/configs/hardware");
  ASSERT_TRUE(hw.ok()) << hw.status();
  constexpr int kGpus = 256;
  ASSERT_TRUE(config->parallel.Validate(config->model, config->moe, config->train.grad_accum, kGpus).ok());
  PlanInputs balanced = Inputs(*config, kGpus, "bf16", hw->gpus_per_node);
  PlanInputs dropless = balanced;
  auto skew = ParseSkew(Published("qwen3-235b-16k.routing.jsonl"));
  ASSERT_TRUE(skew.ok()) << skew.status();
  dropless.skew = *skew;
  const Layout layout = LayoutOf(*config);
  EXPECT_GT(skew->ForEp(layout.ep), 1.0);

  CostCache c1, c2;
  const double even = Evaluate(balanced, layout, *hw, c1).tokens_per_s;
  const double skewed = Evaluate(dropless, layout, *hw, c2).tokens_per_s;
  const double published = 237.0 / 295.0;  // dropless over forced balance, same FLOPs a token
  EXPECT_NEAR(skewed / even, published, 0.10) << "skew " << skew->ForEp(layout.ep);
}

}  // namespace
}  // namespace switchyard::plan
