// The token dispatcher over the expert-parallel group, as separate phases (Megatron-Core's
// pre / communicate / post split), each with its backward:
//
//   dispatch:  Permute       h (N, d)          -> rows (A, d)        sorted by global expert
//              ExchangeCounts                     per-expert counts, all_to_all over ep
//              ExchangeRows  rows (A, d)        -> recv (R, d)       all_to_all_v over ep,
//                                                                    ordered (source, expert)
//              Regroup       recv (R, d)        -> grouped (R, d)    ordered (expert, source)
//   experts:   grouped (R, d) -> out (R, d), rows_per_local_expert() rows per local expert
//   combine:   Ungroup       out (R, d)         -> (R, d)            back to (source, expert)
//              ReturnRows    (R, d)             -> (A, d)            all_to_all_v back
//              Combine       (A, d), gates      -> y (N, d)          gate-weighted sum
//
// N local tokens (all routing groups of this rank), A kept assignments on this rank, R rows
// received by this rank's experts. Global expert e lives on ep rank e / E_l as local expert
// e % E_l (E_l = E / ep). Backward of each phase is its mirror: Permute <-> ScatterAdd,
// ExchangeRows <-> ReturnRows, Regroup <-> Ungroup, Combine -> CombineBackward.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::moe {

// Who goes where; built from the kept assignments, completed by ExchangeCounts.
class DispatchPlan {
 public:
  // experts: (N, k) global expert of every assignment; kept: (N, k) 1 to dispatch, 0 for
  // a dropped assignment. Assignments are ordered by expert, then token, then slot.
  DispatchPlan(const std::vector<int32_t>& experts, const std::vector<uint8_t>& kept,
               int64_t num_tokens, int64_t top_k, int64_t num_experts, int64_t ep_size);

  int64_t num_tokens() const { return num_tokens_; }
  int64_t top_k() const { return top_k_; }
  int64_t num_experts() const { return num_experts_; }
  int64_t ep_size() const { return ep_size_; }
  int64_t experts_per_rank() const { return num_experts_ / ep_size_; }
  // A: assignments this rank dispatches.
  int64_t num_assignments() const { return static_cast<int64_t>(token_.size()); }
  // For permuted row a: its token (row of h) and its flat slot t * k + j (row of gates).
  const std::vector<int64_t>& token() const { return token_; }
  const std::vector<int64_t>& slot() const { return slot_; }
  // (E) rows this rank sends to each global expert.
  const std::vector<int64_t>& send_per_expert() const { return send_per_expert_; }
  // (ep) rows this rank sends to each ep rank.
  const std::vector<int64_t>& send_rows() const { return send_rows_; }

  // Filled by ExchangeCounts: (ep, E_l) rows from each source rank for each local expert;
  // (ep) rows from each source; (E_l) rows per local expert; R.
  bool exchanged() const { return exchanged_; }
  const std::vector<int64_t>& recv_per_source_expert() const { return recv_per_source_expert_; }
  const std::vector<int64_t>& recv_rows() const { return recv_rows_; }
  const std::vector<int64_t>& rows_per_local_expert() const { return rows_per_local_expert_; }
  int64_t num_received() const { return num_received_; }

  // Phase 2: all_to_all of the per-expert counts over the ep group.
  void ExchangeCounts(dist::Communicator& ep);

 private:
  int64_t num_tokens_, top_k_, num_experts_, ep_size_;
  std::vector<int64_t> token_, slot_, send_per_expert_, send_rows_;
  bool exchanged_ = false;
  std::vector<int64_t> recv_per_source_expert_, recv_rows_, rows_per_local_expert_;
  int64_t num_received_ = 0;
};

// Phase 1. rows[a] = h[plan.token()[a]]; h: (N, d) -> (A, d).
Tensor Permute(const Tensor& h, const DispatchPlan& plan);
// Backward of Permute: dh[plan.token()[a]] += drows[a]; drows: (A, d), dh: (N, d).
void ScatterAdd(const Tensor& drows, const DispatchPlan& plan, Tensor& dh);

// Phase 3. (A, d) in expert order -> (R, d) ordered by (source rank, local expert).
Tensor ExchangeRows(const Tensor& rows, const DispatchPlan& plan, dist::Communicator& ep);
// The reverse exchange: (R, d) ordered by (source, local expert) -> (A, d) in expert order.
Tensor ReturnRows(const Tensor& rows, const DispatchPlan& plan, dist::Communicator& ep);

// Phase 4. (source, local expert) order -> (local expert, source) order, so each local
// expert's rows are contiguous (rows_per_local_expert() of them).
Tensor Regroup(const Tensor& recv, const DispatchPlan& plan);
// The inverse permutation of Regroup.
Tensor Ungroup(const Tensor& grouped, const DispatchPlan& plan);

// y (N, d) = sum over a of gates[slot[a]] * out[a] (rows: (A, d) in expert order; gates:
// (N, k) f32). Tokens with no kept assignment get zero.
Tensor Combine(const Tensor& out, const Tensor& gates, const DispatchPlan& plan);
// Backward of Combine: dout[a] = gates[slot[a]] * dy[token[a]] and
// dgates[slot[a]] = dot(dy[token[a]], out[a]) (zero for dropped slots).
void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates,
                     const DispatchPlan& plan, Tensor& dout, Tensor& dgates);

}  // namespace switchyard::moe
