// CUDA implementation of kernels/balance_loss.h. The sums are a few hundred numbers: one
// thread adds the dot product in expert order (as the host loop), and each expert's column
// entry is one thread's; every double operation is an explicit round-to-nearest intrinsic
// (no fused multiply-add), so the values are the host's bits. The device code is in
// kernels/cuda/balance_loss_kernels.cuh.
#include "kernels/balance_loss.h"
#include "kernels/cuda/balance_loss_kernels.cuh"
#include "kernels/cuda/common.cuh"

namespace switchyard::kernels::cuda {
namespace {

using balance_loss::AddColumnKernel;
using balance_loss::AddPartColumnsKernel;
using balance_loss::BalanceColumnKernel;
using balance_loss::BalanceValuesKernel;
using balance_loss::GlobalBalanceColumnKernel;
using balance_loss::GlobalBalanceValueKernel;
using balance_loss::PartBalanceColumnsKernel;
using balance_loss::PartBalanceValueKernel;
using balance_loss::PartColumnSumsKernel;
using balance_loss::PartSlotCountsKernel;

}  // namespace

void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values, DeviceContext* ctx) {
  BalanceValuesKernel<<<1, 1, 0, StreamOf(ctx)>>>(counts.data<int64_t>(),
                                                  prob_sums.data<float>(), prob_sums.numel(),
                                                  top_k, tokens, coef, values.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, Write write, DeviceContext* ctx) {
  const int64_t E = dprobs.dim(1), n = dprobs.numel();
  if (n == 0) return;
  if (tokens == 0) {  // no column: kSet's zeros
    if (write == Write::kSet) dprobs.SetZero(ctx);
    return;
  }
  Tensor col = Tensor::Empty({E}, DType::kF32, dprobs.device());
  BalanceColumnKernel<<<GridFor(E), 256, 0, StreamOf(ctx)>>>(counts.data<int64_t>(), E, top_k,
                                                             tokens, coef, grad,
                                                             col.data<float>());
  SY_CUDA_CHECK_LAUNCH();
  AddColumnKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(dprobs.data<float>(),
                                                         col.data<float>(), n, E, write);
  SY_CUDA_CHECK_LAUNCH();
}

void PartBalanceSums(const Tensor& probs, const Tensor& indices, int64_t part_tokens,
                     Tensor& counts, Tensor& prob_sums, DeviceContext* ctx) {
  cudaStream_t stream = StreamOf(ctx);
  SY_CUDA_CHECK(cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), stream));
  const int64_t T = probs.dim(0), E = probs.dim(1), k = indices.dim(1), P = counts.dim(0);
  if (T == 0) return;  // no parts
  PartSlotCountsKernel<<<GridFor(T * k), 256, 0, stream>>>(
      indices.data<int32_t>(), T * k, k, E, part_tokens,
      reinterpret_cast<unsigned long long*>(counts.data<int64_t>()));
  SY_CUDA_CHECK_LAUNCH();
  PartColumnSumsKernel<<<GridFor(P * E), 256, 0, stream>>>(probs.data<float>(), T, E,
                                                           part_tokens, P,
                                                           prob_sums.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void PartBalanceValueInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                          int64_t part_tokens, int64_t top_k, float coef, Tensor& value,
                          DeviceContext* ctx) {
  cudaStream_t stream = StreamOf(ctx);
  const int64_t P = counts.dim(0);
  if (P == 0) {
    value.SetZero(ctx);
    return;
  }
  PartBalanceValueKernel<<<1, 1, 0, stream>>>(counts.data<int64_t>(), prob_sums.data<float>(),
                                              tokens, part_tokens, P, prob_sums.dim(1), top_k,
                                              coef, value.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

void AddPartBalanceColumns(Tensor& dprobs, const Tensor& counts, int64_t part_tokens,
                           int64_t top_k, float coef, float grad, Write write,
                           DeviceContext* ctx) {
  const int64_t T = dprobs.dim(0), E = dprobs.dim(1), P = counts.dim(0), n = dprobs.numel();
  if (n == 0) return;
  cudaStream_t stream = StreamOf(ctx);
  Tensor cols = Tensor::Empty({P, E}, DType::kF32, dprobs.device());
  const float part_grad = static_cast<float>(static_cast<double>(grad) / P);
  PartBalanceColumnsKernel<<<GridFor(P * E), 256, 0, stream>>>(
      counts.data<int64_t>(), T, part_tokens, P, E, top_k, coef, part_grad, cols.data<float>());
  SY_CUDA_CHECK_LAUNCH();
  AddPartColumnsKernel<<<GridFor(n), 256, 0, stream>>>(dprobs.data<float>(), cols.data<float>(),
                                                       n, E, part_tokens, write);
  SY_CUDA_CHECK_LAUNCH();
}

void GlobalBalanceValueInto(const Tensor& load, const Tensor& prob_sums, int64_t tokens,
                            float coef, Tensor& value, DeviceContext* ctx) {
  GlobalBalanceValueKernel<<<1, 1, 0, StreamOf(ctx)>>>(load.data<float>(),
                                                       prob_sums.data<float>(), prob_sums.numel(),
                                                       tokens, coef, value.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

void AddGlobalBalanceColumn(Tensor& dprobs, const Tensor& load, int64_t tokens, float coef,
                            float grad, Write write, DeviceContext* ctx) {
  const int64_t E = dprobs.dim(1), n = dprobs.numel();
  if (n == 0) return;
  if (tokens == 0) {  // no column: kSet's zeros
    if (write == Write::kSet) dprobs.SetZero(ctx);
    return;
  }
  cudaStream_t stream = StreamOf(ctx);
  Tensor col = Tensor::Empty({E}, DType::kF32, dprobs.device());
  GlobalBalanceColumnKernel<<<GridFor(E), 256, 0, stream>>>(load.data<float>(), E, tokens, coef,
                                                            grad, col.data<float>());
  SY_CUDA_CHECK_LAUNCH();
  AddColumnKernel<<<GridFor(n), 256, 0, stream>>>(dprobs.data<float>(), col.data<float>(), n, E,
                                                  write);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
