// The device code of the grouped products whose group sizes live on the device
// (kernels/cuda/grouped_gemm.cu launches it and describes the design): the tensor-core (bf16)
// and SIMT (f32) main loops, their register and cp.async pipelines, the search of a CTA's row
// tile in the offsets, and the epilogues with row bounds and alpha/beta; the tiles and their
// loads are kernels/cuda/grouped_gemm_tiles.cuh, the wgmma tiles grouped_gemm_hopper.cuh.
// Include it after <cuda_pipeline_primitives.h> and kernels/cuda/common.cuh (ToBf16, MmaBf16,
// LdMatrixX4); it uses nothing else of CUDA's but the built-ins (threadIdx, blockIdx,
// __syncthreads, __syncwarp, fmaf, the __f*_rn intrinsics), the cp.async primitives
// (__pipeline_memcpy_async, __pipeline_commit, __pipeline_wait_prior) and kernels/cuda/wgmma.cuh,
// so the same source also compiles against the host model of tests/kernels/cuda_emulation.h
// (tests/kernels/grouped_gemm_emulation_test.cc).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/cuda/grouped_gemm_hopper.cuh"
#include "kernels/cuda/grouped_gemm_tiles.cuh"

namespace switchyard::kernels::cuda::grouped {

// bf16 products on tensor cores (mma.sync.m16n8k16, f32 accumulators in registers; the
// fragment layout is kernels/cuda/device_common.cuh's). The shared tiles keep their global
// orientation: A (kBM, kBK) row-major, or (kBK, kBM) when kAKm (the weight gradient's x^T:
// its M is x's contiguous dimension); B (kBK, kTileN), or (kTileN, kBK) when kBNk (w
// transposed). ldmatrix reads the fragments, transposing (.trans) where a tile's rows run
// along K's partner rather than K: A when kAKm, B unless kBNk. Each 8-row phase of an
// ldmatrix reads 8 rows of 16 bytes whose leading dimensions (+8 elements) put them in
// distinct banks. Warp w computes rows [64 (w / 4), +64) and columns [kWarpN (w % 4), +kWarpN)
// of the CTA tile: 4 x kWarpN / 8 accumulator tiles of 16 x 8.
//   kWarpN = 32: 128 x 128 CTA tiles, K steps of 32, 3 cp.async stages, two CTAs per SM
//   (128 registers);
//   kWarpN = 64 (Wide, SWITCHYARD_GROUPED_WIDE=1 for the cp.async kernels): 128 x 256 tiles,
//   K steps of 64, 3
//   stages (156 KiB), one CTA per SM: half the fragment loads per product (a warp's 4 a and
//   4 b fragments feed 32 products instead of 4 and 2 feeding 16) and a quarter of the
//   barriers per flop.
template <bool kAKm, bool kBNk, int kWarpN = 32>
struct TensorCoreTiles {
  static_assert(kWarpN == 32 || kWarpN == 64, "warp tiles 64 x 32 or 64 x 64");
  using S = Bf16;
  using Wide = TensorCoreTiles<kAKm, kBNk, 64>;
  using Hopper = HopperTiles<kAKm, kBNk>;  // wgmma (grouped_gemm_hopper.cuh)
  static constexpr int kAlign = 0;         // no alignment beyond the buffer's
  static constexpr bool kWgmma = false;
  static constexpr int kBK = kWarpN == 64 ? 64 : 32;
  static constexpr int kTileN = 4 * kWarpN;
  static constexpr int kStages = 3;                        // of the cp.async pipeline
  static constexpr int kCtasPerSm = kWarpN == 64 ? 1 : 2;  // the cp.async kernels' bound
  static constexpr int kLdA = kAKm ? kBM + 8 : kBK + 8;  // +8: no bank conflicts, 16-byte rows
  static constexpr int kLdB = kBNk ? kBK + 8 : kTileN + 8;
  static constexpr int kABytes = (kAKm ? kBK : kBM) * kLdA * 2;
  static constexpr int kBBytes = (kBNk ? kTileN : kBK) * kLdB * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static_assert(kABytes % 128 == 0 && kBBytes % 128 == 0, "16-byte aligned ldmatrix rows");
  template <typename T>
  using ARegs = TileRegs<T, kAKm ? kBK : kBM, kAKm ? kBM : kBK>;
  template <typename T>
  using BRegs = TileRegs<T, kBNk ? kTileN : kBK, kBNk ? kBK : kTileN>;
  using ACopies = TileCopies<S, kAKm ? kBK : kBM, kAKm ? kBM : kBK>;
  using BCopies = TileCopies<S, kBNk ? kTileN : kBK, kBNk ? kBK : kTileN>;
  static constexpr int kJ = kWarpN / 8;  // 8-column tiles per warp
  struct Acc {
    float c[4][kJ][4];  // [16-row tile i][8-column tile j][register]
  };

