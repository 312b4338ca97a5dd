// The load-balancing loss of one routing group from its sums left on the device, in each
// moe.aux_loss_scope (group, sequence, global), for the training step's single readback (engine/core/step_readback.h; moe/aux_loss.h states the
// loss). The host functions of moe/aux_loss.cc read the sums back first; these write the
// loss value and the per-expert counts into the step's buffer instead, and compute the
// backward's column from the device counts, in the host's double arithmetic (the same
// expressions, each operation rounded once: the same bits on the CPU and on CUDA).
//
// counts (k E + 1) i64: CountSlotAssignments' slot counts (the last one counts indices
// outside [0, E)); prob_sums (E) f32: ProbColumnSums'; T = tokens of the group; k = top_k.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "kernels/write.h"

namespace switchyard::kernels {

// ---- The host's expressions --------------------------------------------------------------
// The loss values and gradient columns from sums on the host, each double operation in this
// order (moe/aux_loss.cc and the CPU ops below call them; the CUDA kernels round each
// operation the same way).

// f32(coef (E dot / (T k T))), dot = sum_e a_e s_e in double in expert order (a: the
// assignments per expert, s: the prob sums); 0 when T = 0.
float BalanceAuxOf(std::span<const int64_t> assignments, const float* prob_sums, int64_t tokens,
                   int64_t top_k, float coef);
// col_e = f32(grad coef E f_e / T) left to right in double, f_e = a_e / (T k); zeros when T = 0.
std::vector<float> BalanceColumnOf(std::span<const int64_t> assignments, int64_t tokens,
                                   int64_t top_k, float coef, float grad);
// The global scope: f32(coef (E dot / T)), dot = sum_e load_e s_e; 0 when T = 0.
float GlobalBalanceAuxOf(std::span<const float> load, const float* prob_sums, int64_t tokens,
                         float coef);
// col_e = f32(grad coef E load_e / T) left to right in double; zeros when T = 0.
std::vector<float> GlobalBalanceColumnOf(std::span<const float> load, int64_t tokens, float coef,
                                         float grad);

// ---- The group scope, from sums on the device ------------------------------------------

// values (E + 2) f64 on the sums' device gets {aux, a_0, ..., a_{E-1}, bad}: a_e = sum_j
// counts[j E + e] (the top-k assignments to expert e), bad = counts[k E], and
//   aux = f32(coef * (E * dot / (T * k * T))), dot = sum_e a_e * prob_sums[e]
// (double, in expert order), 0 when T = 0: moe::LoadBalancingLossFromSums' value.
void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values, DeviceContext* ctx = nullptr);

// dprobs (R, E) f32 += col on every row, col[e] = f32(grad * coef * E * f_e / T),
// f_e = a_e / (T * k): moe::LoadBalancingLossBackward's column (nothing when T = 0). kSet
// writes +0 + col instead (the bits of adding into zeros; zeros when T = 0), dprobs unread.
void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, Write write, DeviceContext* ctx = nullptr);

// ---- The sequence scope: parts of part_tokens rows -------------------------------------
// A group of T rows in P = ceil(T / part_tokens) parts, the last possibly shorter; part p's
// tokens T_p are its rows.

// counts (P, k E + 1) i64, row p CountSlotAssignments' of part p's indices (T, k) rows, and
// prob_sums (P, E) f32, row p ProbColumnSums' of its probs (T, E) rows, each column added in
// double in row order and rounded once: the CPU's bits on either device.
void PartBalanceSums(const Tensor& probs, const Tensor& indices, int64_t part_tokens,
                     Tensor& counts, Tensor& prob_sums, DeviceContext* ctx = nullptr);

// value (1) f64 gets f32(sum_p aux_p / P), aux_p BalanceValuesInto's aux of part p (T_p
// tokens), the sum in double in part order: moe::BalanceLoss for the sequence scope.
void PartBalanceValueInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                          int64_t part_tokens, int64_t top_k, float coef, Tensor& value,
                          DeviceContext* ctx = nullptr);

// dprobs (T, E) f32 += on each row of part p AddBalanceColumn's column of part p (T_p tokens)
// with grad f32(grad / P) (kSet: written over dprobs, unread): moe::BalanceLossBackward for
// the sequence scope.
void AddPartBalanceColumns(Tensor& dprobs, const Tensor& counts, int64_t part_tokens,
                           int64_t top_k, float coef, float grad, Write write,
                           DeviceContext* ctx = nullptr);

// ---- The global scope: f = load (E) f32, on the sums' device ---------------------------

// value (1) f64 gets f32(coef (E dot / T)), dot = sum_e load_e prob_sums_e in double in
// expert order (0 when T = 0): moe::BalanceLoss for the global scope.
void GlobalBalanceValueInto(const Tensor& load, const Tensor& prob_sums, int64_t tokens,
                            float coef, Tensor& value, DeviceContext* ctx = nullptr);

// dprobs (R, E) f32 += col on every row, col_e = f32(grad coef E load_e / T), left to right
// in double (nothing when T = 0; kSet: written over dprobs, zeros when T = 0).
void AddGlobalBalanceColumn(Tensor& dprobs, const Tensor& load, int64_t tokens, float coef,
                            float grad, Write write, DeviceContext* ctx = nullptr);

namespace cpu {
void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values);
void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, Write write);
void PartBalanceSums(const Tensor& probs, const Tensor& indices, int64_t part_tokens,
                     Tensor& counts, Tensor& prob_sums);
void PartBalanceValueInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                          int64_t part_tokens, int64_t top_k, float coef, Tensor& value);
void AddPartBalanceColumns(Tensor& dprobs, const Tensor& counts, int64_t part_tokens,
                           int64_t top_k, float coef, float grad, Write write);
void GlobalBalanceValueInto(const Tensor& load, const Tensor& prob_sums, int64_t tokens,
                            float coef, Tensor& value);
void AddGlobalBalanceColumn(Tensor& dprobs, const Tensor& load, int64_t tokens, float coef,
                            float grad, Write write);
}  // namespace cpu

namespace cuda {
void BalanceValuesInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                       int64_t top_k, float coef, Tensor& values, DeviceContext* ctx);
void AddBalanceColumn(Tensor& dprobs, const Tensor& counts, int64_t tokens, int64_t top_k,
                      float coef, float grad, Write write, DeviceContext* ctx);
void PartBalanceSums(const Tensor& probs, const Tensor& indices, int64_t part_tokens,
                     Tensor& counts, Tensor& prob_sums, DeviceContext* ctx);
void PartBalanceValueInto(const Tensor& counts, const Tensor& prob_sums, int64_t tokens,
                          int64_t part_tokens, int64_t top_k, float coef, Tensor& value,
                          DeviceContext* ctx);
void AddPartBalanceColumns(Tensor& dprobs, const Tensor& counts, int64_t part_tokens,
                           int64_t top_k, float coef, float grad, Write write,
                           DeviceContext* ctx);
void GlobalBalanceValueInto(const Tensor& load, const Tensor& prob_sums, int64_t tokens,
                            float coef, Tensor& value, DeviceContext* ctx);
void AddGlobalBalanceColumn(Tensor& dprobs, const Tensor& load, int64_t tokens, float coef,
                            float grad, Write write, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
