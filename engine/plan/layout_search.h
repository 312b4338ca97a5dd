// The layouts of a fixed world that fit its devices (`switchyard train --dry-run --search`,
// docs/recipes.md): the planner's enumeration (planner.h's EnumerateLayouts, the one list of
// layouts and the one layout check) over part of its space: every tp (at most 8, inside a
// node), pp (1f1b, or interleaved with two virtual stages), ep, etp (1 or tp), ZeRO stage,
// micro-batch (every power of two) and recompute, no cp, with the config's global batch
// (dp x micro_batch_size x grad_accum sequences) kept; each judged by PredictDeviceFit, the
// dry-run's own estimate, so the search, the planner and the dry-run never disagree.
#pragma once

#include <string>
#include <vector>

#include "engine/config/config.h"
#include "engine/plan/device_fit.h"

namespace switchyard::plan {

struct LayoutCandidate {
  config::Config config;  // the searched config: parallel.*, train.micro_batch_size,
                          // grad_accum and recompute changed, and head_chunk_tokens where
                          // the whole head does not fit (as the planner's, planner.h)
  DeviceFit fit;
  // The step's compute relative to no recompute and no pipeline bubble:
  // (1 + recompute's extra forward (and a chunked head's) / the step's FLOPs) x (1 + (pp - 1) / (v m)).
  double work = 1;
};

struct LayoutSearch {
  int64_t global_batch = 0;  // sequences per step, kept by every candidate
  int64_t tried = 0;         // layouts Validate accepted and the search costed
  // The layouts that fit (by the dry-run's peak) that no other fitting layout beats on all
  // of peak, work, ZeRO stage and tp (the Pareto front), ordered by what they cost besides memory: work, then ZeRO
  // stage, then tp, then peak (the best first).
  std::vector<LayoutCandidate> best;
};

// Searches the layouts of `world` ranks for `config`'s model (plan.device_memory_gib must be
// > 0). The world must be one the config's global batch divides into.
LayoutSearch SearchLayouts(const config::Config& config, int world);

// The table: the first `rows` of `best`, predicted peak first, then margin, layout, micro-
// batch, recompute and work.
std::string LayoutSearchReport(const LayoutSearch& search, int world, double device_gib, int rows);

}  // namespace switchyard::plan
