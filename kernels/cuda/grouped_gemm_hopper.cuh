// The grouped products' Hopper tiles (sm_90a): the same kernels, grid and cp.async pipeline as
// the mma.sync tiles (kernels/cuda/grouped_gemm_kernels.cuh), with the products on
// wgmma.mma_async (kernels/cuda/wgmma.cuh) read straight from the shared tiles: no fragment
// loads, no ldmatrix. kernels/cuda/grouped_gemm.cu takes them when SWITCHYARD_GROUPED_WGMMA=1
// and the kernels were compiled for sm_90a.
#pragma once

#include <cstdint>

#include "kernels/cuda/grouped_gemm_tiles.cuh"
#include "kernels/cuda/wgmma.cuh"

namespace switchyard::kernels::cuda::grouped {

// 128 x kN output tiles, K steps of 64: kN = 128, 3 cp.async stages of 32 KiB, two CTAs per
// SM (one CTA's barrier and copies while the other's products run), each K step's products
// waited for before the next; kN = 256 (Wide, SWITCHYARD_GROUPED_WIDE=1 with the wgmma
// tiles), 4 stages of 48 KiB, one CTA per SM, and a K step's products left in flight while the
// next step's are issued (kInFlight = 1; AccumulateAsync copies a step less ahead). The
// shared tiles are 128-byte swizzled (TileCopies<..., true>), in the orientation of their
// global operand, which the instruction's transpose flags name: A (kBM rows, kBK) K-major, or
// (kBK rows, kBM) MN-major when kAKm (the weight gradient's x^T); B (kTileN rows, kBK)
// K-major when kBNk (w transposed), else (kBK rows, kTileN) MN-major. Warpgroup w (threads
// 128 w to 128 w + 127) computes rows [64 w, +64) of the tile with m64nNk16 products (N = kN),
// four per K step; its accumulators are the instruction's kN / 2 registers.
template <bool kAKm, bool kBNk, int kN = 128>
struct HopperTiles {
  static_assert(kN == 128 || kN == 256, "64 x 128 or 64 x 256 a warpgroup");
  using S = Bf16;
  using Wide = HopperTiles<kAKm, kBNk, 256>;
  static constexpr int kBK = 64;
  static constexpr int kTileN = kN;
  static constexpr int kStages = kN == 256 ? 4 : 3, kCtasPerSm = kN == 256 ? 1 : 2;
  static constexpr int kInFlight = kN == 256 ? 1 : 0;  // K steps of products left running
  static constexpr int kAlign = 1024;  // the stages' shared address: whole swizzle atoms
  static constexpr bool kWgmma = true;
  static constexpr int kLdA = 0, kLdB = 0;  // the swizzled layout has no leading dimension
  static constexpr int kABytes = kBM * kBK * 2, kBBytes = kTileN * kBK * 2;
  static constexpr int kStageBytes = kABytes + kBBytes;
  static_assert(kStageBytes % kAlign == 0, "every stage starts on an atom");
  using ACopies = TileCopies<S, kAKm ? kBK : kBM, kAKm ? kBM : kBK, true>;
  using BCopies = TileCopies<S, kBNk ? kTileN : kBK, kBNk ? kBK : kTileN, true>;
  static constexpr uint32_t kRowBytes = 128;                   // a swizzled row: 64 bf16
  static constexpr uint32_t kBlockBytes = kBK * kRowBytes;     // an MN-major column block
  static constexpr uint32_t kGroupRows = 64 * kRowBytes;       // a warpgroup's 64 K-major rows
  static constexpr uint32_t kAtomBytes = 8 * kRowBytes;        // 8 rows
  struct Acc {
    float c[kN / 2];
  };

  __device__ static void Zero(Acc& acc) {
#pragma unroll
    for (int i = 0; i < kN / 2; ++i) acc.c[i] = 0.0f;
  }

  // acc += a b over one K step: four products of K 16, then the wait until at most kInFlight
  // steps' products run (their stages are refilled only after a later barrier; Finish waits
  // for the rest). K-major operands move 32 bytes along their
  // rows per 16 of K, MN-major ones two atoms (16 rows of K); the warpgroup's A is its 64 rows
  // (K-major) or its 64-column block (MN-major), both kGroupRows = kBlockBytes bytes on.
  __device__ static void Multiply(const S* a, const S* b, Acc& acc) {
    static_assert(kGroupRows == kBlockBytes, "one offset for either orientation of A");
    const uint32_t sa = SharedAddress(a) + threadIdx.x / 128 * kGroupRows;
    const uint32_t sb = SharedAddress(b);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBK / 16; ++kk) {
      const uint32_t mn_step = kk * 2 * kAtomBytes, k_step = kk * 32;  // MN- / K-major
      const uint64_t da = kAKm ? SwizzledDescriptor(sa + mn_step, kBlockBytes, kAtomBytes)
                               : SwizzledDescriptor(sa + k_step, 16, kAtomBytes);
      const uint64_t db = kBNk ? SwizzledDescriptor(sb + k_step, 16, kAtomBytes)
                               : SwizzledDescriptor(sb + mn_step, kBlockBytes, kAtomBytes);
      WgmmaM64N<kN, kAKm, !kBNk>(acc.c, da, db);
    }
    WgmmaCommit();
    WgmmaWait<kInFlight>();
  }
  __device__ static void Finish(Acc&) { WgmmaWait<0>(); }

  // Thread (warpgroup w, warp v in it, lane 4 g + t) holds rows 64 w + 16 v + g (+8) and
  // columns 8 j + 2 t (+1): wgmma.cuh's accumulator layout, written straight to global memory.
  __device__ static void Epilogue(Acc& acc, const Output& out, float alpha, float beta,
                                  unsigned char*) {
    const int lane = threadIdx.x % 32;
    const int m0 = threadIdx.x / 128 * 64 + threadIdx.x % 128 / 32 * 16 + lane / 4;
    const int n0 = 2 * (lane % 4);
#pragma unroll
    for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int row = m0 + 8 * (r / 2), col = n0 + 8 * j + r % 2;
        if (row < out.rows && col < out.cols) {
          Put(out, row, col, acc.c[4 * j + r], alpha, beta);
        }
      }
    }
  }
};

}  // namespace switchyard::kernels::cuda::grouped
