// Hot-expert replication (moe/replication.h): the plan, the dispatch destinations and the
// replica slots' weight and gradient exchanges.
#include "moe/replication.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>
#include <utility>

#include "engine/core/check.h"
#include "kernels/elementwise.h"

namespace switchyard::moe {
namespace {

uint64_t SplitMix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// The shares of `count` rows poured onto `loads` by water-filling (header comment).
std::vector<double> WaterFill(const std::vector<double>& loads, double count) {
  const int64_t n = static_cast<int64_t>(loads.size());
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return loads[a] < loads[b]; });
  double prefix = 0, level = 0;
  int64_t m = 0;
  while (m < n) {
    prefix += loads[order[m]];
    ++m;
    level = (count + prefix) / static_cast<double>(m);
    if (m == n || level <= loads[order[m]]) break;
  }
  std::vector<double> share(n, 0.0);
  for (int64_t i = 0; i < m; ++i) share[order[i]] = std::max(0.0, level - loads[order[i]]);
  return share;
}

// The parameters of `e` that exist, in the order w1, w2, w3, b1, b2 (values or gradients).
std::vector<Tensor> ParamsOf(const Experts& e, bool grads) {
  std::vector<Tensor> all = grads ? std::vector<Tensor>{e.grad_w1(), e.grad_w2(), e.grad_w3(),
                                                        e.grad_b1(), e.grad_b2()}
                                  : std::vector<Tensor>{e.w1(), e.w2(), e.w3(), e.b1(), e.b2()};
  std::vector<Tensor> out;
  for (Tensor& t : all)
    if (t.defined()) out.push_back(std::move(t));
  return out;
}

ExpertsOptions SlotOptions(const ExpertsOptions& owned, int64_t slots) {
  SY_CHECK(owned.hidden_whole() == owned.d_hidden)
      << "expert replication does not support a hidden split (parallel.etp > 1)";
  ExpertsOptions o = owned;
  o.first = 0;
  o.num_local = std::max<int64_t>(slots, 1);
  o.num_experts = o.num_local;
  o.adds_output_bias = true;
  return o;
}

}  // namespace

int32_t ReplicaKey(int64_t token, int64_t slot, int64_t top_k) {
  const uint64_t h = SplitMix64(static_cast<uint64_t>(token * top_k + slot));
  return static_cast<int32_t>(h & static_cast<uint64_t>(kReplicaQuota - 1));
}

ReplicaPlan::ReplicaPlan(int64_t num_experts, int64_t ep)
    : num_experts_(num_experts), ep_(ep), entry_of_(num_experts, -1) {
  SY_CHECK(ep >= 1 && num_experts >= 1 && num_experts % ep == 0)
      << "ReplicaPlan: " << num_experts << " experts over ep=" << ep;
}

ReplicaPlan ReplicaPlan::Balance(std::span<const int64_t> counts, int64_t ep, int64_t hot) {
  const int64_t e_count = static_cast<int64_t>(counts.size());
  ReplicaPlan plan(e_count, ep);
  if (hot <= 0 || ep == 1) return plan;
  const int64_t el = e_count / ep;
  std::vector<double> loads(ep, 0.0);
  for (int64_t e = 0; e < e_count; ++e) loads[e / el] += static_cast<double>(counts[e]);
  std::vector<int64_t> order(e_count);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return counts[a] > counts[b]; });
  std::vector<int64_t> next_slot(ep, 0);
  const double min_share = std::accumulate(loads.begin(), loads.end(), 0.0) / ep / 16;
  for (int64_t i = 0; i < std::min(hot, e_count); ++i) {
    const int64_t e = order[i];
    const double c = static_cast<double>(counts[e]);
    if (c <= 0) break;
    const int owner = static_cast<int>(e / el);
    loads[owner] -= c;
    // Water-filling over the candidate ranks; a replica that would take less than 1/16
    // of the mean rank load is not worth a copy of the weights: the smallest such drops
    // out and the others are filled again.
    std::vector<bool> candidate(ep, true);
    std::vector<double> share;
    for (bool changed = true; changed;) {
      std::vector<double> masked = loads;
      for (int r = 0; r < ep; ++r)
        if (!candidate[r]) masked[r] = std::numeric_limits<double>::infinity();
      share = WaterFill(masked, c);
      // Drop the smallest such share (ties: the larger rank), then fill again.
      int drop = -1;
      for (int r = 0; r < ep; ++r) {
        if (r != owner && candidate[r] && share[r] > 0 && share[r] < min_share &&
            (drop < 0 || share[r] <= share[drop]))
          drop = r;
      }
      changed = drop >= 0;
      if (changed) candidate[drop] = false;
    }
    // The owner first, then the replicas by rank; quotas from the cumulative shares.
    ReplicatedExpert entry{.expert = e, .copies = {}};
    std::vector<int> ranks = {owner};
    for (int r = 0; r < ep; ++r)
      if (r != owner && share[r] > 0) ranks.push_back(r);
    double cumulative = 0;
    int32_t previous = 0;
    for (size_t j = 0; j < ranks.size(); ++j) {
      cumulative += share[ranks[j]];
      const int32_t upto = j + 1 == ranks.size()
                               ? kReplicaQuota
                               : static_cast<int32_t>(std::llround(kReplicaQuota * cumulative / c));
      if (j > 0 && upto == previous) continue;  // an empty interval: no replica
      entry.copies.push_back(ExpertCopy{.rank = ranks[j], .slot = -1, .upto = upto,
                                        .share = c * (upto - previous) / kReplicaQuota});
      previous = upto;
    }
    for (const ExpertCopy& copy : entry.copies) loads[copy.rank] += copy.share;
    if (entry.copies.size() == 1) continue;  // the owner keeps it all
    for (size_t j = 1; j < entry.copies.size(); ++j)
      entry.copies[j].slot = next_slot[entry.copies[j].rank]++;
    plan.entry_of_[e] = static_cast<int32_t>(plan.experts_.size());
    plan.experts_.push_back(std::move(entry));
  }
  plan.slots_ = *std::max_element(next_slot.begin(), next_slot.end());
  return plan;
}

