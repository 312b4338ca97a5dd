// Hot-expert replication (moe/replication.h) on 2, 4 and 8 ranks: the MoE layer with
// replicas against the same layer without them, on the same ep group, weights and rows.
//
// Checked: routing, statistics and aux/z are identical (replication acts after routing);
// replica slots hold their owners' weights bit for bit, also after the owners change; y
// and dh are those of the unreplicated layer (each row's output and input gradient is
// computed from the same weights by row-wise kernels): bit for bit where this machine's
// GEMM gives a row the same result whatever rows surround it, and in any case within twice
// the reference's per-element forward bound (tests/moe/moe_layer_test_util.h) for y and
// 1e-5 in relative norm for dh; the router gradient is summed from those rows in the same
// order (the same bound); each expert's weight gradient is the unreplicated sum of the
// same per-row terms split into partial sums (the owner's rows, then each replica's, added
// in the plan's order), so both are within gamma_m S of the exact sum (S = the sum of the
// terms' magnitudes, tests/testing/tolerance.h): |g - g_ref| <= 2 (m + 3) u S. Replica
// gradients are cleared after the push. The relief is real: replicas received rows and the
// busiest rank received fewer.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "engine/dist/process.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"
#include "moe/replication.h"
#include "tests/moe/moe_layer_test_util.h"
#include "tests/testing/tolerance.h"

