// CUDA implementation of kernels/moe_routing.h. Arguments are checked by
// kernels/moe_routing.cc. The CPU loops in kernels/cpu/moe_routing.cc are the reference:
//  - per-token ops (RouterTopK, RouterBackwardLogits, the z-loss) run one warp per token,
//    four tokens per 128-thread block; the per-token sums are in double like the CPU's
//    (exp is exp(double), rounded to f32 where the CPU rounds expf), so only the order of
//    the double sums differs and results agree to ~1 f32 ulp;
//  - counts use integer atomics (exact); the column sums a fixed two-level double sum (no
//    float atomics: deterministic);
//  - capacity admission is kernels/cuda/admission.cu.
// The device code is in kernels/cuda/moe_routing_kernels.cuh.
#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <vector>

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/moe_routing_kernels.cuh"
#include "kernels/moe_routing.h"

namespace switchyard::kernels::cuda {
namespace {

using routing::AddColumnConstantsKernel;
using routing::AddLabelAssignmentCountsKernel;
using routing::ColumnFinalSumsKernel;
using routing::ColumnPartialSumsKernel;
using routing::ColumnSumShapeOf;
using routing::CountSlotAssignmentsKernel;
using routing::ExpertBiasSigns;
using routing::kMaxTopKExperts;
using routing::kSumCols;
using routing::kSumDoublesThreads;
using routing::kSumRowLanes;
using routing::kTokenThreads;
using routing::RouterBackwardLogitsKernel;
using routing::RouterTopKKernel;
using routing::SumDoublesKernel;
using routing::TokenBlocks;
using routing::UpdateExpertBiasKernel;
using routing::ZLossGradCoef;
using routing::ZLossKernel;
using routing::ZLossValueKernel;

}  // namespace

void RouterTopK(const Tensor& logits, const Tensor& bias, bool normalize, bool random_second,
                RngKey second_key, int64_t first_token, Tensor& probs, Tensor& indices,
                Tensor& gates, Tensor& keep, DeviceContext* ctx) {
  const int64_t T = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
  SY_CHECK(E <= kMaxTopKExperts) << "RouterTopK on CUDA supports up to " << kMaxTopKExperts
                                 << " experts, got " << E;
  if (T == 0) return;
  RouterTopKKernel<<<TokenBlocks(T), kTokenThreads, 0, StreamOf(ctx)>>>(
      logits.data<float>(), bias.defined() ? bias.data<float>() : nullptr, T,
      static_cast<int>(E), static_cast<int>(k), normalize, random_second, second_key,
      first_token, probs.data<float>(), indices.data<int32_t>(), gates.data<float>(),
      keep.data<uint8_t>());
  SY_CUDA_CHECK_LAUNCH();
}

void RouterTopK(const Tensor& logits, const Tensor& bias, bool normalize, bool random_second,
                const DeviceRng& second, Tensor& probs, Tensor& indices, Tensor& gates,
                Tensor& keep, DeviceContext* ctx) {
  const int64_t T = logits.dim(0), E = logits.dim(1), k = indices.dim(1);
  SY_CHECK(E <= kMaxTopKExperts) << "RouterTopK on CUDA supports up to " << kMaxTopKExperts
                                 << " experts, got " << E;
  SY_CHECK_EQ(second.per_token, 1) << "RouterTopK: the second-expert draw is one per token";
  if (T == 0) return;
  RouterTopKKernel<<<TokenBlocks(T), kTokenThreads, 0, StreamOf(ctx)>>>(
      logits.data<float>(), bias.defined() ? bias.data<float>() : nullptr, T,
      static_cast<int>(E), static_cast<int>(k), normalize, random_second,
      RngKey{second.seed, 0}, 0, probs.data<float>(), indices.data<int32_t>(),
      gates.data<float>(), keep.data<uint8_t>(), second.values.data<int64_t>(),
      second.token_offset);
  SY_CUDA_CHECK_LAUNCH();
}

void RouterBackwardLogits(const Tensor& probs, const Tensor& indices, const Tensor& gates,
                          const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, bool normalize, Tensor& dlogits,
                          DeviceContext* ctx) {
  const int64_t T = dlogits.dim(0), E = dlogits.dim(1), k = indices.dim(1);
  if (T == 0 || E == 0) return;
  RouterBackwardLogitsKernel<<<TokenBlocks(T), kTokenThreads, 0, StreamOf(ctx)>>>(
      probs.data<float>(), indices.data<int32_t>(), gates.data<float>(), dgates.data<float>(),
      dprobs.defined() ? dprobs.data<float>() : nullptr,
      dlogits_extra.defined() ? dlogits_extra.data<float>() : nullptr, T, static_cast<int>(E),
      static_cast<int>(k), normalize, dlogits.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void CountSlotAssignments(const Tensor& indices, const Tensor& keep, int64_t num_experts,
                          Tensor& counts, DeviceContext* ctx) {
  cudaStream_t stream = StreamOf(ctx);
  SY_CUDA_CHECK(cudaMemsetAsync(counts.raw_data(), 0, counts.nbytes(), stream));
  const int64_t n = indices.numel();
  if (n == 0) return;
  CountSlotAssignmentsKernel<<<GridFor(n), 256, 0, stream>>>(
      indices.data<int32_t>(), keep.defined() ? keep.data<uint8_t>() : nullptr, n,
      static_cast<int>(indices.dim(1)), static_cast<int>(num_experts),
      reinterpret_cast<unsigned long long*>(counts.data<int64_t>()));
  SY_CUDA_CHECK_LAUNCH();
}

void AddLabelAssignmentCounts(const Tensor& indices, const Tensor& labels, int64_t num_labels,
                              int64_t num_experts, Tensor& counts, DeviceContext* ctx) {
  const int64_t n = indices.numel();
  if (n == 0) return;
  AddLabelAssignmentCountsKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(
      indices.data<int32_t>(), labels.data<int32_t>(), n, static_cast<int>(indices.dim(1)),
      static_cast<int>(num_labels), static_cast<int>(num_experts), counts.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

void ProbColumnSums(const Tensor& probs, Tensor& sums, DeviceContext* ctx) {
  const int64_t T = probs.dim(0), E = probs.dim(1);
  if (E == 0) return;
  cudaStream_t stream = StreamOf(ctx);
  const routing::ColumnSumShape shape = ColumnSumShapeOf(T, E);
  const int64_t chunks = shape.chunks;
  // Partial sums in double (an i64 tensor holds their bytes).
  Tensor partial = Tensor::Empty({std::max<int64_t>(chunks * E, 1)}, DType::kI64, ctx->device());
  double* pp = reinterpret_cast<double*>(partial.data<int64_t>());
  if (chunks > 0) {
    dim3 grid(shape.col_tiles, static_cast<unsigned>(chunks));
    dim3 block(kSumCols, kSumRowLanes);
    ColumnPartialSumsKernel<<<grid, block, 0, stream>>>(probs.data<float>(), T,
                                                        static_cast<int>(E), shape.rows_per_chunk,
                                                        pp);
    SY_CUDA_CHECK_LAUNCH();
  }
  ColumnFinalSumsKernel<<<GridFor(E), 256, 0, stream>>>(pp, chunks, static_cast<int>(E),
                                                        sums.data<float>());
  SY_CUDA_CHECK_LAUNCH();
}

void AddColumnConstants(Tensor& x, std::span<const float> column, Write write,
                        DeviceContext* ctx) {
  const int64_t n = x.numel();
  if (n == 0) return;
  Tensor col = ToDevice(std::vector<float>(column.begin(), column.end()), ctx);
  AddColumnConstantsKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(
      x.data<float>(), col.data<float>(), n, static_cast<int>(x.dim(1)), write);
  SY_CUDA_CHECK_LAUNCH();
}

float RouterZLoss(const Tensor& logits, float coef, float grad, int64_t group_tokens,
                  Tensor* dlogits, Write write, bool want_value, DeviceContext* ctx) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const int64_t n = group_tokens > 0 ? group_tokens : T;
  if (T == 0) return 0.0f;
  cudaStream_t stream = StreamOf(ctx);
  const Device dev = ctx->device();
  // lse^2 per token, then their sum, in double (held as i64 tensors of the same size,
  // written before DType::kF64 existed).
  Tensor lse_sq, total;
  if (want_value) {
    lse_sq = Tensor::Empty({T}, DType::kI64, dev);
    total = Tensor::Empty({1}, DType::kI64, dev);
  }
  double* lp = want_value ? reinterpret_cast<double*>(lse_sq.data<int64_t>()) : nullptr;
  float* dl = dlogits != nullptr ? dlogits->data<float>() : nullptr;
  if (lp == nullptr && dl == nullptr) return 0.0f;
  const double grad_coef = ZLossGradCoef(grad, coef);
  ZLossKernel<<<TokenBlocks(T), kTokenThreads, 0, stream>>>(logits.data<float>(), T,
                                                            static_cast<int>(E), grad_coef, n,
                                                            lp, dl, write);
  SY_CUDA_CHECK_LAUNCH();
  if (!want_value) return 0.0f;
  SumDoublesKernel<<<1, kSumDoublesThreads, 0, stream>>>(
      lp, T, reinterpret_cast<double*>(total.data<int64_t>()));
  SY_CUDA_CHECK_LAUNCH();
  const int64_t bits = ToHost<int64_t>(total, ctx)[0];  // waits for the stream
  double sum = 0.0;
  std::memcpy(&sum, &bits, sizeof(double));
  return static_cast<float>(coef * sum / n);
}

void RouterZLossInto(const Tensor& logits, float coef, int64_t group_tokens, Tensor& value,
                     DeviceContext* ctx) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  const int64_t n = group_tokens > 0 ? group_tokens : T;
  cudaStream_t stream = StreamOf(ctx);
  if (T == 0) {
    value.SetZero(ctx);
    return;
  }
  Tensor lse_sq = Tensor::Empty({T}, DType::kF64, ctx->device());
  Tensor total = Tensor::Empty({1}, DType::kF64, ctx->device());
  ZLossKernel<<<TokenBlocks(T), kTokenThreads, 0, stream>>>(logits.data<float>(), T,
                                                            static_cast<int>(E), 0.0, n,
                                                            lse_sq.data<double>(), nullptr,
                                                            Write::kAdd);
  SY_CUDA_CHECK_LAUNCH();
  SumDoublesKernel<<<1, kSumDoublesThreads, 0, stream>>>(lse_sq.data<double>(), T,
                                                          total.data<double>());
  SY_CUDA_CHECK_LAUNCH();
  ZLossValueKernel<<<1, 1, 0, stream>>>(total.data<double>(), coef, n, value.data<double>());
  SY_CUDA_CHECK_LAUNCH();
}

void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate,
                      DeviceContext* ctx) {
  const int64_t E = bias.numel();
  if (E == 0) return;
  Tensor s = ToDevice(ExpertBiasSigns(counts), ctx);
  UpdateExpertBiasKernel<<<GridFor(E), 256, 0, StreamOf(ctx)>>>(bias.data<float>(),
                                                                s.data<int32_t>(), E, rate);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
