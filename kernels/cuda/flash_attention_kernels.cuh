// The device code of the fused attention kernel (kernels/cuda/flash_attention.cu, which
// launches it): tiles, tensor-core products, the forward and the two backward kernels. See
// that file for the design. Include it after <mma.h> and kernels/cuda/common.cuh (ToBf16,
// kFullMask); it uses nothing else of CUDA's but the built-ins (threadIdx, __syncthreads,
// __shfl_xor_sync, expf, the __f*_rn intrinsics) and nvcuda::wmma's fragments, so the same
// source can also be compiled against a host model of those
// (tests/kernels/flash_attention_emulation_test.cc).
#pragma once

#include <cstdint>
#include <type_traits>

#include "kernels/flash_attention.h"

namespace switchyard::kernels::cuda::flash {

namespace wmma = nvcuda::wmma;
using Bf16 = __nv_bfloat16;

constexpr int kBr = static_cast<int>(kFlashBlockQ);  // query rows per tile
constexpr int kBc = static_cast<int>(kFlashBlockK);  // keys per tile
constexpr int kThreads = 128;                        // 4 warps
constexpr int kFrag = 16;                            // wmma m = n = k
static_assert(kBr == 4 * kFrag && kBc == 4 * kFrag, "warp w owns 16 rows of a 64-row tile");
static_assert(kThreads == 2 * kBr, "two threads per softmax row");

using FragA = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, Bf16, wmma::row_major>;
using FragAT = wmma::fragment<wmma::matrix_a, kFrag, kFrag, kFrag, Bf16, wmma::col_major>;
using FragB = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, Bf16, wmma::row_major>;
using FragBT = wmma::fragment<wmma::matrix_b, kFrag, kFrag, kFrag, Bf16, wmma::col_major>;
using FragC = wmma::fragment<wmma::accumulator, kFrag, kFrag, kFrag, float>;

// Shared-memory leading dimensions (elements), padded against bank conflicts. wmma needs a
// multiple of 8 for bf16 and of 4 for f32, and 32-byte aligned fragment pointers: every tile
// below starts at a multiple of 32 bytes and 16 rows of any of them are a multiple of 32 bytes.
template <int HD>
struct Ld {
  static constexpr int kH = HD + 8;   // bf16 (rows, HD) tiles: q, k, v, dout
  static constexpr int kP = kBc + 8;  // bf16 (kBr, kBc) tiles: p, ds
  static constexpr int kS = kBc + 4;  // f32 (kBr, kBc) tiles: scores, dp
  static constexpr int kO = HD + 4;   // f32 (64, HD) staging of a product's result
};

// Bytes of a bf16 (64, HD) tile, of a bf16 (64, 64) tile and of the f32 region.
template <int HD>
struct Sizes {
  static constexpr int kHTile = kBr * Ld<HD>::kH * 2;
  static constexpr int kPTile = kBr * Ld<HD>::kP * 2;
  static constexpr int kSTile = kBr * Ld<HD>::kS * 4;
  static constexpr int kOTile = kBr * Ld<HD>::kO * 4;
  // Forward: q, k, v, p, then one f32 region for the scores and then the pv product.
  static constexpr int kForward = 3 * kHTile + kPTile + (kSTile > kOTile ? kSTile : kOTile);
  // Backward: q, dout, k, v, p, ds, the f32 region (scores and dp, or the staging of a
  // result), then lse and delta of the query rows.
  static constexpr int kF32Region = 2 * kSTile > kOTile ? 2 * kSTile : kOTile;
  static constexpr int kBackward = 4 * kHTile + 2 * kPTile + kF32Region + 2 * kBr * 4;
  static_assert(kHTile % 32 == 0 && kPTile % 32 == 0 && kSTile % 32 == 0, "alignment");
};

struct Dims {
  int s, hq, hkv;
  __host__ __device__ int group() const { return hq / hkv; }
};

// Rows [r0, r0 + 64) of one head of a (B, S, H, HD) f32 tensor, `base` at (b, 0, head, 0)
// with row stride ld, into a bf16 (64, HD) tile (leading dimension Ld::kH); rows >= s are 0.
// Consecutive threads read consecutive elements of a row.
template <int HD>
__device__ void LoadTile(const float* base, int64_t ld, int r0, int s, Bf16* tile) {
  for (int idx = threadIdx.x; idx < kBr * HD; idx += kThreads) {
    const int r = idx / HD, e = idx % HD;
    const float x = r0 + r < s ? base[static_cast<int64_t>(r0 + r) * ld + e] : 0.0f;
    tile[r * Ld<HD>::kH + e] = ToBf16(x);
  }
}

// c (64, 64) f32 = a (64, HD) b^T: warp w computes rows [16 w, 16 w + 16) of c, a and b
// bf16 tiles with leading dimension Ld::kH, c with leading dimension Ld::kS.
template <int HD>
__device__ void ProductABt(const Bf16* a, const Bf16* b, float* c) {
  const int warp = threadIdx.x / 32;
  FragC acc[kBc / kFrag];
  for (int n = 0; n < kBc / kFrag; ++n) wmma::fill_fragment(acc[n], 0.0f);
  for (int kk = 0; kk < HD; kk += kFrag) {
    FragA fa;
    wmma::load_matrix_sync(fa, a + warp * kFrag * Ld<HD>::kH + kk, Ld<HD>::kH);
    for (int n = 0; n < kBc / kFrag; ++n) {
      FragBT fb;  // b^T (HD, 64) is b read column-major
      wmma::load_matrix_sync(fb, b + n * kFrag * Ld<HD>::kH + kk, Ld<HD>::kH);
      wmma::mma_sync(acc[n], fa, fb, acc[n]);
    }
  }
  for (int n = 0; n < kBc / kFrag; ++n) {
    wmma::store_matrix_sync(c + warp * kFrag * Ld<HD>::kS + n * kFrag, acc[n], Ld<HD>::kS,
                            wmma::mem_row_major);
  }
}

// acc[n] (16 rows of warp w, columns [16 n, 16 n + 16) of a (64, HD) result) += x y, with
// x (64, 64) bf16 (leading dimension Ld::kP) read row-major, or transposed (x^T) when
// kTransX, and y (64, HD) bf16 (leading dimension Ld::kH).
template <int HD, bool kTransX>
__device__ void AccumulateXY(const Bf16* x, const Bf16* y, FragC (&acc)[HD / kFrag]) {
  const int warp = threadIdx.x / 32;
  for (int kk = 0; kk < kBc; kk += kFrag) {
    // x: rows [16 w, 16 w + 16), columns [kk, kk + 16); x^T: x's rows [kk, kk + 16),
    // columns [16 w, 16 w + 16).
    using FragX = typename std::conditional<kTransX, FragAT, FragA>::type;
    FragX fx;
    if constexpr (kTransX) {
      wmma::load_matrix_sync(fx, x + kk * Ld<HD>::kP + warp * kFrag, Ld<HD>::kP);
    } else {
      wmma::load_matrix_sync(fx, x + warp * kFrag * Ld<HD>::kP + kk, Ld<HD>::kP);
    }
    for (int n = 0; n < HD / kFrag; ++n) {
      FragB fy;
      wmma::load_matrix_sync(fy, y + kk * Ld<HD>::kH + n * kFrag, Ld<HD>::kH);
      wmma::mma_sync(acc[n], fx, fy, acc[n]);
    }
  }
}

// Stores warp w's accumulators (rows [16 w, 16 w + 16) of a (64, HD) result) times `scale`
// into an f32 staging tile (leading dimension Ld::kO).
template <int HD>
__device__ void StoreScaled(FragC (&acc)[HD / kFrag], float scale, float* staging) {
  const int warp = threadIdx.x / 32;
  for (int n = 0; n < HD / kFrag; ++n) {
    for (int t = 0; t < acc[n].num_elements; ++t) acc[n].x[t] = __fmul_rn(acc[n].x[t], scale);
    wmma::store_matrix_sync(staging + warp * kFrag * Ld<HD>::kO + n * kFrag, acc[n], Ld<HD>::kO,
                            wmma::mem_row_major);
  }
}

// Rows [r0, r0 + 64) of an f32 staging tile into one head of a (B, S, H, HD) tensor, `base` at
// (b, 0, head, 0) with row stride ld; rows >= s are dropped. Call after a __syncthreads().
template <int HD>
__device__ void WriteRows(const float* staging, int r0, int s, float* base, int64_t ld) {
  for (int idx = threadIdx.x; idx < kBr * HD; idx += kThreads) {
    const int r = idx / HD, e = idx % HD;
    if (r0 + r < s) base[static_cast<int64_t>(r0 + r) * ld + e] = staging[r * Ld<HD>::kO + e];
  }
}

__device__ __forceinline__ bool Sees(bool causal, int i, int j) { return !causal || j <= i; }

// Key blocks the query block starting at i0 visits, [0, n) (kCausal: up to its last row).
__device__ __forceinline__ int KeyBlocksOf(int s, bool causal, int i0) {
  const int keys = causal ? min(s, i0 + kBr) : s;
  return (keys + kBc - 1) / kBc;
}

// One thread pair's online-softmax step for query row `row` (global index i) over the key
// block at j0, the thread owning columns [half 32, half 32 + 32) of the scores in sf: writes
// bf16(exp(x - m_new)) into sp, updates the running max m and sum l, and returns the factor
// alpha = exp(m_old - m_new) that rescales the row's earlier accumulators.
template <int HD>
__device__ __forceinline__ float OnlineSoftmaxStep(const float* sf, Bf16* sp, int row, int half,
                                                   int i, int j0, int s, bool causal,
                                                   float scale, float& m, float& l) {
  using L = Ld<HD>;
  constexpr int kCols = kBc / 2;
  float x[kCols];
  float block_max = -INFINITY;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const int col = half * kCols + c, j = j0 + col;
    x[c] = j < s && Sees(causal, i, j) ? __fmul_rn(sf[row * L::kS + col], scale) : -INFINITY;
    block_max = fmaxf(block_max, x[c]);
  }
  block_max = fmaxf(block_max, __shfl_xor_sync(kFullMask, block_max, 1));
  const float m_new = fmaxf(m, block_max);
  const float shift = m_new == -INFINITY ? 0.0f : m_new;  // a row with no key yet
  const float alpha = expf(__fsub_rn(m, shift));
  float row_sum = 0.0f;
#pragma unroll
  for (int c = 0; c < kCols; ++c) {
    const float e = expf(__fsub_rn(x[c], shift));
    row_sum = __fadd_rn(row_sum, e);
    sp[row * L::kP + half * kCols + c] = ToBf16(e);
  }
  row_sum = __fadd_rn(row_sum, __shfl_xor_sync(kFullMask, row_sum, 1));
  l = __fadd_rn(__fmul_rn(l, alpha), row_sum);
  m = m_new;
  return alpha;
}

