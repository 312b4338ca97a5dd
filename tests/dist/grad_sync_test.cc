// Data-parallel gradient sync and the global gradient norm under mpirun (2, 4 and 8
// ranks), over several meshes: ep = world / 2 (edp = 2), ep = world (edp = 1: expert grads
// need no sync), and with 4+ ranks tp = 2 and cp = 2 layouts (tp-sharded dense weights).
//
// Every rank builds a small model registry: kDense weights sharded over tp (on dim 0 and
// on dim 1) or replicated, a non-trainable kDense tensor, and kExpert weights sharded over
// ep. The gradient of a parameter element is an integer-valued float keyed by (parameter,
// global element index, replica), where the replica is the rank's index in the group that
// sums it (dp_cp for kDense, edp for kExpert) — tp peers of one replica hold slices of the
// same gradient, as in training. Integer sums are exact in f32, so:
//  - SyncAll, MarkReady (reverse registration order, and a different scrambled subset on
//    every rank) + Finish, and two steps in a row, all give EXACTLY the per-tensor
//    AllReduce of the same gradients, and exactly the analytic sum;
//  - tiny buckets (several per group, a parameter bigger than a bucket) and the 25 MiB
//    default give identical results; buckets respect the cap, never mix groups, and pack
//    in reverse registration order;
//  - the global norm with tp/ep-sharded parameters equals the norm of the whole (unsharded)
//    gradients computed on one rank, and clipping scales every rank's grads alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/dist/parallel_context.h"
#include "engine/dist/process.h"
#include "engine/parallel/grad_sync.h"
#include "engine/train/clip.h"

