// The router's auxiliary losses for one routing group (../shared/MODEL.md section 2), as
// pure functions returning the loss and accumulating its gradient.
//
// Load balancing, Switch Transformer (Fedus et al. 2021, arXiv 2101.03961, eq. 4-6),
// normalised for top-k:
//   f_i = (top-k assignments to expert i) / (T * k)        (eq. 5, constant for the gradient)
//   P_i = (1 / T) * sum_t probs[t, i]                       (eq. 6)
//   aux = coef * E * sum_i f_i * P_i                        (eq. 4)
//   d aux / d probs[t, i] = coef * E * f_i / T
// Balanced routing (f_i = P_i = 1/E) gives aux = coef.
// f counts every top-k assignment BEFORE anything removes it: capacity dropping, and also
// GShard's random second-expert policy (treated like a drop, as the GShard/mesh-tensorflow
// gating computes the balancing statistics before its random removal).
//
// Router z-loss, ST-MoE (Zoph et al. 2022, arXiv 2202.08906, eq. 5):
//   z = coef * (1 / T) * sum_t (logsumexp_i logits[t, i])^2
//   d z / d logits[t, i] = coef * (2 / T) * lse_t * softmax(logits_t)_i
//
// When a group's tokens are split over ranks (MODEL.md section 4), each rank computes the
// sums of its piece (LoadBalanceSumsOf), the pieces are summed (all-reduce), and every rank
// evaluates the loss from the group's sums and the gradient for its own rows; the z-loss
// takes the group's token count so that the pieces' values add up to the group's.
//
// Devices: the tensors of a call are on the CPU or all on ctx's CUDA device (ctx required
// for CUDA tensors). The losses and LoadBalanceSums are host values: on CUDA they are
// computed on the device and copied back with one small device->host copy (which
// synchronises ctx's stream); gradients are accumulated in place on the tensors' device.
// LoadBalanceSumsInto and ZLossInto leave them on the device for a training step's single
// readback instead (engine/core/step_readback.h).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/step_readback.h"
#include "engine/core/tensor.h"
#include "kernels/write.h"
#include "moe/moe_config.h"

