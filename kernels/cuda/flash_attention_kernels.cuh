// The device code of the fused attention kernels (kernels/cuda/flash_attention.cu launches
// them; the design is there): the masks, the online softmax, the forward and the two backward
// kernels; their tiles, fragments and products are kernels/cuda/flash_attention_tiles.cuh.
// Include it after kernels/cuda/common.cuh (ToBf16, kFullMask, MmaBf16 and the fragment
// helpers of kernels/cuda/device_common.cuh); it uses nothing else of CUDA's but the built-ins
// (threadIdx, __syncthreads, __shfl_xor_sync, fmaf, logf, the __f*_rn intrinsics, and the
// ex2.approx instruction, which the host model replaces by exp2), so the same source also
// compiles against the host model of those (tests/kernels/flash_attention_emulation_test.cc).
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/cuda/flash_attention_tiles.cuh"

namespace switchyard::kernels::cuda::flash {

// 2^x by the SFU's approximation (PTX ex2.approx.ftz.f32: relative error within 2^-22, results
// below 2^-126 flushed to 0): one instruction where expf takes about ten. The host model
// computes exp2 in the C library.
__device__ __forceinline__ float Exp2(float x) {
#ifdef __CUDA_ARCH__
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

__device__ __forceinline__ bool Sees(bool causal, int i, int j) { return !causal || j <= i; }

// Key blocks the query block starting at i0 visits, [0, n) (kCausal: up to its last row).
__device__ __forceinline__ int KeyBlocksOf(int s, bool causal, int i0) {
  const int keys = causal ? min(s, i0 + kBr) : s;
  return (keys + kBc - 1) / kBc;
}

// Whether keys [j0, j0 + keys) are all < s and seen by every query from i_lo on (then a warp's
// tile needs no mask; the caller adds what it needs of the queries).
__device__ __forceinline__ bool Unmasked(int s, bool causal, int i_lo, int j0, int keys) {
  return j0 + keys <= s && (!causal || j0 + keys - 1 <= i_lo);
}

// The online-softmax step of the warp's query rows over the key block at j0, in base 2
// (kernels/flash_attention.h). s holds the rows' unscaled scores x = q^ k^T (row g in
// registers 0, 1 and row g + 8 in 2, 3 of every n tile; i the two rows' global indices); on
// return it holds p = exp2(fma(x, c, -mc)) in f32 with mc = f32(m_new c), the running max m
// (of x) and sum l are updated, and alpha = exp2(f32(m_old - m_new) c) rescales the rows'
// accumulators (exactly 1 while the max stays, 0 before the row's first key). A row's four
// lanes (t = 0..3) combine their max and sum with two shuffles.
// kMasked = false: the caller knows that every key of the block is < seq and visible to every
// row of the warp (Unmasked below), so no element is tested.
template <bool kMasked>
__device__ __forceinline__ void OnlineSoftmaxStep(float (&s)[kBc / 8][4], const int (&i)[2],
                                                  int j0, int seq, bool causal, float c,
                                                  float (&m)[2], float (&l)[2],
                                                  float (&alpha)[2]) {
  const int t = threadIdx.x % 4;
#pragma unroll
  for (int half = 0; half < 2; ++half) {
    float block_max = -INFINITY;
#pragma unroll
    for (int n = 0; n < kBc / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int j = j0 + 8 * n + 2 * t + e;
        float& x = s[n][2 * half + e];
        if (kMasked && !(j < seq && Sees(causal, i[half], j))) x = -INFINITY;
        block_max = fmaxf(block_max, x);
      }
    }
    block_max = fmaxf(block_max, __shfl_xor_sync(kFullMask, block_max, 1));
    block_max = fmaxf(block_max, __shfl_xor_sync(kFullMask, block_max, 2));
    const float m_new = fmaxf(m[half], block_max);
    const bool none = m_new == -INFINITY;  // a row with no key yet
    const float mc = none ? 0.0f : __fmul_rn(m_new, c);
    alpha[half] = none ? 0.0f : Exp2(__fmul_rn(__fsub_rn(m[half], m_new), c));
    float row_sum = 0.0f;
#pragma unroll
    for (int n = 0; n < kBc / 8; ++n) {
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        float& x = s[n][2 * half + e];
        x = Exp2(fmaf(x, c, -mc));
        row_sum = __fadd_rn(row_sum, x);
      }
    }
    row_sum = __fadd_rn(row_sum, __shfl_xor_sync(kFullMask, row_sum, 1));
    row_sum = __fadd_rn(row_sum, __shfl_xor_sync(kFullMask, row_sum, 2));
    l[half] = __fadd_rn(__fmul_rn(l[half], alpha[half]), row_sum);
    m[half] = m_new;
  }
}