int32_t ReplicaPlan::Destination(int64_t expert, int32_t key) const {
  SY_CHECK(expert >= 0 && expert < num_experts_) << "expert " << expert << " of " << num_experts_;
  const int64_t el = experts_per_rank(), ls = local_slots();
  const int32_t entry = entry_of_.empty() ? -1 : entry_of_[expert];
  if (entry < 0) return static_cast<int32_t>((expert / el) * ls + expert % el);
  for (const ExpertCopy& copy : experts_[entry].copies) {
    if (key < copy.upto) {
      return static_cast<int32_t>(copy.rank * ls + (copy.slot < 0 ? expert % el : el + copy.slot));
    }
  }
  SY_CHECK(false) << "replica key " << key << " outside [0, " << kReplicaQuota << ")";
  return -1;
}

int64_t ReplicaPlan::ExpertInSlot(int rank, int64_t slot) const {
  for (const ReplicatedExpert& r : experts_)
    for (const ExpertCopy& c : r.copies)
      if (c.rank == rank && c.slot == slot) return r.expert;
  return -1;
}

std::vector<double> ReplicaPlan::PlannedLoads(std::span<const int64_t> counts) const {
  SY_CHECK_EQ(static_cast<int64_t>(counts.size()), num_experts_);
  std::vector<double> loads(ep_, 0.0);
  const int64_t el = experts_per_rank();
  for (int64_t e = 0; e < num_experts_; ++e) {
    const int32_t entry = entry_of_[e];
    if (entry < 0) {
      loads[e / el] += static_cast<double>(counts[e]);
      continue;
    }
    int32_t previous = 0;
    for (const ExpertCopy& c : experts_[entry].copies) {
      loads[c.rank] += static_cast<double>(counts[e]) * (c.upto - previous) / kReplicaQuota;
      previous = c.upto;
    }
  }
  return loads;
}

std::string ReplicaPlan::ToString() const {
  if (experts_.empty()) return "none";
  std::ostringstream out;
  for (size_t i = 0; i < experts_.size(); ++i) {
    if (i) out << "; ";
    out << "e" << experts_[i].expert << " ->";
    int32_t previous = 0;
    for (const ExpertCopy& c : experts_[i].copies) {
      out << " r" << c.rank << " (" << static_cast<double>(c.upto - previous) / kReplicaQuota
          << ")";
      previous = c.upto;
    }
  }
  return out.str();
}

bool ReplicaPlan::operator==(const ReplicaPlan& o) const {
  if (num_experts_ != o.num_experts_ || ep_ != o.ep_ || slots_ != o.slots_ ||
      experts_.size() != o.experts_.size())
    return false;
  for (size_t i = 0; i < experts_.size(); ++i) {
    const ReplicatedExpert &a = experts_[i], &b = o.experts_[i];
    if (a.expert != b.expert || a.copies.size() != b.copies.size()) return false;
    for (size_t j = 0; j < a.copies.size(); ++j) {
      if (a.copies[j].rank != b.copies[j].rank || a.copies[j].slot != b.copies[j].slot ||
          a.copies[j].upto != b.copies[j].upto)
        return false;
    }
  }
  return true;
}

Tensor ReplicaDestinations(const ReplicaPlan& plan, const Tensor& experts,
                           std::span<const int64_t> row_tokens, DeviceContext* ctx) {
  SY_CHECK(experts.defined() && experts.ndim() == 2 && experts.dtype() == DType::kI32 &&
           experts.dim(0) == static_cast<int64_t>(row_tokens.size()))
      << "ReplicaDestinations: experts " << experts.DebugString() << " for "
      << row_tokens.size() << " rows";
  const int64_t n = experts.dim(0), k = experts.dim(1);
  const Tensor host = experts.ToHost("moe.replica_destinations", ctx);
  Tensor out = Tensor::Empty({n, k}, DType::kI32);
  const int32_t* in = host.data<int32_t>();
  int32_t* dst = out.data<int32_t>();
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t j = 0; j < k; ++j) {
      dst[t * k + j] = plan.Destination(in[t * k + j], ReplicaKey(row_tokens[t], j, k));
    }
  }
  return experts.device().is_cpu() ? out : out.To(experts.device(), ctx);
}

