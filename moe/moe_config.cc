#include "moe/moe_config.h"

#include <cmath>

namespace switchyard::moe {

StatusOr<Activation> ParseActivation(const std::string& name) {
  return dense::ParseActivation(name, "moe.activation");
}

StatusOr<SecondExpertPolicy> ParseSecondExpertPolicy(const std::string& name) {
  if (name == "all") return SecondExpertPolicy::kAll;
  if (name == "random") return SecondExpertPolicy::kRandom;
  return InvalidArgument("moe.second_expert_policy='", name, "' is not one of all, random");
}

StatusOr<DropPolicy> ParseDropPolicy(const std::string& name) {
  if (name == "position") return DropPolicy::kPosition;
  if (name == "probability") return DropPolicy::kProbability;
  return InvalidArgument("moe.drop_policy='", name, "' is not one of position, probability");
}

const char* SecondExpertPolicyName(SecondExpertPolicy p) {
  return p == SecondExpertPolicy::kAll ? "all" : "random";
}

const char* DropPolicyName(DropPolicy p) {
  return p == DropPolicy::kPosition ? "position" : "probability";
}

Status MoEConfig::Validate() const {
  if (d_model <= 0) return InvalidArgument("model.d_model=", d_model, " must be positive");
  if (num_experts <= 0) return InvalidArgument("moe.num_experts=", num_experts, " must be positive");
  if (layer_freq <= 0) return InvalidArgument("moe.layer_freq=", layer_freq, " must be >= 1");
  if (top_k <= 0) return InvalidArgument("moe.top_k=", top_k, " must be positive");
  if (top_k > num_experts) {
    return InvalidArgument("moe.top_k=", top_k, " exceeds moe.num_experts=", num_experts);
  }
  if (d_expert <= 0) return InvalidArgument("moe.d_expert=", d_expert, " must be positive");
  if (second_expert_policy == SecondExpertPolicy::kRandom && top_k != 2) {
    return InvalidArgument("moe.second_expert_policy=random needs moe.top_k=2, got ", top_k);
  }
  if (!(jitter_eps >= 0.0f && jitter_eps < 1.0f)) {
    return InvalidArgument("moe.jitter_eps=", jitter_eps, " must be in [0, 1)");
  }
  if (!(expert_bias_rate >= 0.0f)) {
    return InvalidArgument("moe.expert_bias_rate=", expert_bias_rate, " must be >= 0");
  }
  // NaN and +-inf are not capacities (<= 0 already means dropless; inf would overflow C).
  if (!std::isfinite(capacity_factor)) {
    return InvalidArgument("moe.capacity_factor=", capacity_factor,
                           " must be a finite number (<= 0 means dropless)");
  }
  if (!std::isfinite(eval_capacity_factor)) {
    return InvalidArgument("moe.eval_capacity_factor=", eval_capacity_factor,
                           " must be a finite number (<= 0 means dropless)");
  }
  if (!(aux_loss_coef >= 0.0f)) {
    return InvalidArgument("moe.aux_loss_coef=", aux_loss_coef, " must be >= 0");
  }
  if (!(z_loss_coef >= 0.0f)) {
    return InvalidArgument("moe.z_loss_coef=", z_loss_coef, " must be >= 0");
  }
  if (num_shared_experts < 0) {
    return InvalidArgument("moe.num_shared_experts=", num_shared_experts, " must be >= 0");
  }
  if (d_shared < 0) return InvalidArgument("moe.d_shared=", d_shared, " must be >= 0");
  if (overlap_chunks < 1) {
    return InvalidArgument("moe.overlap_chunks=", overlap_chunks, " must be >= 1 (1: no chunks)");
  }
  return OkStatus();
}

StatusOr<int64_t> MoEConfig::ExpertsPerRank(int64_t ep) const {
  if (ep <= 0 || num_experts % ep != 0) {
    return InvalidArgument("moe.num_experts=", num_experts, " is not divisible by parallel.ep=", ep);
  }
  return num_experts / ep;
}

StatusOr<int64_t> MoEConfig::ExpertHiddenPerRank(int64_t etp) const {
  if (etp <= 0 || d_expert % etp != 0) {
    return InvalidArgument("parallel.etp=", etp, " does not divide moe.d_expert=", d_expert);
  }
  return d_expert / etp;
}

Status MoEConfig::CheckOverlapChunks(int64_t ep) const {
  SY_ASSIGN_OR_RETURN(const int64_t per_rank, ExpertsPerRank(ep));
  if (overlap_chunks > per_rank) {
    return InvalidArgument("moe.overlap_chunks=", overlap_chunks, " exceeds the ", per_rank,
                           " experts per ep rank (moe.num_experts=", num_experts,
                           " / parallel.ep=", ep, "): each chunk holds whole experts");
  }
  return OkStatus();
}

}  // namespace switchyard::moe
