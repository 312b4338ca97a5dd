#include "engine/core/allocator.h"

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "engine/core/check.h"

namespace switchyard {
namespace {

constexpr size_t kCpuAlignment = 64;

class CpuAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override {
    size_t rounded = std::max<size_t>(kCpuAlignment, (bytes + kCpuAlignment - 1) /
                                                         kCpuAlignment * kCpuAlignment);
    void* ptr = std::aligned_alloc(kCpuAlignment, rounded);
    SY_CHECK(ptr != nullptr) << "host out of memory allocating " << bytes << " bytes";
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use += bytes;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    return ptr;
  }
  void Deallocate(void* ptr, size_t bytes) override {
    std::free(ptr);
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use -= bytes;
  }
  Device device() const override { return Device::Cpu(); }
  Stats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return stats_;
  }

 private:
  mutable std::mutex mu_;
  Stats stats_;
};

}  // namespace

Allocator* GetAllocator(Device device) {
  if (device.is_cpu()) {
    static CpuAllocator* cpu = new CpuAllocator();
    return cpu;
  }
  return internal::GetCudaCachingAllocator(device.index);
}

#ifndef SY_HAVE_CUDA
namespace internal {
Allocator* GetCudaCachingAllocator(int index) {
  SY_LOG(FATAL) << "cuda:" << index << " requested but this build has no CUDA backend";
  return nullptr;
}
}  // namespace internal
#endif

}  // namespace switchyard
