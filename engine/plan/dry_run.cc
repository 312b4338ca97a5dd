#include "engine/plan/dry_run.h"

#include <algorithm>
#include <numeric>

#include <cstdio>
#include <sstream>

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

std::string FormatBytes(double v) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int i = 0;
  while (v >= 1024 && i < 4) v /= 1024, ++i;
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.2f %s", v, units[i]);
  return buf;
}

ModelCost EstimateCost(const config::Config& c) {
  const model::ModelConfig& m = c.model;
  const moe::MoEConfig& e = c.moe;
  const int64_t d = m.d_model, hd = m.head_dim(), hq = m.n_heads, hkv = m.kv_heads();
  const int64_t mats = m.activation == "swiglu" ? 3 : 2;
  const int64_t emats = e.activation == moe::Activation::kSwiglu ? 3 : 2;
  const int64_t norm = m.norm == "layernorm" ? 2 * d : d;
  ModelCost cost;
  cost.embedding_params = m.vocab_size * d + (m.position == "learned" ? m.seq_len * d : 0);
  const int64_t attn_mat = d * hq * hd + 2 * d * hkv * hd + hq * hd * d;
  const int64_t attn_bias = m.bias ? hq * hd + 2 * hkv * hd + d : 0;
  const int64_t mlp_mat = mats * d * m.ff_hidden();
  const int64_t mlp_bias = m.bias ? m.ff_hidden() + d : 0;
  const int64_t expert_mat = emats * d * e.d_expert;
  const int64_t expert_bias = e.bias ? e.d_expert + d : 0;
  const int64_t shared_h = e.num_shared_experts * e.shared_hidden();
  const int64_t shared_mat = emats * d * shared_h;
  const int64_t shared_bias = e.num_shared_experts > 0 && e.bias ? shared_h + d : 0;
  const int64_t head = m.tie_embeddings ? 0 : m.vocab_size * d;

  int64_t total = cost.embedding_params + norm + head, active = total, matmul = m.vocab_size * d;
  int64_t moe_layers = 0;
  for (int64_t i = 0; i < m.n_layers; ++i) {
    int64_t common = 2 * norm + attn_mat + attn_bias;
    total += common;
    active += common;
    matmul += attn_mat;
    if (e.IsMoeLayer(i)) {
      ++moe_layers;
      const int64_t router = d * e.num_experts;
      const int64_t one = expert_mat + expert_bias;
      total += router + e.num_experts * one + shared_mat + shared_bias;
      active += router + e.top_k * one + shared_mat + shared_bias;
      matmul += router + e.top_k * expert_mat + shared_mat;
      cost.expert_params += e.num_experts * one;
    } else {
      total += mlp_mat + mlp_bias;
      active += mlp_mat + mlp_bias;
      matmul += mlp_mat;
    }
  }
  cost.total_params = total;
  cost.active_params = active;
  cost.flops_per_token = 6.0 * matmul + 12.0 * m.n_layers * m.seq_len * hq * hd;

  const double state = c.train.optimizer == config::OptimizerKind::kAdamW ? 2 : 1;
  const double local = (total - cost.expert_params) + double(cost.expert_params) / c.parallel.ep;
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

// What a rank's chunks hold: layers, embedding, head.
struct Holdings {
  std::vector<bool> layer;
  bool embedding = false, head = false;
  int64_t moe_layers = 0, layers = 0;
};

Holdings HoldingsOf(const config::Config& c, const dist::Mesh& mesh, int rank) {
  Holdings h;
  h.layer.assign(c.model.n_layers, false);
  for (const model::Stage& s : RankStages(c, mesh.Coord(rank, dist::View::kDense, dist::Axis::kPp))) {
    for (int64_t i = s.first_layer; i < s.End(c.model.n_layers); ++i) {
      h.layer[i] = true;
      ++h.layers;
      h.moe_layers += c.moe.IsMoeLayer(i) ? 1 : 0;
    }
    h.embedding = h.embedding || s.embedding;
    h.head = h.head || s.head;
  }
  return h;
}

}  // namespace