// The k and v tiles a kernel walks over key blocks with (the forward's and dq's), on their way
// into the shared tiles t and t + 1 (TileLoader): Start(j0, t) begins key block j0's (and
// commits its copies), Finish(j0, t) ends it, before the barrier that shows them.
template <int HD, typename TI, bool kAhead>
struct KeyValueTiles {
  const TI *k, *v;  // at (b, 0, kv head, 0)
  int64_t ld;
  int s;
  bool aligned;
  unsigned char* smem;
  TileLoader<HD, TI, kAhead> k_in{}, v_in{};

  __device__ __forceinline__ void Start(int j0, int t) {
    k_in.Start(k, ld, j0, s, aligned, TileAt<HD>(smem, t));
    v_in.Start(v, ld, j0, s, aligned, TileAt<HD>(smem, t + 1));
    k_in.Commit();
  }
  __device__ __forceinline__ void Finish(int j0, int t) {
    k_in.Finish(k, ld, j0, s, aligned, TileAt<HD>(smem, t));
    v_in.Finish(v, ld, j0, s, aligned, TileAt<HD>(smem, t + 1));
  }
};

// out: f32, or bf16 (TO; each value rounded as stored: the output projection's operand under
// bf16 activation storage).
template <int HD, typename TI = float, typename TO = float, bool kAhead = kPrefetch<HD>>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<HD, TI, kAhead>)
    FlashForwardKernel(const TI* __restrict__ q, const TI* __restrict__ k,
                       const TI* __restrict__ v, TO* __restrict__ out,
                       float* __restrict__ lse, Dims d, bool causal, Scale sc) {
  extern __shared__ __align__(128) unsigned char smem[];
  Bf16* sq = TileAt<HD>(smem, 0);  // then k, v of even key blocks (1, 2) and odd ones (3, 4)

  // The longest query blocks (causal) first.
  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int g = h / d.group(), i0 = qb * kBr;
  const int64_t ldq = static_cast<int64_t>(d.hq) * HD, ldkv = static_cast<int64_t>(d.hkv) * HD;
  const TI* qh = q + static_cast<int64_t>(b) * d.s * ldq + static_cast<int64_t>(h) * HD;
  const TI* kh = k + static_cast<int64_t>(b) * d.s * ldkv + static_cast<int64_t>(g) * HD;
  const TI* vh = v + static_cast<int64_t>(b) * d.s * ldkv + static_cast<int64_t>(g) * HD;

  const int row0 = (threadIdx.x / 32) * kWarpRows, lane = threadIdx.x % 32;
  const int i[2] = {i0 + row0 + lane / 4, i0 + row0 + lane / 4 + 8};
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};
  float acc[HD / 8][4];
  Zero(acc);

  // The first key block's k and v are fetched before q is loaded: their loads fly during q's.
  const int blocks = KeyBlocksOf(d.s, causal, i0);
  KeyValueTiles<HD, TI, kAhead> kv{kh, vh, ldkv, d.s, d.aligned, smem};
  kv.Start(0, 1);
  LoadTile<HD>(qh, ldq, i0, d.s, d.aligned, sq);
  kv.Finish(0, 1);
  __syncthreads();
  uint32_t qa[HD / 16][4];  // the warp's q rows, kept as a fragments
