// Route and admit for whole or tp-split routing groups (moe/group_routing.h).
#include "moe/group_routing.h"

#include "engine/core/check.h"

namespace switchyard::moe {

RoutedGroups RouteGroups(const Tensor& h, int64_t local_tokens, const Tensor& wr,
                         const Tensor& expert_bias, const MoEConfig& config, bool training,
                         const RouterRng& rng, dist::Communicator* tp, DeviceContext* ctx) {
  const int64_t n = h.dim(0), e = config.num_experts;
  SY_CHECK(local_tokens > 0 && n % local_tokens == 0)
      << "router input of " << n << " rows is not whole groups of " << local_tokens;
  RoutedGroups out;
  out.tp_size = tp != nullptr ? tp->size() : 1;
  out.tp_rank = tp != nullptr ? tp->rank() : 0;
  out.groups = n / local_tokens;
  out.top_k = config.top_k;
  out.device = h.device();
  out.group_tokens = local_tokens * out.tp_size;
  const int64_t t_whole = out.group_tokens;
  for (int64_t g = 0; g < out.groups; ++g) {
    Tensor hg = h.Slice(g * local_tokens, (g + 1) * local_tokens);  // (T/P, d)
    RouterRng group_rng = rng;
    group_rng.first_token = rng.first_token + g * t_whole;  // the group's first token
    RouterRng own_rng = group_rng;
    own_rng.first_token += out.own_begin();                 // this rank's first row
    RouterOutput r = RouterLogits(hg, wr, config, training, own_rng, ctx);
    if (out.tp_size > 1) {
      // The group's logits (T, E) in token order, the same bits on every tp rank.
      Tensor whole = Tensor::Empty({t_whole, e}, DType::kF32, h.device());
      tp->AllGather(r.logits, whole);
      r.logits = whole;
    }
    RouterChoose(r, expert_bias, config, group_rng, ctx);
    LoadBalanceSums lb = LoadBalanceSumsOf(r.probs, r.indices, ctx);
    out.aux.push_back(LoadBalancingLossFromSums(lb, config.top_k, config.aux_loss_coef));
    // coef 0 gives z = 0 without a pass over the logits (on CUDA, without a wait).
    out.z.push_back(config.z_loss_coef != 0.0f
                        ? ZLoss(r.logits, config.z_loss_coef, 0.0f, nullptr, 0, ctx)
                        : 0.0f);
    out.router.push_back(std::move(r));
    out.balance.push_back(std::move(lb));
  }
  return out;
}

void AdmitGroups(RoutedGroups& routed, double capacity_factor, const MoEConfig& config,
                 DeviceContext* ctx) {
  const int64_t e = config.num_experts;
  const int64_t capacity = ExpertCapacity(capacity_factor, routed.group_tokens, config.top_k, e);
  routed.admission.clear();
  for (const RouterOutput& r : routed.router) {
    routed.admission.push_back(AdmitToCapacity(r.indices, r.gates, r.keep, e, capacity,
                                               config.drop_policy, {}, ctx));
  }
}

OwnRouting OwnRowsOf(const RoutedGroups& routed, DeviceContext* ctx) {
  SY_CHECK_EQ(routed.admission.size(), routed.router.size()) << "OwnRowsOf before AdmitGroups";
  const int64_t t = routed.local_tokens(), n = routed.groups * t;
  const int64_t lo = routed.own_begin(), hi = lo + t;
  // One group whole on this rank: the routing's own tensors.
  if (routed.groups == 1 && routed.tp_size == 1) {
    return OwnRouting{routed.router[0].indices, routed.router[0].gates,
                      routed.admission[0].kept};
  }
  const int64_t k = routed.top_k;
  const Device dev = routed.device;
  OwnRouting out{Tensor::Empty({n, k}, DType::kI32, dev), Tensor::Empty({n, k}, DType::kF32, dev),
                 Tensor::Empty({n, k}, DType::kU8, dev)};
  for (int64_t g = 0; g < routed.groups; ++g) {
    const RouterOutput& r = routed.router[g];
    out.experts.Slice(g * t, (g + 1) * t).CopyFrom(r.indices.Slice(lo, hi), ctx);
    out.gates.Slice(g * t, (g + 1) * t).CopyFrom(r.gates.Slice(lo, hi), ctx);
    out.kept.Slice(g * t, (g + 1) * t).CopyFrom(routed.admission[g].kept.Slice(lo, hi), ctx);
  }
  return out;
}

void RouteGroupsBackward(std::span<const RouterOutput> router,
                         std::span<const LoadBalanceSums> balance, const Tensor& wr,
                         const MoEConfig& config, const Tensor& dgates,
                         std::span<const float> daux, std::span<const float> dz, int tp_rank,
                         Tensor& dh, Tensor& dwr, DeviceContext* ctx) {
  const int64_t groups = static_cast<int64_t>(router.size());
  SY_CHECK(static_cast<int64_t>(balance.size()) == groups &&
           static_cast<int64_t>(daux.size()) == groups && static_cast<int64_t>(dz.size()) == groups)
      << "router backward: " << groups << " groups, " << balance.size() << " balance sums, "
      << daux.size() << " daux, " << dz.size() << " dz";
  const Device dev = wr.device();
  const int64_t e = config.num_experts;
  for (int64_t g = 0; g < groups; ++g) {
    const RouterOutput& whole = router[g];
    const int64_t t = whole.input.dim(0), t_whole = whole.logits.dim(0);
    const int64_t lo = t_whole == t ? 0 : tp_rank * t, hi = lo + t;
    // This rank's rows of the group's routing (views).
    RouterOutput own = whole;
    if (t != t_whole) {
      own.logits = whole.logits.Slice(lo, hi);
      own.probs = whole.probs.Slice(lo, hi);
      own.indices = whole.indices.Slice(lo, hi);
      own.gates = whole.gates.Slice(lo, hi);
      own.keep = whole.keep.Slice(lo, hi);
    }
    // The aux and z terms of these rows, with the whole group's f and T.
    Tensor dprobs = Tensor::Zeros({t, e}, DType::kF32, dev, ctx);
    LoadBalancingLossBackward(balance[g], config.top_k, config.aux_loss_coef, daux[g], dprobs,
                              ctx);
    Tensor dlogits = Tensor::Zeros({t, e}, DType::kF32, dev, ctx);
    ZLossBackward(own.logits, config.z_loss_coef, dz[g], dlogits, t == t_whole ? 0 : t_whole,
                  ctx);
    Tensor dh_g = dh.Slice(g * t, (g + 1) * t);
    RouterBackward(own, wr, config, dgates.Slice(g * t, (g + 1) * t), dprobs, dlogits, dh_g, dwr,
                   ctx);
  }
}

}  // namespace switchyard::moe
