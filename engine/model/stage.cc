#include "engine/model/stage.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <map>
#include <mutex>
#include <tuple>

#include "engine/model/param_table.h"

namespace switchyard::model {
namespace {

// Parameters and per-token compute (FLOPs) of one piece of the model.
struct Cost {
  double params = 0, flops = 0;
};

// The balancing's weight of one tensor: what a token multiplies by or adds (2 FLOPs per
// element it uses). Norms enter as 4 d per layer (the most two norms hold) and the final
// norm and the shared experts' biases not at all: the weights the split was tuned with, so
// that partitions stay as they were.
bool Weighed(const ParamShape& p) {
  return p.role != ParamRole::kNorm && !(p.role == ParamRole::kSharedExpert && p.bias) &&
         !p.tied_copy;
}

// Every piece's cost from the parameter table, in ParamTable::PieceIndex order: the
// embedding (its tables, no matrix product), the layers (their weighed tensors plus two
// norms, and causal attention's scores and values: 2 S d per token on average, half of
// 4 S d), the head (the logits' product, and its own table when untied).
std::vector<Cost> PieceCostsUncached(const ModelConfig& m, const moe::MoEConfig& e) {
  const ParamTable table = ParamTable::Build(m, e);
  std::vector<Cost> costs(m.n_layers + 2);
  for (const ParamShape& p : table.params()) {
    if (!Weighed(p)) continue;
    Cost& c = costs[table.PieceIndex(p)];
    c.params += double(p.numel());
    if (p.part.kind == parallel::PartId::Kind::kLayer) c.flops += 2.0 * double(p.active(e.top_k));
  }
  for (int64_t i = 0; i < m.n_layers; ++i) {
    costs[1 + i].params += 4.0 * double(m.d_model);
    costs[1 + i].flops += 2.0 * double(table.Layer(i).attention);
  }
  costs.back().flops = 2.0 * double(table.Head().matmul);
  return costs;
}

// PieceCosts of the last few models asked for: the planner partitions one model's layers
// for every layout and rank it sizes.
std::vector<Cost> PieceCosts(const ModelConfig& m, const moe::MoEConfig& e) {
  struct Entry {
    ModelConfig model;
    moe::MoEConfig moe;
    std::vector<Cost> costs;
  };
  static std::mutex mu;
  static std::deque<Entry> recent;  // newest first
  {
    std::lock_guard<std::mutex> lock(mu);
    for (const Entry& x : recent) {
      if (x.model == m && x.moe == e) return x.costs;
    }
  }
  std::vector<Cost> costs = PieceCostsUncached(m, e);
  std::lock_guard<std::mutex> lock(mu);
  recent.push_front({m, e, costs});
  if (recent.size() > 8) recent.pop_back();
  return costs;
}

Cost Totals(const std::vector<Cost>& pieces) {
  Cost t;
  for (const Cost& c : pieces) {
    t.params += c.params;
    t.flops += c.flops;
  }
  return t;
}

double Share(const Cost& c, const Cost& total) {
  return c.params / std::max(total.params, 1.0) + c.flops / std::max(total.flops, 1.0);
}

// The contiguous split of layers [0, L) into `stages` that minimises the largest stage cost
// (dynamic programming over each stage's first layer, O(stages L^2)): prefix[i] is the cost
// of layers [0, i); the first stage also pays first_extra, the last last_extra. Remembered
// per thread, since the planner asks for the same split for thousands of layouts.
std::vector<int64_t> BalancedSplit(const std::vector<double>& prefix, double first_extra,
                                   double last_extra, int stages) {
  using Key = std::tuple<int, double, double, std::vector<double>>;
  thread_local std::map<Key, std::vector<int64_t>> memo;
  Key key{stages, first_extra, last_extra, prefix};
  if (auto it = memo.find(key); it != memo.end()) return it->second;
  const int64_t L = static_cast<int64_t>(prefix.size()) - 1;
  auto cost = [&](int64_t lo, int64_t hi, int s) {  // layers [lo, hi) as stage s
    double c = prefix[hi] - prefix[lo];
    if (s == 0) c += first_extra;
    if (s == stages - 1) c += last_extra;
    return c;
  };
  constexpr double kInf = std::numeric_limits<double>::infinity();
  // best[s][i]: the least bottleneck of layers [0, i) as stages 0..s; from[s][i] its split.
  std::vector<std::vector<double>> best(stages, std::vector<double>(L + 1, kInf));
  std::vector<std::vector<int64_t>> from(stages, std::vector<int64_t>(L + 1, -1));
  for (int64_t i = 1; i <= L; ++i) best[0][i] = cost(0, i, 0);
  for (int s = 1; s < stages; ++s) {
    for (int64_t i = s + 1; i <= L; ++i) {
      for (int64_t j = s; j < i; ++j) {
        const double c = std::max(best[s - 1][j], cost(j, i, s));
        if (c < best[s][i]) best[s][i] = c, from[s][i] = j;
      }
    }
  }
  std::vector<int64_t> counts(stages, 0);
  int64_t end = L;
  for (int s = stages - 1; s > 0; --s) {
    const int64_t begin = from[s][end];
    counts[s] = end - begin;
    end = begin;
  }
  counts[0] = end;
  if (memo.size() >= 4096) memo.clear();
  memo.emplace(std::move(key), counts);
  return counts;
}

}  // namespace

std::string Stage::Describe(int64_t n_layers) const {
  std::string out = embedding ? "embedding + " : "";
  out += StrCat("layers ", first_layer, "-", End(n_layers) - 1);
  if (head) out += " + head";
  return out;
}

Status Stage::Validate(int64_t n_layers) const {
  const int64_t end = End(n_layers);
  if (first_layer < 0 || end > n_layers || first_layer >= end) {
    return InvalidArgument("pipeline stage layers [", first_layer, ", ", end,
                           ") is not a non-empty range of the model's ", n_layers, " layers");
  }
  return OkStatus();
}

double LayerCost(const ModelConfig& model, const moe::MoEConfig& moe, int64_t layer) {
  const std::vector<Cost> pieces = PieceCosts(model, moe);
  return Share(pieces[1 + layer], Totals(pieces));
}

std::vector<double> StageCosts(const ModelConfig& model, const moe::MoEConfig& moe,
                               std::span<const Stage> stages) {
  const std::vector<Cost> pieces = PieceCosts(model, moe);
  const Cost total = Totals(pieces);
  std::vector<double> out;
  for (const Stage& s : stages) {
    double c = 0;
    for (int64_t i = s.first_layer; i < s.End(model.n_layers); ++i) c += Share(pieces[1 + i], total);
    if (s.embedding) c += Share(pieces.front(), total);
    if (s.head) c += Share(pieces.back(), total);
    out.push_back(c);
  }
  return out;
}

StatusOr<std::vector<Stage>> PartitionLayers(const ModelConfig& model, const moe::MoEConfig& moe,
                                             int stages,
                                             std::span<const int64_t> layers_per_stage) {
  const int64_t L = model.n_layers;
  if (stages < 1) return InvalidArgument("pipeline stages = ", stages, " must be >= 1");
  if (stages > L) {
    return InvalidArgument(stages, " pipeline stages (parallel.pp x parallel.virtual_stages) ",
                           "for ", L, " layers: every stage needs at least one layer");
  }
  std::vector<int64_t> counts(layers_per_stage.begin(), layers_per_stage.end());
  if (!counts.empty()) {
    if (static_cast<int>(counts.size()) != stages) {
      return InvalidArgument("parallel.pipeline_layers lists ", counts.size(),
                             " stages, the layout has ", stages,
                             " (parallel.pp x parallel.virtual_stages)");
    }
    int64_t sum = 0;
    for (size_t s = 0; s < counts.size(); ++s) {
      if (counts[s] < 1) {
        return InvalidArgument("parallel.pipeline_layers gives stage ", s, " ", counts[s],
                               " layers: every stage needs at least one");
      }
      sum += counts[s];
    }
    if (sum != L) {
      return InvalidArgument("parallel.pipeline_layers sums to ", sum, " layers, the model has ",
                             "model.n_layers=", L);
    }
  } else {
    const std::vector<Cost> pieces = PieceCosts(model, moe);
    const Cost total = Totals(pieces);
    std::vector<double> prefix(L + 1, 0.0);
    for (int64_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + Share(pieces[1 + i], total);
    counts = BalancedSplit(prefix, Share(pieces.front(), total), Share(pieces.back(), total), stages);
  }
  std::vector<Stage> out;
  int64_t first = 0;
  for (int s = 0; s < stages; ++s) {
    out.push_back(Stage{.first_layer = first, .end_layer = first + counts[s],
                        .embedding = s == 0, .head = s == stages - 1});
    first += counts[s];
  }
  return out;
}

std::vector<parallel::PartId> BackwardParts(std::span<const Stage> chunks, int64_t n_layers,
                                            bool tie_embeddings) {
  using parallel::PartId;
  std::vector<PartId> order;
  for (auto c = chunks.rbegin(); c != chunks.rend(); ++c) {
    if (c->head) {
      if (!tie_embeddings) order.push_back(PartId::Head());
      order.push_back(PartId::NormF());
      // A tied head without the embedding: its table's gradient is final here.
      if (tie_embeddings && !c->embedding) order.push_back(PartId::Embed());
    }
    for (int64_t i = c->End(n_layers); i-- > c->first_layer;) order.push_back(PartId::Layer(i));
    if (c->embedding) order.push_back(PartId::Embed());
  }
  return order;
}

}  // namespace switchyard::model