#pragma unroll
  for (int kk = 0; kk < HD / 16; ++kk) LoadA(sq, Ld<HD>::kH, row0, 16 * kk, qa[kk]);

  for (int kb = 0; kb < blocks; ++kb) {
    const int j0 = kb * kBc, cur = 1 + 2 * (kb % 2), other = 4 - cur;
    const Bf16 *sk = TileAt<HD>(smem, cur), *sv = TileAt<HD>(smem, cur + 1);
    const bool more = kb + 1 < blocks;
    // The next block's pair into the other buffers, last read in the previous block (before
    // the last barrier); the barrier below shows it to every warp and ends this block's reads.
    if (more) kv.Start(j0 + kBc, other);
    float s[kBc / 8][4];  // (16, 64) q^ k^T
    Zero(s);
    ProductFragments<HD>(qa, sk, s);
    float alpha[2];
    // Rows past S need no mask (never written): the forward tests only the keys.
    if (Unmasked(d.s, causal, i0 + row0, j0, kBc)) {
      OnlineSoftmaxStep<false>(s, i, j0, d.s, causal, sc.c, m, l, alpha);
    } else {
      OnlineSoftmaxStep<true>(s, i, j0, d.s, causal, sc.c, m, l, alpha);
    }
    Rescale(acc, alpha);
    ProductWeights<HD>(s, sv, acc);  // acc += bf16(p) v^
    if (more) kv.Finish(j0 + kBc, other);
    __syncthreads();
  }
  const float one[2] = {1.0f, 1.0f};  // acc already divided by l
#pragma unroll
  for (int half = 0; half < 2; ++half) {
#pragma unroll
    for (int n = 0; n < HD / 8; ++n) {
      acc[n][2 * half] = __fdiv_rn(acc[n][2 * half], l[half]);
      acc[n][2 * half + 1] = __fdiv_rn(acc[n][2 * half + 1], l[half]);
    }
    if (lane % 4 == 0 && i[half] < d.s) {
      lse[(static_cast<int64_t>(b) * d.hq + h) * d.s + i[half]] =
          __fadd_rn(__fmul_rn(m[half], sc.scale), logf(l[half]));
    }
  }
  WriteAccumulators<HD>(acc, one, i0 + row0, d.s,
                        out + static_cast<int64_t>(b) * d.s * ldq + static_cast<int64_t>(h) * HD,
                        ldq);
}

// The backward's per-tile weights, for one warp's (16, 64) scores s and dp (rows and columns
// as the caller's product made them; i and j of element (n, r) from `at`): s becomes
// p = exp2(fma(s, c, -lse2)) (0 where masked or past S; `at` gives the row's lse2 =
// f32(lse log2 e)) and dp becomes ds = p (dp - delta).
// kMasked = false: every (i, j) of the tile is in bounds and visible (no test).
template <bool kMasked, typename At>
__device__ __forceinline__ void BackwardWeights(float (&s)[kBc / 8][4], float (&dp)[kBc / 8][4],
                                                int seq, bool causal, float c, At at) {
#pragma unroll
  for (int n = 0; n < kBc / 8; ++n) {
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      int i, j;
      float row_lse2, row_delta;
      at(n, r, i, j, row_lse2, row_delta);
      float p = 0.0f;
      if (!kMasked || (i < seq && j < seq && Sees(causal, i, j))) {
        p = Exp2(fmaf(s[n][r], c, -row_lse2));
      }
      s[n][r] = p;
      dp[n][r] = __fmul_rn(p, __fsub_rn(dp[n][r], row_delta));
    }
  }
}

// The dk/dv kernel's lse2 and delta of tile buffer buf (kBr each), after its six tiles.
template <int HD>
__device__ __forceinline__ float* StatsAt(unsigned char* smem, int buf) {
  return reinterpret_cast<float*>(smem + 6 * Sizes<HD>::kRows + buf * Sizes<HD>::kStats);
}

