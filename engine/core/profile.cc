#include "engine/core/profile.h"

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <utility>
#include <vector>

#include "engine/core/check.h"

namespace switchyard {
namespace {

constexpr const char* kNames[] = {"embedding_head_loss", "attention", "norms", "dense_mlp",
                                  "router", "dispatch", "experts", "combine",
                                  "communication", "optimizer", "graph_replay"};
static_assert(std::size(kNames) == static_cast<size_t>(Phase::kCount));

// The device counts (engine/core/counters.h) of `steps` steps, per step: the totals, the
// dispatches by op (the most frequent first, a few to a line) and the readbacks by site.
std::string CountsTable(const DeviceCounts& total, double steps) {
  std::string out;
  char line[256];
  std::snprintf(line, sizeof(line),
                "device counts per step: %.1f kernel dispatches, %.2f readbacks, %.1f dtype "
                "conversions (%.4g elements; weights %.1f), %.1f cudaMalloc\n",
                total.dispatches / steps, total.readbacks / steps, total.conversions() / steps,
                total.conversion_element_total() / steps, total.weight_conversion_calls / steps,
                total.cuda_mallocs / steps);
  out += line;
  std::vector<std::pair<int64_t, std::string>> ops;
  for (const auto& [op, n] : total.dispatch_ops) ops.emplace_back(-n, op);
  std::sort(ops.begin(), ops.end());
  std::string row_text = "  dispatches by op:";
  for (size_t i = 0; i < ops.size(); ++i) {
    std::snprintf(line, sizeof(line), " %s %.1f%s", ops[i].second.c_str(), -ops[i].first / steps,
                  i + 1 < ops.size() ? "," : "");
    if (row_text.size() + std::strlen(line) > 96) {
      out += row_text + "\n";
      row_text = "   ";
    }
    row_text += line;
  }
  if (!ops.empty()) out += row_text + "\n";
  for (const auto& [site, n] : total.readback_sites) {
    std::snprintf(line, sizeof(line), "  readback %-28s %8.2f per step\n", site.c_str(),
                  n / steps);
    out += line;
  }
  return out;
}

}  // namespace

#ifndef SY_HAVE_CUDA
namespace internal {
std::unique_ptr<PhaseEvents> MakePhaseEvents(DeviceContext*) { return nullptr; }
}  // namespace internal
#endif

const char* PhaseName(Phase phase) {
  const int i = static_cast<int>(phase);
  return i >= 0 && i < static_cast<int>(Phase::kCount) ? kNames[i] : "other";
}

Profiler::Profiler() = default;
Profiler::~Profiler() {
  if (recording_ == this) recording_ = nullptr;
}

void Profiler::UseDeviceTiming(DeviceContext* ctx) { events_ = internal::MakePhaseEvents(ctx); }

void Profiler::BeginStep() {
  SY_CHECK(recording_ == nullptr && !skipping_) << "a profiler is already recording a step";
  if (skipped_ < skip_steps_) {
    skipping_ = true;
    return;
  }
  recording_ = this;
  open_ = Phase::kCount;
  step_start_ = counters::Snapshot();
  if (events_ && !external_started_) {
    events_->StartExternalProfiler();
    external_started_ = true;
  }
  if (events_) events_->Record(static_cast<int>(Phase::kCount));
  since_ = Clock::now();
}

void Profiler::EndStep(double step_seconds) {
  if (skipping_) {
    skipping_ = false;
    ++skipped_;
    return;
  }
  SY_CHECK(recording_ == this) << "EndStep without BeginStep";
  SY_CHECK(open_ == Phase::kCount) << "EndStep inside phase " << PhaseName(open_);
  recording_ = nullptr;
  ++steps_;
  step_seconds_ += step_seconds;
  step_counts_.push_back(counters::Snapshot().Minus(step_start_));
  if (events_) {
    events_->Record(static_cast<int>(Phase::kCount));
    events_->Collect(device_seconds_.data(), &device_step_s_);
  }
}

DeviceCounts Profiler::total_counts() const {
  DeviceCounts sum;
  for (const DeviceCounts& c : step_counts_) sum.Add(c);
  return sum;
}

Phase Profiler::Switch(Phase next) {
  if (events_) events_->Record(static_cast<int>(open_));
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
  char line[256];
  const double steps = static_cast<double>(std::max<int64_t>(steps_, 1));
  std::snprintf(line, sizeof(line), "profile over %lld step(s), %.3f s of step time",
                static_cast<long long>(steps_), step_seconds_);
  out += line;
  if (skipped_ > 0) {
    std::snprintf(line, sizeof(line), " (the first %lld step(s) skipped: warm-up)",
                  static_cast<long long>(skipped_));
    out += line;
  }
  std::snprintf(line, sizeof(line), ":\n");
  out += line;
  std::snprintf(line, sizeof(line), "  %-20s %12s %12s %8s\n", "phase", "total (ms)",
                "ms/step", "share");
  out += line;
  auto row = [&](const char* name, double s) {
    std::snprintf(line, sizeof(line), "  %-20s %12.2f %12.3f %7.1f%%\n", name, 1e3 * s,
                  1e3 * s / steps, step_seconds_ > 0 ? 100.0 * s / step_seconds_ : 0.0);
    out += line;
  };
  for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) {
    // The graph replay's row only when the run replayed (runtime.cuda_graphs).
    if (i == static_cast<int>(Phase::kGraphReplay) && seconds_[i] == 0.0) continue;
    row(kNames[i], seconds_[i]);
  }
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
  if (events_) {
    std::snprintf(line, sizeof(line), "GPU time (CUDA events), ms/step:");
    out += line;
    double phases = 0.0;
    for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) {
      phases += device_seconds_[i];
      std::snprintf(line, sizeof(line), " %s %.3f,", kNames[i], 1e3 * device_seconds_[i] / steps);
      out += line;
    }
    std::snprintf(line, sizeof(line), " other %.3f; step %.3f\n",
                  1e3 * std::max(0.0, device_step_s_ - phases) / steps,
                  1e3 * device_step_s_ / steps);
    out += line;
  }
  out += CountsTable(total_counts(), steps);
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
  char a2a[192];
  std::snprintf(a2a, sizeof(a2a),
                ", \"all_to_all\": {\"in_flight_s\": %.9g, \"exposed_s\": %.9g, "
                "\"hidden_s\": %.9g}",
                all_to_all_s_, all_to_all_s_ - all_to_all_hidden_seconds(),
                all_to_all_hidden_seconds());
  std::string counts = ", \"counts_per_step\": " + total_counts().Json(std::max<int64_t>(steps_, 1)) +
                       ", \"counts\": [";
  for (size_t i = 0; i < step_counts_.size(); ++i) {
    counts += (i ? ", " : "") + step_counts_[i].Json();
  }
  counts += "]";
  char skipped[64];
  std::snprintf(skipped, sizeof(skipped), "\"skipped_steps\": %lld, ",
                static_cast<long long>(skipped_));
  std::string device;
  if (events_) {
    std::string ph;
    double sum = 0.0;
    for (int i = 0; i < static_cast<int>(Phase::kCount); ++i) {
      std::snprintf(buf, sizeof(buf), "%s\"%s\": %.9g", i ? ", " : "", kNames[i],
                    device_seconds_[i]);
      ph += buf;
      sum += device_seconds_[i];
    }
    std::snprintf(buf, sizeof(buf), ", \"other\": %.9g", std::max(0.0, device_step_s_ - sum));
    ph += buf;
    std::snprintf(buf, sizeof(buf), ", \"device_step_s\": %.9g", device_step_s_);
    device = std::string(buf) + ", \"device_phases\": {" + ph + "}";
  }
  std::snprintf(buf, sizeof(buf), "{\"steps\": %lld, \"step_s\": %.9g, ",
                static_cast<long long>(steps_), step_seconds_);
  return std::string(buf) + skipped + "\"phases\": {" + phases + "}, \"ms_per_step\": {" +
         per_step + "}" + a2a + counts + device + "}\n";
}

}  // namespace switchyard
