// BlockCache: the bookkeeping of the CUDA caching allocator (allocator_cuda.cc), kept apart
// from cudaMalloc and cudaFree so that a host test drives it (tests/engine/block_cache_test.cc).
//
// Segments and blocks. The system (cudaMalloc) is asked for segments: 2 MiB for a request of
// up to 1 MiB (small), else the request rounded up to 2 MiB (large). A segment is cut into
// blocks: a request takes the smallest free block that holds it (best fit) and the block is
// split when what is left is worth keeping (at least 512 bytes in a small segment, more than
// 1 MiB in a large one), the rest staying free. A freed block merges with its free neighbours
// of the same segment and the same owner (below). So the memory held from the system stays
// close to the bytes live at the peak: a request wastes at most the split threshold, not a
// whole cached block. Small and large segments are kept apart, so small requests do not
// fragment the large blocks. All work is ordered on one stream per device, so a block the host
// frees can be handed out again at once. ReleaseFree returns the segments that are wholly
// free (a segment is returned whole or not at all).
//
// Graph pools (CUDA graphs, engine/core/captured_work.h). A captured graph replays its kernels
// at the addresses it recorded, so the memory it used must stay its own for as long as it
// lives. Between BeginPool and EndPool (the capture), every block handed out and every block
// returned belongs to the pool: a block the capture frees, allocated before it or during it,
// goes to the pool's own free list, which only later captures into the same pool draw from.
// Blocks the capture allocated and that outlive it (tensors the graph keeps) join the pool's
// free list when they are freed, whenever that is. A block is owned by one pool or by none
// (the general list); blocks of different owners never merge, and the free rest of a block
// split for a capture stays with the list it came from. ReleasePool(id) (the graph destroyed)
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
#include <set>
#include <utility>

namespace switchyard {

class BlockCache {
 public:
  static constexpr size_t kSmallRequest = size_t{1} << 20;  // up to this: a small segment's
  static constexpr size_t kSegmentRound = size_t{2} << 20;  // segment size granule
  static constexpr size_t kMinBlock = 512;  // the least a small block is split into

  // Returns null when the system has no memory left.
  using SystemAlloc = std::function<void*(size_t bytes)>;
  using SystemFree = std::function<void(void* ptr)>;
  BlockCache(SystemAlloc system_alloc, SystemFree system_free)
      : system_alloc_(std::move(system_alloc)), system_free_(std::move(system_free)) {}
  ~BlockCache();
  BlockCache(const BlockCache&) = delete;
  BlockCache& operator=(const BlockCache&) = delete;

  // A block of at least `size` bytes (rounded up to a multiple of kMinBlock), null when the
  // system has none even after the wholly free segments were returned to it.
  // *block_size: the block's size; *from_system: whether a segment was asked for (a miss).
  void* Allocate(size_t size, size_t* block_size, bool* from_system);
  // Returns a block Allocate handed out; its size.
  size_t Deallocate(void* ptr);
  // Returns the wholly free segments of the general list to the system (pools keep theirs).
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

  // Free bytes in the general list (cached), and in pool `pool`'s.
  size_t cached() const { return cached_; }
  size_t pool_free_bytes(int pool) const;
  // Bytes held from the system (the segments), now and at most so far; segments held.
  size_t reserved() const { return reserved_; }
  size_t reserved_peak() const { return reserved_peak_; }
  size_t segments() const { return segments_.size(); }
  // The pool a live block belongs to (0: none).
  int pool_of(void* ptr) const;

 private:
  struct Block {
    size_t size = 0;
    char* segment = nullptr;  // the segment it was cut from
    bool small = false;       // the segment is a small one (2 MiB for requests <= 1 MiB)
    int pool = 0;             // its owner: a graph pool, or 0 (the general list)
    bool free = true;
    bool lent = false;  // live, taken from a pool's free list during a loan
  };
  using Blocks = std::map<char*, Block>;  // every block, live or free, by address
  using FreeList = std::set<std::pair<size_t, char*>>;  // free blocks by (size, address)
  static bool IsSmall(size_t size) { return size <= kSmallRequest; }
  // Marks a block free in its owner's list (merging with its free neighbours of the same
  // segment and owner) and returns its iterator.
  Blocks::iterator Free(Blocks::iterator it);
  // Takes the best-fitting block of >= size from the free list of (pool, small), splitting it;
  // null when none holds size.
  char* Take(int pool, bool small, size_t size);
  // A new segment for a request of `size` (free in the general list); null when the system
  // has none.
  char* NewSegment(size_t size);
  // A free block into, or out of, its owner's free list (and the cached bytes).
  void List(Blocks::iterator it);
  void Unlist(Blocks::iterator it);

  SystemAlloc system_alloc_;
  SystemFree system_free_;
  Blocks blocks_;
  std::map<std::pair<int, bool>, FreeList> free_;  // (owner, small) -> its free blocks
  std::map<char*, size_t> segments_;               // start -> size
  size_t cached_ = 0;
  size_t reserved_ = 0, reserved_peak_ = 0;
  int capturing_ = 0;
  int lending_ = 0;
  int next_pool_ = 1;
};

}  // namespace switchyard
