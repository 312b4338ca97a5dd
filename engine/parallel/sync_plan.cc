#include "engine/parallel/sync_plan.h"

#include <algorithm>
#include <unordered_map>
#include <utility>

#include "engine/core/check.h"

namespace switchyard::parallel {

SyncPolicy SyncPolicyFor(const SyncSettings& s) {
  SY_CHECK(s.zero_stage >= 0 && s.zero_stage <= 3) << "ZeRO stage " << s.zero_stage;
  SyncPolicy p;
  p.zero_stage = s.zero_stage;
  p.ordered_accum = s.ordered_grad_accum && s.grad_accum > 1;
  p.reduce_during_backward = !p.ordered_accum && !(s.zero_stage == 1 && s.pp > 1);
  p.reduce_scatter = s.zero_stage >= 1;
  p.persistent_shard = s.zero_stage >= 2;
  p.stream = s.zero_stage >= 2 && !p.ordered_accum && !(s.pp > 1 && s.tied_embeddings);
  p.buckets_by_part = s.zero_stage >= 3 || p.stream;
  p.tied_alone = s.zero_stage >= 1;
  p.max_in_flight = p.stream ? 1 : 2;
  return p;
}

SyncParam SyncParamOf(const Parameter& p, int part) {
  SyncParam s{.name = p.name, .view = p.view, .grad_sum = p.grad_sum, .trainable = p.trainable,
              .part = part, .tied = p.tied};
  if (p.trainable) {
    SY_CHECK(p.grad.defined()) << p.name << " has no gradient";
    s.numel = p.grad.numel();
    s.dtype = p.grad.dtype();
  }
  return s;
}

std::vector<int> BucketKeys(const SyncPolicy& policy, const std::vector<SyncParam>& params,
                            int n_parts) {
  std::vector<int> keys(params.size(), -1);
  for (size_t i = 0; i < params.size(); ++i) {
    if (policy.buckets_by_part) keys[i] = params[i].part;
    if (policy.tied_alone && params[i].tied) keys[i] = n_parts;
  }
  return keys;
}

int MeshGroupSize(const dist::Mesh& mesh, dist::View view, AxisSet axes) {
  int size = 1;
  for (dist::Axis axis : axes.Axes()) size *= mesh.Size(view, axis);
  return size;
}

std::vector<SyncGroup> PackBuckets(const std::vector<SyncParam>& params,
                                   const std::vector<int>& keys, int64_t bucket_bytes,
                                   const GroupSize& group_size) {
  SY_CHECK(bucket_bytes > 0) << "bucket_bytes " << bucket_bytes;
  SY_CHECK(keys.empty() || keys.size() == params.size())
      << keys.size() << " bucket keys for " << params.size() << " parameters";
  // The distinct (view, axes) of the trainable parameters, in first-seen order.
  std::vector<SyncGroup> groups;
  for (const SyncParam& p : params) {
    if (!p.trainable || p.grad_sum.empty()) continue;
    auto same = [&](const SyncGroup& g) { return g.view == p.view && g.axes == p.grad_sum; };
    if (std::find_if(groups.begin(), groups.end(), same) != groups.end()) continue;
    const int size = group_size(p.view, p.grad_sum);
    // Remembered with size 1 too, so it is asked once; dropped below.
    groups.push_back({.view = p.view, .axes = p.grad_sum, .size = size});
  }
  std::erase_if(groups, [](const SyncGroup& g) { return g.size == 1; });
  for (SyncGroup& group : groups) {
    // The open (still filling) bucket of each dtype, as an index into group.buckets.
    std::vector<std::pair<DType, size_t>> open;
    for (size_t i = params.size(); i-- > 0;) {
      const SyncParam& p = params[i];
      if (!p.trainable || p.view != group.view || !(p.grad_sum == group.axes)) continue;
      const int64_t bytes = p.numel * static_cast<int64_t>(SizeOf(p.dtype));
      const int key = keys.empty() ? -1 : keys[i];
      auto it = std::find_if(open.begin(), open.end(), [&](auto& o) { return o.first == p.dtype; });
      if (it != open.end()) {
        const SyncBucket& b = group.buckets[it->second];
        if (b.bytes() + bytes > bucket_bytes || b.key != key) {
          open.erase(it);
          it = open.end();
        }
      }
      if (it == open.end()) {
        group.buckets.push_back({.dtype = p.dtype, .key = key});
        open.emplace_back(p.dtype, group.buckets.size() - 1);
        it = open.end() - 1;
      }
      SyncBucket& b = group.buckets[it->second];
      b.params.push_back(i);
      b.offsets.push_back(b.elements);
      b.elements += p.numel;
    }
  }
  return groups;
}

std::vector<BucketRef> LaunchOrder(const std::vector<SyncGroup>& groups,
                                   const std::vector<SyncParam>& params,
                                   const std::vector<int>& part_done) {
  // Where each parameter is packed, and each bucket's parameters not yet ready.
  std::vector<BucketRef> where(params.size(), {-1, -1});
  std::vector<std::vector<int>> pending(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (size_t b = 0; b < groups[g].buckets.size(); ++b) {
      for (size_t i : groups[g].buckets[b].params) where[i] = {int(g), int(b)};
      pending[g].push_back(static_cast<int>(groups[g].buckets[b].params.size()));
    }
  }
  // Each part's packed parameters in registration order, so a finished part costs its own
  // parameters, not a pass over all of them (thousands of layers: quadratic otherwise).
  std::unordered_map<int, std::vector<size_t>> of_part;
  for (size_t i = 0; i < params.size(); ++i) {
    if (where[i].group >= 0) of_part[params[i].part].push_back(i);
  }
  std::vector<size_t> next(groups.size(), 0);
  std::vector<BucketRef> order;
  for (int part : part_done) {
    auto found = of_part.find(part);
    if (found == of_part.end()) continue;
    for (size_t i : found->second) {
      const int g = where[i].group;
      if (--pending[g][where[i].bucket] != 0) continue;
      while (next[g] < groups[g].buckets.size() && pending[g][next[g]] == 0) {
        order.push_back({g, static_cast<int>(next[g]++)});
      }
    }
  }
  size_t all = 0;
  for (const SyncGroup& g : groups) all += g.buckets.size();
  SY_CHECK(order.size() == all) << "LaunchOrder: " << all - order.size()
                                << " buckets hold parameters of no finished part";
  return order;
}

std::vector<BucketRef> SyncLaunchOrder(const SyncPolicy& policy,
                                       const std::vector<SyncGroup>& groups,
                                       const std::vector<SyncParam>& params,
                                       const std::vector<int>& part_done) {
  if (policy.reduce_during_backward) return LaunchOrder(groups, params, part_done);
  std::vector<BucketRef> order;
  for (size_t g = 0; g < groups.size(); ++g)
    for (size_t b = 0; b < groups[g].buckets.size(); ++b) order.push_back({int(g), int(b)});
  return order;
}

}  // namespace switchyard::parallel
