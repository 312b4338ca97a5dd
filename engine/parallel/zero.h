// ZeRO (Rajbhandari et al., "ZeRO: Memory Optimizations Toward Training Trillion Parameter
// Models", SC'20): the model states of data-parallel replicas partitioned over the ranks
// that would otherwise each hold a copy, on top of the gradient buckets of GradSync.
//
// The unit of ownership is a bucket's chunk, as in Megatron-Core's distributed optimizer:
// each GradSync bucket (one (view, grad_sum axes) group: dense over dp x cp, experts over
// edp, tp-summed norms/router over dp x cp x tp) is cut by dist::OrderedChunks over its
// group, and rank r owns chunk r. A parameter's owned elements are the part of chunk r it
// overlaps — one contiguous range, written into its description as flat_begin/flat_end.
// Parameters without a bucket (a group of size 1, not trainable) are owned whole.
//
//   stage 1  optimizer state for the owned range only; gradients reduce-scattered (the
//            owned range summed in place), and after the update each bucket's chunks are
//            all-gathered so every replica has the new parameters: the volume of stage 0's
//            all-reduce (ZeRO paper, section 7)
//   stage 2  + gradients reduce-scattered (GradSyncOptions::reduce_scatter): the summed
//            gradient of the owned range is all that persists; the full gradients are
//            workspace, materialised for backward and freed after the step
//   stage 3  + parameters: each rank keeps only its chunk of every bucket (buckets never
//            span model parts); Acquire(part, next) all-gathers a part's parameters before
//            it runs and starts the next part's gather (prefetch); Release(part) frees them
//
// Every rank of a group joins every collective of every bucket whatever tokens it routed:
// an expert that received no token anywhere still reduce-scatters its zero gradient and is
// gathered, so nothing waits on a rank that has nothing to send (the ZeRO-3 + MoE hang of
// other engines). The sums are ordered (dist::OrderedReduceScatter), so stage 2/3
// gradients are bit for bit the all-reduce's and the AdamW update of an element does not
// depend on the stage: stages 1-3 equal stage 0 bit for bit except for the clipping norm's
// order of summation (docs/zero.md).
#pragma once

#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/dist/communicator.h"
#include "engine/parallel/grad_sync.h"
#include "engine/parallel/parameter.h"

namespace switchyard::parallel {

class ZeroShards {
 public:
  // stage 0-3. The GradSync must have been built with reduce_scatter = (stage >= 1),
  // persistent_shard = (stage >= 2) and,
  // for stage 3, part_of = part_of. part_of: registry index -> part index, part_names[index]
  // the part (Parameter::part, as Decoder reports it). Sets flat_begin/flat_end
  // of every owned parameter, tags the model states' memory, and for stage 3 moves the
  // owned chunks into shards and frees the whole parameters. registry, sync and ctx must
  // outlive this.
  ZeroShards(ParameterRegistry& registry, GradSync& sync, int stage, std::vector<int> part_of,
             std::vector<PartId> part_names, DeviceContext* ctx = nullptr);
  ~ZeroShards();
  ZeroShards(const ZeroShards&) = delete;
  ZeroShards& operator=(const ZeroShards&) = delete;

  int stage() const { return stage_; }

  // The owned elements of trainable parameter `index`, as 1-D tensors (empty when it owns
  // none): its values (a view of the parameter, or of the stage-3 shard) and its summed
  // gradient (a view of the gradient, or of the stage-2/3 gradient shard; valid after the
  // step's GradSync::Finish/SyncAll).
  Tensor OwnedValue(size_t index) const;
  Tensor OwnedGrad(size_t index) const;
  // The mesh axes the parameter's elements are partitioned over (its bucket's group), empty
  // when it is owned whole. Clipping counts an owned range once: on the rank whose
  // coordinate is 0 on every other replicated axis.
  AxisSet ShardAxes(size_t index) const;

  // Stage >= 2: before a step's first backward, the full gradients are materialised (the
  // caller zeroes them); after the step's sync, FreeGradients() gives them back.
  void MaterializeGradients();
  void FreeGradients();
  // Every replica's owned range of per-parameter tensors, all-gathered into whole ones:
  // owned(i) is parameter i's owned 1-D tensor, whole(i) its box-shaped destination
  // (written on every rank). Collective over every bucket's group.
  void GatherWhole(const std::function<Tensor(size_t)>& owned,
                   const std::function<Tensor(size_t)>& whole) const;
  // Stages 1 and 2: after the optimizer updated the owned ranges, every replica receives
  // the new values (one all-gather per bucket). Stage 3: nothing (the shards are the
  // parameters). Collective over every bucket's group.
  void GatherUpdatedParameters();

  // Stage 3: the parameters of `part` are whole when this returns; the gather of `next`
  // (PartId() for none) is started, after the gradient buckets in flight complete
  // (GradSync::CompleteInFlight: a part's reduce-scatter overlaps the wait for the part
  // prefetched before it, the next gather overlaps the part's compute). Release frees
  // them. No-ops for other stages. Collective over the part's groups, in the same order of
  // parts on every rank.
  void Acquire(const PartId& part, const PartId& next);
  void Release(const PartId& part);
  // Stage 3: gathers or frees every part (tests that read whole parameters).
  void AcquireAll();
  void ReleaseAll();

  // What a checkpoint saves and loads for the model: the registry's parameters with their
  // owned ranges (stages 0-2: replicas split the writing, every rank loads its whole box),
  // or for stage 3 the shards (flat values) in their place.
  std::vector<Parameter> CheckpointParameters() const;

  // "zero 2: 4 buckets over dense dp,cp (2 ranks) and expert edp (2 ranks)".
  std::string Summary() const;

 private:
  struct Bucket;
  struct Gather;
  void StartGather(const PartId& part);
  void FinishGather(const PartId& part);
  int PartIndex(const PartId& part) const;  // -1: not a part of the registry
  // Copies an all-gather's padded pieces (recv) of bucket b into whole_of(i) of each of its
  // parameters.
  void Unpack(const Bucket& b, const Tensor& recv,
              const std::function<Tensor(size_t)>& whole_of) const;

  ParameterRegistry& registry_;
  GradSync& sync_;
  int stage_;
  DeviceContext* ctx_;
  std::vector<int> part_of_;
  std::vector<PartId> part_names_;
  std::vector<Bucket> buckets_;
  // For each registry index: {bucket, offset of the parameter in it} or {-1, 0}.
  std::vector<std::pair<int, int64_t>> where_;
  std::vector<std::vector<int>> part_buckets_;  // part id -> its buckets
  std::vector<std::unique_ptr<Gather>> gathers_;  // part id -> the gather in flight
  std::vector<bool> resident_;                   // part id -> whole parameters present
};

// A trainable parameter's gradient as this rank holds it for the update: the whole gradient,
// or under ZeRO stage >= 1 the flat range this rank owns (ZeroShards::OwnedGrad).
struct HeldGrad {
  size_t index = 0;  // in the registry
  Tensor grad;       // non-empty
};

// Every trainable parameter with a non-empty held gradient, in registry order. zero may be
// null (no ZeRO: every gradient held whole).
std::vector<HeldGrad> HeldGrads(const ParameterRegistry& registry, const ZeroShards* zero);

}  // namespace switchyard::parallel
