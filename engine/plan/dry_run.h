// `switchyard train --dry-run`: what a config costs before anything is allocated —
// parameter counts (total, and active per token), training FLOPs per token, the memory
// each rank needs under the config's layout and, with pipeline parallelism, the stages,
// the schedule's checks, bubble and micro-batches in flight (docs/pipeline.md).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/dist/mesh.h"
#include "engine/model/param_table.h"
#include "engine/model/stage.h"
#include "engine/parallel/parameter.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/plan/activation_memory.h"
#include "engine/config/config.h"
#include "engine/plan/pipeline_plan.h"

namespace switchyard::plan {

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
  // keeps for backward through the whole model (the sum of EstimateActivationBytes' pieces:
  // a pipeline stage keeps its own layers' share, PlanPipeline).
  double param_bytes_per_rank = 0;
  double activation_bytes_per_rank = 0;
};

ModelCost EstimateCost(const config::Config& config);

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
// size): what the layers' splits put on `rank`, of its pipeline stage's layers (the
// embedding on the first stage; the final norm, the head, or with tied embeddings the
// token table's copy, on the last).
RankParams EstimateRankParams(const config::Config& config, const dist::Mesh& mesh, int rank);

// The model stages pipeline rank `pp_rank` holds: its chunks, chunk c being model stage
// c * pp + pp_rank (PartitionLayers over pp x virtual_stages stages); the whole model
// when pp = virtual_stages = 1. CHECK-fails on a layout Config::Validate rejects.
std::vector<model::Stage> RankStages(const config::Config& config, int pp_rank);
// The same counted from a built model's descriptions (the test that the two agree keeps the
// estimate honest).
RankParams CountRankParams(const parallel::ParameterRegistry& registry);

// One parameter a rank holds, from the parameter table: its entry, the elements of its
// box, the axes (of shape.view()) its gradient is summed over (ParamTable::GradSum) and
// whether it is a pipeline-stage copy of the tied token table (Parameter::tied).
struct HeldParam {
  model::ParamShape shape;
  int64_t numel = 0;
  parallel::AxisSet grad_sum;
  bool tied = false;
};
// Every parameter `rank` holds, in the order its chunks' decoders register them
// (ParamTable::StageParams of each chunk, in chunk order): the runtime's registry.
std::vector<HeldParam> HeldParams(const config::Config& config, const dist::Mesh& mesh, int rank);

// The bytes one rank holds under the config's ZeRO stage (docs/zero.md): the model states
// between steps — the ZeRO paper's formulas with this engine's f32 constants (4 bytes of
// weights, 4 of gradients, 4 per optimizer state tensor: AdamW 2, SGD with momentum 1),
// each parameter group partitioned over its own data-parallel group (dense over dp x cp,
// tp-summed replicas over dp x cp x tp, routed experts over edp), of the rank's pipeline
// stage — and an estimate of the workspace peak: one step of the rank's schedule walked
// by SimulateStepWorkspace (the activations of the micro-batches in flight, messages, the
// ordered gradient accumulation's tree, the gradient buckets), plus the full gradients of
// ZeRO stages 2-3 during backward and two gathered parts of stage 3.
struct RankMemory {
  double parameters = 0, gradients = 0, optimizer = 0;
  double workspace = 0;
  double activations_peak = 0;  // of the step's walk: the most kept activations at once (in workspace)
  double model_states() const { return parameters + gradients + optimizer; }
  double total() const { return model_states() + workspace; }
};
RankMemory PredictRankMemory(const config::Config& config, const dist::Mesh& mesh, int rank);
// Its model states alone (no workspace, no walk of the step): a floor of its total.
RankMemory PredictRankStates(const config::Config& config, const dist::Mesh& mesh, int rank);
// A floor of its total without the walk of the step: the model states, the token ids and
// the largest chunk's kept activations of one micro-batch with its backward's transient.
double PredictRankFloor(const config::Config& config, const dist::Mesh& mesh, int rank);

// The step's workspace of one rank as PredictRankMemory computes it (no ZeRO terms).
StepWorkspace PredictStepWorkspace(const config::Config& config, const dist::Mesh& mesh, int rank);
// What PredictStepWorkspace walks: the rank's schedule, its chunks' activations, its
// gradients and the sync's buckets (engine/plan/device_fit.h varies the sync term).
StepWorkspaceInputs StepWorkspaceInputsOf(const config::Config& config, const dist::Mesh& mesh,
                                          int rank);

// "1.50 MiB": bytes in powers of 1024, two decimals (engine/core/allocator.h).
using ::switchyard::FormatBytes;

// The human-readable report: sizes, layout, counts, FLOPs, memory, and a table of the
// parameter elements and bytes (weights + gradients + optimizer state, f32) every rank of
// the layout holds, by group; with pp > 1 (or virtual stages) the pipeline section of
// PlanPipeline. `check`, when given, receives the pipeline's CheckCommunicatorOrder result
// (OK without pipeline parallelism).
std::string DryRunReport(const config::Config& config, int world, Status* check = nullptr);

}  // namespace switchyard::plan
