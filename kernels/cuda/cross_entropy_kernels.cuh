// The device code of the cross-entropy (kernels/cuda/cross_entropy.cu, which launches it and
// describes the design): one block per row for the loss and the gradient, then one block
// summing the rows; with the launch shapes, which the .cu and the emulation test
// (tests/kernels/embedding_emulation_test.cc) both take from here.
#pragma once

#include <climits>
#include <cmath>
#include <cstdint>

#include "kernels/cuda/device_common.cuh"

namespace switchyard::kernels::cuda::cross_entropy {
// Internal linkage: the emulation test compiles these kernels too, and links with
// cross_entropy.cu's.
namespace {

constexpr unsigned long long kNoBadRow = ULLONG_MAX;
constexpr int kSumThreads = 1024;           // SumRowsKernel's one block
constexpr int64_t kMaxBlocks = 65535 * 16;  // grid cap of the row kernel

// What the device hands back to the host in one copy.
struct DeviceSums {
  double loss_sum;
  unsigned long long count;
  unsigned long long first_bad_row;
};

// logits, dlogits (n, v); dlogits null: no gradient. row_loss (n).
__global__ void CrossEntropyRowKernel(const float* logits, const int32_t* targets, float* dlogits,
                                      int64_t n, int64_t v, float scale, int32_t ignore_index,
                                      double* row_loss, unsigned long long* first_bad_row) {
  __shared__ float shared_max[32];
  __shared__ double shared_sum[32];
  for (int64_t r = blockIdx.x; r < n; r += gridDim.x) {
    const float* x = logits + r * v;
    float* dx = dlogits ? dlogits + r * v : nullptr;
    const int32_t t = targets[r];
    if (t == ignore_index || t < 0 || t >= v) {  // the same for the whole block
      if (dx) {
        for (int64_t j = threadIdx.x; j < v; j += blockDim.x) dx[j] = 0.0f;
      }
      if (threadIdx.x == 0) {
        row_loss[r] = 0.0;
        if (t != ignore_index) atomicMin(first_bad_row, static_cast<unsigned long long>(r));
      }
      continue;
    }
    const float target_logit = x[t];  // before any thread of the block writes the row
    float max = -INFINITY;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) max = x[j] > max ? x[j] : max;
    max = BlockMax(max, shared_max, -INFINITY);
    double sum = 0.0;
    for (int64_t j = threadIdx.x; j < v; j += blockDim.x) sum += expf(__fsub_rn(x[j], max));
    sum = BlockSum(sum, shared_sum);
    const double lse = static_cast<double>(max) + log(sum);
    if (threadIdx.x == 0) row_loss[r] = lse - static_cast<double>(target_logit);
    if (dx) {
      const float lse_f = static_cast<float>(lse);
      for (int64_t j = threadIdx.x; j < v; j += blockDim.x) {
        const float g = __fmul_rn(scale, expf(__fsub_rn(x[j], lse_f)));
        dx[j] = j == t ? __fsub_rn(g, scale) : g;
      }
    }
  }
}

// One block of kSumThreads: out->loss_sum = sum of row_loss (null: 0), out->count = number
// of targets != ignore_index; slots (or null) get the two as doubles too, the loss NaN when a
// target was outside the vocabulary (out->first_bad_row set by the row kernel before it): the
// step's readback carries no error word, and a NaN loss stops the step (the trainer's
// non-finite check) where a bad target would otherwise train silently as an ignored one.
__global__ void SumRowsKernel(const double* row_loss, const int32_t* targets, int64_t n,
                              int32_t ignore_index, DeviceSums* out, double* slots = nullptr) {
  __shared__ double shared_loss[32];
  __shared__ unsigned long long shared_count[32];
  double loss = 0.0;
  unsigned long long count = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    if (row_loss) loss += row_loss[i];
    count += targets[i] != ignore_index;
  }
  loss = BlockSum(loss, shared_loss);
  count = BlockSum(count, shared_count);
  if (threadIdx.x == 0) {
    out->loss_sum = loss;
    out->count = count;
    if (slots) {
      slots[0] = out->first_bad_row == kNoBadRow ? loss : static_cast<double>(NAN);
      slots[1] = static_cast<double>(count);
    }
  }
}

// The row kernel's launch for n rows of v logits: `blocks` blocks (grid-stride over the rows
// past max_blocks) of `threads`, a warp per 128 logits, 1 to 32 warps.
struct RowLaunch {
  unsigned blocks = 0;
  int threads = 0;
};

RowLaunch RowShape(int64_t n, int64_t v, int64_t max_blocks = kMaxBlocks) {
  RowLaunch l;
  l.blocks = static_cast<unsigned>(n < max_blocks ? n : max_blocks);
  const int64_t t = ((v + 3) / 4 + 31) / 32 * 32;
  l.threads = static_cast<int>(t < 32 ? 32 : (t > 1024 ? 1024 : t));
  return l;
}

}  // namespace
}  // namespace switchyard::kernels::cuda::cross_entropy
