// The planner's layouts, routing skew and caches (cost_model.h).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "engine/core/file.h"
#include "engine/model/param_table.h"
#include "engine/plan/cost_model.h"
#include "engine/plan/dry_run.h"

namespace switchyard::plan {

namespace {

// "[4, 44]".
std::string LayersText(const std::vector<int64_t>& layers) {
  std::string out = "[";
  for (size_t i = 0; i < layers.size(); ++i) out += StrCat(i ? ", " : "", layers[i]);
  return out + "]";
}

}  // namespace

std::string Layout::Describe(int world) const {
  std::string sched(parallel::PipelineScheduleName(schedule));
  if (virtual_stages > 1) sched += StrCat("x", virtual_stages);
  return StrCat("tp ", tp, " cp ", cp, " pp ", pp, pp > 1 ? " " + sched : std::string(), " ep ", ep,
                " etp ", etp, " dp ", dp(world), " zero ", zero_stage, " mbs ", micro_batch_size,
                " m ", micro_batches, " recompute ", model::RecomputeName(recompute),
                head_chunk_tokens > 0 ? StrCat(" head chunk ", head_chunk_tokens) : std::string(),
                pipeline_layers.empty() ? std::string() : " layers " + LayersText(pipeline_layers));
}

config::Config Layout::Apply(const config::Config& base) const {
  config::Config c = base;
  c.parallel.tp = tp;
  c.parallel.cp = cp;
  c.parallel.pp = pp;
  c.parallel.ep = ep;
  c.parallel.etp = etp;
  c.parallel.pipeline_schedule = schedule;
  c.parallel.virtual_stages = virtual_stages;
  c.parallel.pipeline_layers = pipeline_layers;
  c.parallel.zero_stage = zero_stage;
  c.train.micro_batch_size = micro_batch_size;
  c.train.grad_accum = micro_batches;
  c.train.recompute = recompute;
  c.train.head_chunk_tokens = head_chunk_tokens;
  return c;
}

Layout LayoutOf(const config::Config& c) {
  const config::ParallelConfig& p = c.parallel;
  Layout l{.tp = p.tp, .cp = p.cp, .pp = p.pp, .ep = p.ep, .etp = p.expert_tp()};
  l.schedule = p.pipeline_schedule;
  l.virtual_stages = p.virtual_stages;
  l.zero_stage = p.zero_stage;
  l.micro_batch_size = c.train.micro_batch_size;
  l.micro_batches = c.train.grad_accum;
  l.recompute = c.train.recompute;
  l.head_chunk_tokens = c.train.head_chunk_tokens;
  l.pipeline_layers = p.pipeline_layers;
  return l;
}

double Skew::ForEp(int ep) const {
  if (ep <= 1) return 1;
  // At most ep: the busiest of ep ranks takes at most every token, ep times the mean.
  if (expert_counts.empty()) return std::min(constant, double(ep));
  // Each MoE layer's all-to-all waits for that layer's busiest rank, and the layers run one
  // after another: the step pays the mean over layers of each layer's busiest / mean.
  double sum = 0;
  int layers = 0;
  for (const std::vector<double>& layer : expert_counts) {
    const size_t per = layer.size() / ep;
    if (per == 0 || layer.size() % ep != 0) continue;
    double total = 0, most = 0;
    for (int r = 0; r < ep; ++r) {
      double load = 0;
      for (size_t e = r * per; e < (r + 1) * per; ++e) load += layer[e];
      total += load;
      most = std::max(most, load);
    }
    if (total > 0) sum += most * ep / total, ++layers;
  }
  return layers > 0 ? std::max(1.0, sum / layers) : 1.0;
}

namespace {

// The per-layer expert counts of a routing.jsonl line (its tokens_per_expert), or an error
// saying what the line lacks; `where` names the flag and the file.
StatusOr<std::vector<std::vector<double>>> ExpertCounts(const std::string& where,
                                                         const std::string& line) {
  const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) {
    return InvalidArgument(where, ": not a number, and its last line is not JSON (a run's "
                           "routing.jsonl holds one JSON record per line)");
  }
  if (!j.is_object() || !j.contains("tokens_per_expert")) {
    return InvalidArgument(where, ": its last line has no tokens_per_expert; is it a run's "
                           "routing.jsonl (metrics.jsonl is not)?");
  }
  std::vector<std::vector<double>> counts;
  const nlohmann::json& layers = j["tokens_per_expert"];
  bool ok = layers.is_array() && !layers.empty();
  for (size_t i = 0; ok && i < layers.size(); ++i) {
    const nlohmann::json& layer = layers[i];
    ok = layer.is_array() && !layer.empty();
    counts.emplace_back();
    for (size_t e = 0; ok && e < layer.size(); ++e) {
      ok = layer[e].is_number() && layer[e].get<double>() >= 0;
      if (ok) counts.back().push_back(layer[e].get<double>());
    }
  }
  if (!ok) {
    return InvalidArgument(where, ": tokens_per_expert must hold, per MoE layer, a non-empty "
                           "list of non-negative counts (one per expert)");
  }
  return counts;
}

}  // namespace

