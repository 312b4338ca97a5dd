#include "engine/model/stage.h"

#include <algorithm>
#include <limits>

namespace switchyard::model {
namespace {

// Parameters and per-token compute (FLOPs) of one piece of the model.
struct Cost {
  double params = 0, flops = 0;
};

Cost LayerCostRaw(const ModelConfig& m, const moe::MoEConfig& e, int64_t layer) {
  const double d = m.d_model, kv = double(m.kv_heads()) * m.head_dim();
  const double bias = m.bias ? 1 : 0;
  Cost c;
  // Attention: q and o (d x d), k and v (d x kv); causal scores and values cost 2 S d per
  // token on average (half of 4 S d).
  const double attn = 2 * d * d + 2 * d * kv + bias * (2 * d + 2 * kv);
  c.params += attn + 4 * d;  // + the two norms' weights and biases (at most)
  c.flops += 2 * attn + 2.0 * m.seq_len * d;
  if (!e.IsMoeLayer(layer)) {
    const double mats = m.activation == "swiglu" ? 3 : 2, ff = m.ff_hidden();
    const double mlp = mats * d * ff + bias * (ff + d);
    c.params += mlp;
    c.flops += 2 * mlp;
    return c;
  }
  const double mats = e.activation == moe::Activation::kSwiglu ? 3 : 2;
  const double expert = mats * d * e.d_expert + (e.bias ? e.d_expert + d : 0);
  const double shared = e.num_shared_experts * (mats * d * e.shared_hidden());
  const double router = d * e.num_experts;
  c.params += router + e.num_experts * expert + shared;
  c.flops += 2 * (router + e.top_k * expert + shared);
  return c;
}

// The embedding (first stage: its tables, no matrix product) and the head (last stage: the
// logits' product, and its own table when untied).
Cost EmbeddingCost(const ModelConfig& m) {
  const double positions = m.position == "learned" ? m.seq_len : 0;
  return {.params = double(m.vocab_size + positions) * m.d_model, .flops = 0};
}
Cost HeadCost(const ModelConfig& m) {
  const double table = double(m.vocab_size) * m.d_model;
  return {.params = m.tie_embeddings ? 0 : table, .flops = 2 * table};
}

Cost Totals(const ModelConfig& m, const moe::MoEConfig& e) {
  Cost t;
  for (int64_t i = 0; i < m.n_layers; ++i) {
    const Cost c = LayerCostRaw(m, e, i);
    t.params += c.params;
    t.flops += c.flops;
  }
  for (const Cost& c : {EmbeddingCost(m), HeadCost(m)}) {
    t.params += c.params;
    t.flops += c.flops;
  }
  return t;
}

double Share(const Cost& c, const Cost& total) {
  return c.params / std::max(total.params, 1.0) + c.flops / std::max(total.flops, 1.0);
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
  return Share(LayerCostRaw(model, moe, layer), Totals(model, moe));
}

std::vector<double> StageCosts(const ModelConfig& model, const moe::MoEConfig& moe,
                               std::span<const Stage> stages) {
  const Cost total = Totals(model, moe);
  std::vector<double> out;
  for (const Stage& s : stages) {
    double c = 0;
    for (int64_t i = s.first_layer; i < s.End(model.n_layers); ++i)
      c += Share(LayerCostRaw(model, moe, i), total);
    if (s.embedding) c += Share(EmbeddingCost(model), total);
    if (s.head) c += Share(HeadCost(model), total);
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
    // Contiguous split minimising the largest stage cost (dynamic programming over the
    // last stage's first layer).
    const Cost total = Totals(model, moe);
    std::vector<double> prefix(L + 1, 0.0);
    for (int64_t i = 0; i < L; ++i) prefix[i + 1] = prefix[i] + Share(LayerCostRaw(model, moe, i), total);
    const double first_extra = Share(EmbeddingCost(model), total);
    const double last_extra = Share(HeadCost(model), total);
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
    counts.assign(stages, 0);
    int64_t end = L;
    for (int s = stages - 1; s > 0; --s) {
      const int64_t begin = from[s][end];
      counts[s] = end - begin;
      end = begin;
    }
    counts[0] = end;
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

}  // namespace switchyard::model