  static constexpr bool kTransposeA = false, kTransposeB = false;

  __device__ static void Zero(Acc& acc) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) acc.c[i][j][r] = 0.0f;
      }
    }
  }

  // acc += a b over one K step. Lane l addresses row l % 8 of matrix l / 8 of each ldmatrix.
  __device__ static void Multiply(const S* a, const S* b, Acc& acc) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int m0 = warp / 4 * 64, n0 = warp % 4 * kWarpN, mi = lane / 8, r8 = lane % 8;
#pragma unroll
    for (int kk = 0; kk < kBK; kk += 16) {
      uint32_t fb[kJ][2];
#pragma unroll
      for (int jj = 0; jj < kJ / 2; ++jj) {  // the 8-column tiles 2 jj and 2 jj + 1
        const int n = n0 + 16 * jj;
        uint32_t r[4];
        if constexpr (kBNk) {  // rows n: matrices (n, k), (n, k + 8), (n + 8, k), (n + 8, k + 8)
          LdMatrixX4(r, b + (n + r8 + 8 * (mi >> 1)) * kLdB + kk + 8 * (mi & 1));
        } else {  // rows k: matrices (k, n), (k + 8, n), (k, n + 8), (k + 8, n + 8), transposed
          LdMatrixX4Trans(r, b + (kk + r8 + 8 * (mi & 1)) * kLdB + n + 8 * (mi >> 1));
        }
        fb[2 * jj][0] = r[0];
        fb[2 * jj][1] = r[1];
        fb[2 * jj + 1][0] = r[2];
        fb[2 * jj + 1][1] = r[3];
      }
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int m = m0 + 16 * i;
        uint32_t fa[4];
        if constexpr (kAKm) {  // rows k: matrices (k, m), (k, m + 8), (k + 8, m), (k + 8, m + 8)
          LdMatrixX4Trans(fa, a + (kk + r8 + 8 * (mi >> 1)) * kLdA + m + 8 * (mi & 1));
        } else {  // rows m: matrices (m, k), (m + 8, k), (m, k + 8), (m + 8, k + 8)
          LdMatrixX4(fa, a + (m + r8 + 8 * (mi & 1)) * kLdA + kk + 8 * (mi >> 1));
        }
#pragma unroll
        for (int j = 0; j < kJ; ++j) MmaBf16(acc.c[i][j], fa, fb[j]);
      }
    }
  }

  // Lane (g, t) = (l / 4, l % 4) holds columns 2t, 2t + 1 of rows g and g + 8 of each 16 x 8
  // tile and writes them straight to global memory: a lane quad writes 32 contiguous bytes.
  __device__ static void Epilogue(Acc& acc, const Output& out, float alpha, float beta,
                                  unsigned char*) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    const int m0 = warp / 4 * 64 + lane / 4, n0 = warp % 4 * kWarpN + 2 * (lane % 4);
#pragma unroll
    for (int i = 0; i < 4; ++i) {
#pragma unroll
      for (int j = 0; j < kJ; ++j) {
#pragma unroll
        for (int r = 0; r < 4; ++r) {
          const int row = m0 + 16 * i + 8 * (r / 2), col = n0 + 8 * j + r % 2;
          if (row < out.rows && col < out.cols) {
            Put(out, row, col, acc.c[i][j][r], alpha, beta);
          }
        }
      }
    }
  }
};

