// The tiles of the fused attention kernels (kernels/cuda/flash_attention_kernels.cuh computes
// with them; kernels/cuda/flash_attention.cu describes the design): the block sizes and shared
// memory, the f32 rows' way into bf16 shared tiles (loaded as stored, or fetched ahead into
// registers), the mma.sync fragments ldmatrix reads from them, the warp's products, and the
// accumulators' way out. Include it after kernels/cuda/common.cuh; like the kernels, it uses
// nothing of CUDA's but the built-ins and device_common.cuh's helpers, so the host model of
// tests/kernels/cuda_emulation.h compiles it too.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/flash_attention.h"

namespace switchyard::kernels::cuda::flash {

using Bf16 = __nv_bfloat16;

constexpr int kBr = static_cast<int>(kFlashBlockQ);  // query rows per tile
constexpr int kBc = static_cast<int>(kFlashBlockK);  // keys per tile
constexpr int kThreads = 128;                        // 4 warps
constexpr int kWarpRows = 16;                        // rows of a tile each warp owns (mma m)
static_assert(kBr == 4 * kWarpRows && kBc == 4 * kWarpRows, "warp w owns 16 rows of a 64-row tile");
static_assert(kBr == kBc, "a (64, HD) tile holds 64 rows of either kind");

// Shared-memory leading dimension (bf16 elements) of the (64, HD) row-major tiles: q, k, v,
// dout. +8: each 8-row phase of an ldmatrix reads 8 rows of 16 bytes in distinct banks.
template <int HD>
struct Ld {
  static constexpr int kH = HD + 8;
};

// Bytes of shared memory of each kernel. The tiles a kernel loops over (k and v, or q and dout
// with their lse and delta) are double-buffered: the next block's pair is stored into one
// buffer while the warps read the other, so a block costs one barrier, not two.
template <int HD>
struct Sizes {
  static constexpr int kRows = kBr * Ld<HD>::kH * 2;  // one (64, HD) tile
  static constexpr int kStats = 2 * kBr * 4;          // a query block's lse and delta
  static constexpr int kForward = 5 * kRows;          // q; k, v twice
  static constexpr int kBackwardQ = 6 * kRows;        // q, dout; k, v twice
  static constexpr int kBackwardKv = 6 * kRows + 2 * kStats;  // k, v; q, dout, lse, delta twice
  static_assert(kRows % 16 == 0, "alignment");
};

// Tile t of a kernel's shared memory (t kRows bytes in).
template <int HD>
__device__ __forceinline__ Bf16* TileAt(unsigned char* smem, int t) {
  return reinterpret_cast<Bf16*>(smem + t * Sizes<HD>::kRows);
}

// aligned: every row of q, k and v starts on 16 bytes (their tiles load a 16-byte quad of f32
// or chunk of bf16 at a time); aligned_dout: dout's rows do (f32, whatever q's type). The
// launch checks the pointers.
struct Dims {
  int s, hq, hkv;
  bool aligned, aligned_dout;
  __host__ __device__ int group() const { return hq / hkv; }
};

// The scores' two factors (kernels/flash_attention.h): scale = 1/sqrt(hd), for lse and the
// gradients, and c = f32(scale log2 e), for the base-2 softmax on the unscaled scores.
struct Scale {
  float scale, c;
};

// The f32 rows' way into a bf16 tile: a thread takes a quad, four neighbouring elements of a
// row (consecutive threads, consecutive quads: a 64-wide row is 16 threads' 16-byte loads),
// loaded by one 16-byte access when the launch says every row starts 16-byte aligned
// (Dims::aligned), else by four, and stored rounded (round to nearest even) as one 8-byte
// shared store. Rows >= s are 0. kQuads: a thread's quads of a (64, HD) tile.
template <int HD>
constexpr int kQuads = kBr * HD / 4 / kThreads;
static_assert(kBr * 64 / 4 % kThreads == 0, "whole passes");

template <int HD>
__device__ __forceinline__ int QuadRow(int it) {
  return (it * kThreads + static_cast<int>(threadIdx.x)) / (HD / 4);
}
template <int HD>
__device__ __forceinline__ int QuadCol(int it) {
  return 4 * ((it * kThreads + static_cast<int>(threadIdx.x)) % (HD / 4));
}
// The aligned load is written as the instruction (a read-only 16-byte load: the kernels never
// write their inputs), since nvcc otherwise merges the two branches into the unaligned one.
__device__ __forceinline__ Vals<4> LoadQuad(const float* src, bool in, bool aligned) {
  if (!in) return Vals<4>{{0.0f, 0.0f, 0.0f, 0.0f}};
  if (aligned) {
#ifdef __CUDA_ARCH__
    Vals<4> v;
    asm("ld.global.nc.v4.f32 {%0, %1, %2, %3}, [%4];"
        : "=f"(v.v[0]), "=f"(v.v[1]), "=f"(v.v[2]), "=f"(v.v[3])
        : "l"(src));
    return v;
#else
    return LoadVals<4>(src);
#endif
  }
  return Vals<4>{{src[0], src[1], src[2], src[3]}};
}
template <int HD>
__device__ __forceinline__ void StoreQuad(Bf16* tile, int it, const Vals<4>& v) {
  StoreVals<4>(tile + QuadRow<HD>(it) * Ld<HD>::kH + QuadCol<HD>(it), v);
}

// Rows [r0, r0 + 64) of one head of a (B, S, H, HD) f32 tensor, `base` at (b, 0, head, 0)
// with row stride ld, rounded to bf16 into a (64, HD) tile (row-major, Ld::kH). The loops run
// a constant number of times in batches of kBatch quads (unrolled), so a batch's loads are
// all issued before its first store waits for one (a tile costs kQuads / kBatch memory
// latencies, not kQuads), with 4 kBatch registers in flight: a 64-wide tile in one batch, a
// 128-wide one in two (whose kernels have fewer registers to spare).
template <int HD>
__device__ void LoadRows(const float* base, int64_t ld, int r0, int s, bool aligned, Bf16* tile) {
  constexpr int kBatch = 8;
  static_assert(kQuads<HD> % kBatch == 0, "whole batches");
#pragma unroll 1
  for (int b0 = 0; b0 < kQuads<HD>; b0 += kBatch) {
    Vals<4> v[kBatch];
#pragma unroll
    for (int it = 0; it < kBatch; ++it) {
      const int r = QuadRow<HD>(b0 + it);
      v[it] = LoadQuad(base + static_cast<int64_t>(r0 + r) * ld + QuadCol<HD>(b0 + it), r0 + r < s,
                       aligned);
    }
#pragma unroll
    for (int it = 0; it < kBatch; ++it) StoreQuad<HD>(tile, b0 + it, v[it]);
  }
}

// A (64, HD) tile's f32 values held in registers between their loads and their store into
// shared memory (LoadRows' quads): the kernels fetch the next block's tiles before
// computing on the current one, so the loads are in flight during the products (HD <= 64,
// kPrefetch: 64 registers for two tiles; wider heads load as they store, LoadRows).
template <int HD>
struct RowsInFlight {
  Vals<4> v[kQuads<HD>];

