// Caching allocator for CUDA device memory: freed blocks go to a size-ordered free list
// and are reused by later requests of up to twice their size. Blocks are not split, and
// all work is assumed ordered on one stream per device (the DeviceContext's), so a block
// freed by the host can be handed out again at once.
#include <map>
#include <memory>
#include <mutex>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/counters.h"
#include "engine/core/cuda_check.h"

namespace switchyard::internal {
namespace {

constexpr size_t kRound = 512;

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int index) : index_(index) {}

  void* Allocate(size_t bytes) override {
    size_t size = std::max(kRound, (bytes + kRound - 1) / kRound * kRound);
    std::lock_guard<std::mutex> lock(mu_);
    auto it = free_.lower_bound(size);
    void* ptr = nullptr;
    if (it != free_.end() && it->first <= 2 * size) {
      size = it->first;
      ptr = it->second;
      free_.erase(it);
      stats_.cached -= size;
    } else {
      SY_CUDA_CHECK(cudaSetDevice(index_));
      counters::CountCudaMalloc();
      cudaError_t err = cudaMalloc(&ptr, size);
      if (err == cudaErrorMemoryAllocation) {
        (void)cudaGetLastError();
        ReleaseLocked();
        err = cudaMalloc(&ptr, size);
      }
      SY_CHECK(err == cudaSuccess) << "cudaMalloc of " << size << " bytes on cuda:" << index_
                                   << " failed: " << cudaGetErrorString(err);
    }
    sizes_[ptr] = size;
    stats_.in_use += size;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    return ptr;
  }

  void Deallocate(void* ptr, size_t /*bytes*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = sizes_.find(ptr);
    SY_CHECK(it != sizes_.end()) << "freeing a pointer this allocator did not hand out";
    free_.emplace(it->second, ptr);
    stats_.in_use -= it->second;
    stats_.cached += it->second;
    sizes_.erase(it);
  }

  Device device() const override { return Device::Cuda(index_); }
  Stats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }
  void EmptyCache() override {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseLocked();
  }

 private:
  void ReleaseLocked() {
    for (auto& [size, ptr] : free_) SY_CUDA_CHECK(cudaFree(ptr));
    free_.clear();
    stats_.cached = 0;
  }

  int index_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // size -> block
  std::map<void*, size_t> sizes_;      // live block -> rounded size
  Stats stats_;
};

}  // namespace

Allocator* GetCudaCachingAllocator(int index) {
  static std::mutex mu;
  static std::vector<std::unique_ptr<CudaCachingAllocator>>* allocators =
      new std::vector<std::unique_ptr<CudaCachingAllocator>>();
  std::lock_guard<std::mutex> lock(mu);
  SY_CHECK(index >= 0) << "bad CUDA device index " << index;
  if (allocators->size() <= static_cast<size_t>(index)) allocators->resize(index + 1);
  auto& slot = (*allocators)[index];
  if (!slot) slot = std::make_unique<CudaCachingAllocator>(index);
  return slot.get();
}

}  // namespace switchyard::internal
