// The MoE layer (moe/moe_layer.h): construction, parameter descriptions, and Forward /
// Backward as one call per phase.
#include "moe/moe_layer.h"

#include <algorithm>
#include <optional>
#include <string>

#include "engine/core/profile.h"
#include "kernels/activation_storage.h"
#include "kernels/gemm.h"

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
      group_(parallel.group != nullptr ? (parallel.group->size() > 1 ? parallel.group : nullptr)
                                       : tp_),
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
  const int etp_rank = etp_ ? etp_->rank() : 0;
  SY_CHECK(experts_.options().d_hidden * etp_size() == config_.d_expert &&
           experts_.options().hidden_offset == etp_rank * experts_.options().d_hidden &&
           experts_.options().hidden_whole() == config_.d_expert &&
           experts_.options().adds_output_bias == (etp_rank == 0))
      << "experts hold hidden units [" << experts_.options().hidden_offset << ", +"
      << experts_.options().d_hidden << ") of " << experts_.options().hidden_whole()
      << ", not etp rank " << etp_rank << "'s share of moe.d_expert=" << config_.d_expert
      << " over parallel.etp=" << etp_size();
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
  if (config_.aux_loss_scope == AuxLossScope::kGlobal) {
    const int64_t e = config_.num_experts;
    expert_load_ = Tensor::FromVector(std::vector<float>(e, 1.0f / static_cast<float>(e)), {e});
    if (!dev.is_cpu()) expert_load_ = expert_load_.To(dev, ctx);
  }
  SY_CHECK(config_.num_shared_experts == 0 || shared_.has_value())
      << "the config asks for shared experts";
  SY_CHECK_OK(config_.CheckOverlapChunks(ep_->size()));
  if (config_.overlap_chunks > 1) comm_thread_ = std::make_unique<dist::CommThread>(*ep_);
}

MoELayer MoELayer::Init(const MoEConfig& config, int64_t layer_id, const MoEParallel& parallel,
                        uint64_t seed, float std, float out_std, DeviceContext* ctx) {
  const std::string name = StrCat("layers.", layer_id, ".moe");
  const Device dev = ctx != nullptr ? ctx->device() : Device::Cpu();
  dist::Communicator* ep = parallel.ep;
  const StatusOr<int64_t> experts_per_rank = config.ExpertsPerRank(ep->size());
  SY_CHECK_OK(experts_per_rank.status());
  const int64_t per_rank = *experts_per_rank;
  Tensor wr = Tensor::Empty({config.d_model, config.num_experts}, DType::kF32, dev);
  parallel::Parameter router = parallel::Parameter::Dense("router.weight", wr, Tensor(), false);
  parallel::InitNormal(router, seed, std, ctx, name + ".router.weight");
  ExpertsOptions eo = RoutedExpertsOptions(config, ep->rank() * per_rank, per_rank, dev);
  if (parallel.etp != nullptr && parallel.etp->size() > 1) {
    const StatusOr<int64_t> hidden = config.ExpertHiddenPerRank(parallel.etp->size());
    SY_CHECK_OK(hidden.status());
    eo.d_hidden = *hidden;
    eo.hidden_offset = parallel.etp->rank() * eo.d_hidden;
    eo.hidden_total = config.d_expert;
    eo.adds_output_bias = parallel.etp->rank() == 0;
  }
  Experts experts = Experts::Init(eo, seed, name + ".experts", std, out_std, ctx);
  std::optional<DenseMlp> shared;
  if (config.num_shared_experts > 0) {
    shared.emplace(Experts::Init(SharedExpertsOptions(config, dev), seed, name + ".shared", std,
                                 out_std, ctx));
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
  // The router and the expert bias are whole on every tp rank; each tp rank back-propagates
  // its own rows only, so the router's gradient is summed over tp.
  parallel::Parameter router =
      parallel::Parameter::Dense("router.weight", router_weight_, grad_router_weight_, false);
  router.lr_scale = config_.router_lr_scale;
  if (tp_) router.ReplicatedOver(Axis::kTp, /*grad_summed=*/true);
  out.push_back(std::move(router));
  // The routed experts describe their split over ep and etp (b2 whole over etp).
  parallel::AppendPrefixed("experts", experts_.Parameters(dist::View::kExpert), out);
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
  if (expert_load_.defined()) {
    parallel::Parameter f =
        parallel::Parameter::Dense("expert_load", expert_load_, Tensor(), false);
    f.grad_sum = parallel::AxisSet();
    if (tp_) f.ReplicatedOver(Axis::kTp, false);
    out.push_back(std::move(f));
  }
  return out;
}

void MoELayer::UpdateExpertLoad(std::span<const int64_t> counts, DeviceContext* ctx) {
  if (!expert_load_.defined()) return;
  const int64_t e = config_.num_experts;
  SY_CHECK_EQ(static_cast<int64_t>(counts.size()), e) << "expert load counts";
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0) return;
  std::vector<float> f(e);
  for (int64_t i = 0; i < e; ++i) {
    f[i] = static_cast<float>(static_cast<double>(counts[i]) / static_cast<double>(total));
  }
  expert_load_.CopyFrom(Tensor::FromVector(f, {e}), ctx);
}

