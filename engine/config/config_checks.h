// The checks of Config::Validate that read several sections or the parse itself (internal to
// engine/config): the required keys, the model's bounds, the products of sizes that must stay
// countable, the MoE layers a config asks for, hot-expert replication. One line each, naming
// the keys and values.
#pragma once

#include <cstdint>

#include "engine/config/config.h"

namespace switchyard::config {

// The keys without a usable default (docs/config.md marks them *required*).
inline constexpr const char* kRequiredKeys[] = {"model.vocab_size", "model.seq_len",
                                                "model.d_model",    "model.n_layers",
                                                "model.n_heads",    "moe.d_expert"};

// The deepest model a config may describe. The deepest published LLMs have about 100-130
// layers (GPT-3 96, Megatron-Turing NLG 105, PaLM 118, Llama 3.1 405B 126); 1024 is 8x that.
// A mistyped depth (100000) is refused rather than planned: the dry-run's memory prediction
// and the registries grow with the layers (1024 layers: about 0.6 s of dry-run).
inline constexpr int64_t kMaxLayers = 1024;

// The largest count formed from config values (tokens, logits, attention scores, parameters,
// sequences of a run): 2^53, so that it is exact in the planner's doubles and leaves int64
// a factor of 1024 for bytes and sums. Real runs are far below (a 530B model's parameters
// are 2^39; a step of 4M tokens is 2^22).
inline constexpr int64_t kMaxCount = int64_t{1} << 53;

// "model.d_model is required" when ParseConfig saw no value for `key` (one of
// kRequiredKeys), else OK. Validate asks where it checks the key's value, so that a key set
// to 0 is "model.d_model=0 must be positive". The decoder's other sizes (vocab_size, seq_len,
// n_layers, n_heads) are Config::ValidateModel's: Config::Validate also takes configs of one
// MoE layer (`switchyard moe-layer` reads model.d_model and the moe section only).
Status CheckRequiredKey(const Config& config, const char* key);

// The model's bounds beyond ModelConfig::Validate: n_layers <= kMaxLayers, rope_base > 0
// under rope, init_std in (0, 1], and a MoE config with at least one MoE layer.
Status CheckModelLimits(const Config& config);

// Every product of sizes the engine forms (tokens per micro-batch, logits, expert rows,
// attention scores, tokens per step, sequences of the run, parameters) is at most kMaxCount.
// world <= 0: one data-parallel rank.
Status CheckSizeProducts(const Config& config, int world);

// moe.replicate_hot_experts: more than one ep rank, whole experts, ZeRO <= 2, no chunks.
Status CheckReplication(const moe::MoEConfig& moe, const ParallelConfig& parallel);

}  // namespace switchyard::config
