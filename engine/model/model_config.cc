#include "engine/model/model_config.h"

namespace switchyard::model {

StatusOr<dense::NormKind> ParseNorm(const std::string& name) {
  if (name == "layernorm") return dense::NormKind::kLayerNorm;
  if (name == "rmsnorm") return dense::NormKind::kRmsNorm;
  return InvalidArgument("model.norm='", name, "' is not one of layernorm, rmsnorm");
}

StatusOr<Position> ParsePosition(const std::string& name) {
  if (name == "learned") return Position::kLearned;
  if (name == "rope") return Position::kRope;
  return InvalidArgument("model.position='", name, "' is not one of learned, rope");
}

StatusOr<dense::Activation> ParseActivation(const std::string& name) {
  return dense::ParseActivation(name, "model.activation");
}

const char* PositionName(Position position) {
  return position == Position::kLearned ? "learned" : "rope";
}

Status ModelConfig::Validate() const {
  for (auto [key, v] : {std::pair<const char*, int64_t>{"vocab_size", vocab_size},
                        {"seq_len", seq_len}, {"d_model", d_model}, {"n_layers", n_layers},
                        {"n_heads", n_heads}}) {
    if (v <= 0) return InvalidArgument("model.", key, "=", v, " must be positive");
  }
  if (explicit_head_dim < 0) {
    return InvalidArgument("model.head_dim=", explicit_head_dim, " must be >= 0 (0: d_model / n_heads)");
  }
  if (explicit_head_dim == 0 && d_model % n_heads != 0) {
    return InvalidArgument("model.n_heads=", n_heads, " does not divide model.d_model=", d_model,
                           " (or set model.head_dim)");
  }
  if (n_kv_heads < 0 || n_heads % kv_heads() != 0) {
    return InvalidArgument("model.n_kv_heads=", n_kv_heads, " does not divide model.n_heads=",
                           n_heads);
  }
  if (d_ff < 0) return InvalidArgument("model.d_ff=", d_ff, " must be >= 0 (0: 4 * d_model)");
  if (!(norm_eps > 0.0f)) return InvalidArgument("model.norm_eps=", norm_eps, " must be > 0");
  if (position == Position::kRope && head_dim() % 2 != 0) {
    return InvalidArgument("model.position=rope needs an even head dim, got ",
                           explicit_head_dim > 0 ? "model.head_dim = " : "d_model / n_heads = ",
                           head_dim());
  }
  if (!(init_std > 0.0f)) return InvalidArgument("model.init_std=", init_std, " must be > 0");
  return OkStatus();
}

}  // namespace switchyard::model
