// The training step's single readback on CUDA (engine/core/step_readback.h, issue #36): the
// ops that leave a step's values on the device give exactly what their host-returning
// twins give on the same GPU, and the balance-loss kernels give the CPU's bits:
//  - CrossEntropyForwardBackwardInto: the sums and dlogits of CrossEntropyForwardBackward
//    (the same kernels), bit for bit;
//  - RouterZLossInto and EntropySumInto: RouterZLoss's f32 and EntropySum's double (the
//    same partial sums, added in the same order on the device);
//  - SumSquaresPartials: SumSquaresMany once the host adds the partials in order (tensors
//    of 0, 1, a few and several chunks' elements);
//  - BalanceValuesInto and AddBalanceColumn: the CPU implementation's aux, counts and
//    gradient column from the same sums (each double operation rounded once on both), the
//    column added or written (kSet);
//  - the sequence and global scopes' kernels (PartBalanceSums, PartBalanceValueInto,
//    AddPartBalanceColumns, GlobalBalanceValueInto, AddGlobalBalanceColumn): the CPU's
//    bits, the part sums included (each column in double in row order on both);
//  - the embedding with ids checked on the host: the lookup and its backward as with the
//    on-device check, without its readbacks;
//  - AddLabelAssignmentCounts (routing by language in a training step): the CPU's counts;
//  - StepReadback on the device: slots over several chunks read back in one copy.
#include <gtest/gtest.h>

#include <cstring>
#include <limits>
#include <vector>

#include "engine/core/counters.h"
#include "engine/core/device_context.h"
#include "engine/core/step_readback.h"
#include "kernels/balance_loss.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/moe_routing.h"
#include "kernels/optimizer.h"
#include "kernels/permute.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::HostUniform;
using gpu_test::ValuesOf;

const Device kCuda = Device::Cuda(0);

std::vector<double> Doubles(const Tensor& t, DeviceContext* ctx) { return ValuesOf<double>(t, ctx); }

TEST(StepReadbackGpuTest, CrossEntropyIntoIsTheReturnedSums) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const int64_t n = 300, v = 1000;
  const Tensor logits = HostUniform({n, v}, 11, -4.0f, 4.0f).To(kCuda, gpu);
  std::vector<int32_t> t(n);
  for (int64_t i = 0; i < n; ++i) t[i] = i % 7 == 0 ? kIgnoreIndex : static_cast<int32_t>(i * 13 % v);
  const Tensor targets = Tensor::FromVector(t, {n}).To(kCuda, gpu);
  Tensor want_d = Tensor::Empty({n, v}, DType::kF32, kCuda);
  const CrossEntropySums want =
      CrossEntropyForwardBackward(logits, targets, want_d, 1.0 / 257, kIgnoreIndex, gpu);
  Tensor got_d = Tensor::Empty({n, v}, DType::kF32, kCuda);
  Tensor sums = Tensor::Zeros({2}, DType::kF64, kCuda, gpu);
  CrossEntropyForwardBackwardInto(logits, targets, got_d, 1.0 / 257, kIgnoreIndex, sums, gpu);
  EXPECT_EQ(Doubles(sums, gpu), (std::vector<double>{want.loss_sum, double(want.count)}));
  ExpectBitEqual(got_d, want_d, gpu, "dlogits");
}

TEST(StepReadbackGpuTest, ZLossAndEntropyIntoAreTheReturnedValues) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  for (int64_t T : {1, 37, 4096}) {
    const Tensor logits = HostUniform({T, 16}, 20 + T, -3.0f, 3.0f).To(kCuda, gpu);
    // group_tokens 0 (n = T) and a group three times this piece (n = 3 T: a tp piece).
    for (int64_t group_tokens : {int64_t{0}, 3 * T}) {
      Tensor z = Tensor::Zeros({1}, DType::kF64, kCuda, gpu);
      RouterZLossInto(logits, 0.001f, group_tokens, z, gpu);
      EXPECT_EQ(Doubles(z, gpu)[0], static_cast<double>(RouterZLoss(
                                        logits, 0.001f, 0.0f, group_tokens, nullptr, gpu)))
          << "T=" << T << " group_tokens=" << group_tokens;
    }
    const Tensor probs = HostUniform({T, 16}, 30 + T, 0.0f, 1.0f).To(kCuda, gpu);
    Tensor entropy = Tensor::Zeros({1}, DType::kF64, kCuda, gpu);
    EntropySumInto(probs, entropy, gpu);
    EXPECT_EQ(Doubles(entropy, gpu)[0], EntropySum(probs, gpu)) << "T=" << T;
  }
}

