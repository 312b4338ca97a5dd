// Per-device memory allocators. Both cache freed blocks by size, so steady-state training
// does no cudaMalloc and touches no fresh pages: the CPU allocator caches blocks of 256 KiB
// and more (up to 2 GiB of them; smaller ones go back to malloc) and aligns to 64 bytes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "engine/core/device.h"

namespace switchyard {

class Allocator {
 public:
  struct Stats {
    size_t in_use = 0;  // bytes handed out and not yet returned
    size_t peak = 0;    // high-water mark of in_use
    size_t cached = 0;  // bytes held in free lists (caching allocators only)
    // Bytes held from the system (cudaMalloc's segments; on the host in_use + cached), now
    // and at their high-water mark: what the device must have.
    size_t reserved = 0;
    size_t reserved_peak = 0;
  };

  virtual ~Allocator() = default;
  // Never returns null. When the device cannot serve `bytes`, even after the cached blocks
  // went back to it, the process ends through ExitOutOfMemory.
  virtual void* Allocate(size_t bytes) = 0;
  virtual void Deallocate(void* ptr, size_t bytes) = 0;
  virtual Device device() const = 0;
  virtual Stats stats() const = 0;
  // Returns cached blocks to the system (no-op for non-caching allocators).
  virtual void EmptyCache() {}
  // Bytes in use on the whole device as its driver says (CUDA: cudaMemGetInfo's total -
  // free: this allocator's segments plus the context, library workspaces such as cuBLAS's
  // and NCCL's, and any other process's); -1 where there is no such figure (the host).
  virtual int64_t DeviceUsed() const { return -1; }
  // Bytes new buffers can still take: this allocator's cached blocks plus what the device has
  // free (the host: the kernel's MemAvailable, and the rest of a cgroup v2 memory.max where
  // one is set; CUDA: cudaMemGetInfo's free bytes); -1 where there is no such figure.
  virtual int64_t AvailableBytes() const { return -1; }

  // Graph pools (engine/core/block_cache.h; the CUDA allocator's, no-ops elsewhere): a new
  // pool id; while a pool captures, the blocks handed out and returned are the graph's and
  // stay so until ReleaseGraphPool.
  virtual int NewGraphPool() { return 0; }
  virtual void BeginGraphPool(int /*pool*/) {}
  virtual void EndGraphPool() {}
  virtual void ReleaseGraphPool(int /*pool*/) {}
  // Between a graph's replays, other work borrows its pool's idle blocks (BlockCache loans);
  // GraphLoansLive: borrowed blocks not yet returned.
  virtual void BeginGraphLoan(int /*pool*/) {}
  virtual void EndGraphLoan() {}
  virtual int64_t GraphLoansLive(int /*pool*/) const { return 0; }
};

// The process-wide allocator of `device` (one per device, created on first use).
Allocator* GetAllocator(Device device);

// "1.50 MiB": bytes in powers of 1024, two decimals.
std::string FormatBytes(double bytes);

// The exit status of a process whose device could not serve an allocation (docs/failures.md).
inline constexpr int kExitOutOfMemory = 5;
// Ends the process after `device` could not serve `bytes` with `in_use` bytes handed out and
// `held` held from the system: one line on stderr naming them and what to change, then
// exit status kExitOutOfMemory. Nothing is written: the last checkpoint stays as it was.
[[noreturn]] void ExitOutOfMemory(Device device, size_t bytes, size_t in_use, size_t held);
// Ends the process, as ExitOutOfMemory, after an allocation outside the allocators (a
// std::vector, a string, a parsed file: std::bad_alloc) failed on the host; `where` names
// what was running ("train", "a compute thread").
[[noreturn]] void ExitHostOutOfMemory(const char* where);
// The same exit after the system refused a thread (std::thread's std::system_error: out of
// memory for its stack, or the process's thread limit); `where` names what was starting it,
// `why` the system's reason.
[[noreturn]] void ExitNoThread(const char* where, const char* why);
// The same exit when `bytes` of memory a library needs up front (`what` says for what: its
// work buffers) cannot be had: the address-space limit (ulimit -v) or the host refuses them.
[[noreturn]] void ExitNoWorkMemory(const char* what, size_t bytes);

// What a buffer's bytes are for, as the memory report splits them (ZeRO paper, section 3:
// model states = parameters + gradients + optimizer states; the rest is residual memory).
// A new buffer is kWorkspace (activations, communication buckets, scratch); the trainer
// tags the persistent model states with Tensor::SetMemoryKind.
enum class MemoryKind : int { kWorkspace = 0, kParameters, kGradients, kOptimizer };
inline constexpr int kMemoryKinds = 4;
// "workspace", "parameters", "gradients", "optimizer".
const char* MemoryKindName(MemoryKind kind);

// Bytes of live buffers per kind on one device, counted by every Buffer as it allocates,
// releases, is re-tagged and is freed (exact: the bytes asked of the allocator).
struct MemoryUse {
  int64_t in_use[kMemoryKinds] = {};
  int64_t peak[kMemoryKinds] = {};  // high-water mark of each kind since the last reset
  int64_t total() const { return in_use[0] + in_use[1] + in_use[2] + in_use[3]; }
  int64_t model_states() const { return in_use[1] + in_use[2] + in_use[3]; }
};
MemoryUse MemoryUseOf(Device device);
// Peaks restart from the current use (e.g. after the model is built).
void ResetMemoryPeaks(Device device);

namespace internal {
// Buffer's bookkeeping: `bytes` of `kind` appear (positive) or go (negative) on device.
void CountMemory(Device device, MemoryKind kind, int64_t bytes);
}  // namespace internal

namespace internal {
// Defined in allocator_cuda.cc when the CUDA backend is built.
Allocator* GetCudaCachingAllocator(int index);
}  // namespace internal

}  // namespace switchyard
