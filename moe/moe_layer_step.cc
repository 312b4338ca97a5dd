// The MoE layer's end of a training step (MoELayer::EndOfStep, moe/moe_layer.h): everything
// a layer updates from the step's statistics once the optimizer has run, in one call, so the
// trainer needs no knowledge of the layer's balancing and replication state.
#include "moe/moe_layer.h"

namespace switchyard::moe {

void MoELayer::EndOfStep(const MoEStats& stats, bool updated, const ReplicaPlan* replica_plan,
                         DeviceContext* ctx) {
  const int64_t e = config_.num_experts;
  SY_CHECK(static_cast<int64_t>(stats.tokens_per_expert.size()) == e)
      << "EndOfStep: statistics of " << stats.tokens_per_expert.size() << " experts, the layer has "
      << e;
  // The global aux loss's f: the whole world's counts of this step, for the next.
  if (updated && config_.aux_loss_scope == AuxLossScope::kGlobal) {
    UpdateExpertLoad(stats.tokens_per_expert, ctx);
  }
  // Hot-expert replication: the owners' weights changed; maybe a new plan.
  if (config_.replicate_hot_experts > 0) {
    MarkExpertsUpdated();
    if (replica_plan != nullptr) SetReplicaPlan(*replica_plan, ctx);
  }
  // Aux-loss-free balancing (DeepSeek-V3): the bias follows the whole world's counts.
  if (updated && config_.expert_bias_rate > 0) {
    if (config_.expert_bias_update == ExpertBiasUpdate::kProportional) {
      UpdateExpertBiasProportional(expert_bias_, stats.tokens_per_expert, config_.expert_bias_rate,
                                   ctx);
    } else {
      UpdateExpertBias(expert_bias_, stats.tokens_per_expert, config_.expert_bias_rate, ctx);
    }
  }
}

}  // namespace switchyard::moe
