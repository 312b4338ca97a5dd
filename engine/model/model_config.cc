#include "engine/model/model_config.h"

namespace switchyard::model {

Status ModelConfig::Validate() const {
  for (auto [key, v] : {std::pair<const char*, int64_t>{"vocab_size", vocab_size},
                        {"seq_len", seq_len}, {"d_model", d_model}, {"n_layers", n_layers},
                        {"n_heads", n_heads}}) {
    if (v <= 0) return InvalidArgument("model.", key, "=", v, " must be positive");
  }
  if (d_model % n_heads != 0) {
    return InvalidArgument("model.n_heads=", n_heads, " does not divide model.d_model=", d_model);
  }
  if (n_kv_heads < 0 || n_heads % kv_heads() != 0) {
    return InvalidArgument("model.n_kv_heads=", n_kv_heads, " does not divide model.n_heads=",
                           n_heads);
  }
  if (d_ff < 0) return InvalidArgument("model.d_ff=", d_ff, " must be >= 0 (0: 4 * d_model)");
  if (norm != "layernorm" && norm != "rmsnorm") {
    return InvalidArgument("model.norm='", norm, "' is not one of layernorm, rmsnorm");
  }
  if (!(norm_eps > 0.0f)) return InvalidArgument("model.norm_eps=", norm_eps, " must be > 0");
  if (position != "learned" && position != "rope") {
    return InvalidArgument("model.position='", position, "' is not one of learned, rope");
  }
  if (position == "rope" && head_dim() % 2 != 0) {
    return InvalidArgument("model.position=rope needs an even head dim, got d_model / n_heads = ",
                           head_dim());
  }
  if (activation != "gelu" && activation != "relu" && activation != "swiglu") {
    return InvalidArgument("model.activation='", activation, "' is not one of gelu, relu, swiglu");
  }
  if (!(init_std > 0.0f)) return InvalidArgument("model.init_std=", init_std, " must be > 0");
  return OkStatus();
}

}  // namespace switchyard::model
