// The MoE router for one routing group of T tokens (../shared/MODEL.md section 2), as pure
// functions: forward, backward, and the aux-loss-free expert-bias update. No hidden state:
// everything the backward needs is in RouterOutput. The MoE layer loops over groups.
//
//   x       = h * noise                    (T, d)  noise ~ U[1-eps, 1+eps], training only
//   logits  = x @ Wr                       (T, E)  fp32
//   scores  = softmax(logits) | sigmoid(logits)  (T, E)  moe.score
//   probs   = scores / their sum           (T, E)  (= scores for softmax)
//   indices = top-k of scores (+ b)        (T, k)  ties to the smaller expert index; with
//             moe.route_groups only among the experts of the token's best groups
//   gates   = scores[indices] (/ their sum) (T, k) always from the unbiased scores
//   keep    = GShard random second choice  (T, k)  u < 2 * p2 / (p1 + p2)
//
// Randomness (philox.h) is keyed by (seed, stream, element): the streams are named by what
// they are for, the layer and the step (JitterRngKey, SecondExpertRngKey), and the element
// is the token's GLOBAL index (times d, plus j, for the jitter), so a token's noise does not
// depend on the group it is routed in or on which rank routes it.
//
// Devices: every function below takes its tensors on the CPU or all on ctx's CUDA device
// (one device per call; ctx is required for CUDA tensors and may be null for CPU ones).
// Output tensors are allocated on that device. Host-side results (std::span counts) stay
// host values: on CUDA they are computed on the device and copied back with one small
// device->host copy (which synchronises ctx's stream); RouterForward and RouterBackward
// only queue work. The router's matrix products run in f32 whatever ctx's matmul_dtype
// (MODEL.md section 2: the logits are fp32 on every backend).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/random.h"
#include "moe/moe_config.h"

