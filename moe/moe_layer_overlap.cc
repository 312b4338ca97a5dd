// The MoE layer's dispatch -> experts -> combine in moe.overlap_chunks chunks (moe/overlap.h,
// docs/moe-layer.md "Overlap"), forward and backward: the same phases as moe_layer.cc's
// Dispatch / RunExperts / CombineOutputs and their mirrors, with each chunk's exchange in
// flight while another chunk's experts (or the shared experts) compute.
#include "kernels/gemm.h"
#include "moe/moe_layer.h"

namespace switchyard::moe {
namespace {

// The grouped-GEMM schedule of one call over all the chunks' rows: every chunk runs its
// experts under it, so each expert gets the bits of the unchunked call (kernels/gemm.h).
kernels::GroupSchedule ScheduleOfAll(const std::vector<std::vector<int64_t>>& rows_of_chunks) {
  std::vector<int64_t> all(rows_of_chunks.front().size(), 0);
  for (const std::vector<int64_t>& rows : rows_of_chunks)
    for (size_t e = 0; e < rows.size(); ++e) all[e] += rows[e];
  return kernels::GroupScheduleFor(all);
}

}  // namespace

Tensor MoELayer::ForwardOverlapped(const Tensor& h, MoEActivations& acts, DeviceContext* ctx) {
  std::optional<ScopedPhase> phase(Phase::kDispatch);
  acts.plan = std::make_unique<DispatchPlan>(DispatchPlan::Build(
      acts.experts_all, acts.kept_all, config_.num_experts, ep_->size(), ctx));
  DispatchPlan& plan = *acts.plan;
  plan.ExchangeCounts(*ep_, ctx);
  acts.chunks = std::make_unique<ChunkedExchange>(plan, config_.overlap_chunks, ctx);
  const ChunkedExchange& chunks = *acts.chunks;
  const int64_t n = chunks.chunks();
  // The rows each expert computes on, per chunk: this rank's, or under etp every etp rank's
  // (the etp plans' count all-gathers run now, before any exchange is in flight).
  std::vector<std::vector<int64_t>> expert_rows(n);
  for (int64_t c = 0; c < n; ++c) {
    if (etp_) {
      acts.chunk_etp.push_back(
          MakeEtpPlan(chunks.rows_per_local_expert(c), *etp_, device(), ctx));
      expert_rows[c] = acts.chunk_etp.back().rows_per_expert;
    } else {
      expert_rows[c] = chunks.rows_per_local_expert(c);
    }
  }
  const kernels::GroupSchedule schedule = ScheduleOfAll(expert_rows);
  acts.chunk_experts.resize(n);
  auto compute = [&](int64_t c, const Tensor& grouped) -> Tensor {
    if (!etp_) {
      acts.chunk_experts[c] = experts_.Forward(grouped, expert_rows[c], ctx, schedule);
      return acts.chunk_experts[c].y;
    }
    const EtpPlan& etp = acts.chunk_etp[c];
    acts.chunk_experts[c] =
        experts_.Forward(EtpGather(grouped, etp, *etp_, ctx), expert_rows[c], ctx, schedule);
    return EtpReduceScatter(acts.chunk_experts[c].y, etp, *etp_, ctx);
  };
  // The shared experts compute while the first chunks' rows travel.
  auto shared = [&] {
    if (shared_) acts.shared = shared_->Forward(h, ctx);
  };
  acts.expert_out = chunks.Run(Permute(h, plan, ctx), *comm_thread_, compute, shared,
                               ctx, Phase::kDispatch, Phase::kCombine);
  phase.emplace(Phase::kCombine);
  return CombineAndKeep(acts, ctx);
}

Tensor MoELayer::BackwardOverlapped(const MoEActivations& acts, const Tensor& dy, Tensor& dgates,
                                    DeviceContext* ctx) {
  const DispatchPlan& plan = *acts.plan;
  const int64_t n = plan.num_tokens(), d = config_.d_model;
  const Device dev = device();
  std::optional<ScopedPhase> phase(Phase::kCombine);
  Tensor dout = Tensor::Empty({plan.num_assignments(), d}, DType::kF32, dev);
  CombineBackward(dy, acts.expert_out, acts.gates, config_.routed_scaling_factor, plan, dout,
                  dgates, ctx);
  auto compute = [&](int64_t c, const Tensor& dgrouped) -> Tensor {
    if (!etp_) return experts_.Backward(acts.chunk_experts[c], dgrouped, ctx);
    const EtpPlan& etp = acts.chunk_etp[c];
    const Tensor dx =
        experts_.Backward(acts.chunk_experts[c], EtpGather(dgrouped, etp, *etp_, ctx), ctx);
    return EtpReduceScatter(dx, etp, *etp_, ctx);
  };
  // The shared experts' dx starts dh (a fresh tensor, computed while the first chunks'
  // gradients travel; else the scatter below writes dh whole).
  Tensor dh;
  auto shared = [&] {
    dh = shared_ ? shared_->Backward(*acts.shared, dy, ctx)
                 : Tensor::Empty({n, d}, DType::kF32, dev);
  };
  Tensor drows = acts.chunks->Run(dout, *comm_thread_, compute, shared, ctx,
                                  Phase::kCombine, Phase::kDispatch);
  phase.emplace(Phase::kDispatch);
  ScatterAdd(drows, plan, dh, shared_ ? kernels::Write::kAdd : kernels::Write::kSet, ctx);
  return dh;
}

}  // namespace switchyard::moe
