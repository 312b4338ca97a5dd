#include "engine/plan/zero_memory.h"

#include <algorithm>

#include "engine/model/param_table.h"
#include "engine/plan/dry_run.h"

namespace switchyard::plan {
namespace {

// The part Decoder reports for a parameter (Parameter::part).
std::string PartName(const model::ParamShape& p) {
  switch (p.part) {
    case model::ParamPart::kEmbedding: return "embed";
    case model::ParamPart::kLayer: return StrCat("layers.", p.layer);
    case model::ParamPart::kHead: break;
  }
  if (p.role == model::ParamRole::kNorm) return "norm_f";
  return p.tied_copy ? "embed" : "head";
}

// One bucket: its bytes, its group's size, and the backward position of the part that
// completes it (its earliest registered parameter's).
struct Bucket {
  double bytes = 0, group = 1;
  int launch = 0;
  std::string part;
};

// The rank's parts in backward order: head, norm_f, the layers from the last, embed.
std::vector<std::string> BackwardOrder(const std::vector<std::string>& seen) {
  std::vector<std::string> order;
  auto add = [&](const std::string& name) {
    if (std::find(seen.begin(), seen.end(), name) != seen.end() &&
        std::find(order.begin(), order.end(), name) == order.end())
      order.push_back(name);
  };
  add("head");
  add("norm_f");
  for (auto it = seen.rbegin(); it != seen.rend(); ++it)
    if (it->rfind("layers.", 0) == 0) add(*it);
  add("embed");
  return order;
}

// GradSync's buckets for the rank (per group, reverse registration order, bucket_mb each,
// one part each when per_part), in launch order.
std::vector<Bucket> RankBuckets(const config::Config& c, const dist::Mesh& mesh, int rank,
                                bool per_part, std::vector<std::string>* order) {
  struct Param {
    std::string part;
    double bytes;
    GradGroup group;
  };
  std::vector<Param> params;
  std::vector<std::string> seen;
  ForEachRankParam(c, mesh, rank, [&](const model::ParamShape& p, int64_t n, GradGroup g) {
    if (GradGroupSize(g, mesh) <= 1) return;
    params.push_back({PartName(p), 4.0 * n, g});
    if (std::find(seen.begin(), seen.end(), params.back().part) == seen.end())
      seen.push_back(params.back().part);
  });
  *order = BackwardOrder(seen);
  auto position = [&](const std::string& part) {
    return static_cast<int>(std::find(order->begin(), order->end(), part) - order->begin());
  };
  const double cap = double(c.train.bucket_bytes());
  std::vector<GradGroup> groups;
  for (const Param& p : params)
    if (std::find(groups.begin(), groups.end(), p.group) == groups.end()) groups.push_back(p.group);
  std::vector<Bucket> out;
  for (GradGroup g : groups) {
    Bucket open;
    bool any = false;
    for (auto it = params.rbegin(); it != params.rend(); ++it) {
      if (it->group != g) continue;
      if (any && (open.bytes + it->bytes > cap || (per_part && open.part != it->part))) {
        out.push_back(open);
        open = Bucket();
      }
      open.bytes += it->bytes;
      open.group = GradGroupSize(g, mesh);
      open.part = it->part;
      open.launch = position(it->part);
      any = true;
    }
    if (any) out.push_back(open);
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const Bucket& a, const Bucket& b) { return a.launch < b.launch; });
  return out;
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

bool StreamsGradients(const config::Config& c, bool ordered) {
  const bool ordered_accum = ordered && c.train.grad_accum > 1;
  return c.parallel.zero_stage >= 2 && !ordered_accum &&
         !(c.parallel.pp > 1 && c.model.tie_embeddings);
}

std::vector<ZeroPart> RankZeroParts(const config::Config& c, const dist::Mesh& mesh, int rank) {
  std::vector<std::string> order;
  const std::vector<Bucket> buckets = RankBuckets(c, mesh, rank, /*per_part=*/true, &order);
  std::vector<ZeroPart> parts;
  for (const std::string& name : order) {
    ZeroPart part;
    part.name = name;
    for (const Bucket& b : buckets) {
      if (b.part != name) continue;
      part.bytes += b.bytes;
      part.buckets.push_back(b.bytes);
    }
    parts.push_back(part);
  }
  return parts;
}

ZeroWorkspace PredictZeroWorkspace(const config::Config& c, const dist::Mesh& mesh, int rank,
                                   bool ordered) {
  const int stage = c.parallel.zero_stage;
  const bool stream = StreamsGradients(c, ordered);
  std::vector<std::string> order;
  const std::vector<Bucket> buckets =
      RankBuckets(c, mesh, rank, /*per_part=*/stage >= 3 || stream, &order);
  ZeroWorkspace w;
  if (buckets.empty()) return w;
  if (stage == 0) {
    // All-reduces complete in Finish: all in flight when launched during the last backward,
    // one at a time under ordered accumulation (SyncAll).
    for (const Bucket& b : buckets) {
      if (ordered && c.train.grad_accum > 1) {
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
  const std::vector<ZeroPart> parts = RankZeroParts(c, mesh, rank);
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
