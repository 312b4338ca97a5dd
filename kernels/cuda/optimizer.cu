// CUDA implementation of kernels/optimizer.h.
//
// Per-element updates (AdamW, SGD, scale) evaluate the CPU reference's expressions
// (kernels/cpu/optimizer.cc) in the same order with __fmul_rn / __fadd_rn / __fsub_rn /
// __fdiv_rn / __fsqrt_rn: every operation is a correctly rounded f32 operation and none is
// contracted into a fused multiply-add, so the results equal the CPU's bit for bit.
//
// The device code and the launch shapes are kernels/cuda/optimizer_kernels.cuh.
//
// Single-tensor ops: grid-stride kernels, 256 threads, GridFor(n, kThreads) blocks.
// Multi-tensor ops ("multi-tensor apply"): the host cuts every tensor into chunks of at
// most kChunk elements and writes one descriptor per chunk (pointers already offset to the
// chunk, its length, and per-tensor scalars); the table goes to the device in one
// cudaMemcpyAsync and one launch runs a 512-thread block per chunk. AdamWUpdateMany and
// AdamWUpdate share AdamWElement, so they agree bit for bit; a chunk of a tensor with a bf16
// weight shadow also stores the new value rounded there (ToBf16, Cast's rounding).
//
// Sums of squares: each thread accumulates x * x in double (exact products), a block sums
// its threads (BlockSum<double>) into one partial per block (single tensor: grid-stride,
// at most kMaxSumBlocks blocks; many: one block per chunk); the partials come back in one
// copy and the host adds them in order. The order depends on the sizes only: deterministic.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/optimizer_kernels.cuh"
#include "kernels/optimizer.h"

namespace switchyard::kernels::cuda {
namespace {

using optimizer::AdamWChunk;
using optimizer::AdamWChunksKernel;
using optimizer::AdamWKernel;
using optimizer::AppendAdamWChunks;
using optimizer::AppendSpans;
using optimizer::ConstsOf;
using optimizer::ForEachChunk;
using optimizer::kChunkThreads;
using optimizer::kThreads;
using optimizer::ScaleChunksKernel;
using optimizer::ScaleKernel;
using optimizer::SgdKernel;
using optimizer::Span;
using optimizer::SumSquaresBlocks;
using optimizer::SumSquaresChunksKernel;
using optimizer::SumSquaresKernel;

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
    auto* p16 = t.shadow.defined() ? static_cast<__nv_bfloat16*>(t.shadow.raw_data()) : nullptr;
    AppendAdamWChunks(p, g, m, v, t.param.numel(), decay, p16, chunks);
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
  const int64_t blocks = SumSquaresBlocks(n);
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
  for (const Tensor& t : tensors) AppendSpans(t.data<float>(), t.numel(), chunks);
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
    AppendSpans(t.data<float>(), t.numel(), chunks);
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
  for (Tensor& t : tensors) AppendSpans(t.data<float>(), t.numel(), chunks);
  if (chunks.empty()) return;
  Tensor table;
  const Span* device_chunks = Upload(chunks, table, ctx);
  ScaleChunksKernel<<<static_cast<unsigned>(chunks.size()), kChunkThreads, 0, StreamOf(ctx)>>>(
      device_chunks, scale);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
