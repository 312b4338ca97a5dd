// The MoE router's per-token and per-expert arithmetic (../shared/MODEL.md section 2): the
// fused softmax + top-k + GShard keep draw, its backward to the logits, assignment counts,
// the load-balancing sums and gradient, the router z-loss, the expert-bias update and
// capacity admission. moe/router.cc, moe/aux_loss.cc and moe/capacity.cc call these; the
// router's matrix products stay kernels::Gemm and its jitter products kernels::Mul/MulAdd.
//
// Every tensor of one call is on one device (the CPU, or ctx's CUDA device). T tokens,
// E experts, k choices per token. Ops that return host values (counts, losses) compute them
// on the device and copy them back with one small device->host copy, which waits for ctx's
// stream; the others queue work on the stream and return.
//
// CPU vs CUDA: the integer results (indices, keep, counts, kept, position) are exactly
// equal; probabilities and gates agree to ~1 ulp (the softmax sums exp in double on both;
// the CUDA exp is exp(double) rounded to f32, the CPU's expf); gradients agree to f32
// rounding of double sums taken in another order.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/random.h"
#include "kernels/write.h"

namespace switchyard::kernels {

// Per token t of logits (T, E) f32:
//   probs[t]   = softmax(logits[t])  (max-subtracted, the exp sum accumulated in double)
//   indices[t] = the k experts of largest probs[t] + bias (bias (E) f32, or undefined for
//                none), best first, ties to the smaller expert index
//   gates[t]   = probs[t][indices[t]], divided by their (f32, in order) sum when normalize
//   keep[t]    = 1, except with random_second (k must be 2): keep[t][1] = u < 2 * g2,
//                g2 = p2 / (p1 + p2), u = UniformAt(second_key, first_token + t) (GShard).
// probs (T, E) f32, indices (T, k) i32, gates (T, k) f32, keep (T, k) u8 are outputs.
void RouterTopK(const Tensor& logits, const Tensor& bias, bool normalize, bool random_second,
                RngKey second_key, int64_t first_token, Tensor& probs, Tensor& indices,
                Tensor& gates, Tensor& keep, DeviceContext* ctx = nullptr);

// How RouterTopKScored scores the experts and limits a token's choice (docs/model.md, "The
// MoE layer", steps 1-3).
struct RouterScoring {
  bool sigmoid = false;    // scores = sigmoid(logits) (DeepSeek-V3), probs = scores / their
                           // sum; false: scores = probs = softmax(logits)
  bool normalize = false;  // gates divided by their (f32, in order) sum
  int64_t groups = 0;      // G > 0: node-limited routing over G contiguous groups of E/G
  int64_t group_topk = 0;  // M: a token chooses among the experts of its M best groups
};

// RouterTopK with a score function and node-limited routing. Per token t:
//   softmax: probs[t] as RouterTopK's; scores undefined (they are the probs)
//   sigmoid: scores[t, e] = 1 / (1 + exp(-logits[t, e])) (in double, rounded to f32 once),
//            probs[t, e] = scores[t, e] * f32(1 / sum_e scores[t, e]) (sum in double)
//   c = scores (+ bias): the choice scores
//   groups G > 0: group g holds experts [g E/G, (g+1) E/G); its score is the f32 sum of its
//     two largest c (the largest alone when E/G = 1); the M groups of largest score (ties
//     to the smaller group) stay, every other group's experts are out of the choice
//   indices[t] = the k experts of largest c among those left, best first, ties to the
//     smaller expert index; gates[t] = scores[t][indices[t]] (/ their f32 sum when
//     normalize); keep as RouterTopK's, with p1, p2 the two chosen scores.
// scores (T, E) f32 is written for sigmoid only (pass undefined for softmax). CPU only for
// sigmoid or G > 0 (a CUDA tensor is a fatal error naming the keys).
void RouterTopKScored(const Tensor& logits, const Tensor& bias, const RouterScoring& scoring,
                      bool random_second, RngKey second_key, int64_t first_token,
                      Tensor& probs, Tensor& scores, Tensor& indices, Tensor& gates,
                      Tensor& keep, DeviceContext* ctx = nullptr);
// The same with the random second expert's key stream and first token read from device
// memory when it runs (kernels/random.h's DeviceRng, per_token 1; runtime.cuda_graphs):
// the bits of the host-key op with RngKey{seed, stream} and first_token + token_offset.
void RouterTopKScored(const Tensor& logits, const Tensor& bias, const RouterScoring& scoring,
                      bool random_second, const DeviceRng& second, Tensor& probs,
                      Tensor& scores, Tensor& indices, Tensor& gates, Tensor& keep,
                      DeviceContext* ctx = nullptr);

// The backward of RouterTopKScored to the logits, per token, in double, rounded once:
//   ds = the gates' share on the scores: ds[idx_j] += dg_j, or with normalize
//        (g_j = s_j / Sk, Sk = sum_l s_l over the chosen)  ds[idx_j] += (dg_j - sum_l dg_l g_l) / Sk
//   softmax (s = p):  dp = ds + dprobs;  dlogits = p * (dp - sum_e p_e dp_e)
//   sigmoid:          ds += (dprobs - sum_e dprobs_e p_e) / S, S = sum_e s_e (p = s / S);
//                     dlogits = ds * s * (1 - s)
//   dlogits += dlogits_extra.
// scores: (T, E) for sigmoid, undefined for softmax. Node-limited routing needs nothing
// more: the groups only choose. CPU only for sigmoid.
void RouterBackwardScored(const Tensor& probs, const Tensor& scores, const Tensor& indices,
                          const Tensor& gates, const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, const RouterScoring& scoring,
                          Tensor& dlogits, DeviceContext* ctx = nullptr);

// The backward of RouterTopK's gates and probs to the logits, per token:
//   dp = dprobs[t] (or 0) + the gates' share: dp[idx_j] += dg_j, or with normalize
//        (g_j = p_j / S, S = sum_l p_l)  dp[idx_j] += (dg_j - sum_l dg_l g_l) / S
//   dlogits[t] = p * (dp - sum_e p_e dp_e) + dlogits_extra[t] (or 0)
// in double, rounded to f32 once. probs (T, E), indices (T, k) i32, gates and dgates (T, k);
// dprobs and dlogits_extra (T, E) f32 or undefined. dlogits (T, E) f32 is overwritten.
void RouterBackwardLogits(const Tensor& probs, const Tensor& indices, const Tensor& gates,
                          const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, bool normalize, Tensor& dlogits,
                          DeviceContext* ctx = nullptr);

// Assignment counts by slot and expert. indices (T, k) i32; keep (T, k) u8 or undefined for
// all ones. counts (k * E + 1) i64 is overwritten: counts[j * E + e] = assignments (t, j)
// to expert e with keep = 1, and counts[k * E] = the number of indices outside [0, E)
// (whatever keep says; callers check it is 0).
void CountSlotAssignments(const Tensor& indices, const Tensor& keep, int64_t num_experts,
                          Tensor& counts, DeviceContext* ctx = nullptr);

// Assignment counts by (label, expert), added to what counts holds: the routing-by-language
// record of a training step (engine/train/metrics.h RoutingByLabel), left on the device for
// the step's readback (engine/core/step_readback.h). indices (T, k) i32; labels (T) i32, the
// label id of each token (a token whose label is outside [0, L) is not counted); counts
// (L * E + 1) f64: counts[l * E + e] += the assignments of label-l tokens to expert e, and
// counts[L * E] += the counted tokens' indices outside [0, E) (0 unless the routing is
// broken; the caller checks it). Integer sums in f64: exact below 2^53 in any order.
// Nothing waits.
void AddLabelAssignmentCounts(const Tensor& indices, const Tensor& labels, int64_t num_labels,
                              int64_t num_experts, Tensor& counts, DeviceContext* ctx = nullptr);

// sums[e] = sum over t of probs[t, e], accumulated in double and rounded to f32.
// probs (T, E) f32; sums (E) f32 is overwritten. The CUDA sum is deterministic (a fixed
// two-level order, no atomics).
void ProbColumnSums(const Tensor& probs, Tensor& sums, DeviceContext* ctx = nullptr);

// x[t, e] += column[e] for x (T, E) f32 (kSet: x[t, e] = +0 + column[e], x unread); column
// (E) is on the host.
void AddColumnConstants(Tensor& x, std::span<const float> column, Write write,
                        DeviceContext* ctx = nullptr);

// The router z-loss (ST-MoE) of logits (T, E) f32, with n = group_tokens (<= 0: n = T):
//   returns coef * (1 / n) * sum_t lse_t^2, lse_t = logsumexp(logits[t]) (in double), and
//   when dlogits (T, E) f32 is given adds grad * coef * (2 / n) * lse_t * softmax(logits[t]).
float RouterZLoss(const Tensor& logits, float coef, float grad, int64_t group_tokens,
                  Tensor* dlogits, DeviceContext* ctx = nullptr);

// RouterZLoss's value (no gradient) left on the device, for the training step's single
// readback (engine/core/step_readback.h): value (1) f64 on the logits' device gets the f32
// RouterZLoss returns, as a double; nothing is read back.
void RouterZLossInto(const Tensor& logits, float coef, int64_t group_tokens, Tensor& value,
                     DeviceContext* ctx = nullptr);

// RouterZLoss's gradient alone (the same values), without computing or copying back the
// loss: on CUDA it does not wait for the stream. kAdd adds it into dlogits as RouterZLoss
// does; kSet writes +0 + it (the bits of adding into zeros), dlogits unread.
void RouterZLossBackward(const Tensor& logits, float coef, float grad, int64_t group_tokens,
                         Tensor& dlogits, Write write, DeviceContext* ctx = nullptr);

// DeepSeek-V3 bias update: bias[i] += rate if sum_j c_j > E * c_i, -= rate if <, unchanged
// if equal. bias (E) f32; counts (E) on the host.
void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate,
                      DeviceContext* ctx = nullptr);

