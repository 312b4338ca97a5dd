#include "engine/core/profile.h"

#include <algorithm>
#include <cstdio>

#include "engine/core/check.h"

namespace switchyard {
namespace {

constexpr const char* kNames[] = {"embedding_head_loss", "attention", "norms", "dense_mlp",
                                  "router", "dispatch", "experts", "combine",
                                  "communication", "optimizer"};
static_assert(std::size(kNames) == static_cast<size_t>(Phase::kCount));

}  // namespace

const char* PhaseName(Phase phase) {
  const int i = static_cast<int>(phase);
  return i >= 0 && i < static_cast<int>(Phase::kCount) ? kNames[i] : "other";
}

void Profiler::BeginStep() {
  SY_CHECK(recording_ == nullptr) << "a profiler is already recording a step";
  recording_ = this;
  open_ = Phase::kCount;
  since_ = Clock::now();
}

void Profiler::EndStep(double step_seconds) {
  SY_CHECK(recording_ == this) << "EndStep without BeginStep";
  SY_CHECK(open_ == Phase::kCount) << "EndStep inside phase " << PhaseName(open_);
  recording_ = nullptr;
  ++steps_;
  step_seconds_ += step_seconds;
}

Phase Profiler::Switch(Phase next) {
  const Clock::time_point now = Clock::now();
  if (open_ != Phase::kCount) {
    seconds_[static_cast<int>(open_)] += std::chrono::duration<double>(now - since_).count();
  }
  const Phase was = open_;
  open_ = next;
  since_ = now;
  return was;
}

double Profiler::other_seconds() const {
  double phases = 0.0;
  for (double s : seconds_) phases += s;
  return std::max(0.0, step_seconds_ - phases);
}

void Profiler::AddAllToAll(double seconds, double exposed_seconds) {
  all_to_all_s_ += seconds;
  all_to_all_exposed_s_ += exposed_seconds;
}

double Profiler::all_to_all_hidden_seconds() const {
  return std::max(0.0, all_to_all_s_ - all_to_all_exposed_s_);
}

ScopedAllToAll::ScopedAllToAll(bool active)
    : profiler_(active ? Profiler::Recording() : nullptr) {
  if (profiler_ != nullptr) start_ = std::chrono::steady_clock::now();
}

ScopedAllToAll::~ScopedAllToAll() {
  if (profiler_ == nullptr) return;
  const double s =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  profiler_->AddAllToAll(s, s);
}

std::string Profiler::Table() const {
  std::string out;
  char line[160];
  const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
  std::snprintf(line, sizeof(line), "profile over %lld step(s), %.3f s of step time:\n",
                static_cast<long long>(steps_), step_seconds_);
  out += line;
  std::snprintf(line, sizeof(line), "  %-20s %12s %12s %8s\n", "phase", "total (ms)",
                "ms/step", "share");
  out += line;
  auto row = [&](const char* name, double s) {
    std::snprintf(line, sizeof(line), "  %-20s %12.2f %12.3f %7.1f%%\n", name, 1e3 * s,
                  1e3 * s / steps, step_seconds_ > 0 ? 100.0 * s / step_seconds_ : 0.0);
    out += line;
  };
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) row(kNames[i], seconds_[i]);
  row("other", other_seconds());
  row("step", step_seconds_);
  // The token all-to-alls: in flight, waited for (exposed) and overlapped (hidden). Their
  // time is inside the dispatch / combine / experts phases above, not beside them.
  const double a2a = all_to_all_s_, hidden = all_to_all_hidden_seconds();
  const double exposed = a2a - hidden;
  auto share = [&](double s) { return a2a > 0 ? 100.0 * s / a2a : 0.0; };
  std::snprintf(line, sizeof(line),
                "token all-to-all: %.3f ms/step in flight, exposed %.3f ms/step (%.1f%%), "
                "hidden %.3f ms/step (%.1f%%)\n",
                1e3 * a2a / steps, 1e3 * exposed / steps, share(exposed), 1e3 * hidden / steps,
                share(hidden));
  out += line;
  return out;
}

std::string Profiler::Json() const {
  // Plain text (engine/core has no JSON library); names are fixed identifiers.
  const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
  std::string phases, per_step;
  char buf[128];
  auto add = [&](const char* name, double s) {
    const char* sep = phases.empty() ? "" : ", ";
    std::snprintf(buf, sizeof(buf), "%s\"%s\": %.9g", sep, name, s);
    phases += buf;
    std::snprintf(buf, sizeof(buf), "%s\"%s\": %.6g", sep, name, 1e3 * s / steps);
    per_step += buf;
  };
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) add(kNames[i], seconds_[i]);
  add("other", other_seconds());
  std::snprintf(buf, sizeof(buf), "{\"steps\": %lld, \"step_s\": %.9g, ",
                static_cast<long long>(steps_), step_seconds_);
  char a2a[192];
  std::snprintf(a2a, sizeof(a2a),
                ", \"all_to_all\": {\"in_flight_s\": %.9g, \"exposed_s\": %.9g, "
                "\"hidden_s\": %.9g}",
                all_to_all_s_, all_to_all_s_ - all_to_all_hidden_seconds(),
                all_to_all_hidden_seconds());
  return std::string(buf) + "\"phases\": {" + phases + "}, \"ms_per_step\": {" + per_step +
         "}" + a2a + "}\n";
}

}  // namespace switchyard