RankParams EstimateRankParams(const config::Config& c, const dist::Mesh& mesh, int rank) {
  const model::ModelConfig& m = c.model;
  const moe::MoEConfig& e = c.moe;
  const int64_t tp = mesh.tp(), etp = mesh.etp(), ep = mesh.ep();
  const int tp_rank = mesh.Coord(rank, dist::View::kDense, dist::Axis::kTp);
  const int64_t d = m.d_model, hd = m.head_dim(), hq = m.n_heads, hkv = m.kv_heads();
  const int64_t mats = m.activation == "swiglu" ? 3 : 2;
  const int64_t emats = e.activation == moe::Activation::kSwiglu ? 3 : 2;
  const int64_t norm = m.norm == "layernorm" ? 2 * d : d;
  const Holdings held = HoldingsOf(c, mesh, rank);
  // Vocabulary rows of this tp rank: V padded to a multiple of tp, the padding left out.
  const int64_t rows = (m.vocab_size + tp - 1) / tp;
  const int64_t vocab = std::max<int64_t>(0, std::min(rows, m.vocab_size - tp_rank * rows));
  RankParams r;
  // With tp = 1 nothing is replicated over tp: what is whole counts as dense.
  int64_t& shared_tp = tp > 1 ? r.replicated : r.dense;
  if (held.embedding) {
    r.dense += vocab * d;
    if (m.position == "learned") shared_tp += m.seq_len * d;
  }
  if (held.head) {
    // The untied head's table, or with tied embeddings the last stage's copy of the token
    // table (engine/model/stage.h).
    if (!m.tie_embeddings || !held.embedding) r.dense += vocab * d;
    shared_tp += norm;  // norm_f
  }
  for (int64_t i = 0; i < m.n_layers; ++i) {
    if (!held.layer[i]) continue;
    shared_tp += 2 * norm;
    // k and v are split with the heads, or whole on every rank when tp does not divide
    // the kv heads (replicated, dense/attention.h).
    const bool kv_whole = tp > 1 && hkv % tp != 0;
    r.dense += (d * hq * hd + hq * hd * d) / tp;
    (kv_whole ? r.replicated : r.dense) += 2 * d * hkv * hd / (kv_whole ? 1 : tp);
    if (m.bias) {
      r.dense += hq * hd / tp;                                  // q bias (column-parallel)
      (kv_whole ? r.replicated : r.dense) += 2 * hkv * hd / (kv_whole ? 1 : tp);
      shared_tp += d;                                           // o bias (row-parallel: whole)
    }
    if (e.IsMoeLayer(i)) {
      shared_tp += d * e.num_experts;  // router
      const int64_t shared_h = e.num_shared_experts * e.shared_hidden();
      if (shared_h > 0) shared_tp += emats * d * shared_h + (e.bias ? shared_h + d : 0);
      const int64_t local = e.num_experts / ep;
      r.expert += local * (emats * d * e.d_expert / etp + (e.bias ? e.d_expert / etp : 0));
      if (e.bias) (etp > 1 ? r.replicated : r.expert) += local * d;  // b2
    } else {
      r.dense += mats * d * m.ff_hidden() / tp + (m.bias ? m.ff_hidden() / tp : 0);
      if (m.bias) shared_tp += d;  // w2 bias
    }
  }
  return r;
}

namespace {

// The parameter elements of a rank by the group their gradient is summed (and, under ZeRO,
// partitioned) over: (elements, the group's size).
std::vector<std::pair<double, double>> GradientGroups(const config::Config& c, const dist::Mesh& mesh,
                                                      int rank) {
  const moe::MoEConfig& e = c.moe;
  const RankParams held = EstimateRankParams(c, mesh, rank);
  const Holdings on = HoldingsOf(c, mesh, rank);
  const double dp_cp = double(mesh.dp()) * mesh.cp(), edp = mesh.edp();
  const int64_t norm = c.model.norm == "layernorm" ? 2 * c.model.d_model : c.model.d_model;
  // The replicated elements that are not partitioned over dp x cp x tp: norm weights without
  // sequence parallelism (each tp rank computes the whole gradient: dp x cp) and the
  // experts' output bias under etp (edp x etp).
  const int64_t norms_unsummed = mesh.tp() > 1 && !c.parallel.sequence_parallel
                                     ? norm * (2 * on.layers + (on.head ? 1 : 0))
                                     : 0;
  const int64_t b2_etp =
      e.bias && mesh.etp() > 1 ? on.moe_layers * (e.num_experts / mesh.ep()) * c.model.d_model : 0;
  const int64_t rest = held.replicated - norms_unsummed - b2_etp;
  return {{double(held.dense), dp_cp},
          {double(norms_unsummed), dp_cp},
          {double(rest), dp_cp * mesh.tp()},
          {double(b2_etp), edp * mesh.etp()},
          {double(held.expert), edp}};
}

}  // namespace

StepWorkspace PredictStepWorkspace(const config::Config& c, const dist::Mesh& mesh, int rank) {
  const config::ParallelConfig& p = c.parallel;
  const int pp_rank = mesh.Coord(rank, dist::View::kDense, dist::Axis::kPp);
  auto schedule = parallel::ParsePipelineSchedule(p.pipeline_schedule);
  SY_CHECK_OK(schedule.status());
  const int micro_batches = static_cast<int>(c.train.grad_accum);
  SY_CHECK_OK(parallel::CheckScheduleArgs(*schedule, mesh.pp(), micro_batches, p.virtual_stages));
  const ActivationBytes acts = EstimateActivationBytes(c);
  StepWorkspaceInputs in;
  in.actions = parallel::ScheduleActions(*schedule, mesh.pp(), micro_batches, p.virtual_stages, pp_rank);
  in.chunks = RankStages(c, pp_rank);
  for (const model::Stage& s : in.chunks) {
    in.kept.push_back(acts.Stage(s));
    in.backward.push_back(acts.StageBackward(s));
  }
  in.hidden = acts.hidden;
  in.tokens = acts.tokens;
  double synced = 0;
  for (auto [n, group] : GradientGroups(c, mesh, rank)) {
    in.gradients += 4.0 * n;
    if (group > 1) synced += n;
  }
  in.ordered_accum = c.train.ordered_grad_accum && micro_batches > 1;
  // Every bucket of gradients that has a group to sum over, as its packed copy and the
  // ordered sum's receive buffer of the same size (dist/ordered_sum.h).
  in.sync = 2.0 * 4.0 * synced;
  return SimulateStepWorkspace(in);
}

