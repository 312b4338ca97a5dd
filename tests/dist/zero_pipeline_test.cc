// ZeRO stages 1-3 under pipeline parallelism (docs/pipeline.md, "ZeRO under pipeline
// parallelism"), end to end under mpirun with 2, 4 and 8 ranks on the tiny MoE decoder of
// tests/data/train-tiny.yaml, a global batch of 8 micro-batches of 4 sequences:
//
//  - StagesMatchStageZeroAndOneRank: per layout (pp 2 with 1F1B, GPipe and interleaved 1F1B,
//    tied and untied embeddings; pp 2 with dp, ep and tp; pp 4 x dp 2 interleaved), stages
//    0-3 train 5 steps. Stages 1-3 give stage 0's losses and every rank's parameter boxes
//    bit for bit, and the saved optimizer state assembled whole is stage 0's bit for bit;
//    every stage equals the one-rank reference as every layout does (layout_matrix.h:
//    losses within 1e-5, weights, saved model and optimizer state within 1e-4). With
//    train.ordered_grad_accum=true, and on one layout per world false (stage 1 then reduces
//    once after the schedule, stages 2-3 per bucket during the last backward). Each rank's
//    model-state bytes (the allocator's ledger) are within 5% of the dry-run's prediction,
//    and (dp <= 2) the validation losses logged after steps 2, 4 and 5 are stage 0's bit
//    for bit.
//  - CheckpointMovesBetweenPipelineAndZeroLayouts: 3 steps saved under a (pp, zero) layout
//    are resumed under others (pp 1 <-> pp 2 <-> pp 4, interleaved, zero 1 <-> zero 3, and
//    one rank); the resumed losses of steps 3-5 equal an uninterrupted one-rank run's
//    within 1e-5.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include "engine/checkpoint/checkpoint.h"
#include "engine/plan/dry_run.h"
#include "tests/dist/layout_matrix.h"
#include "tests/dist/train_fixture.h"

