// The Communicator's collectives on the world and on sub-groups, under mpirun with 2, 4 and 8
// ranks. Each rank fills its tensors from a formula of (rank, index) with integer values,
// so every expected result is exact; received rows carry (source rank, destination,
// row index, column) so a row that lands in the wrong place is caught.
//
// Between collectives only EXPECT_* (never ASSERT_*): every rank must reach every call.
// Non-blocking and batched point-to-point and the uneven collectives: p2p_test.cc.
#include <gtest/gtest.h>

#include <time.h>

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <type_traits>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "engine/dist/process.h"
#include "tests/dist/communicator_test_util.h"

namespace switchyard::dist {
namespace {

using testing_util::Comparable;
using testing_util::ExpectEach;
using testing_util::Fill;
using testing_util::FromCode;
using testing_util::ThousandTriangle;


// The row exchanged by AllToAllV: row j sent from src to dst, column c.
int64_t RowCode(int src, int dst, int64_t j, int64_t c) {
  return src * 1000000LL + dst * 10000LL + j * 100 + c;
}

// Exchanges count(src, dst) rows of `row_shape` from every src to every dst over comm and
// checks each received row; `async` uses AllToAllVAsync. -1 marks rows never written.
template <typename T>
void CheckAllToAllV(Communicator& comm, const std::function<int64_t(int, int)>& count,
                    const Shape& row_shape, bool async, const std::string& what) {
  const int me = comm.rank(), n = comm.size();
  const int64_t row = NumElements(row_shape);
  std::vector<int64_t> send_rows(n), recv_rows(n);
  std::vector<int64_t> send_first(n + 1, 0), recv_first(n + 1, 0);  // first row per rank
  for (int r = 0; r < n; ++r) {
    send_rows[r] = count(me, r);
    recv_rows[r] = count(r, me);
    send_first[r + 1] = send_first[r] + send_rows[r];
    recv_first[r + 1] = recv_first[r] + recv_rows[r];
  }
  Shape in_shape = row_shape, out_shape = row_shape;
  in_shape.insert(in_shape.begin(), send_first[n]);
  out_shape.insert(out_shape.begin(), recv_first[n]);
  // Which (rank, row within its block) an absolute row index belongs to.
  auto locate = [n](const std::vector<int64_t>& first, int64_t i) {
    int r = 0;
    while (r + 1 < n && first[r + 1] <= i) ++r;
    return std::make_pair(r, i - first[r]);
  };
  Tensor in = Fill<T>(in_shape, [&](int64_t i) {
    auto [dst, j] = locate(send_first, i / row);
    return RowCode(me, dst, j, i % row);
  });
  Tensor out = Fill<T>(out_shape, [](int64_t) { return -1; });
  if (async) {
    std::unique_ptr<Work> work = comm.AllToAllVAsync(in, send_rows, out, recv_rows);
    work->Wait();
  } else {
    comm.AllToAllV(in, send_rows, out, recv_rows);
  }
  ExpectEach<T>(out, [&](int64_t i) {
    auto [src, j] = locate(recv_first, i / row);
    return RowCode(src, me, j, i % row);
  }, what);
}

// The uneven pattern of the brief: zero where (src + dst) % 3 == 0, else 0..10 rows.
int64_t UnevenRows(int src, int dst) {
  return (src + dst) % 3 == 0 ? 0 : (src * 7 + dst * 3) % 11;
}

class CommunicatorTest : public testing::Test {
 protected:
  void SetUp() override { world_ = WorldCommunicator(); }
  void TearDown() override { world_.reset(); }

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }

