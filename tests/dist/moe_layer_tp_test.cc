// The MoE layer under tensor (sequence) parallelism and expert tensor parallelism (run with
// 2, 4 and 8 ranks) against one rank: MODEL.md section 4's whole routing groups.
//
// Each data-parallel replica (dense view) routes kGroups groups of kTokens tokens in one
// Forward; its tp ranks each hold kTokens / tp rows of every group (group_tokens = the local
// rows, first_token = the replica's first group's first token). The experts are split over
// ep and, with etp > 1, over their hidden units. Every rank also runs a one-rank reference
// layer (a local communicator, every expert whole, the same seed) over ALL groups of the
// world.
//
// Checked against the reference: the layer's parameters are boxes of the reference's
// (bitwise, Init keyed by the global element); per group, the kept counts per expert and the
// drops are identical, and so are aux and z (every tp rank routes the whole group from the
// same gathered logits); y and dh of this rank's rows; every gradient summed over its
// description's grad_sum group (exactly what the gradient sync does) against the matching
// box of the reference's gradient (the sum over all groups); MoEStats summed over the world
// against the reference's.
//
// Layouts (tp, ep, etp), each run when the world size allows it: tp 2; tp 2 x ep 2 (etp 1,
// Megatron's folding puts the tp ranks in one ep group); tp 1 x etp 2 with ep 1 and ep 2;
// tp 2 x etp 2; tp 2 x ep 2 x etp 2; tp 4 x ep 2 x etp 2. Cases: top-1 and top-2 (GShard's
// random second expert), position and probability drop policies, capacity factors that drop,
// swiglu with a shared expert and biases, the aux-loss-free expert bias, router jitter.
//
// Tolerances: routing decisions, counts, aux and z exactly. y: both sides are f32
// evaluations of the same layer on the same rows (the router logits of T/tp rows vs T rows
// and the etp partial sums only change the order of sums), each within ReferenceForward's
// y_bound (tests/moe/moe_layer_test_util.h) of the exact value: |y - y_ref| <= 2 y_bound.
// Gradients: the same per-token terms added in another order (own rows, then the sum over
// the description's grad_sum group), so by the "Accumulation bounds" of
// tests/moe/moe_layer_grad_test.cc |g - g_ref| <= 2 (m + 3) u S, S = TermScale (the sum over
// tokens of |token t's contribution|) boxed like the gradient, m <= N + G + R (N tokens, G
// router GEMMs, R - 1 additions over ranks). dh: 1e-5 in relative norm, each element 1e-5 of
// the tensor's largest. Rank 0 prints, per case and layout, "bit-identical" or the worst
// difference over the world relative to the tensor's largest element, and how much of the
// bound (tolerance, for dh) it used.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "engine/core/step_readback.h"
#include "engine/dist/mesh.h"
#include "engine/dist/parallel_context.h"
#include "engine/dist/process.h"
#include "engine/parallel/grad_sync.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"
#include "tests/moe/moe_layer_test_util.h"
#include "tests/testing/tolerance.h"

