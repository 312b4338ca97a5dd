// Hot-expert replication (moe.replicate_hot_experts): the busiest experts get copies on
// the least loaded ranks of their ep group, and their tokens are split between the copies.
//
// The plan (ReplicaPlan::Balance) is a pure function of the per-expert token counts of the
// last moe.replicate_every steps, summed over the whole world, so every rank computes the
// same plan. Rank r owns experts [r * E_l, +E_l); its load is the sum of their counts. For
// each of the N hottest experts (count descending, ties by the smaller index) the expert's
// count c is taken off its owner and poured onto the ranks by water-filling: with the ranks'
// loads sorted ascending (ties by rank), the level is the smallest lambda with
//   sum_r max(0, lambda - L_r) = c,
// and rank r takes max(0, lambda - L_r) of the expert's rows; every rank but the owner that
// takes a share gets a replica, unless the share is below 1/16 of the mean rank load (not
// worth a copy of the weights): the smallest such share's rank drops out (ties: the larger
// rank) and the rest are filled again, until every replica's share is worth it. The
// loads then include those shares, and the next expert is placed.
//
// The split of the rows is deterministic and independent of the layout: the assignment of
// global token t, slot j draws key(t, j) = splitmix64(t * k + j) mod Q (Q = 2^16) and goes
// to the copy whose quota interval holds it; copy i's interval is [upto_{i-1}, upto_i),
// upto_i = round(Q * (shares of copies 0..i) / c), the owner first, then the replicas by
// increasing rank.
//
// Dispatch: each rank holds E_l owned experts and S replica slots (S: the most any rank
// holds; unused slots receive no rows). An assignment goes to a "local slot" of the virtual
// layout of ep * (E_l + S) experts: rank r's slots [r * (E_l + S), +E_l + S), its own experts
// first, then its replica slots. So the dispatcher (moe/dispatcher.h) runs unchanged on the
// virtual expert ids (ReplicaDestinations), and each rank's grouped rows are its own
// experts' rows followed by its replicas' rows.
//
// Weights and gradients (ExpertReplicas): each replica slot holds a copy of its expert's
// weights, pulled from the owner by point-to-point messages inside the ep group whenever the
// plan changes or the owner's weights were updated. After each backward the replicas'
// weight gradients travel back to the owner, which adds them to its own in the copies'
// order (a fixed order on every rank), and the replica gradients are cleared. So the
// optimizer, the gradient sync, ZeRO and checkpoints only ever see the owners' parameters:
// checkpoints hold no replica.
//
// What is equal to the unreplicated run: every row's expert output and input gradient is
// computed from the same weights by the same row-wise kernels, so y, dh and the router's
// gradient are those of the unreplicated layer within the matrix products' per-row bounds
// (bit for bit where the GEMM's result for a row does not depend on the rows around it);
// an expert's weight gradient is the same sum of per-row terms split into partial sums,
// within gamma_R |terms| of the unreplicated sum (R rows; tests/testing/tolerance.h).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "moe/experts.h"

namespace switchyard::moe {

// Keys of the row split are drawn from [0, kReplicaQuota).
inline constexpr int32_t kReplicaQuota = 1 << 16;

// The split key of the assignment (global token `token`, slot `slot` of top_k).
int32_t ReplicaKey(int64_t token, int64_t slot, int64_t top_k);

// One copy of a replicated expert.
struct ExpertCopy {
  int rank = 0;       // the ep rank that runs it
  int64_t slot = -1;  // -1: the owner's own expert; else the replica slot on `rank`
  int32_t upto = 0;   // keys in [previous copy's upto, upto) run here
  double share = 0;   // the rows of the planning counts it was given (for reports)
};

struct ReplicatedExpert {
  int64_t expert = 0;
  std::vector<ExpertCopy> copies;  // the owner first, then the replicas by increasing rank
};

class ReplicaPlan {
 public:
  // No replication: every expert on its owner only.
  ReplicaPlan() = default;
  ReplicaPlan(int64_t num_experts, int64_t ep);

