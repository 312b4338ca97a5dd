// What a training run shows and writes: the per-step progress line, one JSON object per
// step in metrics.jsonl, the load-balance summary per MoE layer, and the routing-by-label
// (language) table that shows which experts each language's tokens go to.
#pragma once

#include <cstdint>
#include <fstream>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/device_context.h"
#include "engine/core/status.h"
#include "moe/moe_layer.h"

namespace switchyard::train {

// One step's numbers, already reduced over the data-parallel world.
struct StepMetrics {
  int64_t step = 0;
  double loss = 0, ce_loss = 0, aux_loss = 0, z_loss = 0;  // aux/z: summed over MoE layers
  double lr = 0, grad_norm = 0, tokens_per_s = 0, step_s = 0;
  // A step whose loss or gradient norm was not finite (train.on_nonfinite): the first
  // parameter whose gradient was not, whether its update was skipped, and the run's count
  // of skipped steps so far.
  bool nonfinite = false, skipped = false;
  std::string nonfinite_param;
  int64_t nonfinite_skips = 0;
  std::vector<int64_t> moe_layer_ids;
  std::vector<moe::MoEStats> moe;  // per MoE layer, reduced over the dp world
};

// "step 12 | loss 5.1234 (ce 5.1100 aux 0.0123 z 0.0011) | lr 3.0e-04 | 12345 tok/s |
//  dropped 1.2% | load min 8.1% max 16.2%"
std::string ProgressLine(const StepMetrics& m);

// The balance of per-expert counts (E): max_violation = max / mean - 1 (MaxVio of the
// aux-loss-free balancing paper, Wang et al. 2024), and the coefficient of variation
// (population standard deviation / mean). Both 0 when every count is 0.
double MaxViolation(const std::vector<int64_t>& counts);
double LoadCv(const std::vector<int64_t>& counts);

// One MoE layer's statistics as JSON: layer, tokens, assignments, [tokens_per_expert
// (before dropping), tokens_per_expert_kept, when with_counts], dropped, dropped_frac,
// router_entropy, aux, z, min_load, max_load (shares of kept assignments), max_violation
// and load_cv (of the counts before dropping: the router's balance).
nlohmann::ordered_json MoEStatsJson(int64_t layer, const moe::MoEStats& stats,
                                    bool with_counts = true);

// One line of JSON with step, loss, ce_loss, aux_loss, z_loss, lr, grad_norm, tokens_per_s,
// step_s, and per MoE layer the scalars of MoEStatsJson without the per-expert counts
// (those go to RoutingJson every logging.routing_every steps); after a non-finite step also
// "nonfinite": true, "skipped", "nonfinite_param", and from the first skipped step on
// "nonfinite_skips" (the run's count).
std::string MetricsJson(const StepMetrics& m);

// One line of routing.jsonl: {"step", "layers": [ids], "tokens_per_expert": [[E] per layer],
// "tokens_per_expert_kept": [[E] per layer]} and, when expert_bias is not empty,
// "expert_bias": [[E] per layer] (the bias after this step's update).
std::string RoutingJson(const StepMetrics& m, const std::vector<std::vector<double>>& expert_bias);

// Appends lines to a file, each with one write(2) straight to the file (so a killed run
// keeps every record it logged, whole). A record that cannot be written whole (a full disk,
// a file-size limit) is cut back out of the file, so no line is ever torn; the first such
// failure prints one warning to stderr, later ones are counted (failed()), and training
// goes on: metrics are not worth losing a run.
class JsonlWriter {
 public:
  // keep_before_step 0: a new, empty file. > 0 (a resumed run): the file keeps its records
  // whose "step" is below keep_before_step, in order, and loses the rest (those logged
  // after the checkpoint being resumed, and any torn line), rewritten atomically, so every
  // step appears once.
  static StatusOr<JsonlWriter> Open(const std::string& path, int64_t keep_before_step);
  JsonlWriter(JsonlWriter&& other) noexcept;
  JsonlWriter& operator=(JsonlWriter&& other) noexcept;
  JsonlWriter(const JsonlWriter&) = delete;
  JsonlWriter& operator=(const JsonlWriter&) = delete;
  ~JsonlWriter();

  // Appends line + '\n' whole, or not at all. False when it was not written.
  bool Write(const std::string& line);
  // Records that could not be written so far.
  int64_t failed() const { return failed_; }
  // Records dropped by Open (logged after the resumed step).
  int64_t dropped() const { return dropped_; }

 private:
  JsonlWriter() = default;
  std::string path_;
  int fd_ = -1;
  int64_t failed_ = 0, dropped_ = 0;
};

// Counts of top-k assignments by (label, expert) for each MoE layer.
class RoutingByLabel {
 public:
  RoutingByLabel(std::vector<std::string> labels, std::vector<int64_t> layer_ids,
                 int64_t num_experts);
  // indices: (T, k) i32 router choices of one layer (by position in layer_ids);
  // labels: (T) label ids of the same tokens.
  void Add(size_t layer, const Tensor& indices, const Tensor& labels);
  // Add in a training step, when ctx has the step's readback open: the counts are made on
  // indices' device into the readback (one slot range per layer and step, which every
  // micro-batch adds to), nothing waits, and Resolve adds them to the totals once the step's
  // values are read back. Otherwise Add (which reads the indices back at once).
  void AddInStep(size_t layer, const Tensor& indices, const Tensor& labels, DeviceContext* ctx);
  // Adds the counts AddInStep left in the step's readback, whose values are `slots`.
  void Resolve(std::span<const double> slots);
  // Sums over the ranks of comm (every rank ends with the totals).
  void AllReduce(dist::Communicator& comm);
  // Per layer: rows = labels, columns = experts, each cell the share (%) of that label's
  // assignments sent to that expert, and the label's most-used expert.
  std::string Table() const;
  const std::vector<int64_t>& counts(size_t layer) const { return counts_[layer]; }
  // The counts as one JSON object (routing_by_language.json): {"labels": [L names],
  // "layers": [ids], "num_experts": E, "counts": [per layer [per label [E]]]}.
  std::string Json() const;

 private:
  std::vector<std::string> labels_;
  std::vector<int64_t> layer_ids_;
  int64_t num_experts_;
  std::vector<std::vector<int64_t>> counts_;  // per layer: (labels, E)
  // Per layer: the first of this step's (labels * E + 1) readback slots, or -1.
  std::vector<int64_t> pending_first_;
  std::vector<Tensor> pending_values_;  // per layer: those slots on the device
};

// Per MoE layer: tokens per expert (share of kept assignments), dropped fraction, router
// entropy (and its maximum ln E), least/most loaded expert and the coefficient of variation.
std::string LoadBalanceSummary(const std::vector<int64_t>& layer_ids,
                               const std::vector<moe::MoEStats>& stats);

}  // namespace switchyard::train
