// Data-parallel gradient sync and the global gradient norm under mpirun (2, 4 and 8 ranks)
// on a synthetic model described the way the layers describe theirs
// (engine/parallel/parameter.h): a vocabulary-parallel table (dim 0 over tp), column- (dim 1)
// and row-parallel (dim 0) weights, a row-parallel bias and a sequence-parallel norm
// replicated over tp with their gradients summed over it, a norm without sequence
// parallelism and the router replicated over tp WITHOUT (each tp rank already has the whole
// gradient), experts split over ep on dim 0 and over etp on dim 2 at once (a 2-dim box),
// the experts' output bias replicated over etp with its gradient summed, and a
// non-trainable expert bias. Layouts: tp 2 (etp 2), ep = world / 2, ep = world; with 4+
// ranks also tp 2 x ep 2 (etp 1), etp 2 x ep 2 (tp 1), cp 2, tp 4 (etp 4); with 8 also
// tp 2 x etp 2 x ep 2, tp 2 x cp 2 x ep 4, tp 4 x ep 2 (etp 1).
//
// The gradient of a parameter element is a float keyed by (parameter, global element
// index, replica), the replica being the rank's index in the group its description sums
// over (GroupOf(view, grad_sum)); tp peers of one replica hold boxes of the same gradient,
// and copies that are not summed hold equal ones, as in training. The values have 17-bit
// mantissas and exponents in [-12, 12], so sums round and their order shows. GradSync sums
// in the canonical order (dist::OrderedAllReduce: the pairwise tree over the group's
// ranks), so:
//  - SyncAll, MarkReady (reverse registration order; a scrambled subset that differs per
//    rank) + Finish, Finish alone, and steps in a row all give, BIT FOR BIT, the tree sum
//    of the replicas' values computed locally and the per-tensor OrderedAllReduce, and a
//    plain per-tensor AllReduce within rounding; afterwards every copy of a box (its
//    `replicated` group) holds the same bits;
//  - tiny buckets (several per group, a parameter bigger than a bucket) and the 25 MiB
//    default give identical results; buckets respect the cap, never mix groups, and pack
//    in reverse registration order; groups of one rank get no bucket;
//  - the global norm (the owner rule on the descriptions) equals the norm of the whole
//    one-rank model built from the same values within 1e-6 relative, and clipping scales
//    every rank's gradients alike.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "engine/dist/ordered_sum.h"
#include "engine/dist/parallel_context.h"
#include "engine/dist/process.h"
#include "engine/parallel/grad_sync.h"
#include "engine/parallel/clip.h"

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

uint64_t SplitMix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// The gradient of element `j` (global flat index) of parameter `pid` on replica `d`: a sign
// and a 17-bit mantissa times 2^e, e in [-12, 12]. Sums of such values mostly round, so
// sums of four or more depend on their order.
float GradValue(int pid, int64_t j, int d) {
  const uint64_t h = SplitMix64(SplitMix64(static_cast<uint64_t>(pid) * 1000003 + d) ^
                                static_cast<uint64_t>(j));
  const float mantissa = 1.0f + static_cast<float>(h >> 48) / 65536.0f;
  const int exponent = static_cast<int>((h >> 3) % 25) - 12;
  return ((h & 1) ? -1.0f : 1.0f) * std::ldexp(mantissa, exponent);
}

// The replicas' values of one element, in the rank order of the group that sums them.
std::vector<float> Leaves(int pid, int64_t j, int replicas) {
  std::vector<float> out(replicas);
  for (int d = 0; d < replicas; ++d) out[d] = GradValue(pid, j, d);
  return out;
}