// ---- Forward and its phases ------------------------------------------------------------

MoEForward MoELayer::Forward(const Tensor& h, int64_t group_tokens, bool training, int64_t step,
                             int64_t first_token, DeviceContext* ctx,
                             const GroupLayout& layout, int64_t valid_tokens,
                             const Tensor& rng_values) {
  const int64_t n = h.dim(0), d = config_.d_model;
  SY_CHECK(h.ndim() == 2 && h.dim(1) == d && group_tokens > 0 && n % group_tokens == 0)
      << "MoE input " << ShapeString(h.shape()) << " is not (G * " << group_tokens << ", " << d
      << ")";
  SY_CHECK(h.device() == device()) << "MoE input on " << h.device() << ", the layer on "
                                   << device();
  CheckContext(device(), ctx, "MoELayer::Forward");
  MoEForward out;
  MoEActivations& acts = out.acts;
  std::optional<ScopedPhase> phase(Phase::kRouter);
  // 1. Route every group (whole groups: under tp the logits are gathered over tp).
  RouterRng rng{config_.seed, step, layer_id_, first_token};
  if (rng_values.defined()) {
    SY_CHECK(rng_values.dtype() == DType::kI64 && rng_values.numel() >= 4 * (layer_id_ + 1) &&
             rng_values.device() == device())
        << "MoE layer " << layer_id_ << ": router rng values " << rng_values.DebugString();
    rng.device_values = rng_values.View({4}, 4 * layer_id_);
    rng.device_base = first_token;
  }
  RoutedGroups routed = RouteGroups(h, group_tokens, router_weight_, expert_bias_, config_,
                                    training, rng, group_, ctx, layout, expert_load_);
  // 2. Admit each whole group's assignments to capacity; keep this rank's rows.
  AdmitGroups(routed, training ? config_.capacity_factor : config_.eval_capacity_factor,
              config_, ctx);
  const OwnRouting own = OwnRowsOf(routed, ctx);
  acts.device_counts = config_.DeviceDispatchCounts(ep_->size(), etp_size()) && !replicas_;
  if (acts.device_counts) {
    acts.all_kept = routed.all_admitted;
    // At most C kept per expert and group, and never more than every assignment.
    const int64_t all = own.experts.numel();
    acts.device_rows = routed.capacity < 0
                           ? all
                           : std::min(all, routed.groups * config_.num_experts * routed.capacity);
  }
  acts.experts_all = own.experts;
  acts.gates = own.gates;
  acts.kept_all = own.kept;
  if (replicas_) {
    if (replicas_stale_) replicas_->PullWeights(experts_, *ep_, ctx);
    replicas_stale_ = false;
    acts.destinations = ReplicaDestinations(replica_plan_, own.experts,
                                            RowTokens(routed, first_token, ctx), ctx);
  }
  if (config_.overlap_chunks > 1) {
    // 3-5 in chunks, the exchanges overlapping the experts (moe/overlap.h).
    out.y = ForwardOverlapped(h, acts, ctx);
  } else {
    // 3. Dispatch this rank's rows over ep.
    phase.emplace(Phase::kDispatch);
    Tensor grouped = Dispatch(h, acts, ctx);
    // 4. The experts (over etp when split).
    phase.emplace(Phase::kExperts);
    Tensor expert_y = RunExperts(grouped, acts, ctx);
    // 5. Return and combine (+ the shared experts on this rank's rows).
    phase.emplace(Phase::kCombine);
    out.y = CombineOutputs(h, expert_y, acts, ctx);
  }
  // 6. Statistics of this rank's rows and the whole groups' values.
  phase.emplace(Phase::kRouter);
  out.stats = RoutingStats(routed, own, config_.num_experts, ctx, valid_tokens);
  out.groups = GroupValuesOf(routed, config_.top_k);
  acts.groups = routed.groups;
  acts.group_tokens = routed.group_tokens;
  acts.router = std::move(routed.router);
  acts.balance = std::move(routed.terms);
  acts.own_rows = routed.own_rows;
  return out;
}