RankMemory PredictRankMemory(const config::Config& c, const dist::Mesh& mesh, int rank) {
  const moe::MoEConfig& e = c.moe;
  const int stage = c.parallel.zero_stage;
  const double states = c.train.optimizer == config::OptimizerKind::kAdamW ? 2
                        : c.train.momentum != 0.0f                  ? 1
                                                                    : 0;
  RankMemory r;
  double synced = 0;
  for (auto [n, group] : GradientGroups(c, mesh, rank)) {
    if (group > 1) synced += n;
    r.parameters += 4.0 * n / (stage >= 3 ? group : 1);
    r.gradients += 4.0 * n / (stage >= 2 ? group : 1);
    r.optimizer += 4.0 * states * n / (stage >= 1 ? group : 1);
  }
  // The aux-loss-free expert bias: persistent, not trained, whole on every rank.
  if (e.expert_bias_rate > 0) {
    r.parameters += 4.0 * HoldingsOf(c, mesh, rank).moe_layers * e.num_experts;
  }
  // Workspace: one step of the rank's schedule (PredictStepWorkspace); the full gradients
  // of ZeRO stages 2-3 (of the partitioned parameters: the others' stay whole and count as
  // gradients); two gathered stage-3 parts (the one in use, the next). zero_perf and
  // tests/dist/pipeline_memory_test.cc compare it with the measured peak.
  r.workspace = PredictStepWorkspace(c, mesh, rank).peak;
  if (stage >= 2) r.workspace += 4.0 * synced;
  if (stage >= 3) r.workspace += 2.0 * 4.0 * synced / std::max<int64_t>(1, c.model.n_layers);
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
  const int64_t dp = world / (c.parallel.tp * c.parallel.cp * c.parallel.pp);
  std::ostringstream out;
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
  if (!mesh.ok()) {
    out << "  per-rank table: " << mesh.status().message() << "\n";
    return out.str();
  }
  // Memory under the ZeRO stage: the largest rank, and how many ranks of common memory
  // sizes the run needs at this layout (the world grown in steps of a whole model replica).
  RankMemory most;
  for (int r = 0; r < world; ++r) {
    const RankMemory rm = PredictRankMemory(c, *mesh, r);
    if (rm.total() > most.total()) most = rm;
  }
  out << "  memory / rank under zero_stage " << c.parallel.zero_stage << " (largest rank): "
      << "parameters " << FormatBytes(most.parameters) << ", gradients " << FormatBytes(most.gradients)
      << ", optimizer " << FormatBytes(most.optimizer) << ", workspace ~" << FormatBytes(most.workspace)
      << ", total " << FormatBytes(most.total()) << "\n";
  const int64_t replica = std::lcm(int64_t{c.parallel.tp} * c.parallel.cp * c.parallel.pp,
                                   int64_t{c.parallel.etp > 0 ? c.parallel.etp : c.parallel.tp} * c.parallel.ep * c.parallel.pp);
  // Less memory per rank needs at least as many ranks: the 24 GiB count comes last.
  const std::pair<double, const char*> sizes[] = {
      {24, "24 GiB (this CPU machine)"}, {80, "80 GiB (H100)"}, {141, "141 GiB (H200)"}};
  int64_t need[3] = {0, 0, 0};
  for (int64_t w = replica; w <= (int64_t{1} << 16) && need[0] == 0; w += replica) {
    auto wmesh = dist::Mesh::Create(static_cast<int>(w), c.parallel.MeshSizes(), c.parallel.order);
    if (!wmesh.ok()) continue;
    double peak = 0;  // ranks differ only within a replica: the first one is enough
    for (int r = 0; r < std::min<int64_t>(w, replica); ++r)
      peak = std::max(peak, PredictRankMemory(c, *wmesh, r).total());
    for (int i = 0; i < 3; ++i)
      if (need[i] == 0 && peak <= sizes[i].first * 1024.0 * 1024.0 * 1024.0) need[i] = w;
  }
  for (int i = 0; i < 3; ++i) {
    out << "    ranks of " << sizes[i].second << ": "
        << (need[i] > 0 ? StrCat(need[i]) : std::string("more than 65536")) << "\n";
  }
  // Ranks with equal holdings share a row.
  std::vector<std::pair<RankParams, std::vector<int>>> rows;
  for (int r = 0; r < world; ++r) {
    const RankParams p = EstimateRankParams(c, *mesh, r);
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
  if (c.parallel.pp > 1 || c.parallel.virtual_stages > 1) out << PipelineReport(c, *mesh, check);
  return out.str();
}

}  // namespace switchyard::plan
