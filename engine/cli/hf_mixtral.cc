#include "engine/cli/hf_mixtral.h"

#include <charconv>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>
#include <sstream>
#include <utility>

namespace switchyard::cli {
namespace {

// (r, c) -> (c, r), f32 host.
Tensor Transpose(const Tensor& m) {
  const int64_t r = m.dim(0), c = m.dim(1);
  Tensor t = Tensor::Empty({c, r}, DType::kF32);
  const float* src = m.data<float>();
  float* dst = t.data<float>();
  for (int64_t i = 0; i < r; ++i)
    for (int64_t j = 0; j < c; ++j) dst[j * r + i] = src[i * c + j];
  return t;
}

// Row e of a stacked (E, a, b) tensor as its own (a, b) tensor.
Tensor Slice(const Tensor& stacked, int64_t e) {
  const int64_t a = stacked.dim(1), b = stacked.dim(2);
  return stacked.View({a, b}, e * a * b);
}

std::string Layer(int64_t i) { return "model.layers." + std::to_string(i) + "."; }

// (ours, theirs, transposed) for the tensors that are not experts.
struct Pair {
  std::string ours, theirs;
  bool transpose;
};

std::vector<Pair> DensePairs(const config::Config& c) {
  std::vector<Pair> p = {{"embed.wte", "model.embed_tokens.weight", false},
                         {"norm_f.weight", "model.norm.weight", false}};
  if (!c.model.tie_embeddings) p.push_back({"head.weight", "lm_head.weight", true});
  for (int64_t i = 0; i < c.model.n_layers; ++i) {
    const std::string o = "layers." + std::to_string(i) + ".", t = Layer(i);
    p.push_back({o + "norm1.weight", t + "input_layernorm.weight", false});
    p.push_back({o + "norm2.weight", t + "post_attention_layernorm.weight", false});
    for (const char* x : {"q", "k", "v", "o"})
      p.push_back({o + "attn." + x + ".weight", t + "self_attn." + x + "_proj.weight", true});
    p.push_back({o + "moe.router.weight", t + "block_sparse_moe.gate.weight", true});
  }
  return p;
}

}  // namespace

Status CheckMixtralExpressible(const config::Config& c) {
  const model::ModelConfig& m = c.model;
  const moe::MoEConfig& e = c.moe;
  auto no = [](auto&&... args) {
    return InvalidArgument(args..., "; MixtralForCausalLM has no equivalent (hf-mixtral exports "
                                    "rmsnorm, rope, swiglu experts in every layer, no biases, "
                                    "top-k with renormalised gates, dropless)");
  };
  if (m.norm != dense::NormKind::kRmsNorm) {
    return no("model.norm=", dense::NormKindName(m.norm), ": Mixtral uses RMSNorm");
  }
  if (m.position != model::Position::kRope) {
    return no("model.position=", model::PositionName(m.position), ": Mixtral uses rotary positions");
  }
  if (m.bias) return no("model.bias=true: Mixtral's linear layers have no biases");
  if (e.layer_freq != 1) return no("moe.layer_freq=", e.layer_freq, ": Mixtral makes every layer MoE");
  if (e.activation != moe::Activation::kSwiglu) {
    return no("moe.activation=", moe::ActivationName(e.activation), ": Mixtral's experts are SwiGLU");
  }
  if (e.bias) return no("moe.bias=true: Mixtral's experts have no biases");
  if (!e.normalize_gates) return no("moe.normalize_gates=false: Mixtral renormalises the top-k gates");
  if (e.routed_scaling_factor != 1.0f) {
    return no("moe.routed_scaling_factor=", e.routed_scaling_factor, ": Mixtral does not scale its experts' output");
  }
  if (e.top_k > 1 && e.second_expert_policy != moe::SecondExpertPolicy::kAll) {
    return no("moe.second_expert_policy=", moe::SecondExpertPolicyName(e.second_expert_policy),
              ": Mixtral keeps every top-k choice");
  }
  if (e.score != moe::ScoreFunction::kSoftmax) {
    return no("moe.score=", moe::ScoreFunctionName(e.score), ": Mixtral's router takes a softmax");
  }
  if (e.route_groups > 0) {
    return no("moe.route_groups=", e.route_groups, ": Mixtral routes over all experts, not groups");
  }
  if (e.num_shared_experts > 0) return no("moe.num_shared_experts=", e.num_shared_experts, ": Mixtral has no shared experts");
  if (e.expert_bias_rate > 0) return no("moe.expert_bias_rate=", e.expert_bias_rate, ": Mixtral's router has no expert bias");
  if (e.eval_capacity_factor > 0) {
    return no("moe.eval_capacity_factor=", e.eval_capacity_factor, ": Mixtral routes dropless (set it to 0 when training)");
  }
  return OkStatus();
}

namespace {

// An f32 as the double of its shortest decimal text (1e-06f as 1e-06, not the
// 9.999999974752427e-07 it widens to): the text config.json shows, which reads back to the
// same f32, as the import and PyTorch's float32 arithmetic read it.
double ShortestF32(float v) {
  char text[32];
  const auto [end, error] = std::to_chars(text, text + sizeof text, v);
  double shortest = v;
  if (error == std::errc()) std::from_chars(text, end, shortest);
  return shortest;
}

}  // namespace

nlohmann::ordered_json MixtralConfigJson(const config::Config& c) {
  const model::ModelConfig& m = c.model;
  nlohmann::ordered_json j;
  j["architectures"] = {"MixtralForCausalLM"};
  j["model_type"] = "mixtral";
  j["vocab_size"] = m.vocab_size;
  j["hidden_size"] = m.d_model;
  j["intermediate_size"] = c.moe.d_expert;
  j["num_hidden_layers"] = m.n_layers;
  j["num_attention_heads"] = m.n_heads;
  j["num_key_value_heads"] = m.kv_heads();
  j["head_dim"] = m.head_dim();
  j["hidden_act"] = "silu";
  j["max_position_embeddings"] = m.seq_len;
  j["rms_norm_eps"] = ShortestF32(m.norm_eps);
  j["rope_theta"] = ShortestF32(m.rope_base);
  j["sliding_window"] = nullptr;
  j["attention_dropout"] = 0.0;
  j["num_local_experts"] = c.moe.num_experts;
  j["num_experts_per_tok"] = c.moe.top_k;
  j["router_aux_loss_coef"] = ShortestF32(c.moe.aux_loss_coef);
  j["output_router_logits"] = false;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["initializer_range"] = ShortestF32(m.init_std);
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  return j;
}

namespace {

// config.json's key for each Switchyard key an import sets from it, so that an error names
// the key of the file ("hidden_size=0 must be positive", not "model.d_model=0 ...").
constexpr std::pair<const char*, const char*> kHfKeys[] = {
    {"model.vocab_size", "vocab_size"},         {"model.seq_len", "max_position_embeddings"},
    {"model.d_model", "hidden_size"},           {"model.n_layers", "num_hidden_layers"},
    {"model.n_kv_heads", "num_key_value_heads"}, {"model.n_heads", "num_attention_heads"},
    {"model.head_dim", "head_dim"},             {"model.d_ff", "intermediate_size"},
    {"model.norm_eps", "rms_norm_eps"},         {"model.rope_base", "rope_theta"},
    {"model.init_std", "initializer_range"},    {"model.tie_embeddings", "tie_word_embeddings"},
    {"moe.num_experts", "num_local_experts"},   {"moe.top_k", "num_experts_per_tok"},
    {"moe.d_expert", "intermediate_size"},      {"moe.aux_loss_coef", "router_aux_loss_coef"}};

// config.json's values by kind, or a default when absent or null (none: required); errors
// name the file and the key.
class HfReader {
 public:
  HfReader(const nlohmann::json& hf, const std::string& source) : hf_(hf), source_(source) {}
  bool Has(const char* key) const { return hf_.contains(key) && !hf_[key].is_null(); }
  Status Bad(const char* key, const std::string& why) const {
    return InvalidArgument(source_, ": ", key, "=", hf_[key].dump().substr(0, 80), why);
  }
  StatusOr<int64_t> Int(const char* key, std::optional<int64_t> fallback = std::nullopt) const {
    if (!Has(key)) return Missing(key, fallback);
    const nlohmann::json& v = hf_[key];
    if (!v.is_number_integer()) return Bad(key, " is not an integer");
    if (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t{INT64_MAX}) {
      return Bad(key, " is beyond 2^63 - 1");
    }
    return v.get<int64_t>();
  }
  StatusOr<double> Number(const char* key, double fallback) const {
    if (!Has(key)) return fallback;
    if (!hf_[key].is_number()) return Bad(key, " is not a number");
    return hf_[key].get<double>();
  }
  StatusOr<bool> Bool(const char* key, bool fallback) const {
    if (!Has(key)) return fallback;
    if (!hf_[key].is_boolean()) return Bad(key, " is not true or false");
    return hf_[key].get<bool>();
  }

