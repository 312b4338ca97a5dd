// A per-phase time profile of training steps (`switchyard train --profile`): cheap scoped
// timers (steady_clock) that charge the time between their construction and destruction to
// a named phase. Off by default; when off, a ScopedPhase is one load and one branch.
//
// Time is exclusive: a phase opened inside another pauses the outer one, so the phases of
// a step never count the same nanosecond twice and their sum is at most the step's time
// (the rest, time inside no phase, is reported as "other"). Timers only run between
// Profiler::BeginStep and EndStep of the profiler that is recording, so evaluation and
// checkpointing between steps are not counted. Host time: on a GPU, kernels run
// asynchronously and are charged to whichever phase waits for them. So on a GPU
// (UseDeviceTiming) every phase switch also records a CUDA event on the stream, and EndStep
// waits for the step's last event and charges the GPU time between consecutive events to
// the phase open between them: device_seconds(phase) is GPU time. The first
// skip_steps() steps (warm-up: allocator misses, cuBLAS heuristics) are not profiled; on a GPU
// the first profiled step also starts an attached external profiler (cudaProfilerStart), so
// that Nsight Compute's kernel times skip them too (scripts/gpu_bench.sh's kernel profile).
//
// Each profiled step also records the device counts of engine/core/counters.h (kernel
// dispatches, readbacks by site, dtype conversions, cudaMalloc calls): step_counts() per
// step, printed and written to profile.json.
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
#include <memory>
#include <string>
#include <vector>

#include "engine/core/counters.h"

namespace switchyard {

class DeviceContext;

namespace internal {
// GPU timing of the phases (profile_cuda.cc): an event per phase switch on the stream.
class PhaseEvents {
 public:
  virtual ~PhaseEvents() = default;
  // An event now on the stream, closing a span of phase `closing` (kCount: none).
  virtual void Record(int closing) = 0;
  // Waits for the last event; adds each closed span's GPU seconds to seconds[phase] (spans
  // of no phase to seconds[kCount]) and the first-to-last time to *step; forgets the events.
  virtual void Collect(double* seconds, double* step) = 0;
  // Tells an attached external profiler that the profiled steps begin (cudaProfilerStart:
  // Nsight Compute run with --profile-from-start off records from here, so the warm-up steps
  // and the initialisation before them stay out of its kernel times). Called once.
  virtual void StartExternalProfiler() = 0;
};
// Null in a build without the CUDA backend or for a host context.
std::unique_ptr<PhaseEvents> MakePhaseEvents(DeviceContext* ctx);
}  // namespace internal

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
  kGraphReplay,        // runtime.cuda_graphs: the micro-batches' forward and backward replayed
                       // as one CUDA graph (the phases above then see none of them)
  kCount,
};

// The phase's name as printed and written to profile.json ("attention", "dense_mlp", ...).
const char* PhaseName(Phase phase);

class Profiler {
 public:
  Profiler();
  ~Profiler();

  // Starts a step: this profiler records until EndStep. CHECK-fails if one already records.
  // One of the first skip_steps() steps is run but not profiled (nothing records).
  void BeginStep();
  // Ends the step begun last; step_seconds is the step's measured wall time (the total the
  // phases are a part of).
  void EndStep(double step_seconds);

  // Steps at the start not profiled (warm-up); 0 by default. Call before the first step.
  void set_skip_steps(int64_t steps) { skip_steps_ = steps; }
  int64_t skip_steps() const { return skip_steps_; }
  int64_t skipped_steps() const { return skipped_; }
  // Times the phases on ctx's stream with CUDA events too (a no-op for a host context or
  // a build without CUDA). Call before the first step.
  void UseDeviceTiming(DeviceContext* ctx);
  bool device_timing() const { return events_ != nullptr; }
  // GPU seconds of a phase (device_timing only); "other" is device_step_seconds() minus
  // the phases.
  double device_seconds(Phase phase) const { return device_seconds_[static_cast<int>(phase)]; }
  double device_step_seconds() const { return device_step_s_; }

  // The device counts of each profiled step, in order, and their sum.
  const std::vector<DeviceCounts>& step_counts() const { return step_counts_; }
  DeviceCounts total_counts() const;

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

  // A table: phase, total ms, ms per step, share of the step time (and GPU ms per step with
  // device timing); "other" and the total; then the device counts per step.
  std::string Table() const;
  // {"steps", "skipped_steps", "step_s", "phases": {name: seconds, ..., "other": s},
  //  "ms_per_step": {...}, "all_to_all": {...}, "counts_per_step": DeviceCounts::Json of the
  //  mean, "counts": [one per profiled step]} and with device timing "device_step_s",
  //  "device_phases".
  std::string Json() const;

 private:
  friend class ScopedPhase;
  using Clock = std::chrono::steady_clock;
  // Charges the time since the last switch to the open phase (if any), opens `next`
  // (kCount: none) and returns the phase that was open.
  Phase Switch(Phase next);

  static inline Profiler* recording_ = nullptr;
  int64_t skip_steps_ = 0, skipped_ = 0;
  bool external_started_ = false;  // StartExternalProfiler called
  bool skipping_ = false;  // inside a skipped step
  DeviceCounts step_start_;
  std::vector<DeviceCounts> step_counts_;
  std::unique_ptr<internal::PhaseEvents> events_;
  std::array<double, static_cast<int>(Phase::kCount) + 1> device_seconds_{};  // + no phase
  double device_step_s_ = 0.0;
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
