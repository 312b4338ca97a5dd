// The compute pool of parallel.h. Workers spin briefly after each job (a training step
// issues its kernels back to back, microseconds apart) and then sleep on the job counter,
// so an idle process costs nothing and a busy one pays no wake-up per kernel.
#include "engine/core/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <new>
#include <system_error>
#include <thread>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/check.h"

namespace switchyard {
namespace {

// How long a worker (or the caller waiting for it) spins before it sleeps or yields.
constexpr auto kSpin = std::chrono::microseconds(200);

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#endif
}

// A positive integer from the environment variable `name`, or 0 when unset or not one.
int EnvThreads(const char* name) {
  const char* v = std::getenv(name);
  // Digits only: strtol alone also takes leading spaces and a sign (" 4" was accepted, "4 " not).
  if (v == nullptr || *v < '0' || *v > '9') return 0;
  char* end = nullptr;
  const long n = std::strtol(v, &end, 10);
  return (*end == '\0' && n > 0 && n <= kMaxComputeThreads) ? static_cast<int>(n) : 0;
}

int DefaultThreads() {
  if (int n = EnvThreads("SWITCHYARD_THREADS")) return n;
  if (int n = EnvThreads("OPENBLAS_NUM_THREADS")) return n;
  cpu_set_t set;
  int cores = 1;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) cores = std::max(1, CPU_COUNT(&set));
  const int local_ranks = std::max(1, EnvThreads("OMPI_COMM_WORLD_LOCAL_SIZE"));
  return std::max(1, cores / local_ranks);
}

thread_local bool t_in_region = false;

}  // namespace

Status CheckThreadsEnv() {
  const char* v = std::getenv("SWITCHYARD_THREADS");
  if (v == nullptr || *v == '\0' || EnvThreads("SWITCHYARD_THREADS") > 0) return OkStatus();
  return InvalidArgument("SWITCHYARD_THREADS=", v,
                         ": takes the number of compute threads, an "
                         "integer from 1 to ",
                         kMaxComputeThreads, " (unset: one per core)");
}

namespace {

class Pool {
 public:
  explicit Pool(int threads) : threads_(threads) {
    // A worker the system refuses ends the process with one line (the workers started hold
    // no state worth keeping; a std::system_error escaping would abort).
    try {
      for (int w = 1; w < threads_; ++w) workers_.emplace_back([this, w] { WorkerLoop(w); });
    } catch (const std::system_error& e) {
      ExitNoThread("the compute thread pool", e.what());
    }
  }
  ~Pool() {
    stop_.store(true, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    for (std::thread& t : workers_) t.join();
  }
  int threads() const { return threads_; }

  // Runs the job's chunks; false when the pool is busy (another thread's job), in which
  // case the caller runs the whole range itself.
  bool Run(int64_t n, int chunks, detail::ChunkFn fn, void* ctx) {
    std::unique_lock<std::mutex> lock(busy_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    n_ = n;
    chunks_ = chunks;
    fn_ = fn;
    ctx_ = ctx;
    pending_.store(threads_ - 1, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    generation_.notify_all();
    RunChunk(0);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; pending_.load(std::memory_order_acquire) != 0; ++i) {
      if ((i & 63) == 0 && std::chrono::steady_clock::now() - start > kSpin) {
        std::this_thread::yield();
      } else {
        CpuRelax();
      }
    }
    return true;
  }

 private:
  void RunChunk(int c) {
    const int64_t begin = n_ * c / chunks_, end = n_ * (c + 1) / chunks_;
    const bool was = t_in_region;
    t_in_region = true;
    // A chunk's std::bad_alloc ends the process with one line and exit 5: escaping a worker
    // it would call std::terminate (an abort, nothing said), and half a job cannot be undone.
    try {
      if (begin < end) fn_(ctx_, begin, end);
    } catch (const std::bad_alloc&) {
      ExitHostOutOfMemory("a compute thread");
    }
    t_in_region = was;
  }

  void WorkerLoop(int index) {
    t_in_region = true;
    uint32_t seen = 0;  // the generation at construction: a job may be posted before we run
    for (;;) {
      uint32_t g = generation_.load(std::memory_order_acquire);
      const auto start = std::chrono::steady_clock::now();
      for (int i = 0; g == seen; ++i) {
        if ((i & 63) == 0 && std::chrono::steady_clock::now() - start > kSpin) {
          generation_.wait(seen, std::memory_order_acquire);
        } else {
          CpuRelax();
        }
        g = generation_.load(std::memory_order_acquire);
      }
      seen = g;
      if (stop_.load(std::memory_order_relaxed)) return;
      if (index < chunks_) RunChunk(index);
      pending_.fetch_sub(1, std::memory_order_release);
    }
  }

  const int threads_;
  std::vector<std::thread> workers_;
  std::mutex busy_;
  std::atomic<uint32_t> generation_{0};
  std::atomic<int> pending_{0};
  std::atomic<bool> stop_{false};
  // The current job: written before generation_ is bumped, read after it is seen.
  int64_t n_ = 0;
  int chunks_ = 1;
  detail::ChunkFn fn_ = nullptr;
  void* ctx_ = nullptr;
};

std::mutex g_pool_mutex;  // guards g_pool's replacement
Pool* g_pool = nullptr;   // leaked at exit: workers sleep, nothing to flush

Pool& GetPool() {
  Pool* p = __atomic_load_n(&g_pool, __ATOMIC_ACQUIRE);
  if (p != nullptr) return *p;
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  if (g_pool == nullptr) __atomic_store_n(&g_pool, new Pool(DefaultThreads()), __ATOMIC_RELEASE);
  return *g_pool;
}

}  // namespace

int ComputeThreads() { return GetPool().threads(); }

void SetComputeThreads(int threads) {
  SY_CHECK(threads >= 1) << "SetComputeThreads: threads must be >= 1, got " << threads;
  std::lock_guard<std::mutex> lock(g_pool_mutex);
  Pool* old = g_pool;
  if (old != nullptr && old->threads() == threads) return;
  __atomic_store_n(&g_pool, new Pool(threads), __ATOMIC_RELEASE);
  delete old;
}

bool InParallelRegion() { return t_in_region; }

namespace detail {

void ParallelForImpl(int64_t n, int64_t min_chunk, ChunkFn fn, void* ctx) {
  Pool& pool = GetPool();
  const int64_t most = std::max<int64_t>(1, n / std::max<int64_t>(1, min_chunk));
  const int chunks = static_cast<int>(std::min<int64_t>(pool.threads(), most));
  if (chunks <= 1 || t_in_region || !pool.Run(n, chunks, fn, ctx)) fn(ctx, 0, n);
}

}  // namespace detail
}  // namespace switchyard