 private:
  template <typename T>
  StatusOr<T> Missing(const char* key, std::optional<T> fallback) const {
    if (!fallback) return InvalidArgument(source_, ": no '", key, "' (required)");
    return *fallback;
  }
  const nlohmann::json& hf_;
  const std::string& source_;
};

// config.json's keys that change what the model computes and that no Switchyard key
// expresses: refused unless absent or at their neutral value. sliding_window depends on the
// sequence length and is CheckSlidingWindow's.
Status CheckUnsupportedKeys(const HfReader& r) {
  const char* kNoScaling = " is not null: Switchyard's rotary positions are not scaled "
                           "(only rope_scaling=null imports)";
  if (r.Has("rope_scaling")) return r.Bad("rope_scaling", kNoScaling);
  for (const char* key : {"attention_bias", "mlp_bias"}) {
    SY_ASSIGN_OR_RETURN(bool bias, r.Bool(key, false));
    if (bias) return r.Bad(key, ": Switchyard's Mixtral has no linear biases (only false imports)");
  }
  return OkStatus();
}

// rope_theta, or (transformers 5's form) rope_parameters.rope_theta of the default rotary
// type; 1e6 (MixtralConfig's default) when neither is given.
StatusOr<double> RopeTheta(const nlohmann::json& hf, const HfReader& r, const std::string& source) {
  if (r.Has("rope_theta") || !r.Has("rope_parameters")) return r.Number("rope_theta", 1e6);
  const nlohmann::json& p = hf["rope_parameters"];
  const nlohmann::json type =
      p.is_object() ? p.value("rope_type", nlohmann::json("default")) : nlohmann::json();
  if (type != "default") {
    return r.Bad("rope_parameters", " is not the default rotary type: Switchyard's rotary "
                                    "positions are not scaled (only rope_type=default imports)");
  }
  const HfReader params(p, source);
  return params.Number("rope_theta", 1e6);
}

}  // namespace

StatusOr<std::string> ConfigYamlFromMixtral(const nlohmann::json& hf, const std::string& source) {
  const HfReader r(hf, source);
  if (!r.Has("model_type")) return InvalidArgument(source, ": no 'model_type' (required)");
  if (hf["model_type"] != "mixtral") return r.Bad("model_type", ": only mixtral imports");
  if (r.Has("hidden_act") && hf["hidden_act"] != "silu") {
    return r.Bad("hidden_act", ": only silu (swiglu experts) imports");
  }
  SY_RETURN_IF_ERROR(CheckUnsupportedKeys(r));
  // Numbers as config.json holds them (the shortest text of the same double): a float key
  // rounds to the f32 it would round to from the JSON.
  const auto number = [](double v) { return nlohmann::json(v).dump(); };
  std::ostringstream y;
  y << "model:\n";
  for (auto [ours, theirs] : {std::pair<const char*, const char*>{"vocab_size", "vocab_size"},
                              {"seq_len", "max_position_embeddings"}, {"d_model", "hidden_size"},
                              {"n_layers", "num_hidden_layers"}, {"n_heads", "num_attention_heads"},
                              {"d_ff", "intermediate_size"}}) {
    SY_ASSIGN_OR_RETURN(int64_t v, r.Int(theirs));
    y << "  " << ours << ": " << v << "\n";
  }
  if (r.Has("head_dim")) {  // 0 or absent: hidden / heads
    SY_ASSIGN_OR_RETURN(int64_t head_dim, r.Int("head_dim"));
    y << "  head_dim: " << head_dim << "\n";
  }
  SY_ASSIGN_OR_RETURN(int64_t heads, r.Int("num_attention_heads"));
  SY_ASSIGN_OR_RETURN(int64_t kv_heads, r.Int("num_key_value_heads", heads));
  SY_ASSIGN_OR_RETURN(double eps, r.Number("rms_norm_eps", 1e-5));
  SY_ASSIGN_OR_RETURN(double theta, RopeTheta(hf, r, source));
  SY_ASSIGN_OR_RETURN(bool tied, r.Bool("tie_word_embeddings", false));
  SY_ASSIGN_OR_RETURN(double init_std, r.Number("initializer_range", 0.02));
  y << "  n_kv_heads: " << kv_heads << "\n  norm: rmsnorm\n  norm_eps: " << number(eps)
    << "\n  position: rope\n  rope_base: " << number(theta)
    << "\n  activation: swiglu\n  bias: false\n  tie_embeddings: " << (tied ? "true" : "false")
    << "\n  init_std: " << number(init_std) << "\n";
  SY_ASSIGN_OR_RETURN(int64_t experts, r.Int("num_local_experts"));
  SY_ASSIGN_OR_RETURN(int64_t k, r.Int("num_experts_per_tok"));
  SY_ASSIGN_OR_RETURN(int64_t f, r.Int("intermediate_size"));
  SY_ASSIGN_OR_RETURN(double aux, r.Number("router_aux_loss_coef", 0.02));
  y << "moe:\n  num_experts: " << experts << "\n  layer_freq: 1\n  top_k: " << k
    << "\n  d_expert: " << f << "\n  activation: swiglu\n  bias: false\n"
    << "  normalize_gates: true\n  second_expert_policy: all\n  capacity_factor: 0\n"
    << "  eval_capacity_factor: 0\n  aux_loss_coef: " << number(aux) << "\n  z_loss_coef: 0\n";
  return y.str();
}

Status CheckMixtralValues(const std::string& yaml, const std::string& source) {
  StatusOr<config::Config> config = config::ParseConfig(yaml, source);
  Status s = config.status();
  if (s.ok()) s = config->Validate(1);
  if (s.ok()) s = config->ValidateModel();
  if (s.ok()) return OkStatus();
  std::string m(s.message());
  for (auto [ours, theirs] : kHfKeys) {
    const size_t n = std::strlen(ours), t = std::strlen(theirs);
    for (size_t at = m.find(ours); at != std::string::npos; at = m.find(ours, at + t)) {
      m.replace(at, n, theirs);
    }
  }
  if (m.rfind(source + ":", 0) != 0) m = source + ": " + m;
  return InvalidArgument(m);
}

Status CheckSlidingWindow(const nlohmann::json& hf, const config::Config& config,
                          const std::string& source) {
  const HfReader r(hf, source);
  if (!r.Has("sliding_window")) return OkStatus();
  SY_ASSIGN_OR_RETURN(int64_t window, r.Int("sliding_window"));
  if (window < 1) return r.Bad("sliding_window", " must be a positive integer or null");
  if (window >= config.model.seq_len) return OkStatus();  // every position sees all before it
  return r.Bad("sliding_window", StrCat(" is below model.seq_len=", config.model.seq_len,
                                        ": Switchyard attends to every earlier position, so the "
                                        "model would change (import with --set model.seq_len=",
                                        window, " or less)"));
}

std::map<std::string, Tensor> ToMixtral(const std::map<std::string, Tensor>& ours,
                                        const config::Config& c) {
  std::map<std::string, Tensor> hf;
  for (const Pair& p : DensePairs(c)) {
    const Tensor& t = ours.at(p.ours);
    hf[p.theirs] = p.transpose ? Transpose(t) : t;
  }
  for (int64_t i = 0; i < c.model.n_layers; ++i) {
    const std::string o = "layers." + std::to_string(i) + ".moe.experts.";
    for (int64_t e = 0; e < c.moe.num_experts; ++e) {
      const std::string t = Layer(i) + "block_sparse_moe.experts." + std::to_string(e) + ".";
      for (const char* w : {"w1", "w2", "w3"}) hf[t + w + ".weight"] = Transpose(Slice(ours.at(o + w), e));
    }
  }
  return hf;
}

StatusOr<std::map<std::string, Tensor>> FromMixtral(const std::map<std::string, Tensor>& hf,
                                                    const config::Config& c,
                                                    const std::string& source) {
  std::set<std::string> unused;
  for (const auto& [name, t] : hf) unused.insert(name);
  // Tied embeddings: a saved lm_head.weight (a copy of the embedding) is not needed.
  if (c.model.tie_embeddings) unused.erase("lm_head.weight");
  auto take = [&](const std::string& name, const Shape& shape) -> StatusOr<Tensor> {
    auto it = hf.find(name);
    if (it == hf.end()) return InvalidArgument(source, ": no tensor ", name);
    if (it->second.dtype() != DType::kF32) {
      return InvalidArgument(source, ": ", name, " is ", DTypeName(it->second.dtype()),
                             "; only float32 checkpoints import (convert with torch_dtype=float32)");
    }
    if (it->second.shape() != shape) {
      return InvalidArgument(source, ": ", name, " has shape ", ShapeString(it->second.shape()),
                             ", the config.json implies ", ShapeString(shape));
    }
    unused.erase(name);
    return it->second;
  };
  const model::ModelConfig& m = c.model;
  const int64_t d = m.d_model, hd = m.head_dim(), E = c.moe.num_experts, f = c.moe.d_expert;
  std::map<std::string, Shape> ours_shape = {{"embed.wte", {m.vocab_size, d}},
                                             {"norm_f.weight", {d}},
                                             {"head.weight", {d, m.vocab_size}}};
  for (int64_t i = 0; i < m.n_layers; ++i) {
    const std::string o = "layers." + std::to_string(i) + ".";
    ours_shape[o + "norm1.weight"] = {d};
    ours_shape[o + "norm2.weight"] = {d};
    ours_shape[o + "attn.q.weight"] = {d, m.n_heads * hd};
    ours_shape[o + "attn.k.weight"] = {d, m.kv_heads() * hd};
    ours_shape[o + "attn.v.weight"] = {d, m.kv_heads() * hd};
    ours_shape[o + "attn.o.weight"] = {m.n_heads * hd, d};
    ours_shape[o + "moe.router.weight"] = {d, E};
  }
  std::map<std::string, Tensor> ours;
  for (const Pair& p : DensePairs(c)) {
    const Shape& s = ours_shape.at(p.ours);
    SY_ASSIGN_OR_RETURN(Tensor t, take(p.theirs, p.transpose ? Shape{s[1], s[0]} : s));
    ours[p.ours] = p.transpose ? Transpose(t) : t.Clone();
  }
  for (int64_t i = 0; i < m.n_layers; ++i) {
    const std::string o = "layers." + std::to_string(i) + ".moe.experts.";
    for (const char* w : {"w1", "w2", "w3"}) {
      const bool down = std::strcmp(w, "w2") == 0;
      Tensor stacked = Tensor::Empty(down ? Shape{E, f, d} : Shape{E, d, f}, DType::kF32);
      for (int64_t e = 0; e < E; ++e) {
        const std::string name =
            Layer(i) + "block_sparse_moe.experts." + std::to_string(e) + "." + w + ".weight";
        SY_ASSIGN_OR_RETURN(Tensor t, take(name, down ? Shape{d, f} : Shape{f, d}));
        const Tensor tt = Transpose(t);
        std::memcpy(stacked.data<float>() + e * d * f, tt.data<float>(), sizeof(float) * d * f);
      }
      ours[o + w] = stacked;
    }
  }
  if (!unused.empty()) {
    return InvalidArgument(source, ": unexpected tensor ", *unused.begin(),
                           " (not part of a MixtralForCausalLM of this config.json)");
  }
  return ours;
}

}  // namespace switchyard::cli
