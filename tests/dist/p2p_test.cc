// Non-blocking and batched point-to-point (SendAsync, RecvAsync, BatchSendRecv) and the
// uneven collectives (AllGatherV, ReduceScatterV), under mpirun with 2, 4 and 8 ranks.
// Values are integer codes of (rank, index), so every expected result is exact.
//
// Between collectives only EXPECT_* (never ASSERT_*): every rank must reach every call.
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "engine/dist/process.h"
#include "tests/dist/communicator_test_util.h"

namespace switchyard::dist {
namespace {

using testing_util::ExpectEach;
using testing_util::Fill;
using testing_util::ThousandTriangle;

class CommunicatorTest : public testing::Test {
 protected:
  void SetUp() override { world_ = WorldCommunicator(); }
  void TearDown() override { world_.reset(); }

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }

  std::unique_ptr<Communicator> world_;
};

// ---- Non-blocking and batched point-to-point ---------------------------------------------

// Every rank sends to the next and receives from the previous, posting the receive first
// when recv_first, and waiting in the opposite order to posting.
void CheckAsyncRing(Communicator& comm, bool recv_first) {
  const int n = comm.size(), r = comm.rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  Tensor out = Fill<float>({3, 2}, [r](int64_t i) { return r * 100 + i; });
  Tensor in = Fill<float>({3, 2}, [](int64_t) { return -1; });
  Tensor out_tagged = Fill<int64_t>({4}, [r](int64_t i) { return r * 10 + i; });
  Tensor in_tagged = Tensor::Zeros({4}, DType::kI64);
  std::vector<std::unique_ptr<Work>> works;
  if (recv_first) {
    works.push_back(comm.RecvAsync(in_tagged, prev, 7));
    works.push_back(comm.RecvAsync(in, prev));
    works.push_back(comm.SendAsync(out, next));
    works.push_back(comm.SendAsync(out_tagged, next, 7));
  } else {
    works.push_back(comm.SendAsync(out, next));
    works.push_back(comm.SendAsync(out_tagged, next, 7));
    works.push_back(comm.RecvAsync(in, prev));
    works.push_back(comm.RecvAsync(in_tagged, prev, 7));
  }
  for (int i = static_cast<int>(works.size()) - 1; i >= 0; --i) works[i]->Wait();
  const std::string what = recv_first ? "receive first" : "send first";
  ExpectEach<float>(in, [prev](int64_t i) { return prev * 100 + i; }, what);
  ExpectEach<int64_t>(in_tagged, [prev](int64_t i) { return prev * 10 + i; }, what + " tag 7");
}

TEST_F(CommunicatorTest, AsyncSendRecvRingInEitherOrder) {
  CheckAsyncRing(*world_, false);
  CheckAsyncRing(*world_, true);
  // Even ranks post sends first, odd ranks receives first.
  CheckAsyncRing(*world_, rank() % 2 == 1);
}

// Work::Test: a receive whose message has not been sent is not complete; once sent, polling
// Test completes both ends (MPI_Test drives the progress), after which Wait returns at once
// and the received values are the sent ones. Rank 0 sends a large message (past any eager
// limit) and a small one to rank 1; the other ranks only join the barriers.
TEST_F(CommunicatorTest, TestCompletesWithoutWaiting) {
  constexpr int64_t kLarge = 1 << 20;  // 4 MiB of f32
  Tensor large = Fill<float>({kLarge}, [r = rank()](int64_t i) { return r == 0 ? i % 1000 : -1; });
  Tensor small = Fill<int64_t>({3}, [r = rank()](int64_t i) { return r == 0 ? 7 + i : 0; });
  std::vector<std::unique_ptr<Work>> works;
  if (rank() == 1) {
    works.push_back(world_->RecvAsync(large, 0));
    works.push_back(world_->RecvAsync(small, 0, 5));
    // Rank 0 sends only after the barrier below.
    EXPECT_FALSE(works[0]->Test());
    EXPECT_FALSE(works[1]->Test());
  }
  world_->Barrier();
  if (rank() == 0) {
    works.push_back(world_->SendAsync(large, 1));
    works.push_back(world_->SendAsync(small, 1, 5));
  }
  for (std::unique_ptr<Work>& w : works) {
    while (!w->Test()) {
    }
    EXPECT_TRUE(w->Test());  // stays complete
    w->Wait();               // returns at once
  }
  if (rank() == 1) {
    ExpectEach<float>(large, [](int64_t i) { return i % 1000; }, "large");
    ExpectEach<int64_t>(small, [](int64_t i) { return 7 + i; }, "small");
  }
  EXPECT_TRUE(CompletedWork()->Test());
  world_->Barrier();
}

// One batch per rank: two tensors to the next rank (tag 1), one to the previous (tag 2), an
// empty one each way (tag 3) and one to itself (tag 4), with the matching receives, in an
// order that differs between even and odd ranks.
TEST_F(CommunicatorTest, BatchSendRecvBothNeighbours) {
  const int n = size(), r = rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  Tensor fwd_a = Fill<float>({2, 3}, [r](int64_t i) { return r * 100 + i; });
  Tensor fwd_b = Fill<int64_t>({5}, [r](int64_t i) { return r * 1000 + i; });
  Tensor bwd = Tensor::FromVector(std::vector<double>{r + 0.25, r + 0.5}, {2});
  Tensor empty_out = Tensor::Zeros({0, 3}, DType::kF32);
  Tensor self_out = Fill<int32_t>({3}, [r](int64_t i) { return r * 7 + i; });
  Tensor from_prev_a = Fill<float>({2, 3}, [](int64_t) { return -1; });
  Tensor from_prev_b = Tensor::Zeros({5}, DType::kI64);
  Tensor from_next = Tensor::Zeros({2}, DType::kF64);
  Tensor empty_in = Tensor::Zeros({0, 3}, DType::kF32);
  Tensor empty_in2 = Tensor::Zeros({0, 3}, DType::kF32);
  Tensor self_in = Tensor::Zeros({3}, DType::kI32);
  std::vector<P2POp> sends = {{P2POp::kSend, fwd_a, next, 1},
                              {P2POp::kSend, fwd_b, next, 1},
                              {P2POp::kSend, bwd, prev, 2},
                              {P2POp::kSend, empty_out, next, 3},
                              {P2POp::kSend, empty_out, prev, 3},
                              {P2POp::kSend, self_out, r, 4}};
  std::vector<P2POp> recvs = {{P2POp::kRecv, from_prev_a, prev, 1},
                              {P2POp::kRecv, from_prev_b, prev, 1},
                              {P2POp::kRecv, from_next, next, 2},
                              {P2POp::kRecv, empty_in, prev, 3},
                              {P2POp::kRecv, empty_in2, next, 3},
                              {P2POp::kRecv, self_in, r, 4}};
  std::vector<P2POp> ops;
  if (r % 2 == 0) {
    ops = sends;
    ops.insert(ops.end(), recvs.begin(), recvs.end());
  } else {
    ops = recvs;
    ops.insert(ops.end(), sends.begin(), sends.end());
  }
  world_->BatchSendRecv(ops)->Wait();
  ExpectEach<float>(from_prev_a, [prev](int64_t i) { return prev * 100 + i; }, "first");
  ExpectEach<int64_t>(from_prev_b, [prev](int64_t i) { return prev * 1000 + i; }, "second");
  EXPECT_EQ(from_next.ToVector<double>(), (std::vector<double>{next + 0.25, next + 0.5}));
  ExpectEach<int32_t>(self_in, [r](int64_t i) { return r * 7 + i; }, "self");
}

// ---- Uneven all-gather and reduce-scatter --------------------------------------------------

// Rows per rank with zeros: rank 1 (and every third rank after it) contributes none.
int64_t GatherRows(int r) { return r % 3 == 1 ? 0 : r + 1; }

TEST_F(CommunicatorTest, AllGatherVWithEmptyRanks) {
  const int n = size(), r = rank();
  std::vector<int64_t> rows(n), first(n + 1, 0);
  for (int s = 0; s < n; ++s) {
    rows[s] = GatherRows(s);
    first[s + 1] = first[s] + rows[s];
  }
  // Rank s's row j, column c: s * 1000 + j * 10 + c.
  Tensor in = Fill<float>({rows[r], 3}, [r](int64_t i) { return r * 1000 + (i / 3) * 10 + i % 3; });
  Tensor out = Fill<float>({first[n], 3}, [](int64_t) { return -1; });
  world_->AllGatherV(in, out, rows);
  ExpectEach<float>(out, [&](int64_t i) {
    int s = 0;
    while (first[s + 1] <= i / 3) ++s;
    return s * 1000 + (i / 3 - first[s]) * 10 + i % 3;
  }, "f32 (n, 3)");

  // Only the last rank has rows; 1-d i64.
  std::vector<int64_t> last_only(n, 0);
  last_only[n - 1] = 4;
  Tensor in64 = Fill<int64_t>({r == n - 1 ? 4 : 0}, [r](int64_t i) { return r * 10 + i; });
  Tensor out64 = Tensor::Zeros({4}, DType::kI64);
  world_->AllGatherV(in64, out64, last_only);
  ExpectEach<int64_t>(out64, [n](int64_t i) { return (n - 1) * 10 + i; }, "last only");

  // Nobody has rows.
  const std::vector<int64_t> none(n, 0);
  Tensor empty_in = Tensor::Zeros({0, 2}, DType::kF32);
  Tensor empty_out = Tensor::Zeros({0, 2}, DType::kF32);
  world_->AllGatherV(empty_in, empty_out, none);
}

TEST_F(CommunicatorTest, ReduceScatterVWithEmptyRanks) {
  const int n = size(), r = rank();
  std::vector<int64_t> rows(n), first(n + 1, 0);
  for (int s = 0; s < n; ++s) {
    rows[s] = GatherRows(s);
    first[s + 1] = first[s] + rows[s];
  }
  // in: (sum(rows), 2), element e on rank s = s * 1000 + e; out: rows [first[r], first[r+1]).
  Tensor in = Fill<float>({first[n], 2}, [r](int64_t e) { return r * 1000 + e; });
  Tensor sum = Fill<float>({rows[r], 2}, [](int64_t) { return -1; });
  Tensor max = Fill<float>({rows[r], 2}, [](int64_t) { return -1; });
  world_->ReduceScatterV(in, sum, rows, ReduceOp::kSum);
  world_->ReduceScatterV(in, max, rows, ReduceOp::kMax);
  const int64_t base = first[r] * 2;
  ExpectEach<float>(sum, [&](int64_t k) { return ThousandTriangle(n) + n * (base + k); }, "sum");
  ExpectEach<float>(max, [&](int64_t k) { return (n - 1) * 1000 + base + k; }, "max");

  // f64 average, 1-d rows.
  Tensor in64 = Tensor::Zeros({first[n]}, DType::kF64);
  for (int64_t e = 0; e < first[n]; ++e) in64.data<double>()[e] = r + e * 0.5;
  Tensor avg = Tensor::Zeros({rows[r]}, DType::kF64);
  world_->ReduceScatterV(in64, avg, rows, ReduceOp::kAvg);
  for (int64_t k = 0; k < rows[r]; ++k) {
    EXPECT_EQ(avg.data<double>()[k], (n * (n - 1) / 2.0 + n * (first[r] + k) * 0.5) / n) << k;
  }
}

}  // namespace
}  // namespace switchyard::dist