  __device__ __forceinline__ void Fetch(const float* base, int64_t ld, int r0, int s,
                                        bool aligned) {
#pragma unroll
    for (int it = 0; it < kQuads<HD>; ++it) {
      const int r = QuadRow<HD>(it);
      v[it] = LoadQuad(base + static_cast<int64_t>(r0 + r) * ld + QuadCol<HD>(it), r0 + r < s,
                       aligned);
    }
  }
  __device__ __forceinline__ void Store(Bf16* tile) const {
#pragma unroll
    for (int it = 0; it < kQuads<HD>; ++it) StoreQuad<HD>(tile, it, v[it]);
  }
};
// The kernels' kAhead parameter (default kPrefetch<HD>) says whether they fetch f32 rows
// ahead (TileLoader).
template <int HD>
constexpr bool kPrefetch = HD <= 64;

// Fragments from the row-major tiles by ldmatrix.x4: lane l gives the address of row l % 8 of
// matrix l / 8 (mi, r8 below).
// The a fragment of rows [row0, row0 + 16), columns [col0, col0 + 16): matrices (row0, col0),
// (row0 + 8, col0), (row0, col0 + 8), (row0 + 8, col0 + 8).
__device__ __forceinline__ void LoadA(const Bf16* tile, int ld, int row0, int col0,
                                      uint32_t (&a)[4]) {
  const int lane = threadIdx.x % 32, mi = lane / 8, r8 = lane % 8;
  LdMatrixX4(a, tile + (row0 + r8 + 8 * (mi & 1)) * ld + col0 + 8 * (mi >> 1));
}

// The b fragments of the 8-column tiles n0 and n0 + 8 (b[0], b[1] and b[2], b[3]) where the
// tile's rows are the product's columns, B[k][n] = tile[n0 + n][k0 + k]: k in q k^T.
__device__ __forceinline__ void LoadBRows(const Bf16* tile, int ld, int n0, int k0,
                                          uint32_t (&b)[4]) {
  const int lane = threadIdx.x % 32, mi = lane / 8, r8 = lane % 8;
  LdMatrixX4(b, tile + (n0 + r8 + 8 * (mi >> 1)) * ld + k0 + 8 * (mi & 1));
}

// The same where the tile's rows are the product's K, B[k][n] = tile[k0 + k][n0 + n]: v in
// p v (ldmatrix transposes the 8 x 8 matrices).
__device__ __forceinline__ void LoadBCols(const Bf16* tile, int ld, int k0, int n0,
                                          uint32_t (&b)[4]) {
  const int lane = threadIdx.x % 32, mi = lane / 8, r8 = lane % 8;
  LdMatrixX4Trans(b, tile + (k0 + r8 + 8 * (mi & 1)) * ld + n0 + 8 * (mi >> 1));
}

// c[n] += a b for the two 8-column tiles of a LoadBRows / LoadBCols result.
__device__ __forceinline__ void MmaPair(float (&c0)[4], float (&c1)[4], const uint32_t (&a)[4],
                                        const uint32_t (&b)[4]) {
  const uint32_t lo[2] = {b[0], b[1]}, hi[2] = {b[2], b[3]};
  MmaBf16(c0, a, lo);
  MmaBf16(c1, a, hi);
}

// The a fragment of columns [16 kk, 16 kk + 16) of a warp's (16, N) f32 accumulators (n = 8
// tiles c[2 kk] and c[2 kk + 1]), each value rounded to bf16.
template <int N>
__device__ __forceinline__ void PackA(const float (&c)[N][4], int kk, uint32_t (&a)[4]) {
  a[0] = PackBf16x2(c[2 * kk][0], c[2 * kk][1]);
  a[1] = PackBf16x2(c[2 * kk][2], c[2 * kk][3]);
  a[2] = PackBf16x2(c[2 * kk + 1][0], c[2 * kk + 1][1]);
  a[3] = PackBf16x2(c[2 * kk + 1][2], c[2 * kk + 1][3]);
}

template <int N>
__device__ __forceinline__ void Zero(float (&c)[N][4]) {
#pragma unroll
  for (int n = 0; n < N; ++n) c[n][0] = c[n][1] = c[n][2] = c[n][3] = 0.0f;
}

// c (16 rows of the warp, 64 columns) += x y^T: x the warp's rows [row0, row0 + 16) of a
// row-major (., HD) tile, y the 64 rows of another (its rows are the result's columns).
template <int HD>
__device__ __forceinline__ void ProductRows(const Bf16* x, int row0, const Bf16* y,
                                            float (&c)[kBc / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
    uint32_t a[4];
    LoadA(x, Ld<HD>::kH, row0, 16 * kk, a);
#pragma unroll
    for (int n = 0; n < kBc / 16; ++n) {
      uint32_t b[4];
      LoadBRows(y, Ld<HD>::kH, 16 * n, 16 * kk, b);
      MmaPair(c[2 * n], c[2 * n + 1], a, b);
    }
  }
}

// c (16 rows of the warp, 64 columns) += x y^T where x is held as the a fragments of the
// warp's 16 rows (the forward's q) and y is a row-major (64, HD) tile.
template <int HD>
__device__ __forceinline__ void ProductFragments(const uint32_t (&x)[HD / 16][4], const Bf16* y,
                                                 float (&c)[kBc / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) {
#pragma unroll
    for (int n = 0; n < kBc / 16; ++n) {
      uint32_t b[4];
      LoadBRows(y, Ld<HD>::kH, 16 * n, 16 * kk, b);
      MmaPair(c[2 * n], c[2 * n + 1], x[kk], b);
    }
  }
}

// acc (16 rows, HD) += bf16(w) z: w the warp's (16, 64) f32 accumulators, z a row-major
// (64, HD) tile (its 64 rows are the product's K).
template <int HD>
__device__ __forceinline__ void ProductWeights(const float (&w)[kBc / 8][4], const Bf16* z,
                                               float (&acc)[HD / 8][4]) {
#pragma unroll
  for (int kk = 0; kk < kBc / 16; ++kk) {
    uint32_t a[4];
    PackA(w, kk, a);
#pragma unroll
    for (int n = 0; n < HD / 16; ++n) {
      uint32_t b[4];
      LoadBCols(z, Ld<HD>::kH, 16 * kk, 16 * n, b);
      MmaPair(acc[2 * n], acc[2 * n + 1], a, b);
    }
  }
}

// Writes a warp's (16, HD) accumulators times `scale` as rows [r0, r0 + 16) of one head of a
// (B, S, H, HD) tensor (`base` at (b, 0, head, 0), row stride ld); rows >= s are dropped.
template <int HD, typename TO>
__device__ __forceinline__ void WriteAccumulators(const float (&acc)[HD / 8][4],
                                                  const float (&scale)[2], int r0, int s,
                                                  TO* base, int64_t ld) {
  const int lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    const int r = r0 + g + 8 * half;
    if (r >= s) continue;
    TO* row = base + static_cast<int64_t>(r) * ld;
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      StoreAs(row, 8 * n + 2 * t, __fmul_rn(acc[n][2 * half], scale[half]));
      StoreAs(row, 8 * n + 2 * t + 1, __fmul_rn(acc[n][2 * half + 1], scale[half]));
    }
  }
}

