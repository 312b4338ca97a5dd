// A host model of what the device code of kernels/cuda/*_kernels.cuh uses of CUDA, so that the
// same source compiles and runs on the CPU without a GPU (the *_emulation_test.cc files):
//  - a CTA is blockDim.x * blockDim.y threads (a multiple of 32), each a fiber (its own stack)
//    of the one host thread, which run in turns (emu::fiber): a thread runs until it waits at
//    a barrier, then the lowest-numbered thread that can run (or the highest: the direction is
//    drawn anew at each __syncthreads) runs, so a warp runs ahead to the next __syncthreads;
//    __syncthreads is a barrier of them all, __syncwarp one of the warp's 32, and __shfl_sync
//    and __shfl_xor_sync exchange any value of up to 8 bytes through memory between two
//    barriers of the warp; atomicAdd and atomicMin are std::atomic_ref operations; CTAs run one
//    at a time (emu::Launch), and shared memory is one buffer filled with 0xFF bytes (NaN)
//    before each CTA, so a read of anything not written first shows; a barrier that not every
//    thread reaches (which hangs a GPU) stops the test program with one line;
//  - nvcuda::wmma 16 x 16 x 16: a fragment holds its whole tile; load_matrix_sync reads it as
//    the layout says (row- or column-major, leading dimension ldm); an accumulator's row r
//    belongs to lane r (lanes 16-31 own none), which alone computes it in mma_sync (f32 sums
//    of the bf16 products, in k order) and loads and stores it, so a kernel must keep the
//    tile's other rows out of any lane's arithmetic, as on the GPU where the distribution is
//    opaque (element access is allowed only for an operation applied to every element);
//  - mma.sync.m16n8k16 bf16 (MmaBf16) and ldmatrix.x4 (LdMatrixX4, LdMatrixX4Trans): each lane
//    publishes its registers (or row address) at a warp barrier, then computes or packs its own
//    with the PTX ISA's fragment layout (kernels/cuda/device_common.cuh); f32 sums in k order;
//  - cp.async (__pipeline_memcpy_async, __pipeline_commit, __pipeline_wait_prior): a copy
//    poisons its destination with NaN when issued and lands at the wait that covers it;
//  - wgmma.mma_async on swizzled shared operands (kernels/cuda/wgmma.cuh): computed when the
//    wait that covers it comes (tests/kernels/cuda_emulation_wgmma.h);
//  - __nv_bfloat16 is engine/core/dtype.h's BFloat16 (round to nearest even), expf/logf/fmaf
//    the C library's, the __f*_rn intrinsics plain f32 operations (this project compiles with
//    -ffp-contract=off); the device helpers of kernels/cuda/device_common.cuh (reductions,
//    grid-stride loops, ToBf16, FromBf16) are the real ones, compiled on the host.
// What the model cannot show: wmma's real fragment layout (opaque on the GPU; the model gives
// each accumulator row to one lane), whether the mma.sync and ldmatrix layouts written here
// are the hardware's (the GPU tests check that), every interleaving of threads between two
// barriers (a missing barrier shows when a reader's warp runs ahead of the writer's, or a
// writer's ahead of a reader's, as one of the two directions makes it; fibers replaced
// std::threads, which on two cores cost the device code's tests a futex wake per thread per
// barrier, several times their time now), and anything about speed.
//
// Use: include this after every other header (it defines CUDA's qualifiers, __global__,
// __device__, __shared__ ..., as empty macros, and they stay defined), define the kernels'
// shared-memory buffer in their namespace (`alignas(128) unsigned char smem[N];`, which the
// kernels' `extern __shared__ unsigned char smem[]` then names), include the .cuh and run its
// kernels with emu::Launch.
#pragma once

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <math.h>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include <gtest/gtest.h>


#include "engine/core/dtype.h"
#include "tests/kernels/emulation_fibers.h"