// Capacity admission (moe/capacity.h states the contract).
enum class AdmissionOrder {
  kPosition,     // slot by slot, tokens in order; optional (k * E) priority offsets
  kProbability,  // decreasing gate, ties by token then slot
};

// Host-side totals of an admission.
struct AdmissionCounts {
  std::vector<int64_t> before;  // (E) assignments that competed (keep = 1)
  std::vector<int64_t> after;   // (E) assignments admitted
  int64_t removed = 0;          // assignments with keep = 0
};

// Admits the assignments indices (T, k) i32 (keep (T, k) u8 or undefined; gates (T, k) f32,
// read by kProbability only) to experts of capacity C = `capacity` (< 0: unlimited). Writes
// kept (T, k) u8 (1 iff admitted) and position (T, k) i64 (the rank among its expert's
// competitors in priority order, offsets included; -1 when not admitted). offsets: empty or
// (k * E) (kPosition only), offsets[j * E + e] being the rank of the piece's first slot-j
// assignment to e. CUDA: a stable radix sort of the assignments by (expert, slot) or
// (expert, decreasing gate), then one kernel to rank them; the counts come back in one copy.
AdmissionCounts AdmitAssignments(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                                 int64_t num_experts, int64_t capacity, AdmissionOrder order,
                                 std::span<const int64_t> offsets, Tensor& kept,
                                 Tensor& position, DeviceContext* ctx = nullptr);