  // The plan for `counts` (E) over `ep` ranks with the `hot` most loaded experts replicated
  // (see the header comment). hot = 0 or ep = 1: no replica.
  static ReplicaPlan Balance(std::span<const int64_t> counts, int64_t ep, int64_t hot);

  bool empty() const { return experts_.empty(); }
  int64_t num_experts() const { return num_experts_; }
  int64_t ep() const { return ep_; }
  int64_t experts_per_rank() const { return num_experts_ / ep_; }  // E_l
  int64_t slots() const { return slots_; }                          // S
  int64_t local_slots() const { return experts_per_rank() + slots_; }
  int64_t virtual_experts() const { return ep_ * local_slots(); }
  const std::vector<ReplicatedExpert>& replicated() const { return experts_; }

  // The virtual expert (the dispatch destination) of an assignment of `expert` with split
  // key `key` (ReplicaKey).
  int32_t Destination(int64_t expert, int32_t key) const;
  // The expert held by replica slot `slot` of ep rank `rank`, or -1 when unused.
  int64_t ExpertInSlot(int rank, int64_t slot) const;
  // (ep) rows each rank's experts and replicas receive when expert e gets counts[e] rows
  // split exactly by the shares (the loads the plan aims at).
  std::vector<double> PlannedLoads(std::span<const int64_t> counts) const;
  // "e3 -> r0 (0.50) r5 (0.25) r6 (0.25); ..." or "none".
  std::string ToString() const;

  bool operator==(const ReplicaPlan& o) const;

 private:
  int64_t num_experts_ = 0, ep_ = 1, slots_ = 0;
  std::vector<ReplicatedExpert> experts_;
  std::vector<int32_t> entry_of_;  // (E) index into experts_, or -1
};

// The dispatch destinations of this rank's assignments: experts (N, k) i32 (global expert
// ids, on the CPU or a device) -> (N, k) i32 virtual experts on the same device, for rows
// whose global tokens are row_tokens (N). A device tensor makes one round trip to the host.
Tensor ReplicaDestinations(const ReplicaPlan& plan, const Tensor& experts,
                           std::span<const int64_t> row_tokens, DeviceContext* ctx = nullptr);

// When to plan: sums every MoE layer's per-expert counts (the world's, one step at a
// time) over moe.replicate_every steps, then plans each layer from its sums and starts a
// new window. A trainer on every rank feeds it the same numbers, so the plans agree.
class ReplicaPlanner {
 public:
  // hot: moe.replicate_hot_experts; every: moe.replicate_every; ep: the ep group's size.
  ReplicaPlanner(int64_t hot, int64_t every, int64_t ep);
  // One step's counts, (layers) x (E). Every `every`-th call returns one plan per layer
  // (from the window's sums); the other calls return an empty vector.
  std::vector<ReplicaPlan> AddStep(const std::vector<std::vector<int64_t>>& counts);

 private:
  int64_t hot_, every_, ep_, steps_ = 0;
  std::vector<std::vector<int64_t>> window_;
};

// The replica slots of one rank: weights pulled from the owners, gradients pushed back.
class ExpertReplicas {
 public:
  // Slots for `plan` on ep rank `rank`, shaped like `owned` (the rank's own experts; no
  // hidden split). Values and gradients start at zero.
  ExpertReplicas(const ReplicaPlan& plan, int rank, const ExpertsOptions& owned,
                 DeviceContext* ctx = nullptr);

  // Copies every replicated expert's parameters from its owner into its replica slots.
  // Collective over ep (every rank of it calls, with the same plan).
  void PullWeights(const Experts& owned, dist::Communicator& ep, DeviceContext* ctx = nullptr);
  // Sends every replica slot's gradients to the expert's owner, which adds them into
  // `owned`'s gradients in the plan's copy order; clears the replica gradients.
  // Collective over ep.
  void PushGradients(Experts& owned, dist::Communicator& ep, DeviceContext* ctx = nullptr);

  // The slots as experts (S local experts; slot s holds plan.ExpertInSlot(rank, s)).
  Experts& experts() { return experts_; }
  const Experts& experts() const { return experts_; }

 private:
  ReplicaPlan plan_;
  int rank_;
  Experts experts_;
};

}  // namespace switchyard::moe
