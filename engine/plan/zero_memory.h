// What the gradient sync and ZeRO add to a step's workspace (the allocator's kWorkspace),
// from the config alone, walked as engine/parallel/grad_sync.h and zero.h run it:
//
//  - the buckets: the rank's partitioned parameters (those whose group has more than one
//    rank) packed as GradSync packs them, by the same functions (PlanRankSync below:
//    engine/parallel/sync_plan.h's policy, keys, packing and launch order, over the
//    parameter table's tensors of the rank in registration order);
//  - the sync of stages 0-1 (and of ordered accumulation): each bucket in flight holds
//    its packed copy and the ordered sum's received pieces (its size again); at most two
//    are in flight, so the peak is the largest pair launched one after the other
//    (stage 1: plus each one's summed chunk, 1/N of it);
//  - after a stage 1-2 update, the all-gather of the new values: a chunk and the received
//    bucket per bucket, two in flight;
//  - streaming (stages 2-3, in-place accumulation): per micro-batch, in backward order,
//    the part being computed holds its gradients; its buckets then go one at a time (the
//    one in flight completes first): packed copy beside what is left of the part's
//    gradients, then the copy and its received pieces while the next part computes; with
//    tied embeddings the table's gradient lives through the whole backward;
//  - stage 3: a part's parameters from its gather to its release, the received bucket
//    beside them while it is unpacked, and the next part's gather, started after the
//    bucket in flight completes; the head is kept from the forward to the backward.
//
// tests/dist/zero_memory_test.cc holds the total (model states + workspace) within 10% of
// the ledger's, and the buckets equal to the trainer's exactly.
#pragma once

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/dist/mesh.h"
#include "engine/parallel/sync_plan.h"

namespace switchyard::plan {

struct HeldParam;  // engine/plan/dry_run.h

// The rank's gradient sync as the runtime builds it (engine/parallel/sync_plan.h over the
// parameter table): its parameters as SyncParams in registration order (HeldParams), parts
// numbered in first-seen order as the trainer numbers them, packed under the config's
// policy (BucketKeys, PackBuckets), and the buckets' launch order (SyncLaunchOrder: as
// the parts finish in model::BackwardParts' order, or all at the step's end). tests/dist/zero_memory_test.cc compares the
// buckets with the trainer's GradSync::Buckets(), exactly.
struct RankSync {
  std::vector<parallel::SyncParam> params;
  std::vector<parallel::PartId> parts;      // by part index
  std::vector<int> backward;                // part indices in backward order
  std::vector<parallel::SyncGroup> groups;  // PackBuckets
  std::vector<parallel::BucketRef> launch;  // every bucket, in launch order
};
RankSync PlanRankSync(const config::Config& config, const dist::Mesh& mesh, int rank);
// The same from the rank's HeldParams, when the caller has them.
RankSync PlanRankSync(const config::Config& config, const dist::Mesh& mesh, int rank,
                      const std::vector<HeldParam>& held);

// One part of the rank's model ("embed", "layers.<i>", "norm_f", "head"), in bytes of its
// partitioned (bucketed) elements, f32.
struct ZeroPart {
  std::string name;
  double bytes = 0;
  std::vector<double> buckets;  // streaming / stage 3: the part's buckets, in launch order
};

struct ZeroWorkspace {
  double sync = 0;     // stages 0-1 / ordered: the buckets in flight at the sync's peak
  double gather = 0;   // stages 1-2: the all-gather of the updated values
  double stream = 0;   // streaming: gradients and buckets (and stage 3 gathers) at once
  double materialized = 0;  // ordered stages 2-3: the full gradients
  double gathered = 0;      // ordered stage 3: two gathered parts
};

// The rank's parts in backward order (head, norm_f, the layers from the last, embed).
std::vector<ZeroPart> RankZeroParts(const config::Config& config, const dist::Mesh& mesh,
                                    int rank);

// Under the config's sync policy (engine/config/sync_settings.h), train.ordered_grad_accum
// included.
ZeroWorkspace PredictZeroWorkspace(const config::Config& config, const dist::Mesh& mesh,
                                   int rank);
ZeroWorkspace PredictZeroWorkspace(const config::Config& config, const dist::Mesh& mesh, int rank,
                                   const std::vector<HeldParam>& held);

}  // namespace switchyard::plan
