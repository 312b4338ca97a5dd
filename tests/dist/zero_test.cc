// ZeRO stages 1-3 (engine/parallel/zero.h) end to end under mpirun with 2, 4 and 8 ranks,
// on the tiny MoE decoder of tests/data/train-tiny.yaml with a global batch of 8
// micro-batches of 4 sequences (grad_accum = 8 / dp: 4, 2 or 1):
//
//  - StagesMatchStageZeroAndOneRank: per layout (dp with ep 2 and 4, grad_accum 2 and 4,
//    combined with tp 2), stages 1, 2 and 3 train 6 steps; losses and every rank's
//    parameter boxes equal stage 0 on the same layout bit for bit, and one rank (the
//    reference) within MODEL.md section 4's tolerance. The model-state bytes each rank
//    holds (the allocator's ledger) are within 5% of the dry-run's prediction and of the
//    ZeRO paper's formulas (stage 1: 8P + 8P/N, 2: 4P + 12P/N, 3: 16P/N, P split into the
//    dense part with N = dp x cp and the expert part with N = edp).
//  - StreamedAccumulationMatchesOneRank: on 4 ranks (dp 4, ep 2, grad_accum 2, in-place
//    accumulation), stages 2 and 3 stream the gradients into the shard; losses equal one
//    rank's within 1e-5.
//  - ZeroTokenExpertsTakePartAndGetZeroGradients: on 4 and 8 ranks, an expert bias of 10
//    sends every token to expert 0; the other experts (every expert of the ep ranks but the
//    first) receive nothing in any step. Stages 2 and 3 finish, their gradient shards are
//    exactly zero and their weights are AdamW's with a zero gradient (decay only), bit for
//    bit.
//  - CheckpointMovesBetweenStagesAndLayouts: on 4 ranks, 3 steps saved under (dp 4, zero 3,
//    ep 2), where each rank's model and optimizer files hold its own shards, then resumed
//    under (dp 2, ep 2, zero 1), (tp 2, dp 2, ep 2, zero 2) and one rank; 3 steps saved
//    under (tp 2, dp 2, zero 1) and by one rank, resumed under zero 3 with ep 4 and ep 2.
//    Every resumed run's losses of steps 3-5 (which need the Adam moments back) equal an
//    uninterrupted one-rank run's within 1e-5.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/save_plan.h"
#include "engine/plan/dry_run.h"
#include "engine/train/schedule.h"
#include "tests/dist/train_fixture.h"

