// CUDA implementation of kernels/gemm.h's device-sized grouped products: one tiled kernel per
// call that reads the groups' offsets itself, so the host never waits for them (no copy, no
// synchronisation). The device code is kernels/cuda/grouped_gemm_kernels.cuh.
//
// Tiles: a CTA of 256 threads (8 warps) computes a 128 x 128 tile of the output.
//  - bf16 mode: tensor cores (mma.sync.m16n8k16 on fragments that ldmatrix reads from the
//    shared tiles, f32 accumulators in registers, written straight to global memory), K steps
//    of 32; warp w owns a 64 x 32 sub-tile (4 x 4 tiles of 16 x 8). f32 operands are rounded
//    to bf16 (nearest even) as they are stored into shared memory, bf16 ones copied: no
//    converted copy in global memory.
//  - f32 mode: f32 SIMT products (fmaf, no TF32), K steps of 16; each thread an 8 x 8 block.
// Pipeline, for two bf16 operands with 16-byte aligned rows (training under bf16 storage: the
// gathered rows, the kept h, the once-converted gradients, the weights' shadows): cp.async
// copies each K step's tiles straight into shared memory, 16 bytes a thread at a time and
// zero-filling the chunks out of bounds, kStages = 3 stages deep (two steps in flight while
// one is multiplied), one barrier per step; these kernels take 128 registers (ptxas, sm_90,
// no spills), so two CTAs share an SM (__launch_bounds__(256, 2); 52-62 KiB of shared memory
// each). Otherwise (an f32 operand, or rows cp.async cannot carry) the next K step's tiles are
// loaded from global memory into registers (16-byte loads where the rows allow them, each
// warp reading whole rows or 512 contiguous bytes of one, in the dimension that is
// contiguous: x along k, w along n, or along k when
// transposed, dy along n) while the current step is multiplied from one of two shared stages;
// then they are converted and stored into the other stage; one barrier per step. An edge tile
// (the last K step or column tile when k or n is off the tile, or rows that 16-byte loads
// cannot read) is read element by element as it is stored, without the prefetch. Shared rows
// are padded (+8 bf16, +4 f32) against bank conflicts.
//
//   GroupedGemmKernel       grid MaxRowTiles x ceil(n / 128), in bands of 8 row tiles (the CTAs
//                           running together share a few panels of x and w in L2). The host
//                           does not know the group sizes, so it launches the most row tiles
//                           any split can need, (R + min(G, R) (128 - 1)) / 128 (each group
//                           wastes at most one partial tile); each CTA scans the offsets (256
//                           groups at a time) for its (group, tile) and returns when it has
//                           none. Rows from offsets[G] on are never written.
//   GroupedWeightGradKernel grid (ceil(k / 128) ceil(n / 128) in bands, G): each CTA loops over
//                           its group's rows (the product's K) in steps; a group with no rows
//                           gets beta dw[g] (0 for beta = 0, dw not read).
// ptxas (sm_90): the register-pipeline tensor-core kernels take 200-235 registers, so one
// 256-thread CTA runs per SM (a cap of 128 registers, for two, spills: the prefetch registers),
// the SIMT ones 155-175; no local memory.
// Hopper tiles (SWITCHYARD_GROUPED_WGMMA=1 in an sm_90a build;
// kernels/cuda/grouped_gemm_hopper.cuh): the same grid and cp.async pipeline with 128 x 128
// tiles, K steps of 64, the shared tiles in wgmma's 128-byte swizzled layout, and each
// warpgroup's 64 x 128 half of the tile computed by wgmma.mma_async.m64n128k16 from shared
// memory; 3 stages of 32 KiB, two CTAs per SM.
// Every element of a tile is one f32 sum over K of exact bf16 products (or f32 fmas), so the
// results differ from the CPU reference (kernels/cpu/gemm.cc) only in the summation order.
// GroupedGemmBiasGelu runs the forward kernels with a fused epilogue (grouped::BiasGelu): each
// element, as it leaves the accumulators, gets its group's bias, and the tile writes bf16
// GELU and bf16 pre-activation instead of f32: the experts' first projection under bf16
// activation storage writes 4 bytes an element once, where the product then the bias kernel
// wrote 4, read 4 and wrote 4 more.
#include <cuda_pipeline_primitives.h>

#include <climits>
#include <type_traits>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/grouped_gemm_kernels.cuh"
#include "kernels/gemm.h"

