// The size-1 local communicator (what every rank-less build and every singleton group
// gets): collectives copy or do nothing, and bad arguments fail with the shapes named.
#include <gtest/gtest.h>

#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
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
}

}  // namespace
}  // namespace switchyard::dist