// ---- The CUDA built-ins (global names, as CUDA's are).
struct EmuDim3 {
  unsigned x = 0, y = 0, z = 0;
};
// The running thread's: the scheduler (emu::fiber) swaps them with each thread's own copy at
// every turn, as it does the other per-thread state of the model.
inline EmuDim3 threadIdx, blockIdx, gridDim, blockDim;
using __nv_bfloat16 = switchyard::BFloat16;

namespace emu {
constexpr int kMaxWarps = 1024 / 32;
constexpr size_t kSharedBytes = 227 * 1024;  // sm_90's per-block limit

inline Barrier* block_barrier = nullptr;
inline Barrier* warp_barriers[kMaxWarps] = {};
inline uint64_t shuffle_slots[kMaxWarps][32];
}  // namespace emu

namespace emu {
// The thread's index in its CTA (threadIdx.x fastest), which numbers warps and lanes.
inline int LinearThread() { return static_cast<int>(threadIdx.y * blockDim.x + threadIdx.x); }
}  // namespace emu

inline void __syncthreads() { emu::block_barrier->arrive_and_wait(); }
inline void __syncwarp(unsigned = 0xffffffffu) {
  emu::warp_barriers[emu::LinearThread() / 32]->arrive_and_wait();
}
// Warp shuffles exchange through one 8-byte slot per lane (any T up to 8 bytes).
template <typename T>
T __shfl_sync(unsigned, T v, int src_lane) {
  static_assert(sizeof(T) <= sizeof(uint64_t) && std::is_trivially_copyable_v<T>);
  const int warp = emu::LinearThread() / 32;
  std::memcpy(&emu::shuffle_slots[warp][emu::LinearThread() % 32], &v, sizeof(T));
  emu::warp_barriers[warp]->arrive_and_wait();
  T other;
  std::memcpy(&other, &emu::shuffle_slots[warp][src_lane & 31], sizeof(T));
  emu::warp_barriers[warp]->arrive_and_wait();
  return other;
}
template <typename T>
T __shfl_xor_sync(unsigned mask, T v, int lane_mask) {
  return __shfl_sync(mask, v, (emu::LinearThread() % 32) ^ lane_mask);
}
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dmul_rn(double a, double b) { return a * b; }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __ddiv_rn(double a, double b) { return a / b; }
inline uint32_t __float_as_uint(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof(u));
  return u;
}
inline float __uint_as_float(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof(f));
  return f;
}
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }

// Atomics (the CTA's threads take turns on one host thread, so these need no more than
// atomic_ref; CTAs run one at a time, which the device does not promise: a kernel must not
// depend on the order).
template <typename T>
T atomicAdd(T* address, T v) {
  return std::atomic_ref<T>(*address).fetch_add(v);
}
template <typename T>
T atomicMin(T* address, T v) {
  std::atomic_ref<T> a(*address);
  T old = a.load();
  while (v < old && !a.compare_exchange_weak(old, v)) {
  }
  return old;
}

// cp.async (<cuda_pipeline_primitives.h>): a copy lands only when a wait covers its group, as
// on the GPU where it may land any time before. So the model fills the destination with 0xFF
// bytes (NaN) when the copy is issued, and writes it when this thread's
// __pipeline_wait_prior(n) leaves fewer than n newer groups: a read before the wait and the
// barrier that publishes it finds NaN, and so does a warp still reading a stage that a copy
// is already refilling. A CTA that ends with copies in flight fails (emu::Launch).
namespace emu {
struct AsyncCopy {
  unsigned char* dst;
  const unsigned char* src;
  int bytes, zfill;
};
inline std::vector<std::vector<AsyncCopy>> copy_groups;  // committed, oldest first
inline std::vector<AsyncCopy> open_copies;               // not yet committed
inline int CopiesInFlight() {
  size_t n = open_copies.size();
  for (const auto& g : copy_groups) n += g.size();
  return static_cast<int>(n);
}
}  // namespace emu

