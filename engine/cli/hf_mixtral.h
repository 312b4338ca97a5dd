// The Hugging Face bridge (`switchyard export/import --format hf-mixtral`, docs/hf.md):
// a Switchyard model of Mixtral's shape and Hugging Face's MixtralForCausalLM directory
// (config.json + model.safetensors with its tensor names), in both directions. The tensors
// correspond one to one (docs/model.md): ours are (in, out), torch.nn.Linear's (out, in),
// so every matrix is transposed, and the stacked expert tensors (E, ., .) become E
// separate experts. Values are copied, never rounded, so export then import gives back the
// same bits.
#pragma once

#include <map>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/core/status.h"
#include "engine/core/tensor.h"
#include "engine/config/config.h"

namespace switchyard::cli {

// OK when MixtralForCausalLM computes what this config does in eval mode; otherwise one
// error naming the key, its value and why Mixtral has no equivalent ("moe.layer_freq=2:
// Mixtral makes every layer MoE").
Status CheckMixtralExpressible(const config::Config& config);

// config.json of MixtralForCausalLM for a config CheckMixtralExpressible accepts.
nlohmann::ordered_json MixtralConfigJson(const config::Config& config);

// The YAML of a Switchyard config with config.json's model (the moe section Mixtral's:
// top-k renormalised, dropless, swiglu experts in every layer); the train, data and
// runtime sections keep their defaults. Refused, naming the file and config.json's key: a
// value of the wrong kind ("config.json: hidden_size=\"64\" is not an integer"), and keys
// that change the model without a Switchyard equivalent (hidden_act other than silu,
// rope_scaling not null, attention_bias or mlp_bias true, rope_parameters of another
// rotary type: "config.json: hidden_act=\"gelu\": only silu (swiglu experts) imports").
StatusOr<std::string> ConfigYamlFromMixtral(const nlohmann::json& hf, const std::string& source);

// The YAML of ConfigYamlFromMixtral by itself (no --set): what the config layer refuses
// (Config::Validate, Config::ValidateModel), with `source` and config.json's key named
// ("config.json: hidden_size=0 must be positive").
Status CheckMixtralValues(const std::string& yaml, const std::string& source);

// config.json's sliding_window against the config imported (with --set): null, or at least
// model.seq_len (then every position sees all before it, as Switchyard's attention does).
Status CheckSlidingWindow(const nlohmann::json& hf, const config::Config& config,
                          const std::string& source);

// Our model tensors (checkpoint names, whole, f32 on the host) -> Mixtral's names.
std::map<std::string, Tensor> ToMixtral(const std::map<std::string, Tensor>& ours,
                                        const config::Config& config);

// Mixtral's tensors -> ours, for `config`. Errors: a missing tensor, an unexpected one, a
// wrong shape or a dtype other than F32 (one line naming the tensor; `source` the files).
StatusOr<std::map<std::string, Tensor>> FromMixtral(const std::map<std::string, Tensor>& hf,
                                                    const config::Config& config,
                                                    const std::string& source);

}  // namespace switchyard::cli