  std::unique_ptr<Communicator> world_;
};

// ---- The world --------------------------------------------------------------------------

TEST_F(CommunicatorTest, WorldIdentity) {
  EXPECT_EQ(rank(), WorldRank());
  EXPECT_EQ(size(), WorldSize());
  EXPECT_GE(size(), 2) << "run under mpirun with at least 2 ranks";
  std::vector<int> expected(size());
  for (int r = 0; r < size(); ++r) expected[r] = r;
  EXPECT_EQ(world_->world_ranks(), expected);
  EXPECT_EQ(world_->backend(), "mpi");
  EXPECT_EQ(world_->device(), Device::Cpu());
  EXPECT_NE(world_->ToString().find(StrCat("rank ", rank(), " of ", size())),
            std::string::npos)
      << world_->ToString();
}

TEST_F(CommunicatorTest, AllReduceF32) {
  const int n = size(), r = rank();
  auto code = [r](int64_t i) { return r * 1000 + i; };
  // Each element's maximum comes from a different rank.
  auto rotated = [r, n](int64_t i) { return ((r + i) % n) * 1000 + i; };
  Tensor sum = Fill<float>({3, 5}, code);
  Tensor avg = Fill<float>({3, 5}, code);
  Tensor max = Fill<float>({3, 5}, rotated);
  Tensor min = Fill<float>({3, 5}, rotated);
  world_->AllReduce(sum, ReduceOp::kSum);
  world_->AllReduce(avg, ReduceOp::kAvg);
  world_->AllReduce(max, ReduceOp::kMax);
  world_->AllReduce(min, ReduceOp::kMin);
  ExpectEach<float>(sum, [n](int64_t i) { return ThousandTriangle(n) + n * i; }, "sum");
  std::vector<float> avg_values = avg.ToVector<float>();
  for (int64_t i = 0; i < 15; ++i) {
    EXPECT_EQ(avg_values[i], static_cast<float>(ThousandTriangle(n) + n * i) / n) << i;
  }
  ExpectEach<float>(max, [n](int64_t i) { return (n - 1) * 1000 + i; }, "max");
  ExpectEach<float>(min, [](int64_t i) { return i; }, "min");
}

TEST_F(CommunicatorTest, AllReduceIntegers) {
  const int n = size(), r = rank();
  // Values past 2^32 prove all 64 bits travel and add.
  const int64_t big = int64_t{1} << 40;
  Tensor sum = Fill<int64_t>({7}, [&](int64_t i) { return big * (r + 1) + i; });
  Tensor max = Fill<int64_t>({7}, [&](int64_t i) { return -big * ((r + i) % n); });
  Tensor min = Fill<int64_t>({7}, [&](int64_t i) { return -big * ((r + i) % n); });
  Tensor sum32 = Fill<int32_t>({2, 2}, [&](int64_t i) { return r * 1000 + i; });
  Tensor max8 = Fill<uint8_t>({4}, [&](int64_t i) { return (r * 31 + i) % 256; });
  world_->AllReduce(sum, ReduceOp::kSum);
  world_->AllReduce(max, ReduceOp::kMax);
  world_->AllReduce(min, ReduceOp::kMin);
  world_->AllReduce(sum32, ReduceOp::kSum);
  world_->AllReduce(max8, ReduceOp::kMax);
  ExpectEach<int64_t>(sum, [&](int64_t i) { return big * n * (n + 1) / 2 + n * i; }, "i64 sum");
  ExpectEach<int64_t>(max, [](int64_t) { return 0; }, "i64 max");
  ExpectEach<int64_t>(min, [&](int64_t) { return -big * (n - 1); }, "i64 min");
  ExpectEach<int32_t>(sum32, [&](int64_t i) { return ThousandTriangle(n) + n * i; },
                      "i32 sum");
  ExpectEach<uint8_t>(max8, [&](int64_t i) {
    int64_t best = 0;
    for (int s = 0; s < n; ++s) best = std::max<int64_t>(best, (s * 31 + i) % 256);
    return best;
  }, "u8 max");
}

TEST_F(CommunicatorTest, AllGather) {
  const int n = size(), r = rank();
  // in: (2, 3) per rank -> out: (n*2, 3); rank s's rows at [2s, 2s+2).
  Tensor in = Fill<float>({2, 3}, [r](int64_t i) { return r * 1000 + i; });
  Tensor out = Fill<float>({2 * n, 3}, [](int64_t) { return -1; });
  world_->AllGather(in, out);
  ExpectEach<float>(out, [](int64_t i) { return (i / 6) * 1000 + i % 6; }, "f32");

  Tensor in64 = Fill<int64_t>({1, 2, 2}, [r](int64_t i) { return (int64_t{r} << 33) + i; });
  Tensor out64 = Tensor::Zeros({n, 2, 2}, DType::kI64);
  world_->AllGather(in64, out64);
  ExpectEach<int64_t>(out64, [](int64_t i) { return ((i / 4) << 33) + i % 4; }, "i64");

  // bf16 travels bit for bit (NaN patterns included).
  Tensor in16 = Fill<BFloat16>({5}, [r](int64_t i) { return 0x7f70 + r * 5 + i; });
  Tensor out16 = Tensor::Zeros({5 * n}, DType::kBF16);
  world_->AllGather(in16, out16);
  ExpectEach<BFloat16>(out16, [](int64_t i) { return 0x7f70 + i; }, "bf16");
}

TEST_F(CommunicatorTest, ReduceScatter) {
  const int n = size(), r = rank();
  // in: (n*2, 3), element j on rank s = s*1000 + j -> out: (2, 3) = rows [2r, 2r+2) summed.
  Tensor in = Fill<float>({2 * n, 3}, [r](int64_t j) { return r * 1000 + j; });
  Tensor sum = Tensor::Zeros({2, 3}, DType::kF32);
  Tensor max = Tensor::Zeros({2, 3}, DType::kF32);
  Tensor avg = Tensor::Zeros({2, 3}, DType::kF32);
  world_->ReduceScatter(in, sum, ReduceOp::kSum);
  world_->ReduceScatter(in, max, ReduceOp::kMax);
  world_->ReduceScatter(in, avg, ReduceOp::kAvg);
  auto global = [r](int64_t k) { return r * 6 + k; };
  ExpectEach<float>(sum, [&](int64_t k) { return ThousandTriangle(n) + n * global(k); }, "sum");
  ExpectEach<float>(max, [&](int64_t k) { return (n - 1) * 1000 + global(k); }, "max");
  std::vector<float> avg_values = avg.ToVector<float>();
  for (int64_t k = 0; k < 6; ++k) {
    EXPECT_EQ(avg_values[k], static_cast<float>(ThousandTriangle(n) + n * global(k)) / n);
  }

  Tensor in64 = Fill<int64_t>({n}, [r](int64_t j) { return r * 10 + j; });
  Tensor min64 = Tensor::Zeros({1}, DType::kI64);
  world_->ReduceScatter(in64, min64, ReduceOp::kMin);
  ExpectEach<int64_t>(min64, [r](int64_t) { return r; }, "i64 min");
}

TEST_F(CommunicatorTest, AllToAll) {
  const int n = size(), r = rank();
  // in: (n*2, 3): rows [2d, 2d+2) go to rank d; row q of that block, column c.
  auto code = [](int64_t src, int64_t dst, int64_t q, int64_t c) {
    return src * 10000 + dst * 100 + q * 10 + c;
  };
  Tensor in = Fill<float>({2 * n, 3}, [&](int64_t i) {
    return code(r, i / 6, (i / 3) % 2, i % 3);
  });
  Tensor out = Fill<float>({2 * n, 3}, [](int64_t) { return -1; });
  world_->AllToAll(in, out);
  ExpectEach<float>(out, [&](int64_t i) { return code(i / 6, r, (i / 3) % 2, i % 3); }, "f32");
}

TEST_F(CommunicatorTest, AllToAllVUneven) {
  CheckAllToAllV<float>(*world_, UnevenRows, {3}, false, "f32 (n, 3)");
  CheckAllToAllV<int64_t>(*world_, UnevenRows, {2, 2}, false, "i64 (n, 2, 2)");
  CheckAllToAllV<BFloat16>(*world_, UnevenRows, {5}, false, "bf16 (n, 5)");
  CheckAllToAllV<float>(*world_, UnevenRows, {}, false, "f32 (n)");
}

TEST_F(CommunicatorTest, AllToAllVSkewed) {
  const int last = size() - 1;
  // Rank 0 sends nothing; every other rank sends only to the last rank (itself included),
  // which receives everything; every rank but the last receives nothing.
  auto to_last = [last](int src, int dst) -> int64_t {
    return src != 0 && dst == last ? src * 5 : 0;
  };
  CheckAllToAllV<float>(*world_, to_last, {3}, false, "to last");
  // Everyone sends everything to rank 0 except rank 0 itself.
  auto to_first = [](int src, int dst) -> int64_t { return dst == 0 && src != 0 ? 3 : 0; };
  CheckAllToAllV<float>(*world_, to_first, {4}, false, "to first");
  // Nothing at all moves: zero-row tensors on every rank.
  auto nothing = [](int, int) -> int64_t { return 0; };
  CheckAllToAllV<float>(*world_, nothing, {3}, false, "empty");
  // Big rows: 64 KiB each, past any eager limit.
  auto few = [](int src, int dst) -> int64_t { return (src + 2 * dst) % 3; };
  CheckAllToAllV<float>(*world_, few, {16384}, false, "64 KiB rows");
}

TEST_F(CommunicatorTest, BroadcastFromEveryRoot) {
  const int r = rank();
  for (int root = 0; root < size(); ++root) {
    Tensor t = Fill<float>({4, 3}, [&](int64_t i) { return r == root ? root * 100 + i : -1; });
    world_->Broadcast(t, root);
    ExpectEach<float>(t, [root](int64_t i) { return root * 100 + i; },
                      StrCat("root ", root));
    Tensor scalar = Fill<int64_t>({}, [&](int64_t) { return r == root ? 7 * root + 1 : -1; });
    world_->Broadcast(scalar, root);
    ExpectEach<int64_t>(scalar, [root](int64_t) { return 7 * root + 1; },
                        StrCat("0-d, root ", root));
  }
}

TEST_F(CommunicatorTest, SendRecvRing) {
  const int n = size(), r = rank();
  const int next = (r + 1) % n, prev = (r + n - 1) % n;
  Tensor out = Fill<float>({3, 2}, [r](int64_t i) { return r * 100 + i; });
  Tensor in = Fill<float>({3, 2}, [](int64_t) { return -1; });
  Tensor out_tagged = Fill<int64_t>({4}, [r](int64_t i) { return r * 10 + i; });
  Tensor in_tagged = Tensor::Zeros({4}, DType::kI64);
  // Even ranks send first, odd ranks receive first: no cycle of blocking sends.
  if (r % 2 == 0) {
    world_->Send(out, next);
    world_->Recv(in, prev);
    world_->Send(out_tagged, next, 7);
    world_->Recv(in_tagged, prev, 7);
  } else {
    world_->Recv(in, prev);
    world_->Send(out, next);
    world_->Recv(in_tagged, prev, 7);
    world_->Send(out_tagged, next, 7);
  }
  ExpectEach<float>(in, [prev](int64_t i) { return prev * 100 + i; }, "ring");
  ExpectEach<int64_t>(in_tagged, [prev](int64_t i) { return prev * 10 + i; }, "tag 7");
}

// Every rank leaves the barrier after the last one entered it. Ranks enter at staggered
// times; CLOCK_MONOTONIC is one clock for every process of the (single) test machine.
TEST_F(CommunicatorTest, BarrierWaitsForEveryRank) {
  auto now_us = [] {
    timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return static_cast<int64_t>(ts.tv_sec) * 1000000 + ts.tv_nsec / 1000;
  };
  timespec pause{0, 20000000L * (size() - 1 - rank())};  // the first ranks arrive last
  nanosleep(&pause, nullptr);
  Tensor entered = Fill<int64_t>({1}, [&](int64_t) { return now_us(); });
  world_->Barrier();
  const int64_t left = now_us();
  Tensor all = Tensor::Zeros({size()}, DType::kI64);
  world_->AllGather(entered, all);
  for (int64_t t : all.ToVector<int64_t>()) EXPECT_GE(left, t);
}

TEST_F(CommunicatorTest, AsyncWaitedInReverseOrder) {
  const int n = size(), r = rank();
  Tensor sum = Fill<float>({4, 4}, [r](int64_t i) { return r * 1000 + i; });
  Tensor gather_in = Fill<int64_t>({3}, [r](int64_t i) { return r * 10 + i; });
  Tensor gather_out = Tensor::Zeros({3 * n}, DType::kI64);
  Tensor scatter_in = Fill<float>({n, 2}, [r](int64_t j) { return r * 1000 + j; });
  Tensor scatter_out = Tensor::Zeros({1, 2}, DType::kF32);
  Tensor avg = Fill<float>({5}, [r](int64_t i) { return r * 8 + i; });

  std::vector<std::unique_ptr<Work>> works;
  works.push_back(world_->AllReduceAsync(sum, ReduceOp::kSum));
  works.push_back(world_->AllGatherAsync(gather_in, gather_out));
  works.push_back(world_->ReduceScatterAsync(scatter_in, scatter_out, ReduceOp::kMax));
  works.push_back(world_->AllReduceAsync(avg, ReduceOp::kAvg));
  for (int i = static_cast<int>(works.size()) - 1; i >= 0; --i) works[i]->Wait();
  for (auto& work : works) work->Wait();  // Wait is idempotent

  ExpectEach<float>(sum, [n](int64_t i) { return ThousandTriangle(n) + n * i; }, "sum");
  ExpectEach<int64_t>(gather_out, [](int64_t i) { return (i / 3) * 10 + i % 3; }, "gather");
  ExpectEach<float>(scatter_out, [&](int64_t k) { return (n - 1) * 1000 + r * 2 + k; },
                    "scatter max");
  std::vector<float> avg_values = avg.ToVector<float>();
  for (int64_t i = 0; i < 5; ++i) {
    EXPECT_EQ(avg_values[i], static_cast<float>(8 * n * (n - 1) / 2 + n * i) / n) << i;
  }
  CheckAllToAllV<float>(*world_, UnevenRows, {3}, true, "async all_to_all_v");
}

TEST_F(CommunicatorTest, AsyncWorkWaitsWhenDestroyed) {
  const int n = size(), r = rank();
  Tensor t = Fill<int32_t>({6}, [r](int64_t i) { return r + i; });
  world_->AllReduceAsync(t, ReduceOp::kSum).reset();
  ExpectEach<int32_t>(t, [n](int64_t i) { return n * (n - 1) / 2 + n * i; }, "sum");
}

// ---- f64 --------------------------------------------------------------------------------

TEST_F(CommunicatorTest, AllReduceAndAllGatherF64) {
  const int n = size(), r = rank();
  // r * 2^40 + i + 0.5 is exact in f64 and not in f32: the values travel as doubles.
  const double big = 1099511627776.0;
  auto code = [&](int64_t i) { return r * big + static_cast<double>(i) + 0.5; };
  auto rotated = [&](int64_t i) { return ((r + i) % n) * big + static_cast<double>(i); };
  Tensor sum = Tensor::FromVector(std::vector<double>{code(0), code(1), code(2)}, {3});
  Tensor avg = sum.Clone();
  Tensor max = Tensor::FromVector(std::vector<double>{rotated(0), rotated(1)}, {2});
  Tensor min = max.Clone();
  world_->AllReduce(sum, ReduceOp::kSum);
  world_->AllReduce(avg, ReduceOp::kAvg);
  world_->AllReduce(max, ReduceOp::kMax);
  world_->AllReduceAsync(min, ReduceOp::kMin)->Wait();
  const double ranks = n * (n - 1) / 2.0;
  for (int64_t i = 0; i < 3; ++i) {
    const double want = ranks * big + n * (i + 0.5);
    EXPECT_EQ(sum.data<double>()[i], want) << i;
    EXPECT_EQ(avg.data<double>()[i], want / n) << i;
  }
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(max.data<double>()[i], (n - 1) * big + i) << i;
    EXPECT_EQ(min.data<double>()[i], static_cast<double>(i)) << i;
  }