// The query tiles the dk/dv kernel of key head g (batch b) walks: the group's query heads, each
// over its query blocks from `first` (causal: the blocks wholly above the diagonal skipped).
// Fetch(t, smem, buf) starts tile t's q and dout on their way (TileLoader) into buffer buf,
// tiles 2 + 2 buf and 3 + 2 buf, in flight during the previous tile's products, and loads its
// lse and delta, row threadIdx.x's (threads < kBr; 0 past S); Store(t, smem, buf) finishes
// them and stores lse as lse2 = f32(lse log2 e) and delta at StatsAt(buf).
template <int HD, typename TI, bool kAhead>
struct QueryTiles {
  const TI* q;
  const float *dout, *lse, *delta;
  Dims d;
  int b, g, first;
  TileLoader<HD, TI, kAhead> q_in{};
  TileLoader<HD, float, kAhead> do_in{};
  float lse_next = 0.0f, delta_next = 0.0f;

  __device__ int PerHead() const { return (d.s + kBr - 1) / kBr - first; }
  __device__ int Count() const { return d.group() * PerHead(); }
  __device__ int Head(int tile) const { return g * d.group() + tile / PerHead(); }
  __device__ int FirstRow(int tile) const { return (first + tile % PerHead()) * kBr; }
  __device__ int64_t Offset(int tile) const {
    return (static_cast<int64_t>(b) * d.s * d.hq + Head(tile)) * HD;
  }
  __device__ void Fetch(int tile, unsigned char* smem, int buf) {
    const int64_t ld = static_cast<int64_t>(d.hq) * HD;
    const int i0 = FirstRow(tile);
    q_in.Start(q + Offset(tile), ld, i0, d.s, d.aligned, TileAt<HD>(smem, 2 + 2 * buf));
    do_in.Start(dout + Offset(tile), ld, i0, d.s, d.aligned_dout, TileAt<HD>(smem, 3 + 2 * buf));
    q_in.Commit();
    const int r = threadIdx.x, i = i0 + r;
    const bool in = r < kBr && i < d.s;
    const int64_t at = (static_cast<int64_t>(b) * d.hq + Head(tile)) * d.s + i;
    lse_next = in ? lse[at] : 0.0f;
    delta_next = in ? delta[at] : 0.0f;
  }
  __device__ void Store(int tile, unsigned char* smem, int buf) {
    const int64_t ld = static_cast<int64_t>(d.hq) * HD;
    const int i0 = FirstRow(tile);
    q_in.Finish(q + Offset(tile), ld, i0, d.s, d.aligned, TileAt<HD>(smem, 2 + 2 * buf));
    do_in.Finish(dout + Offset(tile), ld, i0, d.s, d.aligned_dout, TileAt<HD>(smem, 3 + 2 * buf));
    if (threadIdx.x < kBr) {
      StatsAt<HD>(smem, buf)[threadIdx.x] = __fmul_rn(lse_next, kLog2e);
      StatsAt<HD>(smem, buf)[kBr + threadIdx.x] = delta_next;
    }
  }
};


