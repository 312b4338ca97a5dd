// Data-parallel gradient synchronisation in buckets (PyTorch DDP's Reducer, Megatron's
// DistributedDataParallel without ZeRO): after backward, every gradient becomes the SUM of
// its replicas' gradients over the axes its description names (Parameter::grad_sum):
//   dense parameters                                   over dp x cp
//   sequence-parallel norms, the router, row biases    over dp x cp x tp
//   routed experts (sharded over ep, maybe etp)        over edp
//   the experts' output bias under etp                 over edp x etp
// Sums are ordered (dist::OrderedAllReduce): the pairwise tree over the group's ranks in
// rank order, so with data-parallel ranks holding consecutive micro-batches the sum is the
// one a single rank gets from the same tree over its micro-batches.
// The trainer scales the loss by 1 / (the number of micro-batches of the global batch), so
// the sum is the gradient of the global-batch mean. A group of size 1 has nothing to do:
// its parameters get no bucket and cost nothing.
//
// Buckets: the trainable parameters of each group are packed, in REVERSE registration
// order (the order backward produces their gradients), into flat buffers of at most
// bucket_bytes (default 25 MiB, DDP's bucket_cap_mb); a parameter larger than that gets a
// bucket of its own. Buckets never mix groups or dtypes. Each bucket is one all-reduce.
// The packing is sync_plan.h's PackBuckets (the planner packs the parameter table with it),
// and what a ZeRO stage sets below is its SyncPolicy (GradSyncOptionsFor).
//
// Overlap with backward:
//   for each micro-batch's backward, on the last micro-batch only:
//     ... as soon as parameter i's gradient is final: sync.MarkReady(i);
//   sync.Finish();   // waits, writes the sums back into the grads
// A bucket is packed and its AllReduceAsync launched when all its parameters are ready;
// buckets of one group launch in bucket order (a ready bucket waits for the ones before
// it), so every rank issues the collectives of a communicator in the same order whatever
// order its backward marks parameters in. Finish() launches whatever was not launched —
// a parameter never marked is reduced as it stands (e.g. its zeroed gradient) — waits for
// every bucket, copies back and resets for the next step. SyncAll() is the synchronous
// path: every bucket packed, all-reduced (blocking) and copied back, in bucket order.
// Reduce-scatters (ZeRO stages 1-3): at most two buckets are in flight
// (GradSyncOptions::max_in_flight): launching a third first completes the oldest, so the
// packed copies and the ordered sum's receive buffers (one bucket's size each,
// dist/ordered_sum.h) never exceed two buckets' worth. All-reduces (stage 0) end with a
// blocking all-gather, so they complete in Finish, group by group in bucket order (every
// bucket may be in flight); SyncAll runs them one at a time.
//
// Streaming (GradSyncOptions::stream, ZeRO stages 2-3 with in-place accumulation): no
// full gradient ever exists. Before a part's backward writes its gradients, the trainer
// calls BeginGradients(its parameters): they are allocated and zeroed. When the part is
// done (MarkReady, every micro-batch), its buckets (one part each) are packed, the
// gradients freed at once, and the packed bucket reduce-scattered and ADDED into the
// persistent shard (the first micro-batch of a step writes it). Gradient memory: the
// shard, the part being computed, and at most max_in_flight buckets in flight.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/dist/communicator.h"
#include "engine/dist/parallel_context.h"
#include "engine/parallel/parameter.h"
#include "engine/parallel/sync_plan.h"

namespace switchyard::parallel {

// The communicator of pc over `axes` of `view`: the groups a parameter description can
// name (dense: dp x cp, with tp, tp alone; expert: edp, with etp, etp alone). Others are a
// programming error.
dist::Communicator& GroupOf(const dist::ParallelContext& pc, dist::View view, AxisSet axes);

// PyTorch DDP's default bucket_cap_mb = 25.
inline constexpr int64_t kDefaultBucketBytes = int64_t{25} * 1024 * 1024;

struct GradSyncOptions {
  int64_t bucket_bytes = kDefaultBucketBytes;  // > 0
  // ZeRO: each bucket is reduce-scattered (dist::OrderedReduceScatter: the bits the
  // all-reduce would give) and this rank gets only its chunk — chunk `rank` of
  // dist::OrderedChunks(bucket elements, group size): stage 1 copies it back into the
  // grads' elements it covers (the rest of the grads stay unsummed), stages 2-3
  // (persistent_shard) keep it in the bucket's grad_shard. Off: all-reduced into the grads.
  bool reduce_scatter = false;
  bool persistent_shard = false;
  // Registry index -> bucket key (sync_plan.h's BucketKeys: a part, a tied weight's own
  // key); when given, a bucket holds parameters of one key only, so ZeRO-3 can gather a
  // part's parameters bucket by bucket.
  std::vector<int> part_of;
  // Streaming accumulation into the shard (see the file comment): needs reduce_scatter,
  // persistent_shard and part_of.
  bool stream = false;
  int max_in_flight = 2;  // buckets whose collective is in flight at once, >= 1
};

// The options of a sync under `policy` (sync_plan.h): reduce-scatter, persistent shard,
// streaming and buckets in flight as the policy says, part_of = keys (BucketKeys).
GradSyncOptions GradSyncOptionsFor(const SyncPolicy& policy, int64_t bucket_bytes,
                                   std::vector<int> keys);

class GradSync {
 public:
  // group_of(view, axes): the communicator over those axes of this rank's mesh (on the
  // device of the gradients); ctx orders the pack/unpack copies of device tensors. The
  // registry, the communicators and ctx must outlive the GradSync, and the registry keep
  // its parameter list. bucket_bytes > 0.
  using GroupResolver = std::function<dist::Communicator&(dist::View, AxisSet)>;
  GradSync(ParameterRegistry& registry, const GroupResolver& group_of,
           int64_t bucket_bytes = kDefaultBucketBytes, DeviceContext* ctx = nullptr);
  GradSync(ParameterRegistry& registry, const GroupResolver& group_of,
           const GradSyncOptions& options, DeviceContext* ctx = nullptr);
  // The same with the groups of pc (GroupOf below).
  GradSync(ParameterRegistry& registry, const dist::ParallelContext& pc,
           int64_t bucket_bytes = kDefaultBucketBytes, DeviceContext* ctx = nullptr);
  ~GradSync();
  GradSync(const GradSync&) = delete;
  GradSync& operator=(const GradSync&) = delete;