StatusOr<Skew> ParseSkew(const std::string& text) {
  Skew skew;
  if (text.empty()) {
    return InvalidArgument("--skew is empty; give a load ratio >= 1 or a run's routing.jsonl");
  }
  char* end = nullptr;
  const double v = std::strtod(text.c_str(), &end);
  if (end == text.c_str() + text.size()) {
    if (!(v >= 1) || !std::isfinite(v)) {
      return InvalidArgument("--skew ", text, ": the busiest rank's load over the mean must be >= 1");
    }
    skew.constant = v;
    return skew;
  }
  const std::string where = StrCat("--skew ", text);
  StatusOr<std::string> body = ReadFile(text);
  if (!body.ok()) {
    return InvalidArgument(where, ": not a number, nor a file to read (", body.status().message(),
                           ")");
  }
  std::istringstream lines(*body);
  std::string line, last;
  while (std::getline(lines, line)) {
    if (line.find_first_not_of(" \t\r") != std::string::npos) last = line;
  }
  if (last.empty()) {
    return InvalidArgument(where,
                           ": the file is empty; give a load ratio >= 1 or a run's routing.jsonl");
  }
  SY_ASSIGN_OR_RETURN(skew.expert_counts, ExpertCounts(where, last));
  return skew;
}

double CostCache::Bubble(parallel::PipelineSchedule schedule, int pp, int64_t m, int v,
                         int backward_cost) {
  if (pp <= 1) return 0;
  const auto key = std::tuple(int(schedule), pp, m, v, backward_cost);
  auto it = bubbles_.find(key);
  if (it != bubbles_.end()) return it->second;
  return bubbles_[key] =
             parallel::SimulateBubble(schedule, pp, static_cast<int>(m), v, 1, backward_cost);
}

const std::vector<std::vector<model::Stage>>& CostCache::Stages(
    const config::Config& c, int pp, int v, const std::vector<int64_t>& layers) {
  const auto key = std::tuple(pp, v, layers);
  auto it = stages_.find(key);
  if (it != stages_.end()) return it->second;
  config::Config copy = c;
  copy.parallel.pp = pp;
  copy.parallel.virtual_stages = v;
  copy.parallel.pipeline_layers = layers;
  std::vector<std::vector<model::Stage>> ranks;
  for (int r = 0; r < pp; ++r) ranks.push_back(RankStages(copy, r));
  return stages_[key] = std::move(ranks);
}

double CostCache::FlopsPerToken(const config::Config& c) {
  if (flops_per_token_ < 0) flops_per_token_ = ModelFlopsPerToken(c);
  return flops_per_token_;
}

const std::vector<std::pair<double, double>>& CostCache::PieceParams(const config::Config& c,
                                                                      int tp, int etp, int ep) {
  const auto key = std::tuple(tp, etp, ep);
  auto it = pieces_.find(key);
  if (it != pieces_.end()) return it->second;
  const std::shared_ptr<const model::ParamTable> shared =
      model::ParamTable::Shared(c.model, c.moe, {.tp = tp, .etp = etp, .ep = ep});
  const model::ParamTable& table = *shared;
  std::vector<std::pair<double, double>> pieces(c.model.n_layers + 2);
  for (const model::ParamShape& p : table.params()) {
    if (p.tied_copy) continue;  // RankElements adds it on a head stage without the embedding
    auto& piece = pieces[table.PieceIndex(p)];
    (p.expert_view && p.role == model::ParamRole::kExpert ? piece.second : piece.first) +=
        double(table.LocalNumel(p, 0));
  }
  return pieces_[key] = std::move(pieces);
}

}  // namespace switchyard::plan