// A tile's way from global memory into its shared (64, HD) bf16 tile (rows [r0, r0 + 64) of
// one head, `base` at (b, 0, head, 0), row stride ld; rows >= s are 0), begun a block ahead by
// Start (then the caller's Commit) and ended by Finish, before the barrier that shows the tile:
//   f32 rows, kAhead: Start loads the quads into registers (RowsInFlight), Finish rounds and
//     stores them;
//   f32 rows otherwise: Finish loads, rounds and stores them (LoadRows);
//   bf16 rows starting on 16 bytes (aligned): Start issues cp.async copies of 16-byte chunks
//     straight into the tile (no registers; rows >= s zero-filled), Commit closes them as one
//     group, Finish waits for this thread's groups;
//   bf16 rows otherwise: Finish copies them element by element.
// The values are the same bits on every way: bf16 input is already what the f32 rows round to.
template <int HD, typename T, bool kAhead>
struct TileLoader;

template <int HD, bool kAhead>
struct TileLoader<HD, float, kAhead> {
  RowsInFlight<HD> regs{};  // kAhead only

  __device__ __forceinline__ void Start(const float* base, int64_t ld, int r0, int s, bool aligned,
                                        Bf16*) {
    if constexpr (kAhead) regs.Fetch(base, ld, r0, s, aligned);
  }
  __device__ __forceinline__ void Finish(const float* base, int64_t ld, int r0, int s,
                                         bool aligned, Bf16* tile) const {
    if constexpr (kAhead) {
      regs.Store(tile);
    } else {
      LoadRows<HD>(base, ld, r0, s, aligned, tile);
    }
  }
  __device__ __forceinline__ static void Commit() {}
};