// f32 products on the CUDA cores (fmaf, no TF32). Both shared tiles K-major: A^T (kBK, kBM)
// and B (kBK, kBN), f32 with leading dimension +4 (16-byte rows); an operand stored the
// other way round in global memory is transposed as it is stored. Thread (ty, tx) =
// (t / 16, t % 16) computes rows {4 ty + i, 64 + 4 ty + i} x columns {4 tx + j, 64 + 4 tx + j},
// i, j < 4, reading each operand as two 16-byte vectors per k.
template <bool kAKm, bool kBNk>
struct SimtTiles {
  using S = float;
  using Wide = SimtTiles;  // no cp.async kernels: f32 operands take the register pipeline
  using Hopper = SimtTiles;
  static constexpr int kAlign = 0;
  static constexpr bool kWgmma = false;
  static constexpr int kBK = 16;
  static constexpr int kTileN = kBN, kStages = 2, kCtasPerSm = 1;
  static constexpr int kLdA = kBM + 4, kLdB = kBN + 4;
  static constexpr int kABytes = kBK * kLdA * 4, kBBytes = kBK * kLdB * 4;
  static constexpr int kStageBytes = kABytes + kBBytes;
  template <typename T>
  using ARegs = TileRegs<T, kAKm ? kBK : kBM, kAKm ? kBM : kBK>;
  template <typename T>
  using BRegs = TileRegs<T, kBNk ? kBN : kBK, kBNk ? kBK : kBN>;
  struct Acc {
    float c[8][8];
  };

  static constexpr bool kTransposeA = !kAKm, kTransposeB = kBNk;

  __device__ static void Zero(Acc& acc) {
#pragma unroll
    for (int i = 0; i < 8; ++i) {
#pragma unroll
      for (int j = 0; j < 8; ++j) acc.c[i][j] = 0.0f;
    }
  }

  // Row (or column) of a thread's i-th (j-th) value within the tile.
  __device__ static int Line(int t, int i) { return (i < 4 ? 0 : 64 - 4) + 4 * t + i; }

  __device__ static void Multiply(const S* a, const S* b, Acc& acc) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int kk = 0; kk < kBK; ++kk) {
      const auto* ar = reinterpret_cast<const Pack<float, 4>*>(a + kk * kLdA + 4 * ty);
      const auto* br = reinterpret_cast<const Pack<float, 4>*>(b + kk * kLdB + 4 * tx);
      const Pack<float, 4> a0 = ar[0], a1 = ar[16], b0 = br[0], b1 = br[16];  // +64 floats
      float av[8], bv[8];
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        av[i] = a0.v[i], av[4 + i] = a1.v[i], bv[i] = b0.v[i], bv[4 + i] = b1.v[i];
      }
#pragma unroll
      for (int i = 0; i < 8; ++i) {
#pragma unroll
        for (int j = 0; j < 8; ++j) acc.c[i][j] = fmaf(av[i], bv[j], acc.c[i][j]);
      }
    }
  }

  __device__ static void Epilogue(Acc& acc, const Output& out, float alpha, float beta,
                                  unsigned char*) {
    const int ty = threadIdx.x / 16, tx = threadIdx.x % 16;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int row = Line(ty, i);
      if (row >= out.rows) continue;
#pragma unroll
      for (int j = 0; j < 8; ++j) {
        const int col = Line(tx, j);
        if (col < out.cols) Put(out, row, col, acc.c[i][j], alpha, beta);
      }
    }
  }
};

// Shared memory: P's tiles in two stages (Accumulate) or P::kStages (AccumulateAsync), from the
// first P::kAlign-aligned shared address (StagesOf), then the row-tile search's scratch.
template <class P, bool kAsync = false>
struct Smem {
  // The scan's 2 kThreads ints follow the stages.
  static constexpr int kScan = P::kAlign + (kAsync ? P::kStages : 2) * P::kStageBytes;
  static constexpr int kFound = kScan + 2 * kThreads * 4;  // 3 int64
  static constexpr int kBytes = kFound + 3 * 8;
};

// Where P's stages start in the kernels' shared memory.
template <class P>
__device__ __forceinline__ unsigned char* StagesOf(unsigned char* smem) {
  if constexpr (P::kAlign > 1) {
    return smem + (P::kAlign - SharedAddress(smem) % P::kAlign) % P::kAlign;
  } else {
    return smem;
  }
}