TEST(StepReadbackGpuTest, SumSquaresPartialsAddUpToSumSquaresMany) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  std::vector<Tensor> tensors;
  int64_t seed = 40;
  for (int64_t n : {0, 1, 1000, 3 << 20}) {
    tensors.push_back(HostUniform({n}, seed++).To(kCuda, gpu));
  }
  const std::vector<double> want = SumSquaresMany(tensors, gpu);
  const std::vector<int64_t> first = SumSquaresPartition(tensors, kCuda);
  ASSERT_EQ(first.size(), tensors.size() + 1);
  Tensor partials = Tensor::Zeros({first.back()}, DType::kF64, kCuda, gpu);
  SumSquaresPartials(tensors, partials, gpu);
  const std::vector<double> p = Doubles(partials, gpu);
  for (size_t k = 0; k < tensors.size(); ++k) {
    double sum = 0.0;
    for (int64_t c = first[k]; c < first[k + 1]; ++c) sum += p[c];
    EXPECT_EQ(sum, want[k]) << "tensor " << k;
  }
}

TEST(StepReadbackGpuTest, BalanceKernelsGiveTheCpuBits) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const int64_t E = 12, k = 2;
  // T = 0 (aux 0, no column) and T = 333 with two out-of-range expert indices (E and -1),
  // which the `bad` value counts (MoEStats::Resolve fails the step on it).
  for (int64_t T : {int64_t{0}, int64_t{333}}) {
    SCOPED_TRACE(T);
    std::vector<int32_t> idx(T * k);
    for (int64_t i = 0; i < T * k; ++i) idx[i] = static_cast<int32_t>((i * 7 + i / 5) % E);
    if (T > 0) {
      idx[5] = static_cast<int32_t>(E);
      idx[T * k - 1] = -1;
    }
    const Tensor probs = HostUniform({T, E}, 50, 0.0f, 1.0f);
    Tensor counts = Tensor::Empty({k * E + 1}, DType::kI64, kCuda);
    Tensor prob_sums = Tensor::Empty({E}, DType::kF32, kCuda);
    CountSlotAssignments(Tensor::FromVector(idx, {T, k}).To(kCuda, gpu), Tensor(), E, counts,
                         gpu);
    ProbColumnSums(probs.To(kCuda, gpu), prob_sums, gpu);
    const Tensor host_counts = counts.To(Device::Cpu(), gpu);
    const Tensor host_sums = prob_sums.To(Device::Cpu(), gpu);
    Tensor cpu_counts = Tensor::Empty({k * E + 1}, DType::kI64);
    CountSlotAssignments(Tensor::FromVector(idx, {T, k}), Tensor(), E, cpu_counts);
    EXPECT_EQ(host_counts.ToVector<int64_t>(), cpu_counts.ToVector<int64_t>());
    EXPECT_EQ(host_counts.ToVector<int64_t>().back(), T > 0 ? 2 : 0) << "the bad indices";
    Tensor want = Tensor::Zeros({E + 2}, DType::kF64);
    BalanceValuesInto(host_counts, host_sums, T, k, 0.01f, want);
    Tensor got = Tensor::Zeros({E + 2}, DType::kF64, kCuda, gpu);
    BalanceValuesInto(counts, prob_sums, T, k, 0.01f, got, gpu);
    EXPECT_EQ(Doubles(got, gpu), Doubles(want, gpu));
    const Tensor start = HostUniform({T, E}, 51);
    Tensor want_dp = start.Clone();
    AddBalanceColumn(want_dp, host_counts, T, k, 0.01f, 0.37f, Write::kAdd);
    Tensor got_dp = start.To(kCuda, gpu);
    AddBalanceColumn(got_dp, counts, T, k, 0.01f, 0.37f, Write::kAdd, gpu);
    ExpectBitEqual(got_dp, want_dp, gpu, "dprobs");
    // kSet over NaN (never read), as the MoE layer's backward writes it.
    const Tensor nan_rows = Tensor::FromVector(
        std::vector<float>(T * E, std::numeric_limits<float>::quiet_NaN()), {T, E});
    Tensor want_set = nan_rows.Clone(), got_set = nan_rows.To(kCuda, gpu);
    AddBalanceColumn(want_set, host_counts, T, k, 0.01f, 0.37f, Write::kSet);
    AddBalanceColumn(got_set, counts, T, k, 0.01f, 0.37f, Write::kSet, gpu);
    ExpectBitEqual(got_set, want_set, gpu, "dprobs kSet");
  }
}

