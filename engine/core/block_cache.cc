#include "engine/core/block_cache.h"

#include "engine/core/check.h"

namespace switchyard {

BlockCache::~BlockCache() {
  for (auto& [size, ptr] : free_) system_free_(ptr);
  for (auto& [id, list] : pools_) {
    for (auto& [size, ptr] : list) system_free_(ptr);
  }
}

void* BlockCache::Take(FreeList& list, size_t size, size_t* block_size) {
  auto it = list.lower_bound(size);
  if (it == list.end() || it->first > 2 * size) return nullptr;
  *block_size = it->first;
  void* ptr = it->second;
  list.erase(it);
  return ptr;
}

void* BlockCache::Allocate(size_t size, size_t* block_size, bool* from_system) {
  *from_system = false;
  void* ptr = nullptr;
  if (capturing_ != 0) ptr = Take(pools_[capturing_], size, block_size);
  if (capturing_ == 0 && lending_ != 0) {
    ptr = Take(pools_[lending_], size, block_size);
    if (ptr != nullptr) {
      live_[ptr] = Live{*block_size, lending_, /*lent=*/true};
      return ptr;
    }
  }
  if (ptr == nullptr) {
    ptr = Take(free_, size, block_size);
    if (ptr != nullptr) cached_ -= *block_size;
  }
  if (ptr == nullptr) {
    *from_system = true;
    *block_size = size;
    ptr = system_alloc_(size);
    if (ptr == nullptr) {
      ReleaseFree();
      ptr = system_alloc_(size);
    }
    if (ptr == nullptr) return nullptr;
  }
  live_[ptr] = Live{*block_size, capturing_};
  return ptr;
}

size_t BlockCache::Deallocate(void* ptr) {
  auto it = live_.find(ptr);
  SY_CHECK(it != live_.end()) << "freeing a pointer this allocator did not hand out";
  const Live block = it->second;
  live_.erase(it);
  // Freed during a capture: the graph may touch it at replay, so the pool keeps it.
  const int pool = capturing_ != 0 ? capturing_ : block.pool;
  if (pool != 0) {
    pools_[pool].emplace(block.size, ptr);
  } else {
    free_.emplace(block.size, ptr);
    cached_ += block.size;
  }
  return block.size;
}

void BlockCache::ReleaseFree() {
  for (auto& [size, ptr] : free_) system_free_(ptr);
  free_.clear();
  cached_ = 0;
}

void BlockCache::BeginPool(int pool) {
  SY_CHECK(pool > 0 && pool < next_pool_) << "BeginPool: " << pool << " is not a pool id";
  SY_CHECK(capturing_ == 0) << "BeginPool(" << pool << ") while pool " << capturing_
                            << " captures";
  SY_CHECK(lending_ == 0) << "BeginPool(" << pool << ") while pool " << lending_ << " lends";
  capturing_ = pool;
}

void BlockCache::BeginLoan(int pool) {
  SY_CHECK(pool > 0 && pool < next_pool_) << "BeginLoan: " << pool << " is not a pool id";
  SY_CHECK(capturing_ == 0 && lending_ == 0)
      << "BeginLoan(" << pool << ") during a capture or another loan";
  lending_ = pool;
}

void BlockCache::EndLoan() { lending_ = 0; }

int64_t BlockCache::lent_live(int pool) const {
  int64_t n = 0;
  for (const auto& [ptr, block] : live_) n += block.lent && block.pool == pool ? 1 : 0;
  return n;
}

void BlockCache::EndPool() {
  SY_CHECK(capturing_ != 0) << "EndPool without BeginPool";
  capturing_ = 0;
}

void BlockCache::ReleasePool(int pool) {
  SY_CHECK(pool != capturing_) << "ReleasePool(" << pool << ") while it captures";
  if (lending_ == pool) lending_ = 0;
  auto it = pools_.find(pool);
  if (it != pools_.end()) {
    for (auto& [size, ptr] : it->second) {
      free_.emplace(size, ptr);
      cached_ += size;
    }
    pools_.erase(it);
  }
  for (auto& [ptr, block] : live_) {
    if (block.pool == pool) block = Live{block.size, 0, false};
  }
}

size_t BlockCache::pool_free_bytes(int pool) const {
  auto it = pools_.find(pool);
  if (it == pools_.end()) return 0;
  size_t bytes = 0;
  for (const auto& [size, ptr] : it->second) bytes += size;
  return bytes;
}

int BlockCache::pool_of(void* ptr) const {
  auto it = live_.find(ptr);
  return it == live_.end() ? 0 : it->second.pool;
}

}  // namespace switchyard
