// Expert capacity and admission for one routing group (../shared/MODEL.md section 2), as
// pure functions over the router's choices.
//
// Capacity: C = ceil(cf * T * k / E) (T*k/E tokens per expert when perfectly balanced,
// times the capacity factor; Switch Transformer arXiv 2101.03961 eq. 3, GShard). The caller
// picks cf: capacity_factor in training, eval_capacity_factor outside it. cf <= 0 means
// dropless.
//
// Admission: each expert takes at most C of the (token, slot) assignments that reach it, in
// priority order; the rest are dropped.
//   position     all first choices in token order, then all second choices, ... (GShard)
//   probability  decreasing gate value, ties by token then slot (batch-prioritised routing,
//                Riquelme et al. 2021, arXiv 2106.05974)
// Assignments removed earlier (the router's `keep` = 0, GShard's random second choice)
// never take a slot, and are not counted before or after.
//
// Groups split over ranks (MODEL.md section 4). Under `position`, an assignment (t, j) to
// expert e is kept iff its rank among e's assignments in priority order is < C, and that
// rank is (assignments to e in slots < j over the whole group) + (assignments to e in slot
// j from earlier tokens). So a rank holding a later piece of the group's tokens admits its
// piece alone given priority offsets (k, E):
//   offsets[j][e] = sum_{j' < j} total[j'][e] + exclusive_prefix[j][e]
// where total is the group's SlotExpertCounts (all-reduce over the pieces) and
// exclusive_prefix is that of the earlier pieces (exclusive scan in token order); see
// PositionOffsets. The result equals admitting the whole group at once. `probability`
// needs every gate of the group: gather the group first (offsets are rejected for it).
//
// Devices: the tensors of a call are on the CPU or all on ctx's CUDA device (ctx required
// for CUDA tensors); Admission's kept/position are allocated on that device. Offsets and
// the host results (Admission's counts/dropped/removed, SlotExpertCounts) are host values:
// on CUDA they are computed on the device and copied back with one small device->host
// copy (which synchronises ctx's stream).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/step_readback.h"
#include "engine/core/tensor.h"
#include "moe/moe_config.h"

namespace switchyard::moe {

// ExpertCapacity's answer for cf <= 0: no limit.
inline constexpr int64_t kDropless = -1;

// C = ceil(cf * T * k / E), or kDropless when cf <= 0. Computed in double as
// cf * (T * k) / E; a result within a relative 1e-6 of an integer n is taken as exactly n
// before the ceil, because cf arrives as a float (1.1f is 1.10000002...) and the intended
// decimal value times T*k/E can be an integer (1.1 * 10 / 11 = 1, not 2). T = 0 gives 0;
// C is capped at T * k.
int64_t ExpertCapacity(double capacity_factor, int64_t tokens, int64_t top_k, int64_t num_experts);

// The admission of one group (or of one piece of it, under offsets).
struct Admission {
  Tensor kept;                         // (T, k) u8: 1 iff the assignment reaches its expert
  Tensor position;                     // (T, k) i64: the assignment's rank among its
                                       // expert's kept assignments in priority order (the
                                       // offsets included); -1 when not kept
  std::vector<int64_t> counts_before;  // (E) assignments that competed (keep = 1)
  std::vector<int64_t> counts_after;   // (E) assignments admitted
  // Dropless admission of balance sums still on the device (a training step): the two
  // count vectors are empty and both are the step's readback slots [counts_slot, + E).
  int64_t counts_slot = -1;
  // Capacity admission in a training step (AdmitToCapacityInto): counts_after, dropped and
  // removed are not on the host; the admitted counts are the step's readback slots
  // [kept_slot, + E), slot kept_slot + E the out-of-range count (0). counts_before are the
  // balance sums' (its counts_slot).
  int64_t kept_slot = -1;
  int64_t dropped = 0;                 // sum(counts_before) - sum(counts_after)
  int64_t removed = 0;                 // assignments with keep = 0 (never competed)
};

// Admits the assignments of indices (T, k) i32 with gates (T, k) f32 (used by
// `probability` only; may be undefined for `position`). keep (T, k) u8, or undefined for
// all ones. capacity: C, or kDropless (anything < 0). offsets: empty, or (k * E) priority
// offsets from PositionOffsets for a later piece of a split group (`position` only).
Admission AdmitToCapacity(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                          int64_t num_experts, int64_t capacity, DropPolicy policy,
                          std::span<const int64_t> offsets = {}, DeviceContext* ctx = nullptr);

// AdmitToCapacity of a whole group in a training step, its counts left on the device for
// the step's readback (no wait): kept and position as AdmitToCapacity's; kept_slot set, the
// host counts empty (see Admission).
Admission AdmitToCapacityInto(const Tensor& indices, const Tensor& gates, const Tensor& keep,
                              int64_t num_experts, int64_t capacity, DropPolicy policy,
                              StepReadback& readback, DeviceContext* ctx);

// (k * E) counts of assignments with keep = 1, by slot j and expert e (index j * E + e).
std::vector<int64_t> SlotExpertCounts(const Tensor& indices, const Tensor& keep,
                                      int64_t num_experts, DeviceContext* ctx = nullptr);

// (k * E) priority offsets of a piece: exclusive_prefix[j][e] + sum_{j' < j} total[j'][e],
// both (k * E) SlotExpertCounts sums (of the earlier pieces, and of the whole group).
std::vector<int64_t> PositionOffsets(std::span<const int64_t> exclusive_prefix,
                                     std::span<const int64_t> total, int64_t top_k,
                                     int64_t num_experts);

}  // namespace switchyard::moe
