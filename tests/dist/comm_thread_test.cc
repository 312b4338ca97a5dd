// dist::CommThread (engine/dist/comm_thread.h), run with 2, 4 and 8 ranks: exchanges posted
// to the thread deliver exactly what the blocking AllToAllV delivers — several in flight at
// once, uneven and zero-row splits, waited for in any order, one left to the destructor —
// while the posting thread runs collectives of its own on another communicator; every
// exchange reports a non-negative time in flight and time waited. Each rank's values are
// integers from (rank, destination, row, column), so every expected value is exact.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <vector>

#include "engine/dist/comm_thread.h"
#include "engine/dist/process.h"

namespace switchyard::dist {
namespace {

// Rows this rank sends to `dest` in exchange `x` (0 for some pairs: empty splits).
int64_t RowsTo(int me, int dest, int x) { return (me + 2 * dest + x) % 4; }

constexpr int64_t kCols = 3;

float Value(int src, int dest, int64_t row, int64_t col, int x) {
  return static_cast<float>(((x * 16 + src) * 16 + dest) * 1000 + row * kCols + col);
}

struct Exchange {
  Tensor in, out;
  std::vector<int64_t> send, recv;
};

Exchange Make(int me, int size, int x) {
  Exchange e;
  int64_t total = 0, received = 0;
  for (int r = 0; r < size; ++r) {
    e.send.push_back(RowsTo(me, r, x));
    e.recv.push_back(RowsTo(r, me, x));
    total += e.send.back();
    received += e.recv.back();
  }
  e.in = Tensor::Empty({total, kCols}, DType::kF32);
  e.out = Tensor::Empty({received, kCols}, DType::kF32);
  float* p = e.in.data<float>();
  for (int r = 0; r < size; ++r)
    for (int64_t i = 0; i < e.send[r]; ++i)
      for (int64_t c = 0; c < kCols; ++c) *p++ = Value(me, r, i, c, x);
  return e;
}

// What `out` must hold after exchange x.
std::vector<float> Expected(int me, int size, int x) {
  std::vector<float> want;
  for (int s = 0; s < size; ++s)
    for (int64_t i = 0; i < RowsTo(s, me, x); ++i)
      for (int64_t c = 0; c < kCols; ++c) want.push_back(Value(s, me, i, c, x));
  return want;
}

TEST(CommThreadTest, PostedExchangesDeliverWhatTheBlockingOneDelivers) {
  auto world = WorldCommunicator();
  auto other = world->Split({[&] {
    std::vector<int> all;
    for (int r = 0; r < world->size(); ++r) all.push_back(r);
    return all;
  }()});
  const int me = world->rank(), size = world->size();
  CommThread thread(*world);
  if (me == 0) {
    std::printf("[ info     ] exchanges on a thread of their own: %s (MPI_THREAD_MULTIPLE %s)\n",
                thread.threaded() ? "yes" : "no", MpiThreadMultiple() ? "provided" : "absent");
  }
  EXPECT_EQ(thread.threaded(), size > 1 && MpiThreadMultiple());
  constexpr int kExchanges = 4;
  std::vector<Exchange> ex;
  std::vector<std::unique_ptr<TimedWork>> works;
  for (int x = 0; x < kExchanges; ++x) {
    ex.push_back(Make(me, size, x));
    works.push_back(thread.AllToAllV(ex[x].in, ex[x].send, ex[x].out, ex[x].recv));
  }
  // The posting thread's own collective on another communicator meanwhile.
  Tensor sum = Tensor::FromVector<int64_t>({me + 1}, {1});
  other->AllReduce(sum, ReduceOp::kSum);
  EXPECT_EQ(sum.data<int64_t>()[0], int64_t(size) * (size + 1) / 2);
  // Waited for out of order; the last one by its destructor.
  for (int x : {2, 0, 1}) {
    works[x]->Wait();
    works[x]->Wait();  // idempotent
    EXPECT_EQ(ex[x].out.ToVector<float>(), Expected(me, size, x)) << "exchange " << x;
    EXPECT_GE(works[x]->seconds(), 0.0);
    EXPECT_GE(works[x]->exposed_seconds(), 0.0);
  }
  works[3].reset();
  EXPECT_EQ(ex[3].out.ToVector<float>(), Expected(me, size, 3)) << "exchange 3";
  // The same exchange through the blocking call.
  Exchange blocking = Make(me, size, 1);
  world->AllToAllV(blocking.in, blocking.send, blocking.out, blocking.recv);
  EXPECT_EQ(blocking.out.ToVector<float>(), ex[1].out.ToVector<float>());
}

}  // namespace
}  // namespace switchyard::dist
