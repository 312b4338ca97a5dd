#include "engine/train/run_policy.h"

#include <atomic>
#include <csignal>
#include <cstdio>

namespace switchyard::train {
namespace {

std::atomic<int> g_signal{0};
extern "C" void OnStopSignal(int sig) { g_signal.store(sig); }

}  // namespace

NonFinitePolicy::NonFinitePolicy(const config::TrainConfig& tc)
    : skip_(tc.on_nonfinite == config::NonFiniteAction::kSkip),
      max_in_row_(tc.max_nonfinite_skips) {}

void NonFinitePolicy::Decide(StepMetrics& m) {
  if (m.nonfinite) {
    ++in_row_;
    m.skipped = skip_ && in_row_ <= max_in_row_;
    if (m.skipped) ++skips_;
  } else {
    in_row_ = 0;
  }
  m.nonfinite_skips = skips_;
}

std::string NonFinitePolicy::Describe(const StepMetrics& m) {
  return StrCat("step ", m.step, ": loss ", m.loss, ", gradient norm ", m.grad_norm,
                " (first non-finite gradient: ",
                m.nonfinite_param.empty() ? std::string("none; the loss alone") : m.nonfinite_param,
                ")");
}

std::string NonFinitePolicy::SkipNote(const StepMetrics& m) const {
  return StrCat(Describe(m), "; train.on_nonfinite=skip: update skipped (", in_row_,
                " in a row, at most ", max_in_row_, ")");
}

Status NonFinitePolicy::StopError(const StepMetrics& m, const std::string& latest) const {
  return FailedPrecondition(
      Describe(m),
      skip_ ? StrCat("; ", in_row_, " non-finite steps in a row (train.max_nonfinite_skips=",
                     max_in_row_, ")")
            : std::string("; train.on_nonfinite=stop"),
      ": nothing saved, ", latest, " (lower train.lr or raise train.warmup_steps, then --resume)");
}

StopSignals::StopSignals() {
  g_signal.store(0);
  old_term_ = std::signal(SIGTERM, OnStopSignal);
  old_int_ = std::signal(SIGINT, OnStopSignal);
  installed_ = true;
}

void StopSignals::Restore() {
  if (!installed_) return;
  std::signal(SIGTERM, old_term_);
  std::signal(SIGINT, old_int_);
  installed_ = false;
}

int StopSignals::Agree(dist::Communicator& world) const {
  Tensor flag = Tensor::FromVector<int32_t>({g_signal.load()}, {1});
  world.AllReduce(flag, dist::ReduceOp::kMax);
  return flag.data<int32_t>()[0];
}

}  // namespace switchyard::train
