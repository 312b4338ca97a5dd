// Per-device memory allocators. Both cache freed blocks by size, so steady-state training
// does no cudaMalloc and touches no fresh pages: the CPU allocator caches blocks of 256 KiB
// and more (up to 2 GiB of them; smaller ones go back to malloc) and aligns to 64 bytes.
#pragma once

#include <cstddef>

#include "engine/core/device.h"

namespace switchyard {

class Allocator {
 public:
  struct Stats {
    size_t in_use = 0;  // bytes handed out and not yet returned
    size_t peak = 0;    // high-water mark of in_use
    size_t cached = 0;  // bytes held in free lists (caching allocators only)
  };

  virtual ~Allocator() = default;
  // Never returns null: running out of memory is fatal with a message naming the size.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
  virtual Stats stats() const = 0;
  // Returns cached blocks to the system (no-op for non-caching allocators).
  virtual void EmptyCache() {}
};

// The process-wide allocator of `device` (one per device, created on first use).
Allocator* GetAllocator(Device device);

namespace internal {
// Defined in allocator_cuda.cc when the CUDA backend is built.
Allocator* GetCudaCachingAllocator(int index);
}  // namespace internal

}  // namespace switchyard