Tensor MoELayer::Dispatch(const Tensor& h, MoEActivations& acts, DeviceContext* ctx) const {
  acts.plan = std::make_unique<DispatchPlan>(
      acts.device_counts
          ? DispatchPlan::BuildDeviceSized(acts.experts_all, acts.kept_all, config_.num_experts,
                                           acts.device_rows, ctx)
      : acts.destinations.defined()
          ? DispatchPlan::Build(acts.destinations, acts.kept_all,
                                replica_plan_.virtual_experts(), ep_->size(), ctx)
          : DispatchPlan::Build(acts.experts_all, acts.kept_all, config_.num_experts,
                                ep_->size(), ctx));
  DispatchPlan& plan = *acts.plan;
  plan.ExchangeCounts(*ep_, ctx);
  // Under bf16 activation storage the rows are gathered as the experts' bf16 operand (what
  // their products read and keep), so they cross ep at 2 bytes an element; not under etp or
  // replicas, whose paths move f32 rows.
  const DType rows_dtype = kernels::StoresBf16(ctx) && !etp_ && !acts.destinations.defined()
                               ? DType::kBF16
                               : DType::kF32;
  Tensor rows = Permute(h, plan, ctx, rows_dtype);
  const ScopedAllToAll timed(ep_->size() > 1);
  return Regroup(ExchangeRows(rows, plan, *ep_, ctx), plan, ctx);
}

Tensor MoELayer::RunExperts(const Tensor& grouped, MoEActivations& acts,
                            DeviceContext* ctx) const {
  if (acts.destinations.defined()) return RunWithReplicas(grouped, acts, ctx);
  if (acts.plan->device_sized()) {
    // Unless every assignment was kept, rows past the kept ones (dropped assignments the
    // plan carries) get zero outputs, so the combine's rows hold no unwritten memory.
    acts.experts = experts_.Forward(grouped, acts.plan->offsets(), ctx, !acts.all_kept);
    return acts.experts.y;
  }
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

Tensor MoELayer::CombineOutputs(const Tensor& h, const Tensor& expert_y, MoEActivations& acts,
                                DeviceContext* ctx) const {
  const DispatchPlan& plan = *acts.plan;
  Tensor ungrouped = Ungroup(expert_y, plan, ctx);
  {
    const ScopedAllToAll timed(ep_->size() > 1);
    acts.expert_out = ReturnRows(ungrouped, plan, *ep_, ctx);
  }
  if (shared_) acts.shared = shared_->Forward(h, ctx);
  return CombineAndKeep(acts, ctx);
}

Tensor MoELayer::CombineAndKeep(MoEActivations& acts, DeviceContext* ctx) const {
  // Backward reads the returned rows for the gates' gradient only: under bf16 storage the
  // combine keeps them rounded (kernels/activation_storage.h), in its own pass. Backward
  // reads none of the experts' outputs (Experts::Backward): the routed experts' (per chunk
  // under overlap; under etp the partial sums), the replica slots' and the shared experts'
  // go.
  // A device-sized plan's rows past the kept ones (dropped assignments: no slot points to
  // them, so the combine does not write them) start at zero, as the experts' outputs there.
  const bool unwritten_rows = acts.plan->device_sized() && !acts.all_kept;
  Tensor kept = !kernels::StoresBf16(ctx) ? Tensor()
                : unwritten_rows ? Tensor::Zeros(acts.expert_out.shape(), DType::kBF16, device(), ctx)
                                 : Tensor::Empty(acts.expert_out.shape(), DType::kBF16, device());
  Tensor y = Combine(acts.expert_out, acts.gates, config_.routed_scaling_factor, *acts.plan,
                     shared_ ? acts.shared->y : Tensor(), ctx, kept.defined() ? &kept : nullptr);
  if (kept.defined()) acts.expert_out = kept;
  acts.experts.y = Tensor();
  for (ExpertsActivations& e : acts.chunk_experts) e.y = Tensor();
  if (acts.replica) acts.replica->y = Tensor();
  if (acts.shared) acts.shared->y = Tensor();
  return y;
}

// ---- Backward ---------------------------------------------------------------------------

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
  Tensor dgates = Tensor::Empty({n, k}, DType::kF32, dev);
  Tensor dh;
  // The rows' gradients live until the layer's backward ends, as they always have: the
  // dry-run's activation estimate (engine/plan/activation_memory.cc) counts them beside the
  // router's backward.
  Tensor dgrouped, dx;
  if (config_.overlap_chunks > 1) {
    // 5-3 in chunks (moe/overlap.h).
    dh = BackwardOverlapped(acts, dy, dgates, ctx);
  } else {
    // 5. Combine's backward (the shared experts' dx starts dh), back over ep.
    dgrouped = CombineOutputsBackward(acts, dy, dgates, dh, ctx);
    // 4. The experts (over etp when split).
    dx = RunExpertsBackward(acts, dgrouped, ctx);
    // 3. The dispatch in reverse, added into dh.
    DispatchBackward(dx, acts, dh, ctx);
  }
  // 2-1. The router of every group on this rank's rows: gates, load balancing and z-loss.
  const ScopedPhase phase(Phase::kRouter);
  RouteGroupsBackward(acts.router, acts.balance, router_weight_, config_, dgates, daux, dz,
                      tp_rank(), dh, grad_router_weight_, ctx, acts.own_rows);
  return dh;
}

