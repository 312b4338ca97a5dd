// Route and admit for whole or tp-split routing groups (moe/group_routing.h).
#include "moe/group_routing.h"

#include "engine/core/check.h"
#include "engine/core/step_readback.h"
#include "moe/row_index.h"

namespace switchyard::moe {
namespace {

// The group token of every row of rank m (members[m]'s runs in order); checks the runs.
std::vector<int64_t> TokensOf(const GroupLayout& layout, int m, int64_t rows, int64_t t_whole) {
  std::vector<int64_t> tokens;
  tokens.reserve(rows);
  for (const TokenRun& run : layout.members[m]) {
    SY_CHECK(run.token >= 0 && run.rows >= 0 && run.token + run.rows <= t_whole)
        << "group layout run [" << run.token << ", +" << run.rows << ") outside a group of "
        << t_whole;
    for (int64_t i = 0; i < run.rows; ++i) tokens.push_back(run.token + i);
  }
  SY_CHECK_EQ(static_cast<int64_t>(tokens.size()), rows)
      << "group layout: rank " << m << " holds " << tokens.size() << " rows, not " << rows;
  return tokens;
}

// d aux / d probs of this rank's t rows (of a group of t_whole): one constant row for one
// part; per sequence, the whole group's rows then this rank's (rows [lo, lo + t) or
// own_rows). Written whole (Write::kSet): no zeroing first.
Tensor OwnBalanceGrad(const BalanceTerms& terms, const MoEConfig& config, float daux, int64_t t,
                      int64_t t_whole, int64_t lo, const Tensor& own_rows, Device dev,
                      DeviceContext* ctx) {
  const int64_t e = config.num_experts;
  constexpr kernels::Write kSet = kernels::Write::kSet;
  if (terms.one_row() || t == t_whole) {
    Tensor dprobs = Tensor::Empty({t, e}, DType::kF32, dev);
    BalanceLossBackward(terms, config.top_k, config.aux_loss_coef, daux, dprobs, kSet, ctx);
    return dprobs;
  }
  Tensor whole = Tensor::Empty({t_whole, e}, DType::kF32, dev);
  BalanceLossBackward(terms, config.top_k, config.aux_loss_coef, daux, whole, kSet, ctx);
  return own_rows.defined() ? RowsAt(whole, own_rows, ctx) : whole.Slice(lo, lo + t);
}

// A whole group's z-loss value: coef 0 gives 0 without a pass over the logits (on CUDA,
// without a wait); in a training step the value stays on the device until the step's
// readback.
PendingSum ZLossValue(const Tensor& logits, float coef, DeviceContext* ctx) {
  if (coef == 0.0f) return PendingSum(static_cast<double>(0.0f));
  if (StepReadback* readback = ctx != nullptr ? ctx->step_readback() : nullptr) {
    StepReadback::Slots slot = readback->Reserve(1, logits.device(), ctx);
    ZLossInto(logits, coef, slot.values, 0, ctx);
    return PendingSum::Slot(slot.first);
  }
  return static_cast<double>(ZLoss(logits, coef, 0.0f, nullptr, 0, ctx));
}

// A routed group's load-balancing sums, loss terms and aux into out. In a training step they
// stay on the device until its readback; otherwise they are read back (and the global
// scope's f from expert_load into `load`, once for all groups).
void AddBalanceTerms(const RouterOutput& r, const MoEConfig& config, const Tensor& expert_load,
                     std::vector<float>& load, DeviceContext* ctx, RoutedGroups& out) {
  StepReadback* readback = ctx != nullptr ? ctx->step_readback() : nullptr;
  if (readback != nullptr) {
    LoadBalanceSums lb =
        LoadBalanceSumsInto(r.probs, r.indices, config.aux_loss_coef, *readback, ctx);
    BalanceTerms terms =
        BalanceTermsInto(r.probs, r.indices, lb, config.aux_loss_scope, config.seq_len,
                         expert_load, config.top_k, config.aux_loss_coef, *readback, ctx);
    out.aux.push_back(PendingSum::Slot(terms.aux_slot));
    out.terms.push_back(std::move(terms));
    out.balance.push_back(std::move(lb));
    return;
  }
  if (load.empty() && expert_load.defined() && config.aux_loss_scope == AuxLossScope::kGlobal) {
    load = expert_load.ToHost("moe.expert_load", ctx).ToVector<float>();
  }
  LoadBalanceSums lb = LoadBalanceSumsOf(r.probs, r.indices, ctx);
  BalanceTerms terms = BalanceTermsOf(r.probs, r.indices, lb, config.aux_loss_scope,
                                      config.seq_len, load, ctx);
  out.aux.push_back(static_cast<double>(BalanceLoss(terms, config.top_k, config.aux_loss_coef)));
  out.terms.push_back(std::move(terms));
  out.balance.push_back(std::move(lb));
}

}  // namespace

RoutedGroups RouteGroups(const Tensor& h, int64_t local_tokens, const Tensor& wr,
                         const Tensor& expert_bias, const MoEConfig& config, bool training,
                         const RouterRng& rng, dist::Communicator* tp, DeviceContext* ctx,
                         const GroupLayout& layout, const Tensor& expert_load) {
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
  // A non-contiguous layout: where each token's logits land in the rank-major gather, and
  // this rank's tokens.
  Tensor token_order;
  if (!layout.contiguous()) {
    SY_CHECK_EQ(static_cast<int>(layout.members.size()), out.tp_size)
        << "group layout for " << layout.members.size() << " ranks, the group has "
        << out.tp_size;
    std::vector<int64_t> gathered_row(t_whole, -1);
    for (int m = 0; m < out.tp_size; ++m) {
      const std::vector<int64_t> tokens = TokensOf(layout, m, local_tokens, t_whole);
      for (int64_t i = 0; i < local_tokens; ++i) {
        SY_CHECK_EQ(gathered_row[tokens[i]], -1) << "group layout: token " << tokens[i] << " twice";
        gathered_row[tokens[i]] = m * local_tokens + i;
      }
      if (m == out.tp_rank) out.own_rows = IndexOn(tokens, h.device(), ctx);
    }
    token_order = IndexOn(gathered_row, h.device(), ctx);
  }
  const std::span<const TokenRun> own_runs =
      layout.contiguous() ? std::span<const TokenRun>() : layout.members[out.tp_rank];
  std::vector<float> load;  // outside a training step: the global scope's f, read back once
  for (int64_t g = 0; g < out.groups; ++g) {
    Tensor hg = h.Slice(g * local_tokens, (g + 1) * local_tokens);  // (T/P, d)
    RouterRng group_rng = rng;
    group_rng.first_token = rng.first_token + g * t_whole;  // the group's first token
    RouterRng own_rng = group_rng;
    if (own_runs.empty()) own_rng.first_token += out.own_begin();  // this rank's first row
    RouterOutput r = RouterLogits(hg, wr, config, training, own_rng, ctx, own_runs);
    if (out.tp_size > 1) {
      // The group's logits (T, E) in token order, the same bits on every tp rank.
      Tensor whole = Tensor::Empty({t_whole, e}, DType::kF32, h.device());
      tp->AllGather(r.logits, whole);
      r.logits = token_order.defined() ? RowsAt(whole, token_order, ctx) : whole;
    }
    RouterChoose(r, expert_bias, config, group_rng, ctx);
    AddBalanceTerms(r, config, expert_load, load, ctx, out);
    out.z.push_back(ZLossValue(r.logits, config.z_loss_coef, ctx));
    // The z-loss's statistic whatever its coefficient (coef 1: the same pass and rounding).
    out.lse_sq.push_back(config.z_loss_coef == 1.0f ? out.z.back()
                                                    : ZLossValue(r.logits, 1.0f, ctx));
    out.router.push_back(std::move(r));
  }
  return out;
}

void AdmitGroups(RoutedGroups& routed, double capacity_factor, const MoEConfig& config,
                 DeviceContext* ctx) {
  const int64_t e = config.num_experts;
  const int64_t capacity = ExpertCapacity(capacity_factor, routed.group_tokens, config.top_k, e);
  routed.admission.clear();
  // Dropless without GShard's random second choice (keep is all ones): every assignment is
  // admitted, kept is the router's keep and the counts are the balance sums' (the same
  // values AdmitToCapacity returns), so admission needs no pass and no readback.
  const bool all_admitted = capacity == kDropless &&
                            config.second_expert_policy != SecondExpertPolicy::kRandom &&
                            routed.balance.size() == routed.router.size();
  routed.all_admitted = all_admitted;
  routed.capacity = capacity;
  for (size_t g = 0; g < routed.router.size(); ++g) {
    const RouterOutput& r = routed.router[g];
    if (all_admitted) {
      Admission a;
      a.kept = r.keep;
      a.counts_before = routed.balance[g].assignments;
      a.counts_after = routed.balance[g].assignments;
      // Sums on the device: the counts are the step's readback's.
      if (routed.balance[g].on_device()) a.counts_slot = routed.balance[g].values_slot + 1;
      routed.admission.push_back(std::move(a));
      continue;
    }
    StepReadback* readback = ctx != nullptr ? ctx->step_readback() : nullptr;
    if (readback != nullptr && routed.balance[g].on_device()) {
      // A training step: the admitted counts stay on the device until its readback.
      routed.admission.push_back(AdmitToCapacityInto(r.indices, r.gates, r.keep, e, capacity,
                                                     config.drop_policy, *readback, ctx));
      continue;
    }
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
    if (routed.own_rows.defined()) {
      out.experts.Slice(g * t, (g + 1) * t).CopyFrom(RowsAt(r.indices, routed.own_rows, ctx), ctx);
      out.gates.Slice(g * t, (g + 1) * t).CopyFrom(RowsAt(r.gates, routed.own_rows, ctx), ctx);
      out.kept.Slice(g * t, (g + 1) * t)
          .CopyFrom(RowsAt(routed.admission[g].kept, routed.own_rows, ctx), ctx);
      continue;
    }
    out.experts.Slice(g * t, (g + 1) * t).CopyFrom(r.indices.Slice(lo, hi), ctx);
    out.gates.Slice(g * t, (g + 1) * t).CopyFrom(r.gates.Slice(lo, hi), ctx);
    out.kept.Slice(g * t, (g + 1) * t).CopyFrom(routed.admission[g].kept.Slice(lo, hi), ctx);
  }
  return out;
}

void RouteGroupsBackward(std::span<const RouterOutput> router,
                         std::span<const BalanceTerms> terms, const Tensor& wr,
                         const MoEConfig& config, const Tensor& dgates,
                         std::span<const float> daux, std::span<const float> dz, int tp_rank,
                         Tensor& dh, Tensor& dwr, DeviceContext* ctx, const Tensor& own_rows) {
  const int64_t groups = static_cast<int64_t>(router.size());
  SY_CHECK(static_cast<int64_t>(terms.size()) == groups &&
           static_cast<int64_t>(daux.size()) == groups && static_cast<int64_t>(dz.size()) == groups)
      << "router backward: " << groups << " groups, " << terms.size() << " aux-loss terms, "
      << daux.size() << " daux, " << dz.size() << " dz";
  const Device dev = wr.device();
  const int64_t e = config.num_experts;
  for (int64_t g = 0; g < groups; ++g) {
    const RouterOutput& whole = router[g];
    const int64_t t = whole.input.dim(0), t_whole = whole.logits.dim(0);
    const int64_t lo = t_whole == t ? 0 : tp_rank * t, hi = lo + t;
    // This rank's rows of the group's routing (views).
    RouterOutput own = whole;
    if (own_rows.defined()) {
      own.logits = RowsAt(whole.logits, own_rows, ctx);
      own.probs = RowsAt(whole.probs, own_rows, ctx);
      own.scores = whole.scores.raw_data() == whole.probs.raw_data()
                       ? own.probs
                       : RowsAt(whole.scores, own_rows, ctx);
      own.indices = RowsAt(whole.indices, own_rows, ctx);
      own.gates = RowsAt(whole.gates, own_rows, ctx);
      own.keep = RowsAt(whole.keep, own_rows, ctx);
    } else if (t != t_whole) {
      own.logits = whole.logits.Slice(lo, hi);
      own.probs = whole.probs.Slice(lo, hi);
      own.scores = whole.scores.Slice(lo, hi);
      own.indices = whole.indices.Slice(lo, hi);
      own.gates = whole.gates.Slice(lo, hi);
      own.keep = whole.keep.Slice(lo, hi);
    }
    // The aux and z terms of these rows, with the whole group's f and T.
    Tensor dprobs = OwnBalanceGrad(terms[g], config, daux[g], t, t_whole, lo, own_rows, dev, ctx);
    // The z-loss's gradient, written whole; none at coef 0 (RouterBackward then adds none).
    Tensor dlogits;
    if (config.z_loss_coef != 0.0f) {
      dlogits = Tensor::Empty({t, e}, DType::kF32, dev);
      ZLossBackward(own.logits, config.z_loss_coef, dz[g], dlogits, kernels::Write::kSet,
                    t == t_whole ? 0 : t_whole, ctx);
    }
    Tensor dh_g = dh.Slice(g * t, (g + 1) * t);
    RouterBackward(own, wr, config, dgates.Slice(g * t, (g + 1) * t), dprobs, dlogits, dh_g, dwr,
                   ctx);
  }
}

}  // namespace switchyard::moe
