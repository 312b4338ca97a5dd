// The statistics every MoE layer reports per step (../shared/MODEL.md section 3), as sums,
// so that adding (all-reducing) them over ranks gives the statistics of the whole
// data-parallel world whatever the layout; and the last phase of the layer's Forward that
// makes them from the routing (RoutingStats, GroupValuesOf).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/pending_sum.h"
#include "engine/dist/communicator.h"
#include "moe/group_routing.h"

namespace switchyard::moe {

// One rank's sums. Under tp a rank counts the rows it routed, and tp rank 0 alone the
// groups and their aux and z (see RoutingStats).
struct MoEStats {
  std::vector<int64_t> tokens_per_expert;          // (E) top-k assignments, before dropping
  std::vector<int64_t> tokens_per_expert_kept;     // (E) assignments the experts processed
  int64_t tokens = 0;                              // tokens routed
  int64_t assignments = 0;                         // tokens * k
  // In a training step the floating sums are PendingSums of the step's readback
  // (engine/core/step_readback.h), known once Resolve has run.
  PendingSum entropy_sum;                          // sum over tokens of -sum_e p log p
  PendingSum aux_sum, z_sum;                       // sums over groups
  PendingSum lse_sq_sum;  // sum over groups of the mean over tokens of logsumexp(logits)^2
  int64_t groups = 0;

  // Per-expert assignment counts of one group still in the step's readback (a training
  // step's dropless groups, moe/aux_loss.h LoadBalanceSumsInto): slots [first, + E) add to
  // tokens_per_expert, and to tokens_per_expert_kept too when `kept`; slot first + E is the
  // out-of-range count (0).
  // kept_first >= 0 (capacity admission in a training step): slots [kept_first, + E) add
  // to tokens_per_expert_kept instead, and slot kept_first + E is their out-of-range count.
  struct PendingCounts {
    int64_t first = 0;
    bool kept = false;
    int64_t kept_first = -1;
  };
  std::vector<PendingCounts> pending_counts;

  // Adds another rank's (or group's) sums.
  void Add(const MoEStats& other);
  // The pending sums and counts from the step's readback values.
  void Resolve(std::span<const double> slots);
  // Sums over the ranks of `comm` in place (every rank ends with the totals). A
  // communicator on a CUDA device reduces through device memory ordered on ctx.
  void AllReduce(dist::Communicator& comm, DeviceContext* ctx = nullptr);

  int64_t dropped() const;                          // assignments - kept
  double dropped_fraction() const;                  // dropped / assignments
  double router_entropy() const;                    // mean over tokens
  double aux_mean() const;                          // mean over groups
  double z_mean() const;
  // The router logits' size: the mean over groups of the mean over tokens of
  // logsumexp(logits)^2, z_mean() / moe.z_loss_coef but kept whatever the coefficient
  // (max_e l_e <= logsumexp(l) <= max_e l_e + ln E).
  double router_lse_sq() const;
  // Rows received by each ep rank's experts: sum of kept counts of its experts. (ep)
  std::vector<int64_t> TokensPerEpRank(int64_t ep) const;
  // Least, most and mean kept load over the experts, as shares of all kept assignments.
  double min_load_share() const;
  double max_load_share() const;
  double mean_load_share() const;
};

// Per-group values the layer reports (for `switchyard moe-layer` and tests): those of the
// WHOLE groups, identical on every tp rank.
// In a training step aux and z are pending and the counts are not filled (they are in the
// step's readback, engine/core/step_readback.h).
struct MoEGroupValues {
  std::vector<PendingSum> aux;                     // (G) aux of each group (f32 values)
  std::vector<PendingSum> z;                       // (G)
  std::vector<int64_t> tokens_per_expert_kept;     // (G, E) after dropping
  std::vector<int64_t> dropped;                    // (G) dropped assignments
};

// The statistics phase of one Forward. Tokens, assignments, per-expert counts (before and
// after dropping) and the entropy sum are those of this rank's own rows (`own`, OwnRowsOf's;
// the whole groups without tp); groups, aux_sum, z_sum and lse_sq_sum are counted on tp rank 0 only. So
// summing the statistics over tp x dp gives the one-rank numbers.
// valid_tokens >= 0: only the first valid_tokens of the G x T group tokens (group g's token
// i is number g * T + i) count in the token statistics (tokens, assignments, per-expert
// counts, entropy): the rest pad an evaluation's last micro-batches (data::Batch::padding,
// always the trailing rows). They are still routed, take capacity and count in aux_sum and
// z_sum. -1 (or >= G x T): every token.
MoEStats RoutingStats(const RoutedGroups& routed, const OwnRouting& own, int64_t num_experts,
                      DeviceContext* ctx = nullptr, int64_t valid_tokens = -1);

// The whole groups' aux, z, kept counts per expert and dropped assignments.
MoEGroupValues GroupValuesOf(const RoutedGroups& routed, int64_t top_k);

}  // namespace switchyard::moe