namespace switchyard::moe {

// The sums the load-balancing loss needs, over a group or a piece of one; add pieces
// element-wise to get the group's.
struct LoadBalanceSums {
  std::vector<int64_t> assignments;  // (E) top-k assignments per expert, before any removal
  std::vector<float> prob_sums;      // (E) sum over the tokens of probs[:, i] (accumulated in
                                     // double, stored f32 so an f32 all-reduce can add pieces)
  int64_t tokens = 0;                // T
  // In a training step (LoadBalanceSumsInto) the sums stay on the device and the two
  // vectors above are empty: device_counts (k E + 1) i64 (kernels::CountSlotAssignments'),
  // device_prob_sums (E) f32, and the step's readback slots [values_slot, + E + 2) hold
  // {aux, the E assignments, the out-of-range count} (kernels/balance_loss.h).
  Tensor device_counts, device_prob_sums;
  int64_t values_slot = -1;
  bool on_device() const { return device_counts.defined(); }
};

// Sums of probs (T, E) f32 and indices (T, k) i32.
LoadBalanceSums LoadBalanceSumsOf(const Tensor& probs, const Tensor& indices,
                                  DeviceContext* ctx = nullptr);

// LoadBalanceSumsOf for a whole group in a training step: the sums stay on the device, and
// the group's aux = coef E sum_i f_i P_i (with top_k = indices' k) and its per-expert
// assignments are written into the step's readback (engine/core/step_readback.h) at
// values_slot, without a wait.
LoadBalanceSums LoadBalanceSumsInto(const Tensor& probs, const Tensor& indices, float coef,
                                    StepReadback& readback, DeviceContext* ctx);

// aux = coef * E * sum_i f_i P_i from the group's sums (on the host).
float LoadBalancingLossFromSums(const LoadBalanceSums& group, int64_t top_k, float coef);

// dprobs (T_piece, E) += grad * coef * E * f_i / T, with f and T those of the whole group
// (from the device counts for sums on the device: the same column, kernels/balance_loss.h).
// kSet writes the column over dprobs instead (the bits of adding into zeros).
void LoadBalancingLossBackward(const LoadBalanceSums& group, int64_t top_k, float coef, float grad,
                               Tensor& dprobs, kernels::Write write,
                               DeviceContext* ctx = nullptr);

// One whole group: returns aux; when dprobs (T, E) is given, adds grad * d aux / d probs.
float LoadBalancingLoss(const Tensor& probs, const Tensor& indices, float coef, float grad,
                        Tensor* dprobs, DeviceContext* ctx = nullptr);

// The load-balancing loss of one routing group under moe.aux_loss_scope (docs/model.md,
// "Auxiliary losses"):
//   group     parts = {the group's sums}:          aux = coef E sum_i f_i P_i
//   sequence  parts = each sequence's sums (consecutive runs of S = seq_len tokens, the last
//             possibly shorter), aux = (1 / n) sum_s coef E sum_i f_i^s P_i^s
//             (DeepSeek-V3's sequence-wise balance loss)
//   global    parts = {the group's sums}, f_i = load_i: the fractions of the top-k
//             assignments of the whole global batch (every micro-batch and data-parallel
//             rank) of the previous optimizer step, a constant (Qwen's global-batch balancing)
struct BalanceTerms {
  std::vector<LoadBalanceSums> parts;
  std::vector<float> load;  // (E) global scope; empty otherwise
  // The rows of part p of the group: [p * part_tokens, + parts[p].tokens).
  int64_t part_tokens = 0;
  // In a training step (BalanceTermsInto) they stay on the device instead: parts = {the
  // group's sums (LoadBalanceSumsInto)}, and
  //   sequence  part_counts (P, k E + 1) i64, each part's slot counts
  //             (kernels::PartBalanceSums), parts of part_tokens rows, the last possibly
  //             shorter
  //   global    device_load (E) f32 on the device (load stays empty)
  // and aux waits in the step's readback at aux_slot.
  Tensor part_counts, device_load;
  int64_t aux_slot = -1;
  // d aux / d probs is one constant row (the group and global scopes).
  bool one_row() const { return parts.size() == 1 && !part_counts.defined(); }
};

// The terms of a whole group from its probs (T, E) and indices (T, k) (the whole group's
// rows, in token order); `group` is LoadBalanceSumsOf them (reused for the group and global
// scopes). load: (E) for the global scope.
BalanceTerms BalanceTermsOf(const Tensor& probs, const Tensor& indices,
                            const LoadBalanceSums& group, AuxLossScope scope, int64_t seq_len,
                            std::span<const float> load, DeviceContext* ctx = nullptr);

// BalanceTermsOf in a training step, from `group` = LoadBalanceSumsInto(probs, indices):
// nothing is read back, and no wait. The group scope's aux is group.values_slot; the sequence
// scope's parts' sums and the global scope's (from load (E) f32 on the sums' device) are
// written into one more slot of the readback. The terms' aux_slot says which.
BalanceTerms BalanceTermsInto(const Tensor& probs, const Tensor& indices,
                              const LoadBalanceSums& group, AuxLossScope scope, int64_t seq_len,
                              const Tensor& load, int64_t top_k, float coef,
                              StepReadback& readback, DeviceContext* ctx);

// aux of the group (terms on the host).
float BalanceLoss(const BalanceTerms& terms, int64_t top_k, float coef);

// dprobs += grad * d aux / d probs. With one part (group and global scopes) dprobs may hold
// any of the group's rows (the gradient is one constant row); with several (sequence scope)
// it holds the whole group's T rows in token order. kSet writes every row of dprobs (which
// need not be initialised) with the bits of adding into zeros.
void BalanceLossBackward(const BalanceTerms& terms, int64_t top_k, float coef, float grad,
                         Tensor& dprobs, kernels::Write write, DeviceContext* ctx = nullptr);

// Returns z for logits (T, E) f32; when dlogits (T, E) is given, adds grad * dz / dlogits.
// group_tokens: the group's token count when logits hold one piece of it (the result is
// then that piece's share of z); 0 means logits are the whole group.
float ZLoss(const Tensor& logits, float coef, float grad, Tensor* dlogits,
            int64_t group_tokens = 0, DeviceContext* ctx = nullptr);

// ZLoss's value (no gradient) into value (1) f64 on the logits' device, left there for the
// training step's single readback (engine/core/step_readback.h): the f32 ZLoss returns, as
// a double.
void ZLossInto(const Tensor& logits, float coef, Tensor& value, int64_t group_tokens = 0,
               DeviceContext* ctx = nullptr);

// ZLoss's gradient alone: dlogits (T, E) += grad * dz / dlogits (kSet: written over
// dlogits, the bits of adding into zeros), the same values, without computing the loss (so
// on CUDA without waiting for the stream). For the backward pass.
void ZLossBackward(const Tensor& logits, float coef, float grad, Tensor& dlogits,
                   kernels::Write write, int64_t group_tokens = 0,
                   DeviceContext* ctx = nullptr);

}  // namespace switchyard::moe
