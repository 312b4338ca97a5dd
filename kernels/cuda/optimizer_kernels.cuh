// The device code of the optimizer kernels (kernels/cuda/optimizer.cu, which launches them and
// describes the design): AdamW, SGD and scale per element, their multi-tensor forms over chunk
// tables, and the sums of squares of the gradient norm; with the host code that forms their
// arguments and launch shapes (AdamW's scalars, the chunk tables, the grids), shared by the .cu
// and by tests/kernels/optimizer_emulation_test.cc. Include after
// kernels/cuda/device_common.cuh.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/optimizer.h"

namespace switchyard::kernels::cuda::optimizer {
// Internal linkage: the emulation test compiles these kernels too, and links with optimizer.cu's.
namespace {

constexpr int kThreads = 256;       // single-tensor kernels
constexpr int kChunkThreads = 512;  // multi-tensor kernels: one block per chunk
constexpr int64_t kChunk = 65536;   // elements per multi-tensor chunk
constexpr int kMaxSumBlocks = 1024;

// ---- launch shapes (host) ------------------------------------------------------------------

// Blocks of SumSquaresKernel over n > 0 elements: 16 per thread, at most max_blocks
// (kMaxSumBlocks; the test lowers it).
inline unsigned SumSquaresBlocks(int64_t n, int64_t max_blocks = kMaxSumBlocks) {
  return static_cast<unsigned>(
      std::clamp<int64_t>((n + kThreads * 16 - 1) / (kThreads * 16), 1, max_blocks));
}

// Calls emit(offset, length) for the chunks of a tensor of n elements, in order.
template <typename Emit>
void ForEachChunk(int64_t n, Emit emit) {
  for (int64_t offset = 0; offset < n; offset += kChunk) emit(offset, std::min(kChunk, n - offset));
}

// ---- AdamW ---------------------------------------------------------------------------------

// The scalars shared by every element of one update (hp and AdamWScalarsOf, as the CPU).
struct AdamWConsts {
  float b1, b2, one_minus_b1, one_minus_b2, eps, step_size, bc2_sqrt, grad_scale;
};

inline AdamWConsts ConstsOf(const AdamWStep& hp) {
  const AdamWScalars s = AdamWScalarsOf(hp, hp.weight_decay);
  return {hp.beta1,  hp.beta2,    1.0f - hp.beta1, 1.0f - hp.beta2,
          hp.eps,    s.step_size, s.bc2_sqrt,      hp.grad_scale};
}

// g <- grad_scale g; m <- b1 m + (1 - b1) g; v <- b2 v + ((1 - b2) g) g;
// p <- p decay - (step_size m) / (sqrt(v) / bc2_sqrt + eps), on values: m and v updated in
// place, the new p returned.
__device__ __forceinline__ float AdamWValue(float p, float g, float& m, float& v, float decay,
                                            const AdamWConsts& c) {
  const float gi = __fmul_rn(g, c.grad_scale);
  m = __fadd_rn(__fmul_rn(c.b1, m), __fmul_rn(c.one_minus_b1, gi));
  v = __fadd_rn(__fmul_rn(c.b2, v), __fmul_rn(__fmul_rn(c.one_minus_b2, gi), gi));
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(v), c.bc2_sqrt), c.eps);
  return __fsub_rn(__fmul_rn(p, decay), __fdiv_rn(__fmul_rn(c.step_size, m), denom));
}

// The same on element i of the arrays. Returns the new p.
__device__ __forceinline__ float AdamWElement(float* p, const float* g, float* m, float* v,
                                              int64_t i, float decay, const AdamWConsts& c) {
  float mi = m[i], vi = v[i];
  const float pi = AdamWValue(p[i], g[i], mi, vi, decay, c);
  m[i] = mi;
  v[i] = vi;
  p[i] = pi;
  return pi;
}

// p, g, m, v (n): GridFor(n, kThreads) blocks of kThreads.
__global__ void AdamWKernel(float* p, const float* g, float* m, float* v, int64_t n, float decay,
                            AdamWConsts c) {
  SY_GRID_STRIDE(i, n) { AdamWElement(p, g, m, v, i, decay, c); }
}

struct AdamWChunk {
  float* p;
  const float* g;
  float* m;
  float* v;
  int64_t n;    // elements in this chunk, 1..kChunk
  float decay;  // 1 - lr * weight_decay of the chunk's tensor
  __nv_bfloat16* p16;  // the tensor's bf16 weight shadow, which gets the new p; or null
};

// Appends the chunks of one tensor of n elements (decay: its AdamWScalarsOf(...).decay; p16:
// its shadow or null).
inline void AppendAdamWChunks(float* p, const float* g, float* m, float* v, int64_t n,
                              float decay, __nv_bfloat16* p16, std::vector<AdamWChunk>& chunks) {
  ForEachChunk(n, [&](int64_t offset, int64_t length) {
    chunks.push_back({p + offset, g + offset, m + offset, v + offset, length, decay,
                      p16 != nullptr ? p16 + offset : nullptr});
  });
}

