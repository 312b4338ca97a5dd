#include "moe/moe_stats.h"

#include <algorithm>

#include "engine/core/check.h"
#include "engine/core/step_readback.h"
#include "engine/core/tensor.h"
#include "engine/dist/ordered_sum.h"
#include "kernels/permute.h"
#include "moe/row_index.h"

namespace switchyard::moe {

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
  pending_counts.insert(pending_counts.end(), o.pending_counts.begin(), o.pending_counts.end());
  tokens += o.tokens;
  assignments += o.assignments;
  entropy_sum += o.entropy_sum;
  aux_sum += o.aux_sum;
  z_sum += o.z_sum;
  lse_sq_sum += o.lse_sq_sum;
  groups += o.groups;
}

void MoEStats::Resolve(std::span<const double> slots) {
  const int64_t e = static_cast<int64_t>(tokens_per_expert.size());
  for (const PendingCounts& p : pending_counts) {
    SY_CHECK_LE(p.first + e + 1, static_cast<int64_t>(slots.size())) << "MoEStats::Resolve";
    SY_CHECK_EQ(slots[p.first + e], 0.0) << "expert indices outside [0, " << e << ")";
    for (int64_t i = 0; i < e; ++i) {
      const int64_t c = static_cast<int64_t>(slots[p.first + i]);
      tokens_per_expert[i] += c;
      if (p.kept) tokens_per_expert_kept[i] += c;
    }
    if (p.kept_first >= 0) {
      SY_CHECK_LE(p.kept_first + e + 1, static_cast<int64_t>(slots.size())) << "MoEStats::Resolve";
      SY_CHECK_EQ(slots[p.kept_first + e], 0.0) << "expert indices outside [0, " << e << ")";
      for (int64_t i = 0; i < e; ++i) {
        tokens_per_expert_kept[i] += static_cast<int64_t>(slots[p.kept_first + i]);
      }
    }
  }
  pending_counts.clear();
  entropy_sum.Resolve(slots);
  aux_sum.Resolve(slots);
  z_sum.Resolve(slots);
  lse_sq_sum.Resolve(slots);
}