// out: f32, or bf16 (TO; each value rounded as stored: the output projection's operand under
// bf16 activation storage).
template <int HD, typename TO = float>
__global__ void __launch_bounds__(kThreads)
    FlashForwardKernel(const float* __restrict__ q, const float* __restrict__ k,
                       const float* __restrict__ v, TO* __restrict__ out,
                       float* __restrict__ lse, Dims d, bool causal, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  using L = Ld<HD>;
  using Z = Sizes<HD>;
  Bf16* sq = reinterpret_cast<Bf16*>(smem);
  Bf16* sk = reinterpret_cast<Bf16*>(smem + Z::kHTile);
  Bf16* sv = reinterpret_cast<Bf16*>(smem + 2 * Z::kHTile);
  Bf16* sp = reinterpret_cast<Bf16*>(smem + 3 * Z::kHTile);
  float* sf = reinterpret_cast<float*>(smem + 3 * Z::kHTile + Z::kPTile);  // scores, then pv

  // The longest query blocks (causal) first.
  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int g = h / d.group(), i0 = qb * kBr;
  const int64_t ldq = static_cast<int64_t>(d.hq) * HD, ldkv = static_cast<int64_t>(d.hkv) * HD;
  const float* qh = q + static_cast<int64_t>(b) * d.s * ldq + static_cast<int64_t>(h) * HD;
  const float* kh = k + static_cast<int64_t>(b) * d.s * ldkv + static_cast<int64_t>(g) * HD;
  const float* vh = v + static_cast<int64_t>(b) * d.s * ldkv + static_cast<int64_t>(g) * HD;

  const int row = threadIdx.x / 2, half = threadIdx.x % 2, i = i0 + row;
  constexpr int kOut = HD / 2;  // a thread's out columns (and half the score columns)
  float m = -INFINITY, l = 0.0f;
  float acc[kOut];
#pragma unroll
  for (int e = 0; e < kOut; ++e) acc[e] = 0.0f;

  LoadTile<HD>(qh, ldq, i0, d.s, sq);
  const int blocks = KeyBlocksOf(d.s, causal, i0);
  for (int kb = 0; kb < blocks; ++kb) {
    const int j0 = kb * kBc;
    __syncthreads();  // the previous block's readers of sk, sv, sp and sf are done
    LoadTile<HD>(kh, ldkv, j0, d.s, sk);
    LoadTile<HD>(vh, ldkv, j0, d.s, sv);
    __syncthreads();
    ProductABt<HD>(sq, sk, sf);  // (64, 64) q^ k^T
    __syncthreads();
    const float alpha = OnlineSoftmaxStep<HD>(sf, sp, row, half, i, j0, d.s, causal, scale, m, l);
    __syncthreads();  // p written; the scores in sf are no longer read
    // pv (64, HD) = bf16(p) v^, staged in sf.
    {
      FragC pv[HD / kFrag];
      for (int n = 0; n < HD / kFrag; ++n) wmma::fill_fragment(pv[n], 0.0f);
      AccumulateXY<HD, false>(sp, sv, pv);
      StoreScaled<HD>(pv, 1.0f, sf);
    }
    __syncthreads();
#pragma unroll
    for (int e = 0; e < kOut; ++e) {
      acc[e] = __fadd_rn(__fmul_rn(acc[e], alpha), sf[row * L::kO + half * kOut + e]);
    }
  }
  if (i < d.s) {
    TO* orow = out + static_cast<int64_t>(b) * d.s * ldq + static_cast<int64_t>(i) * ldq +
               static_cast<int64_t>(h) * HD + half * kOut;
#pragma unroll
    for (int e = 0; e < kOut; ++e) StoreAs(orow, e, __fdiv_rn(acc[e], l));
    if (half == 0) {
      lse[(static_cast<int64_t>(b) * d.hq + h) * d.s + i] = __fadd_rn(m, logf(l));
    }
  }
}

