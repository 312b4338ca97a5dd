// The tiles of the grouped products whose group sizes live on the device
// (kernels/cuda/grouped_gemm_kernels.cuh computes with them, kernels/cuda/grouped_gemm.cu
// describes the design): the CTA's shape, and an operand tile's way from global to shared
// memory, through registers with the bf16 rounding (TileRegs) or by cp.async (TileCopies).
// Include it after kernels/cuda/common.cuh (ToBf16) and <cuda_pipeline_primitives.h>; it uses
// nothing else of CUDA's but threadIdx and the cp.async primitives, so the host model of
// tests/kernels/cuda_emulation.h compiles it too.
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/activation_math.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace switchyard::kernels::cuda::grouped {

using Bf16 = __nv_bfloat16;

constexpr int kThreads = 256;        // 8 warps
constexpr int kBM = 128, kBN = 128;  // a CTA's output tile (the wide tensor-core tiles: 128 x 256)
constexpr int kFrag = 16;            // wmma m = n = k
constexpr int kBand = 8;             // row tiles per band of the CTA order

// The sizes: x (rows, k), w (groups, k, n) or (groups, n, k), out (rows, n), dy (rows, n),
// dw (groups, k, n); the offsets (groups + 1).
struct Dims {
  int64_t rows, k, n, groups;
};

__host__ __device__ inline int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The forward's row tiles a split of d.rows into d.groups can need: group g takes
// ceil(rows_g / kBM) <= (rows_g + kBM - 1) / kBM, at most min(groups, rows) groups have rows,
// so the sum is at most (rows + min(groups, rows) (kBM - 1)) / kBM.
__host__ __device__ inline int64_t MaxRowTiles(const Dims& d) {
  const int64_t busy = d.groups < d.rows ? d.groups : d.rows;
  return (d.rows + busy * (kBM - 1)) / kBM;
}

// 16 bytes of T: the unit of a vectorised global load.
template <typename T>
struct alignas(16) Vec {
  static constexpr int kN = 16 / static_cast<int>(sizeof(T));
  T v[kN];
};

// N values of S written to shared memory with one store.
template <typename S, int N>
struct alignas(sizeof(S) * N) Pack {
  S v[N];
};

// v as the shared tile holds it: f32 rounded to bf16 (nearest even) for a bf16 tile.
template <typename S, typename T>
__device__ __forceinline__ S Convert(T v) {
  if constexpr (std::is_same_v<S, T>) {
    return v;
  } else if constexpr (std::is_same_v<S, Bf16>) {
    return ToBf16(v);
  } else {
    return static_cast<float>(v);
  }
}

// v clamped to [0, most].
__device__ __forceinline__ int Clamp(int64_t v, int most) {
  return v < 0 ? 0 : v > most ? most : static_cast<int>(v);
}

// True when 16-byte loads of rows with leading dimension ld are aligned from p.
template <typename T>
__device__ __forceinline__ bool VecAligned(const T* p, int64_t ld) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % Vec<T>::kN == 0;
}

// Where an operand's tiles come from. At K step s of bk the tile starts at base + s bk ld
// (k_in_rows: K runs down the rows) or base + s bk (K runs along the columns); `rows` x `cols`
// elements from base are in bounds, and the tile's elements outside load as zeros.
template <typename T>
struct Source {
  const T* base;
  int64_t ld;          // elements between rows (the columns are contiguous)
  int64_t rows, cols;  // in bounds from base at step 0
  bool k_in_rows;
  bool vec;  // VecAligned(base, ld)
};