namespace switchyard::train {
namespace {

using testing::CompareWithReference;
using testing::Distance;

constexpr int64_t kMicroBatches = 8;
constexpr int64_t kSteps = 5;

struct ZeroPipelineLayout {
  std::string name;
  int world;
  int dp;
  std::vector<std::string> model;     // the reference uses them too
  std::vector<std::string> parallel;  // parallel.* overrides
  bool ordered = true;                // train.ordered_grad_accum
};

std::vector<ZeroPipelineLayout> Layouts() {
  const std::vector<std::string> four = {"model.n_layers=4", "moe.layer_freq=2"};
  const std::vector<std::string> interleaved = {"parallel.pipeline_schedule=interleaved",
                                                "parallel.virtual_stages=2"};
  auto with = [](std::vector<std::string> a, const std::vector<std::string>& b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
  };
  return {
      {"pp2_1f1b", 2, 1, {}, {"parallel.pp=2"}},
      {"pp2_gpipe_untied", 2, 1, {"model.tie_embeddings=false"},
       {"parallel.pp=2", "parallel.pipeline_schedule=gpipe"}},
      {"pp2_interleaved_v2", 2, 1, four, with({"parallel.pp=2"}, interleaved)},
      {"pp2_1f1b_unordered", 2, 1, {}, {"parallel.pp=2"}, false},
      {"pp2_dp2_ep2", 4, 2, {}, {"parallel.pp=2", "parallel.ep=2"}},
      {"pp2_dp2_ep2_interleaved_v2", 4, 2, four, with({"parallel.pp=2", "parallel.ep=2"}, interleaved)},
      {"pp2_tp2", 4, 1, {"model.n_heads=4"}, {"parallel.pp=2", "parallel.tp=2"}},
      {"pp2_dp2_ep2_gpipe_unordered", 4, 2, {},
       {"parallel.pp=2", "parallel.ep=2", "parallel.pipeline_schedule=gpipe"}, false},
      {"pp2_tp2_dp2_ep2", 8, 2, {"model.n_heads=4"},
       {"parallel.pp=2", "parallel.tp=2", "parallel.etp=1", "parallel.ep=2"}},
      {"pp2_dp4_ep4", 8, 4, {}, {"parallel.pp=2", "parallel.ep=4"}},
      {"pp4_dp2_interleaved_v2", 8, 2, {"model.n_layers=8", "moe.layer_freq=2"},
       with({"parallel.pp=4"}, interleaved)},
      {"pp2_dp4_ep2_unordered", 8, 4, four, {"parallel.pp=2", "parallel.ep=2"}, false},
  };
}

class ZeroPipelineTest : public testing::TrainFixture {};

// Host copies of this rank's parameter boxes (stage 3: gathered first).
std::map<std::string, Tensor> Snapshot(Trainer& trainer) {
  trainer.zero().AcquireAll();
  std::map<std::string, Tensor> out;
  for (const parallel::Parameter& p : trainer.registry().params()) out[p.name] = p.value.Clone();
  trainer.zero().ReleaseAll();
  return out;
}

bool SameBits(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.nbytes() == b.nbytes() &&
         std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0;
}

// The validation losses a run logged (metrics.jsonl's "val_loss" records), in order.
std::vector<double> ValLosses(const std::string& out) {
  std::vector<double> losses;
  std::ifstream in(out + "/metrics.jsonl");
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json j = nlohmann::json::parse(line);
    if (j.contains("val_loss")) losses.push_back(j["val_loss"].get<double>());
  }
  return losses;
}

// The model-state bytes this rank holds against the dry-run's prediction for it.
void ExpectMemoryAsPredicted(Trainer& t, const config::Config& config, int world, int rank) {
  const Trainer::Memory m = t.memory();
  auto mesh = dist::Mesh::Create(world, config.parallel.MeshSizes(), config.parallel.order);
  ASSERT_TRUE(mesh.ok()) << mesh.status();
  const plan::RankMemory predicted = plan::PredictRankMemory(config, *mesh, rank);
  EXPECT_NEAR(m.parameters, predicted.parameters, 0.05 * predicted.parameters) << "rank " << rank;
  EXPECT_NEAR(m.gradients, predicted.gradients, 0.05 * predicted.gradients) << "rank " << rank;
  EXPECT_NEAR(m.optimizer, predicted.optimizer, 0.05 * predicted.optimizer) << "rank " << rank;
}

TEST_F(ZeroPipelineTest, StagesMatchStageZeroAndOneRank) {
  constexpr double kLossTol = 1e-5;
  constexpr double kWeightTol = 1e-4;
  int ran = 0;
  for (const ZeroPipelineLayout& layout : Layouts()) {
    if (layout.world != R()) continue;
    ++ran;
    SCOPED_TRACE(layout.name);
    const std::string ref_dir = dir("zpref_" + layout.name);
    std::vector<double> ref_losses;
    if (std::unique_ptr<Trainer> ref = TrainReference(layout.model, ref_dir, kSteps, kMicroBatches)) {
      ref_losses = ref->losses();
    }
    world_->Barrier();
    const std::string ref_ckpt = ref_dir + "/" + checkpoint::StepDirName(kSteps);

    std::vector<std::string> overrides = layout.model;
    overrides.insert(overrides.end(), layout.parallel.begin(), layout.parallel.end());
    overrides.push_back("train.max_steps=" + std::to_string(kSteps));
    overrides.push_back("train.grad_accum=" + std::to_string(kMicroBatches / layout.dp));
    overrides.push_back(std::string("train.ordered_grad_accum=") + (layout.ordered ? "true" : "false"));
    // Validation after steps 2 and 4 and the last: under ZeRO-3 it gathers each part as
    // training's forward does. (The corpus's validation split holds 14 sequences: one batch
    // of 4 per data-parallel rank needs dp <= 2.)
    const bool validate = layout.dp <= 2;
    if (validate) {
      overrides.push_back("train.eval_every=2");
      overrides.push_back("train.eval_batches=2");
    }
    std::vector<double> stage0_losses;
    std::map<std::string, Tensor> stage0;
    std::string stage0_ckpt;
    std::vector<double> stage0_val;  // on the root
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE("zero_stage " + std::to_string(stage));
      std::vector<std::string> o = overrides;
      o.push_back("parallel.zero_stage=" + std::to_string(stage));
      const config::Config config = TinyConfig(o);
      const std::string out = dir("zp" + std::to_string(stage) + "_" + layout.name);
      auto trainer = Train(config, out, *world_);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      Trainer& t = **trainer;
      ExpectMemoryAsPredicted(t, config, R(), world_->rank());
      const Distance d = CompareWithReference(t, out, ref_ckpt, ref_losses, kSteps, kLossTol,
                                              kWeightTol, *world_);
      const std::string ckpt = out + "/" + checkpoint::StepDirName(kSteps);
      std::map<std::string, Tensor> mine = Snapshot(t);
      bool identical = true;
      if (stage == 0) {
        stage0 = mine;
        stage0_losses = t.losses();
        stage0_ckpt = ckpt;
        if (is_root()) stage0_val = ValLosses(out);
      } else {
        EXPECT_EQ(t.losses(), stage0_losses);
        identical = t.losses() == stage0_losses;
        if (is_root()) {
          const std::vector<double> val = ValLosses(out);
          EXPECT_EQ(val.size(), validate ? 3u : 0u);  // after steps 2 and 4, and the last
          EXPECT_EQ(val, stage0_val);
          identical = identical && val == stage0_val;
        }
        for (const auto& [name, value] : mine) {
          const bool same = SameBits(value, stage0.at(name));
          identical = identical && same;
          EXPECT_TRUE(same) << "rank " << world_->rank() << ": " << name << " differs from stage 0";
        }
        if (is_root()) {  // the optimizer state as saved, whole
          auto want = checkpoint::ReadWholeTensors(stage0_ckpt, /*optimizer=*/true);
          auto got = checkpoint::ReadWholeTensors(ckpt, /*optimizer=*/true);
          ASSERT_TRUE(want.ok() && got.ok());
          ASSERT_EQ(got->size(), want->size());
          for (const auto& [name, w] : *want) {
            ASSERT_TRUE(got->count(name)) << name;
            const bool same = SameBits(got->at(name), w);
            identical = identical && same;
            EXPECT_TRUE(same) << "saved optimizer state " << name << " differs from stage 0";
          }
        }
      }
      if (is_root()) {
        std::printf("[ info     ] %s zero %d: vs stage 0 %s; vs 1 rank: losses %.2e, weights "
                    "%.2e, checkpoint %.2e\n",
                    layout.name.c_str(), stage,
                    stage == 0 ? "-" : identical ? "bit-identical" : "DIFFERENT", d.loss,
                    d.weights, d.saved);
        std::fflush(stdout);
      }
      world_->Barrier();
    }
  }
  if (ran == 0) GTEST_SKIP() << "no layout of the table runs on " << R() << " ranks";
}