Tensor MoELayer::CombineOutputsBackward(const MoEActivations& acts, const Tensor& dy,
                                        Tensor& dgates, Tensor& dh, DeviceContext* ctx) {
  const DispatchPlan& plan = *acts.plan;
  const int64_t n = plan.num_tokens(), d = config_.d_model;
  // The shared experts' dx starts dh (it is a fresh tensor); else DispatchBackward writes
  // it whole (allocated here all the same, where the dry-run counts it).
  std::optional<ScopedPhase> phase(Phase::kExperts);
  dh = shared_ ? shared_->Backward(*acts.shared, dy, ctx)
               : Tensor::Empty({n, d}, DType::kF32, device());
  phase.emplace(Phase::kCombine);
  // In bf16 mode the combine's backward writes the experts' incoming gradient as the bf16
  // operand their products read (no conversion there, and half the bytes back across ep);
  // not when the experts sum b2's gradient from it (moe.bias), nor under etp or replicas,
  // whose paths move f32 rows (as the forward's). The overlap chunks' backward is its own.
  const bool rows16 = config_.ExpertGradRowsInBf16(
      kernels::MatmulOperandDType(ctx) == DType::kBF16, etp_size(),
      acts.destinations.defined());
  Tensor dout = Tensor::Empty({plan.num_assignments(), d}, rows16 ? DType::kBF16 : DType::kF32,
                              device());
  CombineBackward(dy, acts.expert_out, acts.gates, config_.routed_scaling_factor, plan, dout,
                  dgates, ctx);
  Tensor dgrouped;
  {
    const ScopedAllToAll timed(ep_->size() > 1);
    dgrouped = ExchangeRows(dout, plan, *ep_, ctx);
  }
  return Regroup(dgrouped, plan, ctx);
}

Tensor MoELayer::RunExpertsBackward(const MoEActivations& acts, const Tensor& dgrouped,
                                    DeviceContext* ctx) {
  const ScopedPhase phase(Phase::kExperts);
  Tensor dx;
  if (acts.replica) {
    dx = RunWithReplicasBackward(acts, dgrouped, ctx);
  } else if (!etp_) {
    dx = experts_.Backward(acts.experts, dgrouped, ctx);
  } else {
    dx = EtpReduceScatter(
        experts_.Backward(acts.experts, EtpGather(dgrouped, *acts.etp, *etp_, ctx), ctx),
        *acts.etp, *etp_, ctx);
  }
  // The replicas' weight gradients into their owners' (before any gradient sync): the
  // mirror of Forward's PullWeights.
  if (replicas_) replicas_->PushGradients(experts_, *ep_, ctx);
  return dx;
}

