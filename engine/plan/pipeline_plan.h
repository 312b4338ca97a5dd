// The pipeline part of `switchyard train --dry-run` (dry_run.h): a layout's model stages,
// its schedule's action lists checked rank against rank, the bubble, and per stage the
// micro-batches in flight and the activations they keep (docs/pipeline.md, "The dry-run").
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/dist/mesh.h"
#include "engine/model/stage.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/plan/activation_memory.h"
#include "engine/config/config.h"

namespace switchyard::plan {

// The pipeline of a layout, model stage by model stage.
struct PipelineStagePlan {
  model::Stage stage;
  int rank = 0;                 // the pipeline rank holding it (model stage % pp)
  double cost = 0;              // model::StageCosts' share of the model
  int in_flight = 0;            // the most micro-batches whose activations it keeps (MaxInFlight)
  double micro_batch_bytes = 0; // the activations one micro-batch keeps on it
  double activation_bytes() const { return in_flight * micro_batch_bytes; }
};
struct PipelinePlan {
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::kOneFOneB;
  int pp = 1, micro_batches = 1, virtual_stages = 1;
  // OK, or CheckCommunicatorOrder's first failure on the layout's lists.
  Status order = OkStatus();
  double bubble = 0;  // parallel::AnalyticBubble
  std::vector<PipelineStagePlan> stages;  // every model stage, in model order
  std::vector<StepWorkspace> ranks;       // per pipeline rank: its step's workspace
};
// The layout's stages, the schedule's lists checked with CheckCommunicatorOrder, the bubble
// and, per stage, micro-batches in flight and activation bytes. Errors: the schedule or
// the split of the layers is impossible (Config::Validate's messages).
StatusOr<PipelinePlan> PlanPipeline(const config::Config& config, const dist::Mesh& mesh);

// Every communicator sees the same operations in the same order on all its ranks, given
// each world rank's action list (list_of(world rank)): the lists of the pipeline group of
// rank 0 pass parallel::ValidateActionLists (the pp communicator's messages), and every
// other rank runs the list of the rank of that group with its pipeline rank. So each
// group without the pp axis — tp, cp, dp, ep, etp, edp and their products, whose ranks
// share a pipeline rank — runs one list on all its ranks, and its collectives (inside the
// forwards and backwards) come in one order. The first failure is InvalidArgument naming
// the group, the rank and the action.
Status CheckCommunicatorOrder(
    const dist::Mesh& mesh, int micro_batches, int virtual_stages,
    const std::function<const std::vector<parallel::Action>&(int world_rank)>& list_of);

// The report's pipeline section ("pipeline: ..." and its table), for pp > 1 or virtual
// stages; a setting PlanPipeline rejects is one line naming it. `check` receives the
// lists' CheckCommunicatorOrder result.
std::string PipelineReport(const config::Config& config, const dist::Mesh& mesh, Status* check);

}  // namespace switchyard::plan