  Tensor in = Tensor::FromVector(std::vector<double>{code(0), code(1)}, {1, 2});
  Tensor out = Tensor::Zeros({n, 2}, DType::kF64);
  world_->AllGather(in, out);
  for (int s = 0; s < n; ++s) {
    for (int64_t i = 0; i < 2; ++i) {
      EXPECT_EQ(out.data<double>()[s * 2 + i], s * big + i + 0.5) << s << " " << i;
    }
  }
  Tensor scattered = Tensor::Zeros({1, 2}, DType::kF64);
  Tensor scatter_in = Tensor::Zeros({n, 2}, DType::kF64);
  for (int64_t i = 0; i < 2 * n; ++i) scatter_in.data<double>()[i] = r * big + i;
  world_->ReduceScatter(scatter_in, scattered, ReduceOp::kSum);
  for (int64_t i = 0; i < 2; ++i) {
    EXPECT_EQ(scattered.data<double>()[i], ranks * big + n * (2.0 * r + i)) << i;
  }
}

// ---- Sub-groups -------------------------------------------------------------------------

// Checks comm's identity against `members` (world ranks, in group order) and runs an
// all_reduce, an all_gather and an uneven all_to_all_v inside it.
void CheckGroup(Communicator& comm, const std::vector<int>& members, const std::string& what) {
  const int me = WorldRank();
  EXPECT_EQ(comm.world_ranks(), members) << what;
  EXPECT_EQ(comm.size(), static_cast<int>(members.size())) << what;
  EXPECT_EQ(comm.world_ranks()[comm.rank()], me) << what;
  EXPECT_EQ(comm.backend(), members.size() == 1 ? "local" : "mpi") << what;
  const int n = comm.size();
  int64_t member_sum = 0;
  for (int w : members) member_sum += w;

  Tensor sum = Fill<int64_t>({2}, [me](int64_t i) { return me * 100 + i; });
  comm.AllReduce(sum, ReduceOp::kSum);
  ExpectEach<int64_t>(sum, [&](int64_t i) { return member_sum * 100 + n * i; },
                      what + " all_reduce");

  Tensor in = Fill<float>({1, 2}, [me](int64_t i) { return me * 10 + i; });
  Tensor out = Tensor::Zeros({n, 2}, DType::kF32);
  comm.AllGather(in, out);
  ExpectEach<float>(out, [&](int64_t i) { return members[i / 2] * 10 + i % 2; },
                    what + " all_gather");

  CheckAllToAllV<float>(comm, UnevenRows, {2}, false, what + " all_to_all_v");
  comm.Barrier();
}

