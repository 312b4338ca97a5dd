// CUDA implementation of kernels/cross_entropy.h: the launches and the readback; the device
// code is in kernels/cuda/cross_entropy_kernels.cuh.
//
// CrossEntropyRowKernel: one block per row (grid-stride over rows). Counted rows: the max
//   (f32), sum exp(x - max) (expf, summed in double), lse = max + log(sum) in double, the
//   row's loss lse - x[target] into row_loss (double), and with a gradient
//   dlogits = grad_scale * exp(x - lse) (- grad_scale at the target) in f32 with explicit
//   round-to-nearest intrinsics. Ignored rows: loss 0, gradient 0.
//   A target outside [0, V) (not ignore_index) gets loss 0 and gradient 0 as an ignored row
//   (but SumRowsKernel counts it) and its row index is recorded with atomicMin (the first
//   bad row whatever the schedule). x[target] is read before the first barrier and every
//   element is written by the thread that reads it after the reductions, so dlogits may
//   alias logits.
// SumRowsKernel: one block adds row_loss and counts the targets != ignore_index, each
//   thread a fixed strided subset and then a fixed tree, so the sum is deterministic; the
//   op copies (loss_sum, count, first bad row) to the host once (a stream synchronisation).
// Differences from the CPU (kernels/cpu/cross_entropy.cc): CUDA's expf (<= 2 ulp) summed in
// double where the CPU sums its VecExp (<= 2 ulp) in 16 f32 lanes first; the gradient as
// exp(x - lse) where the CPU scales exp(x - max) by grad_scale / sum; the reduction orders.
#include "kernels/cross_entropy.h"
#include "kernels/cuda/common.cuh"
#include "kernels/cuda/cross_entropy_kernels.cuh"

namespace switchyard::kernels::cuda {
namespace {

namespace ce = cross_entropy;
using ce::DeviceSums;

// A zeroed DeviceSums on the device with first_bad_row = ce::kNoBadRow.
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
  ce::SumRowsKernel<<<1, ce::kSumThreads, 0, StreamOf(ctx)>>>(
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
  const ce::RowLaunch launch = ce::RowShape(n, v);
  ce::CrossEntropyRowKernel<<<launch.blocks, launch.threads, 0, StreamOf(ctx)>>>(
      logits.data<float>(), targets.data<int32_t>(), dlogits ? dlogits->data<float>() : nullptr, n,
      v, static_cast<float>(grad_scale), ignore_index, losses, &device_sums->first_bad_row);
  SY_CUDA_CHECK_LAUNCH();
  ce::SumRowsKernel<<<1, ce::kSumThreads, 0, StreamOf(ctx)>>>(
      losses, targets.data<int32_t>(), n, ignore_index, device_sums, slots);
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
  if (host.first_bad_row != ce::kNoBadRow) {
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
