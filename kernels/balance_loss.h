// The load-balancing loss of one routing group from its sums left on the device, for the
// training step's single readback (engine/core/step_readback.h; moe/aux_loss.h states the
// loss). The host functions of moe/aux_loss.cc read the sums back first; these write the
// loss value and the per-expert counts into the step's buffer instead, and compute the
// backward's column from the device counts, in the host's double arithmetic (the same
// expressions, each operation rounded once: the same bits on the CPU and on CUDA).
//
// counts (k E + 1) i64: CountSlotAssignments' slot counts (the last one counts indices
// outside [0, E)); prob_sums (E) f32: ProbColumnSums'; T = tokens of the group; k = top_k.
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// values (E + 2) f64 on the sums' device gets {aux, a_0, ..., a_{E-1}, bad}: a_e = sum_j
// counts[j E + e] (the top-k assignments to expert e), bad = counts[k E], and
//   aux = f32(coef * (E * dot / (T * k * T))), dot = sum_e a_e * prob_sums[e]
// (double, in expert order), 0 when T = 0: moe::LoadBalancingLossFromSums' value.
void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values, DeviceContext* ctx = nullptr);

// dprobs (R, E) f32 += col on every row, col[e] = f32(grad * coef * E * f_e / T),
// f_e = a_e / (T * k): moe::LoadBalancingLossBackward's column (nothing when T = 0).
void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, DeviceContext* ctx = nullptr);

namespace cpu {
void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values);
void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad);
}  // namespace cpu

namespace cuda {
void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values, DeviceContext* ctx);
void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