// dk and dv of one key block (grid (key blocks, Hkv, B)): warp w owns keys [16 w, 16 w + 16)
// of the block and computes, per query block of each query head of the group,
//   s^T = k^ q^T, dp^T = v^ do^T (keys as rows), p^T and ds^T in registers, then
//   dv += bf16(p^T) do^ and dk += bf16(ds^T) q^ (the q and do tiles read transposed).
template <int HD, typename TI = float, bool kAhead = kPrefetch<HD>>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<HD, TI, kAhead>)
    FlashBackwardKvKernel(const TI* __restrict__ q, const TI* __restrict__ k,
                          const TI* __restrict__ v, const float* __restrict__ lse,
                          const float* __restrict__ dout, const float* __restrict__ delta,
                          float* __restrict__ dk, float* __restrict__ dv, Dims d, bool causal,
                          Scale sc) {
  extern __shared__ __align__(128) unsigned char smem[];
  // k, v, then q, dout of even tiles (2, 3) and odd ones (4, 5), then the two tiles' lse2 and
  // delta (kBr each).
  Bf16 *sk = TileAt<HD>(smem, 0), *sv = TileAt<HD>(smem, 1);

  const int kb = blockIdx.x, g = blockIdx.y, b = blockIdx.z, j0 = kb * kBc;
  const int64_t ldkv = static_cast<int64_t>(d.hkv) * HD;
  const int64_t kv_off = static_cast<int64_t>(b) * d.s * ldkv + static_cast<int64_t>(g) * HD;
  const int row0 = (threadIdx.x / 32) * kWarpRows, lane = threadIdx.x % 32, t = lane % 4;
  const int j[2] = {j0 + row0 + lane / 4, j0 + row0 + lane / 4 + 8};
  // On bf16 rows dout (f32) is loaded as it is stored, not fetched ahead into registers: the
  // kernel then fits 168 registers (3 CTAs an SM; ahead it spills 288 bytes at HD 64).
  constexpr bool kDoutAhead = kAhead && !std::is_same_v<TI, Bf16>;
  QueryTiles<HD, TI, kDoutAhead> walk{q, dout, lse, delta, d, b, g, causal ? j0 / kBr : 0};
  const int tiles = walk.Count();
  // The first tile's q and dout are fetched before k and v are loaded.
  if (tiles > 0) walk.Fetch(0, smem, 0);
  LoadTile<HD>(k + kv_off, ldkv, j0, d.s, d.aligned, sk);
  LoadTile<HD>(v + kv_off, ldkv, j0, d.s, d.aligned, sv);
  if (tiles > 0) walk.Store(0, smem, 0);
  __syncthreads();
  float dk_acc[HD / 8][4], dv_acc[HD / 8][4];
  Zero(dk_acc);
  Zero(dv_acc);
  for (int tile = 0; tile < tiles; ++tile) {
    const int i0 = walk.FirstRow(tile), buf = tile % 2;
    const Bf16 *sq = TileAt<HD>(smem, 2 + 2 * buf), *sdo = TileAt<HD>(smem, 3 + 2 * buf);
    const float *slse = StatsAt<HD>(smem, buf), *sdelta = slse + kBr;
    const bool more = tile + 1 < tiles;
    if (more) walk.Fetch(tile + 1, smem, 1 - buf);
    float st[kBr / 8][4], dpt[kBr / 8][4];  // (16 keys, 64 queries)
    Zero(st);
    Zero(dpt);
    ProductRows<HD>(sk, row0, sq, st);
    ProductRows<HD>(sv, row0, sdo, dpt);
    auto at = [&](int n, int r, int& i, int& jj, float& row_lse2, float& row_delta) {
      const int c = 8 * n + 2 * t + r % 2;  // the query's row in the block
      i = i0 + c;
      jj = j[r / 2];
      row_lse2 = slse[c];
      row_delta = sdelta[c];
    };
    // The warp's 16 keys against the block's 64 queries.
    if (i0 + kBr <= d.s && Unmasked(d.s, causal, i0, j0 + row0, kWarpRows)) {
      BackwardWeights<false>(st, dpt, d.s, causal, sc.c, at);
    } else {
      BackwardWeights<true>(st, dpt, d.s, causal, sc.c, at);
    }
    ProductWeights<HD>(st, sdo, dv_acc);  // dv += bf16(p)^T do^
    ProductWeights<HD>(dpt, sq, dk_acc);  // dk += bf16(ds)^T q^
    // The next tile into the other buffers (as in the forward).
    if (more) walk.Store(tile + 1, smem, 1 - buf);
    __syncthreads();
  }
  const float one[2] = {1.0f, 1.0f}, scaled[2] = {sc.scale, sc.scale};
  WriteAccumulators<HD>(dk_acc, scaled, j0 + row0, d.s, dk + kv_off, ldkv);
  WriteAccumulators<HD>(dv_acc, one, j0 + row0, d.s, dv + kv_off, ldkv);
}

