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
//
// Devices: a plan lives on the device of the routing it is built from (the host
// constructor: the CPU; DispatchPlan::Build: its tensors' device), and every phase runs on
// the rows' device, which must be the plan's; ctx is required for CUDA tensors. The row
// phases are kernels (kernels/permute.h). Building a plan copies the (E) per-expert counts
// to the host (one small device->host copy per plan on CUDA): the all_to_all_v splits and
// the host-sized grouped expert GEMMs need them there. A device-sized plan (ep = 1,
// dropless) keeps them on the device as offsets instead. With ep = 1 the exchanges do not touch the
// communicator (the rows are returned as they are, and Regroup / Ungroup are the
// identity); with ep > 1 the communicator must live on the rows' device (NCCL for CUDA
// rows, MPI for host rows).
#pragma once

#include <cstdint>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"
#include "kernels/write.h"

namespace switchyard::moe {

// Who goes where; built from the kept assignments, completed by ExchangeCounts.
class DispatchPlan {
 public:
  // experts: (N, k) global expert of every assignment; kept: (N, k) 1 to dispatch, 0 for
  // a dropped assignment. Assignments are ordered by expert, then token, then slot. A host
  // plan.
  DispatchPlan(const std::vector<int32_t>& experts, const std::vector<uint8_t>& kept,
               int64_t num_tokens, int64_t top_k, int64_t num_experts, int64_t ep_size);
  // The same from tensors on the CPU or on ctx's CUDA device: experts (N, k) i32, kept
  // (N, k) u8. The plan's tensors live on that device.
  static DispatchPlan Build(const Tensor& experts, const Tensor& kept, int64_t num_experts,
                            int64_t ep_size, DeviceContext* ctx = nullptr);

  // A plan whose per-expert counts stay on the device (ep = 1): the sort writes offsets()
  // instead of host counts (no readback, no wait), and the experts' grouped products read
  // them there (Experts::Forward with offsets). The host does not know A, so the plan
  // carries max_rows rows (a bound on A the caller knows: N * k, or the capacity's
  // G * E * C when smaller): the A kept assignments in expert order, then dropped ones,
  // which the phases tell apart by the inverse map (Combine skips them; CombineBackward
  // gives them no gradient; the experts' rows end at offsets[E]). num_assignments() is
  // max_rows; the host counts (send_per_expert(), rows_per_local_expert(), ...) are empty.
  // On the CPU A > max_rows is a fatal error (CUDA cannot check it without a wait), and the
  // host copies token() and slot() hold the A kept rows, as a host-sized plan's do (read
  // from the tensors when first asked for).
  static DispatchPlan BuildDeviceSized(const Tensor& experts, const Tensor& kept,
                                       int64_t num_experts, int64_t max_rows,
                                       DeviceContext* ctx = nullptr);
  bool device_sized() const { return offsets_.defined(); }
  // (E + 1) i64 on device(): expert e's rows are [offsets[e], offsets[e + 1]) (device-sized
  // plans only; undefined otherwise).
  const Tensor& offsets() const { return offsets_; }

  int64_t num_tokens() const { return num_tokens_; }
  int64_t top_k() const { return top_k_; }
  int64_t num_experts() const { return num_experts_; }
  int64_t ep_size() const { return ep_size_; }
  int64_t experts_per_rank() const { return num_experts_ / ep_size_; }
  // A: assignments this rank dispatches.
  int64_t num_assignments() const { return token_tensor_.numel(); }
  // Where the plan's tensors live.
  Device device() const { return inverse_.device(); }
  // For permuted row a: its token (row of h) and its flat slot t * k + j (row of gates).
  // Host copies, for a host plan only (fatal on a CUDA plan: use the tensors below).
  const std::vector<int64_t>& token() const;
  const std::vector<int64_t>& slot() const;
  // The same as (A) i64 tensors on device(), and the inverse map (N, k) i64: for every
  // slot its permuted row a, or -1 when dropped.
  const Tensor& token_tensor() const { return token_tensor_; }
  const Tensor& slot_tensor() const { return slot_tensor_; }
  const Tensor& inverse() const { return inverse_; }
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
  // The rows the experts process: num_received(), or a device-sized plan's offsets[E] (its
  // num_received() is the bound it carries), read on the host: fatal for a device-sized
  // plan on CUDA, where it would be a wait (tests, benchmarks and tools on the CPU).
  int64_t received_rows() const;

