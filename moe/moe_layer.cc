#include "moe/moe_layer.h"

#include <algorithm>
#include <string>

#include "kernels/permute.h"
#include "kernels/random.h"

namespace switchyard::moe {

// ---- MoEStats ------------------------------------------------------------------------

void MoEStats::Add(const MoEStats& o) {
  if (tokens_per_expert.empty()) {
    tokens_per_expert.assign(o.tokens_per_expert.size(), 0);
    tokens_per_expert_kept.assign(o.tokens_per_expert_kept.size(), 0);
  }
  // A default-constructed MoEStats (no experts yet) adds nothing.
  if (!o.tokens_per_expert.empty()) {
    SY_CHECK(tokens_per_expert.size() == o.tokens_per_expert.size() &&
             o.tokens_per_expert_kept.size() == o.tokens_per_expert.size())
        << "MoEStats::Add: " << o.tokens_per_expert.size() << " experts into "
        << tokens_per_expert.size();
    for (size_t e = 0; e < tokens_per_expert.size(); ++e) {
      tokens_per_expert[e] += o.tokens_per_expert[e];
      tokens_per_expert_kept[e] += o.tokens_per_expert_kept[e];
    }
  }
  tokens += o.tokens;
  assignments += o.assignments;
  entropy_sum += o.entropy_sum;
  aux_sum += o.aux_sum;
  z_sum += o.z_sum;
  groups += o.groups;
}

void MoEStats::AllReduce(dist::Communicator& comm, DeviceContext* ctx) {
  if (comm.size() == 1) return;
  // Host tensors for a host communicator; a device one reduces copies on its device.
  auto all_reduce = [&](Tensor& t) {
    if (comm.device().is_cpu()) {
      comm.AllReduce(t, dist::ReduceOp::kSum);
      return;
    }
    SY_CHECK(ctx != nullptr && ctx->device() == comm.device())
        << "MoEStats::AllReduce over a communicator on " << comm.device()
        << " needs that device's DeviceContext";
    Tensor on_device = t.To(comm.device(), ctx);
    comm.AllReduce(on_device, dist::ReduceOp::kSum);
    t.CopyFrom(on_device, ctx);  // waits for the stream
  };
  const size_t e = tokens_per_expert.size();
  std::vector<int64_t> ints(tokens_per_expert);
  ints.insert(ints.end(), tokens_per_expert_kept.begin(), tokens_per_expert_kept.end());
  ints.insert(ints.end(), {tokens, assignments, groups});
  Tensor it = Tensor::FromVector(ints, {static_cast<int64_t>(ints.size())});
  all_reduce(it);
  // Floating sums travel as f32 pairs (hi, lo) so that the f64 totals lose nothing that
  // matters for reporting; the communicator has no f64.
  std::vector<float> floats;
  for (double v : {entropy_sum, aux_sum, z_sum}) {
    float hi = static_cast<float>(v);
    floats.push_back(hi);
    floats.push_back(static_cast<float>(v - hi));
  }
  Tensor ft = Tensor::FromVector(floats, {static_cast<int64_t>(floats.size())});
  all_reduce(ft);
  const int64_t* ip = it.data<int64_t>();
  std::copy(ip, ip + e, tokens_per_expert.begin());
  std::copy(ip + e, ip + 2 * e, tokens_per_expert_kept.begin());
  tokens = ip[2 * e];
  assignments = ip[2 * e + 1];
  groups = ip[2 * e + 2];
  const float* fp = ft.data<float>();
  entropy_sum = double(fp[0]) + fp[1];
  aux_sum = double(fp[2]) + fp[3];
  z_sum = double(fp[4]) + fp[5];
}

int64_t MoEStats::dropped() const {
  int64_t kept = 0;
  for (int64_t c : tokens_per_expert_kept) kept += c;
  return assignments - kept;
}
double MoEStats::dropped_fraction() const {
  return assignments ? static_cast<double>(dropped()) / assignments : 0.0;
}
double MoEStats::router_entropy() const { return tokens ? entropy_sum / tokens : 0.0; }
double MoEStats::aux_mean() const { return groups ? aux_sum / groups : 0.0; }
double MoEStats::z_mean() const { return groups ? z_sum / groups : 0.0; }

std::vector<int64_t> MoEStats::TokensPerEpRank(int64_t ep) const {
  const int64_t e = static_cast<int64_t>(tokens_per_expert_kept.size());
  SY_CHECK(ep > 0 && e % ep == 0) << "E=" << e << " over ep=" << ep;
  std::vector<int64_t> out(ep, 0);
  for (int64_t i = 0; i < e; ++i) out[i / (e / ep)] += tokens_per_expert_kept[i];
  return out;
}

namespace {
double Share(const std::vector<int64_t>& counts, bool max) {
  int64_t total = 0;
  for (int64_t c : counts) total += c;
  if (total == 0 || counts.empty()) return 0.0;
  int64_t pick = max ? *std::max_element(counts.begin(), counts.end())
                     : *std::min_element(counts.begin(), counts.end());
  return static_cast<double>(pick) / total;
}
}  // namespace

double MoEStats::min_load_share() const { return Share(tokens_per_expert_kept, false); }
double MoEStats::max_load_share() const { return Share(tokens_per_expert_kept, true); }
double MoEStats::mean_load_share() const {
  return tokens_per_expert_kept.empty() ? 0.0 : 1.0 / tokens_per_expert_kept.size();
}

// ---- MoELayer ------------------------------------------------------------------------

namespace {

// ctx is required for work on a CUDA device, and must be that device's.
void CheckContext(Device device, DeviceContext* ctx, const char* what) {
  SY_CHECK(device.is_cpu() || (ctx != nullptr && ctx->device() == device))
      << what << ": the layer lives on " << device << " and needs that device's DeviceContext"
      << (ctx ? StrCat(", got one for ", ctx->device().ToString()) : std::string(", got none"));
}

}  // namespace

MoELayer::MoELayer(const MoEConfig& config, int64_t layer_id, dist::Communicator* ep,
                   Tensor router_weight, Experts experts, std::optional<DenseMlp> shared,
                   Tensor expert_bias, DeviceContext* ctx)
    : config_(config),
      layer_id_(layer_id),
      ep_(ep),
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

MoELayer MoELayer::Init(const MoEConfig& config, int64_t layer_id, dist::Communicator* ep,
                        uint64_t seed, float std, DeviceContext* ctx) {
  const std::string name = StrCat("layers.", layer_id, ".moe");
  const Device dev = ctx != nullptr ? ctx->device() : Device::Cpu();
  const int64_t per_rank = config.ExpertsPerRank(ep->size()).value();
  Tensor wr = Tensor::Empty({config.d_model, config.num_experts}, DType::kF32, dev);
  kernels::FillNormal(wr, {seed, StreamId(name + ".router.weight")}, 0, 0.0f, std, ctx);
  Experts experts =
      Experts::Init(RoutedExpertsOptions(config, ep->rank() * per_rank, per_rank, dev), seed,
                    name + ".experts", std, ctx);
  std::optional<DenseMlp> shared;
  if (config.num_shared_experts > 0) {
    shared.emplace(
        Experts::Init(SharedExpertsOptions(config, dev), seed, name + ".shared", std, ctx));
  }
  Tensor bias;
  if (config.expert_bias_rate > 0) {
    bias = Tensor::Zeros({config.num_experts}, DType::kF32, dev, ctx);
  }
  return MoELayer(config, layer_id, ep, wr, std::move(experts), std::move(shared), bias, ctx);
}

MoEForward MoELayer::Forward(const Tensor& h, int64_t group_tokens, bool training, int64_t step,
                             int64_t first_token, DeviceContext* ctx) {
  const int64_t n = h.dim(0), d = config_.d_model, e = config_.num_experts, k = config_.top_k;
  SY_CHECK(h.ndim() == 2 && h.dim(1) == d && group_tokens > 0 && n % group_tokens == 0)
      << "MoE input " << ShapeString(h.shape()) << " is not (G * " << group_tokens << ", " << d
      << ")";
  const Device dev = device();
  SY_CHECK(h.device() == dev) << "MoE input on " << h.device() << ", the layer on " << dev;
  CheckContext(dev, ctx, "MoELayer::Forward");
  const int64_t groups = n / group_tokens;
  const double cf = training ? config_.capacity_factor : config_.eval_capacity_factor;
  const int64_t capacity = ExpertCapacity(cf, group_tokens, k, e);

  MoEForward out;
  MoEActivations& acts = out.acts;
  acts.groups = groups;
  acts.group_tokens = group_tokens;
  // Every group's routing, side by side: (N, k) on the layer's device.
  acts.gates = Tensor::Empty({n, k}, DType::kF32, dev);
  Tensor experts_all = Tensor::Empty({n, k}, DType::kI32, dev);
  Tensor kept_all = Tensor::Empty({n, k}, DType::kU8, dev);
  out.stats.tokens_per_expert.assign(e, 0);
  out.stats.tokens_per_expert_kept.assign(e, 0);
  out.groups.tokens_per_expert_kept.assign(groups * e, 0);

  for (int64_t g = 0; g < groups; ++g) {
    const int64_t t0 = g * group_tokens;
    Tensor hg = h.Slice(t0, t0 + group_tokens);
    RouterRng rng{config_.seed, step, layer_id_, first_token + t0};
    RouterOutput r =
        RouterForward(hg, router_weight_, expert_bias_, config_, training, rng, ctx);
    Admission adm = AdmitToCapacity(r.indices, r.gates, r.keep, e, capacity, config_.drop_policy,
                                    {}, ctx);
    LoadBalanceSums lb = LoadBalanceSumsOf(r.probs, r.indices, ctx);
    const float aux = LoadBalancingLossFromSums(lb, k, config_.aux_loss_coef);
    // coef 0 gives z = 0 without a pass over the logits (on CUDA, without a wait).
    const float z = config_.z_loss_coef != 0.0f
                        ? ZLoss(r.logits, config_.z_loss_coef, 0.0f, nullptr, 0, ctx)
                        : 0.0f;

    Tensor experts_g = experts_all.Slice(t0, t0 + group_tokens);
    Tensor kept_g = kept_all.Slice(t0, t0 + group_tokens);
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

  // Dispatch, experts, combine (+ the shared experts, added in the combine).
  acts.plan = std::make_unique<DispatchPlan>(
      DispatchPlan::Build(experts_all, kept_all, e, ep_->size(), ctx));
  DispatchPlan& plan = *acts.plan;
  plan.ExchangeCounts(*ep_, ctx);
  Tensor grouped =
      Regroup(ExchangeRows(Permute(h, plan, ctx), plan, *ep_, ctx), plan, ctx);
  acts.experts = experts_.Forward(grouped, plan.rows_per_local_expert(), ctx);
  acts.expert_out = ReturnRows(Ungroup(acts.experts.y, plan, ctx), plan, *ep_, ctx);
  if (shared_) acts.shared = shared_->Forward(h, ctx);
  out.y = Combine(acts.expert_out, acts.gates, plan, shared_ ? acts.shared->y : Tensor(), ctx);
  return out;
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
  CombineBackward(dy, acts.expert_out, acts.gates, plan, dout, dgates, ctx);
  Tensor dgrouped = Regroup(ExchangeRows(dout, plan, *ep_, ctx), plan, ctx);
  Tensor dx = experts_.Backward(acts.experts, dgrouped, ctx);
  ScatterAdd(ReturnRows(Ungroup(dx, plan, ctx), plan, *ep_, ctx), plan, dh, ctx);

  // The router of every group: gates, load balancing and z-loss.
  for (int64_t g = 0; g < acts.groups; ++g) {
    const int64_t t0 = g * acts.group_tokens, t = acts.group_tokens;
    const RouterOutput& r = acts.router[g];
    Tensor dprobs = Tensor::Zeros({t, config_.num_experts}, DType::kF32, dev, ctx);
    LoadBalancingLossBackward(acts.balance[g], k, config_.aux_loss_coef, daux[g], dprobs, ctx);
    Tensor dlogits = Tensor::Zeros({t, config_.num_experts}, DType::kF32, dev, ctx);
    ZLossBackward(r.logits, config_.z_loss_coef, dz[g], dlogits, 0, ctx);
    Tensor dh_g = dh.Slice(t0, t0 + t);
    RouterBackward(r, router_weight_, config_, dgates.Slice(t0, t0 + t), dprobs, dlogits, dh_g,
                   grad_router_weight_, ctx);
  }
  return dh;
}

void MoELayer::ZeroGrad(DeviceContext* ctx) {
  CheckContext(device(), ctx, "MoELayer::ZeroGrad");
  grad_router_weight_.SetZero(ctx);
  experts_.ZeroGrad(ctx);
  if (shared_) shared_->experts().ZeroGrad(ctx);
}

}  // namespace switchyard::moe
