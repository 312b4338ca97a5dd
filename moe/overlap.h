// All-to-all / compute overlap of the MoE layer (moe.overlap_chunks; docs/moe-layer.md
// "Overlap"). The path of dispatcher.h,
//   rows (A, d) -> ExchangeRows -> Regroup -> experts -> Ungroup -> ReturnRows -> (A, d),
// run in C chunks so that chunk c + 1's rows travel while chunk c's experts compute, and
// chunk c's results travel back while chunk c + 1's compute.
//
// What a chunk is: each ep rank's E_l local experts are cut into C contiguous runs of
// whole experts, chunk c holding local experts [c E_l / C, (c + 1) E_l / C) on every ep
// rank. Chunk c carries every row any rank sends to those experts, so the chunks partition
// the kept assignments after admission (capacity is decided for the whole routing group
// before any chunk exists). Its exchange is one all_to_all_v over ep; its received rows,
// regrouped expert-major, are exactly the rows the unchunked Regroup gives those experts,
// in the same order (by source rank, then expert order on the source).
//
// Why the bits are those of one chunk: every expert's rows reach its GEMMs as one block, in
// the unchunked order, with the unchunked grouped-GEMM schedule (kernels/gemm.h
// GroupSchedule, passed by the caller), so every output row and every weight-gradient sum
// is computed by the same arithmetic on the same operands; the exchanges and regroupings
// only copy rows. Everything outside (permute, combine, scatter-add, the shared experts)
// runs on the whole (A, d) or (N, d) tensors as without chunks.
//
// The exchanges run on a dist::CommThread (engine/dist/comm_thread.h), which makes them
// progress during the GEMMs on the CPU; their time in flight and the time waited for them
// go to the recording profiler (engine/core/profile.h) when the group has several ranks.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/profile.h"
#include "engine/core/tensor.h"
#include "engine/dist/comm_thread.h"
#include "moe/dispatcher.h"

namespace switchyard::moe {

// The chunks of one dispatch plan: who sends what to whom in each, and the row orders.
class ChunkedExchange {
 public:
  // plan: after ExchangeCounts; 1 <= chunks <= plan.experts_per_rank(). The index tensors
  // live on the plan's device (ctx required on CUDA).
  ChunkedExchange(const DispatchPlan& plan, int64_t chunks, DeviceContext* ctx = nullptr);

  int64_t chunks() const { return static_cast<int64_t>(chunks_.size()); }
  // Local experts [first, end) of chunk c.
  int64_t first_expert(int64_t c) const { return chunks_[c].first; }
  int64_t end_expert(int64_t c) const { return chunks_[c].end; }
  // (E_l) rows each local expert receives in chunk c: the plan's for the chunk's experts,
  // zero for the others. Chunk c's grouped rows are R_c = their sum.
  const std::vector<int64_t>& rows_per_local_expert(int64_t c) const {
    return chunks_[c].rows_per_local_expert;
  }

  // What runs on chunk c's rows: grouped (R_c, d), expert-major as Regroup orders them ->
  // (R_c, d) in the same order.
  using Compute = std::function<Tensor(int64_t c, const Tensor& grouped)>;

  // rows (A, d) in expert order (Permute's, or CombineBackward's dout) -> (A, d) in expert
  // order: what ReturnRows(Ungroup(f(Regroup(ExchangeRows(rows))))) returns when f runs
  // `compute` on each chunk's rows. `meanwhile` runs once every chunk's exchange has been
  // posted, before the first is waited for (the shared experts). Collective over comm's
  // group, which must be the plan's ep group. The profile charges the outbound exchange to
  // `there`, the computing and `meanwhile` to experts, the return to `back` (forward:
  // dispatch / combine; backward the other way round).
  Tensor Run(const Tensor& rows, dist::CommThread& comm, const Compute& compute,
             const std::function<void()>& meanwhile, DeviceContext* ctx = nullptr,
             Phase there = Phase::kDispatch, Phase back = Phase::kCombine) const;

 private:
  struct Chunk {
    int64_t first = 0, end = 0;                 // local experts [first, end)
    std::vector<int64_t> rows_per_local_expert;  // (E_l)
    std::vector<int64_t> send_rows, recv_rows;   // (ep) the chunk's all_to_all_v counts
    int64_t send_offset = 0;                     // its rows in the chunk-major order
    int64_t sent = 0, received = 0;              // A_c, R_c
    Tensor regroup;                              // (R_c) i64: received row of each grouped row
    Tensor ungroup;                              // (R_c) i64: grouped row of each received row
  };

  int64_t ep_size_;
  int64_t num_assignments_;
  std::vector<Chunk> chunks_;
  Tensor to_chunk_major_;    // (A) i64: expert-order row of each chunk-major row
  Tensor from_chunk_major_;  // (A) i64: chunk-major row of each expert-order row
};

}  // namespace switchyard::moe
