// The MoE layer's first two phases, route and admit, for G routing groups (docs/model.md,
// "The MoE layer"), whole on this rank or split over a tensor-parallel group.
//
// Whole groups (no tp): each group of T tokens is routed by RouterForward, its load-balancing
// sums, aux and z computed, and its assignments admitted to capacity (AdmitToCapacity), as
// on one rank.
//
// Groups split over tp (P ranks; the routing group stays whole, docs/model.md): tp rank
// r holds rows [r*T/P, (r+1)*T/P) of every group, and h (G * T/P, d) holds its rows of group
// 0, then of group 1, ... For each group:
//   1. this rank's router logits (T/P, E), the jitter keyed by the rows' global tokens
//   2. all-gather of the logits over tp: the group's (T, E), in token order, bit-identical
//      on every tp rank
//   3. the one-rank routing of the whole group from those logits, on every tp rank alike:
//      top-k (GShard's random second expert keyed by the global token), the load-balancing
//      sums, aux, z, and capacity admission under either drop policy
//   4. each rank keeps its own rows of the choices, gates and admission (OwnRowsOf) and
//      dispatches only those
// So the kept assignments, gates, aux and z are exactly those of one rank routing the whole
// group. Communication: one all-gather of (T/P, E) f32 per group in the forward, none in
// the backward.
//
// Backward (RouteGroupsBackward): every term of the router's loss is a sum over rows (the
// gates of a token; the aux loss's d/dprobs[t, i] = coef * E * f_i / T with the group's
// constant f and T; the z-loss's per-row term over the group's T), so each tp rank
// back-propagates its own rows only: into dh of its rows and into a PARTIAL router-weight
// gradient, which the gradient sync sums over tp (router.weight is described
// ReplicatedOver(kTp, grad_summed = true)).
//
// Groups whose tokens are not a contiguous block per rank (context parallelism's two chunks
// of every sequence per rank, engine/parallel/context_parallel.h): a
// GroupLayout lists, for every rank of the group communicator, the runs of consecutive
// group tokens its rows hold, in row order. The jitter is keyed by each row's global token,
// the gathered logits are put in token order (one row gather) before step 3, and step 4
// and the backward pick this rank's rows by index; everything else is as above. Ranks
// still hold T/P rows each.
//
// Devices: as the router's (moe/router.h): every tensor on the CPU or on ctx's CUDA device;
// admission counts and the losses are host values (one small device->host copy each),
// except in a training step (ctx's step readback open, engine/core/step_readback.h), where
// the group-scope balance sums, aux, z and dropless counts stay on the device until the
// step's one readback (RoutedGroups::aux and z are PendingSums then).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/pending_sum.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "moe/aux_loss.h"
#include "moe/capacity.h"
#include "moe/moe_config.h"
#include "moe/router.h"

namespace switchyard::moe {

// Where a routing group's T tokens live over the P ranks of its communicator: members[m]
// are rank m's runs, in its row order (each rank T/P rows). Empty: contiguous, rank m
// holds tokens [m*T/P, (m+1)*T/P).
struct GroupLayout {
  std::vector<std::vector<TokenRun>> members;
  bool contiguous() const { return members.empty(); }
};

// The routing of G whole groups as this rank sees it.
struct RoutedGroups {
  int64_t groups = 0;        // G
  int64_t group_tokens = 0;  // T: the whole group's tokens (P times this rank's rows)
  int64_t top_k = 1;         // k
  int tp_rank = 0, tp_size = 1;
  Device device = Device::Cpu();  // h's
  // (G) each whole group's routing: logits, probs (T, E), indices, gates, keep (T, k); under
  // tp, input (and its jitter draw) hold this rank's rows only (T/P, d).
  std::vector<RouterOutput> router;
  std::vector<LoadBalanceSums> balance;  // (G) the whole groups' sums (before dropping)
  std::vector<BalanceTerms> terms;       // (G) the whole groups' aux-loss terms (its scope)
  // (G) the whole groups' losses (f32 values), pending in a training step (the step's
  // readback, engine/core/step_readback.h)
  std::vector<PendingSum> aux, z;
  // (G) the mean over tokens of logsumexp(logits)^2 (z / coef, whatever the coefficient)
  std::vector<PendingSum> lse_sq;
  std::vector<Admission> admission;      // (G) the whole groups' admission (AdmitGroups)
  bool all_admitted = false;  // AdmitGroups kept every assignment without a pass (dropless)
  int64_t capacity = 0;       // AdmitGroups' C per expert and group (kDropless: none)
  // A non-contiguous GroupLayout only: own_rows (T/P) i64, the group token of each of this
  // rank's rows (on `device`); undefined for contiguous groups.
  Tensor own_rows;

  int64_t local_tokens() const { return group_tokens / tp_size; }  // T/P
  int64_t own_begin() const { return tp_rank * local_tokens(); }    // first own row of a group
};

// Phase 1, route. h: (G * T/P, d) f32, this rank's rows of each group in turn; local_tokens:
// T/P; wr (d, E); expert_bias (E) or undefined. rng.first_token: the global index of group
// 0's first token (the same on every tp rank); row i of this rank's piece of group g is
// token rng.first_token + g * T + tp_rank * T/P + i (or as `layout` says). tp: null or
// size 1 for whole groups. Collective over tp. expert_load: (E) f32 on h's device, the f of
// aux_loss_scope: global (MoELayer::expert_load); ignored by the other scopes. In a training
// step (ctx has a StepReadback) the loss terms stay on the device (BalanceTermsInto);
// otherwise they are read back.
RoutedGroups RouteGroups(const Tensor& h, int64_t local_tokens, const Tensor& wr,
                         const Tensor& expert_bias, const MoEConfig& config, bool training,
                         const RouterRng& rng, dist::Communicator* tp,
                         DeviceContext* ctx = nullptr, const GroupLayout& layout = {},
                         const Tensor& expert_load = {});

// Phase 2, admit: each whole group's assignments to C = ExpertCapacity(capacity_factor, T,
// k, E) per expert under config.drop_policy (fills routed.admission). Dropless routing
// without the random second choice admits everything without a pass over the assignments
// (and without a device readback); capacity admission reads its counts back once per group.
void AdmitGroups(RoutedGroups& routed, double capacity_factor, const MoEConfig& config,
                 DeviceContext* ctx = nullptr);

// This rank's rows of the routing, one group after the other: (G * T/P, k) each. What
// dispatch, combine and the router's backward see.
struct OwnRouting {
  Tensor experts;  // i32 chosen experts
  Tensor gates;    // f32 router gates (not masked)
  Tensor kept;     // u8 admitted by capacity (and not removed by the random policy)
};
OwnRouting OwnRowsOf(const RoutedGroups& routed, DeviceContext* ctx = nullptr);

// Backward of phases 1-2 for this rank's rows. router, terms: (G) as RouteGroups made
// them; dgates (G * T/P, k): dLoss/dgates of this rank's rows (zero where not kept); daux,
// dz (G). Adds into dh (G * T/P, d) and dwr (d, E) (this rank's part of the gradient).
// own_rows: RoutedGroups::own_rows (undefined: this rank's rows are the contiguous block
// of tp_rank).
void RouteGroupsBackward(std::span<const RouterOutput> router,
                         std::span<const BalanceTerms> terms, const Tensor& wr,
                         const MoEConfig& config, const Tensor& dgates,
                         std::span<const float> daux, std::span<const float> dz, int tp_rank,
                         Tensor& dh, Tensor& dwr, DeviceContext* ctx = nullptr,
                         const Tensor& own_rows = Tensor());

}  // namespace switchyard::moe