ReplicaPlanner::ReplicaPlanner(int64_t hot, int64_t every, int64_t ep)
    : hot_(hot), every_(every), ep_(ep) {
  SY_CHECK(hot >= 0 && every >= 1 && ep >= 1)
      << "ReplicaPlanner(hot=" << hot << ", every=" << every << ", ep=" << ep << ")";
}

std::vector<ReplicaPlan> ReplicaPlanner::AddStep(const std::vector<std::vector<int64_t>>& counts) {
  if (window_.empty()) {
    for (const std::vector<int64_t>& c : counts) window_.emplace_back(c.size(), 0);
  }
  SY_CHECK_EQ(window_.size(), counts.size()) << "ReplicaPlanner: the number of MoE layers changed";
  for (size_t l = 0; l < counts.size(); ++l) {
    SY_CHECK_EQ(window_[l].size(), counts[l].size());
    for (size_t e = 0; e < counts[l].size(); ++e) window_[l][e] += counts[l][e];
  }
  if (++steps_ % every_ != 0) return {};
  std::vector<ReplicaPlan> plans;
  for (std::vector<int64_t>& w : window_) {
    plans.push_back(ReplicaPlan::Balance(w, ep_, hot_));
    std::fill(w.begin(), w.end(), 0);
  }
  return plans;
}

namespace {

// Walks every extra copy of every replicated expert in the plan's order, the same on every
// rank, so that the k-th message between two ranks is the same tensor on both sides. For
// each of the `params` parameters p of a copy: on the expert's owner owned(p, e, peer), e the
// expert's local index and peer the copy's rank; on the copy's rank replica(p, slot, owner).
template <typename Owned, typename Replica>
void WalkCopies(const ReplicaPlan& plan, int rank, size_t params, Owned owned,
                Replica replica) {
  const int64_t el = plan.experts_per_rank();
  for (const ReplicatedExpert& r : plan.replicated()) {
    const int owner = static_cast<int>(r.expert / el);
    for (size_t j = 1; j < r.copies.size(); ++j) {
      const ExpertCopy& c = r.copies[j];
      for (size_t p = 0; p < params; ++p) {
        if (rank == owner) {
          owned(p, r.expert % el, c.rank);
        } else if (rank == c.rank) {
          replica(p, c.slot, owner);
        }
      }
    }
  }
}

}  // namespace

ExpertReplicas::ExpertReplicas(const ReplicaPlan& plan, int rank, const ExpertsOptions& owned,
                               DeviceContext* ctx)
    : plan_(plan), rank_(rank), experts_(SlotOptions(owned, plan.slots()), ctx) {}

void ExpertReplicas::PullWeights(const Experts& owned, dist::Communicator& ep,
                                 DeviceContext* ctx) {
  SY_CHECK_EQ(ep.size(), plan_.ep()) << "replica plan built for another ep group";
  const std::vector<Tensor> mine = ParamsOf(owned, false), slots = ParamsOf(experts_, false);
  std::vector<dist::P2POp> ops;
  WalkCopies(
      plan_, rank_, mine.size(),
      [&](size_t p, int64_t e, int peer) {
        ops.push_back({dist::P2POp::kSend, mine[p].Slice(e, e + 1), peer});
      },
      [&](size_t p, int64_t slot, int owner) {
        ops.push_back({dist::P2POp::kRecv, slots[p].Slice(slot, slot + 1), owner});
      });
  if (ctx != nullptr) ctx->Synchronize();
  if (!ops.empty()) ep.BatchSendRecv(ops)->Wait();
}

void ExpertReplicas::PushGradients(Experts& owned, dist::Communicator& ep, DeviceContext* ctx) {
  SY_CHECK_EQ(ep.size(), plan_.ep()) << "replica plan built for another ep group";
  const std::vector<Tensor> mine = ParamsOf(owned, true), slots = ParamsOf(experts_, true);
  std::vector<dist::P2POp> ops;
  // The owner's incoming partial gradients, added after the exchange in the plan's order.
  std::vector<std::pair<Tensor, Tensor>> adds;  // (received, owner's gradient slice)
  WalkCopies(
      plan_, rank_, mine.size(),
      [&](size_t p, int64_t e, int peer) {
        Tensor target = mine[p].Slice(e, e + 1);
        Tensor in = Tensor::Empty(target.shape(), DType::kF32, target.device());
        ops.push_back({dist::P2POp::kRecv, in, peer});
        adds.emplace_back(in, target);
      },
      [&](size_t p, int64_t slot, int owner) {
        ops.push_back({dist::P2POp::kSend, slots[p].Slice(slot, slot + 1), owner});
      });
  if (ctx != nullptr) ctx->Synchronize();
  if (!ops.empty()) ep.BatchSendRecv(ops)->Wait();
  for (auto& [in, target] : adds) kernels::Axpy(1.0f, in, target, ctx);
  experts_.ZeroGrad(ctx);
}

}  // namespace switchyard::moe
