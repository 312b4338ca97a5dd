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
using balance_loss::BalanceColumnKernel;
using balance_loss::BalanceValuesKernel;

}  // namespace

void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values, DeviceContext* ctx) {
  BalanceValuesKernel<<<1, 1, 0, StreamOf(ctx)>>>(counts.data<int64_t>(),
                                                  prob_sums.data<float>(), prob_sums.numel(),
                                                  top_k, tokens, coef, values.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, DeviceContext* ctx) {
  const int64_t E = dprobs.dim(1), n = dprobs.numel();
  if (tokens == 0 || n == 0) return;
  Tensor col = Tensor::Empty({E}, DType::kF32, dprobs.device());
  BalanceColumnKernel<<<GridFor(E), 256, 0, StreamOf(ctx)>>>(counts.data<int64_t>(), E, top_k,
                                                             tokens, coef, grad,
                                                             col.data<float>());
  SY_CUDA_CHECK_LAUNCH();
  AddColumnKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(dprobs.data<float>(),
                                                         col.data<float>(), n, E);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
