// The MoE layer's settings (../shared/MODEL.md section 2), with one Validate() that names
// the key and the value it rejects.
#pragma once

#include "dense/mlp.h"

#include <cstdint>
#include <string>

#include "engine/core/status.h"

namespace switchyard::moe {

// The experts' activation: the dense layers' enum (dense/mlp.h), one for the whole model.
using dense::Activation;
using dense::ActivationName;
enum class SecondExpertPolicy { kAll, kRandom };  // GShard; top-2 only
enum class DropPolicy { kPosition, kProbability };

// dense::ParseActivation naming the key moe.activation.
StatusOr<Activation> ParseActivation(const std::string& name);
StatusOr<SecondExpertPolicy> ParseSecondExpertPolicy(const std::string& name);
StatusOr<DropPolicy> ParseDropPolicy(const std::string& name);
const char* SecondExpertPolicyName(SecondExpertPolicy p);
const char* DropPolicyName(DropPolicy p);

struct MoEConfig {
  int64_t d_model = 0;            // d; required
  int64_t num_experts = 8;        // E
  int64_t layer_freq = 2;         // layer i is MoE iff i % layer_freq == layer_freq - 1
  int64_t top_k = 1;              // k, 1 <= k <= E
  int64_t d_expert = 0;           // f, each expert's hidden size; required
  Activation activation = Activation::kGelu;
  bool bias = false;              // experts (and shared experts) carry b1 (f) and b2 (d)
  bool normalize_gates = false;   // divide each token's k gates by their sum
  SecondExpertPolicy second_expert_policy = SecondExpertPolicy::kAll;
  float jitter_eps = 0.0f;        // training-only multiplicative router-input noise
  float expert_bias_rate = 0.0f;  // aux-loss-free balancing (DeepSeek-V3) when > 0
  float capacity_factor = 1.25f;  // training; <= 0 means dropless
  float eval_capacity_factor = 2.0f;
  DropPolicy drop_policy = DropPolicy::kPosition;
  float aux_loss_coef = 0.01f;
  float z_loss_coef = 0.0f;
  int64_t num_shared_experts = 0;  // dense MLPs applied to every token (DeepSeek)
  int64_t d_shared = 0;            // hidden size of each shared expert; 0 means d_expert
  uint64_t seed = 1234;            // keys the jitter and random second-expert draws
  // All-to-all / compute overlap (docs/moe-layer.md "Overlap"): each ep rank's local experts
  // are cut into this many chunks of whole experts after admission; chunk i+1's rows travel
  // while chunk i's experts compute. 1: no chunks. Must not exceed E / ep.
  int64_t overlap_chunks = 1;

  // Checks every field alone and together ("moe.top_k=3 exceeds moe.num_experts=2").
  Status Validate() const;
  // Experts per rank for an ep-way split; an error when E % ep != 0.
  StatusOr<int64_t> ExpertsPerRank(int64_t ep) const;
  // Each expert's hidden units per rank under expert tensor parallelism (etp ranks split
  // d_expert); an error naming parallel.etp and moe.d_expert when etp does not divide it.
  StatusOr<int64_t> ExpertHiddenPerRank(int64_t etp) const;
  // overlap_chunks chunks of whole experts fit an ep-way split (at most E / ep); an error
  // naming moe.overlap_chunks, moe.num_experts and parallel.ep otherwise.
  Status CheckOverlapChunks(int64_t ep) const;
  // Whether decoder layer i is an MoE layer (MODEL.md section 1).
  bool IsMoELayer(int64_t i) const { return i % layer_freq == layer_freq - 1; }
  int64_t shared_hidden() const { return d_shared > 0 ? d_shared : d_expert; }
};

}  // namespace switchyard::moe
