// The token dispatcher over ep = world ranks (run with 1, 2, 4 and 8 ranks): dispatch then
// combine is the identity with unit gates and identity experts; every row reaches the
// rank and local expert that own its global expert; the backward phases are the adjoints
// of the forward ones.
#include "moe/dispatcher.h"

#include <algorithm>

#include <gtest/gtest.h>

#include "engine/core/philox.h"
#include "engine/dist/process.h"

namespace switchyard::moe {
namespace {

struct Routing {
  std::vector<int32_t> experts;
  std::vector<uint8_t> kept;
};

// Deterministic skewed routing for this rank: expert ~ (u^2 * E), ~20% drops, distinct
// experts per token; with `hot`, every assignment goes to expert 0 (one rank receives all).
Routing MakeRouting(int rank, int64_t n, int64_t k, int64_t e, bool hot) {
  Routing r;
  for (int64_t t = 0; t < n; ++t) {
    std::vector<int32_t> chosen;
    for (int64_t j = 0; j < k; ++j) {
      uint64_t idx = (static_cast<uint64_t>(rank) << 32) + t * k + j;
      float u = UniformAt({7, 1}, idx);
      int32_t x = hot ? 0 : static_cast<int32_t>(u * u * e);
      while (std::find(chosen.begin(), chosen.end(), x) != chosen.end()) x = (x + 1) % e;
      chosen.push_back(x);
      r.experts.push_back(x);
      r.kept.push_back(UniformAt({7, 2}, idx) > 0.2f ? 1 : 0);
    }
  }
  return r;
}

Tensor TokenRows(int rank, int64_t n, int64_t d) {
  std::vector<float> v(n * d);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < d; ++j) v[t * d + j] = static_cast<float>(rank * 1000 + t) + 0.125f * j;
  return Tensor::FromVector(v, {n, d});
}

class DispatcherTest : public ::testing::TestWithParam<std::tuple<int64_t, int64_t, bool>> {};

TEST_P(DispatcherTest, DispatchThenCombineIsTheIdentity) {
  auto [experts_per_rank, k, hot] = GetParam();
  auto world = dist::WorldCommunicator();
  const int ep = world->size(), me = world->rank();
  const int64_t e = experts_per_rank * ep, n = 13 + 5 * me, d = 3;
  if (k > e) GTEST_SKIP() << "k=" << k << " > E=" << e << " on " << ep << " ranks";
  Routing routing = MakeRouting(me, n, k, e, hot);
  DispatchPlan plan(routing.experts, routing.kept, n, k, e, ep);
  plan.ExchangeCounts(*world);
  Tensor h = TokenRows(me, n, d);

  Tensor grouped = Regroup(ExchangeRows(Permute(h, plan), plan, *world), plan);
  ASSERT_EQ(grouped.dim(0), plan.num_received());
  // "Expert" local e multiplies by its global index + 1, so the result shows who ran it.
  Tensor out = grouped.Clone();
  int64_t row = 0;
  for (int64_t le = 0; le < plan.experts_per_rank(); ++le) {
    const float scale = static_cast<float>(me * plan.experts_per_rank() + le + 1);
    for (int64_t r = 0; r < plan.rows_per_local_expert()[le]; ++r, ++row)
      for (int64_t j = 0; j < d; ++j) out.data<float>()[row * d + j] *= scale;
  }
  Tensor back = ReturnRows(Ungroup(out, plan), plan, *world);
  std::vector<float> unit(n * k, 1.0f);
  Tensor y = Combine(back, Tensor::FromVector(unit, {n, k}), 1.0f, plan);

  const float* hp = h.data<float>();
  for (int64_t t = 0; t < n; ++t) {
    float factor = 0;
    for (int64_t j = 0; j < k; ++j)
      if (routing.kept[t * k + j]) factor += static_cast<float>(routing.experts[t * k + j] + 1);
    for (int64_t c = 0; c < d; ++c)
      ASSERT_EQ(y.data<float>()[t * d + c], factor * hp[t * d + c]) << "token " << t << " rank " << me;
  }

  // Identity experts and unit gates with only the first kept slot: y == h or 0.
  std::vector<float> first(n * k, 0.0f);
  for (int64_t t = 0; t < n; ++t)
    for (int64_t j = 0; j < k; ++j)
      if (routing.kept[t * k + j]) { first[t * k + j] = 1.0f; break; }
  Tensor identity = Combine(ReturnRows(Ungroup(grouped, plan), plan, *world),
                            Tensor::FromVector(first, {n, k}), 1.0f, plan);
  for (int64_t t = 0; t < n; ++t) {
    bool any = false;
    for (int64_t j = 0; j < k; ++j) any |= routing.kept[t * k + j] != 0;
    for (int64_t c = 0; c < d; ++c)
      ASSERT_EQ(identity.data<float>()[t * d + c], any ? hp[t * d + c] : 0.0f);
  }
}

TEST_P(DispatcherTest, BackwardPhasesAreAdjoints) {
  auto [experts_per_rank, k, hot] = GetParam();
  auto world = dist::WorldCommunicator();
  const int ep = world->size(), me = world->rank();
  const int64_t e = experts_per_rank * ep, n = 11 + 3 * me, d = 2;
  if (k > e) GTEST_SKIP() << "k > E";
  Routing routing = MakeRouting(me, n, k, e, hot);
  DispatchPlan plan(routing.experts, routing.kept, n, k, e, ep);
  plan.ExchangeCounts(*world);
  // Forward map F = Regroup . ExchangeRows . Permute; its adjoint is
  // ScatterAdd . ReturnRows . Ungroup. Check <F h, z> == <h, F^T z> summed over ranks.
  Tensor h = TokenRows(me, n, d);
  Tensor fh = Regroup(ExchangeRows(Permute(h, plan), plan, *world), plan);
  Tensor z = Tensor::Empty(fh.shape(), DType::kF32);
  for (int64_t i = 0; i < z.numel(); ++i) z.data<float>()[i] = static_cast<float>((i * 7 + me) % 5) - 2;
  Tensor ftz = Tensor::FromVector(std::vector<float>(n * d, NAN), {n, d});  // written whole
  ScatterAdd(ReturnRows(Ungroup(z, plan), plan, *world), plan, ftz, kernels::Write::kSet);
  double sums[2] = {0, 0};
  for (int64_t i = 0; i < fh.numel(); ++i) sums[0] += double(fh.data<float>()[i]) * z.data<float>()[i];
  for (int64_t i = 0; i < h.numel(); ++i) sums[1] += double(h.data<float>()[i]) * ftz.data<float>()[i];
  Tensor total = Tensor::FromVector<float>({float(sums[0]), float(sums[1])}, {2});
  world->AllReduce(total, dist::ReduceOp::kSum);
  EXPECT_EQ(total.data<float>()[0], total.data<float>()[1]);
}

INSTANTIATE_TEST_SUITE_P(Layouts, DispatcherTest,
                         ::testing::Values(std::make_tuple(1, 1, false), std::make_tuple(2, 2, false),
                                           std::make_tuple(3, 2, true), std::make_tuple(2, 4, false)));

TEST(DispatcherCombineTest, BackwardGivesGateAndRowGradients) {
  // Two tokens, k = 2, one dropped slot: hand-computed.
  std::vector<int32_t> experts = {1, 0, 0, 1};
  std::vector<uint8_t> kept = {1, 1, 1, 0};
  DispatchPlan plan(experts, kept, 2, 2, 2, 1);
  // Expert order: expert 0 gets (t0, slot 1), (t1, slot 2); expert 1 gets (t0, slot 0).
  ASSERT_EQ(plan.token(), (std::vector<int64_t>{0, 1, 0}));
  ASSERT_EQ(plan.slot(), (std::vector<int64_t>{1, 2, 0}));
  Tensor out = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {3, 2});
  Tensor gates = Tensor::FromVector<float>({0.5f, 0.25f, 2.0f, 9.0f}, {2, 2});
  Tensor y = Combine(out, gates, 1.0f, plan);
  // y0 = 0.25 * (1, 2) + 0.5 * (5, 6); y1 = 2 * (3, 4).
  EXPECT_EQ(y.ToVector<float>(), (std::vector<float>{2.75f, 3.5f, 6, 8}));
  Tensor dy = Tensor::FromVector<float>({1, -1, 2, 0.5f}, {2, 2});
  Tensor dout = Tensor::Empty({3, 2}, DType::kF32), dgates = Tensor::Empty({2, 2}, DType::kF32);
  CombineBackward(dy, out, gates, 1.0f, plan, dout, dgates);
  EXPECT_EQ(dout.ToVector<float>(), (std::vector<float>{0.25f, -0.25f, 4, 1, 0.5f, -0.5f}));
  // dgate = dy[token] . out[a]: slot0 = (1,-1).(5,6) = -1; slot1 = (1,-1).(1,2) = -1;
  // slot2 = (2,0.5).(3,4) = 8; slot3 dropped = 0.
  EXPECT_EQ(dgates.ToVector<float>(), (std::vector<float>{-1, -1, 8, 0}));
}

