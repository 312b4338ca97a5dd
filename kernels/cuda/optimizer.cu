// CUDA implementation of kernels/optimizer.h.
//
// Per-element updates (AdamW, SGD, scale) evaluate the CPU reference's expressions
// (kernels/cpu/optimizer.cc) in the same order with __fmul_rn / __fadd_rn / __fsub_rn /
// __fdiv_rn / __fsqrt_rn: every operation is a correctly rounded f32 operation and none is
// contracted into a fused multiply-add, so the results equal the CPU's bit for bit.
//
// Single-tensor ops: grid-stride kernels, 256 threads, GridFor(n) blocks.
// Multi-tensor ops ("multi-tensor apply"): the host cuts every tensor into chunks of at
// most kChunk elements and writes one descriptor per chunk (pointers already offset to the
// chunk, its length, and per-tensor scalars); the table goes to the device in one
// cudaMemcpyAsync and one launch runs a 512-thread block per chunk. AdamWUpdateMany and
// AdamWUpdate share AdamWElement, so they agree bit for bit.
//
// Sums of squares: each thread accumulates x * x in double (exact products), a block sums
// its threads (BlockSum<double>) into one partial per block (single tensor: grid-stride,
// at most kMaxSumBlocks blocks; many: one block per chunk); the partials come back in one
// copy and the host adds them in order. The order depends on the sizes only: deterministic.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/optimizer.h"

namespace switchyard::kernels::cuda {
namespace {

constexpr int kThreads = 256;       // single-tensor kernels
constexpr int kChunkThreads = 512;  // multi-tensor kernels: one block per chunk
constexpr int64_t kChunk = 65536;   // elements per multi-tensor chunk
constexpr int kMaxSumBlocks = 1024;

// ---- AdamW ---------------------------------------------------------------------------------

// The scalars shared by every element of one update (hp and AdamWScalarsOf, as the CPU).
struct AdamWConsts {
  float b1, b2, one_minus_b1, one_minus_b2, eps, step_size, bc2_sqrt, grad_scale;
};

AdamWConsts ConstsOf(const AdamWStep& hp) {
  const AdamWScalars s = AdamWScalarsOf(hp, hp.weight_decay);
  return {hp.beta1,  hp.beta2,    1.0f - hp.beta1, 1.0f - hp.beta2,
          hp.eps,    s.step_size, s.bc2_sqrt,      hp.grad_scale};
}

// g <- grad_scale g; m <- b1 m + (1 - b1) g; v <- b2 v + ((1 - b2) g) g;
// p <- p decay - (step_size m) / (sqrt(v) / bc2_sqrt + eps).
__device__ __forceinline__ void AdamWElement(float* p, const float* g, float* m, float* v,
                                             int64_t i, float decay, const AdamWConsts& c) {
  const float gi = __fmul_rn(g[i], c.grad_scale);
  const float mi = __fadd_rn(__fmul_rn(c.b1, m[i]), __fmul_rn(c.one_minus_b1, gi));
  const float vi = __fadd_rn(__fmul_rn(c.b2, v[i]), __fmul_rn(__fmul_rn(c.one_minus_b2, gi), gi));
  m[i] = mi;
  v[i] = vi;
  const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(vi), c.bc2_sqrt), c.eps);
  p[i] = __fsub_rn(__fmul_rn(p[i], decay), __fdiv_rn(__fmul_rn(c.step_size, mi), denom));
}

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
};

__global__ void AdamWChunksKernel(const AdamWChunk* chunks, AdamWConsts c) {
  const AdamWChunk ch = chunks[blockIdx.x];
  for (int64_t i = threadIdx.x; i < ch.n; i += blockDim.x) {
    AdamWElement(ch.p, ch.g, ch.m, ch.v, i, ch.decay, c);
  }
}

// ---- SGD and scale -------------------------------------------------------------------------

// momentum == 0: p <- p - lr (g + wd p). Otherwise d = g + wd p; b <- momentum b + d;
// p <- p - lr b.
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

__global__ void ScaleKernel(float* x, int64_t n, float scale) {
  SY_GRID_STRIDE(i, n) { x[i] = __fmul_rn(x[i], scale); }
}

// One chunk of one tensor, for the scale and sum-of-squares tables.
struct Span {
  float* x;
  int64_t n;  // 1..kChunk
};

__global__ void ScaleChunksKernel(const Span* chunks, float scale) {
  const Span ch = chunks[blockIdx.x];
  for (int64_t i = threadIdx.x; i < ch.n; i += blockDim.x) ch.x[i] = __fmul_rn(ch.x[i], scale);
}