TEST_F(CommunicatorTest, SplitEvenOdd) {
  std::vector<std::vector<int>> groups(2);
  for (int r = 0; r < size(); ++r) groups[r % 2].push_back(r);
  std::unique_ptr<Communicator> parity = world_->Split(groups);
  EXPECT_EQ(parity->rank(), rank() / 2);
  CheckGroup(*parity, groups[rank() % 2], "even/odd");
}

TEST_F(CommunicatorTest, SplitConsecutivePairs) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < size(); r += 2) {
    groups.push_back(r + 1 < size() ? std::vector<int>{r, r + 1} : std::vector<int>{r});
  }
  std::unique_ptr<Communicator> pair = world_->Split(groups);
  CheckGroup(*pair, groups[rank() / 2], "pairs");
}

TEST_F(CommunicatorTest, SplitKeepsListOrder) {
  // One group with the world reversed: member i is world rank size-1-i.
  std::vector<int> reversed;
  for (int r = size() - 1; r >= 0; --r) reversed.push_back(r);
  std::unique_ptr<Communicator> comm = world_->Split({reversed});
  EXPECT_EQ(comm->rank(), size() - 1 - rank());
  CheckGroup(*comm, reversed, "reversed");
}

TEST_F(CommunicatorTest, NestedSplit) {
  // Halves of the world, then pairs inside each half (or singletons for 2 ranks).
  const int half = size() / 2;
  std::vector<std::vector<int>> halves(2);
  for (int r = 0; r < size(); ++r) halves[r < half ? 0 : 1].push_back(r);
  std::unique_ptr<Communicator> mine = world_->Split(halves);
  CheckGroup(*mine, halves[rank() < half ? 0 : 1], "half");
  std::vector<std::vector<int>> pairs;
  for (int r = 0; r < mine->size(); r += 2) {
    pairs.push_back(r + 1 < mine->size() ? std::vector<int>{r, r + 1} : std::vector<int>{r});
  }
  std::unique_ptr<Communicator> pair = mine->Split(pairs);
  std::vector<int> members;
  for (int local : pairs[mine->rank() / 2]) members.push_back(mine->world_ranks()[local]);
  CheckGroup(*pair, members, "pair in half");
}