namespace switchyard::kernels::cuda {
namespace {

using grouped::CeilDiv;
using grouped::Dims;
using grouped::kBM;
using grouped::kThreads;
template <bool kAKm, bool kBNk>
using TensorCore = grouped::TensorCoreTiles<kAKm, kBNk>;
template <bool kAKm, bool kBNk>
using Simt = grouped::SimtTiles<kAKm, kBNk>;

// The element pointer of a f32 or bf16 tensor as the kernels read it.
template <typename T>
const T* Elements(const Tensor& t) {
  return static_cast<const T*>(t.raw_data());
}

// Shared memory of a kernel on policy P: the two-stage kernels fit the default 48 KiB, the
// cp.async ones (P::kStages stages: up to 62 KiB for the 128 x 128 tiles, 156 KiB for the wide
// ones) ask for more.
template <class P, bool kAsync>
constexpr int SharedBytes() {
  static_assert(kAsync || grouped::Smem<P>::kBytes <= 48 * 1024, "no opt-in shared memory");
  return grouped::Smem<P, kAsync>::kBytes;
}


// The kernels index a tile in ints: the most rows a tile copies (256, the wide tiles' B of
// the transposed weight, each k wide) of the widest operand must fit one.
constexpr int kMostTileRows = 256;
static_assert(kMostTileRows >= kBM && kMostTileRows >= grouped::kBN, "a tile of more rows than checked");
void CheckWidths(const Dims& d, const char* op) {
  SY_CHECK(d.k <= INT_MAX / kMostTileRows && d.n <= INT_MAX / kMostTileRows)
      << op << ": k = " << d.k << " or n = " << d.n << " is too wide for the tiled kernel";
}

// Whether this build holds the wgmma kernels: CMake defines SWITCHYARD_WGMMA=1 when it compiles
// the CUDA code for sm_90a alone (the architecture-specific code wgmma needs).
#ifndef SWITCHYARD_WGMMA
#define SWITCHYARD_WGMMA 0
#endif
constexpr bool kWgmmaBuilt = SWITCHYARD_WGMMA != 0;

// The cp.async kernels' tiles, read once from the environment:
//  - kNarrow: 128 x 128 on mma.sync, two CTAs per SM (the default);
//  - kWide (SWITCHYARD_GROUPED_WIDE=1): 128 x 256 on mma.sync, P::Wide. Measured on the H200
//    (2026-11-30): within 2% of the narrow at d 1024's expert shapes (32768 rows) and 4% ahead
//    at Mixtral's, but the weight gradient 43% slower at 8192 rows (749 us against 523: its K,
//    a group's rows, is a few steps of 64 on one CTA per SM);
//  - kHopper (SWITCHYARD_GROUPED_WGMMA=1, sm_90a builds): 128 x 128 on wgmma, P::Hopper
//    (kernels/cuda/grouped_gemm_hopper.cuh), or with SWITCHYARD_GROUPED_WIDE=1 too, kHopperWide:
//    128 x 256, P::Hopper::Wide. Not yet run on a GPU, so not the default.
enum class CopyTiles { kNarrow, kWide, kHopper, kHopperWide };
CopyTiles ChosenCopyTiles() {
  static const CopyTiles tiles = [] {
    const bool wide = EnvSwitch("SWITCHYARD_GROUPED_WIDE", false);
    if (EnvSwitch("SWITCHYARD_GROUPED_WGMMA", false)) {
      if (kWgmmaBuilt) return wide ? CopyTiles::kHopperWide : CopyTiles::kHopper;
      SY_LOG(WARNING) << "SWITCHYARD_GROUPED_WGMMA=1 ignored: the CUDA code was not compiled for "
                         "sm_90a alone (CMAKE_CUDA_ARCHITECTURES=90a)";
    }
    return wide ? CopyTiles::kWide : CopyTiles::kNarrow;
  }();
  return tiles;
}

// Calls fn(tag of the tiles chosen) for the cp.async kernels on the mma.sync tiles P.
template <typename T>
struct TilesTag {
  using type = T;
};
template <class P, typename F>
void WithCopyTiles(F&& fn) {
  switch (ChosenCopyTiles()) {
    case CopyTiles::kHopper:
      if constexpr (kWgmmaBuilt) return fn(TilesTag<typename P::Hopper>{});
      break;
    case CopyTiles::kHopperWide:
      if constexpr (kWgmmaBuilt) return fn(TilesTag<typename P::Hopper::Wide>{});
      break;
    case CopyTiles::kWide:
      return fn(TilesTag<typename P::Wide>{});
    case CopyTiles::kNarrow:
      break;
  }
  fn(TilesTag<P>{});
}

// out: f32, or unused (null) with the fused epilogue f.
template <class P, typename TX, typename TW, bool kTransW, bool kAsync>
void LaunchForwardOn(const Tensor& x, const Tensor& offsets, const Tensor& w, float* out,
                     const grouped::BiasGelu& f, const Dims& d, float alpha, float beta,
                     DeviceContext* ctx) {
  const int64_t ctas = grouped::MaxRowTiles(d) * CeilDiv(d.n, P::kTileN);
  SY_CHECK(ctas <= INT_MAX) << "GroupedGemm: " << ctas << " CTAs exceed the grid's x limit";
  constexpr int bytes = SharedBytes<P, kAsync>();
  const auto kernel = grouped::GroupedGemmKernel<P, TX, TW, kTransW, kAsync>;
  AllowSharedMemory(kernel, bytes);
  kernel<<<static_cast<unsigned>(ctas), kThreads, bytes, StreamOf(ctx)>>>(
      Elements<TX>(x), offsets.data<int64_t>(), Elements<TW>(w), out, d, alpha, beta, f);
  SY_CUDA_CHECK_LAUNCH();
}

template <class P, typename TX, typename TW, bool kTransW>
void LaunchForward(const Tensor& x, const Tensor& offsets, const Tensor& w, float* out,
                   const grouped::BiasGelu& f, const Dims& d, float alpha, float beta,
                   DeviceContext* ctx) {
  CheckWidths(d, "GroupedGemm");
  if constexpr (grouped::kBothBf16<TX, TW>) {
    if (grouped::UseCopies(Elements<TX>(x), d.k, Elements<TW>(w), kTransW ? d.k : d.n)) {
      return WithCopyTiles<P>([&](auto tiles) {
        using Q = typename decltype(tiles)::type;
        LaunchForwardOn<Q, TX, TW, kTransW, true>(x, offsets, w, out, f, d, alpha, beta, ctx);
      });
    }
  }
  LaunchForwardOn<P, TX, TW, kTransW, false>(x, offsets, w, out, f, d, alpha, beta, ctx);
}

template <class P, typename TX, typename TD, bool kAsync>
void LaunchWeightGradOn(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                        const Dims& d, float alpha, float beta, DeviceContext* ctx) {
  const int64_t tiles = CeilDiv(d.k, kBM) * CeilDiv(d.n, P::kTileN);
  SY_CHECK(tiles <= INT_MAX && d.groups <= 65535)
      << "GroupedGemmWeightGrad: " << tiles << " tiles of " << d.groups
      << " groups exceed the grid's limits (x 2^31 - 1, y 65535)";
  const dim3 grid(static_cast<unsigned>(tiles), static_cast<unsigned>(d.groups));
  constexpr int bytes = SharedBytes<P, kAsync>();
  const auto kernel = grouped::GroupedWeightGradKernel<P, TX, TD, kAsync>;
  AllowSharedMemory(kernel, bytes);
  kernel<<<grid, kThreads, bytes, StreamOf(ctx)>>>(Elements<TX>(x), Elements<TD>(dy),
                                                   offsets.data<int64_t>(), dw.data<float>(), d,
                                                   alpha, beta);
  SY_CUDA_CHECK_LAUNCH();
}

template <class P, typename TX, typename TD>
void LaunchWeightGrad(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                      const Dims& d, float alpha, float beta, DeviceContext* ctx) {
  CheckWidths(d, "GroupedGemmWeightGrad");
  if constexpr (grouped::kBothBf16<TX, TD>) {
    if (grouped::UseCopies(Elements<TX>(x), d.k, Elements<TD>(dy), d.n)) {
      return WithCopyTiles<P>([&](auto tiles) {
        using Q = typename decltype(tiles)::type;
        LaunchWeightGradOn<Q, TX, TD, true>(x, dy, offsets, dw, d, alpha, beta, ctx);
      });
    }
  }
  LaunchWeightGradOn<P, TX, TD, false>(x, dy, offsets, dw, d, alpha, beta, ctx);
}

// The forward for operand types TX, TW: tensor cores in bf16 mode, SIMT in f32 mode (both
// operands f32 there: kernels/gemm.cc resolves a bf16 operand to bf16 mode).
template <typename TX, typename TW>
void Forward(const Tensor& x, const Tensor& offsets, const Tensor& w, bool trans_w, float* out,
             const grouped::BiasGelu& f, const Dims& d, float alpha, float beta, bool bf16,
             DeviceContext* ctx) {
  if (bf16) {
    if (trans_w) {
      LaunchForward<TensorCore<false, true>, TX, TW, true>(x, offsets, w, out, f, d, alpha,
                                                           beta, ctx);
    } else {
      LaunchForward<TensorCore<false, false>, TX, TW, false>(x, offsets, w, out, f, d, alpha,
                                                             beta, ctx);
    }
    return;
  }
  if constexpr (std::is_same_v<TX, float> && std::is_same_v<TW, float>) {
    if (trans_w) {
      LaunchForward<Simt<false, true>, float, float, true>(x, offsets, w, out, f, d, alpha, beta,
                                                           ctx);
    } else {
      LaunchForward<Simt<false, false>, float, float, false>(x, offsets, w, out, f, d, alpha,
                                                             beta, ctx);
    }
  } else {
    SY_LOG(FATAL) << "GroupedGemm: a bf16 operand in f32 mode (kernels/gemm.cc resolves it)";
  }
}

template <typename TX, typename TD>
void WeightGrad(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                const Dims& d, float alpha, float beta, bool bf16, DeviceContext* ctx) {
  if (bf16) {
    LaunchWeightGrad<TensorCore<true, false>, TX, TD>(x, dy, offsets, dw, d, alpha, beta, ctx);
    return;
  }
  if constexpr (std::is_same_v<TX, float> && std::is_same_v<TD, float>) {
    LaunchWeightGrad<Simt<true, false>, float, float>(x, dy, offsets, dw, d, alpha, beta, ctx);
  } else {
    SY_LOG(FATAL) << "GroupedGemmWeightGrad: a bf16 operand in f32 mode";
  }
}

struct F32Tag {
  using type = float;
};
struct Bf16Tag {
  using type = __nv_bfloat16;
};

// Calls fn(tag of a's element type, tag of b's): f32 or bf16.
template <typename F>
void ForTypes(const Tensor& a, const Tensor& b, F&& fn) {
  const bool a16 = a.dtype() == DType::kBF16, b16 = b.dtype() == DType::kBF16;
  if (a16 && b16) return fn(Bf16Tag{}, Bf16Tag{});
  if (a16) return fn(Bf16Tag{}, F32Tag{});
  if (b16) return fn(F32Tag{}, Bf16Tag{});
  fn(F32Tag{}, F32Tag{});
}

}  // namespace

void GroupedGemm(const Tensor& x, const Tensor& offsets, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha, float beta, DType matmul_dtype, DeviceContext* ctx) {
  const Dims d{x.dim(0), x.dim(1), out.dim(1), w.dim(0)};
  // No rows or no columns: nothing to write. k = 0 runs the kernel with no K step: it writes
  // beta out on the groups' rows only (the host does not know where they end).
  if (d.rows == 0 || d.n == 0 || d.groups == 0) return;
  const bool bf16 = matmul_dtype == DType::kBF16;
  ForTypes(x, w, [&](auto tx, auto tw) {
    using TX = typename decltype(tx)::type;
    using TW = typename decltype(tw)::type;
    Forward<TX, TW>(x, offsets, w, trans_w, out.data<float>(), grouped::BiasGelu{}, d, alpha,
                    beta, bf16, ctx);
  });
}

void GroupedGemmBiasGelu(const Tensor& x, const Tensor& offsets, const Tensor& w,
                         const Tensor& bias, Tensor& h, Tensor& kept, DType matmul_dtype,
                         DeviceContext* ctx) {
  const Dims d{x.dim(0), x.dim(1), h.dim(1), w.dim(0)};
  if (d.rows == 0 || d.n == 0 || d.groups == 0) return;
  const grouped::BiasGelu f{bias.data<float>(), static_cast<__nv_bfloat16*>(h.raw_data()),
                            static_cast<__nv_bfloat16*>(kept.raw_data())};
  const bool bf16 = matmul_dtype == DType::kBF16;
  ForTypes(x, w, [&](auto tx, auto tw) {
    using TX = typename decltype(tx)::type;
    using TW = typename decltype(tw)::type;
    Forward<TX, TW>(x, offsets, w, /*trans_w=*/false, nullptr, f, d, 1.0f, 0.0f, bf16, ctx);
  });
}

void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, const Tensor& offsets, Tensor& dw,
                           float alpha, float beta, DType matmul_dtype, DeviceContext* ctx) {
  const Dims d{x.dim(0), x.dim(1), dy.dim(1), dw.dim(0)};
  if (d.k == 0 || d.n == 0 || d.groups == 0) return;  // dw is empty
  // R = 0 still launches: every group is empty and gets beta dw[g].
  const bool bf16 = matmul_dtype == DType::kBF16;
  ForTypes(x, dy, [&](auto tx, auto td) {
    using TX = typename decltype(tx)::type;
    using TD = typename decltype(td)::type;
    WeightGrad<TX, TD>(x, dy, offsets, dw, d, alpha, beta, bf16, ctx);
  });
}

}  // namespace switchyard::kernels::cuda
