#include "engine/config/sync_settings.h"

namespace switchyard::config {

parallel::SyncSettings SyncSettingsOf(const Config& c) {
  return {.zero_stage = c.parallel.zero_stage,
          .pp = c.parallel.pp,
          .grad_accum = c.train.grad_accum,
          .ordered_grad_accum = c.train.ordered_grad_accum,
          .tied_embeddings = c.model.tie_embeddings};
}

parallel::SyncPolicy SyncPolicyOf(const Config& c) {
  return parallel::SyncPolicyFor(SyncSettingsOf(c));
}

}  // namespace switchyard::config
