// engine/core/thread_pool.h: ParallelFor covers every index exactly once in contiguous chunks
// of at least min_chunk on 1 to 4 threads, runs a nested call inline, stays correct when
// two threads call it at once, and SetComputeThreads replaces the pool.
#include "engine/core/thread_pool.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <new>
#include <thread>
#include <utility>
#include <vector>

#include "tests/testing/address_space.h"

namespace switchyard {
namespace {

class ParallelForTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { SetComputeThreads(GetParam()); }
};

TEST_P(ParallelForTest, CoversEveryIndexOnceInContiguousChunks) {
  ASSERT_EQ(ComputeThreads(), GetParam());
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{1000}, int64_t{100003}}) {
    for (int64_t min_chunk : {int64_t{1}, int64_t{64}, int64_t{5000}}) {
      std::vector<int> hits(static_cast<size_t>(n), 0);
      std::mutex mu;
      std::vector<std::pair<int64_t, int64_t>> chunks;
      ParallelFor(n, min_chunk, [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) ++hits[i];  // chunks are disjoint: no race
        std::lock_guard<std::mutex> lock(mu);
        chunks.emplace_back(begin, end);
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[i], 1) << "n=" << n << " index " << i;
      std::sort(chunks.begin(), chunks.end());
      const int64_t most = std::max<int64_t>(1, std::min<int64_t>(GetParam(), n / min_chunk));
      EXPECT_EQ(static_cast<int64_t>(chunks.size()), most) << "n=" << n << " min_chunk=" << min_chunk;
      for (size_t c = 0; c < chunks.size(); ++c) {
        EXPECT_EQ(chunks[c].first, c == 0 ? 0 : chunks[c - 1].second);
        if (chunks.size() > 1) {
          EXPECT_GE(chunks[c].second - chunks[c].first, min_chunk);
        }
      }
      EXPECT_EQ(chunks.back().second, n);
    }
  }
}

TEST_P(ParallelForTest, ANestedCallRunsInlineOnItsChunksThread) {
  std::atomic<int> wrong{0}, outer_chunks{0};
  EXPECT_FALSE(InParallelRegion());
  ParallelFor(4 * GetParam(), 1, [&](int64_t, int64_t) {
    ++outer_chunks;
    if (GetParam() > 1 && !InParallelRegion()) ++wrong;
    const std::thread::id me = std::this_thread::get_id();
    int inner_chunks = 0;
    ParallelFor(1000, 1, [&](int64_t b, int64_t e) {
      ++inner_chunks;
      if (std::this_thread::get_id() != me || b != 0 || e != 1000) ++wrong;
    });
    if (inner_chunks != 1) ++wrong;
  });
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(outer_chunks.load(), GetParam());
  EXPECT_FALSE(InParallelRegion());
}

TEST_P(ParallelForTest, TwoCallingThreadsAtOnceBothGetEveryIndex) {
  auto run = [](int64_t seed, std::atomic<int>& bad) {
    for (int round = 0; round < 300; ++round) {
      const int64_t n = 1 + (seed * 7919 + round * 104729) % 5000;
      std::vector<int64_t> out(static_cast<size_t>(n), 0);
      ParallelFor(n, 16, [&](int64_t b, int64_t e) {
        for (int64_t i = b; i < e; ++i) out[i] = i * seed;
      });
      for (int64_t i = 0; i < n; ++i) bad += out[i] != i * seed;
    }
  };
  std::atomic<int> bad{0};
  std::thread other(run, 3, std::ref(bad));
  run(5, bad);
  other.join();
  EXPECT_EQ(bad.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(Threads, ParallelForTest, ::testing::Values(1, 2, 3, 4));

TEST(ComputeThreadsTest, SetReplacesThePoolAndZeroIsRefused) {
  SetComputeThreads(3);
  EXPECT_EQ(ComputeThreads(), 3);
  SetComputeThreads(1);
  EXPECT_EQ(ComputeThreads(), 1);
  EXPECT_DEATH(SetComputeThreads(0), "threads must be >= 1, got 0");
}

// A worker's chunk that runs out of memory (std::bad_alloc) ends the process with one line
// and exit 5, the allocator's out-of-memory status, not std::terminate's abort.
TEST(ComputeThreadsTest, AWorkersBadAllocEndsTheProcessWithExitFive) {
  EXPECT_EXIT(
      {
        SetComputeThreads(2);
        ParallelFor(2, 1, [](int64_t begin, int64_t) {
          if (begin == 1) throw std::bad_alloc();
        });
      },
      ::testing::ExitedWithCode(5), "ran out of host memory \\(in a compute thread");
}

// A worker the system refuses (no address space left for its stack) ends the process with
// one line and exit 5, not std::terminate's abort: the address space is capped a few MiB
// above what the process maps, so the 8 MiB stacks of new workers cannot be mapped.
void StartWorkersWithoutAddressSpace() {
  test_util::CapAddressSpace(4 << 20);
  SetComputeThreads(16);
  ParallelFor(16, 1, [](int64_t, int64_t) {});
}

TEST(ComputeThreadsTest, ARefusedWorkerEndsTheProcessWithExitFive) {
  EXPECT_EXIT(StartWorkersWithoutAddressSpace(), ::testing::ExitedWithCode(5),
              "could not start a thread \\(in the compute thread pool: ");
}

}  // namespace
}  // namespace switchyard