// The sequence and global scopes' kernels (moe::BalanceTermsInto) give the CPU's bits: the
// parts' counts and column sums (each column in double in row order), their mean aux, their
// gradient columns in both writes, and the global scope's aux and column; part_tokens 64 over
// 333 rows leaves a shorter last part.
TEST(StepReadbackGpuTest, BalanceScopeKernelsGiveTheCpuBits) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const int64_t T = 333, E = 12, k = 2, part = 64, P = (T + part - 1) / part;
  std::vector<int32_t> idx(T * k);
  for (int64_t i = 0; i < T * k; ++i) idx[i] = static_cast<int32_t>((i * 7 + i / 5) % E);
  idx[5] = static_cast<int32_t>(E);
  const Tensor probs = HostUniform({T, E}, 52, 0.0f, 1.0f);
  const Tensor indices = Tensor::FromVector(idx, {T, k});
  Tensor counts = Tensor::Empty({P, k * E + 1}, DType::kI64);
  Tensor sums = Tensor::Empty({P, E}, DType::kF32);
  PartBalanceSums(probs, indices, part, counts, sums);
  Tensor counts_d = Tensor::Empty({P, k * E + 1}, DType::kI64, kCuda);
  Tensor sums_d = Tensor::Empty({P, E}, DType::kF32, kCuda);
  PartBalanceSums(probs.To(kCuda, gpu), indices.To(kCuda, gpu), part, counts_d, sums_d, gpu);
  EXPECT_EQ(ValuesOf<int64_t>(counts_d, gpu), counts.ToVector<int64_t>());
  ExpectBitEqual(sums_d, sums, gpu, "part prob sums");

  Tensor value = Tensor::Empty({1}, DType::kF64);
  Tensor value_d = Tensor::Empty({1}, DType::kF64, kCuda);
  PartBalanceValueInto(counts, sums, T, part, k, 0.01f, value);
  PartBalanceValueInto(counts_d, sums_d, T, part, k, 0.01f, value_d, gpu);
  EXPECT_EQ(Doubles(value_d, gpu), value.ToVector<double>());

  const Tensor start = HostUniform({T, E}, 53);
  const Tensor nan_rows = Tensor::FromVector(
      std::vector<float>(T * E, std::numeric_limits<float>::quiet_NaN()), {T, E});
  for (const Write write : {Write::kAdd, Write::kSet}) {
    const Tensor& from = write == Write::kSet ? nan_rows : start;
    Tensor want = from.Clone(), got = from.To(kCuda, gpu);
    AddPartBalanceColumns(want, counts, part, k, 0.01f, 0.37f, write);
    AddPartBalanceColumns(got, counts_d, part, k, 0.01f, 0.37f, write, gpu);
    ExpectBitEqual(got, want, gpu, write == Write::kSet ? "part columns kSet" : "part columns");
  }

  const Tensor load = HostUniform({E}, 54, 0.0f, 1.0f);
  const Tensor group_sums = HostUniform({E}, 55, 0.0f, 300.0f);
  Tensor global = Tensor::Empty({1}, DType::kF64);
  Tensor global_d = Tensor::Empty({1}, DType::kF64, kCuda);
  GlobalBalanceValueInto(load, group_sums, T, 0.01f, global);
  GlobalBalanceValueInto(load.To(kCuda, gpu), group_sums.To(kCuda, gpu), T, 0.01f, global_d,
                         gpu);
  EXPECT_EQ(Doubles(global_d, gpu), global.ToVector<double>());
  for (const Write write : {Write::kAdd, Write::kSet}) {
    const Tensor& from = write == Write::kSet ? nan_rows : start;
    Tensor want = from.Clone(), got = from.To(kCuda, gpu);
    AddGlobalBalanceColumn(want, load, T, 0.01f, 0.37f, write);
    AddGlobalBalanceColumn(got, load.To(kCuda, gpu), T, 0.01f, 0.37f, write, gpu);
    ExpectBitEqual(got, want, gpu, write == Write::kSet ? "global column kSet" : "global column");
  }
}