// AdmitAssignments of a whole group (no offsets) in a training step, its counts left on the
// device for the step's readback (engine/core/step_readback.h): counts (E + 1) f64 on
// kept's device gets each expert's admitted assignments (AdmissionCounts::after, exactly),
// then the number of expert indices outside [0, E) (0 unless the routing is broken; the step
// checks it when it reads the counts). kept and position as AdmitAssignments writes them.
// Nothing is read back and nothing waits.
void AdmitAssignmentsInto(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                          int64_t num_experts, int64_t capacity, AdmissionOrder order,
                          Tensor& kept, Tensor& position, Tensor& counts,
                          DeviceContext* ctx = nullptr);

namespace cpu {
void RouterTopK(const Tensor& logits, const Tensor& bias, bool normalize, bool random_second,
                RngKey second_key, int64_t first_token, Tensor& probs, Tensor& indices,
                Tensor& gates, Tensor& keep);
void RouterBackwardLogits(const Tensor& probs, const Tensor& indices, const Tensor& gates,
                          const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, bool normalize, Tensor& dlogits);
// kernels/cpu/moe_scoring.cc.
void RouterTopKScored(const Tensor& logits, const Tensor& bias, const RouterScoring& scoring,
                      bool random_second, RngKey second_key, int64_t first_token,
                      Tensor& probs, Tensor& scores, Tensor& indices, Tensor& gates,
                      Tensor& keep);
void RouterBackwardScored(const Tensor& probs, const Tensor& scores, const Tensor& indices,
                          const Tensor& gates, const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, const RouterScoring& scoring,
                          Tensor& dlogits);
void CountSlotAssignments(const Tensor& indices, const Tensor& keep, int64_t num_experts,
                          Tensor& counts);
void AddLabelAssignmentCounts(const Tensor& indices, const Tensor& labels, int64_t num_labels,
                              int64_t num_experts, Tensor& counts);
void ProbColumnSums(const Tensor& probs, Tensor& sums);
void AddColumnConstants(Tensor& x, std::span<const float> column, Write write);
// dlogits may be null (then write is unused); RouterZLossBackward calls this and drops the
// value.
float RouterZLoss(const Tensor& logits, float coef, float grad, int64_t group_tokens,
                  Tensor* dlogits, Write write);
void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate);
AdmissionCounts AdmitAssignments(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                                 int64_t num_experts, int64_t capacity, AdmissionOrder order,
                                 std::span<const int64_t> offsets, Tensor& kept,
                                 Tensor& position);
}  // namespace cpu

