#include "engine/core/allocator.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <string>
#include <unordered_map>

#include "engine/core/check.h"
#include "engine/core/logging.h"

namespace switchyard {
namespace {

constexpr size_t kCpuAlignment = 64;
// Blocks of at least this size are cached: glibc serves them with fresh mmap'ed pages, and
// first-touch page faults then dominate phases that allocate their outputs each call (the
// MoE dispatcher's exchanges measured 1.7-3.6x slower than raw MPI at 16-32 MiB).
constexpr size_t kCacheMin = size_t{256} << 10;
constexpr size_t kCacheGranule = size_t{4} << 10;
constexpr size_t kCacheLimit = size_t{2} << 30;  // cached bytes kept at most

int64_t HostAvailableBytes();

class CpuAllocator final : public Allocator {
 public:
  void* Allocate(size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use += bytes;
    stats_.peak = std::max(stats_.peak, stats_.in_use);
    if (bytes < kCacheMin) {
      NoteReserved();
      return AllocateBlock(std::max(kCpuAlignment, Round(bytes, kCpuAlignment)), bytes);
    }
    const size_t size = Round(bytes, kCacheGranule);
    // Reuse the smallest cached block that fits and wastes at most half of itself.
    auto it = free_.lower_bound(size);
    void* ptr = nullptr;
    size_t block = size;
    if (it != free_.end() && it->first <= 2 * size) {
      block = it->first;
      ptr = it->second;
      free_.erase(it);
      stats_.cached -= block;
    } else {
      ptr = AllocateBlock(size, bytes);
    }
    blocks_[ptr] = block;
    NoteReserved();
    return ptr;
  }

  void Deallocate(void* ptr, size_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    stats_.in_use -= bytes;
    auto it = blocks_.find(ptr);
    if (it == blocks_.end()) {
      std::free(ptr);
      return;
    }
    const size_t block = it->second;
    blocks_.erase(it);
    free_.emplace(block, ptr);
    stats_.cached += block;
    while (stats_.cached > kCacheLimit) {  // drop the largest cached blocks first
      auto largest = std::prev(free_.end());
      stats_.cached -= largest->first;
      std::free(largest->second);
      free_.erase(largest);
    }
  }

  Device device() const override { return Device::Cpu(); }
  Stats stats() const override {
    std::lock_guard<std::mutex> lock(mu_);
    Stats s = stats_;
    s.reserved = s.in_use + s.cached;
    return s;
  }
  void EmptyCache() override {
    std::lock_guard<std::mutex> lock(mu_);
    ReleaseCached();
  }
  int64_t AvailableBytes() const override {
    const int64_t system = HostAvailableBytes();
    if (system < 0) return -1;
    std::lock_guard<std::mutex> lock(mu_);
    return system + static_cast<int64_t>(stats_.cached);
  }

 private:
  void ReleaseCached() {
    for (auto& [size, ptr] : free_) std::free(ptr);
    free_.clear();
    stats_.cached = 0;
  }
  static size_t Round(size_t n, size_t to) { return (n + to - 1) / to * to; }
  void NoteReserved() {
    stats_.reserved_peak = std::max(stats_.reserved_peak, stats_.in_use + stats_.cached);
  }
  // A block from the system; when it refuses, again after the cached blocks went back;
  // then the process ends (ExitOutOfMemory). Tests cap the bytes in use with
  // SWITCHYARD_TEST_HOST_MEMORY_LIMIT (a refusal beyond it, as the system's would be).
  void* AllocateBlock(size_t size, size_t asked) {
    static const int64_t limit = [] {
      const char* v = std::getenv("SWITCHYARD_TEST_HOST_MEMORY_LIMIT");
      return v == nullptr ? int64_t{-1} : std::atoll(v);
    }();
    const bool refused = limit >= 0 && stats_.in_use > static_cast<size_t>(limit);
    void* ptr = refused ? nullptr : std::aligned_alloc(kCpuAlignment, size);
    if (ptr == nullptr && !refused && !free_.empty()) {
      ReleaseCached();
      ptr = std::aligned_alloc(kCpuAlignment, size);
    }
    if (ptr == nullptr) {
      const size_t before = stats_.in_use - asked;
      ExitOutOfMemory(Device::Cpu(), asked, before, before + stats_.cached);
    }
    return ptr;
  }