namespace switchyard::parallel {
namespace {

using dist::Axis;
using dist::Communicator;
using dist::Mesh;
using dist::MeshSizes;
using dist::ParallelContext;
using dist::View;
using model::GradGroup;
using parallel::Parameter;
using parallel::ParameterRegistry;

constexpr int64_t kExperts = 8;  // divisible by ep = 1, 2, 4, 8

// The gradient of element `j` (global flat index) of parameter `pid` on replica `d`.
float GradValue(int pid, int64_t j, int d) {
  return static_cast<float>((pid * 7 + j * 3 + d * 5) % 13 - 6);
}

// The global flat index of every local element of a parameter (row-major).
std::vector<int64_t> GlobalIndices(const Parameter& p) {
  const Shape& local = p.value.shape();
  const Shape& global = p.global_shape;
  std::vector<int64_t> out(p.value.numel());
  std::vector<int64_t> idx(local.size(), 0);
  for (int64_t n = 0; n < p.value.numel(); ++n) {
    int64_t g = 0;
    for (size_t d = 0; d < local.size(); ++d) {
      const int64_t i = idx[d] + (static_cast<int>(d) == p.shard_dim ? p.shard_offset : 0);
      g = g * global[d] + i;
    }
    out[n] = g;
    for (int d = static_cast<int>(local.size()) - 1; d >= 0; --d) {
      if (++idx[d] < local[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

struct Model {
  ParameterRegistry registry;
  std::vector<int> pid;  // per registry index: the key of GradValue
};

// A registry for this rank; tp shards dense weights, ep the experts.
Model MakeModel(const ParallelContext& pc) {
  const int tp = pc.tp().size(), tr = pc.tp().rank();
  const int ep = pc.ep().size(), er = pc.ep().rank();
  Model m;
  int next_pid = 1;
  auto add = [&](const std::string& name, Shape global, int shard_dim, int shards, int index,
                 GradGroup group, bool trainable = true) {
    Shape local = global;
    int64_t offset = 0;
    if (shards > 1) {
      local[shard_dim] = global[shard_dim] / shards;
      offset = local[shard_dim] * index;
    } else {
      shard_dim = -1;
    }
    Parameter p{.name = name, .global_shape = global, .shard_dim = shard_dim,
                .shard_offset = offset, .group = group, .trainable = trainable,
                .weight_decay = trainable, .value = Tensor::Zeros(local, DType::kF32),
                .grad = Tensor()};
    if (trainable) p.grad = Tensor::Zeros(local, DType::kF32);
    m.registry.Add(std::move(p));
    m.pid.push_back(next_pid++);
  };
  add("wte", {12, 3}, 0, tp, tr, GradGroup::kDense);            // vocab parallel
  add("ln1.weight", {5}, -1, 1, 0, GradGroup::kDense);          // replicated over tp
  add("attn.w_qkv", {6, 4}, 1, tp, tr, GradGroup::kDense);      // column parallel
  add("moe.router", {4, kExperts}, -1, 1, 0, GradGroup::kDense);
  add("moe.expert_bias", {kExperts}, -1, 1, 0, GradGroup::kDense, /*trainable=*/false);
  add("moe.experts.w1", {kExperts, 3, 5}, 0, ep, er, GradGroup::kExpert);
  add("moe.experts.w2", {kExperts, 5, 3}, 0, ep, er, GradGroup::kExpert);
  add("attn.w_out", {4, 6}, 0, tp, tr, GradGroup::kDense);      // row parallel
  add("head", {3, 7}, -1, 1, 0, GradGroup::kDense);
  return m;
}

Communicator& GroupOf(const ParallelContext& pc, GradGroup g) {
  return g == GradGroup::kDense ? pc.dp_cp() : pc.edp();
}

// Writes this rank's (unsynced) gradients; `salt` changes them from step to step.
void FillGrads(Model& m, const ParallelContext& pc, int salt) {
  for (size_t i = 0; i < m.registry.params().size(); ++i) {
    Parameter& p = m.registry.params()[i];
    if (!p.trainable) continue;
    const int replica = GroupOf(pc, p.group).rank();
    std::vector<float> g;
    for (int64_t j : GlobalIndices(p)) g.push_back(GradValue(m.pid[i] + salt, j, replica));
    p.grad.CopyFrom(Tensor::FromVector(g, p.grad.shape()));
  }
}

// Clones of the gradients, each all-reduced on its own: the plain reference.
std::vector<Tensor> PerTensorAllReduce(const Model& m, const ParallelContext& pc) {
  std::vector<Tensor> out;
  for (const Parameter& p : m.registry.params()) {
    if (!p.trainable) {
      out.emplace_back();
      continue;
    }
    Tensor t = p.grad.Clone();
    GroupOf(pc, p.group).AllReduce(t, dist::ReduceOp::kSum);
    out.push_back(t);
  }
  return out;
}

// The synced gradient must equal the reference exactly and the analytic sum over replicas.
void ExpectSynced(const Model& m, const ParallelContext& pc, const std::vector<Tensor>& ref,
                  int salt, const std::string& what) {
  for (size_t i = 0; i < m.registry.params().size(); ++i) {
    const Parameter& p = m.registry.params()[i];
    if (!p.trainable) {
      EXPECT_FALSE(p.grad.defined());
      continue;
    }
    const int replicas = GroupOf(pc, p.group).size();
    std::vector<float> got = p.grad.ToVector<float>(), want = ref[i].ToVector<float>();
    std::vector<int64_t> global = GlobalIndices(p);
    int64_t bad = 0;
    for (size_t n = 0; n < got.size(); ++n) {
      float sum = 0;
      for (int d = 0; d < replicas; ++d) sum += GradValue(m.pid[i] + salt, global[n], d);
      if ((got[n] != want[n] || got[n] != sum) && bad++ < 3) {
        ADD_FAILURE() << what << ": " << p.name << "[" << n << "] = " << got[n]
                      << ", per-tensor all-reduce " << want[n] << ", analytic " << sum;
      }
    }
    EXPECT_EQ(bad, 0) << what << ": " << p.name;
  }
}

// The whole model's gradient norm from the analytic sums, on one rank with a registry of
// whole (unsharded) tensors and no communicators.
double WholeNorm(const Model& m, const ParallelContext& pc, int salt) {
  ParameterRegistry whole;
  for (size_t i = 0; i < m.registry.params().size(); ++i) {
    const Parameter& p = m.registry.params()[i];
    if (!p.trainable) continue;
    const int replicas = GroupOf(pc, p.group).size();
    std::vector<float> g(NumElements(p.global_shape));
    for (int64_t j = 0; j < static_cast<int64_t>(g.size()); ++j) {
      for (int d = 0; d < replicas; ++d) g[j] += GradValue(m.pid[i] + salt, j, d);
    }
    whole.Add({.name = p.name, .global_shape = p.global_shape, .group = p.group,
               .value = Tensor::Zeros(p.global_shape, DType::kF32),
               .grad = Tensor::FromVector(g, p.global_shape)});
  }
  return train::GlobalGradNorm(whole, {});
}

struct Layout {
  std::string name;
  MeshSizes sizes;
};

std::vector<Layout> Layouts(int world) {
  std::vector<Layout> out = {{"ep=world/2", {.ep = std::max(1, world / 2)}},
                             {"ep=world", {.ep = world}}};
  if (world >= 4) {
    out.push_back({"tp=2,ep=2,etp=1", {.tp = 2, .ep = 2, .etp = 1}});
    out.push_back({"cp=2,ep=world/2", {.cp = 2, .ep = world / 2}});
  }
  return out;
}

class GradSyncTest : public testing::Test {
 protected:
  void SetUp() override { world_ = dist::WorldCommunicator(); }
  std::unique_ptr<Communicator> world_;
};

TEST_F(GradSyncTest, BucketsMatchPerTensorAllReduce) {
  for (const Layout& layout : Layouts(world_->size())) {
    auto mesh = Mesh::Create(world_->size(), layout.sizes);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto pc_or = ParallelContext::Create(*world_, *mesh);
    ASSERT_TRUE(pc_or.ok()) << pc_or.status();
    const ParallelContext& pc = **pc_or;
    for (int64_t cap : {int64_t{16}, int64_t{200}, kDefaultBucketBytes}) {
      SCOPED_TRACE(layout.name + ", bucket_bytes " + std::to_string(cap));
      Model m = MakeModel(pc);
      GradSync sync(m.registry, pc, cap);
      if (pc.rank() == 0) std::printf("    %-18s cap %-9lld %s\n", layout.name.c_str(),
                                      static_cast<long long>(cap), sync.Summary().c_str());

      // Bucket structure: every synced trainable parameter once, caps respected, reverse
      // registration order, one group per bucket.
      const auto buckets = sync.Buckets();
      std::vector<size_t> packed;
      for (const auto& b : buckets) {
        EXPECT_TRUE(b.bytes <= cap || b.params.size() == 1) << b.bytes;
        for (size_t i : b.params) {
          EXPECT_EQ(m.registry.params()[i].group, b.group);
          packed.push_back(i);
        }
      }
      std::vector<size_t> want;
      for (GradGroup g : {GradGroup::kDense, GradGroup::kExpert}) {
        if (GroupOf(pc, g).size() == 1) continue;
        for (size_t i = m.registry.params().size(); i-- > 0;) {
          const Parameter& p = m.registry.params()[i];
          if (p.trainable && p.group == g) want.push_back(i);
        }
      }
      EXPECT_EQ(packed, want);
      if (cap == 16) {
        EXPECT_EQ(buckets.size(), want.size());  // one parameter each
      }
      if (cap == 200) {
        EXPECT_GT(buckets.size(), 2u);
        EXPECT_LT(buckets.size(), want.size());
      }

      // 1. The synchronous path.
      FillGrads(m, pc, 0);
      std::vector<Tensor> ref = PerTensorAllReduce(m, pc);
      sync.SyncAll();
      ExpectSynced(m, pc, ref, 0, "SyncAll");

      // 2. MarkReady in reverse registration order (as backward produces them), Finish.
      FillGrads(m, pc, 1);
      ref = PerTensorAllReduce(m, pc);
      for (size_t i = m.registry.params().size(); i-- > 0;) sync.MarkReady(i);
      sync.Finish();
      ExpectSynced(m, pc, ref, 1, "MarkReady reverse + Finish");

      // 3. Another step: a scrambled order that differs per rank, some parameters never
      // marked (Finish launches their buckets), the same result.
      FillGrads(m, pc, 2);
      ref = PerTensorAllReduce(m, pc);
      std::vector<size_t> order(m.registry.params().size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::rotate(order.begin(), order.begin() + (pc.rank() * 3) % order.size(), order.end());
      for (size_t k = 0; k < order.size(); ++k) {
        if ((k + pc.rank()) % 3 != 0) sync.MarkReady(order[k]);
      }
      sync.Finish();
      ExpectSynced(m, pc, ref, 2, "scrambled MarkReady + Finish");

      // 4. Finish alone syncs everything.
      FillGrads(m, pc, 3);
      ref = PerTensorAllReduce(m, pc);
      sync.Finish();
      ExpectSynced(m, pc, ref, 3, "Finish only");
    }
  }
}

TEST_F(GradSyncTest, GlobalNormOfShardedGradsEqualsTheWholeModelNorm) {
  for (const Layout& layout : Layouts(world_->size())) {
    SCOPED_TRACE(layout.name);
    auto mesh = Mesh::Create(world_->size(), layout.sizes);
    ASSERT_TRUE(mesh.ok()) << mesh.status();
    auto pc_or = ParallelContext::Create(*world_, *mesh);
    ASSERT_TRUE(pc_or.ok()) << pc_or.status();
    const ParallelContext& pc = **pc_or;
    Model m = MakeModel(pc);
    GradSync sync(m.registry, pc, 64);
    FillGrads(m, pc, 5);
    sync.SyncAll();

    const train::GradNormGroups groups = train::NormGroupsOf(pc);
    const double norm = train::GlobalGradNorm(m.registry, groups);
    const double whole = WholeNorm(m, pc, 5);
    EXPECT_GT(whole, 10.0);
    EXPECT_NEAR(norm, whole, 1e-6 * whole);
    if (pc.rank() == 0) std::printf("    %-18s global norm %.6f, whole model %.6f\n",
                                    layout.name.c_str(), norm, whole);

    // Clipping to half: every rank scales by the same factor; the new norm is max_norm.
    std::vector<std::vector<float>> before;
    for (const Parameter& p : m.registry.params())
      before.push_back(p.trainable ? p.grad.ToVector<float>() : std::vector<float>{});
    const double max_norm = whole / 2;
    EXPECT_NEAR(train::ClipGradNorm(m.registry, max_norm, groups), whole, 1e-6 * whole);
    const float scale = static_cast<float>(max_norm / (norm + 1e-6));
    for (size_t i = 0; i < before.size(); ++i) {
      const Parameter& p = m.registry.params()[i];
      if (!p.trainable) continue;
      std::vector<float> after = p.grad.ToVector<float>();
      for (size_t n = 0; n < after.size(); ++n) {
        if (after[n] != before[i][n] * scale) {
          ADD_FAILURE() << p.name << "[" << n << "] = " << after[n] << ", want "
                        << before[i][n] * scale;
          break;
        }
      }
    }
    EXPECT_NEAR(train::GlobalGradNorm(m.registry, groups), max_norm, 1e-5 * max_norm);
  }
}

}  // namespace
}  // namespace switchyard::parallel