  // Phase 2: all_to_all of the per-expert counts over the ep group (none for ep = 1). A
  // communicator on a CUDA device exchanges them through device memory, ordered on ctx.
  void ExchangeCounts(dist::Communicator& ep, DeviceContext* ctx = nullptr);

 private:
  DispatchPlan(int64_t num_tokens, int64_t top_k, int64_t num_experts, int64_t ep_size);
  // Sorts experts (N, k) i32 / kept (N, k) u8 and fills everything but the exchange.
  void Init(const Tensor& experts, const Tensor& kept, DeviceContext* ctx);

  int64_t num_tokens_, top_k_, num_experts_, ep_size_;
  Tensor token_tensor_, slot_tensor_, inverse_, offsets_;
  // A device-sized plan fills token_ and slot_ on first use (ReadKeptRows).
  void ReadKeptRows() const;
  mutable std::vector<int64_t> token_, slot_;
  mutable bool kept_rows_read_ = false;
  std::vector<int64_t> send_per_expert_, send_rows_;
  bool exchanged_ = false;
  std::vector<int64_t> recv_per_source_expert_, recv_rows_, rows_per_local_expert_;
  int64_t num_received_ = 0;
};

// Phase 1. rows[a] = h[plan.token()[a]]; h: (N, d) -> (A, d), f32 or, with rows_dtype bf16,
// rounded to bf16 as gathered (the experts' operand under bf16 activation storage: the rows
// then travel, are regrouped and kept in bf16, which the expert products would read anyway;
// the exchanges and regroupings below keep their input's dtype).
Tensor Permute(const Tensor& h, const DispatchPlan& plan, DeviceContext* ctx = nullptr,
               DType rows_dtype = DType::kF32);
// Backward of Permute: dh[plan.token()[a]] += drows[a] (Write::kAdd), or dh[t] = the sum of
// token t's rows, not reading dh (Write::kSet: a fresh dh needs no zeroing); drows: (A, d),
// dh: (N, d). Deterministic on every device (per token, its rows in increasing a).
void ScatterAdd(const Tensor& drows, const DispatchPlan& plan, Tensor& dh, kernels::Write write,
                DeviceContext* ctx = nullptr);

// Phase 3. (A, d) in expert order -> (R, d) ordered by (source rank, local expert).
// ep = 1: returns `rows` itself.
Tensor ExchangeRows(const Tensor& rows, const DispatchPlan& plan, dist::Communicator& ep,
                    DeviceContext* ctx = nullptr);
// The reverse exchange: (R, d) ordered by (source, local expert) -> (A, d) in expert order.
// ep = 1: returns `rows` itself.
Tensor ReturnRows(const Tensor& rows, const DispatchPlan& plan, dist::Communicator& ep,
                  DeviceContext* ctx = nullptr);

// Phase 4. (source, local expert) order -> (local expert, source) order, so each local
// expert's rows are contiguous (rows_per_local_expert() of them). ep = 1: returns `recv`.
Tensor Regroup(const Tensor& recv, const DispatchPlan& plan, DeviceContext* ctx = nullptr);
// The inverse permutation of Regroup. ep = 1: returns `grouped`.
Tensor Ungroup(const Tensor& grouped, const DispatchPlan& plan, DeviceContext* ctx = nullptr);

// y (N, d) = sum over a of g[slot[a]] * out[a] with g = f32(scale * gates) (rows: (A, d) in
// expert order; gates: (N, k) f32; scale: moe.routed_scaling_factor, 1 reads the gates as
// they are), plus `extra` (N, d) when defined (the shared experts' output, added last).
// Tokens with no kept assignment get zero (or extra). kept: null, or (A, d) bf16 that gets
// the kept rows of out rounded in the same pass (what backward reads under bf16 activation
// storage; kernels::Combine).
Tensor Combine(const Tensor& out, const Tensor& gates, float scale, const DispatchPlan& plan,
               const Tensor& extra = Tensor(), DeviceContext* ctx = nullptr,
               Tensor* kept = nullptr);
// Backward of Combine: dout[a] = g[slot[a]] * dy[token[a]] and
// dgates[slot[a]] = scale * dot(dy[token[a]], out[a]) (zero for dropped slots); out f32 or
// Combine's kept bf16 rows.
void CombineBackward(const Tensor& dy, const Tensor& out, const Tensor& gates, float scale,
                     const DispatchPlan& plan, Tensor& dout, Tensor& dgates,
                     DeviceContext* ctx = nullptr);

}  // namespace switchyard::moe