  mutable std::mutex mu_;
  Stats stats_;
  std::multimap<size_t, void*> free_;            // cached blocks by size
  std::unordered_map<void*, size_t> blocks_;     // live cacheable block -> its size
};

// Per device (index 0: the host, 1 + i: cuda:i), per kind.
constexpr int kLedgerDevices = 17;
struct Ledger {
  std::array<std::atomic<int64_t>, kMemoryKinds> in_use{};
  std::array<std::atomic<int64_t>, kMemoryKinds> peak{};
};
Ledger& LedgerOf(Device device) {
  static Ledger ledgers[kLedgerDevices];
  const int slot = device.is_cpu() ? 0 : 1 + device.index;
  SY_CHECK(slot >= 0 && slot < kLedgerDevices) << "memory ledger: device " << device;
  return ledgers[slot];
}

// /proc/meminfo's MemAvailable, capped by the rest of a cgroup v2 memory.max; -1 unknown.
int64_t HostAvailableBytes() {
  int64_t available = -1;
  std::ifstream meminfo("/proc/meminfo");
  for (std::string line; std::getline(meminfo, line);) {
    if (line.rfind("MemAvailable:", 0) == 0) {
      available = std::atoll(line.c_str() + 13) * 1024;  // "MemAvailable:   123 kB"
      break;
    }
  }
  std::ifstream max_file("/sys/fs/cgroup/memory.max");
  std::ifstream current_file("/sys/fs/cgroup/memory.current");
  std::string max_text;
  int64_t current = 0;
  if (max_file >> max_text && max_text != "max" && current_file >> current) {
    const int64_t rest = std::max<int64_t>(0, std::atoll(max_text.c_str()) - current);
    available = available < 0 ? rest : std::min(available, rest);
  }
  return available;
}

}  // namespace

std::string FormatBytes(double v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (v >= 1024 && i < 4) v /= 1024, ++i;
  char text[64];
  std::snprintf(text, sizeof(text), "%.2f %s", v, units[i]);
  return text;
}

void ExitOutOfMemory(Device device, size_t bytes, size_t in_use, size_t held) {
  std::ostringstream line;
  line << "switchyard: error: rank " << LogRank() << " ran out of memory on " << device.ToString()
       << ": " << bytes << " bytes (" << FormatBytes(double(bytes))
       << ") could not be allocated with " << FormatBytes(double(in_use)) << " in use and " << FormatBytes(double(held))
       << " held; `switchyard train --dry-run` gives the peak a rank needs: lower "
          "train.micro_batch_size or model.seq_len, or spread the model over more ranks";
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", line.str().c_str());
  std::fflush(stderr);
  ::_exit(kExitOutOfMemory);
}

void ExitHostOutOfMemory(const char* where) {
  char line[512];
  std::snprintf(line, sizeof line,
                "switchyard: error: rank %d ran out of host memory (in %s, an allocation outside "
                "the tensor allocator failed): free memory on the machine, or run fewer ranks "
                "on it\n",
                LogRank(), where);
  std::fflush(stdout);
  std::fputs(line, stderr);
  std::fflush(stderr);
  ::_exit(kExitOutOfMemory);
}

void ExitNoWorkMemory(const char* what, size_t bytes) {
  char line[512];
  std::snprintf(line, sizeof line,
                "switchyard: error: rank %d could not reserve %s of memory for %s: the "
                "address-space limit (ulimit -v) or the host's memory refuses it; raise the "
                "limit, or run fewer ranks or compute threads (SWITCHYARD_THREADS) on it\n",
                LogRank(), FormatBytes(static_cast<double>(bytes)).c_str(), what);
  std::fflush(stdout);
  std::fputs(line, stderr);
  std::fflush(stderr);
  ::_exit(kExitOutOfMemory);
}

void ExitNoThread(const char* where, const char* why) {
  char line[512];
  std::snprintf(line, sizeof line,
                "switchyard: error: rank %d could not start a thread (in %s: %s): the host is "
                "out of memory or of threads (ulimit -v, ulimit -u); free memory, or run fewer "
                "ranks or compute threads (SWITCHYARD_THREADS) on it\n",
                LogRank(), where, why);
  std::fflush(stdout);
  std::fputs(line, stderr);
  std::fflush(stderr);
  ::_exit(kExitOutOfMemory);
}

const char* MemoryKindName(MemoryKind kind) {
  switch (kind) {
    case MemoryKind::kWorkspace: return "workspace";
    case MemoryKind::kParameters: return "parameters";
    case MemoryKind::kGradients: return "gradients";
    case MemoryKind::kOptimizer: return "optimizer";
  }
  return "?";
}

MemoryUse MemoryUseOf(Device device) {
  Ledger& l = LedgerOf(device);
  MemoryUse use;
  for (int k = 0; k < kMemoryKinds; ++k) {
    use.in_use[k] = l.in_use[k].load();
    use.peak[k] = l.peak[k].load();
  }
  return use;
}

void ResetMemoryPeaks(Device device) {
  Ledger& l = LedgerOf(device);
  for (int k = 0; k < kMemoryKinds; ++k) l.peak[k].store(l.in_use[k].load());
}

namespace internal {
void CountMemory(Device device, MemoryKind kind, int64_t bytes) {
  Ledger& l = LedgerOf(device);
  const int k = static_cast<int>(kind);
  const int64_t now = l.in_use[k].fetch_add(bytes) + bytes;
  int64_t peak = l.peak[k].load();
  while (now > peak && !l.peak[k].compare_exchange_weak(peak, now)) {
  }
}
}  // namespace internal

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