// dq of one query block (grid (query blocks, Hq, B)): warp w owns rows [16 w, 16 w + 16) and
// computes, per key block the rows see, s = q^ k^T and dp = do^ v^T, p and ds in registers,
// then dq += bf16(ds) k^ (the k tile read transposed).
template <int HD, typename TI = float, bool kAhead = kPrefetch<HD>>
__global__ void __launch_bounds__(kThreads, kCtasPerSm<HD, TI, kAhead>)
    FlashBackwardQKernel(const TI* __restrict__ q, const TI* __restrict__ k,
                         const TI* __restrict__ v, const float* __restrict__ lse,
                         const float* __restrict__ dout, const float* __restrict__ delta,
                         float* __restrict__ dq, Dims d, bool causal, Scale sc) {
  extern __shared__ __align__(128) unsigned char smem[];
  // q, dout, then k, v of even key blocks (2, 3) and odd ones (4, 5).
  Bf16 *sq = TileAt<HD>(smem, 0), *sdo = TileAt<HD>(smem, 1);

  const int qb = gridDim.x - 1 - blockIdx.x, h = blockIdx.y, b = blockIdx.z;
  const int g = h / d.group(), i0 = qb * kBr;
  const int64_t ldq = static_cast<int64_t>(d.hq) * HD, ldkv = static_cast<int64_t>(d.hkv) * HD;
  const int64_t q_off = static_cast<int64_t>(b) * d.s * ldq + static_cast<int64_t>(h) * HD;
  const int64_t kv_off = static_cast<int64_t>(b) * d.s * ldkv + static_cast<int64_t>(g) * HD;
  const int64_t stat_off = (static_cast<int64_t>(b) * d.hq + h) * d.s;
  const int row0 = (threadIdx.x / 32) * kWarpRows, lane = threadIdx.x % 32, t = lane % 4;
  const int i[2] = {i0 + row0 + lane / 4, i0 + row0 + lane / 4 + 8};
  float row_lse2[2], row_delta[2];
  for (int half = 0; half < 2; ++half) {
    row_lse2[half] = i[half] < d.s ? __fmul_rn(lse[stat_off + i[half]], kLog2e) : 0.0f;
    row_delta[half] = i[half] < d.s ? delta[stat_off + i[half]] : 0.0f;
  }
  // The first key block's k and v are fetched before q and dout are loaded (see the forward).
  const int blocks = KeyBlocksOf(d.s, causal, i0);
  KeyValueTiles<HD, TI, kAhead> kv{k + kv_off, v + kv_off, ldkv, d.s, d.aligned, smem};
  kv.Start(0, 2);
  LoadTile<HD>(q + q_off, ldq, i0, d.s, d.aligned, sq);
  LoadTile<HD>(dout + q_off, ldq, i0, d.s, d.aligned_dout, sdo);
  kv.Finish(0, 2);
  __syncthreads();
  float dq_acc[HD / 8][4];
  Zero(dq_acc);
  for (int kb = 0; kb < blocks; ++kb) {
    const int j0 = kb * kBc, cur = 2 + 2 * (kb % 2), other = 6 - cur;
    const Bf16 *sk = TileAt<HD>(smem, cur), *sv = TileAt<HD>(smem, cur + 1);
    const bool more = kb + 1 < blocks;
    if (more) kv.Start(j0 + kBc, other);  // into the other buffers (as in the forward)
    float s[kBc / 8][4], dp[kBc / 8][4];  // (16 rows, 64 keys)
    Zero(s);
    Zero(dp);
    ProductRows<HD>(sq, row0, sk, s);
    ProductRows<HD>(sdo, row0, sv, dp);
    auto at = [&](int n, int r, int& ii, int& jj, float& l, float& dl) {
      ii = i[r / 2];
      jj = j0 + 8 * n + 2 * t + r % 2;
      l = row_lse2[r / 2];
      dl = row_delta[r / 2];
    };
    // The warp's 16 queries against the block's 64 keys.
    if (i0 + row0 + kWarpRows <= d.s && Unmasked(d.s, causal, i0 + row0, j0, kBc)) {
      BackwardWeights<false>(s, dp, d.s, causal, sc.c, at);
    } else {
      BackwardWeights<true>(s, dp, d.s, causal, sc.c, at);
    }
    ProductWeights<HD>(dp, sk, dq_acc);  // dq += bf16(ds) k^
    if (more) kv.Finish(j0 + kBc, other);
    __syncthreads();
  }
  const float scaled[2] = {sc.scale, sc.scale};
  WriteAccumulators<HD>(dq_acc, scaled, i0 + row0, d.s, dq + q_off, ldq);
}

}  // namespace switchyard::kernels::cuda::flash
