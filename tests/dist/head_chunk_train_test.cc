// Head chunking in the trainer (train.head_chunk_tokens), run with 1, 2 and 4 ranks on the
// tiny config of tests/data/train-tiny.yaml (tests/dist/train_fixture.h): three steps with
// the head in chunks of 5 rows (64 rows a micro-batch: twelve chunks of 5 and one of 4)
// give the per-step losses of the whole head to rounding, on one rank (its loss summed on
// the device for the step's one readback), under expert parallelism with ZeRO-3 (the head
// acquired from Forward to Backward), two pipeline stages (the last one chunks), and tp 2
// with and without sequence parallelism (the vocabulary-parallel cross-entropy chunk by
// chunk, its collectives once per chunk in Forward and again in Backward), in f32 and with
// bf16 products. The two runs differ only in the order of the head's sums, a relative
// 1e-7 or so per step (head_chunk_test.cc); the bound is 1e-5 on each step's loss.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/train/trainer.h"
#include "tests/dist/train_fixture.h"

namespace switchyard::train {
namespace {

constexpr int64_t kGlobalMicroBatches = 4;  // global batch 16 = 4 micro-batches of 4
constexpr int64_t kSteps = 3;
constexpr double kLossTol = 1e-5;

class HeadChunkTrainTest : public testing::TrainFixture {};

struct Layout {
  std::string name;
  int dp;
  std::vector<std::string> overrides;
};

std::vector<Layout> Layouts(int ranks) {
  if (ranks == 1) return {{"one_rank", 1, {}}};
  return {{"ep2_zero3", ranks, {"parallel.ep=2", "parallel.zero_stage=3"}},
          {"pp2", ranks / 2, {"parallel.pp=2"}},
          {"tp2", ranks / 2, {"parallel.tp=2"}},
          {"tp2_no_sp", ranks / 2, {"parallel.tp=2", "parallel.sequence_parallel=false"}}};
}

TEST_F(HeadChunkTrainTest, ChunkedHeadTrainsTheWholeHeadsLosses) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"f32", {}}, {"bf16_products", {"runtime.precision=bf16"}}};
  for (const auto& [variant, extra] : variants) {
    for (const Layout& layout : Layouts(R())) {
      SCOPED_TRACE(variant + ", " + layout.name);
      std::vector<double> want;
      for (int64_t chunk : {0, 5}) {
        std::vector<std::string> overrides = extra;
        overrides.insert(overrides.end(), layout.overrides.begin(), layout.overrides.end());
        overrides.push_back("train.grad_accum=" + std::to_string(kGlobalMicroBatches / layout.dp));
        overrides.push_back("train.max_steps=" + std::to_string(kSteps));
        overrides.push_back("train.head_chunk_tokens=" + std::to_string(chunk));
        auto trainer = Train(TinyConfig(overrides),
                             dir(variant + "_" + layout.name + "_" + std::to_string(chunk)), *world_);
        ASSERT_TRUE(trainer.ok()) << trainer.status();
        EXPECT_EQ((*trainer)->decoder().head_chunk(), chunk);
        const std::vector<double>& losses = (*trainer)->losses();
        ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
        if (chunk == 0) {
          want = losses;
        } else {
          for (int64_t s = 0; s < kSteps; ++s) {
            EXPECT_TRUE(std::isfinite(losses[s]));
            EXPECT_LE(std::abs(losses[s] - want[s]), kLossTol * std::abs(want[s]))
                << "step " << s << ": loss " << losses[s] << ", whole head " << want[s];
          }
          if (is_root()) {
            std::printf("[ info     ] %s, world %d, %s: losses %.9f %.9f %.9f, whole head "
                        "%.9f %.9f %.9f\n",
                        variant.c_str(), R(), layout.name.c_str(), losses[0], losses[1],
                        losses[2], want[0], want[1], want[2]);
            std::fflush(stdout);
          }
        }
        world_->Barrier();
      }
    }
  }
}

}  // namespace
}  // namespace switchyard::train
