#include "engine/plan/pipeline_plan.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "engine/plan/dry_run.h"

namespace switchyard::plan {

using parallel::Action;

namespace {

// The first index where two lists differ (the shorter one's length if one is a prefix).
size_t FirstDifference(const std::vector<Action>& a, const std::vector<Action>& b) {
  size_t i = 0;
  while (i < a.size() && i < b.size() && a[i] == b[i]) ++i;
  return i;
}

std::string ActionAt(const std::vector<Action>& list, size_t i) {
  return i < list.size() ? StrCat("action ", i, " (", parallel::FormatAction(list[i]), ")")
                         : StrCat("no action ", i, " (", list.size(), " actions)");
}

}  // namespace

Status CheckCommunicatorOrder(
    const dist::Mesh& mesh, int micro_batches, int virtual_stages,
    const std::function<const std::vector<Action>&(int world_rank)>& list_of) {
  using dist::Axis;
  using dist::View;
  const auto pp_groups = mesh.Groups(View::kDense, {Axis::kPp});
  std::vector<std::vector<Action>> first;
  for (int r : pp_groups[0]) first.push_back(list_of(r));
  if (Status s = parallel::ValidateActionLists(first, mesh.pp(), micro_batches, virtual_stages);
      !s.ok()) {
    return InvalidArgument("pipeline group ", dist::FormatGroup(pp_groups[0]), ": ", s.message());
  }
  for (size_t g = 1; g < pp_groups.size(); ++g) {
    for (size_t i = 0; i < pp_groups[g].size(); ++i) {
      const std::vector<Action>& mine = list_of(pp_groups[g][i]);
      const size_t at = FirstDifference(mine, first[i]);
      if (at == mine.size() && at == first[i].size()) continue;
      return InvalidArgument("pipeline group ", dist::FormatGroup(pp_groups[g]), ": rank ",
                             pp_groups[g][i], " (pipeline rank ", i, ") has ", ActionAt(mine, at),
                             " where rank ", pp_groups[0][i], " of the validated group ",
                             dist::FormatGroup(pp_groups[0]), " has ", ActionAt(first[i], at));
    }
  }
  return OkStatus();
}

StatusOr<PipelinePlan> PlanPipeline(const config::Config& c, const dist::Mesh& mesh) {
  const config::ParallelConfig& p = c.parallel;
  PipelinePlan plan;
  plan.schedule = p.pipeline_schedule;
  plan.pp = mesh.pp();
  plan.micro_batches = static_cast<int>(c.train.grad_accum);
  plan.virtual_stages = p.virtual_stages;
  SY_RETURN_IF_ERROR(parallel::CheckScheduleArgs(plan.schedule, plan.pp, plan.micro_batches,
                                                 plan.virtual_stages));
  SY_ASSIGN_OR_RETURN(const std::vector<model::Stage> stages,
                      model::PartitionLayers(c.model, c.moe, plan.pp * plan.virtual_stages,
                                             p.pipeline_layers));
  std::vector<std::vector<Action>> lists;  // per pipeline rank
  for (int r = 0; r < plan.pp; ++r) {
    lists.push_back(parallel::ScheduleActions(plan.schedule, plan.pp, plan.micro_batches,
                                              plan.virtual_stages, r));
  }
  plan.order = CheckCommunicatorOrder(
      mesh, plan.micro_batches, plan.virtual_stages, [&](int rank) -> const std::vector<Action>& {
        return lists[mesh.Coord(rank, dist::View::kDense, dist::Axis::kPp)];
      });
  plan.bubble = parallel::AnalyticBubble(plan.schedule, plan.pp, plan.micro_batches,
                                         plan.virtual_stages);
  const std::vector<double> costs = model::StageCosts(c.model, c.moe, stages);
  const ActivationBytes acts = EstimateActivationBytes(c);
  for (size_t s = 0; s < stages.size(); ++s) {
    const int rank = static_cast<int>(s) % plan.pp, chunk = static_cast<int>(s) / plan.pp;
    std::vector<Action> mine;  // the rank's actions on this chunk
    for (const Action& a : lists[rank])
      if (a.chunk == chunk) mine.push_back(a);
    plan.stages.push_back({.stage = stages[s], .rank = rank, .cost = costs[s],
                           .in_flight = parallel::MaxInFlight(mine),
                           .micro_batch_bytes = acts.Stage(stages[s])});
  }
  const std::vector<int> group = mesh.GroupOf(0, dist::View::kDense, {dist::Axis::kPp});
  for (int r = 0; r < plan.pp; ++r) plan.ranks.push_back(PredictStepWorkspace(c, mesh, group[r]));
  return plan;
}

std::string PipelineReport(const config::Config& c, const dist::Mesh& mesh, Status* check) {
  auto plan = PlanPipeline(c, mesh);
  if (!plan.ok()) {
    if (check != nullptr) *check = plan.status();
    return StrCat("pipeline: ", plan.status().message(), "\n");
  }
  if (check != nullptr) *check = plan->order;
  const bool interleaved = plan->virtual_stages > 1;
  std::ostringstream out;
  out << "pipeline: pp " << plan->pp << ", schedule " << parallel::PipelineScheduleName(plan->schedule)
      << ", " << plan->micro_batches << " micro-batches (train.grad_accum)";
  if (interleaved) out << ", " << plan->virtual_stages << " virtual stages";
  out << ", " << plan->stages.size() << " model stages of " << c.model.n_layers << " layers\n";
  if (plan->order.ok()) {
    out << "  action lists: OK (pipeline group "
        << dist::FormatGroup(mesh.GroupOf(0, dist::View::kDense, {dist::Axis::kPp}))
        << ": every forward and backward once, in dependency order, messages matched in "
           "order, no deadlock; every other rank runs its pipeline rank's list, so each tp, "
           "dp and ep group runs one list on all its ranks)\n";
  } else {
    out << "  action lists: FAILED: " << plan->order.message() << "\n";
  }
  char line[256];
  std::snprintf(line, sizeof(line), "  bubble (analytic, %s): %.4f\n",
                interleaved ? "(p-1)/(v(m+p-1))" : "(p-1)/(m+p-1)", plan->bubble);
  out << line;
  const char* unit = interleaved ? "chunks" : "micro-batches";
  out << "  stages (cost: model::StageCosts, the stage's share of the parameters plus its share "
         "of the compute, summing to 2; activations: one micro-batch's, and the "
      << unit << " in flight x that, the predicted activation memory):\n";
  std::snprintf(line, sizeof(line), "    %5s %4s  %-30s %6s %9s %14s %16s\n", "stage", "rank",
                "layers", "cost", "in flight", "activations/mb", "in flight x /mb");
  out << line;
  for (size_t s = 0; s < plan->stages.size(); ++s) {
    const PipelineStagePlan& st = plan->stages[s];
    std::snprintf(line, sizeof(line), "    %5zu %4d  %-30s %6.4f %9d %14s %16s\n", s, st.rank,
                  st.stage.Describe(c.model.n_layers).c_str(), st.cost, st.in_flight,
                  FormatBytes(st.micro_batch_bytes).c_str(),
                  FormatBytes(st.activation_bytes()).c_str());
    out << line;
  }
  out << "  memory per pipeline rank (model states: the stage's parameters under zero_stage "
      << c.parallel.zero_stage << ", each part divided over its data-parallel group as the "
         "stage shards it; workspace: one step walked through its list: activations, "
         "messages, gradient accumulation, buckets, and the ZeRO terms):\n";
  std::snprintf(line, sizeof(line), "    %4s %14s %14s %16s %14s  %s\n", "rank", "model states",
                "peak", "activations pk", "total", "at");
  out << line;
  const std::vector<int> group = mesh.GroupOf(0, dist::View::kDense, {dist::Axis::kPp});
  for (int r = 0; r < plan->pp; ++r) {
    const StepWorkspace& w = plan->ranks[r];
    const RankMemory m = PredictRankMemory(c, mesh, group[r]);
    std::snprintf(line, sizeof(line), "    %4d %14s %14s %16s %14s  %s\n", r,
                  FormatBytes(m.model_states()).c_str(), FormatBytes(m.workspace).c_str(),
                  FormatBytes(w.activations_peak).c_str(), FormatBytes(m.total()).c_str(),
                  w.peak_at.c_str());
    out << line;
  }
  return out.str();
}

}  // namespace switchyard::plan
