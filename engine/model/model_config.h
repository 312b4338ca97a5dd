// The decoder's sizes and choices (../shared/MODEL.md section 1); the `model` section of a
// config. The MoE layers' settings are moe::MoEConfig (the `moe` section).
#pragma once

#include <cstdint>
#include <string>

#include "dense/mlp.h"
#include "dense/norm.h"
#include "engine/core/status.h"

namespace switchyard::model {

// How the decoder knows a token's position (MODEL.md section 1): a learned table wpe
// (S_max, d) added to the embedding, or rotary q and k.
enum class Position { kLearned, kRope };

// The config's spellings, each error naming its key ("model.norm='x' is not one of
// layernorm, rmsnorm"); the names are the YAML spellings.
StatusOr<dense::NormKind> ParseNorm(const std::string& name);
StatusOr<Position> ParsePosition(const std::string& name);
StatusOr<dense::Activation> ParseActivation(const std::string& name);
const char* PositionName(Position position);

struct ModelConfig {
  int64_t vocab_size = 0;     // V; required; at least the tokenizer's vocabulary
  int64_t seq_len = 0;        // S, tokens per sequence (and S_max of learned positions)
  int64_t d_model = 0;        // d
  int64_t n_layers = 0;       // L
  int64_t n_heads = 0;        // query heads
  int64_t n_kv_heads = 0;     // key/value heads; 0 means n_heads (fewer: grouped-query)
  int64_t explicit_head_dim = 0;  // model.head_dim: hd, each head's width; 0 means
                                  // d_model / n_heads (Megatron-LM's kv_channels, HF head_dim)
  int64_t d_ff = 0;           // hidden size of the dense MLPs; 0 means 4 * d_model
  dense::NormKind norm = dense::NormKind::kLayerNorm;  // layernorm | rmsnorm
  float norm_eps = 1e-5f;
  Position position = Position::kLearned;               // learned | rope
  float rope_base = 10000.0f;
  dense::Activation activation = dense::Activation::kGelu;  // dense MLP: gelu (tanh) | relu | swiglu
  bool bias = true;                   // linear layers carry biases
  bool tie_embeddings = true;         // head = wte^T
  float init_std = 0.02f;             // normal init of every weight matrix
  bool scaled_init = false;           // GPT-2: output projections use init_std / sqrt(2 L)

  // Names the key and the value it rejects ("model.n_heads=3 does not divide ...").
  Status Validate() const;
  bool operator==(const ModelConfig&) const = default;  // every field (the planner's caches)
  int64_t ff_hidden() const { return d_ff > 0 ? d_ff : 4 * d_model; }
  int64_t kv_heads() const { return n_kv_heads > 0 ? n_kv_heads : n_heads; }
  int64_t head_dim() const {
    return explicit_head_dim > 0 ? explicit_head_dim : n_heads > 0 ? d_model / n_heads : 0;
  }
};

}  // namespace switchyard::model