// The same case on a device-sized plan that carries all four rows (max_rows = N k): the
// kept three first in expert order, with the offsets; the dropped slot's row after them,
// whose expert output is never written (NaN here) and must not reach y, dgates or dout.
TEST(DispatcherCombineTest, DeviceSizedPlanCarriesDroppedRowsHarmlessly) {
  std::vector<int32_t> experts = {1, 0, 0, 1};
  std::vector<uint8_t> kept = {1, 1, 1, 0};
  DispatchPlan plan = DispatchPlan::BuildDeviceSized(Tensor::FromVector(experts, {2, 2}),
                                                     Tensor::FromVector(kept, {2, 2}), 2, 4);
  ASSERT_TRUE(plan.device_sized());
  EXPECT_EQ(plan.num_assignments(), 4);
  EXPECT_EQ(plan.offsets().ToVector<int64_t>(), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(plan.slot_tensor().ToVector<int64_t>(), (std::vector<int64_t>{1, 2, 0, 3}));
  EXPECT_EQ(plan.slot(), (std::vector<int64_t>{1, 2, 0}));  // the host copy: kept rows only
  Tensor h = Tensor::FromVector<float>({10, 20, 30, 40}, {2, 2});
  EXPECT_EQ(Permute(h, plan).ToVector<float>(),
            (std::vector<float>{10, 20, 30, 40, 10, 20, 30, 40}));
  Tensor out = Tensor::FromVector<float>({1, 2, 3, 4, 5, 6, NAN, NAN}, {4, 2});
  Tensor gates = Tensor::FromVector<float>({0.5f, 0.25f, 2.0f, 9.0f}, {2, 2});
  EXPECT_EQ(Combine(out, gates, 1.0f, plan).ToVector<float>(),
            (std::vector<float>{2.75f, 3.5f, 6, 8}));
  Tensor dy = Tensor::FromVector<float>({1, -1, 2, 0.5f}, {2, 2});
  Tensor dout = Tensor::Empty({4, 2}, DType::kF32), dgates = Tensor::Empty({2, 2}, DType::kF32);
  CombineBackward(dy, out, gates, 1.0f, plan, dout, dgates);
  EXPECT_EQ(dout.ToVector<float>(), (std::vector<float>{0.25f, -0.25f, 4, 1, 0.5f, -0.5f, 0, 0}));
  EXPECT_EQ(dgates.ToVector<float>(), (std::vector<float>{-1, -1, 8, 0}));
  Tensor dh = Tensor::FromVector<float>({10, 20, 30, 40}, {2, 2});
  Tensor drows = Tensor::FromVector<float>({1, 1, 2, 2, 4, 4, NAN, NAN}, {4, 2});
  ScatterAdd(drows, plan, dh, kernels::Write::kAdd);  // t0 gets rows 0 and 2, t1 row 1; the
  EXPECT_EQ(dh.ToVector<float>(), (std::vector<float>{15, 25, 32, 42}));  // dropped row nothing
  ScatterAdd(drows, plan, dh, kernels::Write::kSet);
  EXPECT_EQ(dh.ToVector<float>(), (std::vector<float>{5, 5, 2, 2}));
}

}  // namespace
}  // namespace switchyard::moe
