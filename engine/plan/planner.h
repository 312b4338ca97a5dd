// `switchyard plan`: every layout of a world the engine's one layout check accepts
// (config::ParallelConfig::Validate), those the dry-run's memory model fits on the device
// (PredictRankMemory), ranked by the step time cost_model.h predicts. docs/plan.md.
//
// The search space (each size a divisor of what the world leaves):
//   tp <= n_heads (and <= PlanInputs::max_tp, a node); cp; pp <= n_layers with gpipe, 1f1b, and interleaved with virtual
//   stages 2, 3, 4, 6, 8 (pp x v <= n_layers); ep (MoE models only) dividing the experts;
//   etp 1 or tp; ZeRO 0-3; micro-batch size 1, 2, 4, 8, 16 (the global batch split into
//   dp x mbs x m); recompute none, selective, full. The mesh order is the default one.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/plan/cost_model.h"

namespace switchyard::plan {

struct PlanOptions {
  int top = 10;
};

struct Candidate {
  Layout layout;
  StepTime time;
  double tokens_per_s = 0;
  double flops_per_gpu = 0;  // model FLOP/s per device (ModelFlopsPerToken x tokens/s / world)
  double mfu = 0;            // flops_per_gpu over the device's peak
  double peak_bytes = 0;     // PeakMemory: the dry-run's largest rank
  bool fits = false;
};

// Every layout of the search space, valid or not (the test compares it with Validate).
std::vector<Layout> SearchSpace(const PlanInputs& in);
// The layouts of the search space Validate accepts, in SearchSpace's order.
std::vector<Layout> EnumerateLayouts(const PlanInputs& in);

// The head chunk a search tries for `layout` (its config: the layout applied) when it does
// not fit with the head whole: SuggestedHeadChunk (device_fit.h) where in.scope.head_chunk
// allows it and the layout runs the head whole; 0 otherwise. Plan and SearchLayouts
// (`train --dry-run --search`) both call it.
int64_t FallbackHeadChunk(const PlanInputs& in, const config::Config& layout);

// The config the layout's devices would run: `layout` applied to in.config, on a GPU, its
// products at in.precision (fp8 and fp8-cs as bf16: the engine keeps no fp8 tensor), its
// activations kept as runtime.activation_dtype says.
config::Config DeviceConfig(const PlanInputs& in, const Layout& layout);

// The peak bytes of the layout's busiest rank (its first and last pipeline ranks: the most
// micro-batches in flight, the head) as `train --dry-run` predicts them for DeviceConfig:
// PredictDeviceFit's model states, step workspace and operand copies (bf16 weight shadows
// at ZeRO stage 0). One memory model for the planner, the dry-run and its layout search.
double PeakMemory(const PlanInputs& in, const Layout& layout);
// The largest pipeline stage's floor (PredictRankFloor: model states and one micro-batch's
// activations): at most PeakMemory, and without its walk of the step.
double PeakFloor(const PlanInputs& in, const Layout& layout);

// Time, throughput and memory of one layout.
Candidate Evaluate(const PlanInputs& in, const Layout& layout, const Hardware& hw, CostCache& cache);

struct PlanResult {
  std::vector<Candidate> best;  // fastest first; ties by layout key
  int64_t searched = 0;         // the search space's size
  int64_t valid = 0;            // accepted by the layout check
  int64_t memory_checked = 0;   // layouts whose memory was computed before `top` fit
  // Layouts not walked: their floor (PeakFloor: model states and one micro-batch's
  // activations) exceeds the device and the smallest peak seen, so they could neither fit nor
  // be `smallest`.
  int64_t memory_skipped = 0;
  // When fewer than `top` fit: of the layouts checked, the one needing the least memory.
  Candidate smallest;
  // Every layout's floor exceeds the device: nothing fits, and `smallest` was found in order
  // of the floors (PeakFloor), not of the step time.
  bool floors_exceed_device = false;
};
PlanResult Plan(const PlanInputs& in, const Hardware& hw, const PlanOptions& options);

// The text table: one row per candidate.
std::string FormatCandidates(const std::vector<Candidate>& rows, int world);

}  // namespace switchyard::plan
