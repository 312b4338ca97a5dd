// CUDA implementation of kernels/cross_entropy.h.
//
// CrossEntropyRowKernel: one block per row (grid-stride over rows). Counted rows: the max
//   (f32), sum exp(x - max) (expf, summed in double), lse = max + log(sum) in double, the
//   row's loss lse - x[target] into row_loss (double), and with a gradient
//   dlogits = grad_scale * exp(x - lse) (- grad_scale at the target), the CPU's f32
//   expressions with explicit round-to-nearest intrinsics. Ignored rows: loss 0, gradient 0.
//   A target outside [0, V) (not ignore_index) is handled like an ignored row and its row
//   index recorded with atomicMin (the first bad row whatever the schedule). x[target] is
//   read before the first barrier and every element is written by the thread that reads
//   it after the reductions, so dlogits may alias logits.
// SumRowsKernel: one block adds row_loss and counts the targets != ignore_index, each
//   thread a fixed strided subset and then a fixed tree, so the sum is deterministic; the
//   op copies (loss_sum, count, first bad row) to the host once (a stream synchronisation).
// Differences from the CPU: expf (<= 2 ulp) where the CPU takes exp in double, and the
// reduction orders.
#include <climits>
#include <cmath>

#include "kernels/cross_entropy.h"
#include "kernels/cuda/common.cuh"

namespace switchyard::kernels::cuda {
namespace {

constexpr unsigned long long kNoBadRow = ULLONG_MAX;
constexpr int kSumThreads = 1024;

// What the device hands back to the host in one copy.
struct DeviceSums {
  double loss_sum;
  unsigned long long count;
  unsigned long long first_bad_row;
};

int RowThreads(int64_t v) {
  const int64_t t = ((v + 3) / 4 + 31) / 32 * 32;
  return static_cast<int>(t < 32 ? 32 : (t > 1024 ? 1024 : t));
}

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
// of targets != ignore_index; slots (or null) get the two as doubles too.
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
      slots[0] = loss;
      slots[1] = static_cast<double>(count);
    }
  }
}

// A zeroed DeviceSums on the device with first_bad_row = kNoBadRow.
Tensor NewDeviceSums(DeviceContext* ctx) {
  Tensor sums =
      Tensor::Empty({static_cast<int64_t>(sizeof(DeviceSums))}, DType::kU8, ctx->device());
  DeviceSums* p = static_cast<DeviceSums*>(sums.raw_data());
  SY_CUDA_CHECK(cudaMemsetAsync(p, 0, sizeof(DeviceSums), StreamOf(ctx)));
  SY_CUDA_CHECK(cudaMemsetAsync(&p->first_bad_row, 0xff, sizeof(p->first_bad_row), StreamOf(ctx)));
  return sums;
}

DeviceSums CopyToHost(const Tensor& sums, DeviceContext* ctx) {
  DeviceSums host;
  SY_CUDA_CHECK(
      cudaMemcpyAsync(&host, sums.raw_data(), sizeof(host), cudaMemcpyDeviceToHost, StreamOf(ctx)));
  SY_CUDA_CHECK(cudaStreamSynchronize(StreamOf(ctx)));
  return host;
}

}  // namespace

int64_t CountTargets(const Tensor& targets, int32_t ignore_index, DeviceContext* ctx) {
  const int64_t n = targets.numel();
  if (n == 0) return 0;
  Tensor sums = NewDeviceSums(ctx);
  SumRowsKernel<<<1, kSumThreads, 0, StreamOf(ctx)>>>(
      nullptr, targets.data<int32_t>(), n, ignore_index, static_cast<DeviceSums*>(sums.raw_data()));
  SY_CUDA_CHECK_LAUNCH();
  return static_cast<int64_t>(CopyToHost(sums, ctx).count);
}

namespace {

// The row kernel and the sum into a fresh DeviceSums (returned); slots: see SumRowsKernel.
Tensor RunCrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits,
                       double grad_scale, int32_t ignore_index, double* slots,
                       DeviceContext* ctx) {
  const int64_t n = targets.numel(), v = logits.dim(-1);
  Tensor sums = NewDeviceSums(ctx);
  DeviceSums* device_sums = static_cast<DeviceSums*>(sums.raw_data());
  Tensor row_loss =
      Tensor::Empty({n * static_cast<int64_t>(sizeof(double))}, DType::kU8, ctx->device());
  double* losses = static_cast<double*>(row_loss.raw_data());
  const unsigned blocks = static_cast<unsigned>(n < 65535 * 16 ? n : 65535 * 16);
  CrossEntropyRowKernel<<<blocks, RowThreads(v), 0, StreamOf(ctx)>>>(
      logits.data<float>(), targets.data<int32_t>(), dlogits ? dlogits->data<float>() : nullptr, n,
      v, static_cast<float>(grad_scale), ignore_index, losses, &device_sums->first_bad_row);
  SY_CUDA_CHECK_LAUNCH();
  SumRowsKernel<<<1, kSumThreads, 0, StreamOf(ctx)>>>(losses, targets.data<int32_t>(), n,
                                                      ignore_index, device_sums, slots);
  SY_CUDA_CHECK_LAUNCH();
  return sums;
}

}  // namespace

void CrossEntropyInto(const Tensor& logits, const Tensor& targets, Tensor& dlogits,
                      double grad_scale, int32_t ignore_index, Tensor& sums, DeviceContext* ctx) {
  if (targets.numel() == 0) {
    sums.SetZero(ctx);
    return;
  }
  RunCrossEntropy(logits, targets, &dlogits, grad_scale, ignore_index, sums.data<double>(), ctx);
}

CrossEntropySums CrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits,
                              double grad_scale, int32_t ignore_index, const char* op,
                              DeviceContext* ctx) {
  const int64_t n = targets.numel(), v = logits.dim(-1);
  CrossEntropySums result;
  if (n == 0) return result;
  Tensor sums = RunCrossEntropy(logits, targets, dlogits, grad_scale, ignore_index, nullptr, ctx);
  const DeviceSums host = CopyToHost(sums, ctx);
  if (host.first_bad_row != kNoBadRow) {
    const int64_t r = static_cast<int64_t>(host.first_bad_row);
    int32_t target = 0;
    SY_CUDA_CHECK(cudaMemcpyAsync(&target, targets.data<int32_t>() + r, sizeof(target),
                                  cudaMemcpyDeviceToHost, StreamOf(ctx)));
    SY_CUDA_CHECK(cudaStreamSynchronize(StreamOf(ctx)));
    SY_LOG(FATAL) << op << ": target " << target << " at row " << r
                  << " is outside the vocabulary of " << v << " (ignore_index=" << ignore_index
                  << ")";
  }
  result.loss_sum = host.loss_sum;
  result.count = static_cast<int64_t>(host.count);
  return result;
}

}  // namespace switchyard::kernels::cuda