namespace switchyard::moe {
namespace {

constexpr uint64_t kDataSeed = 515;

Tensor GlobalNormal(const Shape& shape, uint64_t stream, float std = 1.0f) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillNormal(t, RngKey{kDataSeed, stream}, 0, 0.0f, std);
  return t;
}

struct Case {
  std::string name;
  int64_t top_k;
  Activation activation;
  bool bias;
  float capacity_factor;
  int64_t hot;
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

MoEConfig ConfigOf(const Case& c) {
  MoEConfig config = testing::Config(/*E=*/16, c.top_k, c.activation);
  config.bias = c.bias;
  config.capacity_factor = c.capacity_factor;
  config.aux_loss_coef = 0.01f;
  config.z_loss_coef = 0.001f;
  // Skew: the aux-loss-free bias pulls most first choices onto experts 0, 1 and 5.
  config.expert_bias_rate = 0.001f;
  return config;
}

MoELayer Layer(const MoEConfig& config, dist::Communicator* ep) {
  MoELayer layer = testing::MakeLayer(config, ep);
  // The same biases on every layout: Init's zeros (MakeLayer's fill is per rank's slice)
  // would do, but make them non-zero from the global expert index.
  if (Tensor b1 = layer.experts().b1(); b1.defined()) {
    const ExpertsOptions& o = layer.experts().options();
    kernels::FillNormal(b1, RngKey{kDataSeed, 31}, o.first * o.d_hidden, 0.0f, 0.2f);
    Tensor b2 = layer.experts().b2();
    kernels::FillNormal(b2, RngKey{kDataSeed, 32}, o.first * o.d_model, 0.0f, 0.2f);
  }
  std::vector<float> bias(config.num_experts, 0.0f);
  bias[0] = 1.5f, bias[1] = 1.0f, bias[5] = 0.8f;
  layer.expert_bias().CopyFrom(Tensor::FromVector(bias, {config.num_experts}));
  return layer;
}

std::vector<float> Values(const Tensor& t) { return t.ToVector<float>(); }

int64_t MaxOver(dist::Communicator& comm, int64_t v) {
  Tensor t = Tensor::FromVector<int64_t>({v}, {1});
  comm.AllReduce(t, dist::ReduceOp::kMax);
  return t.data<int64_t>()[0];
}

int64_t SumOver(dist::Communicator& comm, int64_t v) {
  Tensor t = Tensor::FromVector<int64_t>({v}, {1});
  comm.AllReduce(t, dist::ReduceOp::kSum);
  return t.data<int64_t>()[0];
}

// Replica slot s of this rank holds its expert's weights, bit for bit.
void ExpectReplicaWeights(const MoELayer& layer, const MoELayer& whole, int rank) {
  const ReplicaPlan& plan = layer.replica_plan();
  const Experts& slots = layer.replicas()->experts();
  for (int64_t s = 0; s < plan.slots(); ++s) {
    const int64_t e = plan.ExpertInSlot(rank, s);
    if (e < 0) continue;
    const Experts& all = whole.experts();
    EXPECT_EQ(Values(slots.w1().Slice(s, s + 1)), Values(all.w1().Slice(e, e + 1))) << "w1 e" << e;
    EXPECT_EQ(Values(slots.w2().Slice(s, s + 1)), Values(all.w2().Slice(e, e + 1))) << "w2 e" << e;
    if (all.w3().defined()) {
      EXPECT_EQ(Values(slots.w3().Slice(s, s + 1)), Values(all.w3().Slice(e, e + 1)));
    }
    if (all.b1().defined()) {
      EXPECT_EQ(Values(slots.b1().Slice(s, s + 1)), Values(all.b1().Slice(e, e + 1)));
    }
  }
}

// out (and the layers' gradients) of the replicated layer against the plain one.
void ExpectSame(const MoEForward& got, const MoEForward& want, const Tensor& dh, const Tensor& want_dh,
                const std::vector<double>& y_bound, const std::string& what) {
  EXPECT_EQ(got.groups.aux, want.groups.aux) << what;
  EXPECT_EQ(got.groups.z, want.groups.z) << what;
  EXPECT_EQ(got.stats.tokens_per_expert_kept, want.stats.tokens_per_expert_kept) << what;
  EXPECT_EQ(got.stats.tokens_per_expert, want.stats.tokens_per_expert) << what;
  const std::vector<float> y = Values(got.y), y_want = Values(want.y);
  const bool exact_y = y == y_want, exact_dh = Values(dh) == Values(want_dh);
  if (dist::WorldRank() == 0)
    std::printf("    %s: y %s, dh %s\n", what.c_str(), exact_y ? "bit for bit" : "within bound",
                exact_dh ? "bit for bit" : "within bound");
  testing::ExpectWithinBound(y, y_want, y_bound, what + " y", /*factor=*/2.0);
  test_util::ExpectRelativeNormWithin(Values(dh), Values(want_dh), 1e-5, what + " dh");
}

class MoEReplicationTest : public ::testing::TestWithParam<Case> {};

TEST_P(MoEReplicationTest, EqualsNoReplication) {
  const Case& c = GetParam();
  auto world = dist::WorldCommunicator();
  const int R = world->size(), me = world->rank();
  const MoEConfig config = ConfigOf(c);
  const int64_t T = 32, G = 2 * R, N = G * T, d = config.d_model, E = config.num_experts;
  const int64_t step = 2, g0 = me * G / R, g1 = (me + 1) * G / R;
  Tensor h_all = GlobalNormal({N, d}, 1), dy_all = GlobalNormal({N, d}, 2);
  const std::vector<float> dloss(G, 1.0f / G), d_mine(g1 - g0, 1.0f / G);
  Tensor h = h_all.Slice(g0 * T, g1 * T), dy = dy_all.Slice(g0 * T, g1 * T);

  // The one-rank layer: the per-element y bound and the gradient terms' magnitudes.
  auto local = dist::MakeLocalCommunicator();
  MoELayer whole = Layer(config, local.get());
  const testing::Reference bounds = testing::ReferenceForward(whole, h_all, T, true, step, 0);
  MoEForward whole_out = whole.Forward(h_all, T, true, step, 0);
  const std::vector<std::vector<double>> terms =
      testing::TermScale(whole, whole_out.acts, dy_all, dloss, dloss);
  const std::vector<double> y_bound(bounds.y_bound.begin() + g0 * T * d,
                                    bounds.y_bound.begin() + g1 * T * d);
  const int64_t m = N + G + R;  // roundings per gradient term, either side

  // The plain layer, and the replicated one planned from the world's counts of this batch.
  MoELayer plain = Layer(config, world.get());
  MoELayer replicated = Layer(config, world.get());
  MoEForward want = plain.Forward(h, T, true, step, g0 * T);
  MoEStats counts = want.stats;
  counts.AllReduce(*world);
  const ReplicaPlan plan = ReplicaPlan::Balance(counts.tokens_per_expert_kept, R, c.hot);
  if (me == 0) std::printf("    plan: %s\n", plan.ToString().c_str());
  ASSERT_FALSE(plan.empty()) << "the skew is meant to need replicas";
  replicated.SetReplicaPlan(plan);
  MoEForward got = replicated.Forward(h, T, true, step, g0 * T);
  ExpectReplicaWeights(replicated, whole, me);
  Tensor want_dh = plain.Backward(want.acts, dy, d_mine, d_mine);
  Tensor dh = replicated.Backward(got.acts, dy, d_mine, d_mine);
  ExpectSame(got, want, dh, want_dh, y_bound, "step 1");

  // The relief: replicas ran rows, and the busiest rank received fewer than without them.
  const int64_t replica_rows = got.acts.plan->num_received() - got.acts.owned_rows;
  EXPECT_GT(SumOver(*world, replica_rows), 0);
  EXPECT_EQ(SumOver(*world, got.acts.plan->num_received()),
            SumOver(*world, want.acts.plan->num_received()));
  const int64_t max_before = MaxOver(*world, want.acts.plan->num_received());
  const int64_t max_after = MaxOver(*world, got.acts.plan->num_received());
  const double mean = static_cast<double>(SumOver(*world, want.acts.plan->num_received())) / R;
  if (me == 0)
    std::printf("    busiest rank / mean: %.3f -> %.3f\n", max_before / mean, max_after / mean);
  EXPECT_LT(max_after, max_before);

  // Gradients: the router's from the same rows; the experts' from partial sums.
  test_util::ExpectWithinProductBound(Values(replicated.grad_router_weight()),
                                      Values(plain.grad_router_weight()), terms[0], m,
                                      "router.weight grad");
  const std::vector<parallel::Parameter> mine = replicated.experts().Parameters();
  const std::vector<parallel::Parameter> ref = plain.experts().Parameters();
  const int64_t per_rank = E / R, first = me * per_rank;
  for (size_t i = 0; i < mine.size(); ++i) {
    const std::vector<double>& t = terms[1 + i];
    const size_t per = t.size() / E;
    test_util::ExpectWithinProductBound(
        Values(mine[i].grad), Values(ref[i].grad),
        std::vector<double>(t.begin() + first * per, t.begin() + (first + per_rank) * per), m,
        "experts." + mine[i].name + " grad");
  }
  for (const Tensor& g : {replicated.replicas()->experts().grad_w1(),
                          replicated.replicas()->experts().grad_w2()}) {
    const std::vector<float> v = Values(g);
    EXPECT_TRUE(std::all_of(v.begin(), v.end(), [](float x) { return x == 0.0f; }))
        << "replica gradients are cleared after the push";
  }

  // The owners' weights change (one SGD step on the plain layer's gradients, on both layers
  // and the whole one): the replicas follow after MarkExpertsUpdated.
  auto sgd = [&](MoELayer& layer, const MoELayer& from, int64_t first_expert, int64_t count) {
    std::vector<parallel::Parameter> p = layer.experts().Parameters();
    std::vector<parallel::Parameter> g = from.experts().Parameters();
    for (size_t i = 0; i < p.size(); ++i) {
      Tensor grad = g[i].grad.Slice(first_expert, first_expert + count).Clone();
      kernels::Axpy(-0.5f, grad, p[i].value);
    }
  };
  sgd(replicated, plain, 0, per_rank);
  sgd(plain, plain, 0, per_rank);
  {
    // The whole layer's copy of the step: every rank's gradients, gathered.
    std::vector<parallel::Parameter> p = whole.experts().Parameters();
    std::vector<parallel::Parameter> g = plain.experts().Parameters();
    for (size_t i = 0; i < p.size(); ++i) {
      Tensor all = Tensor::Zeros(p[i].value.shape(), DType::kF32);
      all.Slice(first, first + per_rank).CopyFrom(g[i].value);
      world->AllReduce(all, dist::ReduceOp::kSum);  // each slice from its owner alone
      p[i].value.CopyFrom(all);
    }
  }
  replicated.MarkExpertsUpdated();
  replicated.ZeroGrad();
  plain.ZeroGrad();
  MoEForward got2 = replicated.Forward(h, T, true, step + 1, g0 * T);
  MoEForward want2 = plain.Forward(h, T, true, step + 1, g0 * T);
  ExpectReplicaWeights(replicated, whole, me);
  Tensor dh2 = replicated.Backward(got2.acts, dy, d_mine, d_mine);
  Tensor want_dh2 = plain.Backward(want2.acts, dy, d_mine, d_mine);
  EXPECT_EQ(Values(got2.y) == Values(want2.y), Values(got.y) == Values(want.y))
      << "after the update, y is as exact as before";
  test_util::ExpectRelativeNormWithin(Values(got2.y), Values(want2.y), 1e-5, "step 2 y");
  test_util::ExpectRelativeNormWithin(Values(dh2), Values(want_dh2), 1e-5, "step 2 dh");
}

INSTANTIATE_TEST_SUITE_P(
    Configs, MoEReplicationTest,
    ::testing::Values(Case{"top1_gelu_dropless", 1, Activation::kGelu, false, 0.0f, 2},
                      Case{"top2_swiglu_cf2", 2, Activation::kSwiglu, false, 2.0f, 3},
                      Case{"top2_relu_bias_dropless", 2, Activation::kRelu, true, 0.0f, 1}),
    [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace switchyard::moe