inline void __pipeline_memcpy_async(void* dst, const void* src, size_t bytes, size_t zfill = 0) {
  EXPECT_TRUE((bytes == 4 || bytes == 8 || bytes == 16) && zfill <= bytes) << bytes << " " << zfill;
  EXPECT_EQ(reinterpret_cast<uintptr_t>(dst) % bytes, 0u) << "cp.async destination alignment";
  EXPECT_EQ(reinterpret_cast<uintptr_t>(src) % bytes, 0u) << "cp.async source alignment";
  std::memset(dst, 0xFF, bytes);
  emu::open_copies.push_back({static_cast<unsigned char*>(dst),
                              static_cast<const unsigned char*>(src), static_cast<int>(bytes),
                              static_cast<int>(zfill)});
}
inline void __pipeline_commit() {
  emu::copy_groups.push_back(std::move(emu::open_copies));
  emu::open_copies.clear();
}
inline void __pipeline_wait_prior(size_t newer) {
  while (emu::copy_groups.size() > newer) {
    for (const emu::AsyncCopy& c : emu::copy_groups.front()) {
      std::memcpy(c.dst, c.src, static_cast<size_t>(c.bytes - c.zfill));
      std::memset(c.dst + (c.bytes - c.zfill), 0, static_cast<size_t>(c.zfill));
    }
    emu::copy_groups.erase(emu::copy_groups.begin());
  }
}

// The qualifiers and attributes of device code.
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __restrict__ __restrict
#define __shared__
#define __align__(n)

// ---- nvcuda::wmma, 16 x 16 x 16 (see the file comment for who owns what).
namespace nvcuda::wmma {
struct matrix_a {};
struct matrix_b {};
struct accumulator {};
struct row_major {};
struct col_major {};
enum layout_t { mem_row_major, mem_col_major };

// The whole 16 x 16 tile, row-major, as f32 (bf16 values are exact in it).
template <typename Use, int M, int N, int K, typename T, typename Layout = void>
struct fragment {
  static constexpr int num_elements = M * N;
  float x[M * N];
};

template <typename Use, typename T, typename L>
void fill_fragment(fragment<Use, 16, 16, 16, T, L>& f, float v) {
  for (float& e : f.x) e = v;
}

// Element (r, c) of a tile at p: p[r * ldm + c] row-major, p[c * ldm + r] column-major.
inline int64_t TileOffset(bool row_major_layout, int r, int c, unsigned ldm) {
  return row_major_layout ? static_cast<int64_t>(r) * ldm + c : static_cast<int64_t>(c) * ldm + r;
}

// matrix_a / matrix_b: every lane reads the whole tile (bf16 or f32 memory).
template <typename Use, typename T, typename L>
void load_matrix_sync(fragment<Use, 16, 16, 16, T, L>& f, const T* p, unsigned ldm) {
  static_assert(std::is_same_v<L, row_major> || std::is_same_v<L, col_major>);
  for (int r = 0; r < 16; ++r) {
    for (int c = 0; c < 16; ++c) {
      f.x[r * 16 + c] = static_cast<float>(p[TileOffset(std::is_same_v<L, row_major>, r, c, ldm)]);
    }
  }
}

// An accumulator from f32 memory: lane r reads row r; the rows no lane owns stay NaN.
inline void load_matrix_sync(fragment<accumulator, 16, 16, 16, float>& f, const float* p,
                             unsigned ldm, layout_t layout) {
  const int r = emu::LinearThread() % 32;
  for (float& e : f.x) e = NAN;
  if (r >= 16) return;
  for (int c = 0; c < 16; ++c) f.x[r * 16 + c] = p[TileOffset(layout == mem_row_major, r, c, ldm)];
}

inline void store_matrix_sync(float* p, const fragment<accumulator, 16, 16, 16, float>& f,
                              unsigned ldm, layout_t layout) {
  const int r = emu::LinearThread() % 32;
  if (r >= 16) return;
  for (int c = 0; c < 16; ++c) p[TileOffset(layout == mem_row_major, r, c, ldm)] = f.x[r * 16 + c];
}

// d = a b + c on bf16 operands (f32 operands would be TF32 on the GPU: not modelled).
template <typename LA, typename LB>
void mma_sync(fragment<accumulator, 16, 16, 16, float>& d,
              const fragment<matrix_a, 16, 16, 16, __nv_bfloat16, LA>& a,
              const fragment<matrix_b, 16, 16, 16, __nv_bfloat16, LB>& b,
              const fragment<accumulator, 16, 16, 16, float>& c) {
  const int r = emu::LinearThread() % 32;
  if (r >= 16) return;
  for (int col = 0; col < 16; ++col) {
    float acc = c.x[r * 16 + col];
    for (int k = 0; k < 16; ++k) acc += a.x[r * 16 + k] * b.x[k * 16 + col];
    d.x[r * 16 + col] = acc;
  }
}
}  // namespace nvcuda::wmma

