// Activation recompute in the trainer (train.recompute), run with 1, 2 and 4 ranks on the
// tiny config of tests/data/train-tiny.yaml (tests/dist/train_fixture.h): three steps with
// none, selective and full give bit for bit the same per-step losses and the same weights
// on every rank, under expert parallelism (ep = 2 from 2 ranks on: full recompute repeats
// each MoE layer's all-to-all in backward, on every ep rank in the same order), ep 2 with
// ZeRO-3 (the recomputed forward reads a block inside its acquire/release), two pipeline
// stages (1F1B, and interleaved with two chunks per rank), and tp 2 with and without
// sequence parallelism (one kv head, replicated over tp; full recompute repeats the tp
// collectives too). For top-1 routing with capacity drops and jitter (the config),
// top-2 with GShard's random second choice, and bf16 products keeping bf16 activations
// (runtime.activation_dtype=bf16) with swiglu experts.
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

class RecomputeTrainTest : public testing::TrainFixture {};

struct Layout {
  std::string name;
  int dp;                             // grad_accum = 4 / dp
  std::vector<std::string> overrides;  // parallel.* (and model.*) overrides
};

std::vector<Layout> Layouts(int ranks) {
  if (ranks == 1) return {{"one_rank", 1, {}}};
  const std::string ep2 = "parallel.ep=2";
  return {{"ep2", ranks, {ep2}},
          {"ep2_zero3", ranks, {ep2, "parallel.zero_stage=3"}},
          {"pp2", ranks / 2, {"parallel.pp=2"}},
          // Two chunks per rank (each chunk's decoder recomputes).
          {"pp2_interleaved", ranks / 2,
           {"parallel.pp=2", "parallel.pipeline_schedule=interleaved", "parallel.virtual_stages=2",
            "model.n_layers=4"}},
          // One kv head on two tp ranks: replicated k and v (dense/attention.h).
          {"tp2_mqa", ranks / 2, {"parallel.tp=2", "model.n_kv_heads=1"}},
          {"tp2_no_sp", ranks / 2, {"parallel.tp=2", "parallel.sequence_parallel=false"}}};
}

// Every trainable parameter's values on this rank, in registry order (whole under ZeRO-3:
// gathered, collective).
std::vector<std::vector<float>> Weights(Trainer& t) {
  t.zero().AcquireAll();
  std::vector<std::vector<float>> out;
  for (const parallel::Parameter& p : t.registry().params())
    if (p.trainable) out.push_back(p.value.ToVector<float>());
  t.zero().ReleaseAll();
  return out;
}

TEST_F(RecomputeTrainTest, EveryModeTrainsTheSameBits) {
  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"top1_capacity_jitter", {}},
      {"top2_random_second", {"moe.top_k=2", "moe.second_expert_policy=random"}},
      // bf16 activation storage (MODEL.md "Activation storage"): recomputing a block rounds
      // what it keeps exactly as its first forward did.
      {"bf16_storage_swiglu",
       {"runtime.precision=bf16", "runtime.activation_dtype=bf16", "moe.activation=swiglu"}}};
  for (const auto& [variant, model] : variants) {
    for (const Layout& layout : Layouts(R())) {
      SCOPED_TRACE(variant + ", " + layout.name);
      std::vector<double> want_losses;
      std::vector<std::vector<float>> want_weights;
      for (const char* mode : {"none", "selective", "full"}) {
        SCOPED_TRACE(mode);
        std::vector<std::string> overrides = model;
        overrides.insert(overrides.end(), layout.overrides.begin(), layout.overrides.end());
        overrides.push_back("train.grad_accum=" + std::to_string(kGlobalMicroBatches / layout.dp));
        overrides.push_back("train.max_steps=" + std::to_string(kSteps));
        overrides.push_back(std::string("train.recompute=") + mode);
        auto trainer = Train(TinyConfig(overrides),
                             dir(variant + "_" + layout.name + "_" + mode), *world_);
        ASSERT_TRUE(trainer.ok()) << trainer.status();
        ASSERT_EQ(model::RecomputeName((*trainer)->decoder().recompute()), std::string(mode));
        const std::vector<double>& losses = (*trainer)->losses();
        ASSERT_EQ(losses.size(), static_cast<size_t>(kSteps));
        std::vector<std::vector<float>> weights = Weights(**trainer);
        if (want_losses.empty()) {
          want_losses = losses;
          want_weights = std::move(weights);
        } else {
          for (int64_t s = 0; s < kSteps; ++s) {
            EXPECT_EQ(std::memcmp(&losses[s], &want_losses[s], sizeof(double)), 0)
                << "step " << s << ": loss " << losses[s] << ", without recompute "
                << want_losses[s];
          }
          ASSERT_EQ(weights.size(), want_weights.size());
          int differ = 0;
          for (size_t i = 0; i < weights.size(); ++i) differ += weights[i] != want_weights[i];
          EXPECT_EQ(differ, 0) << differ << " parameters differ on rank " << world_->rank();
        }
        if (is_root()) {
          std::printf("[ info     ] %s, world %d, %s, recompute %-9s losses %.9f %.9f %.9f\n",
                      variant.c_str(), R(), layout.name.c_str(), mode, losses[0], losses[1],
                      losses[2]);
          std::fflush(stdout);
        }
        world_->Barrier();
      }
    }
  }
}

}  // namespace
}  // namespace switchyard::train
