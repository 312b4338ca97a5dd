#include "engine/cli/hf_mixtral.h"

#include <cstring>
#include <set>
#include <sstream>

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
  if (e.num_shared_experts > 0) return no("moe.num_shared_experts=", e.num_shared_experts, ": Mixtral has no shared experts");
  if (e.expert_bias_rate > 0) return no("moe.expert_bias_rate=", e.expert_bias_rate, ": Mixtral's router has no expert bias");
  if (e.eval_capacity_factor > 0) {
    return no("moe.eval_capacity_factor=", e.eval_capacity_factor, ": Mixtral routes dropless (set it to 0 when training)");
  }
  return OkStatus();
}

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
  j["rms_norm_eps"] = m.norm_eps;
  j["rope_theta"] = m.rope_base;
  j["sliding_window"] = nullptr;
  j["attention_dropout"] = 0.0;
  j["num_local_experts"] = c.moe.num_experts;
  j["num_experts_per_tok"] = c.moe.top_k;
  j["router_aux_loss_coef"] = c.moe.aux_loss_coef;
  j["output_router_logits"] = false;
  j["tie_word_embeddings"] = m.tie_embeddings;
  j["initializer_range"] = m.init_std;
  j["use_cache"] = true;
  j["torch_dtype"] = "float32";
  return j;
}

StatusOr<std::string> ConfigYamlFromMixtral(const nlohmann::json& hf, const std::string& source) {
  auto get = [&](const char* key) -> StatusOr<nlohmann::json> {
    if (!hf.contains(key) || hf[key].is_null()) return InvalidArgument(source, ": no '", key, "'");
    return hf[key];
  };
  SY_ASSIGN_OR_RETURN(nlohmann::json type, get("model_type"));
  if (type != "mixtral") return InvalidArgument(source, ": model_type=", type.dump(), ": only mixtral imports");
  const std::string act = hf.value("hidden_act", "silu");
  if (act != "silu") return InvalidArgument(source, ": hidden_act='", act, "': only silu (swiglu experts) imports");
  std::ostringstream y;
  y << "model:\n";
  for (auto [ours, theirs] : {std::pair<const char*, const char*>{"vocab_size", "vocab_size"},
                              {"seq_len", "max_position_embeddings"}, {"d_model", "hidden_size"},
                              {"n_layers", "num_hidden_layers"}, {"n_heads", "num_attention_heads"},
                              {"d_ff", "intermediate_size"}}) {
    SY_ASSIGN_OR_RETURN(nlohmann::json v, get(theirs));
    if (!v.is_number_integer()) return InvalidArgument(source, ": ", theirs, "=", v.dump(), " is not an integer");
    y << "  " << ours << ": " << v.get<int64_t>() << "\n";
  }
  if (hf.contains("head_dim") && !hf["head_dim"].is_null()) {  // 0 or absent: hidden / heads
    if (!hf["head_dim"].is_number_integer() || hf["head_dim"].get<int64_t>() < 0) {
      return InvalidArgument(source, ": head_dim=", hf["head_dim"].dump(), " is not an integer >= 0");
    }
    y << "  head_dim: " << hf["head_dim"].get<int64_t>() << "\n";
  }
  y << "  n_kv_heads: " << hf.value("num_key_value_heads", hf.value("num_attention_heads", 0)) << "\n"
    << "  norm: rmsnorm\n  norm_eps: " << hf.value("rms_norm_eps", 1e-5) << "\n"
    << "  position: rope\n  rope_base: " << hf.value("rope_theta", 1e6) << "\n"
    << "  activation: swiglu\n  bias: false\n"
    << "  tie_embeddings: " << (hf.value("tie_word_embeddings", false) ? "true" : "false") << "\n"
    << "  init_std: " << hf.value("initializer_range", 0.02) << "\n";
  SY_ASSIGN_OR_RETURN(nlohmann::json experts, get("num_local_experts"));
  SY_ASSIGN_OR_RETURN(nlohmann::json k, get("num_experts_per_tok"));
  SY_ASSIGN_OR_RETURN(nlohmann::json f, get("intermediate_size"));
  y << "moe:\n  num_experts: " << experts.dump() << "\n  layer_freq: 1\n  top_k: " << k.dump()
    << "\n  d_expert: " << f.dump() << "\n  activation: swiglu\n  bias: false\n"
    << "  normalize_gates: true\n  second_expert_policy: all\n  capacity_factor: 0\n"
    << "  eval_capacity_factor: 0\n  aux_loss_coef: " << hf.value("router_aux_loss_coef", 0.02) << "\n"
    << "  z_loss_coef: 0\n";
  return y.str();
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
