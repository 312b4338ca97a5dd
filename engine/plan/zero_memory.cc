#include "engine/plan/zero_memory.h"

#include <algorithm>
#include <map>

#include "engine/config/sync_settings.h"
#include "engine/model/param_table.h"
#include "engine/parallel/sync_plan.h"
#include "engine/plan/dry_run.h"

namespace switchyard::plan {
namespace {

// One bucket: its bytes, its group's size, and the part of its parameters (one part each
// when the policy cuts buckets by part).
struct Bucket {
  double bytes = 0, group = 1;
  int part = 0;
};

// The buckets of `sync` in launch order.
std::vector<Bucket> LaunchedBuckets(const RankSync& sync) {
  std::vector<Bucket> out;
  for (const parallel::BucketRef& at : sync.launch) {
    const parallel::SyncGroup& g = sync.groups[at.group];
    const parallel::SyncBucket& b = g.buckets[at.bucket];
    out.push_back({.bytes = double(b.bytes()), .group = double(g.size),
                   .part = sync.params[b.params.front()].part});
  }
  return out;
}

// The rank's parts with buckets in backward order, each with its buckets (by part:
// streaming, stage 3). A part none of whose parameters is summed over more than one rank
// has nothing to gather or send.
std::vector<ZeroPart> PartsOf(const RankSync& sync) {
  std::vector<std::vector<double>> of_part(sync.parts.size());  // launch order within each
  for (const Bucket& b : LaunchedBuckets(sync)) of_part[b.part].push_back(b.bytes);
  std::vector<ZeroPart> parts;
  for (int id : sync.backward) {
    if (of_part[id].empty()) continue;
    ZeroPart part{.name = sync.parts[id].Name(), .buckets = of_part[id]};
    for (double b : part.buckets) part.bytes += b;
    parts.push_back(part);
  }
  return parts;
}

// The most two consecutive buckets hold at once, each `per(b)` bytes.
template <typename F>
double LargestPair(const std::vector<Bucket>& buckets, F per) {
  double most = 0;
  for (size_t i = 0; i < buckets.size(); ++i)
    most = std::max(most, per(buckets[i]) + (i + 1 < buckets.size() ? per(buckets[i + 1]) : 0));
  return most;
}

// Streaming: one micro-batch's backward (and, at stage 3, its forward), part by part.
double StreamPeak(const std::vector<ZeroPart>& parts, bool stage3, bool tied) {
  double live = 0, inflight = 0, peak = 0;
  auto at = [&](double extra) { peak = std::max(peak, live + inflight + extra); };
  auto bytes_of = [&](const std::string& name) {
    for (const ZeroPart& p : parts)
      if (p.name == name) return p.bytes;
    return 0.0;
  };
  const bool tied_here = tied && bytes_of("embed") > 0 && parts.front().name != "embed";
  if (stage3) {  // the forward: a part's gather unpacked, then it beside the next's receive
    for (size_t k = parts.size(); k-- > 0;) {
      const double p = parts[k].bytes, next = k > 0 ? parts[k - 1].bytes : 0;
      peak = std::max({peak, 2 * p, p + next});
    }
  }
  // The head's part stays gathered from the forward (tied: the table).
  const std::string head = tied_here ? "embed" : parts.front().name;
  std::vector<std::string> resident;
  if (stage3) {
    resident.push_back(head);
    live += bytes_of(head);
  }
  if (tied_here) live += bytes_of("embed");  // the table's gradient, begun at the head
  if (tied_here && stage3) {
    at(0);
    live -= bytes_of("embed");  // released after the head
    resident.clear();
  }
  double pending = 0;  // a prefetched part's receive buffer
  for (size_t k = 0; k < parts.size(); ++k) {
    const ZeroPart& part = parts[k];
    const bool grads_begun = tied_here && part.name == "embed";
    if (stage3) {
      if (std::find(resident.begin(), resident.end(), part.name) == resident.end()) {
        at(part.bytes);  // unpacked beside its receive buffer
        live += part.bytes - pending;
        pending = 0;
      }
      if (k + 1 < parts.size()) {
        inflight = 0;  // ZeroShards::Acquire completes the bucket in flight first
        pending = parts[k + 1].bytes;
        live += pending;
      }
    }
    if (!grads_begun) live += part.bytes;
    at(0);
    if (stage3) live -= part.bytes;  // released before its buckets go
    for (double b : part.buckets) {
      inflight = 0;  // max_in_flight 1
      at(b);         // the packed copy beside the gradients
      live -= b;
      inflight = 2 * b;
      at(0);
    }
  }
  return peak;
}

}  // namespace

RankSync PlanRankSync(const config::Config& c, const dist::Mesh& mesh, int rank) {
  return PlanRankSync(c, mesh, rank, HeldParams(c, mesh, rank));
}

RankSync PlanRankSync(const config::Config& c, const dist::Mesh& mesh, int rank,
                      const std::vector<HeldParam>& held) {
  RankSync r;
  std::map<parallel::PartId, int> index;  // r.parts' positions
  for (const HeldParam& p : held) {
    auto [it, added] = index.try_emplace(p.shape.part, static_cast<int>(r.parts.size()));
    if (added) r.parts.push_back(p.shape.part);
    r.params.push_back({.name = p.shape.Name(), .numel = p.numel, .view = p.shape.view(),
                        .grad_sum = p.grad_sum, .part = it->second, .tied = p.tied});
  }
  const std::vector<model::Stage> chunks =
      RankStages(c, mesh.Coord(rank, dist::View::kDense, dist::Axis::kPp));
  for (const parallel::PartId& part :
       model::BackwardParts(chunks, c.model.n_layers, c.model.tie_embeddings)) {
    auto it = index.find(part);
    if (it != index.end()) r.backward.push_back(it->second);
  }
  const parallel::SyncPolicy policy = config::SyncPolicyOf(c);
  r.groups = parallel::PackBuckets(
      r.params, parallel::BucketKeys(policy, r.params, static_cast<int>(r.parts.size())),
      c.train.bucket_bytes(), [&](dist::View view, parallel::AxisSet axes) {
        return parallel::MeshGroupSize(mesh, view, axes);
      });
  r.launch = parallel::SyncLaunchOrder(policy, r.groups, r.params, r.backward);
  return r;
}

std::vector<ZeroPart> RankZeroParts(const config::Config& c, const dist::Mesh& mesh, int rank) {
  return PartsOf(PlanRankSync(c, mesh, rank));
}

ZeroWorkspace PredictZeroWorkspace(const config::Config& c, const dist::Mesh& mesh, int rank) {
  return PredictZeroWorkspace(c, mesh, rank, HeldParams(c, mesh, rank));
}

ZeroWorkspace PredictZeroWorkspace(const config::Config& c, const dist::Mesh& mesh, int rank,
                                   const std::vector<HeldParam>& held) {
  const int stage = c.parallel.zero_stage;
  const parallel::SyncPolicy policy = config::SyncPolicyOf(c);
  const bool stream = policy.stream;
  const RankSync sync = PlanRankSync(c, mesh, rank, held);
  const std::vector<Bucket> buckets = LaunchedBuckets(sync);
  ZeroWorkspace w;
  if (buckets.empty()) return w;
  if (stage == 0) {
    // All-reduces complete in Finish: all in flight when launched during the last backward,
    // one at a time under ordered accumulation (SyncAll).
    for (const Bucket& b : buckets) {
      if (policy.ordered_accum) {
        w.sync = std::max(w.sync, 2 * b.bytes);
      } else {
        w.sync += 2 * b.bytes;
      }
    }
  } else if (!stream) {
    w.sync = LargestPair(buckets, [&](const Bucket& b) {
      return 2 * b.bytes + (stage == 1 ? b.bytes / b.group : 0);
    });
  }
  if (stage == 1 || stage == 2) {
    w.gather = LargestPair(buckets, [](const Bucket& b) { return b.bytes + b.bytes / b.group; });
  }
  const std::vector<ZeroPart> parts = PartsOf(sync);
  if (stream) {
    w.stream = StreamPeak(parts, stage >= 3, c.model.tie_embeddings);
  } else if (stage >= 2) {
    for (const Bucket& b : buckets) w.materialized += b.bytes;
    if (stage >= 3) {
      double first = 0, second = 0;
      for (const ZeroPart& p : parts) {
        if (p.bytes > first) {
          second = first;
          first = p.bytes;
        } else {
          second = std::max(second, p.bytes);
        }
      }
      w.gathered = 2 * first + second;  // one unpacked beside its receive buffer, the next's
    }
  }
  return w;
}

}  // namespace switchyard::plan