namespace switchyard::moe {

// What a routing group's random draws are keyed by.
struct RouterRng {
  uint64_t seed = 0;        // MoEConfig::seed
  int64_t step = 0;         // optimizer step
  int64_t layer = 0;        // layer id
  int64_t first_token = 0;  // global index of the group's first token
  // runtime.cuda_graphs: the step's keys and first token read from device memory when the
  // draws run, so that a replay draws the step's numbers (kernels/random.h, DeviceRng).
  // (4) i64 on the layer's device, this layer's RouterRngValues: {jitter stream, base,
  // second-expert stream, base}, base being the micro-batch's first token, which first_token
  // is then an offset from (first_token - device_base is the same every step). Undefined:
  // the keys are computed on the host from step and first_token.
  Tensor device_values = Tensor();
  int64_t device_base = 0;
};

// The device values of every layer's RouterRng for a micro-batch whose first token is
// first_token: 4 per layer (layer l at 4 l), as RouterRng::device_values describes.
std::vector<int64_t> RouterRngValues(uint64_t seed, int64_t step, int64_t n_layers,
                                     int64_t first_token);

// Stream of the jitter noise: StreamId("layers.<layer>.moe.router.jitter.step.<step>").
// Element global_token * d + j is the noise of feature j of that token.
RngKey JitterRngKey(uint64_t seed, int64_t step, int64_t layer);
// Stream of the random second-expert draw:
// StreamId("layers.<layer>.moe.router.second_expert.step.<step>"); element = global token.
RngKey SecondExpertRngKey(uint64_t seed, int64_t step, int64_t layer);

// `rows` rows holding a routing group's tokens [token, token + rows) (indices within the
// group; moe/group_routing.h's GroupLayout).
struct TokenRun {
  int64_t token = 0;
  int64_t rows = 0;
};

// Where a block of rows' jitter noise comes from: row r's feature j draws U[lo, hi) at
// element (its global token) * d + j of JitterRngKey's stream (or of the stream in
// rng.device_values under runtime.cuda_graphs). The noise is drawn where it is used
// (kernels::MulUniform): the forward's x = h * noise and the backward's dh += dx * noise draw
// the same numbers, and no (T, d) noise is kept between them.
struct JitterDraw {
  bool on = false;  // training with moe.jitter_eps > 0
  float lo = 1.0f, hi = 1.0f;
  RouterRng rng;    // rng.first_token: the global index of the rows' first token
  std::vector<TokenRun> runs;  // the rows' tokens, as group indices from rng.first_token;
                               // empty: consecutive tokens from rng.first_token
};

// out (T, d) = x * noise (kSet) or out += x * noise (kAdd), x (T, d) f32, rows as `draw`
// describes them (draw.on).
void MulJitter(const JitterDraw& draw, const Tensor& x, Tensor& out, kernels::Write write,
               DeviceContext* ctx = nullptr);

// The jitter noise of out's rows as a (T, d) tensor, drawn again (MulJitter of ones);
// undefined without jitter. For tests and inspection: training never stores it.
struct RouterOutput;
Tensor JitterNoise(const RouterOutput& out, DeviceContext* ctx = nullptr);

// Everything the router produces for one group; the backward reads it back.
struct RouterOutput {
  Tensor input;       // (T, d) f32: the router input x = h * noise; shares h when no jitter
  JitterDraw jitter;  // the noise's draw (off when no jitter was applied)
  Tensor logits;      // (T, E) f32
  Tensor probs;       // (T, E) f32: a distribution over the experts (the aux loss's P)
  Tensor scores;      // (T, E) f32: what gates and the choice read; the probs for softmax
  Tensor indices;     // (T, k) i32: chosen experts, best first
  Tensor gates;       // (T, k) f32: NOT masked by `keep`; the combine uses capacity's mask
  Tensor keep;        // (T, k) u8: 0 where the random policy removed the second choice
};

// Routes one group. h: (T, d) f32; wr: (d, E) f32; expert_bias: (E) f32 or undefined
// (added to probs for the choice only). Jitter applies when training && jitter_eps > 0.
// The random second-expert policy applies in training and in evaluation alike (MODEL.md
// only makes the jitter training-only); it is keyed by the step either way.
// RouterForward = RouterLogits, then RouterChoose on the same rows.
RouterOutput RouterForward(const Tensor& h, const Tensor& wr, const Tensor& expert_bias,
                           const MoEConfig& config, bool training, const RouterRng& rng,
                           DeviceContext* ctx = nullptr);

// The first half of RouterForward, for any block of rows (a tp rank's piece of a group):
// fills input (T, d), its jitter draw and logits (T, E); rng.first_token is the global index of
// h's first row (keys the jitter). With runs (summing to T rows), h's rows are those runs
// of the group whose first token is rng.first_token instead.
RouterOutput RouterLogits(const Tensor& h, const Tensor& wr, const MoEConfig& config,
                          bool training, const RouterRng& rng, DeviceContext* ctx = nullptr,
                          std::span<const TokenRun> runs = {});

// The second half: probs, indices, gates and keep (T, ...) from out.logits (T, E), which
// may hold more rows than out.input (a whole group gathered from its pieces).
// rng.first_token is the global index of the logits' first row (keys the random second
// expert).
void RouterChoose(RouterOutput& out, const Tensor& expert_bias, const MoEConfig& config,
                  const RouterRng& rng, DeviceContext* ctx = nullptr);

// The router's backward for one group. Returns dlogits (T, E) and accumulates
//   dh  (T, d) += (dlogits @ Wr^T) * noise      (noise = 1 without jitter)
//   dwr (d, E) += x^T @ dlogits
// dgates (T, k): dLoss/dgates, the gates as RouterForward returned them (the layer passes
// zero for assignments that did not reach an expert). dprobs (T, E) (the load-balancing
// loss's) and dlogits_extra (T, E) (the z-loss's) are optional extra gradients; pass
// undefined tensors to leave them out. With normalize_gates, g_j = p_j / S, S = sum_l p_l:
//   dp_j = (dg_j - sum_l dg_l g_l) / S.
Tensor RouterBackward(const RouterOutput& out, const Tensor& wr, const MoEConfig& config,
                      const Tensor& dgates, const Tensor& dprobs, const Tensor& dlogits_extra,
                      Tensor& dh, Tensor& dwr, DeviceContext* ctx = nullptr);

// Top-k assignments per expert, (E), counting every (token, slot) of `indices` (T, k)
// whatever later removes it (random policy, capacity). Adds into `counts` (host); with
// CUDA indices the per-expert counts are computed on the device and copied back.
void CountAssignments(const Tensor& indices, std::span<int64_t> counts,
                      DeviceContext* ctx = nullptr);

// DeepSeek-V3 aux-loss-free balancing (arXiv 2412.19437, section 2.1.2), after each
// optimizer step: b_i += rate * sign(mean_j c_j - c_i), sign(0) = 0. counts (E) are the
// tokens routed to each expert in the step (top-k assignments), summed over the whole
// data-parallel world. The sign is taken exactly, on sum_j c_j - E * c_i. bias: (E) f32 on
// the CPU or on ctx's CUDA device; counts are host values.
void UpdateExpertBias(Tensor& bias, std::span<const int64_t> counts, float rate,
                      DeviceContext* ctx = nullptr);

// The proportional variant (Wang et al. 2024, "Auxiliary-Loss-Free Load Balancing", their
// update for softmax gates; moe.expert_bias_update=proportional): b_i += rate * e_i with
// e_i = (mean_j c_j - c_i) / mean_j c_j, the expert's deviation relative to the mean load (so
// the rate does not depend on the tokens per step). In double, rounded to f32 once per
// expert; no change when every count is 0. Same devices as UpdateExpertBias (the E values
// make a round trip through the host).
void UpdateExpertBiasProportional(Tensor& bias, std::span<const int64_t> counts, float rate,
                                  DeviceContext* ctx = nullptr);

}  // namespace switchyard::moe