// A save under one (pp, zero) layout and the layouts it resumes under.
struct Move {
  std::string name;
  std::vector<std::string> saved;                 // parallel/train overrides of the save
  std::vector<std::pair<std::string, std::vector<std::string>>> resumed;
};

std::vector<Move> Moves(int world) {
  switch (world) {
    case 2:
      return {{"pp2_zero3", {"parallel.pp=2", "parallel.zero_stage=3", "train.grad_accum=4"},
               {{"dp 2, zero 1", {"parallel.zero_stage=1", "train.grad_accum=2"}},
                {"pp 2 interleaved, zero 2",
                 {"parallel.pp=2", "parallel.pipeline_schedule=interleaved",
                  "parallel.virtual_stages=2", "parallel.zero_stage=2", "train.grad_accum=4"}}}},
              {"dp2_zero2", {"parallel.zero_stage=2", "train.grad_accum=2"},
               {{"pp 2 gpipe, zero 3",
                 {"parallel.pp=2", "parallel.pipeline_schedule=gpipe", "parallel.zero_stage=3",
                  "train.grad_accum=4"}}}}};
    case 4:
      return {{"pp2_dp2_ep2_zero1",
               {"parallel.pp=2", "parallel.ep=2", "parallel.zero_stage=1", "train.grad_accum=2"},
               {{"pp 1, dp 4, ep 2, zero 3",
                 {"parallel.ep=2", "parallel.zero_stage=3", "train.grad_accum=1"}},
                {"pp 4, zero 2", {"parallel.pp=4", "parallel.zero_stage=2", "train.grad_accum=4"}}}},
              {"dp4_zero3", {"parallel.zero_stage=3", "train.grad_accum=1"},
               {{"pp 2, dp 2, interleaved, zero 1",
                 {"parallel.pp=2", "parallel.pipeline_schedule=interleaved",
                  "parallel.virtual_stages=2", "parallel.zero_stage=1", "train.grad_accum=2"}},
                {"pp 4, zero 3", {"parallel.pp=4", "parallel.zero_stage=3", "train.grad_accum=4"}}}}};
    case 8:
      return {{"pp2_dp4_ep4_zero3",
               {"parallel.pp=2", "parallel.ep=4", "parallel.zero_stage=3", "train.grad_accum=1"},
               {{"pp 4, dp 2, ep 2, zero 1",
                 {"parallel.pp=4", "parallel.ep=2", "parallel.zero_stage=1", "train.grad_accum=2"}}}}};
    default:
      return {};
  }
}

TEST_F(ZeroPipelineTest, CheckpointMovesBetweenPipelineAndZeroLayouts) {
  const std::vector<Move> moves = Moves(R());
  if (moves.empty()) GTEST_SKIP() << "no move of the table runs on " << R() << " ranks";
  constexpr int64_t kTotal = 6, kFirst = 3;
  const std::vector<std::string> model = {"model.n_layers=4", "moe.layer_freq=2"};
  const int64_t global = 4;  // micro-batches of the global batch
  std::vector<double> want;
  if (std::unique_ptr<Trainer> ref = TrainReference(model, dir("zpck_ref"), kTotal, global)) {
    want = ref->losses();
  }
  auto with = [&](std::vector<std::string> o) {
    o.insert(o.end(), model.begin(), model.end());
    o.push_back("train.max_steps=" + std::to_string(kTotal));
    o.push_back("train.ordered_grad_accum=true");
    return TinyConfig(o);
  };
  for (const Move& move : moves) {
    SCOPED_TRACE(move.name);
    const std::string saved = dir("zpck_" + move.name);
    {
      auto t = Train(with(move.saved), saved, *world_, kFirst);
      ASSERT_TRUE(t.ok()) << t.status();
    }
    std::vector<std::pair<std::string, std::vector<double>>> runs;
    int k = 0;
    for (const auto& [what, o] : move.resumed) {
      runs.push_back({what, ResumeLosses(with(o), saved,
                                         dir("zpck_" + move.name + "_" + std::to_string(k++)),
                                         *world_)});
    }
    if (is_root()) {
      auto local = dist::MakeLocalCommunicator(Device::Cpu(), 0);
      runs.push_back({"one rank", ResumeLosses(with({"train.grad_accum=4"}), saved,
                                               dir("zpck_" + move.name + "_one"), *local)});
      ExpectResumedLossesMatch(runs, want, kFirst);
    }
    world_->Barrier();
  }
}

}  // namespace
}  // namespace switchyard::train