TEST_F(CommunicatorTest, SingletonGroupsDoNoCommunication) {
  std::vector<std::vector<int>> groups;
  for (int r = 0; r < size(); ++r) groups.push_back({r});
  std::unique_ptr<Communicator> self = world_->Split(groups);
  const int me = rank();
  EXPECT_EQ(self->backend(), "local");
  EXPECT_EQ(self->rank(), 0);
  EXPECT_EQ(self->size(), 1);
  EXPECT_EQ(self->world_ranks(), std::vector<int>{me});
  CheckGroup(*self, {me}, "singleton");

  Tensor t = Fill<float>({3}, [me](int64_t i) { return me * 10 + i; });
  self->AllReduce(t, ReduceOp::kAvg);
  self->AllReduceAsync(t, ReduceOp::kMax)->Wait();
  self->Broadcast(t, 0);
  ExpectEach<float>(t, [me](int64_t i) { return me * 10 + i; }, "singleton all_reduce");
  Tensor scattered = Tensor::Zeros({3}, DType::kF32);
  self->ReduceScatterAsync(t, scattered, ReduceOp::kSum)->Wait();
  ExpectEach<float>(scattered, [me](int64_t i) { return me * 10 + i; }, "reduce_scatter");
  Tensor exchanged = Tensor::Zeros({3}, DType::kF32);
  self->AllToAll(t, exchanged);
  ExpectEach<float>(exchanged, [me](int64_t i) { return me * 10 + i; }, "all_to_all");
}

}  // namespace
}  // namespace switchyard::dist