// ---- sums of squares -----------------------------------------------------------------------

// partial[blockIdx.x] = sum over this block's grid-stride elements of x[i]^2.
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

// partial[c] = sum of the squares of chunk c.
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

// ---- host helpers --------------------------------------------------------------------------

// Copies a host table to new device memory (`holder` keeps it) on ctx's stream. The table
// is pageable host memory, which cudaMemcpyAsync stages before returning, so the vector may
// be freed at once (in a CUDA graph capture, Tensor::CopyFrom copies it into pinned memory
// the graph keeps); `holder` goes back to the stream-ordered caching allocator when dropped,
// after the launch that reads it has been queued.
template <typename T>
const T* Upload(const std::vector<T>& table, Tensor& holder, DeviceContext* ctx) {
  const int64_t bytes = static_cast<int64_t>(table.size() * sizeof(T));
  holder = Tensor::Empty({bytes}, DType::kU8, ctx->device());
  const Tensor host =
      Tensor::Wrap(const_cast<T*>(table.data()), {bytes}, DType::kU8, Device::Cpu());
  holder.CopyFrom(host, ctx);
  return static_cast<const T*>(holder.raw_data());
}

// A device buffer of `count` doubles, held as an i64 tensor of the same size (written
// before DType::kF64 existed; the bytes are the same).
double* DoubleBuffer(int64_t count, Tensor& holder, DeviceContext* ctx) {
  holder = Tensor::Empty({count}, DType::kI64, ctx->device());
  return static_cast<double*>(holder.raw_data());
}

// Copies `count` doubles back and waits for the stream.
std::vector<double> Download(const double* device, int64_t count, DeviceContext* ctx) {
  std::vector<double> host(count);
  SY_CUDA_CHECK(cudaMemcpyAsync(host.data(), device, count * sizeof(double), cudaMemcpyDeviceToHost,
                                StreamOf(ctx)));
  SY_CUDA_CHECK(cudaStreamSynchronize(StreamOf(ctx)));
  return host;
}

// Calls emit(offset, length) for the chunks of a tensor of n elements, in order.
template <typename Emit>
void ForEachChunk(int64_t n, Emit emit) {
  for (int64_t offset = 0; offset < n; offset += kChunk) emit(offset, std::min(kChunk, n - offset));
}

}  // namespace

void AdamWUpdate(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                 const AdamWStep& hp, DeviceContext* ctx) {
  const int64_t n = param.numel();
  if (n == 0) return;
  const float decay = AdamWScalarsOf(hp, hp.weight_decay).decay;
  AdamWKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
      param.data<float>(), grad.data<float>(), exp_avg.data<float>(), exp_avg_sq.data<float>(), n,
      decay, ConstsOf(hp));
  SY_CUDA_CHECK_LAUNCH();
}

void AdamWUpdateMany(std::span<AdamWTensors> tensors, const AdamWStep& hp, DeviceContext* ctx) {
  std::vector<AdamWChunk> chunks;
  for (AdamWTensors& t : tensors) {
    float* p = t.param.data<float>();
    const float* g = t.grad.data<float>();
    float* m = t.exp_avg.data<float>();
    float* v = t.exp_avg_sq.data<float>();
    const float decay = AdamWScalarsOf(hp, t.weight_decay).decay;
    ForEachChunk(t.param.numel(), [&](int64_t offset, int64_t length) {
      chunks.push_back({p + offset, g + offset, m + offset, v + offset, length, decay});
    });
  }
  if (chunks.empty()) return;
  Tensor table;
  const AdamWChunk* device_chunks = Upload(chunks, table, ctx);
  AdamWChunksKernel<<<static_cast<unsigned>(chunks.size()), kChunkThreads, 0, StreamOf(ctx)>>>(
      device_chunks, ConstsOf(hp));
  SY_CUDA_CHECK_LAUNCH();
}

void SgdUpdate(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum,
               float weight_decay, DeviceContext* ctx) {
  const int64_t n = param.numel();
  if (n == 0) return;
  if (momentum == 0.0f) {
    SgdKernel<false><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        param.data<float>(), grad.data<float>(), nullptr, n, lr, momentum, weight_decay);
  } else {
    SgdKernel<true><<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(
        param.data<float>(), grad.data<float>(), momentum_buf.data<float>(), n, lr, momentum,
        weight_decay);
  }
  SY_CUDA_CHECK_LAUNCH();
}