// acc = A B over `steps` K steps of P::kBK: the next step's tiles load into registers while
// the current ones are multiplied, two shared stages, one barrier per step. Ends with the
// stages free for the epilogue (after a barrier, or never used when steps = 0).
template <class P, typename TA, typename TB>
__device__ void Accumulate(const Source<TA>& a, const Source<TB>& b, int64_t steps,
                           unsigned char* smem, typename P::Acc& acc) {
  using S = typename P::S;
  P::Zero(acc);
  if (steps <= 0) return;
  typename P::template ARegs<TA> ra;
  typename P::template BRegs<TB> rb;
  auto tile_a = [smem](int64_t s) {
    return reinterpret_cast<S*>(smem + s % 2 * P::kStageBytes);
  };
  auto tile_b = [smem](int64_t s) {
    return reinterpret_cast<S*>(smem + s % 2 * P::kStageBytes + P::kABytes);
  };
  ra.Load(a, 0, P::kBK);
  rb.Load(b, 0, P::kBK);
  ra.template Store<P::kTransposeA>(a, 0, P::kBK, tile_a(0), P::kLdA);
  rb.template Store<P::kTransposeB>(b, 0, P::kBK, tile_b(0), P::kLdB);
  __syncthreads();
  for (int64_t s = 0; s < steps; ++s) {
    const bool next = s + 1 < steps;
    if (next) {
      ra.Load(a, s + 1, P::kBK);
      rb.Load(b, s + 1, P::kBK);
    }
    P::Multiply(tile_a(s), tile_b(s), acc);
    if (next) {
      ra.template Store<P::kTransposeA>(a, s + 1, P::kBK, tile_a(s + 1), P::kLdA);
      rb.template Store<P::kTransposeB>(b, s + 1, P::kBK, tile_b(s + 1), P::kLdB);
    }
    __syncthreads();  // stage s read by all; stage s + 1 written by all
  }
}

// Accumulate's result (the same shared tiles, so the same bits) for operands that TileCopies
// carries (both in P's tile type, both CopiesAligned): the tiles of K step s go to stage
// s % P::kStages by cp.async, kAhead = P::kStages - 1 - kInFlight steps ahead of the products,
// where kInFlight (0, or P::kInFlight for wgmma tiles) steps' products may still run when a
// step ends. Step s: wait for this thread's copies of step s (all but the newest kAhead - 1
// groups), a barrier (everyone's copies landed; everyone is done with step s - 1 - kInFlight,
// whose stage the next copies overwrite), issue step s + kAhead, multiply step s. Every thread
// commits one group per step, empty past the last, so the wait counts stay uniform. Ends with
// no copy or product in flight and the stages free for the epilogue. Under wgmma (P::kWgmma)
// each thread also fences its landed copies for the async proxy that the products read
// shared memory through, before the barrier.
template <class P>
__host__ __device__ constexpr int InFlightOf() {
  if constexpr (P::kWgmma) {
    return P::kInFlight;
  } else {
    return 0;
  }
}
template <class P, typename T>
__device__ void AccumulateAsync(const Source<T>& a, const Source<T>& b, int64_t steps,
                                unsigned char* smem, typename P::Acc& acc) {
  static_assert(std::is_same_v<T, typename P::S>, "cp.async copies the tiles as they are");
  using CopiesA = typename P::ACopies;
  using CopiesB = typename P::BCopies;
  constexpr int kAhead = P::kStages - 1 - InFlightOf<P>();
  static_assert(kAhead >= 1, "a stage for the copies in flight");
  P::Zero(acc);
  if (steps <= 0) return;
  auto tile_a = [smem](int64_t s) {
    return reinterpret_cast<T*>(smem + s % P::kStages * P::kStageBytes);
  };
  auto tile_b = [smem](int64_t s) {
    return reinterpret_cast<T*>(smem + s % P::kStages * P::kStageBytes + P::kABytes);
  };
  auto issue = [&](int64_t s) {
    if (s < steps) {
      CopiesA::Issue(a, s, P::kBK, tile_a(s), P::kLdA);
      CopiesB::Issue(b, s, P::kBK, tile_b(s), P::kLdB);
    }
    __pipeline_commit();
  };
#pragma unroll
  for (int s = 0; s < kAhead; ++s) issue(s);
  for (int64_t s = 0; s < steps; ++s) {
    __pipeline_wait_prior(kAhead - 1);
    if constexpr (P::kWgmma) FenceProxyAsync();
    __syncthreads();
    issue(s + kAhead);
    P::Multiply(tile_a(s), tile_b(s), acc);
  }
  if constexpr (P::kWgmma) P::Finish(acc);
  __pipeline_wait_prior(0);  // only empty groups are left
  __syncthreads();           // every warp is done with the stages
}

