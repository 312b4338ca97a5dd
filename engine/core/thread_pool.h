// The CPU's compute threads: one small pool that every CPU kernel shares (the matrix
// products included: OpenBLAS itself is kept to one thread, and Sgemm splits a large
// product into column or row blocks over the pool), so that a process uses exactly its
// cores, elementwise work included, and never has two thread pools spinning on one core.
//
// ParallelFor cuts [0, n) into at most ComputeThreads() contiguous chunks; the calling
// thread runs the first and waits for the rest. A call made from inside a chunk, or from a
// second thread while the pool is busy, runs on its own thread. Kernels keep their results
// independent of the thread count: chunks only ever split work whose per-element result does
// not depend on the split, and reductions sum fixed-size blocks in block order.
//
// The thread count is, in order: SetComputeThreads(n) (the benchmarks' --threads),
// SWITCHYARD_THREADS, OPENBLAS_NUM_THREADS, else the cores this process may run on divided
// by the ranks mpirun started on this node (OMPI_COMM_WORLD_LOCAL_SIZE), at least 1.
#pragma once

#include <cstdint>
#include <type_traits>

#include "engine/core/status.h"

namespace switchyard {

// SWITCHYARD_THREADS as the pool reads it: unset or empty (the default), or an integer in
// [1, kMaxComputeThreads]. Anything else (abc, 0, -1, 2x, 1000000), which the pool would
// ignore, is an error naming the value; `switchyard` refuses it at start-up (exit 2).
// OPENBLAS_NUM_THREADS belongs to OpenBLAS and is not checked.
inline constexpr int kMaxComputeThreads = 1024;
Status CheckThreadsEnv();

// The pool's thread count, the caller included (>= 1). Starts the pool on first use.
int ComputeThreads();

// Sets the thread count (>= 1), replacing the pool; not while a ParallelFor runs.
void SetComputeThreads(int threads);

// True on a pool worker or inside the caller's own chunk: a nested ParallelFor runs inline.
bool InParallelRegion();

namespace detail {
using ChunkFn = void (*)(void* ctx, int64_t begin, int64_t end);
void ParallelForImpl(int64_t n, int64_t min_chunk, ChunkFn fn, void* ctx);
}  // namespace detail

// Calls fn(begin, end) over contiguous chunks covering [0, n), each at least min_chunk long
// (except when n itself is shorter), on up to ComputeThreads() threads; returns when all
// chunks are done. fn must not throw.
template <typename F>
void ParallelFor(int64_t n, int64_t min_chunk, F&& fn) {
  if (n <= 0) return;
  using Fn = std::remove_reference_t<F>;
  auto call = [](void* ctx, int64_t begin, int64_t end) { (*static_cast<Fn*>(ctx))(begin, end); };
  detail::ParallelForImpl(n, min_chunk, call, const_cast<void*>(static_cast<const void*>(&fn)));
}

}  // namespace switchyard
