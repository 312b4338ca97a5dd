#include "engine/train/run_policy.h"

#include "engine/train/checkpointer.h"

#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstring>

namespace switchyard::train {
namespace {

std::atomic<int> g_signal{0};
// The line a second signal prints, in two buffers: the run loop writes the one not in use,
// then publishes it, so the handler never reads a half-written line.
char g_second_line[2][1024];
std::atomic<int> g_second_index{0};
// Set by StopSignals::CatchEarly until the first StopSignals takes over its handlers (and
// the handlers they replaced).
std::atomic<bool> g_early{false};
void (*g_early_term)(int) = nullptr;
void (*g_early_int)(int) = nullptr;

// Publishes the line a second signal prints ("" : no checkpoint yet).
void PublishSecondLine(const std::string& dir) {
  const std::string line =
      dir.empty() ? std::string(
                        "switchyard train: second signal: exiting without saving; "
                        "there is no checkpoint yet\n")
                  : StrCat(
                        "switchyard train: second signal: exiting without saving; the last "
                        "checkpoint ",
                        dir, " is intact\n");
  const int next = 1 - g_second_index.load();
  std::snprintf(g_second_line[next], sizeof(g_second_line[next]), "%s", line.c_str());
  g_second_index.store(next);
}

// The first signal is noted (the step in progress ends, its checkpoint is saved); a second
// one while it is pending ends the process at once: write(2) and _exit, both
// async-signal-safe.
extern "C" void OnStopSignal(int sig) {
  int none = 0;
  if (g_signal.compare_exchange_strong(none, sig)) return;
  const char* line = g_second_line[g_second_index.load()];
  ssize_t written = ::write(STDERR_FILENO, line, std::strlen(line));
  (void)written;
  ::_exit(128 + sig);
}

}  // namespace

NonFinitePolicy::NonFinitePolicy(const config::TrainConfig& tc)
    : skip_(tc.on_nonfinite == config::NonFiniteAction::kSkip),
      max_in_row_(tc.max_nonfinite_skips) {}

nlohmann::json NonFinitePolicy::SavedState() const {
  return {{"in_row", in_row_}, {"skips", skips_}};
}

Status NonFinitePolicy::Restore(const nlohmann::json& trainer_state, const std::string& source) {
  in_row_ = skips_ = 0;
  if (!trainer_state.is_object() || !trainer_state.contains("nonfinite")) return OkStatus();
  const nlohmann::json& saved = trainer_state["nonfinite"];
  int64_t values[2] = {0, 0};
  const char* keys[2] = {"in_row", "skips"};
  for (int i = 0; i < 2; ++i) {
    const nlohmann::json* v = saved.is_object() && saved.contains(keys[i]) ? &saved[keys[i]] : nullptr;
    if (v == nullptr || !v->is_number_integer() || v->get<int64_t>() < 0) {
      return DataLoss(source, ": nonfinite.", keys[i], " is ",
                      v == nullptr ? std::string("missing") : v->dump().substr(0, 40),
                      ", not a count (an integer >= 0)");
    }
    values[i] = v->get<int64_t>();
  }
  in_row_ = values[0];
  skips_ = values[1];
  return OkStatus();
}

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
      ": nothing saved, ", latest, " (lower train.lr or raise train.warmup_steps, then ",
      latest == Checkpointer::kNoCheckpointYet
          ? "train again into an empty --out: there is nothing to resume)"
          : "--resume)");
}

void StopSignals::CatchEarly(const std::string& last_checkpoint) {
  if (g_early.exchange(true)) return;
  g_signal.store(0);
  PublishSecondLine(last_checkpoint);
  g_early_term = std::signal(SIGTERM, OnStopSignal);
  g_early_int = std::signal(SIGINT, OnStopSignal);
}

StopSignals::StopSignals() {
  if (g_early.exchange(false)) {  // caught since CatchEarly: a signal noted then is kept
    old_term_ = g_early_term;
    old_int_ = g_early_int;
  } else {
    g_signal.store(0);
    old_term_ = std::signal(SIGTERM, OnStopSignal);
    old_int_ = std::signal(SIGINT, OnStopSignal);
  }
  SetLastCheckpoint("");
  installed_ = true;
}

void StopSignals::SetLastCheckpoint(const std::string& dir) { PublishSecondLine(dir); }

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