// A (ROWS, COLS) tile of T (COLS contiguous in global memory) on its way to shared memory.
// Thread t moves the 16-byte chunks t, t + kThreads, ... in row-major order, so a warp reads
// whole rows, or 512 contiguous bytes of one. Load() fetches the next K step's tile into
// registers while the current one is multiplied, when its columns are all in bounds and
// aligned (its rows may end early: a group's last rows, zeros past them); an edge tile (the
// last K step, the last columns, unaligned rows) is read element by element in Store().
template <typename T, int ROWS, int COLS>
struct TileRegs {
  static constexpr int kV = Vec<T>::kN;
  static constexpr int kPerRow = COLS / kV;
  static constexpr int kChunks = ROWS * kPerRow / kThreads;
  static_assert(COLS % kV == 0 && ROWS * kPerRow % kThreads == 0, "whole chunks per thread");
  Vec<T> chunk[kChunks];
  bool fetched;  // chunk holds the tile

  // The tile of `step`: its origin, its rows and columns in bounds (clamped to the tile, so
  // ints) and the leading dimension (the launchers check that kBM times it fits an int).
  struct Window {
    const T* p;
    int rows, cols, ld;
  };
  __device__ __forceinline__ static Window WindowOf(const Source<T>& src, int64_t step, int bk) {
    const int64_t skip = step * bk;
    return {src.base + (src.k_in_rows ? skip * src.ld : skip),
            Clamp(src.k_in_rows ? src.rows - skip : src.rows, ROWS),
            Clamp(src.k_in_rows ? src.cols : src.cols - skip, COLS), static_cast<int>(src.ld)};
  }

  __device__ __forceinline__ void Load(const Source<T>& src, int64_t step, int bk) {
    const Window w = WindowOf(src, step, bk);
    fetched = src.vec && w.cols == COLS;
    if (!fetched) return;
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kThreads, r = c / kPerRow;
      if (r < w.rows) {
        chunk[i] = *reinterpret_cast<const Vec<T>*>(w.p + (r * w.ld + c % kPerRow * kV));
      } else {
#pragma unroll
        for (int j = 0; j < kV; ++j) chunk[i].v[j] = T(0.0f);
      }
    }
  }

  // Into a shared tile of S with leading dimension ld, in the same orientation, or transposed
  // (element (r, e) to tile[e * ld + r]).
  template <bool kTransposed, typename S>
  __device__ __forceinline__ void Store(const Source<T>& src, int64_t step, int bk, S* tile,
                                        int ld) const {
    const Window w = WindowOf(src, step, bk);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kThreads;
      const int r = c / kPerRow, e = c % kPerRow * kV;
      Pack<S, kV> pack;
#pragma unroll
      for (int j = 0; j < kV; ++j) {
        const T v = fetched                           ? chunk[i].v[j]
                    : r < w.rows && e + j < w.cols ? w.p[r * w.ld + e + j]
                                                   : T(0.0f);
        pack.v[j] = Convert<S>(v);
      }
      if constexpr (kTransposed) {
#pragma unroll
        for (int j = 0; j < kV; ++j) tile[(e + j) * ld + r] = pack.v[j];
      } else {
        *reinterpret_cast<Pack<S, kV>*>(tile + r * ld + e) = pack;
      }
    }
  }
};

// The cp.async way to the same shared tile, for an operand already in the tile's type
// (bf16): thread t copies the chunks TileRegs<T, ROWS, COLS> would load, each 16 bytes straight
// from global to shared memory, no registers in between, and a chunk outside the window is
// zero-filled (the copy reads nothing; its source is the operand's base, a valid address).
// That is exact only when every chunk of every step's window is wholly in or out of bounds,
// which CopiesAligned checks: 16-byte aligned rows (src.vec) and columns in bounds a multiple
// of a chunk (steps of bk move the column window by whole chunks).
// kSwizzled: the tile goes to wgmma's 128-byte swizzled layout (kernels/cuda/wgmma.cuh's
// SwizzledOffset: COLS a multiple of 64, column blocks of 64 one after another, rows of 128
// bytes, the tile 1024-byte aligned) instead of rows of leading dimension ld.
template <typename T, int ROWS, int COLS, bool kSwizzled = false>
struct TileCopies {
  using Regs = TileRegs<T, ROWS, COLS>;
  static constexpr int kV = Regs::kV, kPerRow = Regs::kPerRow, kChunks = Regs::kChunks;
  static_assert(!kSwizzled || (sizeof(T) == 2 && COLS % 64 == 0 && ROWS % 8 == 0),
                "swizzled tiles: bf16, whole 8 x 64 atoms");

