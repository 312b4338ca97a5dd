// The layout matrix of the multi-rank training tests (MODEL.md section 4): a layout trains
// the tiny model and is compared with the one-rank reference trained on the same global
// batch: per-step losses, every rank's parameter boxes, and the saved model and optimizer
// tensors assembled whole. trainer_test.cc (tp, sp, etp, pp) and
// context_parallel_train_test.cc (cp) run tables of layouts through it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/checkpoint/checkpoint.h"
#include "engine/checkpoint/save_plan.h"
#include "engine/train/trainer.h"
#include "tests/dist/train_fixture.h"

namespace switchyard::train::testing {

// global batch 16 = 4 micro-batches of 4
inline constexpr int64_t kGlobalMicroBatches = 4;

// ||got - want|| / ||want|| (Frobenius) of a tensor.
struct TensorDiff {
  std::string name;
  double rel = 0;
};

// got: this rank's box (at `offset`, got's shape) of the whole tensor `want`.
inline TensorDiff CompareBox(const std::string& name, const Tensor& got, const Tensor& want,
                      const std::vector<int64_t>& offset) {
  TensorDiff d{name, 0};
  if (got.dtype() != DType::kF32 || want.dtype() != DType::kF32 || got.ndim() != want.ndim()) {
    d.rel = INFINITY;
    return d;
  }
  for (int i = 0; i < want.ndim(); ++i) {
    const int64_t at = offset.empty() ? 0 : offset[i];
    if (at < 0 || at + got.dim(i) > want.dim(i)) {
      d.rel = INFINITY;  // not a box of the whole tensor
      return d;
    }
  }
  Tensor box = Tensor::Empty(got.shape(), DType::kF32);
  checkpoint::CopyBox(want, box, offset, /*paste=*/false);
  const Tensor mine = got.To(Device::Cpu());
  const float* a = mine.data<float>();
  const float* b = box.data<float>();
  double diff2 = 0, want2 = 0;
  for (int64_t i = 0; i < box.numel(); ++i) {
    const double x = a[i], y = b[i];
    diff2 += (x - y) * (x - y);
    want2 += y * y;
    if (!std::isfinite(x)) diff2 = INFINITY;
  }
  d.rel = diff2 == 0 ? 0.0 : std::sqrt(diff2 / std::max(want2, 1e-60));
  return d;
}

// The key bias of attention has an exactly zero gradient (softmax is invariant to adding
// q . b_k to every score of a query), so what it gets is rounding noise, which Adam
// normalises into lr-sized steps of a random sign: its values (and moments) are not
// comparable across reduction orders, and they do not change the outputs. Skipped.
inline bool NoiseDriven(const std::string& name) {
  const std::string suffix = "attn.k.bias";
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Every tensor of two checkpoints (the model's, or with `optimizer` the optimizer state's),
// assembled whole from their pieces: the same names, shapes and dtypes; f32 values within
// `tol` (relative norm), others (the optimizer's step count) equal.
inline void ExpectCheckpointsClose(const std::string& got_dir, const std::string& want_dir,
                            bool optimizer, double tol, const std::string& what, double* worst) {
  auto got = checkpoint::ReadWholeTensors(got_dir, optimizer);
  auto want = checkpoint::ReadWholeTensors(want_dir, optimizer);
  ASSERT_TRUE(got.ok()) << got.status();
  ASSERT_TRUE(want.ok()) << want.status();
  ASSERT_EQ(got->size(), want->size()) << what;
  for (const auto& [name, w] : *want) {
    auto it = got->find(name);
    ASSERT_NE(it, got->end()) << what << ": " << name << " missing";
    const Tensor& g = it->second;
    ASSERT_EQ(g.shape(), w.shape()) << what << ": " << name;
    ASSERT_EQ(g.dtype(), w.dtype()) << what << ": " << name;
    if (w.dtype() != DType::kF32) {
      EXPECT_EQ(std::memcmp(g.raw_data(), w.raw_data(), w.nbytes()), 0) << what << ": " << name;
      continue;
    }
    if (NoiseDriven(name)) continue;
    const TensorDiff d = CompareBox(name, g, w, {});
    *worst = std::max(*worst, d.rel);
    EXPECT_LE(d.rel, tol) << what << ": " << name << " differs by " << d.rel << " (relative norm)";
  }
}

// How far a layout's run is from the one-rank reference: relative norms, 0 is bit-identical.
struct Distance {
  double loss = 0, weights = 0, saved = 0;
};

// Every rank compares its parameter boxes with the reference checkpoint's whole tensors
// (replicas of dense weights, tensor-parallel and expert shards); the root compares the
// per-step losses and the saved model and optimizer files. Returns the worst of each (the
// weights over every rank; the losses and files on the root). Collective over world.
inline Distance CompareWithReference(Trainer& trainer, const std::string& out,
                              const std::string& ref_ckpt, const std::vector<double>& ref_losses,
                              int64_t steps, double loss_tol, double weight_tol,
                              dist::Communicator& world) {
  Distance d;
  auto want = checkpoint::ReadWholeTensors(ref_ckpt, /*optimizer=*/false);
  EXPECT_TRUE(want.ok()) << want.status();
  trainer.zero().AcquireAll();  // ZeRO-3 frees the parameters between uses
  if (want.ok()) {
    for (const parallel::Parameter& p : trainer.registry().params()) {
      if (NoiseDriven(p.name)) continue;
      auto it = want->find(p.name);
      if (it == want->end()) {
        ADD_FAILURE() << p.name << " is not in the reference checkpoint";
        continue;
      }
      const TensorDiff diff = CompareBox(p.name, p.value, it->second, p.offset);
      d.weights = std::max(d.weights, diff.rel);
      EXPECT_LE(diff.rel, weight_tol) << "rank " << world.rank() << ": " << p.Describe()
                                      << " differs from the reference by " << diff.rel;
    }
  }
  trainer.zero().ReleaseAll();
  Tensor worst = Tensor::FromVector<float>({static_cast<float>(d.weights)}, {1});
  world.AllReduce(worst, dist::ReduceOp::kMax);
  d.weights = worst.ToVector<float>()[0];
  if (world.rank() != 0) return d;
  const std::vector<double>& losses = trainer.losses();
  EXPECT_EQ(losses.size(), ref_losses.size());
  for (size_t s = 0; s < std::min(losses.size(), ref_losses.size()); ++s) {
    const double rel = RelErr(losses[s], ref_losses[s]);
    d.loss = std::max(d.loss, rel);
    EXPECT_LE(rel, loss_tol) << "step " << s << ": loss " << losses[s] << " vs " << ref_losses[s]
                             << " on one rank";
  }
  const std::string ckpt = out + "/" + checkpoint::StepDirName(steps);
  ExpectCheckpointsClose(ckpt, ref_ckpt, /*optimizer=*/false, weight_tol, "model", &d.saved);
  ExpectCheckpointsClose(ckpt, ref_ckpt, /*optimizer=*/true, weight_tol, "optimizer", &d.saved);
  return d;
}

struct Layout {
  std::string name;
  int world;                            // the layout runs on this many ranks
  int dp;                               // its data-parallel size (grad_accum = 4 / dp)
  std::vector<std::string> model;       // model/moe overrides (the reference uses them too)
  std::vector<std::string> parallel;    // parallel.* overrides
};

// MODEL.md section 4 for a table of layouts: each layout of the world's size trains 8 steps
// and is compared with one rank (grad_accum 4, the same global batch): per-step losses
// within 1e-5, every rank's parameter boxes and the gathered checkpoint within 1e-4 of the
// reference. Prints, per layout, bit-identical or the worst relative difference. Skips when
// no layout of the table runs on this many ranks.
inline void ExpectLayoutsMatchOneRank(const std::vector<Layout>& layouts, const std::string& tag,
                               dist::Communicator& world, int ranks) {
  auto dir_of = [](const std::string& name) { return TrainFixture::dir(name); };
  constexpr int64_t kSteps = 8;
  constexpr double kLossTol = 1e-5;
  constexpr double kWeightTol = 1e-4;
  const std::string steps = "train.max_steps=" + std::to_string(kSteps);
  int ran = 0;
  for (const Layout& layout : layouts) {
    if (layout.world != ranks) continue;
    ++ran;
    SCOPED_TRACE(layout.name);
    const std::string ref_dir = dir_of(tag + "ref_" + layout.name);
    std::vector<double> ref_losses;
    if (world.rank() == 0) {
      std::vector<std::string> o = layout.model;
      o.push_back(steps);
      o.push_back("train.grad_accum=" + std::to_string(kGlobalMicroBatches));
      auto local = dist::MakeLocalCommunicator(Device::Cpu(), 0);
      auto ref = TrainFixture::Train(TrainFixture::TinyConfig(o), ref_dir, *local);
      EXPECT_TRUE(ref.ok()) << ref.status();
      if (ref.ok()) ref_losses = (*ref)->losses();
    }
    world.Barrier();
    const std::string ref_ckpt = ref_dir + "/" + checkpoint::StepDirName(kSteps);

    std::vector<std::string> overrides = layout.model;
    overrides.insert(overrides.end(), layout.parallel.begin(), layout.parallel.end());
    overrides.push_back(steps);
    overrides.push_back("train.grad_accum=" + std::to_string(kGlobalMicroBatches / layout.dp));
    const std::string out = dir_of(tag + layout.name);
    auto trainer = TrainFixture::Train(TrainFixture::TinyConfig(overrides), out, world);
    ASSERT_TRUE(trainer.ok()) << trainer.status();

    const Distance d = CompareWithReference(**trainer, out, ref_ckpt, ref_losses, kSteps,
                                            kLossTol, kWeightTol, world);
    if (world.rank() == 0) {
      const std::vector<double>& losses = (*trainer)->losses();
      auto show = [](double v) {
        char buf[32];
        if (v == 0) return std::string("bit-identical");
        std::snprintf(buf, sizeof(buf), "%.2e", v);
        return std::string(buf);
      };
      std::printf("[ info     ] %s (world %d): loss %.4f -> %.4f; vs 1 rank: losses %s, "
                  "weights %s, checkpoint %s\n",
                  layout.name.c_str(), ranks, losses.empty() ? 0.0 : losses.front(),
                  losses.empty() ? 0.0 : losses.back(), show(d.loss).c_str(),
                  show(d.weights).c_str(), show(d.saved).c_str());
      std::fflush(stdout);
    }
    world.Barrier();
  }
  if (ran == 0) GTEST_SKIP() << "no layout of the table runs on " << ranks << " ranks";
}

}  // namespace switchyard::train::testing
