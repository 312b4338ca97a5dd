// Whether a layout fits the memory of the devices it is planned for (plan.device_memory_gib,
// docs/recipes.md): the largest rank's predicted peak — PredictRankMemory's model states
// and step workspace, plus the matrix products' operand copies — against the device, and
// the margin.
#pragma once

#include <string>

#include "engine/config/config.h"
#include "engine/dist/mesh.h"
#include "engine/plan/dry_run.h"

namespace switchyard::plan {

struct DeviceFit {
  int rank = 0;               // the largest rank (by `peak`)
  RankMemory memory;          // PredictRankMemory of that rank
  // Under runtime.precision bf16 (or auto on a GPU) every matrix product converts both
  // operands first (kernels/gemm.h): bf16 copies on a GPU (2 bytes an element), rounded f32
  // copies on the CPU (4). The largest weight the rank multiplies and the widest operand of
  // one micro-batch's rows (the logits' gradient, usually) at once.
  double operand_copies = 0;
  double activations = 0;     // of that rank: the most kept activations at once (in flight)
  double peak = 0;            // memory.total() + operand_copies
  double device = 0;          // plan.device_memory_gib in bytes; 0: no device to fit

  bool fits() const { return device <= 0 || peak <= device; }
  double margin() const { return device - peak; }
};

// The ranks whose memory can differ: one per (pipeline rank, tensor-parallel rank) with
// every other coordinate 0 (ranks that differ only in dp, cp, ep or etp hold equal shares).
std::vector<int> DistinctRanks(const dist::Mesh& mesh);

// One rank's DeviceFit::peak (model states, step workspace, operand copies), without the
// report's terms: what the planner compares with the device.
double PredictRankPeak(const config::Config& config, const dist::Mesh& mesh, int rank);

// The largest of `ranks` (DistinctRanks when empty). CHECK-fails on a layout
// Config::Validate rejects for mesh.world().
DeviceFit PredictDeviceFit(const config::Config& config, const dist::Mesh& mesh,
                           std::vector<int> ranks = {});

// The head's rows of one micro-batch on a rank (micro_batch_size x seq_len / cp), and the
// train.head_chunk_tokens the dry-run suggests and the planner tries where the whole head's
// logits do not fit: a quarter of them, at most 4096 (0 for a one-row head, which has nothing
// to chunk).
int64_t HeadRows(const config::Config& config);
int64_t SuggestedHeadChunk(const config::Config& config);

// runtime.memory_check, before training builds its model: the predicted peaks (PredictRankPeak)
// of the ranks that share `rank`'s memory against `available`, the bytes that memory can still
// take (Allocator::AvailableBytes; `source` names where the figure came from). On the host the
// ranks of rank's node share it (block placement, mesh.ranks_per_node()); a GPU is taken as
// rank's alone. An error when they exceed it: the figures, the largest rank's terms and what
// to change; OK when they fit or `available` < 0 (unknown).
Status CheckMemoryFits(const config::Config& config, const dist::Mesh& mesh, int rank,
                       int64_t available, const std::string& source);

// The dry-run's lines: the peak broken into its terms, the device, the margin and
// "fits: yes" or "fits: no".
std::string DeviceFitReport(const config::Config& config, const DeviceFit& fit);

}  // namespace switchyard::plan