namespace switchyard::train {
namespace {

using testing::QuietStdout;
using testing::RelErr;

constexpr int64_t kMicroBatches = 8;
constexpr int64_t kSteps = 6;

struct ZeroLayout {
  std::string name;
  int world;
  int dp;
  std::vector<std::string> parallel;
};

std::vector<ZeroLayout> Layouts() {
  return {
      {"dp2", 2, 2, {}},
      {"dp2_ep2", 2, 2, {"parallel.ep=2"}},
      {"dp4_ep2", 4, 4, {"parallel.ep=2"}},
      {"dp4_ep4", 4, 4, {"parallel.ep=4"}},
      {"tp2_dp2_ep2", 4, 2, {"parallel.tp=2", "parallel.etp=1", "parallel.ep=2"}},
      {"dp8_ep4", 8, 8, {"parallel.ep=4"}},
      {"tp2_dp4_ep4", 8, 4, {"parallel.tp=2", "parallel.etp=1", "parallel.ep=4"}},
  };
}

class ZeroTest : public testing::TrainFixture {};

// Host copies of every parameter box (stage 3: gathered first).
std::map<std::string, Tensor> Snapshot(Trainer& trainer) {
  trainer.zero().AcquireAll();
  std::map<std::string, Tensor> out;
  for (const parallel::Parameter& p : trainer.decoder().registry().params())
    out[p.name] = p.value.Clone();
  trainer.zero().ReleaseAll();
  return out;
}

// ||a - b|| / ||b||; 0 only when bitwise equal.
double RelNorm(const Tensor& a, const Tensor& b) {
  if (a.numel() != b.numel()) return INFINITY;
  if (std::memcmp(a.raw_data(), b.raw_data(), a.nbytes()) == 0) return 0.0;
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  double d2 = 0, y2 = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    d2 += (double(x[i]) - y[i]) * (double(x[i]) - y[i]);
    y2 += double(y[i]) * y[i];
  }
  return std::max(std::sqrt(d2 / std::max(y2, 1e-60)), 1e-300);
}

// The ZeRO paper's model-state bytes for this rank's parameters (f32: 4 bytes of weights,
// 4 of gradients, 8 of AdamW state per parameter).
double PaperBytes(int stage, double dense, double n_dense, double expert, double n_expert) {
  auto one = [stage](double p, double n) {
    switch (stage) {
      case 0: return 16 * p;
      case 1: return 8 * p + 8 * p / n;
      case 2: return 4 * p + 12 * p / n;
      default: return 16 * p / n;
    }
  };
  return one(dense, n_dense) + one(expert, n_expert);
}

TEST_F(ZeroTest, StagesMatchStageZeroAndOneRank) {
  constexpr double kLossTol = 1e-5;
  constexpr double kWeightTol = 1e-4;
  int ran = 0;
  for (const ZeroLayout& layout : Layouts()) {
    if (layout.world != R()) continue;
    ++ran;
    SCOPED_TRACE(layout.name);
    // The one-rank reference: its losses and whole tensors on rank 0 (the tensors broadcast
    // below). The trainer goes at once: the memory ledger then counts one trainer's states.
    std::vector<double> ref_losses;
    std::map<std::string, Tensor> ref_weights;
    if (std::unique_ptr<Trainer> ref =
            TrainReference({}, dir("zref_" + layout.name), kSteps, kMicroBatches)) {
      ref_losses = ref->losses();
      ref_weights = Snapshot(*ref);
    }

    std::vector<std::string> overrides = layout.parallel;
    // Bit for bit against stage 0 with several micro-batches: the ordered accumulation
    // (in place, stages 2-3 add each micro-batch's reduce-scattered sum into the shard).
    overrides.push_back("train.ordered_grad_accum=true");
    overrides.push_back("train.max_steps=" + std::to_string(kSteps));
    overrides.push_back("train.grad_accum=" + std::to_string(kMicroBatches / layout.dp));
    std::vector<double> stage0_losses;
    std::map<std::string, Tensor> stage0;
    for (int stage = 0; stage <= 3; ++stage) {
      SCOPED_TRACE("zero_stage " + std::to_string(stage));
      std::vector<std::string> o = overrides;
      o.push_back("parallel.zero_stage=" + std::to_string(stage));
      const config::Config config = TinyConfig(o);
      auto trainer = Train(config, dir("z" + std::to_string(stage) + "_" + layout.name), *world_);
      ASSERT_TRUE(trainer.ok()) << trainer.status();
      Trainer& t = **trainer;

      // Memory: measured (ledger) against the dry-run and the paper, while this trainer is
      // the only one holding model states on this rank.
      const Trainer::Memory m = t.memory();
      auto mesh = dist::Mesh::Create(R(), config.parallel.MeshSizes(), config.parallel.order);
      ASSERT_TRUE(mesh.ok());
      const plan::RankMemory predicted = plan::PredictRankMemory(config, *mesh, world_->rank());
      const plan::RankParams held = plan::EstimateRankParams(config, *mesh, world_->rank());
      const double paper = PaperBytes(stage, double(held.dense + held.replicated),
                                      double(mesh->dp()) * mesh->cp(), double(held.expert),
                                      mesh->edp());
      EXPECT_NEAR(m.parameters, predicted.parameters, 0.05 * predicted.parameters);
      EXPECT_NEAR(m.gradients, predicted.gradients, 0.05 * predicted.gradients);
      EXPECT_NEAR(m.optimizer, predicted.optimizer, 0.05 * predicted.optimizer);
      EXPECT_NEAR(m.model_states(), paper, 0.05 * paper);

      std::map<std::string, Tensor> mine = Snapshot(t);
      double worst_vs0 = 0;
      if (stage == 0) {
        stage0 = mine;
        stage0_losses = t.losses();
      } else {
        ASSERT_EQ(t.losses().size(), stage0_losses.size());
        for (size_t s = 0; s < stage0_losses.size(); ++s) {
          EXPECT_EQ(t.losses()[s], stage0_losses[s]) << "step " << s;
        }
        for (const auto& [name, value] : mine) {
          const double rel = RelNorm(value, stage0.at(name));
          worst_vs0 = std::max(worst_vs0, rel);
          EXPECT_EQ(rel, 0.0) << "rank " << world_->rank() << ": " << name << " differs from stage 0";
        }
      }
      // Against one rank: the reference's whole tensors, broadcast in registry order.
      double worst_vs1 = 0;
      for (const parallel::Parameter& p : t.decoder().registry().params()) {
        Tensor whole = is_root() ? ref_weights.at(p.name) : Tensor::Empty(p.global_shape, DType::kF32);
        world_->Broadcast(whole, 0);
        if (p.name.size() >= 11 && p.name.compare(p.name.size() - 11, 11, "attn.k.bias") == 0) {
          continue;  // zero gradient: rounding noise that Adam normalises (trainer_test.cc)
        }
        Tensor box = Tensor::Empty(p.value.shape(), DType::kF32);
        checkpoint::CopyBox(whole, box, p.offset, /*paste=*/false);
        const double rel = RelNorm(mine.at(p.name), box);
        worst_vs1 = std::max(worst_vs1, rel);
        EXPECT_LE(rel, kWeightTol) << "rank " << world_->rank() << ": " << p.Describe();
      }
      if (is_root()) {
        double loss_vs1 = 0;
        for (size_t s = 0; s < ref_losses.size() && s < t.losses().size(); ++s)
          loss_vs1 = std::max(loss_vs1, RelErr(t.losses()[s], ref_losses[s]));
        EXPECT_LE(loss_vs1, kLossTol);
        std::printf("[ info     ] %s zero %d: vs stage 0 %s; vs 1 rank: losses %.2e, weights "
                    "%.2e; model states %lld B (dry-run %.0f, paper %.0f), workspace peak %lld B\n",
                    layout.name.c_str(), stage,
                    stage == 0 ? "-" : worst_vs0 == 0 ? "bit-identical" : "DIFFERENT", loss_vs1,
                    worst_vs1, static_cast<long long>(m.model_states()), predicted.model_states(),
                    paper, static_cast<long long>(m.workspace_peak));
        std::fflush(stdout);
      }
      world_->Barrier();
    }
  }
  if (ran == 0) GTEST_SKIP() << "no layout of the table runs on " << R() << " ranks";
}

// In-place accumulation (the default): stages 2 and 3 stream each micro-batch's gradient
// buckets into the shard, so no full gradient exists; the sums are the same terms in
// another order, so against one rank the losses agree within MODEL.md section 4's 1e-5.
TEST_F(ZeroTest, StreamedAccumulationMatchesOneRank) {
  if (R() != 4) GTEST_SKIP() << "dp 4 with ep 2: needs 4 ranks";
  std::vector<double> want;
  if (std::unique_ptr<Trainer> ref = TrainReference({}, dir("stream_ref"), kSteps, kMicroBatches))
    want = ref->losses();
  for (int stage : {2, 3}) {
    SCOPED_TRACE(StrCat("zero_stage ", stage));
    auto trainer = Train(TinyConfig({"parallel.ep=2", StrCat("parallel.zero_stage=", stage),
                                     "train.ordered_grad_accum=false",
                                     StrCat("train.grad_accum=", kMicroBatches / R()),
                                     StrCat("train.max_steps=", kSteps)}),
                         dir(StrCat("stream", stage)), *world_);
    ASSERT_TRUE(trainer.ok()) << trainer.status();
    if (is_root()) {
      ASSERT_EQ((*trainer)->losses().size(), want.size());
      for (size_t s = 0; s < want.size(); ++s)
        EXPECT_LE(RelErr((*trainer)->losses()[s], want[s]), 1e-5) << "step " << s;
    }
    world_->Barrier();
  }
}

TEST_F(ZeroTest, ZeroTokenExpertsTakePartAndGetZeroGradients) {
  if (R() < 4) GTEST_SKIP() << "needs 4 or 8 ranks (ep 2 or 4 with edp 2)";
  constexpr int64_t kSkewSteps = 3;
  const int ep = R() / 2;  // edp 2: the experts are sharded by ZeRO too
  for (int stage : {2, 3}) {
    SCOPED_TRACE("zero_stage " + std::to_string(stage));
    const config::Config config = TinyConfig(
        {"parallel.ep=" + std::to_string(ep), "parallel.zero_stage=" + std::to_string(stage),
         "train.grad_accum=" + std::to_string(kMicroBatches / R()), "moe.capacity_factor=0",
         "moe.expert_bias_rate=1e-9", "train.max_steps=" + std::to_string(kSkewSteps)});
    std::unique_ptr<Trainer> trainer, initial;
    {
      QuietStdout quiet;
      auto t = Trainer::Create(config, dir("skew" + std::to_string(stage)), *world_);
      ASSERT_TRUE(t.ok()) << t.status();
      trainer = std::move(*t);
      auto i = Trainer::Create(config, dir("skew_init" + std::to_string(stage)), *world_);
      ASSERT_TRUE(i.ok()) << i.status();
      initial = std::move(*i);
    }
    for (moe::MoELayer* m : trainer->decoder().moe_layers()) {
      float* bias = m->expert_bias().data<float>();
      for (int64_t e = 0; e < config.moe.num_experts; ++e) bias[e] = e == 0 ? 10.0f : 0.0f;
    }
    {
      QuietStdout quiet;
      ASSERT_TRUE(trainer->Run(0).ok());
    }
    std::map<std::string, Tensor> start = Snapshot(*initial);
    std::map<std::string, Tensor> end = Snapshot(*trainer);
    // AdamW with a zero gradient: p <- p * (1 - lr_t * wd) (kernels/optimizer.h's scalars).
    std::vector<float> decays;
    for (int64_t s = 0; s < kSkewSteps; ++s) {
      const double lr = train::ScheduleFor(config.train).LrAt(s);
      decays.push_back(static_cast<float>(1.0 - lr * config.train.weight_decay));
    }
    const auto& params = trainer->decoder().registry().params();
    int64_t idle_elements = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const parallel::Parameter& p = params[i];
      if (!p.trainable || p.view != dist::View::kExpert) continue;
      const int64_t local = p.value.dim(0), per_expert = p.value.numel() / local;
      // The gradient shard: zero for every element of an expert other than 0.
      const Tensor grad = trainer->zero().OwnedGrad(i).Clone();
      for (int64_t k = 0; k < grad.numel(); ++k) {
        const int64_t expert = p.OffsetAt(0) + (p.flat_begin + k) / per_expert;
        if (expert != 0) {
          ASSERT_EQ(grad.data<float>()[k], 0.0f) << p.name << " expert " << expert;
          ++idle_elements;
        }
      }
      // The weights of the idle experts: decay only, bit for bit.
      const float* before = start.at(p.name).data<float>();
      const float* after = end.at(p.name).data<float>();
      for (int64_t k = 0; k < p.value.numel(); ++k) {
        if (p.OffsetAt(0) + k / per_expert == 0) continue;
        float want = before[k];
        if (p.weight_decay)
          for (float d : decays) want = want * d;
        ASSERT_EQ(after[k], want) << p.name << " element " << k;
      }
    }
    Tensor count = Tensor::FromVector<int64_t>({idle_elements}, {1});
    world_->AllReduce(count, dist::ReduceOp::kSum);
    EXPECT_GT(count.ToVector<int64_t>()[0], 0) << "no idle expert element was checked";
    world_->Barrier();
  }
}

