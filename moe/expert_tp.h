// Expert tensor parallelism (Megatron-LM's expert_tensor_parallel_size, "MoE parallel
// folding"): each routed expert's hidden units are split over the etp group, so every etp
// rank runs every one of its local experts on a slice of the hidden dim and the experts'
// outputs are partial sums.
//
// After the ep exchange each rank holds rows grouped by local expert (the same local experts
// on every etp rank, different rows). Forward:
//   1. Gather:        every etp rank's rows on every etp rank (Communicator::AllGatherV,
//                     uneven counts, rank-major), regrouped expert-major: for each local
//                     expert the rows of etp rank 0, then rank 1, ... (the grouped GEMM needs
//                     each expert's rows contiguous)
//   2. the experts on this rank's hidden slice: partial outputs of every row
//   3. ReduceScatter: the rows back in rank-major order and Communicator::ReduceScatterV
//                     (sum): each rank gets the etp sum of its own rows' partial outputs
// Backward runs the same two collectives on the gradients: Gather the output gradient,
// the experts' backward, ReduceScatter the partial input gradients. Only etp rank 0 adds the
// output bias b2 (its gradient is summed over etp by the gradient sync).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "engine/dist/communicator.h"

namespace switchyard::moe {

// Who sends what for one forward (kept for the backward).
struct EtpPlan {
  std::vector<int64_t> rows_of_rank;       // (etp) rows each etp rank holds
  std::vector<int64_t> rows_per_expert;    // (L) rows of every etp rank, per local expert
  Tensor to_expert_major;                  // (R_all) i64: gathered row index of each row
                                           // of the expert-major order
  Tensor to_rank_major;                    // (R_all) i64: the inverse
};

// rows_per_local_expert: this rank's rows of each of its L local experts. Collective over
// etp (the counts are all-gathered).
EtpPlan MakeEtpPlan(std::span<const int64_t> rows_per_local_expert, dist::Communicator& etp,
                    Device device, DeviceContext* ctx);

// x (R, d), this rank's rows -> (R_all, d) every etp rank's rows, expert-major.
Tensor EtpGather(const Tensor& x, const EtpPlan& plan, dist::Communicator& etp,
                 DeviceContext* ctx);

// y (R_all, d) partial sums, expert-major -> (R, d): this rank's rows, summed over etp.
Tensor EtpReduceScatter(const Tensor& y, const EtpPlan& plan, dist::Communicator& etp,
                        DeviceContext* ctx);

}  // namespace switchyard::moe
