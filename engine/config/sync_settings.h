// The config's values the gradient sync's policy is decided from (engine/parallel/sync_plan.h
// sits below config and takes them plain): the trainer and the planner both ask here.
#pragma once

#include "engine/config/config.h"
#include "engine/parallel/sync_plan.h"

namespace switchyard::config {

// parallel.zero_stage, parallel.pp, train.grad_accum, train.ordered_grad_accum and
// model.tie_embeddings.
parallel::SyncSettings SyncSettingsOf(const Config& config);

// parallel::SyncPolicyFor(SyncSettingsOf(config)).
parallel::SyncPolicy SyncPolicyOf(const Config& config);

}  // namespace switchyard::config
