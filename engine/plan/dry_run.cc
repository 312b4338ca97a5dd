#include "engine/plan/dry_run.h"

#include "engine/config/sync_settings.h"
#include "engine/plan/zero_memory.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <sstream>
#include <tuple>

namespace switchyard::plan {
namespace {

std::string Human(double v, const char* unit) {
  const char* prefixes[] = {"", "K", "M", "G", "T", "P"};
  int i = 0;
  while (v >= 1000 && i < 5) v /= 1000, ++i;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s%s", v, prefixes[i], unit);
  return buf;
}

}  // namespace

ModelCost EstimateCost(const config::Config& c) {
  const model::ParamTable table = model::ParamTable::Build(c.model, c.moe);
  const model::PieceParams& all = table.Total();
  ModelCost cost;
  cost.total_params = all.params;
  cost.active_params = all.active;
  cost.embedding_params = table.embedding_params();
  cost.expert_params = table.expert_params();
  cost.flops_per_token = 6.0 * all.matmul + 12.0 * all.attention;

  const double state = c.train.optimizer == config::OptimizerKind::kAdamW ? 2 : 1;
  const double local = (all.params - cost.expert_params) + double(cost.expert_params) / c.parallel.ep;
  cost.param_bytes_per_rank = 4.0 * local * (2 + state);

  // Activations kept for backward by one micro-batch through every layer (per layer:
  // EstimateActivationBytes).
  cost.activation_bytes_per_rank = EstimateActivationBytes(c).Stage(model::Stage::Whole());
  return cost;
}

std::vector<model::Stage> RankStages(const config::Config& c, int pp_rank) {
  const config::ParallelConfig& p = c.parallel;
  if (p.pp * p.virtual_stages == 1 && p.pipeline_layers.empty()) return {model::Stage::Whole()};
  auto stages = model::PartitionLayers(c.model, c.moe, p.pp * p.virtual_stages, p.pipeline_layers);
  SY_CHECK_OK(stages.status());
  std::vector<model::Stage> mine;
  for (int chunk = 0; chunk < p.virtual_stages; ++chunk) mine.push_back((*stages)[chunk * p.pp + pp_rank]);
  return mine;
}

namespace {

// The MoE layers of a rank's chunks.
int64_t MoELayersHeld(const config::Config& c, const dist::Mesh& mesh, int rank) {
  int64_t n = 0;
  for (const model::Stage& s : RankStages(c, mesh.Coord(rank, dist::View::kDense, dist::Axis::kPp)))
    for (int64_t i = s.first_layer; i < s.End(c.model.n_layers); ++i) n += c.moe.IsMoELayer(i) ? 1 : 0;
  return n;
}

}  // namespace

std::vector<HeldParam> HeldParams(const config::Config& c, const dist::Mesh& mesh, int rank) {
  const std::shared_ptr<const model::ParamTable> shared = model::ParamTable::Shared(
      c.model, c.moe, {.tp = mesh.tp(), .etp = mesh.etp(), .ep = mesh.ep()});
  const model::ParamTable& table = *shared;
  const int tp_rank = mesh.Coord(rank, dist::View::kDense, dist::Axis::kTp);
  const bool sequence_parallel = mesh.tp() > 1 && c.parallel.sequence_parallel;
  std::vector<HeldParam> held;
  for (const model::Stage& s : RankStages(c, mesh.Coord(rank, dist::View::kDense, dist::Axis::kPp))) {
    const bool tied = c.model.tie_embeddings && !s.whole(c.model.n_layers);
    for (const model::ParamShape& p : table.StageParams(s)) {
      held.push_back({.shape = p,
                      .numel = table.LocalNumel(p, tp_rank),
                      .grad_sum = table.GradSum(p, sequence_parallel),
                      .tied = tied && p.token_table});
    }
  }
  return held;
}

namespace {

// The parameter elements of a rank by the group their gradient is summed (and, under ZeRO,
// partitioned) over: (elements, the group's size), groups in first-seen order.
std::vector<std::pair<double, double>> GradientGroups(const std::vector<HeldParam>& held,
                                                      const dist::Mesh& mesh) {
  std::vector<std::pair<dist::View, parallel::AxisSet>> keys;
  std::vector<std::pair<double, double>> groups;
  for (const HeldParam& p : held) {
    const std::pair key{p.shape.view(), p.grad_sum};
    auto it = std::find(keys.begin(), keys.end(), key);
    if (it == keys.end()) {
      keys.push_back(key);
      groups.push_back({0.0, double(parallel::MeshGroupSize(mesh, key.first, key.second))});
      it = keys.end() - 1;
    }
    groups[it - keys.begin()].first += double(p.numel);
  }
  return groups;
}

}  // namespace

RankParams EstimateRankParams(const config::Config& c, const dist::Mesh& mesh, int rank) {
  // As CountRankParams counts a registry: copies over tp (etp) replicated, the rest by view.
  RankParams r;
  for (const HeldParam& p : HeldParams(c, mesh, rank)) {
    if (p.shape.whole_over_tp && (p.shape.expert_view ? mesh.etp() : mesh.tp()) > 1) {
      r.replicated += p.numel;
    } else if (p.shape.expert_view) {
      r.expert += p.numel;
    } else {
      r.dense += p.numel;
    }
  }
  return r;
}

StepWorkspace PredictStepWorkspace(const config::Config& c, const dist::Mesh& mesh, int rank) {
  return SimulateStepWorkspace(StepWorkspaceInputsOf(c, mesh, rank));
}

namespace {

// StepWorkspaceInputsOf with the rank's gradient bytes and the sync's buckets in flight
// given (PredictRankMemory has them already).
StepWorkspaceInputs InputsWith(const config::Config& c, const dist::Mesh& mesh, int rank,
                               double gradients, double sync) {
  const config::ParallelConfig& p = c.parallel;
  const int pp_rank = mesh.Coord(rank, dist::View::kDense, dist::Axis::kPp);
  const parallel::PipelineSchedule schedule = p.pipeline_schedule;
  const int micro_batches = static_cast<int>(c.train.grad_accum);
  SY_CHECK_OK(parallel::CheckScheduleArgs(schedule, mesh.pp(), micro_batches, p.virtual_stages));
  const ActivationBytes acts = EstimateActivationBytes(c);
  StepWorkspaceInputs in;
  std::tie(in.actions, in.send_release) =
      parallel::ScheduleWithReleases(schedule, mesh.pp(), micro_batches, p.virtual_stages, pp_rank);
  in.chunks = RankStages(c, pp_rank);
  for (const model::Stage& s : in.chunks) {
    in.kept.push_back(acts.Stage(s));
    in.backward.push_back(acts.StageBackward(s));
  }
  in.hidden = acts.hidden;
  in.tokens = acts.tokens;
  in.gradients = gradients;
  const parallel::SyncPolicy policy = config::SyncPolicyOf(c);
  in.ordered_accum = policy.ordered_accum;
  in.sync_after_schedule = !policy.ordered_accum && !policy.reduce_during_backward;
  // The buckets in flight at the sync (zero_memory.h); streaming has none at the end.
  in.sync = sync;
  return in;
}

double GradientBytes(const std::vector<std::pair<double, double>>& groups) {
  double bytes = 0;
  for (auto [n, group] : groups) bytes += 4.0 * n;
  return bytes;
}

}  // namespace

StepWorkspaceInputs StepWorkspaceInputsOf(const config::Config& c, const dist::Mesh& mesh, int rank) {
  const std::vector<HeldParam> held = HeldParams(c, mesh, rank);
  return InputsWith(c, mesh, rank, GradientBytes(GradientGroups(held, mesh)),
                    PredictZeroWorkspace(c, mesh, rank, held).sync);
}

namespace {

// The model states of a rank holding `held`, whose gradient groups are `groups`.
RankMemory StatesOf(const config::Config& c, const dist::Mesh& mesh, int rank,
                    const std::vector<std::pair<double, double>>& groups) {
  const moe::MoEConfig& e = c.moe;
  const int stage = c.parallel.zero_stage;
  const double states = c.train.optimizer == config::OptimizerKind::kAdamW ? 2
                        : c.train.momentum != 0.0f                  ? 1
                                                                    : 0;
  RankMemory r;
  for (auto [n, group] : groups) {
    r.parameters += 4.0 * n / (stage >= 3 ? group : 1);
    r.gradients += 4.0 * n / (stage >= 2 ? group : 1);
    r.optimizer += 4.0 * states * n / (stage >= 1 ? group : 1);
  }
  // The aux-loss-free expert bias: persistent, not trained, whole on every rank.
  if (e.expert_bias_rate > 0) {
    r.parameters += 4.0 * MoELayersHeld(c, mesh, rank) * e.num_experts;
  }
  // The global aux loss's expert load: the same, one (E) per MoE layer.
  if (e.aux_loss_scope == moe::AuxLossScope::kGlobal) {
    r.parameters += 4.0 * MoELayersHeld(c, mesh, rank) * e.num_experts;
  }
  return r;
}

}  // namespace

RankMemory PredictRankStates(const config::Config& c, const dist::Mesh& mesh, int rank) {
  return StatesOf(c, mesh, rank, GradientGroups(HeldParams(c, mesh, rank), mesh));
}

double PredictRankFloor(const config::Config& c, const dist::Mesh& mesh, int rank) {
  // Each backward in the walk of the step (SimulateStepWorkspace) sees at least the step's
  // token ids, its micro-batch's kept activations on the chunk and the backward's transient.
  const ActivationBytes acts = EstimateActivationBytes(c);
  double backward = 0;
  for (const model::Stage& s : RankStages(c, mesh.Coord(rank, dist::View::kDense, dist::Axis::kPp))) {
    backward = std::max(backward, acts.Stage(s) + acts.StageBackward(s));
  }
  return PredictRankStates(c, mesh, rank).model_states() + acts.tokens + backward;
}

RankMemory PredictRankMemory(const config::Config& c, const dist::Mesh& mesh, int rank) {
  // The rank's parameters once, for its gradient groups and its sync's buckets.
  const std::vector<HeldParam> held = HeldParams(c, mesh, rank);
  const std::vector<std::pair<double, double>> groups = GradientGroups(held, mesh);
  RankMemory r = StatesOf(c, mesh, rank, groups);
  // Workspace: one step of the rank's schedule (PredictStepWorkspace, the sync's buckets
  // in flight included) plus what ZeRO adds (zero_memory.h): streamed gradients and stage-3
  // gathers, or under ordered accumulation the full gradients of stages 2-3 and the
  // gathered stage-3 parts; or, if more, the all-gather after a stage 1-2 update.
  // zero_perf, tests/dist/zero_memory_test.cc and pipeline_memory_test.cc compare it with
  // the measured peak.
  const ZeroWorkspace z = PredictZeroWorkspace(c, mesh, rank, held);
  const StepWorkspace step =
      SimulateStepWorkspace(InputsWith(c, mesh, rank, GradientBytes(groups), z.sync));
  r.workspace = step.peak + z.stream + z.materialized + z.gathered;
  r.workspace = std::max(r.workspace, z.gather);
  r.activations_peak = step.activations_peak;
  return r;
}

RankParams CountRankParams(const parallel::ParameterRegistry& registry) {
  RankParams r;
  for (const parallel::Parameter& p : registry.params()) {
    if (!p.trainable) continue;
    const int64_t n = p.value.numel();
    if (p.replicated.Has(dist::Axis::kTp)) {
      r.replicated += n;
    } else if (p.view == dist::View::kExpert) {
      r.expert += n;
    } else {
      r.dense += n;
    }
  }
  return r;
}

namespace {

// The report's first part: sizes, layout, counts, FLOPs, weights and activations per rank.
void ReportCosts(std::ostream& out, const config::Config& c, int world, const ModelCost& cost) {
  const int64_t dp = world / (c.parallel.tp * c.parallel.cp * c.parallel.pp);
  out << "dry run: " << c.model.n_layers << " layers, d_model " << c.model.d_model << ", "
      << c.moe.num_experts << " experts (top-" << c.moe.top_k << ", every "
      << c.moe.layer_freq << (c.moe.layer_freq == 1 ? " layer" : " layers") << "), vocab "
      << c.model.vocab_size << ", seq_len " << c.model.seq_len << "\n"
      << "layout: world " << world << " = tp " << c.parallel.tp << " x cp " << c.parallel.cp
      << " x pp " << c.parallel.pp << " x dp " << dp << "; ep " << c.parallel.ep << "\n"
      << "  parameters, total          " << Human(double(cost.total_params), "") << "\n"
      << "  parameters, active / token " << Human(double(cost.active_params), "") << "\n"
      << "  of which routed experts    " << Human(double(cost.expert_params), "") << "\n"
      << "  of which embeddings        " << Human(double(cost.embedding_params), "") << "\n"
      << "  training FLOPs / token      " << Human(cost.flops_per_token, "FLOP") << "\n"
      << "  memory / rank, weights+grads+optimizer (fp32)  " << FormatBytes(cost.param_bytes_per_rank)
      << "\n"
      << "  memory / rank, activations of one micro-batch   "
      << FormatBytes(cost.activation_bytes_per_rank) << " (estimate, micro_batch_size "
      << c.train.micro_batch_size << ", recompute " << model::RecomputeName(c.train.recompute)
      << (c.parallel.pp > 1 ? "; every layer: a pipeline stage keeps its own, below" : "")
      << ")\n";
}

// Memory under the ZeRO stage: the largest rank, and how many ranks of common memory sizes
// the run needs at this layout (the world grown in steps of a whole model replica).
void ReportZeroMemory(std::ostream& out, const config::Config& c, const dist::Mesh& mesh) {
  RankMemory most;
  for (int r = 0; r < mesh.world(); ++r) {
    const RankMemory rm = PredictRankMemory(c, mesh, r);
    if (rm.total() > most.total()) most = rm;
  }
  out << "  memory / rank under zero_stage " << c.parallel.zero_stage << " (largest rank): "
      << "parameters " << FormatBytes(most.parameters) << ", gradients " << FormatBytes(most.gradients)
      << ", optimizer " << FormatBytes(most.optimizer) << ", workspace ~" << FormatBytes(most.workspace)
      << ", total " << FormatBytes(most.total()) << " (train.ordered_grad_accum "
      << (c.train.ordered_grad_accum ? "true" : "false") << ")\n";
  // The other accumulation mode: ordered (bit-identical layouts; stages 2-3 materialise
  // the full gradients) or in place (stages 2-3 stream them into the shard).
  config::Config other = c;
  other.train.ordered_grad_accum = !c.train.ordered_grad_accum;
  RankMemory alt;
  for (int r = 0; r < mesh.world(); ++r) {
    const RankMemory rm = PredictRankMemory(other, mesh, r);
    if (rm.total() > alt.total()) alt = rm;
  }
  out << "    with train.ordered_grad_accum " << (other.train.ordered_grad_accum ? "true" : "false")
      << ": workspace ~" << FormatBytes(alt.workspace) << ", total " << FormatBytes(alt.total())
      << "\n";
  const int64_t replica = c.parallel.SmallestWorld();
  // Less memory per rank needs at least as many ranks: the 24 GiB count comes last.
  const std::pair<double, const char*> sizes[] = {
      {24, "24 GiB (this CPU machine)"}, {80, "80 GiB (H100)"}, {141, "141 GiB (H200)"}};
  // The peak of the world of k replicas; it never grows with k (more ranks only partition
  // more), so the fewest replicas for each size is a binary search (k up to 65536 ranks).
  auto peak_of = [&](int64_t k) {
    auto wmesh = dist::Mesh::Create(static_cast<int>(k * replica), c.parallel.MeshSizes(), c.parallel.order);
    if (!wmesh.ok()) return std::numeric_limits<double>::infinity();
    double peak = 0;  // ranks differ only within a replica: the first one is enough
    for (int r = 0; r < replica; ++r) peak = std::max(peak, PredictRankMemory(c, *wmesh, r).total());
    return peak;
  };
  const int64_t max_k = (int64_t{1} << 16) / replica;
  int64_t need[3] = {0, 0, 0};
  for (int i = 0; i < 3; ++i) {
    const double size = sizes[i].first * 1024.0 * 1024.0 * 1024.0;
    if (max_k < 1 || peak_of(max_k) > size) continue;
    int64_t lo = 1, hi = max_k;  // the answer lies in [lo, hi]
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (peak_of(mid) <= size) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    need[i] = lo * replica;
  }
  for (int i = 0; i < 3; ++i) {
    out << "    ranks of " << sizes[i].second << ": "
        << (need[i] > 0 ? StrCat(need[i]) : std::string("more than 65536")) << "\n";
  }
}

// The table of the parameter elements and bytes every rank holds; ranks with equal
// holdings share a row.
void ReportRankTable(std::ostream& out, const config::Config& c, const dist::Mesh& mesh,
                     double state) {
  std::vector<std::pair<RankParams, std::vector<int>>> rows;
  for (int r = 0; r < mesh.world(); ++r) {
    const RankParams p = EstimateRankParams(c, mesh, r);
    auto it = std::find_if(rows.begin(), rows.end(), [&](const auto& row) { return row.first == p; });
    if (it == rows.end()) {
      rows.push_back({p, {r}});
    } else {
      it->second.push_back(r);
    }
  }
  out << "  parameters held per rank (elements; bytes = f32 weights + gradients + optimizer "
         "state):\n";
  char line[256];
  std::snprintf(line, sizeof(line), "    %-22s %12s %12s %12s %12s %12s\n", "ranks", "dense",
                "replicated", "expert", "total", "bytes");
  out << line;
  for (const auto& [p, ranks] : rows) {
    std::string who = dist::FormatGroup(ranks);
    if (who.size() > 22) who = who.substr(0, 19) + "...";
    std::snprintf(line, sizeof(line), "    %-22s %12lld %12lld %12lld %12lld %12s\n", who.c_str(),
                  static_cast<long long>(p.dense), static_cast<long long>(p.replicated),
                  static_cast<long long>(p.expert), static_cast<long long>(p.total()),
                  FormatBytes(4.0 * p.total() * (2 + state)).c_str());
    out << line;
  }
}

}  // namespace

std::string DryRunReport(const config::Config& c, int world, Status* check) {
  if (check != nullptr) *check = OkStatus();
  ModelCost cost = EstimateCost(c);
  // With a valid mesh, the weights per rank are the most any rank of the table holds.
  auto mesh = dist::Mesh::Create(world, c.parallel.MeshSizes(), c.parallel.order);
  const double state = c.train.optimizer == config::OptimizerKind::kAdamW ? 2 : 1;
  if (mesh.ok()) {
    int64_t most = 0;
    for (int r = 0; r < world; ++r) most = std::max(most, EstimateRankParams(c, *mesh, r).total());
    cost.param_bytes_per_rank = 4.0 * most * (2 + state);
  }
  std::ostringstream out;
  ReportCosts(out, c, world, cost);
  if (!mesh.ok()) {
    out << "  per-rank table: " << mesh.status().message() << "\n";
    return out.str();
  }
  ReportZeroMemory(out, c, *mesh);
  ReportRankTable(out, c, *mesh, state);
  if (c.parallel.pp > 1 || c.parallel.virtual_stages > 1) out << PipelineReport(c, *mesh, check);
  return out.str();
}

}  // namespace switchyard::plan