namespace cuda {
void RouterTopK(const Tensor& logits, const Tensor& bias, bool normalize, bool random_second,
                RngKey second_key, int64_t first_token, Tensor& probs, Tensor& indices,
                Tensor& gates, Tensor& keep, DeviceContext* ctx);
void RouterTopK(const Tensor& logits, const Tensor& bias, bool normalize, bool random_second,
                const DeviceRng& second, Tensor& probs, Tensor& indices, Tensor& gates,
                Tensor& keep, DeviceContext* ctx);
void RouterBackwardLogits(const Tensor& probs, const Tensor& indices, const Tensor& gates,
                          const Tensor& dgates, const Tensor& dprobs,
                          const Tensor& dlogits_extra, bool normalize, Tensor& dlogits,
                          DeviceContext* ctx);
void CountSlotAssignments(const Tensor& indices, const Tensor& keep, int64_t num_experts,
                          Tensor& counts, DeviceContext* ctx);
void AddLabelAssignmentCounts(const Tensor& indices, const Tensor& labels, int64_t num_labels,
                              int64_t num_experts, Tensor& counts, DeviceContext* ctx);
void ProbColumnSums(const Tensor& probs, Tensor& sums, DeviceContext* ctx);
void AddColumnConstants(Tensor& x, std::span<const float> column, Write write,
                        DeviceContext* ctx);
// dlogits may be null. want_value: compute and copy back the loss (else returns 0).
float RouterZLoss(const Tensor& logits, float coef, float grad, int64_t group_tokens,
                  Tensor* dlogits, Write write, bool want_value, DeviceContext* ctx);
// The value into value (1) f64 on the device, no copy back.
void RouterZLossInto(const Tensor& logits, float coef, int64_t group_tokens, Tensor& value,
                     DeviceContext* ctx);
void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate,
                      DeviceContext* ctx);
AdmissionCounts AdmitAssignments(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                                 int64_t num_experts, int64_t capacity, AdmissionOrder order,
                                 std::span<const int64_t> offsets, Tensor& kept,
                                 Tensor& position, DeviceContext* ctx);
void AdmitAssignmentsInto(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                          int64_t num_experts, int64_t capacity, AdmissionOrder order,
                          Tensor& kept, Tensor& position, Tensor& counts, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
