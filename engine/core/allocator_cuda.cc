// Caching allocator for CUDA device memory: the bookkeeping is BlockCache's
// (engine/core/block_cache.h: segments cut into blocks best fit, split and merged, and the
// graph pools CUDA graphs need); this file adds cudaMalloc, cudaFree and the statistics.
#include <memory>
#include <mutex>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/block_cache.h"
#include "engine/core/counters.h"
#include "engine/core/cuda_check.h"

namespace switchyard::internal {
namespace {

class CudaCachingAllocator final : public Allocator {
 public:
  explicit CudaCachingAllocator(int index)
      : index_(index),
        cache_(
            [index](size_t bytes) -> void* {
              SY_CUDA_CHECK(cudaSetDevice(index));
              counters::CountCudaMalloc();
              void* ptr = nullptr;
              const cudaError_t err = cudaMalloc(&ptr, bytes);
              if (err == cudaErrorMemoryAllocation) {
                (void)cudaGetLastError();
                return nullptr;
              }
              SY_CHECK(err == cudaSuccess) << "cudaMalloc of " << bytes << " bytes on cuda:"
                                           << index << " failed: " << cudaGetErrorString(err);
              return ptr;
            },
            [](void* ptr) { SY_CUDA_CHECK(cudaFree(ptr)); }) {}

  void* Allocate(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    size_t block = 0;
    bool fresh = false;
    void* ptr = cache_.Allocate(bytes, &block, &fresh);
    if (ptr == nullptr) ExitOutOfMemory(device(), bytes, stats_.in_use, cache_.reserved());
    stats_.in_use += block;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    return ptr;
  }

  void Deallocate(void* ptr, size_t /*bytes*/) override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use -= cache_.Deallocate(ptr);
  }

  Device device() const override { return Device::Cuda(index_); }
  Stats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    Stats s = stats_;
    s.cached = cache_.cached();
    s.reserved = cache_.reserved();
    s.reserved_peak = cache_.reserved_peak();
    return s;
  }
  int64_t DeviceUsed() const override {
    SY_CUDA_CHECK(cudaSetDevice(index_));
    size_t free_bytes = 0, total = 0;
    SY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    return static_cast<int64_t>(total - free_bytes);
  }
  int64_t AvailableBytes() const override {
    SY_CUDA_CHECK(cudaSetDevice(index_));
    size_t free_bytes = 0, total = 0;
    SY_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    std::lock_guard<std::mutex> lock(mu_);
    return static_cast<int64_t>(free_bytes + cache_.cached());
  }
  void EmptyCache() override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.ReleaseFree();
  }

  int NewGraphPool() override {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.NewPool();
  }
  void BeginGraphPool(int pool) override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.BeginPool(pool);
  }
  void EndGraphPool() override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.EndPool();
  }
  void ReleaseGraphPool(int pool) override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.ReleasePool(pool);
  }
  void BeginGraphLoan(int pool) override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.BeginLoan(pool);
  }
  void EndGraphLoan() override {
    std::lock_guard<std::mutex> lock(mu_);
    cache_.EndLoan();
  }
  int64_t GraphLoansLive(int pool) const override {
    std::lock_guard<std::mutex> lock(mu_);
    return cache_.lent_live(pool);
  }

 private:
  int index_;
  mutable std::mutex mu_;
  BlockCache cache_;
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