double SumSquares(const Tensor& t, DeviceContext* ctx) {
  const int64_t n = t.numel();
  if (n == 0) return 0.0;
  const int64_t blocks =
      std::clamp<int64_t>((n + kThreads * 16 - 1) / (kThreads * 16), 1, kMaxSumBlocks);
  Tensor holder;
  double* partial = DoubleBuffer(blocks, holder, ctx);
  SumSquaresKernel<<<static_cast<unsigned>(blocks), kThreads, 0, StreamOf(ctx)>>>(t.data<float>(),
                                                                                  n, partial);
  SY_CUDA_CHECK_LAUNCH();
  double sum = 0.0;
  for (double s : Download(partial, blocks, ctx)) sum += s;
  return sum;
}

std::vector<int64_t> SumSquaresPartition(std::span<const Tensor> tensors) {
  std::vector<int64_t> first;
  first.reserve(tensors.size() + 1);
  int64_t count = 0;
  for (const Tensor& t : tensors) {
    first.push_back(count);
    ForEachChunk(t.numel(), [&](int64_t, int64_t) { ++count; });
  }
  first.push_back(count);
  return first;
}

void SumSquaresPartials(std::span<const Tensor> tensors, Tensor& partials, DeviceContext* ctx) {
  std::vector<Span> chunks;
  for (const Tensor& t : tensors) {
    float* x = t.data<float>();
    ForEachChunk(t.numel(), [&](int64_t offset, int64_t length) {
      chunks.push_back({x + offset, length});
    });
  }
  SY_CHECK_EQ(partials.numel(), static_cast<int64_t>(chunks.size())) << "SumSquaresPartials";
  if (chunks.empty()) return;
  Tensor table;
  const Span* device_chunks = Upload(chunks, table, ctx);
  SumSquaresChunksKernel<<<static_cast<unsigned>(chunks.size()), kChunkThreads, 0,
                           StreamOf(ctx)>>>(device_chunks, partials.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

std::vector<double> SumSquaresMany(std::span<const Tensor> tensors, DeviceContext* ctx) {
  std::vector<Span> chunks;
  std::vector<size_t> first_chunk;  // tensor k owns chunks [first_chunk[k], first_chunk[k + 1])
  first_chunk.reserve(tensors.size() + 1);
  for (const Tensor& t : tensors) {
    first_chunk.push_back(chunks.size());
    float* x = t.data<float>();
    ForEachChunk(t.numel(), [&](int64_t offset, int64_t length) {
      chunks.push_back({x + offset, length});
    });
  }
  first_chunk.push_back(chunks.size());
  std::vector<double> sums(tensors.size(), 0.0);
  if (chunks.empty()) return sums;
  Tensor table, holder;
  const Span* device_chunks = Upload(chunks, table, ctx);
  const int64_t count = static_cast<int64_t>(chunks.size());
  double* partial = DoubleBuffer(count, holder, ctx);
  SumSquaresChunksKernel<<<static_cast<unsigned>(count), kChunkThreads, 0, StreamOf(ctx)>>>(
      device_chunks, partial);
  SY_CUDA_CHECK_LAUNCH();
  const std::vector<double> host = Download(partial, count, ctx);
  for (size_t k = 0; k < tensors.size(); ++k) {
    for (size_t c = first_chunk[k]; c < first_chunk[k + 1]; ++c) sums[k] += host[c];
  }
  return sums;
}

void ScaleInPlace(Tensor& t, float scale, DeviceContext* ctx) {
  const int64_t n = t.numel();
  if (n == 0) return;
  ScaleKernel<<<GridFor(n, kThreads), kThreads, 0, StreamOf(ctx)>>>(t.data<float>(), n, scale);
  SY_CUDA_CHECK_LAUNCH();
}

void ScaleMany(std::span<Tensor> tensors, float scale, DeviceContext* ctx) {
  std::vector<Span> chunks;
  for (Tensor& t : tensors) {
    float* x = t.data<float>();
    ForEachChunk(t.numel(), [&](int64_t offset, int64_t length) {
      chunks.push_back({x + offset, length});
    });
  }
  if (chunks.empty()) return;
  Tensor table;
  const Span* device_chunks = Upload(chunks, table, ctx);
  ScaleChunksKernel<<<static_cast<unsigned>(chunks.size()), kChunkThreads, 0, StreamOf(ctx)>>>(
      device_chunks, scale);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