// The routing-by-language counts of a training step (RoutingByLabel::AddInStep): two
// micro-batches added into one range on the device, starting from nonzero values, equal the
// CPU's; labels -1 and L are not counted, a labelled bad index is counted apart.
TEST(StepReadbackGpuTest, LabelCountsGiveTheCpuCounts) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const int64_t E = 12, k = 2, L = 3, T = 333;
  std::vector<double> start(L * E + 1);
  for (size_t i = 0; i < start.size(); ++i) start[i] = static_cast<double>(i % 5);
  Tensor want = Tensor::FromVector(start, {L * E + 1});
  Tensor got = want.To(kCuda, gpu);
  for (int micro = 0; micro < 2; ++micro) {
    std::vector<int32_t> idx(T * k), labels(T);
    for (int64_t i = 0; i < T * k; ++i) idx[i] = static_cast<int32_t>((i * 7 + i / 5 + micro) % E);
    for (int64_t t = 0; t < T; ++t) labels[t] = static_cast<int32_t>((t * 3 + micro) % (L + 2)) - 1;
    idx[2 * 4] = static_cast<int32_t>(E);  // token 4: label (12 + micro) % 5 - 1, labelled
    const Tensor i = Tensor::FromVector(idx, {T, k}), l = Tensor::FromVector(labels, {T});
    AddLabelAssignmentCounts(i.To(kCuda, gpu), l.To(kCuda, gpu), L, E, got, gpu);
    AddLabelAssignmentCounts(i, l, L, E, want);
  }
  const std::vector<double> cpu = want.ToVector<double>();
  EXPECT_EQ(Doubles(got, gpu), cpu);
  EXPECT_EQ(cpu.back(), start.back() + 2) << "the bad indices";
}

TEST(StepReadbackGpuTest, EmbeddingWithIdsCheckedOnTheHost) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const int64_t n = 500, v = 64, d = 24;
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = static_cast<int32_t>(i * i % v);
  const Tensor dev_ids = Tensor::FromVector(ids, {n}).To(kCuda, gpu);
  const Tensor table = HostUniform({v, d}, 60).To(kCuda, gpu);
  const Tensor dout = HostUniform({n, d}, 61).To(kCuda, gpu);
  Tensor want = Tensor::Empty({n, d}, DType::kF32, kCuda);
  Tensor got = Tensor::Empty({n, d}, DType::kF32, kCuda);
  Tensor want_dt = Tensor::Zeros({v, d}, DType::kF32, kCuda, gpu);
  Tensor got_dt = Tensor::Zeros({v, d}, DType::kF32, kCuda, gpu);
  EmbeddingForward(dev_ids, table, want, gpu);
  EmbeddingBackward(dev_ids, dout, want_dt, gpu);
  const DeviceCounts before = counters::Snapshot();
  EmbeddingForward(dev_ids, table, got, gpu, IdCheck::kOnHost);
  EmbeddingBackward(dev_ids, dout, got_dt, gpu, IdCheck::kOnHost);
  // Counted where the wrapper decides to check on the device (kernels/embedding.cc), so
  // this pins the wrapper's choice, not what the CUDA code does with check_ids.
  EXPECT_EQ(counters::Snapshot().Minus(before).readbacks, 0);
  ExpectBitEqual(got, want, gpu, "rows");
  ExpectBitEqual(got_dt, want_dt, gpu, "dtable");
}

TEST(StepReadbackGpuTest, SlotsOverChunksReadBackAtOnce) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  StepReadback readback;
  std::vector<double> want;
  for (int64_t block : {200, 100, 300}) {  // three chunks
    StepReadback::Slots s = readback.Reserve(block, kCuda, gpu);
    std::vector<double> values(block);
    for (int64_t i = 0; i < block; ++i) values[i] = 0.25 * (s.first + i);
    s.values.CopyFrom(Tensor::FromVector(values, {block}), gpu);
    want.insert(want.end(), values.begin(), values.end());
  }
  const DeviceCounts before = counters::Snapshot();
  EXPECT_EQ(readback.ReadBack(gpu), want);
  EXPECT_EQ(counters::Snapshot().Minus(before).readbacks, 1);
}

}  // namespace
}  // namespace switchyard::kernels