// The synced value: the pairwise tree over the replicas (dist::OrderedAllReduce's order).
float TreeSum(int pid, int64_t j, int replicas) {
  const std::vector<float> leaves = Leaves(pid, j, replicas);
  return dist::PairwiseTreeSum<float>(leaves);
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

// Clones of the gradients, each all-reduced on its own over its grad_sum group: in the
// canonical order (dist::OrderedAllReduce) when `ordered`, else by the plain AllReduce.
std::vector<Tensor> PerTensorAllReduce(const Model& m, const ParallelContext& pc, bool ordered) {
  std::vector<Tensor> out;
  for (const Parameter& p : m.registry.params()) {
    if (!p.trainable) {
      out.emplace_back();
      continue;
    }
    Tensor t = p.grad.Clone();
    if (ordered) {
      dist::OrderedAllReduce(GroupOf(pc, p), t);
    } else {
      GroupOf(pc, p).AllReduce(t, dist::ReduceOp::kSum);
    }
    out.push_back(t);
  }
  return out;
}

struct References {
  std::vector<Tensor> ordered, plain;
};

References MakeReferences(const Model& m, const ParallelContext& pc) {
  return {PerTensorAllReduce(m, pc, true), PerTensorAllReduce(m, pc, false)};
}

// The synced gradient must equal, bit for bit, the tree sum over the replicas computed here
// and the per-tensor OrderedAllReduce, and the plain AllReduce up to rounding. Returns how
// many elements' tree sum differs from the left-to-right sum (evidence that the values
// can tell the orders apart).
int64_t ExpectSynced(const Model& m, const ParallelContext& pc, const References& ref, int salt,
                     const std::string& what) {
  int64_t order_shows = 0;
  for (size_t i = 0; i < m.registry.params().size(); ++i) {
    const Parameter& p = m.registry.params()[i];
    if (!p.trainable) {
      EXPECT_FALSE(p.grad.defined());
      continue;
    }
    const int replicas = GroupOf(pc, p).size();
    const std::vector<float> got = p.grad.ToVector<float>();
    const std::vector<float> ordered = ref.ordered[i].ToVector<float>();
    const std::vector<float> plain = ref.plain[i].ToVector<float>();
    const std::vector<int64_t> global = GlobalIndices(p);
    int64_t bad = 0;
    for (size_t n = 0; n < got.size(); ++n) {
      const std::vector<float> leaves = Leaves(m.pid[i] + salt, global[n], replicas);
      const float tree = dist::PairwiseTreeSum<float>(leaves);
      float left_to_right = 0.0f, magnitude = 0.0f;
      for (float v : leaves) {
        left_to_right += v;
        magnitude += std::fabs(v);
      }
      order_shows += left_to_right != tree;
      const bool exact = std::bit_cast<uint32_t>(got[n]) == std::bit_cast<uint32_t>(tree) &&
                         std::bit_cast<uint32_t>(got[n]) == std::bit_cast<uint32_t>(ordered[n]);
      const bool near = std::fabs(got[n] - plain[n]) <= 4 * FLT_EPSILON * magnitude;
      if ((!exact || !near) && bad++ < 3) {
        ADD_FAILURE() << what << ": " << p.name << "[" << n << "] = " << got[n]
                      << ", tree sum over " << replicas << " replicas " << tree
                      << ", per-tensor ordered all-reduce " << ordered[n] << ", plain " << plain[n];
      }
    }
    EXPECT_EQ(bad, 0) << what << ": " << p.name << " (" << p.Describe() << ")";
  }
  return order_shows;
}

// After a sync every copy of a box holds the same bits: gathered over the parameter's
// `replicated` group, every rank's gradient equals this rank's.
void ExpectReplicasAgree(const Model& m, const ParallelContext& pc, const std::string& what) {
  for (const Parameter& p : m.registry.params()) {
    if (!p.trainable) continue;
    Communicator& copies = parallel::GroupOf(pc, p.view, p.replicated);
    const int64_t n = p.grad.numel();
    Tensor all = Tensor::Empty({copies.size() * n}, DType::kF32);
    copies.AllGather(p.grad.Reshape({n}), all);
    const std::vector<float> mine = p.grad.ToVector<float>(), every = all.ToVector<float>();
    int64_t bad = 0;
    for (int r = 0; r < copies.size(); ++r) {
      for (int64_t k = 0; k < n; ++k) {
        bad += std::bit_cast<uint32_t>(every[r * n + k]) != std::bit_cast<uint32_t>(mine[k]);
      }
    }
    EXPECT_EQ(bad, 0) << what << ": " << p.Describe() << ": " << bad
                      << " elements differ between its copies";
  }
}

// The whole model's gradient norm from the tree sums, on one rank with a registry of whole
// (unsharded) tensors and no communicators.
double WholeNorm(const Model& m, const ParallelContext& pc, int salt) {
  ParameterRegistry whole;
  for (size_t i = 0; i < m.registry.params().size(); ++i) {
    const Parameter& p = m.registry.params()[i];
    if (!p.trainable) continue;
    const int replicas = GroupOf(pc, p).size();
    std::vector<float> g(NumElements(p.global_shape));
    for (int64_t j = 0; j < static_cast<int64_t>(g.size()); ++j) {
      g[j] = TreeSum(m.pid[i] + salt, j, replicas);
    }
    whole.Add(Parameter::Dense(p.name, Tensor::Zeros(p.global_shape, DType::kF32),
                               Tensor::FromVector(g, p.global_shape), true));
  }
  auto one = dist::MakeLocalCommunicator();
  auto pc1 = ParallelContext::Create(*one, Mesh::Create(1, {}).value());
  SY_CHECK_OK(pc1.status());
  return parallel::GlobalGradNorm(whole, **pc1);
}

struct Layout {
  std::string name;
  MeshSizes sizes;
};

// Every layout whose sizes divide `world` (etp unset means etp = tp).
std::vector<Layout> Layouts(int world) {
  std::vector<Layout> out = {{"tp=2 (etp=2)", {.tp = 2}},
                             {"ep=world/2", {.ep = std::max(1, world / 2)}},
                             {"ep=world", {.ep = world}}};
  if (world >= 4) {
    out.push_back({"tp=2,ep=2,etp=1", {.tp = 2, .ep = 2, .etp = 1}});
    out.push_back({"tp=1,ep=2,etp=2", {.tp = 1, .ep = 2, .etp = 2}});
    out.push_back({"cp=2,ep=world/2", {.cp = 2, .ep = world / 2}});
    out.push_back({"tp=4 (etp=4)", {.tp = 4}});
  }
  if (world >= 8) {
    out.push_back({"tp=2,ep=2,etp=2", {.tp = 2, .ep = 2, .etp = 2}});
    out.push_back({"tp=2,cp=2,ep=4,etp=1", {.tp = 2, .cp = 2, .ep = 4, .etp = 1}});
    out.push_back({"tp=4,ep=2,etp=1", {.tp = 4, .ep = 2, .etp = 1}});
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
      if (pc.rank() == 0) std::printf("    %-22s cap %-9lld %s\n", layout.name.c_str(),
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
      if (cap == 200 && want.size() >= 3) {
        EXPECT_LT(buckets.size(), want.size());  // some share a bucket
      }

      // 1. The synchronous path; afterwards the copies of every box agree.
      int64_t order_shows = 0;
      FillGrads(m, pc, 0);
      References ref = MakeReferences(m, pc);
      sync.SyncAll();
      order_shows += ExpectSynced(m, pc, ref, 0, "SyncAll");
      ExpectReplicasAgree(m, pc, "SyncAll");

      // 2. MarkReady in reverse registration order (as backward produces them), Finish.
      FillGrads(m, pc, 1);
      ref = MakeReferences(m, pc);
      for (size_t i = m.registry.params().size(); i-- > 0;) sync.MarkReady(i);
      sync.Finish();
      order_shows += ExpectSynced(m, pc, ref, 1, "MarkReady reverse + Finish");

      // 3. Another step: a scrambled order that differs per rank, some parameters never
      // marked (Finish launches their buckets), the same result.
      FillGrads(m, pc, 2);
      ref = MakeReferences(m, pc);
      std::vector<size_t> order(m.registry.params().size());
      std::iota(order.begin(), order.end(), size_t{0});
      std::rotate(order.begin(), order.begin() + (pc.rank() * 3) % order.size(), order.end());
      for (size_t k = 0; k < order.size(); ++k) {
        if ((k + pc.rank()) % 3 != 0) sync.MarkReady(order[k]);
      }
      sync.Finish();
      order_shows += ExpectSynced(m, pc, ref, 2, "scrambled MarkReady + Finish");
      ExpectReplicasAgree(m, pc, "scrambled MarkReady + Finish");

      // 4. Finish alone syncs everything.
      FillGrads(m, pc, 3);
      ref = MakeReferences(m, pc);
      sync.Finish();
      order_shows += ExpectSynced(m, pc, ref, 3, "Finish only");

      // With 4 or more replicas the tree and a left-to-right sum differ on some elements,
      // so the bitwise checks above would catch a sync that sums in another order.
      int most = 1;
      for (const Parameter& p : m.registry.params())
        if (p.trainable) most = std::max(most, GroupOf(pc, p).size());
      if (most >= 4) {
        EXPECT_GT(order_shows, 0) << "the values do not tell the summation orders apart";
      }
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

    const double norm = parallel::GlobalGradNorm(m.registry, pc);
    const double whole = WholeNorm(m, pc, 5);
    EXPECT_GT(whole, 1.0);
    EXPECT_NEAR(norm, whole, 1e-6 * whole);
    if (pc.rank() == 0) std::printf("    %-22s global norm %.6f, whole model %.6f\n",
                                    layout.name.c_str(), norm, whole);

    // Clipping to half: every rank scales by the same factor; the new norm is max_norm.
    std::vector<std::vector<float>> before;
    for (const Parameter& p : m.registry.params())
      before.push_back(p.trainable ? p.grad.ToVector<float>() : std::vector<float>{});
    const double max_norm = whole / 2;
    EXPECT_NEAR(parallel::ClipGradNorm(m.registry, max_norm, pc), whole, 1e-6 * whole);
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
    EXPECT_NEAR(parallel::GlobalGradNorm(m.registry, pc), max_norm, 1e-5 * max_norm);
  }
}

}  // namespace
}  // namespace switchyard::parallel
