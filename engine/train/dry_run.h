// `switchyard train --dry-run`: what a config costs before anything is allocated —
// parameter counts (total, and active per token), training FLOPs per token, and the memory
// each rank needs under the config's layout.
#pragma once

#include <cstdint>
#include <string>

#include "engine/dist/mesh.h"
#include "engine/parallel/parameter.h"
#include "engine/train/config.h"

namespace switchyard::train {

struct ModelCost {
  int64_t total_params = 0;      // every trainable parameter, experts included
  int64_t active_params = 0;     // used by one token: dense + router + k experts + shared
  int64_t embedding_params = 0;  // wte (+ wpe); the lookup does no matrix product
  int64_t expert_params = 0;     // all routed experts
  // Training FLOPs per token: 6 * (active matrix parameters, the head included, the
  // embedding lookup excluded) + 12 * L * S * (n_heads * head_dim) for attention scores and
  // values (Kaplan et al. 2020; PaLM's 6N + 12LHQT), causal masking not subtracted.
  double flops_per_token = 0;
  // Bytes per rank: fp32 weights + gradients + optimizer state (AdamW: 2, SGD: 1 per
  // element), with the routed experts split over ep; and the activations one micro-batch
  // keeps for backward (an estimate from the tensors the layers store).
  double param_bytes_per_rank = 0;
  double activation_bytes_per_rank = 0;
};

ModelCost EstimateCost(const Config& config);

// The trainable parameter elements one rank holds, by group (the parameter descriptions'
// terms, engine/parallel/parameter.h):
//   dense       dense-view boxes that no other tensor-parallel rank holds (split over tp,
//               or everything dense when tp = 1)
//   replicated  boxes whose copies live on several tensor-parallel ranks (norm weights,
//               the router, row-parallel biases, wpe and the shared experts under tp; the
//               experts' output bias under etp)
//   expert      routed-expert boxes (split over ep, and over etp on the hidden dim)
struct RankParams {
  int64_t dense = 0, replicated = 0, expert = 0;
  int64_t total() const { return dense + replicated + expert; }
  bool operator==(const RankParams&) const = default;
};

// From the config and the rank's place in the mesh (no model is built, so it works for any
// size): what the layers' splits put on `rank`.
RankParams EstimateRankParams(const Config& config, const dist::Mesh& mesh, int rank);
// The same counted from a built model's descriptions (the test that the two agree keeps the
// estimate honest).
RankParams CountRankParams(const parallel::ParameterRegistry& registry);

// The bytes one rank holds under the config's ZeRO stage (docs/zero.md): the model states
// between steps — the ZeRO paper's formulas with this engine's f32 constants (4 bytes of
// weights, 4 of gradients, 4 per optimizer state tensor: AdamW 2, SGD with momentum 1),
// each parameter group partitioned over its own data-parallel group (dense over dp x cp,
// tp-summed replicas over dp x cp x tp, routed experts over edp) — and an estimate of the
// workspace peak (activations of the micro-batches in flight, gradient buckets, the full
// gradients of stages 2-3 during backward, two gathered parts of stage 3).
struct RankMemory {
  double parameters = 0, gradients = 0, optimizer = 0;
  double workspace = 0;
  double model_states() const { return parameters + gradients + optimizer; }
  double total() const { return model_states() + workspace; }
};
RankMemory PredictRankMemory(const Config& config, const dist::Mesh& mesh, int rank);

// The human-readable report: sizes, layout, counts, FLOPs, memory, and a table of the
// parameter elements and bytes (weights + gradients + optimizer state, f32) every rank of
// the layout holds, by group.
std::string DryRunReport(const Config& config, int world);

}  // namespace switchyard::train
