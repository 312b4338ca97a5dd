// The planner's step-time model (docs/plan.md states every formula): how long one training
// step of a layout takes on a machine (hardware.h), split into compute, the communication
// each parallelism exposes, and the pipeline bubble. Per operation a roofline (FLOPs over
// the peak times a shape-dependent efficiency, or bytes over the memory bandwidth); per
// collective alpha-beta on the link its group crosses; the bubble from the engine's own
// schedule simulator (parallel::SimulateTimeline); overlap only where the engine overlaps
// (gradient buckets during the last backward, ZeRO-3's next gather during compute, the
// context-parallel ring during attention).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <tuple>
#include <vector>

#include "engine/config/config.h"
#include "engine/model/recompute.h"
#include "engine/model/stage.h"
#include "engine/parallel/pipeline_schedule.h"
#include "engine/plan/hardware.h"

namespace switchyard::plan {

// One point of the search: the parallel sizes and the batch split of a step.
struct Layout {
  int tp = 1, cp = 1, pp = 1, ep = 1, etp = 1;
  parallel::PipelineSchedule schedule = parallel::PipelineSchedule::kOneFOneB;
  int virtual_stages = 1;
  int zero_stage = 0;
  int64_t micro_batch_size = 1;  // sequences per micro-batch
  int64_t micro_batches = 1;     // per step and data-parallel rank (train.grad_accum)
  model::Recompute recompute = model::Recompute::kNone;
  int64_t head_chunk_tokens = 0;  // train.head_chunk_tokens (0: the head whole)
  // parallel.pipeline_layers: a config's own split (--config-layout); empty, the balanced one
  // (what the search plans).
  std::vector<int64_t> pipeline_layers = {};

  int dp(int world) const { return world / (tp * cp * pp); }
  int edp(int world) const { return world / (etp * ep * pp); }
  // "tp 8 cp 1 pp 8 1f1b ep 1 etp 8 dp 24 zero 1 mbs 1 m 96 recompute full" (and " head
  // chunk 4096" when the head runs in chunks).
  std::string Describe(int world) const;
  // `base` with the layout written into its parallel and train sections.
  config::Config Apply(const config::Config& base) const;
  auto Key() const {
    return std::tuple(tp, cp, pp, ep, etp, int(schedule), virtual_stages, zero_stage,
                      micro_batch_size, micro_batches, int(recompute), head_chunk_tokens,
                      pipeline_layers);
  }
};

// The layout's config fields read back (parallel.etp 0 resolved to tp).
Layout LayoutOf(const config::Config& config);

// How unevenly routing loads the expert-parallel ranks: the busiest rank's tokens over the
// mean. A constant (max/mean load, >= 1), or per-expert counts from a run's routing.jsonl,
// from which each ep gives its own value (experts e * ep / E .. on rank e / (E / ep)): each
// layer's busiest rank over the mean, averaged over the layers (every layer's all-to-all
// waits for its own busiest rank).
struct Skew {
  double constant = 1;
  std::vector<std::vector<double>> expert_counts;  // per MoE layer, per expert
  // The mean over layers of (busiest rank's load / mean rank load) with `ep` ranks; 1 for
  // ep 1.
  double ForEp(int ep) const;
};
// "--skew 1.3" or "--skew path/routing.jsonl" (its last line).
StatusOr<Skew> ParseSkew(const std::string& text);

// What does not change between layouts.
struct PlanInputs {
  config::Config config;
  int world = 1;
  int64_t global_batch = 1;  // sequences per step
  Skew skew;
  // The matrix products' input type: bf16, fp32, fp8 (block-wise scales computed in the cast,
  // fp8 dispatch: DeepSeek-V3's recipe) or fp8-cs (per-tensor current scaling, 16-bit
  // all-to-all: Transformer Engine's, as Megatron's FP8-CS recipes); docs/plan.md.
  std::string precision = "bf16";
  // The largest tp (and etp) searched; 0: no limit. The planner passes a node's devices:
  // tensor parallelism across nodes is never competitive (docs/plan.md).
  int max_tp = 0;
  // What SearchSpace spans besides the sizes. `switchyard plan` searches all of it; `train
  // --dry-run --search` (layout_search.h), which costs every layout's memory, a narrower part.
  struct Scope {
    bool cp = true;     // context parallelism (false: cp 1)
    bool gpipe = true;  // GPipe beside 1F1B when pp > 1
    std::vector<int> virtual_stages = {2, 3, 4, 6, 8};  // interleaved 1F1B's (pp x v <= layers)
    // Sequences per micro-batch; empty: every power of two dividing a replica's batch.
    std::vector<int64_t> micro_batch_sizes = {1, 2, 4, 8, 16};
    // Where the config runs the head whole (train.head_chunk_tokens 0) and a layout does not
    // fit, the same layout with the head in chunks (SuggestedHeadChunk, device_fit.h).
    bool head_chunk = true;
  } scope;
};

// Seconds of one step on its busiest pipeline rank.
struct StepTime {
  double compute = 0;  // matrix products, attention, element-wise passes, optimizer
  double tp = 0, cp = 0, ep = 0, dp = 0, pp = 0;  // exposed communication by kind
  double bubble = 0;   // pipeline idle time
  double total() const { return compute + tp + cp + ep + dp + pp + bubble; }
};

// Caches of what many layouts share (bubbles, stage splits, per-rank parameter counts); one
// per search.
class CostCache {
 public:
  // The simulator's idle share of a step (0 without a pipeline).
  double Bubble(parallel::PipelineSchedule schedule, int pp, int64_t m, int v, int backward_cost);
  // Per pipeline rank, its chunks' (first layer, end layer, embedding, head).
  const std::vector<std::vector<model::Stage>>& Stages(const config::Config& c, int pp, int v,
                                                      const std::vector<int64_t>& layers);
  // Per piece (embedding, layers, head): elements one rank holds, dense and routed-expert.
  const std::vector<std::pair<double, double>>& PieceParams(const config::Config& c, int tp,
                                                            int etp, int ep);
  // ModelFlopsPerToken of the search's config (computed once).
  double FlopsPerToken(const config::Config& c);

 private:
  double flops_per_token_ = -1;
  std::map<std::tuple<int, int, int64_t, int, int>, double> bubbles_;
  std::map<std::tuple<int, int, std::vector<int64_t>>, std::vector<std::vector<model::Stage>>>
      stages_;
  std::map<std::tuple<int, int, int>, std::vector<std::pair<double, double>>> pieces_;
};

// The step time of `layout` (which must pass ParallelConfig::Validate for in.world).
StepTime PredictStepTime(const PlanInputs& in, const Layout& layout, const Hardware& hw,
                         CostCache& cache);

// Training FLOPs per token of the model (EstimateCost: 6 x active matrix parameters +
// attention), for tokens/s and MFU.
double ModelFlopsPerToken(const config::Config& config);

}  // namespace switchyard::plan