// The bytes of every "<kind>-RRRRR-of-WWWWW.safetensors" file of a step directory.
std::vector<int64_t> RankFileBytes(const std::string& step_dir, const std::string& kind, int world) {
  std::vector<int64_t> out;
  for (int r = 0; r < world; ++r) {
    char name[96];
    std::snprintf(name, sizeof(name), "%s-%05d-of-%05d.safetensors", kind.c_str(), r, world);
    std::error_code ec;
    const auto size = std::filesystem::file_size(std::filesystem::path(step_dir) / name, ec);
    out.push_back(ec ? -1 : static_cast<int64_t>(size));
  }
  return out;
}

TEST_F(ZeroTest, CheckpointMovesBetweenStagesAndLayouts) {
  if (R() != 4) GTEST_SKIP() << "saves under dp 4: needs 4 ranks";
  constexpr int64_t kTotal = 6, kFirst = 3;
  constexpr double kLossTol = 1e-5;
  std::vector<double> want;
  if (std::unique_ptr<Trainer> ref = TrainReference({}, dir("ck_ref"), kTotal, kMicroBatches))
    want = ref->losses();
  // Trains the first kFirst steps under `overrides` on every rank and saves them.
  auto save = [&](std::vector<std::string> overrides, const std::string& out) {
    overrides.push_back("train.max_steps=" + std::to_string(kTotal));
    auto t = Train(TinyConfig(overrides), out, *world_, kFirst);
    ASSERT_TRUE(t.ok()) << t.status();
  };
  // Resumes `saved` with `overrides` on `comm` and trains to the end; the losses of the
  // resumed steps.
  auto resume = [&](const std::string& saved, std::vector<std::string> overrides,
                    const std::string& out, dist::Communicator& comm) -> std::vector<double> {
    overrides.push_back("train.max_steps=" + std::to_string(kTotal));
    QuietStdout quiet;
    auto t = Trainer::Create(TinyConfig(overrides), out, comm);
    EXPECT_TRUE(t.ok()) << t.status();
    if (!t.ok()) return {};
    Status loaded = (*t)->Resume(saved);
    EXPECT_TRUE(loaded.ok()) << loaded;
    EXPECT_EQ((*t)->step(), kFirst);
    Status ran = (*t)->Run(0);
    EXPECT_TRUE(ran.ok()) << ran;
    return (*t)->losses();
  };
  std::unique_ptr<dist::Communicator> pair = world_->Split({{0, 1}, {2, 3}});
  std::map<std::string, std::vector<double>> runs;  // on the root

  // Saved under (dp 4, zero 3, ep 2): each rank writes its own quarter of every file.
  const std::string zero3 = dir("ck_zero3");
  save({"parallel.zero_stage=3", "parallel.ep=2", "train.grad_accum=2"}, zero3);
  if (is_root()) {
    const std::string step = zero3 + "/" + checkpoint::StepDirName(kFirst);
    for (const std::string kind : {"model", "optimizer"}) {
      const std::vector<int64_t> bytes = RankFileBytes(step, kind, R());
      int64_t total = 0, most = 0;
      for (int r = 0; r < R(); ++r) {
        EXPECT_GT(bytes[r], 0) << kind << " file of rank " << r;
        total += bytes[r];
        most = std::max(most, bytes[r]);
      }
      // Each file holds the rank's shards: a quarter of the values (plus its header and the
      // small replicated tensors the lowest rank writes), far from the whole.
      EXPECT_LT(most, total / 2) << kind << ": one rank wrote " << most << " of " << total;
    }
  }
  // Each pair trains on its own, so each gets its own directory (two pairs saving the same
  // step into one directory race to place it).
  std::vector<double> got = resume(zero3, {"parallel.ep=2", "parallel.zero_stage=1",
                                           "train.grad_accum=4"},
                                   dir("ck_3to1_pair" + std::to_string(world_->rank() / 2)), *pair);
  if (world_->rank() == 0) runs["zero 3 (dp 4, ep 2) -> zero 1 (dp 2, ep 2)"] = got;
  got = resume(zero3, {"parallel.tp=2", "parallel.etp=1", "parallel.ep=2", "parallel.zero_stage=2",
                       "train.grad_accum=4"}, dir("ck_3to2"), *world_);
  if (is_root()) runs["zero 3 (dp 4, ep 2) -> zero 2 (tp 2, dp 2, ep 2)"] = got;
  if (is_root()) {
    auto local = dist::MakeLocalCommunicator(Device::Cpu(), 0);
    runs["zero 3 (dp 4, ep 2) -> one rank"] =
        resume(zero3, {"train.grad_accum=8"}, dir("ck_3to0"), *local);
  }
  world_->Barrier();

  // Saved under (tp 2, dp 2, zero 1) and by one rank, resumed under (dp 4, zero 3, ep 4).
  const std::string zero1 = dir("ck_zero1");
  save({"parallel.tp=2", "parallel.zero_stage=1", "train.grad_accum=4"}, zero1);
  got = resume(zero1, {"parallel.zero_stage=3", "parallel.ep=4", "train.grad_accum=2"},
               dir("ck_1to3"), *world_);
  if (is_root()) runs["zero 1 (tp 2, dp 2) -> zero 3 (dp 4, ep 4)"] = got;
  const std::string one = dir("ck_one");
  if (is_root()) {
    auto local = dist::MakeLocalCommunicator(Device::Cpu(), 0);
    auto t = Train(TinyConfig({"train.grad_accum=8", "train.max_steps=" + std::to_string(kTotal)}),
                   one, *local, kFirst);
    EXPECT_TRUE(t.ok()) << t.status();
  }
  world_->Barrier();
  got = resume(one, {"parallel.zero_stage=3", "parallel.ep=2", "train.grad_accum=2"},
               dir("ck_0to3"), *world_);
  if (is_root()) runs["one rank -> zero 3 (dp 4, ep 2)"] = got;

  if (is_root()) {
    ASSERT_EQ(want.size(), static_cast<size_t>(kTotal));
    for (const auto& [what, losses] : runs) {
      ASSERT_EQ(losses.size(), static_cast<size_t>(kTotal - kFirst)) << what;
      double worst = 0;
      for (int64_t s = kFirst; s < kTotal; ++s) {
        worst = std::max(worst, RelErr(losses[s - kFirst], want[s]));
        EXPECT_LE(RelErr(losses[s - kFirst], want[s]), kLossTol)
            << what << ", step " << s << ": " << losses[s - kFirst] << " vs " << want[s];
      }
      std::printf("[ info     ] %s: steps %lld-%lld within %.2e of one rank's uninterrupted run\n",
                  what.c_str(), static_cast<long long>(kFirst), static_cast<long long>(kTotal - 1),
                  worst);
    }
    std::fflush(stdout);
  }
  world_->Barrier();
}

}  // namespace
}  // namespace switchyard::train