// ---- bf16 conversions (kernels/cuda/device_common.cuh's ToBf16 and FromBf16 use these).
inline __nv_bfloat16 __float2bfloat16_rn(float v) { return switchyard::BFloat16(v); }
inline float __bfloat162float(__nv_bfloat16 v) { return static_cast<float>(v); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 v) { return v.bits; }

// The device helpers every family shares (grid-stride loops, reductions, bf16 conversions).
#include "kernels/cuda/device_common.cuh"

// mma.sync.m16n8k16 bf16 (kernels/cuda/device_common.cuh's MmaBf16): the warp's lanes put their
// fragments in per-warp slots, meet at the warp barrier, and each lane computes its own four
// accumulators from the whole tile as the fragment layout there assigns them (f32 sums of the
// exact bf16 products, in k order, onto c); a second barrier frees the slots. A lane that
// skips the call, or a kernel that reads the fragments with another layout, shows as a hang or
// as wrong values.
namespace emu {
inline uint32_t mma_a[kMaxWarps][32][4], mma_b[kMaxWarps][32][2];
inline const switchyard::BFloat16* ldmatrix_rows[kMaxWarps][32];
}  // namespace emu
namespace switchyard::kernels::cuda {
// ldmatrix.m8n8.x4 (device_common.cuh's LdMatrixX4 / LdMatrixX4Trans): the lanes publish their
// row addresses, meet, and each lane packs its four pairs from the rows as the instruction
// distributes them; a second barrier frees the slots.
inline void EmuLdMatrixX4(uint32_t (&r)[4], const __nv_bfloat16* row, bool trans) {
  const int warp = emu::LinearThread() / 32, lane = emu::LinearThread() % 32;
  emu::ldmatrix_rows[warp][lane] = row;
  emu::warp_barriers[warp]->arrive_and_wait();
  uint32_t out[4];
  for (int i = 0; i < 4; ++i) {
    const __nv_bfloat16* const* rows = emu::ldmatrix_rows[warp] + 8 * i;
    uint16_t lo, hi;
    if (trans) {  // rows 2 (l % 4) and 2 (l % 4) + 1, column l / 4
      lo = rows[2 * (lane % 4)][lane / 4].bits;
      hi = rows[2 * (lane % 4) + 1][lane / 4].bits;
    } else {  // row l / 4, columns 2 (l % 4) and 2 (l % 4) + 1
      lo = rows[lane / 4][2 * (lane % 4)].bits;
      hi = rows[lane / 4][2 * (lane % 4) + 1].bits;
    }
    out[i] = static_cast<uint32_t>(lo) | static_cast<uint32_t>(hi) << 16;
  }
  emu::warp_barriers[warp]->arrive_and_wait();
  for (int i = 0; i < 4; ++i) r[i] = out[i];
}
inline void LdMatrixX4(uint32_t (&r)[4], const __nv_bfloat16* row) { EmuLdMatrixX4(r, row, false); }
inline void LdMatrixX4Trans(uint32_t (&r)[4], const __nv_bfloat16* row) {
  EmuLdMatrixX4(r, row, true);
}

// One lane's four accumulators from the warp's fragment slots. Outside the sanitizers: it
// reads only those slots (host arrays, indices in range by construction), never memory a
// kernel addresses, and instrumented it was nearly half the grouped GEMM emulation test's time
// under them. bf16 -> f32 is the bits shifted up, as BFloat16::ToFloat does.
__attribute__((no_sanitize("address", "undefined"))) inline void EmuMmaLane(float (&out)[4],
                                                                            const float (&d)[4],
                                                                            int warp, int lane) {
  const int g = lane / 4, t = lane % 4;
  for (int r = 0; r < 4; ++r) {
    const int row = g + 8 * (r / 2), col = 2 * t + r % 2;
    float acc = d[r];
    for (int k = 0; k < 16; ++k) {
      // A[row][k]: lane (row % 8) * 4 + (k % 8) / 2, register (row >= 8) + 2 (k >= 8);
      // B[k][col]: lane col * 4 + (k % 8) / 2, register (k >= 8).
      // Element k % 2 of a register: its half's bits shifted up.
      const int shift = k % 2 ? 0 : 16;
      const uint32_t ra = emu::mma_a[warp][(row % 8) * 4 + (k % 8) / 2][(row >= 8) + 2 * (k >= 8)];
      const uint32_t rb = emu::mma_b[warp][col * 4 + (k % 8) / 2][k >= 8];
      acc += __builtin_bit_cast(float, ra << shift & 0xffff0000u) *
             __builtin_bit_cast(float, rb << shift & 0xffff0000u);
    }
    out[r] = acc;
  }
}

inline void MmaBf16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  const int warp = emu::LinearThread() / 32, lane = emu::LinearThread() % 32;
  for (int r = 0; r < 4; ++r) emu::mma_a[warp][lane][r] = a[r];
  for (int r = 0; r < 2; ++r) emu::mma_b[warp][lane][r] = b[r];
  emu::warp_barriers[warp]->arrive_and_wait();
  float out[4];
  EmuMmaLane(out, d, warp, lane);
  emu::warp_barriers[warp]->arrive_and_wait();
  for (int r = 0; r < 4; ++r) d[r] = out[r];
}
}  // namespace switchyard::kernels::cuda

