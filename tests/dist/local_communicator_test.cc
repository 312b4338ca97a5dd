// The size-1 local communicator (what every rank-less build and every singleton group
// gets): collectives copy or do nothing, and bad arguments fail with the shapes named.
// Also the size-1 ordered sums and the checks of TreeAccumulator (death tests, which do
// not belong under mpirun).
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "engine/dist/ordered_sum.h"
#include "engine/dist/process.h"

namespace switchyard::dist {
namespace {

std::vector<float> Iota(int n, float start) {
  std::vector<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

TEST(LocalCommunicatorTest, Identity) {
  std::unique_ptr<Communicator> comm = MakeLocalCommunicator(Device::Cpu(), 5);
  EXPECT_EQ(comm->rank(), 0);
  EXPECT_EQ(comm->size(), 1);
  EXPECT_EQ(comm->world_ranks(), std::vector<int>{5});
  EXPECT_EQ(comm->backend(), "local");
  EXPECT_EQ(comm->ToString(), "local(rank 0 of 1, world [5], cpu)");
}

TEST(LocalCommunicatorTest, CollectivesCopyOrKeep) {
  std::unique_ptr<Communicator> comm = MakeLocalCommunicator();
  const std::vector<float> values = Iota(6, 10);
  Tensor t = Tensor::FromVector(values, {2, 3});
  comm->AllReduce(t, ReduceOp::kAvg);
  comm->AllReduceAsync(t, ReduceOp::kSum)->Wait();
  comm->Broadcast(t, 0);
  EXPECT_EQ(t.ToVector<float>(), values);

  Tensor gathered = Tensor::Zeros({2, 3}, DType::kF32);
  comm->AllGather(t, gathered);
  EXPECT_EQ(gathered.ToVector<float>(), values);
  Tensor scattered = Tensor::Zeros({2, 3}, DType::kF32);
  comm->ReduceScatterAsync(t, scattered, ReduceOp::kMax)->Wait();
  EXPECT_EQ(scattered.ToVector<float>(), values);
  Tensor exchanged = Tensor::Zeros({2, 3}, DType::kF32);
  const std::vector<int64_t> rows = {2};
  comm->AllToAllV(t, rows, exchanged, rows);
  EXPECT_EQ(exchanged.ToVector<float>(), values);
  Tensor exchanged_async = Tensor::Zeros({2, 3}, DType::kF32);
  comm->AllToAllVAsync(t, rows, exchanged_async, rows)->Wait();
  EXPECT_EQ(exchanged_async.ToVector<float>(), values);
  // In place: in and out are the same memory.
  comm->AllToAll(t, t);
  EXPECT_EQ(t.ToVector<float>(), values);
  comm->Barrier();

  std::unique_ptr<Communicator> again = comm->Split({{0}});
  EXPECT_EQ(again->size(), 1);
  Tensor empty = Tensor::Zeros({0, 3}, DType::kF32);
  const std::vector<int64_t> none = {0};
  again->AllToAllV(empty, none, empty, none);
}

TEST(LocalCommunicatorTest, UnevenCollectivesAndF64) {
  std::unique_ptr<Communicator> comm = MakeLocalCommunicator();
  EXPECT_EQ(comm->context(), nullptr);
  const std::vector<float> values = Iota(6, 1);
  Tensor t = Tensor::FromVector(values, {2, 3});
  const std::vector<int64_t> rows = {2};
  Tensor gathered = Tensor::Zeros({2, 3}, DType::kF32);
  comm->AllGatherV(t, gathered, rows);
  EXPECT_EQ(gathered.ToVector<float>(), values);
  Tensor scattered = Tensor::Zeros({2, 3}, DType::kF32);
  comm->ReduceScatterV(t, scattered, rows, ReduceOp::kAvg);
  EXPECT_EQ(scattered.ToVector<float>(), values);
  Tensor empty = Tensor::Zeros({0}, DType::kF32);
  const std::vector<int64_t> none = {0};
  comm->AllGatherV(empty, empty, none);

  const std::vector<double> doubles = {0.1, 1e300, -3};
  Tensor d = Tensor::FromVector(doubles, {3});
  comm->AllReduce(d, ReduceOp::kAvg);
  comm->AllReduceAsync(d, ReduceOp::kMax)->Wait();
  EXPECT_EQ(d.ToVector<double>(), doubles);
}

// A send to self pairs with the receive from self of its tag, in order: a copy.
TEST(LocalCommunicatorTest, BatchSendRecvToSelfCopies) {
  std::unique_ptr<Communicator> comm = MakeLocalCommunicator(Device::Cpu(), 3);
  Tensor a = Tensor::FromVector(Iota(4, 1), {2, 2});
  Tensor b = Tensor::FromVector(Iota(3, 10), {3});
  Tensor c = Tensor::FromVector(std::vector<int64_t>{7, 8}, {2});
  Tensor into_a = Tensor::Zeros({4}, DType::kF32);  // another shape, the same numel
  Tensor into_b = Tensor::Zeros({3}, DType::kF32);
  Tensor into_c = Tensor::Zeros({2}, DType::kI64);
  const std::vector<P2POp> ops = {{P2POp::kRecv, into_c, 0, 5}, {P2POp::kSend, a, 0},
                                  {P2POp::kSend, b, 0},         {P2POp::kRecv, into_a, 0},
                                  {P2POp::kSend, c, 0, 5},      {P2POp::kRecv, into_b, 0}};
  comm->BatchSendRecv(ops)->Wait();
  EXPECT_EQ(into_a.ToVector<float>(), Iota(4, 1));
  EXPECT_EQ(into_b.ToVector<float>(), Iota(3, 10));
  EXPECT_EQ(into_c.ToVector<int64_t>(), (std::vector<int64_t>{7, 8}));
  comm->BatchSendRecv({})->Wait();
}

TEST(LocalCommunicatorTest, OrderedSumsOfOneRank) {
  std::unique_ptr<Communicator> comm = MakeLocalCommunicator();
  const std::vector<float> values = {0.1f, -2, 3e30f};
  Tensor t = Tensor::FromVector(values, {3});
  OrderedAllReduce(*comm, t);
  OrderedAllReduceAsync(*comm, t)->Wait();
  EXPECT_EQ(t.ToVector<float>(), values);
  Tensor d = Tensor::FromVector(std::vector<double>{0.1, 0.2}, {2, 1});
  OrderedAllReduce(*comm, d);
  EXPECT_EQ(d.ToVector<double>(), (std::vector<double>{0.1, 0.2}));
  const std::vector<double> sums = {1.5, -0.25};
  EXPECT_EQ(AllReduceDoubles(*comm, sums), sums);
}

// A process that never initialised MPI (or a build without it) is one rank.
TEST(LocalCommunicatorTest, WorldOfOneRankIsLocal) {
  EXPECT_EQ(WorldRank(), 0);
  EXPECT_EQ(WorldSize(), 1);
  std::unique_ptr<Communicator> world = WorldCommunicator();
  EXPECT_EQ(world->backend(), "local");
  EXPECT_EQ(world->world_ranks(), std::vector<int>{0});
}

using LocalCommunicatorDeathTest = testing::Test;

TEST_F(LocalCommunicatorDeathTest, MismatchesNameTheShapes) {
  std::unique_ptr<Communicator> comm = MakeLocalCommunicator();
  Tensor in = Tensor::Zeros({2, 3}, DType::kF32);
  Tensor wrong_rows = Tensor::Zeros({3, 3}, DType::kF32);
  Tensor wrong_dtype = Tensor::Zeros({2, 3}, DType::kI64);
  EXPECT_DEATH(comm->AllGather(in, wrong_rows), "AllGather over 1 ranks: in \\(2, 3\\)");
  EXPECT_DEATH(comm->ReduceScatter(in, wrong_rows, ReduceOp::kSum), "ReduceScatter");
  EXPECT_DEATH(comm->AllToAll(in, wrong_dtype), "AllToAll: in is");
  const std::vector<int64_t> three = {3}, two = {2};
  EXPECT_DEATH(comm->AllToAllV(in, three, in, two), "send_rows \\[3\\] sum to 3");
  EXPECT_DEATH(comm->AllToAllV(in, {}, in, two), "need 1 entries each");
  Tensor three_rows = Tensor::Zeros({3, 3}, DType::kF32);
  EXPECT_DEATH(comm->AllToAllV(in, two, three_rows, three),
               "rank 0 sends itself 2 rows but receives 3");
  Tensor ints = Tensor::Zeros({4}, DType::kI64);
  EXPECT_DEATH(comm->AllReduce(ints, ReduceOp::kAvg), "kAvg needs a floating dtype");
  EXPECT_DEATH(comm->Broadcast(in, 1), "Broadcast root");
  EXPECT_DEATH(comm->Split({{0}, {1}}), "outside a communicator of size 1");
  EXPECT_DEATH(comm->Split({{0, 0}}), "more than one group");

  const std::vector<int64_t> one = {1};
  EXPECT_DEATH(comm->AllGatherV(in, in, one), "AllGatherV with rows \\[1\\] on rank 0");
  EXPECT_DEATH(comm->ReduceScatterV(in, wrong_rows, two, ReduceOp::kSum),
               "ReduceScatterV with rows \\[2\\]");
  EXPECT_DEATH(comm->AllGatherV(in, in, {}), "need 1 entries");
}

TEST_F(LocalCommunicatorDeathTest, PointToPointNeedsAPartner) {
  std::unique_ptr<Communicator> comm = MakeLocalCommunicator();
  Tensor t = Tensor::Zeros({2}, DType::kF32);
  EXPECT_DEATH(comm->SendAsync(t, 0), "SendAsync to rank 0 in a group of size 1");
  EXPECT_DEATH(comm->RecvAsync(t, 0), "RecvAsync from rank 0 in a group of size 1");
  const std::vector<P2POp> unmatched = {{P2POp::kSend, t, 0}};
  EXPECT_DEATH(comm->BatchSendRecv(unmatched), "sends itself 1 messages of tag 0 but receives 0");
  const std::vector<P2POp> other_tag = {{P2POp::kSend, t, 0, 1}, {P2POp::kRecv, t, 0, 2}};
  EXPECT_DEATH(comm->BatchSendRecv(other_tag), "of tag 1 but receives 0");
  Tensor three = Tensor::Zeros({3}, DType::kF32);
  const std::vector<P2POp> sizes = {{P2POp::kSend, t, 0}, {P2POp::kRecv, three, 0}};
  EXPECT_DEATH(comm->BatchSendRecv(sizes), "sends itself Tensor\\(f32, \\(2\\)");
  const std::vector<P2POp> outside = {{P2POp::kSend, t, 1}};
  EXPECT_DEATH(comm->BatchSendRecv(outside), "send 0 with rank 1 in a group of 1");
}

TEST(TreeAccumulatorDeathTest, MismatchedLeaves) {
  TreeAccumulator acc;
  acc.Add(Tensor::Zeros({2}, DType::kF32));
  EXPECT_DEATH(acc.Add(Tensor::Zeros({3}, DType::kF32)), "TreeAccumulator: leaf");
  EXPECT_DEATH(TreeAccumulator().Result(), "no leaf");
  EXPECT_DEATH(TreeAccumulator().Add(Tensor::Zeros({2}, DType::kI64)), "sums f32");
  std::unique_ptr<Communicator> comm = MakeLocalCommunicator();
  Tensor ints = Tensor::Zeros({2}, DType::kI32);
  EXPECT_DEATH(OrderedAllReduce(*comm, ints), "OrderedAllReduce sums f32 or f64");
}

}  // namespace
}  // namespace switchyard::dist
