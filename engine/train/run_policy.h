// When the run loop (Trainer::Run) acts, each decision in the component it belongs to, as
// torchtitan's trainer asks validator.should_validate(step) rather than deciding itself
// (the checkpoints' timing is checkpointer.h's):
//   EvalSchedule        validation every train.eval_every steps and after the run's last
//   RoutingLogSchedule  routing.jsonl every logging.routing_every steps, the run's last and
//                       the step a signal stopped it at
//   NonFinitePolicy     train.on_nonfinite: skip a non-finite step, or stop the run
//   StopSignals         SIGTERM / SIGINT during a run, agreed over the ranks
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/config/train_config.h"
#include "engine/core/status.h"
#include "engine/dist/communicator.h"
#include "engine/train/metrics.h"

namespace switchyard::train {

// Validation every `every` steps (0: never) and after the run's last step, when there are
// validation batches.
class EvalSchedule {
 public:
  EvalSchedule(int64_t every, bool has_batches) : every_(every), has_batches_(has_batches) {}
  // Whether to validate after `steps_done` steps; last_step: the run's last.
  bool ShouldEvaluate(int64_t steps_done, bool last_step) const {
    return every_ > 0 && (steps_done % every_ == 0 || last_step) && has_batches_;
  }

 private:
  int64_t every_;
  bool has_batches_;
};

// The per-expert counts to routing.jsonl: every `every` steps (0: only the others), the
// run's last step and the step a signal stopped it at; never for a model without MoE layers.
class RoutingLogSchedule {
 public:
  explicit RoutingLogSchedule(int64_t every) : every_(every) {}
  // Whether step m is logged; last_step: it is the run's last; stopped: a signal stops the
  // run after it.
  bool ShouldLog(const StepMetrics& m, bool last_step, bool stopped) const {
    return !m.moe.empty() && ((every_ > 0 && m.step % every_ == 0) || last_step || stopped);
  }

 private:
  int64_t every_;
};

// train.on_nonfinite: a step whose loss or gradient norm is not finite is skipped (no
// update) under "skip" while at most train.max_nonfinite_skips ran in a row; otherwise the
// run stops with an error naming the step, its numbers and the first non-finite gradient.
class NonFinitePolicy {
 public:
  explicit NonFinitePolicy(const config::TrainConfig& tc);
  // The counts a checkpoint keeps (trainer_state.json's "nonfinite": in_row, skips), so that
  // a resumed run decides each step as the uninterrupted one would.
  nlohmann::json SavedState() const;
  // Takes them back from a checkpoint's trainer state (none in one saved before they were
  // kept: 0 and 0); a bad value is DataLoss naming `source` and the field.
  Status Restore(const nlohmann::json& trainer_state, const std::string& source);
  // Decides step m: sets m.skipped and m.nonfinite_skips (the skips so far).
  void Decide(StepMetrics& m);
  // A decided step that stops the run: not finite and not skipped.
  static bool Stops(const StepMetrics& m) { return m.nonfinite && !m.skipped; }
  // The line rank 0 prints for a skipped step (no newline).
  std::string SkipNote(const StepMetrics& m) const;
  // The error of a step that stops the run; latest: what the output directory keeps
  // (Checkpointer::Latest).
  Status StopError(const StepMetrics& m, const std::string& latest) const;
  // Steps skipped so far, over every run.
  int64_t skips() const { return skips_; }

 private:
  // "step 3: loss nan, gradient norm nan (first non-finite gradient: NAME)".
  static std::string Describe(const StepMetrics& m);

  bool skip_;            // train.on_nonfinite == skip
  int64_t max_in_row_;   // train.max_nonfinite_skips
  int64_t in_row_ = 0;   // non-finite steps in a row
  int64_t skips_ = 0;
};

// SIGTERM and SIGINT are caught from construction to Restore() (or destruction), the
// handlers found then put back; a caught signal lets the step finish. A second one while
// the first is pending ends the process at once, without saving: one line on stderr
// naming the last checkpoint (SetLastCheckpoint), exit status 128 + the signal (130 for
// SIGINT, 143 for SIGTERM, as shells report a death by it).
class StopSignals {
 public:
  StopSignals();
  ~StopSignals() { Restore(); }
  // Notes SIGTERM and SIGINT from now on, for a run still starting (loading a checkpoint,
  // verifying data): the next StopSignals keeps a signal caught before it, so the run
  // stops after its first step with that step saved (exit 75) instead of dying unsaved.
  // last_checkpoint: what a second signal's line names as intact ("": none).
  static void CatchEarly(const std::string& last_checkpoint);
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The checkpoint a second signal's line names as intact ("": none yet).
  void SetLastCheckpoint(const std::string& dir);
  // Puts the previous handlers back (once).
  void Restore();
  // The signal any rank of world caught (the largest number), 0 for none: every rank stops
  // at the same step. Collective over world.
  int Agree(dist::Communicator& world) const;

 private:
  using Handler = void (*)(int);
  Handler old_term_ = nullptr, old_int_ = nullptr;
  bool installed_ = false;
};

}  // namespace switchyard::train
