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

StatusOr<ScoreFunction> ParseScoreFunction(const std::string& name) {
  if (name == "softmax") return ScoreFunction::kSoftmax;
  if (name == "sigmoid") return ScoreFunction::kSigmoid;
  return InvalidArgument("moe.score='", name, "' is not one of softmax, sigmoid");
}

StatusOr<AuxLossScope> ParseAuxLossScope(const std::string& name) {
  if (name == "group") return AuxLossScope::kGroup;
  if (name == "sequence") return AuxLossScope::kSequence;
  if (name == "global") return AuxLossScope::kGlobal;
  return InvalidArgument("moe.aux_loss_scope='", name, "' is not one of group, sequence, global");
}

const char* ScoreFunctionName(ScoreFunction s) {
  return s == ScoreFunction::kSoftmax ? "softmax" : "sigmoid";
}

const char* AuxLossScopeName(AuxLossScope s) {
  switch (s) {
    case AuxLossScope::kGroup: return "group";
    case AuxLossScope::kSequence: return "sequence";
    case AuxLossScope::kGlobal: return "global";
  }
  return "?";
}

const char* SecondExpertPolicyName(SecondExpertPolicy p) {
  return p == SecondExpertPolicy::kAll ? "all" : "random";
}

const char* DropPolicyName(DropPolicy p) {
  return p == DropPolicy::kPosition ? "position" : "probability";
}

StatusOr<Dispatcher> ParseDispatcher(const std::string& name) {
  if (name == "flat") return Dispatcher::kFlat;
  if (name == "hierarchical") return Dispatcher::kHierarchical;
  return InvalidArgument("moe.dispatcher='", name, "' is not one of flat, hierarchical");
}

StatusOr<ExpertBiasUpdate> ParseExpertBiasUpdate(const std::string& name) {
  if (name == "sign") return ExpertBiasUpdate::kSign;
  if (name == "proportional") return ExpertBiasUpdate::kProportional;
  return InvalidArgument("moe.expert_bias_update='", name, "' is not one of sign, proportional");
}

const char* ExpertBiasUpdateName(ExpertBiasUpdate u) {
  return u == ExpertBiasUpdate::kSign ? "sign" : "proportional";
}

const char* DispatcherName(Dispatcher d) {
  return d == Dispatcher::kFlat ? "flat" : "hierarchical";
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
  if (expert_bias_update != ExpertBiasUpdate::kSign && expert_bias_rate == 0.0f) {
    return InvalidArgument("moe.expert_bias_update=", ExpertBiasUpdateName(expert_bias_update),
                           " needs moe.expert_bias_rate > 0 (0: no expert bias)");
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
  if (!(routed_scaling_factor > 0.0f) || !std::isfinite(routed_scaling_factor)) {
    return InvalidArgument("moe.routed_scaling_factor=", routed_scaling_factor,
                           " must be a finite number > 0 (1 leaves the gates as routed)");
  }
  if (!(router_lr_scale > 0.0f) || !std::isfinite(router_lr_scale)) {
    return InvalidArgument("moe.router_lr_scale=", router_lr_scale,
                           " must be a finite number > 0 (1: the routers at train.lr)");
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
  if (replicate_hot_experts < 0 || replicate_hot_experts >= num_experts) {
    return InvalidArgument("moe.replicate_hot_experts=", replicate_hot_experts,
                           " must be in [0, moe.num_experts=", num_experts, ")");
  }
  if (replicate_every < 1) {
    return InvalidArgument("moe.replicate_every=", replicate_every, " must be >= 1");
  }
  return ValidateRouteGroups();
}

Status MoEConfig::ValidateRouteGroups() const {
  if (route_groups < 0) {
    return InvalidArgument("moe.route_groups=", route_groups, " must be >= 0 (0: off)");
  }
  if (route_groups == 0) {
    if (route_group_topk != 0) {
      return InvalidArgument("moe.route_group_topk=", route_group_topk,
                             " needs moe.route_groups > 0 (node-limited routing is off)");
    }
    return OkStatus();
  }
  if (num_experts % route_groups != 0) {
    return InvalidArgument("moe.route_groups=", route_groups,
                           " does not divide moe.num_experts=", num_experts);
  }
  if (route_group_topk < 1 || route_group_topk > route_groups) {
    return InvalidArgument("moe.route_group_topk=", route_group_topk, " must be in [1, ",
                           route_groups, "] (moe.route_groups=", route_groups, ")");
  }
  const int64_t reachable = route_group_topk * (num_experts / route_groups);
  if (top_k > reachable) {
    return InvalidArgument("moe.top_k=", top_k, " exceeds the ", reachable,
                           " experts of moe.route_group_topk=", route_group_topk, " groups of ",
                           num_experts / route_groups, " (moe.num_experts / moe.route_groups)");
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