// Whether a chunk's arrays take four elements a thread: n a multiple of 4, p, g, m, v on 16
// bytes and the shadow on 8 (the tensors' own alignment: a chunk starts kChunk elements on).
__device__ __forceinline__ bool AdamWQuads(const AdamWChunk& ch) {
  const uintptr_t f32 = reinterpret_cast<uintptr_t>(ch.p) | reinterpret_cast<uintptr_t>(ch.g) |
                        reinterpret_cast<uintptr_t>(ch.m) | reinterpret_cast<uintptr_t>(ch.v);
  return ch.n % 4 == 0 && f32 % 16 == 0 && reinterpret_cast<uintptr_t>(ch.p16) % 8 == 0;
}

// One block of kChunkThreads per chunk: four consecutive elements a thread (16-byte loads and
// stores, 8-byte shadow stores) where AdamWQuads, else one; the same expressions either way.
__global__ void AdamWChunksKernel(const AdamWChunk* chunks, AdamWConsts c) {
  const AdamWChunk ch = chunks[blockIdx.x];
  if (AdamWQuads(ch)) {
    for (int64_t i = 4 * static_cast<int64_t>(threadIdx.x); i < ch.n; i += 4 * blockDim.x) {
      const Vals<4> p = LoadVals<4>(ch.p + i), g = LoadVals<4>(ch.g + i);
      Vals<4> m = LoadVals<4>(ch.m + i), v = LoadVals<4>(ch.v + i), out;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        out.v[e] = AdamWValue(p.v[e], g.v[e], m.v[e], v.v[e], ch.decay, c);
      }
      StoreVals<4>(ch.m + i, m);
      StoreVals<4>(ch.v + i, v);
      StoreVals<4>(ch.p + i, out);
      if (ch.p16 != nullptr) StoreVals<4>(ch.p16 + i, out);
    }
    return;
  }
  for (int64_t i = threadIdx.x; i < ch.n; i += blockDim.x) {
    const float pi = AdamWElement(ch.p, ch.g, ch.m, ch.v, i, ch.decay, c);
    if (ch.p16 != nullptr) ch.p16[i] = ToBf16(pi);
  }
}

// ---- SGD and scale -------------------------------------------------------------------------

// momentum == 0: p <- p - lr (g + wd p). Otherwise d = g + wd p; b <- momentum b + d;
// p <- p - lr b. p, g, b (n): GridFor(n, kThreads) blocks of kThreads.
template <bool kMomentum>
__global__ void SgdKernel(float* p, const float* g, float* b, int64_t n, float lr, float momentum,
                          float weight_decay) {
  SY_GRID_STRIDE(i, n) {
    const float d = __fadd_rn(g[i], __fmul_rn(weight_decay, p[i]));
    if constexpr (kMomentum) {
      const float bi = __fadd_rn(__fmul_rn(momentum, b[i]), d);
      b[i] = bi;
      p[i] = __fsub_rn(p[i], __fmul_rn(lr, bi));
    } else {
      p[i] = __fsub_rn(p[i], __fmul_rn(lr, d));
    }
  }
}

// x (n): GridFor(n, kThreads) blocks of kThreads.
__global__ void ScaleKernel(float* x, int64_t n, float scale) {
  SY_GRID_STRIDE(i, n) { x[i] = __fmul_rn(x[i], scale); }
}

// One chunk of one tensor, for the scale and sum-of-squares tables.
struct Span {
  float* x;
  int64_t n;  // 1..kChunk
};

// Appends the chunks of one tensor of n elements.
inline void AppendSpans(float* x, int64_t n, std::vector<Span>& chunks) {
  ForEachChunk(n, [&](int64_t offset, int64_t length) { chunks.push_back({x + offset, length}); });
}

// One block of kChunkThreads per chunk.
__global__ void ScaleChunksKernel(const Span* chunks, float scale) {
  const Span ch = chunks[blockIdx.x];
  for (int64_t i = threadIdx.x; i < ch.n; i += blockDim.x) ch.x[i] = __fmul_rn(ch.x[i], scale);
}

// ---- sums of squares -----------------------------------------------------------------------

// partial[blockIdx.x] = sum over this block's grid-stride elements of x[i]^2.
// SumSquaresBlocks(n) blocks of kThreads.
__global__ void SumSquaresKernel(const float* x, int64_t n, double* partial) {
  __shared__ double shared[32];
  double acc = 0.0;
  SY_GRID_STRIDE(i, n) {
    const double xi = x[i];
    acc += xi * xi;
  }
  acc = BlockSum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

// partial[c] = sum of the squares of chunk c. One block of kChunkThreads per chunk.
__global__ void SumSquaresChunksKernel(const Span* chunks, double* partial) {
  __shared__ double shared[32];
  const Span ch = chunks[blockIdx.x];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < ch.n; i += blockDim.x) {
    const double xi = ch.x[i];
    acc += xi * xi;
  }
  acc = BlockSum(acc, shared);
  if (threadIdx.x == 0) partial[blockIdx.x] = acc;
}

}  // namespace
}  // namespace switchyard::kernels::cuda::optimizer
