#include "moe/expert_tp.h"

#include "engine/core/check.h"
#include "moe/row_index.h"

namespace switchyard::moe {

EtpPlan MakeEtpPlan(std::span<const int64_t> rows_per_local_expert, dist::Communicator& etp,
                    Device device, DeviceContext* ctx) {
  const int n = etp.size();
  const int64_t l = static_cast<int64_t>(rows_per_local_expert.size());
  Tensor mine = Tensor::FromVector(
      std::vector<int64_t>(rows_per_local_expert.begin(), rows_per_local_expert.end()), {1, l});
  Tensor all = Tensor::Empty({n, l}, DType::kI64);
  // The counts are host values: a host communicator gathers them directly, a device one
  // through device memory.
  if (etp.device().is_cpu()) {
    etp.AllGather(mine, all);
    (void)all.ToHost("moe.etp_counts", ctx);  // a GPU run reads its gather back: one readback
  } else {
    Tensor on = Tensor::Empty({n, l}, DType::kI64, etp.device());
    etp.AllGather(mine.To(etp.device(), ctx), on);
    all = on.ToHost("moe.etp_counts", ctx);
  }
  const int64_t* c = all.data<int64_t>();
  EtpPlan plan;
  plan.rows_of_rank.assign(n, 0);
  plan.rows_per_expert.assign(l, 0);
  std::vector<int64_t> rank_start(n, 0);
  int64_t total = 0;
  for (int s = 0; s < n; ++s) {
    rank_start[s] = total;
    for (int64_t e = 0; e < l; ++e) {
      plan.rows_of_rank[s] += c[s * l + e];
      plan.rows_per_expert[e] += c[s * l + e];
    }
    total += plan.rows_of_rank[s];
  }
  std::vector<int64_t> to_em, to_rm(total);
  to_em.reserve(total);
  for (int64_t e = 0; e < l; ++e) {
    for (int s = 0; s < n; ++s) {
      int64_t at = rank_start[s];
      for (int64_t j = 0; j < e; ++j) at += c[s * l + j];
      for (int64_t i = 0; i < c[s * l + e]; ++i) {
        to_rm[at + i] = static_cast<int64_t>(to_em.size());
        to_em.push_back(at + i);
      }
    }
  }
  plan.to_expert_major = IndexOn(to_em, device, ctx);
  plan.to_rank_major = IndexOn(to_rm, device, ctx);
  return plan;
}

Tensor EtpGather(const Tensor& x, const EtpPlan& plan, dist::Communicator& etp,
                 DeviceContext* ctx) {
  SY_CHECK_EQ(x.dim(0), plan.rows_of_rank[etp.rank()]) << "EtpGather: rows of this rank";
  int64_t total = 0;
  for (int64_t c : plan.rows_of_rank) total += c;
  Tensor all = Tensor::Empty({total, x.dim(1)}, x.dtype(), x.device());  // rank-major
  etp.AllGatherV(x, all, plan.rows_of_rank);
  return RowsAt(all, plan.to_expert_major, ctx);
}

Tensor EtpReduceScatter(const Tensor& y, const EtpPlan& plan, dist::Communicator& etp,
                        DeviceContext* ctx) {
  Tensor rank_major = RowsAt(y, plan.to_rank_major, ctx);
  Tensor mine = Tensor::Empty({plan.rows_of_rank[etp.rank()], y.dim(1)}, y.dtype(), y.device());
  etp.ReduceScatterV(rank_major, mine, plan.rows_of_rank, dist::ReduceOp::kSum);
  return mine;
}

}  // namespace switchyard::moe