  // Parameter `index` (into registry.params()) has its final gradient of this step (when
  // streaming: of this micro-batch). Each parameter at most once per step (micro-batch);
  // parameters with no bucket (not trainable, or in a group of size 1) are accepted and
  // ignored.
  void MarkReady(size_t index);
  // Streaming: the gradients of these parameters (registry indices) are allocated, zeroed,
  // unless they already are. Parameters with no bucket keep their whole gradient (their
  // ZeroGrad is the caller's). No-op when not streaming.
  void BeginGradients(const std::vector<size_t>& indices);
  bool streaming() const { return options_.stream; }
  // Completes every bucket whose collective is in flight (in launch order). ZeRO-3 calls it
  // before it starts a part's gather, so the two are not in flight together.
  void CompleteInFlight();
  // Completes the step (see the file comment). Every rank of a group must call it.
  void Finish();
  // Synchronous all-reduce of every bucket; not between MarkReady and Finish.
  void SyncAll();

  // Introspection (tests, logging).
  struct BucketInfo {
    dist::View view;
    AxisSet axes;  // the gradient is summed over these
    dist::Communicator* comm = nullptr;  // the group over axes
    std::vector<size_t> params;  // registry indices, in packing order
    std::vector<int64_t> offsets;  // where each parameter starts in the bucket (elements)
    int64_t elements = 0;
    int64_t bytes = 0;
    // This rank's chunk of the bucket (dist::OrderedChunks): what it owns under ZeRO.
    int64_t chunk_begin = 0, chunk_elements = 0;
    Tensor grad_shard;  // persistent_shard: (chunk_elements,) the summed chunk after Finish
  };
  std::vector<BucketInfo> Buckets() const;
  // "grad sync: 3 buckets (dense 2 over 4 ranks, expert 1 over 2 ranks), 1.5 MiB".
  std::string Summary() const;
  // The buckets launched in the last step (or in the one under way), in launch order, as
  // (group, bucket) of the packing (sync_plan.h's groups; Buckets() lists them in that
  // order): the planner's SyncLaunchOrder is compared with it.
  const std::vector<std::pair<int, int>>& launches() const { return launches_; }

 private:
  struct Bucket;
  struct Group;

  // A filled bucket's chunk on this rank of comm (dist::OrderedChunks) and, with a
  // persistent shard, its gradient shard.
  void PlaceChunk(Bucket& b, const dist::Communicator& comm);
  // Packs bucket b (completing older buckets first while max_in_flight are in flight) and
  // starts its sum; Complete waits for the oldest in flight and unpacks it.
  void Launch(Group& g, Bucket& b);
  void Pack(Bucket& b);
  void Complete();
  void Complete(Bucket& b);
  void Unpack(Bucket& b);
  std::unique_ptr<dist::Work> Reduce(Group& g, Bucket& b);
  void LaunchReady(Group& g);

  ParameterRegistry& registry_;
  DeviceContext* ctx_;
  GradSyncOptions options_;
  std::vector<std::unique_ptr<Group>> groups_;  // one per (view, axes) of size > 1
  // For each registry index: {group slot, bucket index} or {-1, -1} when not synced.
  std::vector<std::pair<int, int>> where_;
  std::vector<bool> marked_;
  bool in_step_ = false;  // MarkReady since the last Finish
  std::vector<Bucket*> in_flight_;  // launched, not completed, oldest first
  std::vector<std::pair<int, int>> launches_;  // launches()
  bool step_done_ = false;  // Finish/SyncAll ended: the next launch starts a new log
};

}  // namespace switchyard::parallel
