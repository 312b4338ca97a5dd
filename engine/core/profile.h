// A per-phase time profile of training steps (`switchyard train --profile`): cheap scoped
// timers (steady_clock) that charge the time between their construction and destruction to
// a named phase. Off by default; when off, a ScopedPhase is one load and one branch.
//
// Time is exclusive: a phase opened inside another pauses the outer one, so the phases of
// a step never count the same nanosecond twice and their sum is at most the step's time
// (the rest, time inside no phase, is reported as "other"). Timers only run between
// Profiler::BeginStep and EndStep of the profiler that is recording, so evaluation and
// checkpointing between steps are not counted. Host time: on a GPU, kernels run
// asynchronously and are charged to whichever phase waits for them.
//
//   Profiler profiler;                 // one per training run
//   profiler.BeginStep();              // installs it as the recording profiler
//   { ScopedPhase p(Phase::kAttention); ... }
//   profiler.EndStep(step_seconds);    // uninstalls it; adds the step's time
//
// Besides the phases it adds up the MoE layers' token all-to-alls (the row exchanges of
// dispatch and combine, forward and backward): how long they were in flight, and of that
// how long the step waited for them (exposed); the rest ran while the step computed
// (hidden: moe.overlap_chunks > 1, moe/overlap.h). An exchange without overlap is exposed
// whole (ScopedAllToAll).
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <string>

namespace switchyard {

// The phases of a training step, in print order.
enum class Phase : int {
  kEmbeddingHeadLoss,  // token/position embedding, final norm, head GEMM, cross-entropy
  kAttention,          // q/k/v/o projections, rope, core attention (forward and backward)
  kNorms,              // the blocks' pre-attention and pre-FFN norms
  kDenseMlp,           // dense (non-MoE) MLPs
  kRouter,             // router logits, softmax, top-k, capacity, aux/z losses, statistics
  kDispatch,           // dispatch plan, permute, count and row all-to-alls, regroup (and their
                       // mirror in backward)
  kExperts,            // the grouped expert MLPs (and shared experts)
  kCombine,            // ungroup, return all-to-all, gate-weighted combine (and backward)
  kCommunication,      // gradient sync, ZeRO gathers, tied-embedding sums, step statistics,
                       // pipeline send/recv (with the wait for the peer: the bubble)
  kOptimizer,          // gradient clipping and the optimizer update
  kCount,
};

// The phase's name as printed and written to profile.json ("attention", "dense_mlp", ...).
const char* PhaseName(Phase phase);

class Profiler {
 public:
  // Starts a step: this profiler records until EndStep. CHECK-fails if one already records.
  void BeginStep();
  // Ends the step begun last; step_seconds is the step's measured wall time (the total the
  // phases are a part of).
  void EndStep(double step_seconds);

  // The profiler recording now, or nullptr (profiling off, or between steps).
  static Profiler* Recording() { return recording_; }

  int64_t steps() const { return steps_; }
  double step_seconds() const { return step_seconds_; }
  double seconds(Phase phase) const { return seconds_[static_cast<int>(phase)]; }
  // step_seconds() minus every phase: time inside no phase (never negative).
  double other_seconds() const;

  // One token all-to-all: `seconds` in flight, `exposed_seconds` of them waited for.
  void AddAllToAll(double seconds, double exposed_seconds);
  double all_to_all_seconds() const { return all_to_all_s_; }
  double all_to_all_exposed_seconds() const { return all_to_all_exposed_s_; }
  // In flight while the step computed: seconds minus exposed (never negative).
  double all_to_all_hidden_seconds() const;

  // A table: phase, total ms, ms per step, share of the step time; "other" and the total.
  std::string Table() const;
  // {"steps", "step_s", "phases": {name: seconds, ..., "other": s}, "ms_per_step": {...}}.
  std::string Json() const;

 private:
  friend class ScopedPhase;
  using Clock = std::chrono::steady_clock;
  // Charges the time since the last switch to the open phase (if any), opens `next`
  // (kCount: none) and returns the phase that was open.
  Phase Switch(Phase next);

  static inline Profiler* recording_ = nullptr;
  std::array<double, static_cast<int>(Phase::kCount)> seconds_{};
  Phase open_ = Phase::kCount;
  Clock::time_point since_;
  int64_t steps_ = 0;
  double step_seconds_ = 0.0;
  double all_to_all_s_ = 0.0, all_to_all_exposed_s_ = 0.0;
};

// Charges its lifetime to the recording profiler (if any) as a token all-to-all that
// nothing overlapped: in flight and exposed alike; `active` false: nothing (a group of one
// rank). Call from the profiled thread.
class ScopedAllToAll {
 public:
  explicit ScopedAllToAll(bool active = true);
  ~ScopedAllToAll();
  ScopedAllToAll(const ScopedAllToAll&) = delete;
  ScopedAllToAll& operator=(const ScopedAllToAll&) = delete;

 private:
  Profiler* profiler_;
  std::chrono::steady_clock::time_point start_;
};

// Charges its lifetime to `phase` while a profiler records; nested scopes pause it.
class ScopedPhase {
 public:
  explicit ScopedPhase(Phase phase) : profiler_(Profiler::Recording()) {
    if (profiler_ != nullptr) outer_ = profiler_->Switch(phase);
  }
  ~ScopedPhase() {
    if (profiler_ != nullptr) profiler_->Switch(outer_);
  }
  ScopedPhase(const ScopedPhase&) = delete;
  ScopedPhase& operator=(const ScopedPhase&) = delete;

 private:
  Profiler* profiler_;
  Phase outer_ = Phase::kCount;
};

}  // namespace switchyard
