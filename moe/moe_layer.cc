#include "moe/moe_layer.h"

#include <algorithm>
#include <string>

#include "kernels/permute.h"
#include "kernels/elementwise.h"
#include "kernels/random.h"

namespace switchyard::moe {

// ---- MoELayer ------------------------------------------------------------------------

namespace {

// ctx is required for work on a CUDA device, and must be that device's.
void CheckContext(Device device, DeviceContext* ctx, const char* what) {
  SY_CHECK(device.is_cpu() || (ctx != nullptr && ctx->device() == device))
      << what << ": the layer lives on " << device << " and needs that device's DeviceContext"
      << (ctx ? StrCat(", got one for ", ctx->device().ToString()) : std::string(", got none"));
}

}  // namespace

MoELayer::MoELayer(const MoEConfig& config, int64_t layer_id, const MoEParallel& parallel,
                   Tensor router_weight, Experts experts, std::optional<DenseMlp> shared,
                   Tensor expert_bias, DeviceContext* ctx)
    : config_(config),
      layer_id_(layer_id),
      ep_(parallel.ep),
      tp_(parallel.tp && parallel.tp->size() > 1 ? parallel.tp : nullptr),
      etp_(parallel.etp && parallel.etp->size() > 1 ? parallel.etp : nullptr),
      router_weight_(std::move(router_weight)),
      expert_bias_(std::move(expert_bias)),
      experts_(std::move(experts)),
      shared_(std::move(shared)) {
  SY_CHECK(ep_ != nullptr) << "MoELayer needs an ep communicator (a local one for ep = 1)";
  SY_CHECK_OK(config_.Validate());
  const int64_t per_rank = config_.ExpertsPerRank(ep_->size()).value();
  SY_CHECK(experts_.options().num_local == per_rank &&
           experts_.options().first == ep_->rank() * per_rank)
      << "experts [" << experts_.options().first << ", +" << experts_.options().num_local
      << ") do not match ep rank " << ep_->rank() << " of " << ep_->size();
  SY_CHECK(experts_.options().d_hidden * etp_size() == config_.d_expert)
      << "experts hold " << experts_.options().d_hidden << " hidden units, d_expert "
      << config_.d_expert << " over etp " << etp_size();
  SY_CHECK(router_weight_.shape() == (Shape{config_.d_model, config_.num_experts}))
      << "router weight " << ShapeString(router_weight_.shape());
  const Device dev = router_weight_.device();
  SY_CHECK(experts_.options().device == dev &&
           (!shared_ || shared_->experts().options().device == dev) &&
           (!expert_bias_.defined() || expert_bias_.device() == dev))
      << "MoE layer parameters on several devices: router weight on " << dev << ", experts on "
      << experts_.options().device
      << (shared_ ? StrCat(", shared experts on ", shared_->experts().options().device.ToString())
                  : std::string())
      << (expert_bias_.defined() ? StrCat(", expert bias on ", expert_bias_.device().ToString())
                                 : std::string());
  CheckContext(dev, ctx, "MoELayer");
  grad_router_weight_ = Tensor::Zeros(router_weight_.shape(), DType::kF32, dev, ctx);
  SY_CHECK(config_.num_shared_experts == 0 || shared_.has_value())
      << "the config asks for shared experts";
}

MoELayer MoELayer::Init(const MoEConfig& config, int64_t layer_id, const MoEParallel& parallel,
                        uint64_t seed, float std, DeviceContext* ctx) {
  const std::string name = StrCat("layers.", layer_id, ".moe");
  const Device dev = ctx != nullptr ? ctx->device() : Device::Cpu();
  dist::Communicator* ep = parallel.ep;
  const int64_t per_rank = config.ExpertsPerRank(ep->size()).value();
  Tensor wr = Tensor::Empty({config.d_model, config.num_experts}, DType::kF32, dev);
  kernels::FillNormal(wr, {seed, StreamId(name + ".router.weight")}, 0, 0.0f, std, ctx);
  ExpertsOptions eo = RoutedExpertsOptions(config, ep->rank() * per_rank, per_rank, dev);
  if (parallel.etp != nullptr && parallel.etp->size() > 1) {
    const int etp = parallel.etp->size();
    SY_CHECK(config.d_expert % etp == 0)
        << "parallel.etp=" << etp << " does not divide moe.d_expert=" << config.d_expert;
    eo.d_hidden = config.d_expert / etp;
    eo.hidden_offset = parallel.etp->rank() * eo.d_hidden;
    eo.hidden_total = config.d_expert;
    eo.adds_output_bias = parallel.etp->rank() == 0;
  }
  Experts experts = Experts::Init(eo, seed, name + ".experts", std, ctx);
  std::optional<DenseMlp> shared;
  if (config.num_shared_experts > 0) {
    shared.emplace(
        Experts::Init(SharedExpertsOptions(config, dev), seed, name + ".shared", std, ctx));
  }
  Tensor bias;
  if (config.expert_bias_rate > 0) {
    bias = Tensor::Zeros({config.num_experts}, DType::kF32, dev, ctx);
  }
  return MoELayer(config, layer_id, parallel, wr, std::move(experts), std::move(shared), bias,
                  ctx);
}

std::vector<parallel::Parameter> MoELayer::Parameters() const {
  using dist::Axis;
  std::vector<parallel::Parameter> out;
  // The router and the expert bias are whole on every tp rank; every tp rank computes the
  // router's whole gradient (it routes the whole group), so it is not summed over tp.
  parallel::Parameter router =
      parallel::Parameter::Dense("router.weight", router_weight_, grad_router_weight_, false);
  if (tp_) router.ReplicatedOver(Axis::kTp, /*grad_summed=*/false);
  out.push_back(std::move(router));
  for (parallel::Parameter& p : experts_.Parameters()) {
    p.name = "experts." + p.name;
    p.view = dist::View::kExpert;
    p.replicated = p.grad_sum = parallel::AxisSet{Axis::kDp};  // edp
    // Under etp the output bias is whole on every etp rank, added by etp rank 0.
    if (etp_ && p.name == "experts.b2") p.ReplicatedOver(Axis::kTp, /*grad_summed=*/true);
    out.push_back(std::move(p));
  }
  if (shared_) {
    for (parallel::Parameter& p : shared_->experts().Parameters()) {
      p.name = "shared." + p.name;
      // Each tp rank runs the shared experts on its own rows: partial gradients.
      if (tp_) p.ReplicatedOver(Axis::kTp, /*grad_summed=*/true);
      out.push_back(std::move(p));
    }
  }
  if (expert_bias_.defined()) {
    parallel::Parameter b =
        parallel::Parameter::Dense("expert_bias", expert_bias_, Tensor(), false);
    b.grad_sum = parallel::AxisSet();
    if (tp_) b.ReplicatedOver(Axis::kTp, false);
    out.push_back(std::move(b));
  }
  return out;
}

// ---- Forward phases ---------------------------------------------------------------------

Tensor MoELayer::GatherGroup(const Tensor& h, DeviceContext* ctx) const {
  if (!tp_) return h;
  Tensor all = Tensor::Empty({h.dim(0) * tp_->size(), h.dim(1)}, DType::kF32, h.device());
  tp_->AllGather(h, all);
  return all;
}

Tensor MoELayer::OwnRows(const Tensor& whole) const {
  if (!tp_) return whole;
  const int64_t per = whole.dim(0) / tp_->size();
  return whole.Slice(tp_rank() * per, (tp_rank() + 1) * per);
}

void MoELayer::Route(const Tensor& group_h, int64_t group_tokens, bool training, int64_t step,
                     int64_t first_token, MoEForward& out, DeviceContext* ctx) {
  const int64_t n = group_h.dim(0), e = config_.num_experts, k = config_.top_k;
  const int64_t groups = n / group_tokens;
  const double cf = training ? config_.capacity_factor : config_.eval_capacity_factor;
  const int64_t capacity = ExpertCapacity(cf, group_tokens, k, e);
  const Device dev = device();
  MoEActivations& acts = out.acts;
  acts.groups = groups;
  acts.group_tokens = group_tokens;
  // Every group's routing, side by side: (N, k) on the layer's device.
  acts.gates = Tensor::Empty({n, k}, DType::kF32, dev);
  acts.experts_all = Tensor::Empty({n, k}, DType::kI32, dev);
  acts.kept_all = Tensor::Empty({n, k}, DType::kU8, dev);
  out.stats.tokens_per_expert.assign(e, 0);
  out.stats.tokens_per_expert_kept.assign(e, 0);
  out.groups.tokens_per_expert_kept.assign(groups * e, 0);
  for (int64_t g = 0; g < groups; ++g) {
    const int64_t t0 = g * group_tokens;
    Tensor hg = group_h.Slice(t0, t0 + group_tokens);
    RouterRng rng{config_.seed, step, layer_id_, first_token + t0};
    RouterOutput r = RouterForward(hg, router_weight_, expert_bias_, config_, training, rng, ctx);
    Admission adm = AdmitToCapacity(r.indices, r.gates, r.keep, e, capacity, config_.drop_policy,
                                    {}, ctx);
    LoadBalanceSums lb = LoadBalanceSumsOf(r.probs, r.indices, ctx);
    const float aux = LoadBalancingLossFromSums(lb, k, config_.aux_loss_coef);
    // coef 0 gives z = 0 without a pass over the logits (on CUDA, without a wait).
    const float z = config_.z_loss_coef != 0.0f
                        ? ZLoss(r.logits, config_.z_loss_coef, 0.0f, nullptr, 0, ctx)
                        : 0.0f;
    Tensor experts_g = acts.experts_all.Slice(t0, t0 + group_tokens);
    Tensor kept_g = acts.kept_all.Slice(t0, t0 + group_tokens);
    Tensor gates_g = acts.gates.Slice(t0, t0 + group_tokens);
    experts_g.CopyFrom(r.indices, ctx);
    kept_g.CopyFrom(adm.kept, ctx);
    gates_g.CopyFrom(r.gates, ctx);

    // Statistics of the group.
    int64_t kept_total = 0;
    for (int64_t i = 0; i < e; ++i) {
      out.stats.tokens_per_expert[i] += lb.assignments[i];
      out.stats.tokens_per_expert_kept[i] += adm.counts_after[i];
      out.groups.tokens_per_expert_kept[g * e + i] = adm.counts_after[i];
      kept_total += adm.counts_after[i];
    }
    out.stats.entropy_sum += kernels::EntropySum(r.probs, ctx);
    out.groups.aux.push_back(aux);
    out.groups.z.push_back(z);
    out.groups.dropped.push_back(group_tokens * k - kept_total);
    out.stats.aux_sum += aux;
    out.stats.z_sum += z;
    acts.router.push_back(std::move(r));
    acts.balance.push_back(std::move(lb));
  }
  out.stats.tokens = n;
  out.stats.assignments = n * k;
  out.stats.groups = groups;
  // Under tp every rank routed the same whole group: rank 0 reports it.
  if (tp_ && tp_rank() != 0) {
    MoEStats none;
    none.tokens_per_expert.assign(e, 0);
    none.tokens_per_expert_kept.assign(e, 0);
    out.stats = none;
  }
}

Tensor MoELayer::RunExperts(const Tensor& grouped, MoEActivations& acts,
                            DeviceContext* ctx) const {
  const std::vector<int64_t>& rows = acts.plan->rows_per_local_expert();
  if (!etp_) {
    acts.experts = experts_.Forward(grouped, rows, ctx);
    return acts.experts.y;
  }
  acts.etp = MakeEtpPlan(rows, *etp_, device(), ctx);
  acts.experts = experts_.Forward(EtpGather(grouped, *acts.etp, *etp_, ctx),
                                  acts.etp->rows_per_expert, ctx);
  return EtpReduceScatter(acts.experts.y, *acts.etp, *etp_, ctx);
}

MoEForward MoELayer::Forward(const Tensor& h, int64_t group_tokens, bool training, int64_t step,
                             int64_t first_token, DeviceContext* ctx) {
  const int64_t n = h.dim(0), d = config_.d_model;
  SY_CHECK(h.ndim() == 2 && h.dim(1) == d && group_tokens > 0 && n % group_tokens == 0)
      << "MoE input " << ShapeString(h.shape()) << " is not (G * " << group_tokens << ", " << d
      << ")";
  SY_CHECK(!tp_ || n == group_tokens) << "MoE layer under tp: one routing group per call";
  SY_CHECK(h.device() == device()) << "MoE input on " << h.device() << ", the layer on "
                                   << device();
  CheckContext(device(), ctx, "MoELayer::Forward");
  MoEForward out;
  MoEActivations& acts = out.acts;
  // 1. Route and admit the whole groups (all tp ranks' rows; identical on every tp rank).
  Route(GatherGroup(h, ctx), group_tokens * tp_size(), training, step, first_token, out, ctx);
  // 2. Dispatch this rank's rows over ep.
  acts.plan = std::make_unique<DispatchPlan>(DispatchPlan::Build(
      OwnRows(acts.experts_all), OwnRows(acts.kept_all), config_.num_experts, ep_->size(), ctx));
  DispatchPlan& plan = *acts.plan;
  plan.ExchangeCounts(*ep_, ctx);
  Tensor grouped = Regroup(ExchangeRows(Permute(h, plan, ctx), plan, *ep_, ctx), plan, ctx);
  // 3. The experts (over etp when split).
  Tensor expert_y = RunExperts(grouped, acts, ctx);
  // 4. Return and combine (+ the shared experts on this rank's rows).
  acts.expert_out = ReturnRows(Ungroup(expert_y, plan, ctx), plan, *ep_, ctx);
  if (shared_) acts.shared = shared_->Forward(h, ctx);
  out.y = Combine(acts.expert_out, OwnRows(acts.gates), plan,
                  shared_ ? acts.shared->y : Tensor(), ctx);
  return out;
}

// ---- Backward phases --------------------------------------------------------------------

Tensor MoELayer::RunExpertsBackward(const MoEActivations& acts, const Tensor& dgrouped,
                                    DeviceContext* ctx) {
  if (!etp_) return experts_.Backward(acts.experts, dgrouped, ctx);
  const Tensor dx = experts_.Backward(acts.experts, EtpGather(dgrouped, *acts.etp, *etp_, ctx), ctx);
  return EtpReduceScatter(dx, *acts.etp, *etp_, ctx);
}

void MoELayer::RouterBackwardAll(const MoEActivations& acts, const Tensor& dgates_own,
                                 std::span<const float> daux, std::span<const float> dz,
                                 Tensor& dh, DeviceContext* ctx) {
  const Device dev = device();
  const int64_t k = config_.top_k, d = config_.d_model;
  // The gates' gradients of the whole group (every tp rank's rows).
  Tensor dgates = dgates_own;
  Tensor dh_all = dh;
  if (tp_) {
    dgates = Tensor::Empty({dgates_own.dim(0) * tp_->size(), k}, DType::kF32, dev);
    tp_->AllGather(dgates_own, dgates);
    dh_all = Tensor::Zeros({dgates.dim(0), d}, DType::kF32, dev, ctx);
  }
  for (int64_t g = 0; g < acts.groups; ++g) {
    const int64_t t0 = g * acts.group_tokens, t = acts.group_tokens;
    const RouterOutput& r = acts.router[g];
    Tensor dprobs = Tensor::Zeros({t, config_.num_experts}, DType::kF32, dev, ctx);
    LoadBalancingLossBackward(acts.balance[g], k, config_.aux_loss_coef, daux[g], dprobs, ctx);
    Tensor dlogits = Tensor::Zeros({t, config_.num_experts}, DType::kF32, dev, ctx);
    ZLossBackward(r.logits, config_.z_loss_coef, dz[g], dlogits, 0, ctx);
    Tensor dh_g = dh_all.Slice(t0, t0 + t);
    RouterBackward(r, router_weight_, config_, dgates.Slice(t0, t0 + t), dprobs, dlogits, dh_g,
                   grad_router_weight_, ctx);
  }
  if (tp_) kernels::Axpy(1.0f, OwnRows(dh_all), dh, ctx);
}

Tensor MoELayer::Backward(const MoEActivations& acts, const Tensor& dy, std::span<const float> daux,
                          std::span<const float> dz, DeviceContext* ctx) {
  const DispatchPlan& plan = *acts.plan;
  const int64_t n = plan.num_tokens(), d = config_.d_model, k = config_.top_k;
  SY_CHECK(dy.shape() == (Shape{n, d})) << "MoE dy " << ShapeString(dy.shape());
  SY_CHECK(static_cast<int64_t>(daux.size()) == acts.groups &&
           static_cast<int64_t>(dz.size()) == acts.groups)
      << "daux/dz need one value per group (" << acts.groups << ")";
  const Device dev = device();
  SY_CHECK(dy.device() == dev) << "MoE dy on " << dy.device() << ", the layer on " << dev;
  CheckContext(dev, ctx, "MoELayer::Backward");
  // The shared experts' dx starts dh (it is a fresh tensor); else zeros.
  Tensor dh = shared_ ? shared_->Backward(*acts.shared, dy, ctx)
                      : Tensor::Zeros({n, d}, DType::kF32, dev, ctx);
  // Combine's backward, then the dispatch path in reverse.
  Tensor dout = Tensor::Empty({plan.num_assignments(), d}, DType::kF32, dev);
  Tensor dgates = Tensor::Empty({n, k}, DType::kF32, dev);
  CombineBackward(dy, acts.expert_out, OwnRows(acts.gates), plan, dout, dgates, ctx);
  Tensor dgrouped = Regroup(ExchangeRows(dout, plan, *ep_, ctx), plan, ctx);
  Tensor dx = RunExpertsBackward(acts, dgrouped, ctx);
  ScatterAdd(ReturnRows(Ungroup(dx, plan, ctx), plan, *ep_, ctx), plan, dh, ctx);
  // The router of every group: gates, load balancing and z-loss.
  RouterBackwardAll(acts, dgates, daux, dz, dh, ctx);
  return dh;
}

void MoELayer::ZeroGrad(DeviceContext* ctx) {
  CheckContext(device(), ctx, "MoELayer::ZeroGrad");
  grad_router_weight_.SetZero(ctx);
  experts_.ZeroGrad(ctx);
  if (shared_) shared_->experts().ZeroGrad(ctx);
}

}  // namespace switchyard::moe