namespace switchyard::moe {
namespace {

constexpr uint64_t kDataSeed = 91;
constexpr uint64_t kModelSeed = 17;
constexpr int64_t kLayer = 1;
constexpr int64_t kTokens = 32;  // T, per routing group
constexpr int64_t kGroups = 2;   // G, per data-parallel replica and Forward
constexpr int64_t kStep = 3;
constexpr float kInitStd = 0.3f;  // O(1) router logits and expert outputs

// The same (shape) tensor on every rank.
Tensor GlobalNormal(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillNormal(t, RngKey{kDataSeed, stream}, 0, 0.0f, 1.0f);
  return t;
}

// The box of `whole` that `p` describes (offset p.offset, shape p.value.shape()).
Tensor Box(const Tensor& whole, const parallel::Parameter& p) {
  const Shape& local = p.value.shape();
  Tensor out = Tensor::Empty(local, DType::kF32);
  const int nd = static_cast<int>(local.size());
  std::vector<int64_t> idx(nd, 0);
  const float* w = whole.data<float>();
  float* o = out.data<float>();
  for (int64_t n = 0; n < out.numel(); ++n) {
    int64_t at = 0;
    for (int d = 0; d < nd; ++d) at = at * whole.dim(d) + idx[d] + p.OffsetAt(d);
    o[n] = w[at];
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < local[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Rows [g * T + lo, g * T + hi) of every group g in [g0, g0 + G) of x (groups of T rows),
// one group after the other.
Tensor GroupRows(const Tensor& x, int64_t g0, int64_t groups, int64_t lo, int64_t hi) {
  Tensor out = Tensor::Empty({groups * (hi - lo), x.dim(1)}, x.dtype());
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t at = (g0 + g) * kTokens;
    out.Slice(g * (hi - lo), (g + 1) * (hi - lo)).CopyFrom(x.Slice(at + lo, at + hi));
  }
  return out;
}

// Box() of a double-precision scale laid out like `whole_shape`.
std::vector<double> BoxScale(const std::vector<double>& whole, const Shape& whole_shape,
                             const parallel::Parameter& p) {
  const Shape& local = p.value.shape();
  const int nd = static_cast<int>(local.size());
  std::vector<int64_t> idx(nd, 0);
  std::vector<double> out(p.value.numel());
  for (size_t n = 0; n < out.size(); ++n) {
    int64_t at = 0;
    for (int d = 0; d < nd; ++d) at = at * whole_shape[d] + idx[d] + p.OffsetAt(d);
    out[n] = whole[at];
    for (int d = nd - 1; d >= 0; --d) {
      if (++idx[d] < local[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Non-zero biases (Init leaves them at zero), keyed by the global element like the weights,
// so every layout's boxes hold the one-rank values.
void FillBiases(MoELayer& layer) {
  for (parallel::Parameter& p : layer.Parameters()) {
    const std::string& n = p.name;
    const std::string last = n.substr(n.rfind('.') + 1);
    if (last != "b1" && last != "b2") continue;
    parallel::FillNormalBox(p.value, p.global_shape, p.offset, kModelSeed, "test." + n, 0.0f,
                            0.2f);
  }
  if (Tensor b = layer.expert_bias(); b.defined()) {
    std::vector<float> v(b.numel());
    for (size_t e = 0; e < v.size(); ++e) v[e] = 0.01f * static_cast<float>((e * 5) % 7) - 0.03f;
    b.CopyFrom(Tensor::FromVector(v, {b.numel()}));
  }
}

// How close one quantity came, over the world.
struct Closeness {
  double worst_rel = 0;  // max |got - want| / max |want| (per tensor)
  double used = 0;       // max relative norm error / 1e-5
  bool identical = true;
};

// ||got - want|| / ||want|| <= 1e-5 (2-norms) and each |got - want| <= 1e-5 max |want|
// (EXPECT); adds into c. Bounds on the whole tensor and at its scale, which no summation order
// (OpenBLAS's kernel for this machine, the etp partial sums) can break where an element
// cancels, as an elementwise relative error with a tiny floor can (tests/testing/tolerance.h).
void ExpectClose(const Tensor& got, const Tensor& want, const std::string& what, Closeness& c) {
  EXPECT_EQ(got.numel(), want.numel()) << what;
  if (got.numel() != want.numel()) return;
  const std::vector<float> g = got.ToVector<float>(), w = want.ToVector<float>();
  double scale = 0;
  for (float v : w) scale = std::max(scale, double(std::abs(v)));
  const double rel = test_util::RelativeNormError(g, w);
  EXPECT_LE(rel, 1e-5) << what << ": relative norm error " << rel;
  c.used = std::max(c.used, rel / 1e-5);
  int64_t bad = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::abs(double(g[i]) - w[i]);
    const double tol = 1e-5 * scale;
    if (g[i] != w[i]) c.identical = false;
    if (scale > 0) c.worst_rel = std::max(c.worst_rel, err / scale);
    if (!(err <= tol) && bad++ < 3) {
      ADD_FAILURE() << what << "[" << i << "] = " << g[i] << ", reference " << w[i] << " (tol "
                    << tol << ")";
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << g.size() << " elements off";
}

// |got - want| <= factor bound elementwise (EXPECT); adds the fraction used into c.
void ExpectWithin(const Tensor& got, const Tensor& want, const std::vector<double>& bound,
                  double factor, const std::string& what, Closeness& c) {
  EXPECT_EQ(got.numel(), want.numel()) << what;
  EXPECT_EQ(static_cast<int64_t>(bound.size()), want.numel()) << what;
  if (got.numel() != want.numel() || static_cast<int64_t>(bound.size()) != want.numel()) return;
  const std::vector<float> g = got.ToVector<float>(), w = want.ToVector<float>();
  const test_util::BoundUsed used = test_util::WorstFractionOfBound(g, w, bound, factor);
  EXPECT_LE(used.fraction, 1.0) << what << "[" << used.index << "] = " << g[used.index]
                                << ", reference " << w[used.index] << " (bound "
                                << factor * bound[used.index] << ")";
  c.used = std::max(c.used, used.fraction);
  double scale = 0;
  for (float v : w) scale = std::max(scale, double(std::abs(v)));
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] != w[i]) c.identical = false;
    if (scale > 0) c.worst_rel = std::max(c.worst_rel, std::abs(double(g[i]) - w[i]) / scale);
  }
}

// Rank 0 prints c's worst over the world.
void Report(dist::Communicator& world, const char* what, const Closeness& c) {
  Tensor v = Tensor::FromVector<double>({c.worst_rel, c.used, c.identical ? 0.0 : 1.0}, {3});
  world.AllReduce(v, dist::ReduceOp::kMax);
  const double* p = v.data<double>();
  if (world.rank() != 0) return;
  if (p[2] == 0) {
    std::printf("    %-16s bit-identical\n", what);
  } else {
    std::printf("    %-16s worst difference %.2e of the largest element (bound used %.3f)\n",
                what, p[0], p[1]);
  }
}

struct Case {
  std::string name;
  MoEConfig config;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

MoEConfig BaseConfig() {
  MoEConfig c;
  c.d_model = 8;
  c.num_experts = 8;  // divisible by ep = 1, 2, 4, 8
  c.d_expert = 8;     // divisible by etp = 1, 2, 4, 8
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  return c;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  {
    Case c{"top1_position_drops", BaseConfig()};
    c.config.top_k = 1;
    c.config.capacity_factor = 1.0f;  // C = 4 of 32 tokens over 8 experts
    cases.push_back(c);
  }
  {
    Case c{"top1_probability_relu_bias_jitter", BaseConfig()};
    c.config.top_k = 1;
    c.config.activation = Activation::kRelu;
    c.config.bias = true;
    c.config.drop_policy = DropPolicy::kProbability;
    c.config.capacity_factor = 0.75f;
    c.config.jitter_eps = 0.1f;
    cases.push_back(c);
  }
  {
    // GShard: top-2, random second expert, position policy; swiglu, a shared expert, the
    // aux-loss-free expert bias and jitter keyed by the global token.
    Case c{"top2_random_position_swiglu_shared", BaseConfig()};
    c.config.top_k = 2;
    c.config.second_expert_policy = SecondExpertPolicy::kRandom;
    c.config.activation = Activation::kSwiglu;
    c.config.capacity_factor = 0.5f;
    c.config.num_shared_experts = 2;
    c.config.d_shared = 4;
    c.config.expert_bias_rate = 0.001f;
    c.config.jitter_eps = 0.05f;
    cases.push_back(c);
  }
  {
    Case c{"top2_random_probability_swiglu_shared_bias", BaseConfig()};
    c.config.top_k = 2;
    c.config.second_expert_policy = SecondExpertPolicy::kRandom;
    c.config.drop_policy = DropPolicy::kProbability;
    c.config.activation = Activation::kSwiglu;
    c.config.normalize_gates = true;
    c.config.bias = true;
    c.config.capacity_factor = 0.75f;
    c.config.num_shared_experts = 1;
    c.config.expert_bias_rate = 0.001f;
    cases.push_back(c);
  }
  {
    // DeepSeek-V3's router: sigmoid scores, normalised gates, node-limited routing (4 groups
    // of 2 experts, 2 groups per token), the expert bias, and the sequence-wise aux loss
    // over sequences of 12 tokens (straddling the tp pieces; the last one shorter).
    Case c{"top2_sigmoid_node_limited_sequence_aux", BaseConfig()};
    c.config.top_k = 2;
    c.config.score = ScoreFunction::kSigmoid;
    c.config.normalize_gates = true;
    c.config.route_groups = 4;
    c.config.route_group_topk = 2;
    c.config.expert_bias_rate = 0.001f;
    c.config.aux_loss_scope = AuxLossScope::kSequence;
    c.config.seq_len = 12;
    c.config.aux_loss_coef = 0.1f;
    c.config.capacity_factor = 1.0f;
    cases.push_back(c);
  }
  return cases;
}

struct Layout {
  int tp = 1, ep = 1, etp = 1;
  std::string Name() const { return StrCat("tp ", tp, " x ep ", ep, " x etp ", etp); }
};

const std::vector<Layout>& Layouts() {
  static const std::vector<Layout> layouts = {{2, 1, 1}, {2, 2, 1}, {1, 1, 2}, {1, 2, 2},
                                              {2, 1, 2}, {2, 2, 2}, {4, 2, 2}};
  return layouts;
}

void CheckLayout(const Case& c, dist::Communicator& world, const Layout& layout) {
  const MoEConfig& config = c.config;
  const int64_t d = config.d_model, E = config.num_experts;
  auto mesh = dist::Mesh::Create(world.size(), {.tp = layout.tp, .ep = layout.ep,
                                                .etp = layout.etp});
  ASSERT_TRUE(mesh.ok()) << mesh.status();  // the same on every rank
  auto pc_or = dist::ParallelContext::Create(world, *mesh);
  ASSERT_TRUE(pc_or.ok()) << pc_or.status();
  const dist::ParallelContext& pc = **pc_or;
  const int tp = pc.tp().size(), tr = pc.tp().rank();
  const int64_t replicas = mesh->dp(), all_groups = replicas * kGroups;
  const int64_t replica = mesh->Coord(world.rank(), dist::View::kDense, dist::Axis::kDp);
  const int64_t g0 = replica * kGroups, rows = kTokens / tp, lo = tr * rows, hi = lo + rows;
  if (world.rank() == 0) {
    std::printf("[ %s, %s: %s ]\n", c.name.c_str(), layout.Name().c_str(),
                mesh->Summary().c_str());
  }

  // The one-rank reference over every group of the world.
  auto local = dist::MakeLocalCommunicator();
  MoELayer ref = MoELayer::Init(config, kLayer, local.get(), kModelSeed, kInitStd);
  FillBiases(ref);
  const int64_t n_all = all_groups * kTokens;
  Tensor h_all = GlobalNormal({n_all, d}, 1), dy_all = GlobalNormal({n_all, d}, 2);
  std::vector<float> daux_all, dz_all;
  for (int64_t g = 0; g < all_groups; ++g) {
    daux_all.push_back(0.5f + 0.125f * g);
    dz_all.push_back(0.25f + 0.0625f * g);
  }
  MoEForward ref_out = ref.Forward(h_all, kTokens, true, kStep, /*first_token=*/0);
  const moe::testing::Reference bounds =
      moe::testing::ReferenceForward(ref, h_all, kTokens, true, kStep, /*first_token=*/0);
  // TermScale clobbers the gradients: before the reference's Backward.
  const std::vector<std::vector<double>> terms =
      moe::testing::TermScale(ref, ref_out.acts, dy_all, daux_all, dz_all);
  Tensor ref_dh = ref.Backward(ref_out.acts, dy_all, daux_all, dz_all);
  const int64_t m = n_all + all_groups + world.size();  // roundings per gradient term
  EXPECT_GT(ref_out.stats.dropped(), 0) << "the case is meant to drop assignments";

  // The layout. (EXPECT, not ASSERT, from here on: every rank must reach every collective.)
  MoELayer layer = MoELayer::Init(config, kLayer, MoEParallel{&pc.ep(), &pc.tp(), &pc.etp()},
                                  kModelSeed, kInitStd);
  FillBiases(layer);
  std::vector<parallel::Parameter> params = layer.Parameters(), whole = ref.Parameters();
  EXPECT_EQ(params.size(), whole.size());
  const size_t np = std::min(params.size(), whole.size());
  for (size_t i = 0; i < np; ++i) {
    params[i].CheckConsistent();
    EXPECT_EQ(params[i].name, whole[i].name);
    EXPECT_EQ(params[i].global_shape, whole[i].global_shape) << params[i].Describe();
    EXPECT_EQ(Box(whole[i].value, params[i]).ToVector<float>(), params[i].value.ToVector<float>())
        << "Init is layout independent: " << params[i].Describe();
  }

  // This rank's rows of its replica's groups.
  Tensor h = GroupRows(h_all, g0, kGroups, lo, hi), dy = GroupRows(dy_all, g0, kGroups, lo, hi);
  const std::vector<float> daux(daux_all.begin() + g0, daux_all.begin() + g0 + kGroups);
  const std::vector<float> dz(dz_all.begin() + g0, dz_all.begin() + g0 + kGroups);
  MoEForward out = layer.Forward(h, rows, true, kStep, g0 * kTokens);
  Tensor dh = layer.Backward(out.acts, dy, daux, dz);

  // The whole groups' values: identical to one rank's, on every tp rank.
  EXPECT_EQ(out.groups.aux.size(), static_cast<size_t>(kGroups));
  for (int64_t g = 0; g < kGroups && g < static_cast<int64_t>(out.groups.aux.size()); ++g) {
    EXPECT_EQ(out.groups.aux[g], ref_out.groups.aux[g0 + g]) << "aux of group " << g0 + g;
    EXPECT_EQ(out.groups.z[g], ref_out.groups.z[g0 + g]) << "z of group " << g0 + g;
    EXPECT_EQ(out.groups.dropped[g], ref_out.groups.dropped[g0 + g]) << "group " << g0 + g;
    const auto kept = out.groups.tokens_per_expert_kept.begin() + g * E;
    const auto want = ref_out.groups.tokens_per_expert_kept.begin() + (g0 + g) * E;
    EXPECT_EQ(std::vector<int64_t>(kept, kept + E), std::vector<int64_t>(want, want + E))
        << "kept per expert in group " << g0 + g;
  }
  // The kept assignments of this rank's rows are one rank's.
  EXPECT_EQ(out.acts.kept_all.ToVector<uint8_t>(),
            GroupRows(ref_out.acts.kept_all, g0, kGroups, lo, hi).ToVector<uint8_t>());

  Closeness cy, cdh, crouter, cexperts, cshared;
  // ReferenceForward models the softmax router without group limits; for the others y is
  // held to ExpectClose's norm-wise and at-scale bounds (the routing itself, aux and the
  // kept assignments are compared exactly above).
  if (config.score == ScoreFunction::kSoftmax && config.route_groups == 0) {
    ExpectWithin(out.y, GroupRows(ref_out.y, g0, kGroups, lo, hi),
                 GroupRows(Tensor::FromVector(bounds.y_bound, {n_all, d}), g0, kGroups, lo, hi)
                     .ToVector<double>(),
                 2.0, "y", cy);
  } else {
    ExpectClose(out.y, GroupRows(ref_out.y, g0, kGroups, lo, hi), "y", cy);
  }
  ExpectClose(dh, GroupRows(ref_dh, g0, kGroups, lo, hi), "dh", cdh);
  // Each gradient summed over its description's group is the reference's, box by box.
  for (size_t i = 0; i < np; ++i) {
    const parallel::Parameter& p = params[i];
    if (!p.trainable) {
      EXPECT_FALSE(p.grad.defined()) << p.Describe();
      continue;
    }
    Tensor g = p.grad.Clone();
    if (!p.grad_sum.empty()) {
      parallel::GroupOf(pc, p.view, p.grad_sum).AllReduce(g, dist::ReduceOp::kSum);
    }
    Closeness& cl = p.name.rfind("router", 0) == 0    ? crouter
                    : p.name.rfind("experts", 0) == 0 ? cexperts
                                                      : cshared;
    ExpectWithin(g, Box(whole[i].grad, p), BoxScale(terms[i], whole[i].grad.shape(), p),
                 2.0 * (m + 3) * test_util::kF32Unit, "grad of " + p.Describe(), cl);
  }
  Report(world, "y", cy);
  Report(world, "dh", cdh);
  Report(world, "router grad", crouter);
  Report(world, "experts grads", cexperts);
  if (layer.shared()) Report(world, "shared grads", cshared);

  // The statistics summed over the world (tp x dp) are one rank's.
  MoEStats stats = out.stats;
  stats.AllReduce(world);
  const MoEStats& want = ref_out.stats;
  EXPECT_EQ(stats.tokens_per_expert, want.tokens_per_expert);
  EXPECT_EQ(stats.tokens_per_expert_kept, want.tokens_per_expert_kept);
  EXPECT_EQ(stats.tokens, want.tokens);
  EXPECT_EQ(stats.assignments, want.assignments);
  EXPECT_EQ(stats.groups, want.groups);
  EXPECT_EQ(stats.dropped(), want.dropped());
  EXPECT_NEAR(stats.entropy_sum, want.entropy_sum, 1e-5 * want.entropy_sum);
  EXPECT_NEAR(stats.aux_sum, want.aux_sum, 1e-6 * want.aux_sum);
  EXPECT_NEAR(stats.z_sum, want.z_sum, 1e-6 * want.z_sum);
  if (world.rank() == 0) {
    std::printf("    dropped %lld of %lld assignments, aux mean %.5f, z mean %.5f\n",
                static_cast<long long>(want.dropped()), static_cast<long long>(want.assignments),
                want.aux_mean(), want.z_mean());
  }

  // In a training step (a StepReadback open on the context) the sequence scope's terms stay
  // on the device (moe::BalanceTermsInto), the whole group's columns cut to this rank's rows:
  // the same aux, dh and gradients, bit for bit, as the host terms above on this layout.
  if (config.aux_loss_scope != AuxLossScope::kGroup) {
    std::vector<Tensor> grads;
    for (const parallel::Parameter& p : params) {
      grads.push_back(p.grad.defined() ? p.grad.Clone() : Tensor());
    }
    layer.ZeroGrad();
    auto cpu = DeviceContext::Create(Device::Cpu());
    StepReadback readback;
    cpu->set_step_readback(&readback);
    MoEForward step_out = layer.Forward(h, rows, true, kStep, g0 * kTokens, cpu.get());
    Tensor step_dh = layer.Backward(step_out.acts, dy, daux, dz, cpu.get());
    const std::vector<double> slots = readback.ReadBack(cpu.get());
    cpu->set_step_readback(nullptr);
    EXPECT_EQ(step_out.groups.aux.size(), out.groups.aux.size());
    for (size_t g = 0; g < std::min(out.groups.aux.size(), step_out.groups.aux.size()); ++g) {
      EXPECT_EQ(step_out.groups.aux[g].Value(slots), static_cast<double>(out.groups.aux[g]))
          << "aux of group " << g0 + g << " in a step";
    }
    EXPECT_EQ(step_dh.ToVector<float>(), dh.ToVector<float>()) << "dh in a step";
    for (size_t i = 0; i < np; ++i) {
      if (grads[i].defined()) {
        EXPECT_EQ(params[i].grad.ToVector<float>(), grads[i].ToVector<float>())
            << "grad of " << params[i].Describe() << " in a step";
      }
    }
  }
}

class MoELayerTpTest : public ::testing::TestWithParam<Case> {};

TEST_P(MoELayerTpTest, EveryLayoutEqualsOneRank) {
  auto world = dist::WorldCommunicator();
  const int R = world->size();
  int run = 0;
  for (const Layout& layout : Layouts()) {
    if (R % layout.tp != 0 || R % (layout.ep * layout.etp) != 0) {
      if (world->rank() == 0) {
        std::printf("[ %s, %s: not run on %d ranks ]\n", GetParam().name.c_str(),
                    layout.Name().c_str(), R);
      }
      continue;
    }
    SCOPED_TRACE(layout.Name());
    CheckLayout(GetParam(), *world, layout);
    ++run;
  }
  EXPECT_GE(run, 4) << "every world size of the registration runs the tp 2, tp 2 x ep 2, "
                       "etp 2 and tp 2 x etp 2 layouts";
}

// The layer rejects an etp that does not divide the experts' hidden size, naming the key.
TEST(MoELayerTpErrorsTest, EtpMustDivideTheHiddenSize) {
  MoEConfig c = BaseConfig();
  c.d_expert = 6;
  EXPECT_EQ(c.ExpertHiddenPerRank(4).status().message(),
            "parallel.etp=4 does not divide moe.d_expert=6");
  EXPECT_EQ(*c.ExpertHiddenPerRank(3), 2);
}

INSTANTIATE_TEST_SUITE_P(Configs, MoELayerTpTest, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace switchyard::moe