// Inclusive sum of v over the CTA's threads in thread order (Hillis-Steele through `buf`,
// 2 kThreads ints of shared memory); `total` gets the sum of all. Every thread calls it.
__device__ inline int InclusiveScan(int v, int* buf, int& total) {
  const int t = threadIdx.x;
  int* src = buf;
  int* dst = buf + kThreads;
  src[t] = v;
  __syncthreads();
  for (int d = 1; d < kThreads; d *= 2) {
    dst[t] = t >= d ? src[t] + src[t - d] : src[t];
    __syncthreads();
    int* swap = src;
    src = dst;
    dst = swap;
  }
  const int sum = src[t];
  total = src[kThreads - 1];
  __syncthreads();  // buf may be written again
  return sum;
}

// The forward's row tile number `tile`: the groups' rows cut into tiles of kBM in group order
// (group g has ceil(rows_g / kBM), the last one partial). group < 0: past the last tile.
struct RowTile {
  int64_t group, row0, row1;  // rows [row0, row1) of x and out; row1 - row0 <= kBM
};

// The groups are scanned kThreads at a time (any number of groups), stopping at the chunk
// that holds the tile. Every thread calls it and gets the same answer.
template <class P, bool kAsync>
__device__ RowTile FindRowTile(const int64_t* offsets, int64_t groups, int64_t tile,
                               unsigned char* smem) {
  int* scan = reinterpret_cast<int*>(smem + Smem<P, kAsync>::kScan);
  int64_t* found = reinterpret_cast<int64_t*>(smem + Smem<P, kAsync>::kFound);
  if (threadIdx.x == 0) found[0] = -1;
  int64_t before = 0;  // tiles of the groups before this chunk
  for (int64_t g0 = 0; g0 < groups && before <= tile; g0 += kThreads) {
    const int64_t g = g0 + threadIdx.x;
    int64_t begin = 0, end = 0;
    if (g < groups) begin = offsets[g], end = offsets[g + 1];
    const int count = static_cast<int>(CeilDiv(end - begin, kBM));
    int total = 0;
    const int64_t first = before + InclusiveScan(count, scan, total) - count;
    if (tile >= first && tile < first + count) {
      found[0] = g;
      found[1] = begin + (tile - first) * kBM;
      found[2] = end;
    }
    before += total;
  }
  __syncthreads();
  const int64_t row0 = found[1];
  const int64_t row1 = found[2] - row0 < kBM ? found[2] : row0 + kBM;
  return {found[0], row0, row1};
}

// The CTA order over a (tiles_m, tiles_n) grid: bands of kBand row tiles, each band column by
// column, so the CTAs running at once share a few panels of each operand in L2.
struct TileCoord {
  int64_t m, n;
};
__device__ inline TileCoord BandOrder(int64_t cta, int64_t tiles_m, int64_t tiles_n) {
  const int64_t per_band = kBand * tiles_n, first = cta / per_band * kBand;
  const int64_t height = tiles_m - first < kBand ? tiles_m - first : kBand;
  const int64_t in_band = cta % per_band;
  return {first + in_band % height, in_band / height};
}