// Shared-memory tiles of the backward kernels.
template <int HD>
struct BackwardSmem {
  Bf16 *q, *dout, *k, *v, *p, *ds;
  float *s, *dp, *staging, *lse, *delta;

  __device__ explicit BackwardSmem(unsigned char* base) {
    using Z = Sizes<HD>;
    q = reinterpret_cast<Bf16*>(base);
    dout = reinterpret_cast<Bf16*>(base + Z::kHTile);
    k = reinterpret_cast<Bf16*>(base + 2 * Z::kHTile);
    v = reinterpret_cast<Bf16*>(base + 3 * Z::kHTile);
    p = reinterpret_cast<Bf16*>(base + 4 * Z::kHTile);
    ds = reinterpret_cast<Bf16*>(base + 4 * Z::kHTile + Z::kPTile);
    unsigned char* f32 = base + 4 * Z::kHTile + 2 * Z::kPTile;
    s = reinterpret_cast<float*>(f32);
    dp = reinterpret_cast<float*>(f32 + Z::kSTile);
    staging = s;  // the result staging reuses the scores and dp once they are done
    lse = reinterpret_cast<float*>(f32 + Z::kF32Region);
    delta = lse + kBr;
  }
};

// Loads the query block's q, dout (bf16), lse and delta (rows >= s: 0). `row_stats` points at
// (b, h, 0) of the (B, Hq, S) lse and delta.
template <int HD>
__device__ void LoadQueryBlock(const BackwardSmem<HD>& t, const float* qh, const float* doh,
                               int64_t ldq, const float* lse_bh, const float* delta_bh, int i0,
                               int s) {
  LoadTile<HD>(qh, ldq, i0, s, t.q);
  LoadTile<HD>(doh, ldq, i0, s, t.dout);
  for (int r = threadIdx.x; r < kBr; r += kThreads) {
    t.lse[r] = i0 + r < s ? lse_bh[i0 + r] : 0.0f;
    t.delta[r] = i0 + r < s ? delta_bh[i0 + r] : 0.0f;
  }
}

