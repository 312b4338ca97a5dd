// The gradient sync's layout decisions, as pure functions of plain inputs: what a ZeRO
// stage does (SyncPolicy), which bucket key each parameter gets (BucketKeys), how a rank's
// gradients are packed into buckets (PackBuckets) and in which order the buckets go out
// when the model's parts finish their backward (LaunchOrder). The runtime (GradSync,
// ZeroShards and the trainer) and the planner (engine/plan/zero_memory.h) call these same
// functions: the runtime over its registry, the planner over the parameter table
// (engine/model/param_table.h), both as SyncParam lists (no tensors). DESIGN.md: "A
// decision the runtime makes about layout ... is a pure function of (config, mesh, rank)
// in the layer that owns it". The config's values reach SyncSettings through
// config::SyncSettingsOf (engine/config/sync_settings.h): this layer sits below config.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/core/dtype.h"
#include "engine/dist/mesh.h"
#include "engine/parallel/parameter.h"

namespace switchyard::parallel {

// What of the run decides how gradients are synchronised.
struct SyncSettings {
  int zero_stage = 0;               // parallel.zero_stage, 0-3
  int pp = 1;                       // parallel.pp
  int64_t grad_accum = 1;           // train.grad_accum: micro-batches per step
  bool ordered_grad_accum = false;  // train.ordered_grad_accum
  bool tied_embeddings = false;     // model.tie_embeddings
};

// What a ZeRO stage does with the gradients (docs/zero.md).
struct SyncPolicy {
  int zero_stage = 0;
  // train.ordered_grad_accum with more than one micro-batch: each micro-batch's gradient
  // alone, summed in the tree order, then one synchronous sync (GradSync::SyncAll).
  bool ordered_accum = false;
  // Without ordered accumulation, whether the gradient buckets go out during the last
  // backward (each part's as it finishes) rather than once after the whole schedule: every
  // stage but ZeRO-1 under pipeline parallelism, which reduces once per step as
  // Megatron-DeepSpeed's pipeline engine does (docs/pipeline.md, "ZeRO under pipeline
  // parallelism"). False under ordered accumulation.
  bool reduce_during_backward = true;
  bool reduce_scatter = false;    // stages 1-3 (GradSyncOptions::reduce_scatter)
  bool persistent_shard = false;  // stages 2-3 (GradSyncOptions::persistent_shard)
  // ZeRO stages 2-3 without ordered accumulation: each part's gradient bucket is
  // reduce-scattered into the shard as soon as its backward is done, every micro-batch,
  // and freed (GradSyncOptions::stream); no full gradient exists. Not with tied embeddings
  // over pipeline stages (their sum needs the whole table's gradient).
  bool stream = false;
  // A bucket holds one part's parameters: under ZeRO-3 (a part is gathered bucket by
  // bucket) and when streaming (a part's buckets go out as its backward ends).
  bool buckets_by_part = false;
  // Under ZeRO (stages 1-3) a tied weight (Parameter::tied) has buckets of its own, so
  // that rank r of the data-parallel group owns the same range of it on the first and the
  // last pipeline stage (the trainer sums the two copies' owned ranges).
  bool tied_alone = false;
  // Buckets whose collective is in flight at once: one when streaming (one part's bucket
  // in flight while the next part's backward computes), else two.
  int max_in_flight = 2;
};

SyncPolicy SyncPolicyFor(const SyncSettings& settings);

// One parameter as the sync sees it: its gradient's size and type, the group it is
// summed over, and the part of the model it belongs to.
struct SyncParam {
  std::string name;
  int64_t numel = 0;  // elements of the gradient (the rank's box)
  DType dtype = DType::kF32;
  dist::View view = dist::View::kDense;
  AxisSet grad_sum;  // Parameter::grad_sum; empty: not synced
  bool trainable = true;
  int part = -1;  // the index of its part in the rank's part list; -1: none
  bool tied = false;  // Parameter::tied
};

// The SyncParam of a registry entry (numel and dtype from its gradient, which must be
// defined when trainable); part as given.
SyncParam SyncParamOf(const Parameter& p, int part);

// Per parameter, the key that keeps buckets apart (GradSyncOptions::part_of): its part
// when policy.buckets_by_part, a key of its own for tied parameters when policy.tied_alone
// (n_parts: the number of parts, the first free key); all -1 (one key) otherwise.
std::vector<int> BucketKeys(const SyncPolicy& policy, const std::vector<SyncParam>& params,
                            int n_parts);

// One bucket: a flat buffer of gradients of one group, one dtype and one key.
struct SyncBucket {
  std::vector<size_t> params{};  // indices into the SyncParam list, in packing order
  std::vector<int64_t> offsets{};  // where each starts in the bucket (elements)
  int64_t elements = 0;
  DType dtype = DType::kF32;
  int key = -1;  // the bucket key of its parameters
  int64_t bytes() const { return elements * static_cast<int64_t>(SizeOf(dtype)); }
};

// The buckets of one (view, grad_sum axes) group of more than one rank.
struct SyncGroup {
  dist::View view = dist::View::kDense;
  AxisSet axes;
  int size = 1;  // ranks in the group
  std::vector<SyncBucket> buckets{};
};

// The groups of the trainable parameters with a non-empty grad_sum, in first-seen
// (registration) order, those whose group_size is 1 left out (nothing to sum). Each
// group's parameters are packed from the last registered to the first (the order backward
// finishes them) into buckets of at most bucket_bytes per dtype (a larger parameter gets a
// bucket of its own); a parameter whose key differs from the open bucket's starts a new
// one. keys: per parameter (BucketKeys), or empty for one key. bucket_bytes > 0.
using GroupSize = std::function<int(dist::View, AxisSet)>;
std::vector<SyncGroup> PackBuckets(const std::vector<SyncParam>& params,
                                   const std::vector<int>& keys, int64_t bucket_bytes,
                                   const GroupSize& group_size);
// The ranks of `mesh` a group over `axes` of `view` spans.
int MeshGroupSize(const dist::Mesh& mesh, dist::View view, AxisSet axes);

// Where a bucket is: its group and its index there.
struct BucketRef {
  int group = 0, bucket = 0;
  bool operator==(const BucketRef&) const = default;
};

// The order the buckets go out in when the parts finish their backward in the order
// part_done lists them (part ids; every trainable parameter's part among them): each
// finished part marks its parameters ready in registration order, and a bucket is launched
// when its every parameter is ready and the buckets before it in its group have launched
// (GradSync::MarkReady).
std::vector<BucketRef> LaunchOrder(const std::vector<SyncGroup>& groups,
                                   const std::vector<SyncParam>& params,
                                   const std::vector<int>& part_done);

// The order the sync launches the buckets in under `policy`: LaunchOrder when the buckets
// go out during the backward (policy.reduce_during_backward), else all at the end of the
// step (GradSync::Finish, or SyncAll under ordered accumulation): group by group, each in
// bucket order.
std::vector<BucketRef> SyncLaunchOrder(const SyncPolicy& policy,
                                       const std::vector<SyncGroup>& groups,
                                       const std::vector<SyncParam>& params,
                                       const std::vector<int>& part_done);

}  // namespace switchyard::parallel