void MoEStats::AllReduce(dist::Communicator& comm, DeviceContext* ctx) {
  SY_CHECK(pending_counts.empty()) << "MoEStats::AllReduce before the step's readback";
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
  // Floating sums: exact ordered f64 sums (the same totals on any layout).
  const double local[4] = {entropy_sum, aux_sum, z_sum, lse_sq_sum};
  const std::vector<double> sums = dist::AllReduceDoubles(comm, local);
  const int64_t* ip = it.data<int64_t>();
  std::copy(ip, ip + e, tokens_per_expert.begin());
  std::copy(ip + e, ip + 2 * e, tokens_per_expert_kept.begin());
  tokens = ip[2 * e];
  assignments = ip[2 * e + 1];
  groups = ip[2 * e + 2];
  entropy_sum = sums[0];
  aux_sum = sums[1];
  z_sum = sums[2];
  lse_sq_sum = sums[3];
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
double MoEStats::router_lse_sq() const { return groups ? lse_sq_sum / groups : 0.0; }

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

namespace {

// RoutingStats' token statistics (tokens, assignments, per-expert counts before and after
// dropping, entropy) again, of the own rows whose group token is < valid only: the rows
// picked by index and counted as the tp path counts its rows.
void CountValidRows(const RoutedGroups& routed, const OwnRouting& own, int64_t valid,
                    DeviceContext* ctx, MoEStats& s) {
  const int64_t e = static_cast<int64_t>(s.tokens_per_expert.size());
  const int64_t t = routed.local_tokens(), T = routed.group_tokens, lo = routed.own_begin();
  std::vector<int64_t> own_tokens;  // (t) the group token of each own row of a group
  if (routed.own_rows.defined()) {
    own_tokens = routed.own_rows.ToHost("moe.valid_rows", ctx).ToVector<int64_t>();
  } else {
    for (int64_t i = 0; i < t; ++i) own_tokens.push_back(lo + i);
  }
  s.tokens_per_expert.assign(e, 0);
  s.tokens_per_expert_kept.assign(e, 0);
  s.pending_counts.clear();
  s.entropy_sum = 0;
  std::vector<int64_t> rows;  // own rows (over every group) that count
  for (int64_t g = 0; g < routed.groups; ++g) {
    std::vector<int64_t> tokens;  // their tokens in group g
    for (int64_t i = 0; i < t; ++i) {
      if (g * T + own_tokens[i] >= valid) continue;
      rows.push_back(g * t + i);
      tokens.push_back(own_tokens[i]);
    }
    if (tokens.empty()) continue;
    const Tensor& probs = routed.router[g].probs;
    s.entropy_sum +=
        kernels::EntropySum(RowsAt(probs, IndexOn(tokens, probs.device(), ctx), ctx), ctx);
  }
  s.tokens = static_cast<int64_t>(rows.size());
  s.assignments = s.tokens * routed.top_k;
  if (rows.empty()) return;
  const Tensor index = IndexOn(rows, own.experts.device(), ctx);
  const Tensor experts = RowsAt(own.experts, index, ctx);
  CountAssignments(experts, s.tokens_per_expert, ctx);
  const std::vector<int64_t> slots =
      SlotExpertCounts(experts, RowsAt(own.kept, index, ctx), e, ctx);  // (k, E)
  for (size_t j = 0; j < slots.size(); ++j) s.tokens_per_expert_kept[j % e] += slots[j];
}

// EntropySum of probs; in a training step left on the device until the step's readback.
PendingSum EntropyOf(const Tensor& probs, DeviceContext* ctx) {
  if (StepReadback* readback = ctx != nullptr ? ctx->step_readback() : nullptr) {
    StepReadback::Slots slot = readback->Reserve(1, probs.device(), ctx);
    kernels::EntropySumInto(probs, slot.values, ctx);
    return PendingSum::Slot(slot.first);
  }
  return kernels::EntropySum(probs, ctx);
}

}  // namespace

MoEStats RoutingStats(const RoutedGroups& routed, const OwnRouting& own, int64_t num_experts,
                      DeviceContext* ctx, int64_t valid_tokens) {
  const int64_t e = num_experts, t = routed.local_tokens();
  const int64_t lo = routed.own_begin(), hi = lo + t;
  MoEStats s;
  s.tokens_per_expert.assign(e, 0);
  s.tokens_per_expert_kept.assign(e, 0);
  if (routed.tp_size == 1) {
    // The whole groups are this rank's rows: their counts are at hand.
    for (int64_t g = 0; g < routed.groups; ++g) {
      const LoadBalanceSums& balance = routed.balance[g];
      const Admission& admission = routed.admission[g];
      if (balance.on_device()) {  // a training step: the counts come with its readback
        const bool kept = admission.counts_slot >= 0;
        s.pending_counts.push_back({.first = balance.values_slot + 1, .kept = kept,
                                    .kept_first = admission.kept_slot});
        if (!kept && admission.kept_slot < 0) {
          for (int64_t i = 0; i < e; ++i) s.tokens_per_expert_kept[i] += admission.counts_after[i];
        }
        continue;
      }
      for (int64_t i = 0; i < e; ++i) {
        s.tokens_per_expert[i] += balance.assignments[i];
        s.tokens_per_expert_kept[i] += admission.counts_after[i];
      }
    }
  } else if (own.experts.numel() > 0) {
    CountAssignments(own.experts, s.tokens_per_expert, ctx);
    const std::vector<int64_t> slots = SlotExpertCounts(own.experts, own.kept, e, ctx);  // (k, E)
    for (size_t j = 0; j < slots.size(); ++j) s.tokens_per_expert_kept[j % e] += slots[j];
  }
  for (int64_t g = 0; g < routed.groups; ++g) {
    const Tensor& probs = routed.router[g].probs;
    Tensor own_probs = probs;
    if (routed.own_rows.defined()) {
      own_probs = Tensor::Empty({t, probs.dim(1)}, DType::kF32, probs.device());
      kernels::GatherRows(probs, routed.own_rows, own_probs, ctx);
    } else if (routed.tp_size > 1) {
      own_probs = probs.Slice(lo, hi);
    }
    s.entropy_sum += EntropyOf(own_probs, ctx);
  }
  s.tokens = routed.groups * t;
  s.assignments = s.tokens * routed.top_k;
  if (routed.tp_rank == 0) {
    s.groups = routed.groups;
    for (int64_t g = 0; g < routed.groups; ++g) {
      s.aux_sum += routed.aux[g];
      s.z_sum += routed.z[g];
      s.lse_sq_sum += routed.lse_sq[g];
    }
  }
  if (valid_tokens >= 0 && valid_tokens < routed.groups * routed.group_tokens) {
    CountValidRows(routed, own, valid_tokens, ctx, s);  // padding rows left out
  }
  return s;
}

MoEGroupValues GroupValuesOf(const RoutedGroups& routed, int64_t top_k) {
  MoEGroupValues v;
  v.aux = routed.aux;
  v.z = routed.z;
  for (const Admission& a : routed.admission) {
    // A training step's counts: in its readback.
    if (a.counts_slot >= 0 || a.kept_slot >= 0) return v;
  }
  for (int64_t g = 0; g < routed.groups; ++g) {
    const std::vector<int64_t>& kept = routed.admission[g].counts_after;
    int64_t total = 0;
    for (int64_t c : kept) total += c;
    v.tokens_per_expert_kept.insert(v.tokens_per_expert_kept.end(), kept.begin(), kept.end());
    v.dropped.push_back(routed.group_tokens * top_k - total);
  }
  return v;
}

}  // namespace switchyard::moe
