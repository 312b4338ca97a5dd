// Hot-expert replication in training (moe.replicate_hot_experts), on 2, 4 and 8 ranks with
// ep = world and no aux loss (the routing is left to skew): replication = no replication.
//
// The same layout trains 6 steps without and with replicas (re-planned every 2 steps from
// the world's counts): the per-step losses within MODEL.md section 4's 1e-5, every rank's
// parameter boxes and the saved model and optimizer state within 1e-4 in relative norm (the
// layout matrices' bounds: replicas change only the order in which an expert's per-row
// gradient terms are summed, as ep does). The replicated run's checkpoint holds exactly the
// unreplicated run's tensors (no replica), and an unreplicated trainer resumed from it
// continues with the unreplicated run's losses.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "engine/checkpoint/step_dir.h"
#include "tests/dist/layout_matrix.h"
#include "tests/dist/train_fixture.h"

namespace switchyard::train::testing {
namespace {

class ReplicationTrainTest : public TrainFixture {};

constexpr int64_t kSteps = 6, kSaved = 3;

std::vector<std::string> Common() {
  return {"parallel.ep=" + std::to_string(TrainFixture::R()), "moe.aux_loss_coef=0",
          "train.grad_accum=1", "train.max_steps=" + std::to_string(kSteps),
          "train.checkpoint_every=" + std::to_string(kSaved)};
}

TEST_F(ReplicationTrainTest, EqualsNoReplication) {
  if (R() < 2) GTEST_SKIP() << "replicas need ep > 1";
  const std::string plain_dir = dir("plain"), rep_dir = dir("replicated");
  auto plain = Train(TinyConfig(Common()), plain_dir, *world_);
  ASSERT_TRUE(plain.ok()) << plain.status();
  std::vector<std::string> with = Common();
  with.push_back("moe.replicate_hot_experts=2");
  with.push_back("moe.replicate_every=2");
  auto rep = Train(TinyConfig(with), rep_dir, *world_);
  ASSERT_TRUE(rep.ok()) << rep.status();

  // Replicas were planned (the last plan, from steps 5 and 6; the same on every rank).
  int replicated_layers = 0;
  for (moe::MoELayer* layer : (*rep)->decoder().moe_layers()) {
    if (is_root()) std::printf("[ info     ] layer %lld plan: %s\n",
                               static_cast<long long>(layer->layer_id()),
                               layer->replica_plan().ToString().c_str());
    if (!layer->replica_plan().empty()) ++replicated_layers;
  }
  EXPECT_GT(replicated_layers, 0) << "the skewed routing is meant to need replicas";

  const std::string plain_ckpt = plain_dir + "/" + checkpoint::StepDirName(kSteps);
  const Distance d = CompareWithReference(**rep, rep_dir, plain_ckpt, (*plain)->losses(), kSteps,
                                          /*loss_tol=*/1e-5, /*weight_tol=*/1e-4, *world_);
  if (is_root()) {
    std::printf("[ info     ] ep %d: max rel diff vs no replication: loss %.2e, weights %.2e, "
                "checkpoint %.2e\n", R(), d.loss, d.weights, d.saved);
  }

  // The replicated run's checkpoint resumes unreplicated: the losses of the plain run.
  const std::vector<double> resumed =
      ResumeLosses(TinyConfig(Common()), rep_dir + "/" + checkpoint::StepDirName(kSaved),
                   dir("resumed"), *world_);
  if (is_root()) {
    ExpectResumedLossesMatch({{"unreplicated, resumed from the replicated run", resumed}},
                             (*plain)->losses(), kSaved);
  }
  world_->Barrier();
}

}  // namespace
}  // namespace switchyard::train::testing