// out[group rows] = alpha x[group rows] op(w[g]) + beta out[group rows], or with f.h set the
// fused bias + GELU epilogue into f.h and f.kept (out unused). Grid: MaxRowTiles(d) x
// ceil(n / P::kTileN) CTAs in band order; a CTA past the last row tile returns at once.
template <class P, typename TX, typename TW, bool kTransW, bool kAsync = false>
__global__ void __launch_bounds__(kThreads, kAsync ? P::kCtasPerSm : 1)
    GroupedGemmKernel(const TX* __restrict__ x, const int64_t* __restrict__ offsets,
                      const TW* __restrict__ w, float* __restrict__ out, Dims d, float alpha,
                      float beta, BiasGelu f) {
  static_assert(kAsync || !P::kWgmma, "the wgmma tiles take the cp.async pipeline");
  extern __shared__ __align__(128) unsigned char smem[];
  const TileCoord tc = BandOrder(blockIdx.x, MaxRowTiles(d), CeilDiv(d.n, P::kTileN));
  const RowTile rt = FindRowTile<P, kAsync>(offsets, d.groups, tc.m, smem);
  if (rt.group < 0) return;
  const int64_t n0 = tc.n * P::kTileN, rows = rt.row1 - rt.row0;
  const Source<TX> a{x + rt.row0 * d.k, d.k, rows, d.k, false, VecAligned(x, d.k)};
  const TW* wg = w + rt.group * d.k * d.n;
  const Source<TW> b =
      kTransW ? Source<TW>{wg + n0 * d.k, d.k, d.n - n0, d.k, false, VecAligned(w, d.k)}
              : Source<TW>{wg + n0, d.n, d.k, d.n - n0, true, VecAligned(w, d.n)};
  typename P::Acc acc;
  if constexpr (kAsync) {
    AccumulateAsync<P>(a, b, CeilDiv(d.k, P::kBK), StagesOf<P>(smem), acc);
  } else {
    Accumulate<P>(a, b, CeilDiv(d.k, P::kBK), smem, acc);
  }
  const int64_t origin = rt.row0 * d.n + n0;
  const Output o = f.h == nullptr
                       ? Output{out + origin, d.n, rows, d.n - n0}
                       : Output{nullptr, d.n, rows, d.n - n0,
                                {f.bias + rt.group * d.n + n0, f.h + origin, f.kept + origin}};
  P::Epilogue(acc, o, alpha, beta, smem);
}

// dw[g] = alpha x[group g]^T dy[group g] + beta dw[g]. Grid: (ceil(k / kBM) ceil(n / P::kTileN)
// in band order, groups); a CTA loops over its group's rows, the products' K.
template <class P, typename TX, typename TD, bool kAsync = false>
__global__ void __launch_bounds__(kThreads, kAsync ? P::kCtasPerSm : 1)
    GroupedWeightGradKernel(const TX* __restrict__ x, const TD* __restrict__ dy,
                            const int64_t* __restrict__ offsets, float* __restrict__ dw, Dims d,
                            float alpha, float beta) {
  static_assert(kAsync || !P::kWgmma, "the wgmma tiles take the cp.async pipeline");
  extern __shared__ __align__(128) unsigned char smem[];
  const int64_t g = blockIdx.y;
  const TileCoord tc = BandOrder(blockIdx.x, CeilDiv(d.k, kBM), CeilDiv(d.n, P::kTileN));
  const int64_t m0 = tc.m * kBM, n0 = tc.n * P::kTileN;
  const int64_t r0 = offsets[g], rows = offsets[g + 1] - r0;
  const Source<TX> a{x + r0 * d.k + m0, d.k, rows, d.k - m0, true, VecAligned(x, d.k)};
  const Source<TD> b{dy + r0 * d.n + n0, d.n, rows, d.n - n0, true, VecAligned(dy, d.n)};
  typename P::Acc acc;
  if constexpr (kAsync) {
    AccumulateAsync<P>(a, b, CeilDiv(rows, P::kBK), StagesOf<P>(smem), acc);
  } else {
    Accumulate<P>(a, b, CeilDiv(rows, P::kBK), smem, acc);
  }
  const Output o{dw + g * d.k * d.n + m0 * d.n + n0, d.n, d.k - m0, d.n - n0};
  P::Epilogue(acc, o, alpha, beta, smem);
}

}  // namespace switchyard::kernels::cuda::grouped
