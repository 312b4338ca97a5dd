// BlockCache: the bookkeeping of the CUDA caching allocator (allocator_cuda.cc), kept apart
// from cudaMalloc and cudaFree so that a host test drives it (tests/engine/block_cache_test.cc).
//
// Freed blocks go to a size-ordered free list and serve later requests of up to twice their
// size; blocks are not split. All work is ordered on one stream per device, so a block the
// host frees can be handed out again at once.
//
// Graph pools (CUDA graphs, engine/core/captured_work.h). A captured graph replays its kernels
// at the addresses it recorded, so the memory it used must stay its own for as long as it
// lives. Between BeginPool and EndPool (the capture), every block handed out and every block
// returned belongs to the pool: a block the capture frees, allocated before it or during it,
// goes to the pool's own free list, which only later captures into the same pool draw from.
// Blocks the capture allocated and that outlive it (tensors the graph keeps) join the pool's
// free list when they are freed, whenever that is. ReleasePool(id) (the graph destroyed)
// gives the pool's blocks back to the general free list.
//
// Loans: between two replays the pool's free blocks are idle, and the work that runs there
// (the update, validation) may borrow them (BeginLoan) so that graph mode needs no more
// memory than eager steps. A lent block goes back to the pool when freed; lent_live(pool)
// counts those not yet back, which must be none when the graph replays (it writes them).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>

namespace switchyard {

class BlockCache {
 public:
  // Returns null when the system has no memory left.
  using SystemAlloc = std::function<void*(size_t bytes)>;
  using SystemFree = std::function<void(void* ptr)>;
  BlockCache(SystemAlloc system_alloc, SystemFree system_free)
      : system_alloc_(std::move(system_alloc)), system_free_(std::move(system_free)) {}
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A block of at least `size` bytes (callers round), null when the system has none even
  // after the general free list was returned to it. *block_size: the block's size;
  // *from_system: whether the system was asked (a cache miss).
  void* Allocate(size_t size, size_t* block_size, bool* from_system);
  // Returns a block Allocate handed out; its size.
  size_t Deallocate(void* ptr);
  // Returns the general free list to the system (the pools' blocks stay).
  void ReleaseFree();

  // Starts a capture into pool `pool` (> 0; a new id from NewPool, or one a graph already
  // holds). One capture at a time.
  int NewPool() { return next_pool_++; }
  void BeginPool(int pool);
  void EndPool();
  int capturing_pool() const { return capturing_; }
  // The pool's free blocks go back to the general free list; its live blocks join it when
  // they are freed (a loan from it ends).
  void ReleasePool(int pool);
  // Outside a capture: allocations try pool `pool`'s free list first (lent blocks) until
  // EndLoan. One loan at a time.
  void BeginLoan(int pool);
  void EndLoan();
  int lending_pool() const { return lending_; }
  // Lent blocks of `pool` still live.
  int64_t lent_live(int pool) const;

  // Bytes in the general free list, and in pool `pool`'s.
  size_t cached() const { return cached_; }
  size_t pool_free_bytes(int pool) const;
  // The pool a live block belongs to (0: none).
  int pool_of(void* ptr) const;

 private:
  struct Live {
    size_t size = 0;
    int pool = 0;
    bool lent = false;  // taken from the pool's free list during a loan
  };
  using FreeList = std::multimap<size_t, void*>;  // size -> block
  // A block of >= size and <= 2 size from `list`, or null.
  static void* Take(FreeList& list, size_t size, size_t* block_size);

  SystemAlloc system_alloc_;
  SystemFree system_free_;
  FreeList free_;                  // the general free list
  std::map<int, FreeList> pools_;  // each graph pool's free list
  std::map<void*, Live> live_;
  size_t cached_ = 0;
  int capturing_ = 0;
  int lending_ = 0;
  int next_pool_ = 1;
};

}  // namespace switchyard