void MoELayer::DispatchBackward(const Tensor& dgrouped_x, const MoEActivations& acts, Tensor& dh,
                                DeviceContext* ctx) const {
  const DispatchPlan& plan = *acts.plan;
  const ScopedPhase phase(Phase::kDispatch);
  Tensor dx_rows = Ungroup(dgrouped_x, plan, ctx);
  {
    const ScopedAllToAll timed(ep_->size() > 1);
    dx_rows = ReturnRows(dx_rows, plan, *ep_, ctx);
  }
  ScatterAdd(dx_rows, plan, dh, shared_ ? kernels::Write::kAdd : kernels::Write::kSet, ctx);
}

void MoELayer::ZeroGrad(DeviceContext* ctx) {
  CheckContext(device(), ctx, "MoELayer::ZeroGrad");
  grad_router_weight_.SetZero(ctx);
  experts_.ZeroGrad(ctx);
  if (shared_) shared_->experts().ZeroGrad(ctx);
  if (replicas_) replicas_->experts().ZeroGrad(ctx);
}

// ---- Hot-expert replication ---------------------------------------------------------------

void MoELayer::SetReplicaPlan(const ReplicaPlan& plan, DeviceContext* ctx) {
  SY_CHECK(plan.empty() || (plan.num_experts() == config_.num_experts &&
                            plan.ep() == ep_->size()))
      << "replica plan for " << plan.num_experts() << " experts over ep=" << plan.ep()
      << ", the layer has " << config_.num_experts << " over ep=" << ep_->size();
  SY_CHECK(plan.empty() || etp_ == nullptr)
      << "expert replication does not support expert tensor parallelism (parallel.etp > 1)";
  if (plan == replica_plan_ && (plan.empty() == (replicas_ == nullptr))) return;
  replica_plan_ = plan;
  replicas_.reset();
  if (!plan.empty()) {
    replicas_ = std::make_unique<ExpertReplicas>(plan, ep_->rank(), experts_.options(), ctx);
  }
  replicas_stale_ = true;
}

std::vector<int64_t> MoELayer::RowTokens(const RoutedGroups& routed, int64_t first_token,
                                         DeviceContext* ctx) const {
  const int64_t per_group = routed.local_tokens();
  std::vector<int64_t> in_group(per_group);
  if (routed.own_rows.defined()) {
    in_group = routed.own_rows.ToHost("moe.row_tokens", ctx).ToVector<int64_t>();
  } else {
    for (int64_t i = 0; i < per_group; ++i) in_group[i] = routed.own_begin() + i;
  }
  std::vector<int64_t> tokens(routed.groups * per_group);
  for (int64_t g = 0; g < routed.groups; ++g)
    for (int64_t i = 0; i < per_group; ++i)
      tokens[g * per_group + i] = first_token + g * routed.group_tokens + in_group[i];
  return tokens;
}

Tensor MoELayer::RunWithReplicas(const Tensor& grouped, MoEActivations& acts,
                                 DeviceContext* ctx) const {
  const std::vector<int64_t>& rows = acts.plan->rows_per_local_expert();  // (E_l + S)
  const int64_t el = experts_.options().num_local, r = grouped.dim(0);
  const std::span<const int64_t> all(rows);
  int64_t owned = 0;
  for (int64_t e = 0; e < el; ++e) owned += rows[e];
  acts.owned_rows = owned;
  acts.experts = experts_.Forward(grouped.Slice(0, owned), all.first(el), ctx);
  acts.replica = replicas_->experts().Forward(grouped.Slice(owned, r), all.subspan(el), ctx);
  Tensor y = Tensor::Empty(grouped.shape(), DType::kF32, grouped.device());  // (R, d)
  y.Slice(0, owned).CopyFrom(acts.experts.y, ctx);
  y.Slice(owned, r).CopyFrom(acts.replica->y, ctx);
  return y;
}

Tensor MoELayer::RunWithReplicasBackward(const MoEActivations& acts, const Tensor& dgrouped,
                                         DeviceContext* ctx) {
  SY_CHECK(replicas_ != nullptr)
      << "the replica plan changed between a Forward with replicas and its Backward";
  const int64_t owned = acts.owned_rows, r = dgrouped.dim(0);
  Tensor dx = Tensor::Empty(dgrouped.shape(), DType::kF32, dgrouped.device());  // (R, d)
  dx.Slice(0, owned).CopyFrom(experts_.Backward(acts.experts, dgrouped.Slice(0, owned), ctx),
                              ctx);
  dx.Slice(owned, r).CopyFrom(
      replicas_->experts().Backward(*acts.replica, dgrouped.Slice(owned, r), ctx), ctx);
  return dx;
}

}  // namespace switchyard::moe