  __device__ __forceinline__ static void Issue(const Source<T>& src, int64_t step, int bk, T* tile,
                                               int ld) {
    const typename Regs::Window w = Regs::WindowOf(src, step, bk);
#pragma unroll
    for (int i = 0; i < kChunks; ++i) {
      const int c = static_cast<int>(threadIdx.x) + i * kThreads;
      const int r = c / kPerRow, e = c % kPerRow * kV;
      const bool in = r < w.rows && e < w.cols;
      T* dst = kSwizzled ? tile + SwizzledOffset(ROWS, r, e / kV) / static_cast<int>(sizeof(T))
                         : tile + (r * ld + e);
      __pipeline_memcpy_async(dst, in ? w.p + (r * w.ld + e) : src.base, 16, in ? 0 : 16);
    }
  }
};

// The forward's fused epilogue (kernels::GroupedGemmBiasGelu): W1's bias and GELU applied to
// the product as its tiles are written, for the experts' first projection under bf16
// activation storage. bias (G, n) f32; h and kept (R, n) bf16. Null: the plain product.
struct BiasGelu {
  const float* bias = nullptr;
  Bf16* h = nullptr;
  Bf16* kept = nullptr;
};

// Where a CTA writes: its tile's origin in the output, the output's leading dimension, and
// the rows and columns in bounds from the origin. With the fused epilogue (fused.h set):
// fused.h and fused.kept at the tile's origin (leading dimension ld too), fused.bias at its
// group's bias for the tile's first column, and base unused.
struct Output {
  float* base;
  int64_t ld;
  int64_t rows, cols;
  BiasGelu fused = {};
};

// *p = alpha acc + beta *p; beta = 0 never reads *p.
__device__ __forceinline__ void Write(float* p, float acc, float alpha, float beta) {
  const float v = __fmul_rn(alpha, acc);
  *p = beta == 0.0f ? v : __fadd_rn(v, __fmul_rn(beta, *p));
}

// Element (row, col) of a tile: Write into the output, or with the fused epilogue (beta 0)
// z = alpha acc + bias[col], kept = bf16(z), h = bf16(gelu(z)): GroupedGemm's f32 value, then
// GroupedBiasGeluForward's expressions (kernels/cuda/bias_kernels.cuh), so the same bits.
__device__ __forceinline__ void Put(const Output& out, int row, int col, float acc, float alpha,
                                    float beta) {
  const int64_t at = row * out.ld + col;
  const BiasGelu& f = out.fused;
  if (f.h == nullptr) return Write(out.base + at, acc, alpha, beta);
  const float z = __fadd_rn(__fmul_rn(alpha, acc), f.bias[col]);
  f.kept[at] = ToBf16(z);
  f.h[at] = ToBf16(Gelu(z));
}

// True when TileCopies may carry this operand: see there.
template <typename T>
__host__ __device__ inline bool CopiesAligned(const T* p, int64_t ld, int64_t cols) {
  return reinterpret_cast<uintptr_t>(p) % 16 == 0 && ld % Vec<T>::kN == 0 &&
         cols % Vec<T>::kN == 0;
}

// The cp.async kernels' operands: both bf16 (kBothBf16), both CopiesAligned from their
// bases (the per-group and per-tile origins inherit it: every offset added to a base is a
// multiple of the leading dimension or of a tile's width). grouped_gemm.cu chooses its
// kernels by these, and the emulation test as it does.
template <typename TA, typename TB>
constexpr bool kBothBf16 = std::is_same_v<TA, Bf16> && std::is_same_v<TB, Bf16>;
template <typename T>
bool UseCopies(const T* a, int64_t lda, const T* b, int64_t ldb) {
  return CopiesAligned(a, lda, lda) && CopiesAligned(b, ldb, ldb);
}

}  // namespace switchyard::kernels::cuda::grouped