template <int HD, bool kAhead>
struct TileLoader<HD, Bf16, kAhead> {
  static constexpr int kPerRow = HD / 8;                     // 16-byte chunks of a row
  static constexpr int kChunks = kBr * kPerRow / kThreads;  // a thread's chunks of a tile
  static_assert(kBr * kPerRow % kThreads == 0, "whole passes");

  __device__ __forceinline__ void Start(const Bf16* base, int64_t ld, int r0, int s, bool aligned,
                                        Bf16* tile) const {
    if (!aligned) return;
#pragma unroll
    for (int it = 0; it < kChunks; ++it) {
      const int c = it * kThreads + static_cast<int>(threadIdx.x);
      const int r = c / kPerRow, e = 8 * (c % kPerRow);
      const bool in = r0 + r < s;  // else zero-filled from a valid address
      __pipeline_memcpy_async(tile + r * Ld<HD>::kH + e,
                              in ? base + static_cast<int64_t>(r0 + r) * ld + e : base, 16,
                              in ? 0 : 16);
    }
  }
  __device__ __forceinline__ void Finish(const Bf16* base, int64_t ld, int r0, int s,
                                         bool aligned, Bf16* tile) const {
    if (aligned) return __pipeline_wait_prior(0);
#pragma unroll 1
    for (int it = 0; it < kChunks; ++it) {
      const int c = it * kThreads + static_cast<int>(threadIdx.x);
      const int r = c / kPerRow, e = 8 * (c % kPerRow);
      const Bf16* row = base + static_cast<int64_t>(r0 + r) * ld + e;
#pragma unroll
      for (int x = 0; x < 8; ++x) {
        tile[r * Ld<HD>::kH + e + x] = r0 + r < s ? row[x] : ToBf16(0.0f);
      }
    }
  }
  __device__ __forceinline__ static void Commit() { __pipeline_commit(); }
};

