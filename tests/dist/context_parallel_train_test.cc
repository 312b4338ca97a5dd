// Context parallelism end to end (engine/parallel/context_parallel.h), run with 2, 4 and 8 ranks on
// the tiny MoE decoder of tests/data/train-tiny.yaml (seq_len 16: 4 chunks of 4 at cp 2, 8
// of 2 at cp 4):
//
//  - ContextParallelLayoutsMatchOneRank (MODEL.md section 4): cp 2 and 4, alone and with
//    dp, ep, etp, tp (with and without sequence parallelism), pp and ZeRO; learned positions and
//    RoPE with grouped-query attention; jitter, a random second expert and a shared
//    expert: 8 steps against one rank on the same global batch, per-step losses within
//    1e-5 and weights within 1e-4 (the ring's merges reorder the softmax sums, so not bit
//    for bit). The MoE layers route the whole micro-batch over cp x tp (moe/group_routing.h's
//    GroupLayout), so capacity drops, aux and z are the one-rank ones.
//  - ContextParallelCheckpointMovesBetweenLayouts: saved under cp 2 (x dp 2 on 4 ranks),
//    resumed under cp 4 and under one rank: the next losses equal an uninterrupted one-rank
//    run's.
#include <gtest/gtest.h>

#include <string>
#include <utility>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/train/trainer.h"
#include "tests/dist/layout_matrix.h"
#include "tests/dist/train_fixture.h"

namespace switchyard::train {
namespace {

using testing::ExpectLayoutsMatchOneRank;
using testing::kGlobalMicroBatches;
using testing::Layout;
using testing::QuietStdout;
using testing::RelErr;

class ContextParallelTest : public testing::TrainFixture {};

std::vector<Layout> ContextParallelLayouts() {
  const std::vector<std::string> four_heads = {"model.n_heads=4"};
  // RoPE (rotated at each chunk's global positions) and 4 query heads on 2 kv heads.
  const std::vector<std::string> mixtral = {
      "model.norm=rmsnorm", "model.position=rope", "model.n_heads=4", "model.n_kv_heads=2",
      "model.activation=swiglu", "model.bias=false", "moe.activation=swiglu", "moe.top_k=2",
      "moe.normalize_gates=true", "model.tie_embeddings=false"};
  // A random second expert keyed by the global token, expert biases, a shared expert.
  const std::vector<std::string> gshard = {"moe.top_k=2", "moe.second_expert_policy=random",
                                           "moe.num_shared_experts=1", "moe.bias=true"};
  const std::vector<std::string> four_layers = {"model.n_layers=4", "moe.layer_freq=2"};
  // Heads narrower than d / n_heads (model.head_dim): q is 4 x 6 = 24 wide on d 32.
  std::vector<std::string> narrow_heads = mixtral;
  narrow_heads.push_back("model.head_dim=6");
  return {
      {"cp2", 2, 1, {}, {"parallel.cp=2"}},
      {"cp2_mixtral", 2, 1, mixtral, {"parallel.cp=2"}},
      {"cp2_narrow_heads", 2, 1, narrow_heads, {"parallel.cp=2"}},
      {"cp2_gshard_shared", 2, 1, gshard, {"parallel.cp=2"}},
      {"cp4", 4, 1, {}, {"parallel.cp=4"}},
      {"cp4_mixtral", 4, 1, mixtral, {"parallel.cp=4"}},
      {"cp2_dp2_ep2", 4, 2, {}, {"parallel.cp=2", "parallel.ep=2"}},
      {"cp2_tp2", 4, 1, four_heads, {"parallel.cp=2", "parallel.tp=2"}},
      {"cp2_tp2_no_sp", 4, 1, four_heads,
       {"parallel.cp=2", "parallel.tp=2", "parallel.sequence_parallel=false"}},
      {"cp2_pp2", 4, 1, four_layers, {"parallel.cp=2", "parallel.pp=2"}},
      {"cp2_dp2_zero1", 4, 2, {}, {"parallel.cp=2", "parallel.zero_stage=1"}},
      {"cp2_dp2_etp2", 4, 2, {}, {"parallel.cp=2", "parallel.etp=2"}},
      {"cp2_ep4", 8, 4, {}, {"parallel.cp=2", "parallel.ep=4"}},
      {"cp2_tp2_ep2", 8, 2, four_heads,
       {"parallel.cp=2", "parallel.tp=2", "parallel.etp=1", "parallel.ep=2"}},
      {"cp4_dp2_ep2_zero3", 8, 2, mixtral, {"parallel.cp=4", "parallel.ep=2", "parallel.zero_stage=3"}},
  };
}

TEST_F(ContextParallelTest, ContextParallelLayoutsMatchOneRank) {
  ExpectLayoutsMatchOneRank(ContextParallelLayouts(), "cp_", *world_, R());
}

// A checkpoint saved under cp 2 (x dp 2) resumes under cp 4 and under one rank: the
// parameters and optimizer state do not depend on cp, so the resumed losses are an
// uninterrupted one-rank run's.
TEST_F(ContextParallelTest, ContextParallelCheckpointMovesBetweenLayouts) {
  if (R() != 4) GTEST_SKIP() << "saves under (cp 2, dp 2): needs 4 ranks";
  constexpr int64_t kTotal = 6, kFirst = 3;
  std::unique_ptr<Trainer> ref =
      TrainReference({}, dir("cpck_ref"), kTotal, kGlobalMicroBatches);
  const std::vector<double> want = ref ? ref->losses() : std::vector<double>{};
  auto with = [&](std::vector<std::string> o) {
    o.push_back("train.max_steps=" + std::to_string(kTotal));
    return TinyConfig(o);
  };
  const std::string saved = dir("cpck_cp2");
  {
    auto t = Train(with({"parallel.cp=2", "train.grad_accum=2"}), saved, *world_, kFirst);
    ASSERT_TRUE(t.ok()) << t.status();
  }
  std::vector<double> cp4 = ResumeLosses(with({"parallel.cp=4", "train.grad_accum=4"}), saved,
                                         dir("cpck_cp4"), *world_);
  std::vector<double> one;
  if (is_root()) {
    auto local = dist::MakeLocalCommunicator(Device::Cpu(), 0);
    one = ResumeLosses(with({"train.grad_accum=4"}), saved, dir("cpck_one"), *local);
  }
  if (is_root()) {
    ASSERT_EQ(want.size(), static_cast<size_t>(kTotal));
    ExpectResumedLossesMatch({{"cp 4", cp4}, {"one rank", one}}, want, kFirst);
  }
  world_->Barrier();
}

}  // namespace
}  // namespace switchyard::train