// With q, dout, k, v, lse and delta of the tile loaded: s = q^ k^T, dp = do^ v^T, then
//   p = exp(s scale - lse) (0 where masked or past S), t.p = bf16(p), t.ds = bf16(p (dp - delta)).
// Begins and ends with the block's threads in step.
template <int HD>
__device__ void ComputeBackwardTile(const BackwardSmem<HD>& t, int i0, int j0, int s, bool causal,
                                    float scale) {
  using L = Ld<HD>;
  __syncthreads();
  ProductABt<HD>(t.q, t.k, t.s);
  ProductABt<HD>(t.dout, t.v, t.dp);
  __syncthreads();
  for (int idx = threadIdx.x; idx < kBr * kBc; idx += kThreads) {
    const int r = idx / kBc, c = idx % kBc, i = i0 + r, j = j0 + c;
    float p = 0.0f;
    if (i < s && j < s && Sees(causal, i, j)) {
      p = expf(__fsub_rn(__fmul_rn(t.s[r * L::kS + c], scale), t.lse[r]));
    }
    t.p[r * L::kP + c] = ToBf16(p);
    t.ds[r * L::kP + c] = ToBf16(__fmul_rn(p, __fsub_rn(t.dp[r * L::kS + c], t.delta[r])));
  }
  __syncthreads();
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardKvKernel(const float* __restrict__ q, const float* __restrict__ k,
                          const float* __restrict__ v, const float* __restrict__ lse,
                          const float* __restrict__ dout, const float* __restrict__ delta,
                          float* __restrict__ dk, float* __restrict__ dv, Dims d, bool causal,
                          float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<HD> t(smem);
  const int kb = blockIdx.x, g = blockIdx.y, b = blockIdx.z, j0 = kb * kBc;
  const int64_t ldq = static_cast<int64_t>(d.hq) * HD, ldkv = static_cast<int64_t>(d.hkv) * HD;
  const int64_t kv_off = static_cast<int64_t>(b) * d.s * ldkv + static_cast<int64_t>(g) * HD;
  LoadTile<HD>(k + kv_off, ldkv, j0, d.s, t.k);
  LoadTile<HD>(v + kv_off, ldkv, j0, d.s, t.v);
  FragC dk_acc[HD / kFrag], dv_acc[HD / kFrag];
  for (int n = 0; n < HD / kFrag; ++n) {
    wmma::fill_fragment(dk_acc[n], 0.0f);
    wmma::fill_fragment(dv_acc[n], 0.0f);
  }
  const int q_blocks = (d.s + kBr - 1) / kBr;
  const int first = causal ? j0 / kBr : 0;  // query blocks wholly above the diagonal skipped
  for (int h = g * d.group(); h < (g + 1) * d.group(); ++h) {
    const int64_t q_off = static_cast<int64_t>(b) * d.s * ldq + static_cast<int64_t>(h) * HD;
    const int64_t stat_off = (static_cast<int64_t>(b) * d.hq + h) * d.s;
    for (int qb = first; qb < q_blocks; ++qb) {
      const int i0 = qb * kBr;
      __syncthreads();  // the previous tile's readers of q, dout, p, ds are done
      LoadQueryBlock<HD>(t, q + q_off, dout + q_off, ldq, lse + stat_off, delta + stat_off, i0,
                         d.s);
      ComputeBackwardTile<HD>(t, i0, j0, d.s, causal, scale);
      // dv (64 keys, HD) += bf16(p)^T do^;  dk += bf16(ds)^T q^.
      AccumulateXY<HD, true>(t.p, t.dout, dv_acc);
      AccumulateXY<HD, true>(t.ds, t.q, dk_acc);
    }
  }
  __syncthreads();  // the last tile's s and dp are done: staging reuses them
  StoreScaled<HD>(dk_acc, scale, t.staging);
  __syncthreads();
  WriteRows<HD>(t.staging, j0, d.s, dk + kv_off, ldkv);
  __syncthreads();
  StoreScaled<HD>(dv_acc, 1.0f, t.staging);
  __syncthreads();
  WriteRows<HD>(t.staging, j0, d.s, dv + kv_off, ldkv);
}

template <int HD>
__global__ void __launch_bounds__(kThreads)
    FlashBackwardQKernel(const float* __restrict__ q, const float* __restrict__ k,
                         const float* __restrict__ v, const float* __restrict__ lse,
                         const float* __restrict__ dout, const float* __restrict__ delta,
                         float* __restrict__ dq, Dims d, bool causal, float scale) {
  extern __shared__ __align__(128) unsigned char smem[];
  const BackwardSmem<HD> t(smem);
  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int g = h / d.group(), i0 = qb * kBr;
  const int64_t ldq = static_cast<int64_t>(d.hq) * HD, ldkv = static_cast<int64_t>(d.hkv) * HD;
  const int64_t q_off = static_cast<int64_t>(b) * d.s * ldq + static_cast<int64_t>(h) * HD;
  const int64_t kv_off = static_cast<int64_t>(b) * d.s * ldkv + static_cast<int64_t>(g) * HD;
  const int64_t stat_off = (static_cast<int64_t>(b) * d.hq + h) * d.s;
  LoadQueryBlock<HD>(t, q + q_off, dout + q_off, ldq, lse + stat_off, delta + stat_off, i0, d.s);
  FragC dq_acc[HD / kFrag];
  for (int n = 0; n < HD / kFrag; ++n) wmma::fill_fragment(dq_acc[n], 0.0f);
  const int blocks = KeyBlocksOf(d.s, causal, i0);
  for (int kb = 0; kb < blocks; ++kb) {
    const int j0 = kb * kBc;
    __syncthreads();  // the previous tile's readers of k, v, ds are done
    LoadTile<HD>(k + kv_off, ldkv, j0, d.s, t.k);
    LoadTile<HD>(v + kv_off, ldkv, j0, d.s, t.v);
    ComputeBackwardTile<HD>(t, i0, j0, d.s, causal, scale);
    // dq (64 rows, HD) += bf16(ds) k^.
    AccumulateXY<HD, false>(t.ds, t.k, dq_acc);
  }
  __syncthreads();
  StoreScaled<HD>(dq_acc, scale, t.staging);
  __syncthreads();
  WriteRows<HD>(t.staging, i0, d.s, dq + q_off, ldq);
}

}  // namespace switchyard::kernels::cuda::flash
