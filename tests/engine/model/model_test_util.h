// Shared by the decoder tests (decoder_test, stage_test, recompute_test): the Llama/Mixtral
// variants of a test's small GPT/Switch configs.
#pragma once

#include "engine/model/model_config.h"
#include "moe/moe_config.h"

namespace switchyard::model::testing {

// `gpt` with rmsnorm, rope, swiglu, no biases, an untied head and 4 query / 2 kv heads.
inline ModelConfig LlamaLike(ModelConfig gpt) {
  gpt.norm = "rmsnorm";
  gpt.position = "rope";
  gpt.activation = "swiglu";
  gpt.bias = false;
  gpt.tie_embeddings = false;
  gpt.n_heads = 4;
  gpt.n_kv_heads = 2;
  return gpt;
}

// `sw` with an MoE layer everywhere, top-2 normalised gates and swiglu experts.
inline moe::MoEConfig MixtralLike(moe::MoEConfig sw) {
  sw.layer_freq = 1;
  sw.top_k = 2;
  sw.normalize_gates = true;
  sw.activation = moe::Activation::kSwiglu;
  return sw;
}

}  // namespace switchyard::model::testing
