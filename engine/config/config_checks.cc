#include "engine/config/config_checks.h"

#include <algorithm>
#include <initializer_list>
#include <string>
#include <utility>

namespace switchyard::config {
namespace {

// One factor of a product: the key that sets it and its value.
struct Factor {
  const char* key;
  int64_t value;
};

// "train.micro_batch_size=4 * model.seq_len=64" when the product exceeds kMaxCount.
Status CheckProduct(std::initializer_list<Factor> factors, const char* what) {
  unsigned __int128 product = 1;
  for (const Factor& f : factors) {
    if (f.value <= 0) return OkStatus();  // 0 (a layer-only config): nothing is counted
    product = std::min<unsigned __int128>(product * static_cast<uint64_t>(f.value),
                                          static_cast<unsigned __int128>(kMaxCount) + 1);
  }
  if (product <= static_cast<unsigned __int128>(kMaxCount)) return OkStatus();
  std::string terms;
  for (const Factor& f : factors) terms += StrCat(terms.empty() ? "" : " * ", f.key, "=", f.value);
  return InvalidArgument(terms, " is more than 2^53 ", what,
                         " (the largest count the engine forms)");
}

// The parameters the sizes describe, an upper estimate in double (attention, dense MLPs and
// experts in every layer, the embeddings and an untied head).
double ParameterEstimate(const model::ModelConfig& m, const moe::MoEConfig& e) {
  const double d = m.d_model, hd = m.head_dim();
  const double attention = d * hd * (2.0 * m.n_heads + 2.0 * m.kv_heads());
  const double mlp = 3.0 * d * m.ff_hidden();
  const double experts = e.num_experts * (3.0 * d * e.d_expert + d) +
                         e.num_shared_experts * 3.0 * d * e.shared_hidden();
  return m.n_layers * (attention + mlp + experts) + (2.0 * m.vocab_size + m.seq_len) * d;
}

}  // namespace

Status CheckRequiredKey(const Config& config, const char* key) {
  const std::vector<std::string>& unset = config.unset_required;
  if (std::find(unset.begin(), unset.end(), key) == unset.end()) return OkStatus();
  return InvalidArgument(key, " is required (docs/config.md)");
}

Status Config::ValidateModel() const {
  for (auto [key, v] : {std::pair<const char*, int64_t>{"model.vocab_size", model.vocab_size},
                        {"model.seq_len", model.seq_len}, {"model.d_model", model.d_model},
                        {"model.n_layers", model.n_layers}, {"model.n_heads", model.n_heads}}) {
    if (v <= 0) SY_RETURN_IF_ERROR(CheckRequiredKey(*this, key));
  }
  return model.Validate();
}

Status CheckModelLimits(const Config& config) {
  const model::ModelConfig& m = config.model;
  if (m.n_layers > kMaxLayers) {
    return InvalidArgument("model.n_layers=", m.n_layers, " exceeds ", kMaxLayers,
                           " (8x the deepest published models, about 100-130 layers)");
  }
  if (m.position == model::Position::kRope && !(m.rope_base > 0.0f)) {
    return InvalidArgument("model.rope_base=", m.rope_base, " must be > 0 (model.position=rope)");
  }
  // Published recipes draw weights with a standard deviation of at most 1 (GPT-2 0.02,
  // Megatron 0.006-0.02, T5's embeddings 1.0); past it every d-wide product grows the
  // activations by std * sqrt(d) per layer and the f32 forward overflows within a few layers.
  if (!(m.init_std <= 1.0f)) {
    return InvalidArgument("model.init_std=", m.init_std,
                           " must be at most 1 (a weight's standard deviation; 0.02 is usual)");
  }
  return OkStatus();
}
// moe.replicate_hot_experts spreads experts over the ranks of an ep group and copies whole
// experts between them (moe/replication.h).
Status CheckReplication(const moe::MoEConfig& moe, const ParallelConfig& parallel) {
  if (moe.replicate_hot_experts == 0) return OkStatus();
  if (parallel.ep <= 1) {
    return InvalidArgument("moe.replicate_hot_experts=", moe.replicate_hot_experts,
                           " needs parallel.ep > 1 (replicas live on the other ranks of an ep "
                           "group), got parallel.ep=", parallel.ep);
  }
  if (parallel.expert_tp() > 1) {
    return InvalidArgument("moe.replicate_hot_experts=", moe.replicate_hot_experts,
                           " does not support split experts: expert tensor parallelism is ",
                           parallel.expert_tp(), " (set parallel.etp=1)");
  }
  if (parallel.zero_stage >= 3) {
    return InvalidArgument("moe.replicate_hot_experts=", moe.replicate_hot_experts,
                           " does not support parallel.zero_stage=3 (use 0, 1 or 2)");
  }
  if (moe.overlap_chunks > 1) {
    return InvalidArgument("moe.replicate_hot_experts=", moe.replicate_hot_experts,
                           " does not combine with moe.overlap_chunks=", moe.overlap_chunks,
                           " yet (the chunks cut this rank's own experts; set one of them off)");
  }
  return OkStatus();
}


Status CheckSizeProducts(const Config& config, int world) {
  const model::ModelConfig& m = config.model;
  const moe::MoEConfig& e = config.moe;
  const TrainConfig& t = config.train;
  const ParallelConfig& p = config.parallel;
  const int64_t ranks = world > 0 ? world : std::max<int64_t>(config.plan.world, 1);
  const int64_t model_parallel = std::max<int64_t>(1, int64_t{p.tp} * p.cp * p.pp);
  const int64_t dp = std::max<int64_t>(1, ranks / model_parallel);
  const Factor mbs{"train.micro_batch_size", t.micro_batch_size}, seq{"model.seq_len", m.seq_len};
  SY_RETURN_IF_ERROR(CheckProduct({mbs, seq}, "tokens per micro-batch"));
  SY_RETURN_IF_ERROR(CheckProduct({mbs, seq, {"model.vocab_size", m.vocab_size}},
                                  "logits per micro-batch"));
  SY_RETURN_IF_ERROR(CheckProduct({mbs, seq, {"model.d_ff (or 4 * model.d_model)", m.ff_hidden()}},
                                  "dense MLP activations per micro-batch"));
  SY_RETURN_IF_ERROR(CheckProduct({mbs, seq, {"moe.top_k", e.top_k}, {"moe.d_expert", e.d_expert}},
                                  "expert activations per micro-batch"));
  SY_RETURN_IF_ERROR(CheckProduct({mbs, {"model.n_heads", m.n_heads}, seq, seq},
                                  "attention scores per micro-batch"));
  const Factor accum{"train.grad_accum", t.grad_accum}, replicas{"data-parallel ranks", dp};
  SY_RETURN_IF_ERROR(CheckProduct({mbs, seq, accum, replicas}, "tokens per step"));
  SY_RETURN_IF_ERROR(CheckProduct({{"train.max_steps", t.max_steps}, mbs, accum, replicas},
                                  "sequences over the run"));
  const double params = ParameterEstimate(m, e);
  if (params > static_cast<double>(kMaxCount)) {
    return InvalidArgument("model.vocab_size=", m.vocab_size, ", d_model=", m.d_model,
                           ", n_layers=", m.n_layers, ", moe.num_experts=", e.num_experts,
                           ", moe.d_expert=", e.d_expert, " describe about ", params,
                           " parameters, more than 2^53 (the largest count the engine forms)");
  }
  return OkStatus();
}

}  // namespace switchyard::config
