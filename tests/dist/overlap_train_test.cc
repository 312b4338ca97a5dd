// moe.overlap_chunks in the trainer, run with 2 and 4 ranks on the tiny config of
// tests/data/train-tiny.yaml (tests/dist/train_fixture.h): three steps with the MoE layers'
// local experts in 2 (and 4) chunks give bit for bit the per-step losses and the updated
// weights of no chunks, under ep 2, and from 4 ranks on ep 4, ep 2 x etp 2 and tp 2 x ep 2.
// For top-1 routing with capacity drops and jitter (the config) and top-2 with a shared
// expert (computed while the first chunks' rows travel).
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "engine/train/trainer.h"
#include "tests/dist/train_fixture.h"

namespace switchyard::train {
namespace {

constexpr int64_t kGlobalMicroBatches = 4;  // global batch 16 = 4 micro-batches of 4
constexpr int64_t kSteps = 3;

class OverlapTrainTest : public testing::TrainFixture {};

struct Layout {
  std::string name;
  int dp;                              // grad_accum = 4 / dp
  int experts_per_rank;                // 8 / ep
  std::vector<std::string> overrides;  // parallel.* overrides
};

std::vector<Layout> Layouts(int ranks) {
  std::vector<Layout> layouts = {{"ep2", ranks, 4, {"parallel.ep=2"}}};
  if (ranks >= 4) {
    layouts.push_back({"ep4", ranks, 2, {"parallel.ep=4"}});
    layouts.push_back({"ep2_etp2", ranks, 4, {"parallel.ep=2", "parallel.etp=2"}});
    layouts.push_back({"tp2_ep2", ranks / 2, 4, {"parallel.tp=2", "parallel.ep=2"}});
  }
  return layouts;
}

std::vector<std::vector<float>> Weights(Trainer& t) {
  std::vector<std::vector<float>> out;
  for (const parallel::Parameter& p : t.registry().params())
    if (p.trainable) out.push_back(p.value.ToVector<float>());
  return out;
}

TEST_F(OverlapTrainTest, ChunksTrainTheBitsOfOne) {
  if (R() < 2) GTEST_SKIP() << "needs ep >= 2";
  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"top1_capacity_jitter", {}},
      {"top2_shared", {"moe.top_k=2", "moe.num_shared_experts=1", "moe.d_shared=16"}}};
  int compared = 0;
  for (const auto& [variant, model] : variants) {
    for (const Layout& layout : Layouts(R())) {
      SCOPED_TRACE(variant + ", " + layout.name);
      std::vector<double> want_losses;
      std::vector<std::vector<float>> want_weights;
      std::vector<int> chunk_counts = {1, 2};
      if (layout.experts_per_rank >= 4) chunk_counts.push_back(4);
      for (int chunks : chunk_counts) {
        SCOPED_TRACE(StrCat(chunks, " chunks"));
        std::vector<std::string> overrides = model;
        overrides.insert(overrides.end(), layout.overrides.begin(), layout.overrides.end());
        overrides.push_back("train.grad_accum=" + std::to_string(kGlobalMicroBatches / layout.dp));
        overrides.push_back("train.max_steps=" + std::to_string(kSteps));
        overrides.push_back("moe.overlap_chunks=" + std::to_string(chunks));
        auto trainer = Train(TinyConfig(overrides),
                             dir(StrCat(variant, "_", layout.name, "_c", chunks)), *world_);
        ASSERT_TRUE(trainer.ok()) << trainer.status();
        const std::vector<double>& losses = (*trainer)->losses();
        ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
        std::vector<std::vector<float>> weights = Weights(**trainer);
        if (chunks == 1) {
          want_losses = losses;
          want_weights = std::move(weights);
        } else {
          for (int64_t s = 0; s < kSteps; ++s) {
            EXPECT_EQ(std::memcmp(&losses[s], &want_losses[s], sizeof(double)), 0)
                << "step " << s << ": loss " << losses[s] << ", without chunks "
                << want_losses[s];
          }
          ASSERT_EQ(weights.size(), want_weights.size());
          int differ = 0;
          for (size_t i = 0; i < weights.size(); ++i) differ += weights[i] != want_weights[i];
          EXPECT_EQ(differ, 0) << differ << " parameters differ on rank " << world_->rank();
          ++compared;
        }
        if (is_root()) {
          std::printf("[ info     ] %s, world %d, %s, %d chunk(s): losses %.9f %.9f %.9f\n",
                      variant.c_str(), R(), layout.name.c_str(), chunks, losses[0], losses[1],
                      losses[2]);
          std::fflush(stdout);
        }
        world_->Barrier();
      }
    }
  }
  EXPECT_GE(compared, 4);
}

}  // namespace
}  // namespace switchyard::train
