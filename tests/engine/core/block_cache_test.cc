// BlockCache (engine/core/block_cache.h), the CUDA caching allocator's bookkeeping, driven
// with malloc: segments cut into blocks (best fit, split, merged when freed), the graph pools
// a captured CUDA graph's memory lives in, and the loans of their idle blocks between
// replays. Addresses are checked as offsets into the segment the system handed out.
#include "engine/core/block_cache.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>
#include <random>
#include <set>

namespace switchyard {
namespace {

constexpr size_t kMiB = size_t{1} << 20;
constexpr size_t kSegment = BlockCache::kSegmentRound;  // a small segment: 2 MiB

struct System {
  int allocs = 0, frees = 0;
  size_t limit = SIZE_MAX, held = 0;  // a device of `limit` bytes
  std::map<void*, size_t> live;
  BlockCache Make() {
    return BlockCache(
        [this](size_t bytes) -> void* {
          if (held + bytes > limit) return nullptr;
          ++allocs;
          void* p = std::malloc(bytes);
          live[p] = bytes;
          held += bytes;
          return p;
        },
        [this](void* p) {
          ++frees;
          held -= live.at(p);
          live.erase(p);
          std::free(p);
        });
  }
};

char* Get(BlockCache& cache, size_t size, bool* fresh = nullptr, size_t* block = nullptr) {
  size_t b = 0;
  bool from_system = false;
  char* p = static_cast<char*>(cache.Allocate(size, &b, &from_system));
  if (fresh != nullptr) *fresh = from_system;
  if (block != nullptr) *block = b;
  return p;
}

TEST(BlockCacheTest, SmallRequestsShareASegmentAndFreedNeighboursMerge) {
  System sys;
  {
    BlockCache cache = sys.Make();
    bool fresh = false;
    size_t block = 0;
    char* a = Get(cache, 1000, &fresh, &block);  // rounded to 1024
    EXPECT_TRUE(fresh);
    EXPECT_EQ(block, 1024u);
    EXPECT_EQ(cache.reserved(), kSegment);
    EXPECT_EQ(cache.cached(), kSegment - 1024);
    char* b = Get(cache, 600, &fresh, &block);  // cut from the same segment
    EXPECT_FALSE(fresh);
    EXPECT_EQ(b, a + 1024);
    EXPECT_EQ(block, 1024u);
    char* c = Get(cache, 1, &fresh, &block);
    EXPECT_EQ(c, a + 2048);
    EXPECT_EQ(block, 512u);
    EXPECT_EQ(cache.Deallocate(a), 1024u);  // b is live: no merge
    EXPECT_EQ(cache.cached(), kSegment - 1024 - 512);
    // Best fit: the 1024 hole at a, not the big rest after c.
    EXPECT_EQ(Get(cache, 700), a);
    cache.Deallocate(a);
    cache.Deallocate(b);  // merges with a
    EXPECT_EQ(Get(cache, 2048, &fresh, &block), a);  // the merged a + b
    EXPECT_EQ(block, 2048u);
    cache.Deallocate(a);
    cache.Deallocate(c);  // a + b + c + the rest: the whole segment again
    EXPECT_EQ(cache.cached(), kSegment);
    EXPECT_EQ(Get(cache, BlockCache::kSmallRequest), a);  // the largest small request
    cache.Deallocate(a);
    EXPECT_EQ(cache.segments(), 1u);
    cache.ReleaseFree();
    EXPECT_EQ(cache.cached(), 0u);
    EXPECT_EQ(cache.reserved(), 0u);
    EXPECT_EQ(cache.reserved_peak(), kSegment);
    EXPECT_TRUE(sys.live.empty());
  }
  EXPECT_EQ(sys.allocs, sys.frees);
}

TEST(BlockCacheTest, LargeRequestsRoundToSegmentsAndSplitOnlyRestsOverOneMiB) {
  System sys;
  BlockCache cache = sys.Make();
  size_t block = 0;
  bool fresh = false;
  char* x = Get(cache, 3 * kMiB, &fresh, &block);  // a 4 MiB segment; a 1 MiB rest stays on
  EXPECT_TRUE(fresh);
  EXPECT_EQ(block, 4 * kMiB);
  EXPECT_EQ(cache.reserved(), 4 * kMiB);
  cache.Deallocate(x);
  char* big = Get(cache, 16 * kMiB, &fresh, &block);
  EXPECT_TRUE(fresh);
  cache.Deallocate(big);
  char* y = Get(cache, 6 * kMiB, &fresh, &block);  // best fit: the 16 MiB, split
  EXPECT_EQ(y, big);
  EXPECT_FALSE(fresh);
  EXPECT_EQ(block, 6 * kMiB);
  char* z = Get(cache, 9 * kMiB, &fresh, &block);  // the 10 MiB rest, whole (1 MiB left)
  EXPECT_EQ(z, big + 6 * kMiB);
  EXPECT_EQ(block, 10 * kMiB);
  EXPECT_EQ(cache.reserved(), 20 * kMiB);
  // A small request is not cut from a large segment.
  char* s = Get(cache, 4096, &fresh);
  EXPECT_TRUE(fresh);
  EXPECT_EQ(cache.reserved(), 20 * kMiB + kSegment);
  cache.Deallocate(s);
  cache.Deallocate(y);
  cache.Deallocate(z);
  EXPECT_EQ(cache.cached(), cache.reserved());
}

// A step's pattern: an activation freed and its space reused by two smaller buffers. The old
// cache (no splitting) took a second segment for the second of them; now the step holds its
// peak of live bytes and nothing more, and later steps ask the system for nothing.
TEST(BlockCacheTest, ARepeatedStepHoldsItsLivePeakAndAllocatesOnlyOnce) {
  System sys;
  BlockCache cache = sys.Make();
  for (int step = 0; step < 4; ++step) {
    char* a = Get(cache, 40 * kMiB);
    char* b = Get(cache, 8 * kMiB);
    cache.Deallocate(a);
    char* c = Get(cache, 30 * kMiB);  // in a's 40 MiB, split
    char* d = Get(cache, 10 * kMiB);  // the rest of it
    EXPECT_EQ(c, a);
    EXPECT_EQ(d, a + 30 * kMiB);
    cache.Deallocate(b);
    cache.Deallocate(c);
    cache.Deallocate(d);
    EXPECT_EQ(sys.allocs, 2) << "step " << step;
  }
  EXPECT_EQ(cache.reserved_peak(), 48 * kMiB);  // = the most bytes live at once
  EXPECT_EQ(cache.cached(), 48 * kMiB);
}

TEST(BlockCacheTest, OutOfMemoryReturnsWhollyFreeSegmentsAndRetries) {
  System sys;
  sys.limit = 10 * kMiB;
  BlockCache cache = sys.Make();
  char* x = Get(cache, 6 * kMiB);
  cache.Deallocate(x);
  bool fresh = false;
  char* y = Get(cache, 8 * kMiB, &fresh);  // 6 + 8 > 10: the free 6 MiB goes back first
  ASSERT_NE(y, nullptr);
  EXPECT_TRUE(fresh);
  EXPECT_EQ(cache.reserved(), 8 * kMiB);
  EXPECT_EQ(sys.frees, 1);
  EXPECT_EQ(Get(cache, 4 * kMiB), nullptr);  // nothing free to return: out of memory
  EXPECT_EQ(cache.reserved(), 8 * kMiB);
  cache.Deallocate(y);
}

// Out of memory while a graph is captured: no segment goes back (freeing device memory would
// synchronise the device, which invalidates the capture); the request fails at once.
TEST(BlockCacheTest, OutOfMemoryDuringACaptureReturnsNothing) {
  System sys;
  sys.limit = 10 * kMiB;
  BlockCache cache = sys.Make();
  cache.Deallocate(Get(cache, 6 * kMiB));  // a wholly free 6 MiB segment
  const int pool = cache.NewPool();
  cache.BeginPool(pool);
  EXPECT_EQ(Get(cache, 8 * kMiB), nullptr);
  EXPECT_EQ(sys.frees, 0);
  EXPECT_EQ(cache.reserved(), 6 * kMiB);
  cache.EndPool();
  char* y = Get(cache, 8 * kMiB);  // outside the capture the free segment goes back first
  ASSERT_NE(y, nullptr);
  EXPECT_EQ(sys.frees, 1);
  cache.Deallocate(y);
  cache.ReleasePool(pool);
}

// What a capture touches stays the graph's: blocks it allocates, and blocks allocated before
// it that it frees, are handed to nothing outside the pool until the pool is released.
TEST(BlockCacheTest, GraphPoolKeepsWhatTheCaptureTouched) {
  System sys;
  BlockCache cache = sys.Make();
  char* before = Get(cache, 1024);  // e.g. an activation of the previous step
  char* cached = Get(cache, 2048);
  EXPECT_EQ(cached, before + 1024);
  cache.Deallocate(cached);  // in the general free list before the capture
  const int pool = cache.NewPool();
  cache.BeginPool(pool);
  char* in_capture = Get(cache, 2048);  // cut from the general list: now the pool's
  EXPECT_EQ(in_capture, cached);
  EXPECT_EQ(cache.pool_of(in_capture), pool);
  cache.Deallocate(before);      // freed during the capture: the pool's
  cache.Deallocate(in_capture);  // freed during the capture: the pool's (merged with before)
  EXPECT_EQ(cache.pool_free_bytes(pool), 3072u);
  EXPECT_EQ(cache.cached(), kSegment - 3072);  // the rest of the segment stays general
  char* reused = Get(cache, 1024);  // a capture reuses its pool's blocks
  EXPECT_EQ(reused, before);
  char* outlives = Get(cache, 4096);  // allocated in the capture and kept after it
  EXPECT_EQ(outlives, before + 3072);  // the pool's 2048 do not hold it: the general rest
  cache.EndPool();
  EXPECT_EQ(cache.pool_free_bytes(pool), 2048u);
  EXPECT_EQ(cache.cached(), kSegment - 3072 - 4096);
  // Outside the capture nothing of the pool is handed out: the pool's free 2048 at
  // before + 1024 would fit, the general rest is taken.
  bool fresh = true;
  char* outside = Get(cache, 2048, &fresh);
  EXPECT_FALSE(fresh);
  EXPECT_EQ(outside, before + 7168);
  EXPECT_EQ(cache.pool_of(outside), 0);
  // A block the capture allocated goes back to the pool whenever it is freed.
  cache.Deallocate(outlives);
  EXPECT_EQ(cache.pool_free_bytes(pool), 2048u + 4096u);
  cache.Deallocate(reused);
  EXPECT_EQ(cache.pool_free_bytes(pool), 2048u + 4096u + 1024u);
  cache.Deallocate(outside);  // general: merges with the general rest, not with the pool's
  EXPECT_EQ(cache.cached(), kSegment - 7168);
  // The graph destroyed: its blocks serve everyone again, merged into the whole segment.
  cache.ReleasePool(pool);
  EXPECT_EQ(cache.pool_free_bytes(pool), 0u);
  EXPECT_EQ(cache.cached(), kSegment);
  EXPECT_EQ(Get(cache, 4096, &fresh), before);
  EXPECT_FALSE(fresh);
  cache.Deallocate(before);
  cache.ReleaseFree();
  EXPECT_EQ(cache.reserved(), 0u);
}

TEST(BlockCacheTest, ALiveBlockOfAReleasedPoolReturnsToTheGeneralList) {
  System sys;
  BlockCache cache = sys.Make();
  const int pool = cache.NewPool();
  cache.BeginPool(pool);
  char* kept = Get(cache, 512);
  cache.EndPool();
  cache.ReleasePool(pool);
  EXPECT_EQ(cache.pool_of(kept), 0);
  cache.Deallocate(kept);
  EXPECT_EQ(cache.cached(), kSegment);  // merged with the segment's general rest
  EXPECT_EQ(cache.pool_free_bytes(pool), 0u);
}

// Between replays, other work borrows the pool's idle blocks and gives them back when it
// frees them; a block still out is counted (the graph must not replay over it).
TEST(BlockCacheTest, LoansBorrowThePoolsIdleBlocks) {
  System sys;
  BlockCache cache = sys.Make();
  const int pool = cache.NewPool();
  cache.BeginPool(pool);
  char* a = Get(cache, 4096);
  char* b = Get(cache, 1024);
  EXPECT_EQ(b, a + 4096);
  cache.Deallocate(a);
  cache.Deallocate(b);
  cache.EndPool();
  EXPECT_EQ(cache.pool_free_bytes(pool), 5120u);
  const int allocs = sys.allocs;
  cache.BeginLoan(pool);
  EXPECT_EQ(cache.lending_pool(), pool);
  bool fresh = true;
  char* borrowed = Get(cache, 3000, &fresh);  // cut from the pool's 5120: no new memory
  EXPECT_EQ(borrowed, a);
  EXPECT_FALSE(fresh);
  EXPECT_EQ(cache.lent_live(pool), 1);
  EXPECT_EQ(cache.pool_free_bytes(pool), 2048u);
  char* other = Get(cache, 8192, &fresh);  // nothing in the pool holds it: the general rest
  EXPECT_EQ(other, a + 5120);
  EXPECT_EQ(cache.pool_of(other), 0);
  EXPECT_EQ(cache.lent_live(pool), 1);
  cache.Deallocate(borrowed);  // back to the pool, not the general list
  EXPECT_EQ(cache.lent_live(pool), 0);
  EXPECT_EQ(cache.pool_free_bytes(pool), 5120u);
  cache.Deallocate(other);
  EXPECT_EQ(cache.cached(), kSegment - 5120);
  char* kept = Get(cache, 1024);  // borrowed and still out when the loan ends
  EXPECT_EQ(kept, a);
  cache.EndLoan();
  EXPECT_EQ(cache.lending_pool(), 0);
  EXPECT_EQ(cache.lent_live(pool), 1);
  // No loan: the pool's blocks are not handed out (the general rest is).
  char* outside = Get(cache, 4096, &fresh);
  EXPECT_EQ(outside, other);
  EXPECT_FALSE(fresh);
  EXPECT_EQ(sys.allocs, allocs);
  cache.Deallocate(kept);  // returns to the pool whenever it is freed
  EXPECT_EQ(cache.lent_live(pool), 0);
  EXPECT_EQ(cache.pool_free_bytes(pool), 5120u);
  cache.Deallocate(outside);
  // Releasing the pool ends a loan from it.
  cache.BeginLoan(pool);
  char* last = Get(cache, 1024);
  cache.ReleasePool(pool);
  EXPECT_EQ(cache.lending_pool(), 0);
  EXPECT_EQ(cache.pool_of(last), 0);
  EXPECT_EQ(cache.lent_live(pool), 0);
  cache.Deallocate(last);
  EXPECT_EQ(cache.cached(), kSegment);
}

// Random requests, frees, captures, loans and releases: live blocks never overlap and lie in
// what the system handed out, a block is the capturing pool's during a capture and no pool's
// outside a capture or loan, the byte counts add up, and once all is freed and released every
// segment is whole and goes back.
TEST(BlockCacheTest, RandomUseKeepsBlocksDisjointAndReturnsEverything) {
  System sys;
  {
    BlockCache cache = sys.Make();
    std::mt19937_64 rng(7);
    std::map<char*, size_t> live;  // ptr -> block size
    std::vector<int> pools;
    auto size_of = [&]() -> size_t {
      switch (rng() % 3) {
        case 0: return 1 + rng() % 8192;
        case 1: return 1 + rng() % kMiB;
        default: return kMiB + rng() % (24 * kMiB);
      }
    };
    for (int op = 0; op < 4000; ++op) {
      const int r = static_cast<int>(rng() % 100);
      if (r < 50 || live.empty()) {
        size_t block = 0;
        bool fresh = false;
        const size_t want = size_of();
        char* p = static_cast<char*>(cache.Allocate(want, &block, &fresh));
        ASSERT_NE(p, nullptr);
        ASSERT_GE(block, want);
        // Inside one system allocation at a multiple of kMinBlock, disjoint from every live
        // block, and owned as the capture or loan says.
        auto seg = sys.live.upper_bound(p);
        ASSERT_NE(seg, sys.live.begin());
        --seg;
        char* start = static_cast<char*>(seg->first);
        ASSERT_EQ(static_cast<size_t>(p - start) % BlockCache::kMinBlock, 0u);
        ASSERT_LE(p + block, start + seg->second);
        const int owner = cache.pool_of(p);
        if (cache.capturing_pool() != 0) {
          ASSERT_EQ(owner, cache.capturing_pool());
        } else if (cache.lending_pool() != 0) {
          ASSERT_TRUE(owner == 0 || owner == cache.lending_pool());
        } else {
          ASSERT_EQ(owner, 0);
        }
        auto next = live.lower_bound(p);
        if (next != live.end()) {
          ASSERT_LE(p + block, next->first);
        }
        if (next != live.begin()) {
          ASSERT_LE(std::prev(next)->first + std::prev(next)->second, p);
        }
        live[p] = block;
      } else if (r < 90) {
        auto it = live.begin();
        std::advance(it, rng() % live.size());
        ASSERT_EQ(cache.Deallocate(it->first), it->second);
        live.erase(it);
      } else if (r < 94 && cache.capturing_pool() == 0 && cache.lending_pool() == 0) {
        if (pools.empty() || rng() % 2 == 0) pools.push_back(cache.NewPool());
        cache.BeginPool(pools[rng() % pools.size()]);
      } else if (r < 97 && cache.capturing_pool() != 0) {
        cache.EndPool();
      } else if (r < 98 && cache.capturing_pool() == 0 && cache.lending_pool() == 0 &&
                 !pools.empty()) {
        cache.BeginLoan(pools[rng() % pools.size()]);
      } else if (r < 99 && cache.lending_pool() != 0) {
        cache.EndLoan();
      } else if (!pools.empty()) {
        const size_t i = rng() % pools.size();
        if (pools[i] != cache.capturing_pool()) {
          cache.ReleasePool(pools[i]);
          pools.erase(pools.begin() + static_cast<std::ptrdiff_t>(i));
        }
      }
      size_t live_bytes = 0, pool_bytes = 0;
      for (const auto& [p, b] : live) live_bytes += b;
      for (int pool : pools) pool_bytes += cache.pool_free_bytes(pool);
      ASSERT_EQ(live_bytes + cache.cached() + pool_bytes, cache.reserved()) << "op " << op;
      ASSERT_EQ(cache.reserved(), sys.held);
    }
    if (cache.capturing_pool() != 0) cache.EndPool();
    cache.EndLoan();
    for (const auto& [p, b] : live) cache.Deallocate(p);
    for (int pool : pools) cache.ReleasePool(pool);
    EXPECT_EQ(cache.cached(), cache.reserved());
    cache.ReleaseFree();
    EXPECT_EQ(cache.reserved(), 0u);
    EXPECT_EQ(cache.segments(), 0u);
    EXPECT_TRUE(sys.live.empty());
  }
  EXPECT_EQ(sys.allocs, sys.frees);
}

TEST(BlockCacheDeathTest, MisuseIsFatal) {
  System sys;
  BlockCache cache = sys.Make();
  EXPECT_DEATH(cache.BeginPool(1), "not a pool id");
  EXPECT_DEATH(cache.EndPool(), "EndPool without BeginPool");
  const int pool = cache.NewPool();
  cache.BeginPool(pool);
  EXPECT_DEATH(cache.BeginPool(pool), "while pool");
  EXPECT_DEATH(cache.ReleasePool(pool), "while it captures");
  EXPECT_DEATH(cache.BeginLoan(pool), "during a capture or another loan");
  cache.EndPool();
  cache.BeginLoan(pool);
  EXPECT_DEATH(cache.BeginLoan(pool), "during a capture or another loan");
  EXPECT_DEATH(cache.BeginPool(pool), "lends");
  cache.EndLoan();
  int x = 0;
  EXPECT_DEATH(cache.Deallocate(&x), "did not hand out");
  char* p = Get(cache, 512);
  cache.Deallocate(p);
  EXPECT_DEATH(cache.Deallocate(p), "did not hand out");  // twice
}

}  // namespace
}  // namespace switchyard
