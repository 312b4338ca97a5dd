// BlockCache (engine/core/block_cache.h), the CUDA caching allocator's bookkeeping, driven
// with malloc: reuse by size, the graph pools a captured CUDA graph's memory lives in, and
// the loans of their idle blocks between replays.
#include "engine/core/block_cache.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <set>

namespace switchyard {
namespace {

struct System {
  int allocs = 0, frees = 0;
  std::set<void*> live;
  BlockCache Make() {
    return BlockCache(
        [this](size_t bytes) {
          ++allocs;
          void* p = std::malloc(bytes);
          live.insert(p);
          return p;
        },
        [this](void* p) {
          ++frees;
          live.erase(p);
          std::free(p);
        });
  }
};

void* Get(BlockCache& cache, size_t size, bool* fresh = nullptr) {
  size_t block = 0;
  bool from_system = false;
  void* p = cache.Allocate(size, &block, &from_system);
  if (fresh != nullptr) *fresh = from_system;
  return p;
}

TEST(BlockCacheTest, ReusesFreedBlocksOfUpToTwiceTheSize) {
  System sys;
  {
    BlockCache cache = sys.Make();
    bool fresh = false;
    void* a = Get(cache, 1024, &fresh);
    EXPECT_TRUE(fresh);
    EXPECT_EQ(cache.Deallocate(a), 1024u);
    EXPECT_EQ(cache.cached(), 1024u);
    EXPECT_EQ(Get(cache, 600, &fresh), a);  // 1024 <= 2 * 600
    EXPECT_FALSE(fresh);
    cache.Deallocate(a);
    void* b = Get(cache, 400, &fresh);  // 1024 > 2 * 400: a new block
    EXPECT_TRUE(fresh);
    EXPECT_NE(b, a);
    cache.Deallocate(b);
    cache.ReleaseFree();
    EXPECT_EQ(cache.cached(), 0u);
    EXPECT_TRUE(sys.live.empty());
  }
  EXPECT_EQ(sys.allocs, sys.frees);
}

// What a capture touches stays the graph's: blocks it allocates, and blocks allocated before
// it that it frees, are handed to nothing outside the pool until the pool is released.
TEST(BlockCacheTest, GraphPoolKeepsWhatTheCaptureTouched) {
  System sys;
  BlockCache cache = sys.Make();
  void* before = Get(cache, 1024);  // e.g. an activation of the previous step
  void* cached = Get(cache, 2048);
  cache.Deallocate(cached);         // in the general free list before the capture
  const int pool = cache.NewPool();
  cache.BeginPool(pool);
  void* in_capture = Get(cache, 2048);  // taken from the general list: now the pool's
  EXPECT_EQ(in_capture, cached);
  EXPECT_EQ(cache.pool_of(in_capture), pool);
  cache.Deallocate(before);      // freed during the capture: the pool's
  cache.Deallocate(in_capture);  // freed during the capture: the pool's
  void* reused = Get(cache, 1024);  // a capture reuses its pool's blocks
  EXPECT_EQ(reused, before);
  void* outlives = Get(cache, 4096);  // allocated in the capture and kept after it
  cache.EndPool();
  EXPECT_EQ(cache.pool_free_bytes(pool), 2048u);
  EXPECT_EQ(cache.cached(), 0u);
  // Outside the capture nothing of the pool is handed out: new blocks come from the system.
  bool fresh = false;
  void* outside = Get(cache, 2048, &fresh);
  EXPECT_TRUE(fresh);
  EXPECT_NE(outside, in_capture);
  // A block the capture allocated goes back to the pool whenever it is freed.
  cache.Deallocate(outlives);
  EXPECT_EQ(cache.pool_free_bytes(pool), 2048u + 4096u);
  cache.Deallocate(reused);
  EXPECT_EQ(cache.pool_free_bytes(pool), 2048u + 4096u + 1024u);
  cache.Deallocate(outside);
  EXPECT_EQ(cache.cached(), 2048u);
  // The graph destroyed: its blocks serve everyone again.
  cache.ReleasePool(pool);
  EXPECT_EQ(cache.pool_free_bytes(pool), 0u);
  EXPECT_EQ(cache.cached(), 2048u + 2048u + 4096u + 1024u);
  EXPECT_EQ(Get(cache, 4096, &fresh), outlives);
  EXPECT_FALSE(fresh);
  cache.Deallocate(outlives);
}

TEST(BlockCacheTest, ALiveBlockOfAReleasedPoolReturnsToTheGeneralList) {
  System sys;
  BlockCache cache = sys.Make();
  const int pool = cache.NewPool();
  cache.BeginPool(pool);
  void* kept = Get(cache, 512);
  cache.EndPool();
  cache.ReleasePool(pool);
  EXPECT_EQ(cache.pool_of(kept), 0);
  cache.Deallocate(kept);
  EXPECT_EQ(cache.cached(), 512u);
  EXPECT_EQ(cache.pool_free_bytes(pool), 0u);
}

// Between replays, other work borrows the pool's idle blocks and gives them back when it
// frees them; a block still out is counted (the graph must not replay over it).
TEST(BlockCacheTest, LoansBorrowThePoolsIdleBlocks) {
  System sys;
  BlockCache cache = sys.Make();
  const int pool = cache.NewPool();
  cache.BeginPool(pool);
  void* a = Get(cache, 4096);
  void* b = Get(cache, 1024);
  cache.Deallocate(a);
  cache.Deallocate(b);
  cache.EndPool();
  const int allocs = sys.allocs;
  cache.BeginLoan(pool);
  EXPECT_EQ(cache.lending_pool(), pool);
  bool fresh = true;
  void* borrowed = Get(cache, 3000, &fresh);  // the pool's 4096 block: no new memory
  EXPECT_EQ(borrowed, a);
  EXPECT_FALSE(fresh);
  EXPECT_EQ(cache.lent_live(pool), 1);
  void* other = Get(cache, 8192, &fresh);  // nothing in the pool fits: from the system
  EXPECT_TRUE(fresh);
  EXPECT_EQ(cache.pool_of(other), 0);
  EXPECT_EQ(cache.lent_live(pool), 1);
  cache.Deallocate(borrowed);  // back to the pool, not the general list
  EXPECT_EQ(cache.lent_live(pool), 0);
  EXPECT_EQ(cache.pool_free_bytes(pool), 4096u + 1024u);
  cache.Deallocate(other);
  EXPECT_EQ(cache.cached(), 8192u);
  void* kept = Get(cache, 1024);  // borrowed and still out when the loan ends
  cache.EndLoan();
  EXPECT_EQ(cache.lending_pool(), 0);
  EXPECT_EQ(cache.lent_live(pool), 1);
  // No loan: the pool's blocks are not handed out (the general list's 8192 is).
  void* outside = Get(cache, 4096, &fresh);
  EXPECT_EQ(outside, other);
  EXPECT_FALSE(fresh);
  EXPECT_EQ(sys.allocs, allocs + 1);
  cache.Deallocate(kept);  // returns to the pool whenever it is freed
  EXPECT_EQ(cache.lent_live(pool), 0);
  EXPECT_EQ(cache.pool_free_bytes(pool), 4096u + 1024u);
  cache.Deallocate(outside);
  // Releasing the pool ends a loan from it.
  cache.BeginLoan(pool);
  void* last = Get(cache, 1024);
  cache.ReleasePool(pool);
  EXPECT_EQ(cache.lending_pool(), 0);
  EXPECT_EQ(cache.pool_of(last), 0);
  EXPECT_EQ(cache.lent_live(pool), 0);
  cache.Deallocate(last);
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
}

}  // namespace
}  // namespace switchyard