// A tile loaded now (Start, Commit, Finish): the tiles a kernel holds throughout.
template <int HD, typename T>
__device__ __forceinline__ void LoadTile(const T* base, int64_t ld, int r0, int s, bool aligned,
                                         Bf16* tile) {
  TileLoader<HD, T, false> loader;
  loader.Start(base, ld, r0, s, aligned, tile);
  loader.Commit();
  loader.Finish(base, ld, r0, s, aligned, tile);
}

// The CTAs per SM each kernel's register budget is sized for (__launch_bounds__), T the type
// of q, k and v. f32 rows: 2 when fetched ahead (ptxas, sm_90a: 255 registers; a cap of 168,
// for 3, spills 200-400 bytes), else no bound (HD 64: 128-185 registers). bf16 rows hold no
// tile in registers (cp.async; the dk/dv kernel loads dout as it stores it, kDoutAhead): at
// HD 64 all three kernels fit 168 registers with no spills, so 3 (12 warps an SM); at HD 128, 2.
template <int HD, typename T, bool kAhead>
constexpr int kCtasPerSm = std::is_same_v<T, Bf16> ? (HD == 64 ? 3 : 2) : (kAhead ? 2 : 1);

// acc *= alpha row by row (rows g: registers 0, 1; rows g + 8: 2, 3). A row whose max did not
// move has alpha exactly 1 (kernels/flash_attention.h), and multiplying by 1 changes no bit,
// so those rows are skipped: after the first key blocks most are, and a warp whose 16 rows
// all kept their max skips the multiplies altogether.
template <int N>
__device__ __forceinline__ void Rescale(float (&acc)[N][4], const float (&alpha)[2]) {
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    if (alpha[half] == 1.0f) continue;
#pragma unroll
    for (int n = 0; n < N; ++n) {
      acc[n][2 * half] = __fmul_rn(acc[n][2 * half], alpha[half]);
      acc[n][2 * half + 1] = __fmul_rn(acc[n][2 * half + 1], alpha[half]);
    }
  }
}

}  // namespace switchyard::kernels::cuda::flash
