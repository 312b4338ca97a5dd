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
      const int64_t i = idx[d] + p.OffsetAt(static_cast<int>(d));
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

// A registry for this rank, described as the layers describe theirs: tp splits dense
// weights (vocabulary rows, columns, rows), ep and etp the experts on two dims at once;
// sequence-parallel norms and row biases are replicated over tp with their gradients summed
// over it, the router and a norm without sequence parallelism replicated over tp without.
Model MakeModel(const ParallelContext& pc) {
  const int tp = pc.tp().size(), tr = pc.tp().rank();
  const int ep = pc.ep().size(), er = pc.ep().rank();
  const int etp = pc.etp().size(), etr = pc.etp().rank();
  Model m;
  int next_pid = 1;
  // split: {dim, parts, index} pairs; each splits dim into `parts` and keeps part `index`.
  struct Cut {
    int dim, parts, index;
  };
  auto add = [&](const std::string& name, Shape global, bool expert, std::vector<Cut> cuts,
                 int tp_copies = 0, bool trainable = true) {
    Shape local = global;
    for (const Cut& c : cuts) local[c.dim] = global[c.dim] / c.parts;
    Tensor value = Tensor::Zeros(local, DType::kF32);
    Tensor grad = trainable ? Tensor::Zeros(local, DType::kF32) : Tensor();
    Parameter p = expert ? Parameter::Expert(name, value, grad, trainable)
                         : Parameter::Dense(name, value, grad, trainable);
    for (const Cut& c : cuts) p.Split(c.dim, local[c.dim] * c.index, global[c.dim]);
    // tp_copies: 0 none, 1 replicated over (e)tp with summed gradients, 2 without.
    if (tp_copies > 0) p.ReplicatedOver(Axis::kTp, tp_copies == 1);
    m.registry.Add(std::move(p));
    m.pid.push_back(next_pid++);
  };
  add("wte", {12, 3}, false, {{0, tp, tr}});                        // vocab parallel
  add("ln1.weight", {5}, false, {}, 1);                            // sequence parallel
  add("ln2.weight", {5}, false, {}, 2);                            // no sequence parallel
  add("attn.w_qkv", {6, 4}, false, {{1, tp, tr}});                 // column parallel
  add("moe.router", {4, kExperts}, false, {}, 2);                  // whole routing group
  add("moe.expert_bias", {kExperts}, false, {}, 2, /*trainable=*/false);
  add("moe.experts.w1", {kExperts, 3, 4}, true, {{0, ep, er}, {2, etp, etr}});
  add("moe.experts.w2", {kExperts, 4, 3}, true, {{0, ep, er}, {1, etp, etr}});
  add("moe.experts.b2", {kExperts, 3}, true, {{0, ep, er}}, 1);    // added by etp rank 0
  add("attn.w_out", {4, 6}, false, {{0, tp, tr}});                 // row parallel
  add("attn.b_out", {6}, false, {}, 1);                            // row-parallel bias
  add("head", {3, 7}, false, {}, 2);
  return m;
}

// The group a parameter's gradient is summed over.
Communicator& GroupOf(const ParallelContext& pc, const Parameter& p) {
  return parallel::GroupOf(pc, p.view, p.grad_sum);
}

// Writes this rank's (unsynced) gradients; `salt` changes them from step to step.
void FillGrads(Model& m, const ParallelContext& pc, int salt) {
  for (size_t i = 0; i < m.registry.params().size(); ++i) {
    Parameter& p = m.registry.params()[i];
    if (!p.trainable) continue;
    // Copies that are not summed (replicated without grad_sum) hold equal gradients.
    const int replica = GroupOf(pc, p).rank();
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
    GroupOf(pc, p).AllReduce(t, dist::ReduceOp::kSum);
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
    const int replicas = GroupOf(pc, p).size();
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
    const int replicas = GroupOf(pc, p).size();
    std::vector<float> g(NumElements(p.global_shape));
    for (int64_t j = 0; j < static_cast<int64_t>(g.size()); ++j) {
      for (int d = 0; d < replicas; ++d) g[j] += GradValue(m.pid[i] + salt, j, d);
    }
    whole.Add(Parameter::Dense(p.name, Tensor::Zeros(p.global_shape, DType::kF32),
                               Tensor::FromVector(g, p.global_shape), true));
  }
  auto one = dist::MakeLocalCommunicator();
  auto pc1 = ParallelContext::Create(*one, Mesh::Create(1, {}).value());
  SY_CHECK_OK(pc1.status());
  return train::GlobalGradNorm(whole, **pc1);
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
    out.push_back({"tp=1,ep=2,etp=2", {.tp = 1, .ep = 2, .etp = 2}});
  }
  if (world >= 8) out.push_back({"tp=2,ep=2,etp=2", {.tp = 2, .ep = 2, .etp = 2}});
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
          EXPECT_EQ(m.registry.params()[i].view, b.view);
          EXPECT_EQ(m.registry.params()[i].grad_sum, b.axes);
          packed.push_back(i);
        }
      }
      // One group per (view, axes) of size > 1, in first-registered order; inside each,
      // reverse registration order.
      std::vector<std::pair<View, AxisSet>> kinds;
      for (const Parameter& p : m.registry.params()) {
        if (!p.trainable || p.grad_sum.empty()) continue;
        if (std::find(kinds.begin(), kinds.end(), std::pair{p.view, p.grad_sum}) == kinds.end())
          kinds.emplace_back(p.view, p.grad_sum);
      }
      std::vector<size_t> want;
      for (auto [view, axes] : kinds) {
        if (parallel::GroupOf(pc, view, axes).size() == 1) continue;
        for (size_t i = m.registry.params().size(); i-- > 0;) {
          const Parameter& p = m.registry.params()[i];
          if (p.trainable && p.view == view && p.grad_sum == axes) want.push_back(i);
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

    const double norm = train::GlobalGradNorm(m.registry, pc);
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
    EXPECT_NEAR(train::ClipGradNorm(m.registry, max_norm, pc), whole, 1e-6 * whole);
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
    EXPECT_NEAR(train::GlobalGradNorm(m.registry, pc), max_norm, 1e-5 * max_norm);
  }
}

}  // namespace
}  // namespace switchyard::parallel