// wgmma.mma_async and its fences (kernels/cuda/wgmma.cuh).
#include "tests/kernels/cuda_emulation_wgmma.h"

namespace emu {

// Each thread's copy of the model's per-thread globals while another thread has its turn.
struct ThreadState {
  EmuDim3 thread_idx, block_idx, grid_dim, block_dim;
  std::vector<std::vector<AsyncCopy>> copy_groups;
  std::vector<AsyncCopy> open_copies;
  std::vector<PendingWgmma> wgmma_open;
  std::vector<std::vector<PendingWgmma>> wgmma_groups;
};
inline std::vector<ThreadState> thread_states;
inline void SwapThreadState(int thread) {
  ThreadState& s = thread_states[thread];
  std::swap(threadIdx, s.thread_idx);
  std::swap(blockIdx, s.block_idx);
  std::swap(gridDim, s.grid_dim);
  std::swap(blockDim, s.block_dim);
  std::swap(copy_groups, s.copy_groups);
  std::swap(open_copies, s.open_copies);
  std::swap(wgmma_open, s.wgmma_open);
  std::swap(wgmma_groups, s.wgmma_groups);
}

// Runs `kernel` (a call of one __global__ function) over `grid`, one CTA at a time, on
// block.x * block.y threads (a multiple of 32, at most 1024: fibers, emu::fiber) that live for
// the whole launch.
// `smem` (`smem_bytes`) is the kernels' shared memory, refilled with 0xFF before each CTA;
// `shared_bytes` is what the launch would ask for, at most the buffer.
// A block of block.x * block.y threads (2-D: threadIdx.x fastest, as CUDA numbers them).
template <typename Kernel>
void Launch(EmuDim3 grid, EmuDim3 block_dims, unsigned char* smem, size_t smem_bytes,
            int64_t shared_bytes, Kernel kernel) {
  const int threads = static_cast<int>(block_dims.x * block_dims.y);
  ASSERT_TRUE(block_dims.z == 1 && threads > 0 && threads % 32 == 0 && threads <= 32 * kMaxWarps)
      << block_dims.x << " x " << block_dims.y << " x " << block_dims.z;
  ASSERT_LE(shared_bytes, static_cast<int64_t>(smem_bytes));
  ASSERT_LE(smem_bytes, kSharedBytes);
  Barrier block(threads);
  std::vector<std::unique_ptr<Barrier>> warps;
  for (int w = 0; w < threads / 32; ++w) {
    warps.push_back(std::make_unique<Barrier>(32));
    warp_barriers[w] = warps.back().get();
  }
  block_barrier = &block;
  thread_states.assign(threads, ThreadState{});
  for (int t = 0; t < threads; ++t) {
    thread_states[t].thread_idx = {t % block_dims.x, t / block_dims.x, 0};
    thread_states[t].block_dim = block_dims;
    thread_states[t].grid_dim = grid;
  }
  struct Args {
    EmuDim3 grid;
    unsigned char* smem;
    size_t smem_bytes;
    Barrier* block;
    Kernel* kernel;
  } args{grid, smem, smem_bytes, &block, &kernel};
  fiber::swap_state = &SwapThreadState;
  fiber::Run(threads, [](void* p, int t) {
    const Args& a = *static_cast<const Args*>(p);
    for (unsigned z = 0; z < a.grid.z; ++z) {
      for (unsigned y = 0; y < a.grid.y; ++y) {
        for (unsigned x = 0; x < a.grid.x; ++x) {
          if (t == 0) {
            std::memset(a.smem, 0xFF, a.smem_bytes);
            shared_base = a.smem;
          }
          a.block->arrive_and_wait();  // shared memory refilled
          blockIdx = {x, y, z};
          (*a.kernel)();
          EXPECT_EQ(CopiesInFlight(), 0) << "a CTA ended with cp.async copies in flight";
          EXPECT_EQ(WgmmaPending(), 0) << "a CTA ended with wgmma products not waited for";
          copy_groups.clear();
          open_copies.clear();
          wgmma_groups.clear();
          wgmma_open.clear();
          a.block->arrive_and_wait();  // every thread done with this CTA
        }
      }
    }
  }, &args);
  thread_states.clear();
}

template <typename Kernel>
void Launch(EmuDim3 grid, int threads, unsigned char* smem, size_t smem_bytes,
            int64_t shared_bytes, Kernel kernel) {
  Launch(grid, EmuDim3{static_cast<unsigned>(threads), 1, 1}, smem, smem_bytes, shared_bytes,
         kernel);
}

// A value for a message: bf16 widened first (it converts to float only).
template <typename T>
double AsDouble(const T& v) {
  if constexpr (std::is_same_v<T, switchyard::BFloat16>) {
    return static_cast<float>(v);
  } else {
    return static_cast<double>(v);
  }
}

// Expects got and want of one size with the same bits everywhere; names the first difference.
template <typename T>
void ExpectSameBits(const std::vector<T>& got, const std::vector<T>& want,
                    const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(T)) != 0) {
      ADD_FAILURE() << what << ": element " << i << " of " << got.size() << " differs: "
                    << AsDouble(got[i]) << " vs " << AsDouble(want[i]);
      return;
    }
  }
}

}  // namespace emu
