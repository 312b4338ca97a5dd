#include "engine/core/block_cache.h"

#include <algorithm>

#include "engine/core/check.h"

namespace switchyard {

BlockCache::~BlockCache() {
  for (auto& [start, bytes] : segments_) system_free_(start);
}

void BlockCache::List(Blocks::iterator it) {
  const Block& b = it->second;
  free_[{b.pool, b.small}].emplace(b.size, it->first);
  if (b.pool == 0) cached_ += b.size;
}

void BlockCache::Unlist(Blocks::iterator it) {
  const Block& b = it->second;
  free_[{b.pool, b.small}].erase({b.size, it->first});
  if (b.pool == 0) cached_ -= b.size;
}

char* BlockCache::NewSegment(size_t size) {
  const bool small = IsSmall(size);
  const size_t bytes =
      small ? kSegmentRound : (size + kSegmentRound - 1) / kSegmentRound * kSegmentRound;
  char* start = static_cast<char*>(system_alloc_(bytes));
  if (start == nullptr) return nullptr;
  segments_[start] = bytes;
  reserved_ += bytes;
  reserved_peak_ = std::max(reserved_peak_, reserved_);
  List(blocks_.emplace(start, Block{bytes, start, small, 0, true, false}).first);
  return start;
}

char* BlockCache::Take(int pool, bool small, size_t size) {
  auto lists = free_.find({pool, small});
  if (lists == free_.end()) return nullptr;
  auto f = lists->second.lower_bound({size, nullptr});
  if (f == lists->second.end()) return nullptr;
  char* ptr = f->second;
  auto it = blocks_.find(ptr);
  Unlist(it);
  Block& b = it->second;
  const size_t rest = b.size - size;
  if (small ? rest >= kMinBlock : rest > kSmallRequest) {
    b.size = size;
    List(blocks_.emplace(ptr + size, Block{rest, b.segment, b.small, b.pool, true, false}).first);
  }
  b.free = false;
  return ptr;
}

void* BlockCache::Allocate(size_t size, size_t* block_size, bool* from_system) {
  size = std::max(kMinBlock, (size + kMinBlock - 1) / kMinBlock * kMinBlock);
  const bool small = IsSmall(size);
  *from_system = false;
  char* ptr = nullptr;
  bool lent = false;
  if (capturing_ != 0) {
    ptr = Take(capturing_, small, size);
  } else if (lending_ != 0) {
    ptr = Take(lending_, small, size);
    lent = ptr != nullptr;
  }
  if (ptr == nullptr) ptr = Take(0, small, size);
  if (ptr == nullptr) {
    if (NewSegment(size) == nullptr) {
      // Returning segments frees device memory, which synchronises the device: not while a
      // stream is captured (the capture would be invalidated), where it is out of memory.
      if (capturing_ != 0) return nullptr;
      ReleaseFree();
      if (NewSegment(size) == nullptr) return nullptr;
    }
    *from_system = true;
    ptr = Take(0, small, size);  // the new segment: nothing else in the list held size
  }
  Block& b = blocks_.at(ptr);
  if (capturing_ != 0) b.pool = capturing_;
  b.lent = lent;
  *block_size = b.size;
  return ptr;
}

BlockCache::Blocks::iterator BlockCache::Free(Blocks::iterator it) {
  Block& b = it->second;
  b.free = true;
  b.lent = false;
  auto joins = [&](const Block& n) { return n.free && n.segment == b.segment && n.pool == b.pool; };
  auto next = std::next(it);
  if (next != blocks_.end() && joins(next->second)) {
    Unlist(next);
    b.size += next->second.size;
    blocks_.erase(next);
  }
  if (it != blocks_.begin()) {
    auto prev = std::prev(it);
    if (joins(prev->second)) {
      Unlist(prev);
      prev->second.size += b.size;
      blocks_.erase(it);
      it = prev;
    }
  }
  List(it);
  return it;
}

size_t BlockCache::Deallocate(void* ptr) {
  auto it = blocks_.find(static_cast<char*>(ptr));
  SY_CHECK(it != blocks_.end() && !it->second.free)
      << "freeing a pointer this allocator did not hand out";
  const size_t size = it->second.size;
  // Freed during a capture: the graph may touch it at replay, so the pool keeps it (a block
  // of another graph's pool stays that graph's).
  if (capturing_ != 0 && it->second.pool == 0) it->second.pool = capturing_;
  Free(it);
  return size;
}

void BlockCache::ReleaseFree() {
  for (auto s = segments_.begin(); s != segments_.end();) {
    auto it = blocks_.find(s->first);
    const Block& b = it->second;
    if (!b.free || b.pool != 0 || b.size != s->second) {
      ++s;
      continue;
    }
    Unlist(it);
    blocks_.erase(it);
    system_free_(s->first);
    reserved_ -= s->second;
    s = segments_.erase(s);
  }
}

void BlockCache::BeginPool(int pool) {
  SY_CHECK(pool > 0 && pool < next_pool_) << "BeginPool: " << pool << " is not a pool id";
  SY_CHECK(capturing_ == 0) << "BeginPool(" << pool << ") while pool " << capturing_
                            << " captures";
  SY_CHECK(lending_ == 0) << "BeginPool(" << pool << ") while pool " << lending_ << " lends";
  capturing_ = pool;
}

void BlockCache::EndPool() {
  SY_CHECK(capturing_ != 0) << "EndPool without BeginPool";
  capturing_ = 0;
}

void BlockCache::BeginLoan(int pool) {
  SY_CHECK(pool > 0 && pool < next_pool_) << "BeginLoan: " << pool << " is not a pool id";
  SY_CHECK(capturing_ == 0 && lending_ == 0)
      << "BeginLoan(" << pool << ") during a capture or another loan";
  lending_ = pool;
}

void BlockCache::EndLoan() { lending_ = 0; }

void BlockCache::ReleasePool(int pool) {
  SY_CHECK(pool != capturing_) << "ReleasePool(" << pool << ") while it captures";
  if (lending_ == pool) lending_ = 0;
  for (auto it = blocks_.begin(); it != blocks_.end();) {
    Block& b = it->second;
    if (b.pool != pool) {
      ++it;
    } else if (!b.free) {
      b.pool = 0;
      b.lent = false;
      ++it;
    } else {  // to the general list, merged with its free neighbours there
      Unlist(it);
      b.pool = 0;
      it = std::next(Free(it));
    }
  }
  free_.erase({pool, true});
  free_.erase({pool, false});
}

int64_t BlockCache::lent_live(int pool) const {
  int64_t n = 0;
  for (const auto& [ptr, b] : blocks_) n += !b.free && b.lent && b.pool == pool ? 1 : 0;
  return n;
}

size_t BlockCache::pool_free_bytes(int pool) const {
  size_t bytes = 0;
  for (bool small : {true, false}) {
    auto it = free_.find({pool, small});
    if (it == free_.end()) continue;
    for (const auto& [size, ptr] : it->second) bytes += size;
  }
  return bytes;
}

int BlockCache::pool_of(void* ptr) const {
  auto it = blocks_.find(static_cast<char*>(ptr));
  return it == blocks_.end() || it->second.free ? 0 : it->second.pool;
}

}  // namespace switchyard
