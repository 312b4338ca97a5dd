// The statistics every MoE layer reports per step (../shared/MODEL.md section 3), as sums,
// so that adding (all-reducing) them over ranks gives the statistics of the whole
// data-parallel world whatever the layout.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/dist/communicator.h"

namespace switchyard::moe {

struct MoEStats {
  std::vector<int64_t> tokens_per_expert;          // (E) top-k assignments, before dropping
  std::vector<int64_t> tokens_per_expert_kept;     // (E) assignments the experts processed
  int64_t tokens = 0;                              // tokens routed
  int64_t assignments = 0;                         // tokens * k
  double entropy_sum = 0;                          // sum over tokens of -sum_e p log p
  double aux_sum = 0, z_sum = 0;                   // sums over groups
  int64_t groups = 0;

  // Adds another rank's (or group's) sums.
  void Add(const MoEStats& other);
  // Sums over the ranks of `comm` in place (every rank ends with the totals). A
  // communicator on a CUDA device reduces through device memory ordered on ctx.
  void AllReduce(dist::Communicator& comm, DeviceContext* ctx = nullptr);

  int64_t dropped() const;                          // assignments - kept
  double dropped_fraction() const;                  // dropped / assignments
  double router_entropy() const;                    // mean over tokens
  double aux_mean() const;                          // mean over groups
  double z_mean() const;
  // Rows received by each ep rank's experts: sum of kept counts of its experts. (ep)
  std::vector<int64_t> TokensPerEpRank(int64_t ep) const;
  // Least, most and mean kept load over the experts, as shares of all kept assignments.
  double min_load_share() const;
  double max_load_share() const;
  double mean_load_share() const;
};

}  // namespace switchyard::moe
