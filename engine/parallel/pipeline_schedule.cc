// Pipeline schedules as action lists: the names, the settings check and the three
// generators (GPipe, 1F1B, interleaved 1F1B); see pipeline_schedule.h. The validator is in
// pipeline_validate.cc, the simulator, chart and bubble formulas in pipeline_timeline.cc.
#include "engine/parallel/pipeline_schedule.h"

#include <algorithm>

#include "engine/core/check.h"
#include "engine/parallel/pipeline_internal.h"

namespace switchyard::parallel {

using pipeline_internal::IsCompute;
using pipeline_internal::IsSend;
using pipeline_internal::StageMap;

namespace {

// Forward of (micro_batch, chunk) with its messages: [recv activation] forward [send it on].
void AppendForward(const StageMap& map, int rank, int micro_batch, int chunk,
                   std::vector<Action>& out) {
  const int stage = map.Stage(rank, chunk);
  if (!map.IsFirst(stage)) {
    out.push_back({ActionKind::kRecvActivation, micro_batch, chunk, map.RankOf(stage - 1)});
  }
  out.push_back({ActionKind::kForward, micro_batch, chunk, -1});
  if (!map.IsLast(stage)) {
    out.push_back({ActionKind::kSendActivation, micro_batch, chunk, map.RankOf(stage + 1)});
  }
}

// Backward of (micro_batch, chunk): [recv output gradient] backward [send input gradient].
void AppendBackward(const StageMap& map, int rank, int micro_batch, int chunk,
                    std::vector<Action>& out) {
  const int stage = map.Stage(rank, chunk);
  if (!map.IsLast(stage)) {
    out.push_back({ActionKind::kRecvGradient, micro_batch, chunk, map.RankOf(stage + 1)});
  }
  out.push_back({ActionKind::kBackward, micro_batch, chunk, -1});
  if (!map.IsFirst(stage)) {
    out.push_back({ActionKind::kSendGradient, micro_batch, chunk, map.RankOf(stage - 1)});
  }
}

void GPipeActions(const StageMap& map, int m, int rank, std::vector<Action>& out) {
  for (int i = 0; i < m; ++i) AppendForward(map, rank, i, 0, out);
  for (int i = 0; i < m; ++i) AppendBackward(map, rank, i, 0, out);
}

// PipeDream-flush: warm-up forwards, then forward i + warmup / backward i pairs, then the
// backwards left.
void OneFOneBActions(const StageMap& map, int m, int rank, std::vector<Action>& out) {
  const int warmup = std::min(map.pp - rank - 1, m);
  for (int i = 0; i < warmup; ++i) AppendForward(map, rank, i, 0, out);
  for (int i = 0; i < m - warmup; ++i) {
    AppendForward(map, rank, warmup + i, 0, out);
    AppendBackward(map, rank, i, 0, out);
  }
  for (int i = m - warmup; i < m; ++i) AppendBackward(map, rank, i, 0, out);
}

// Interleaved 1F1B. The k-th forward of a rank (k = 0 .. v*m - 1) runs micro-batch
// (k / (pp v)) pp + k % pp on chunk (k % (pp v)) / pp: pp micro-batches through chunk 0,
// the same pp through chunk 1, ..., then the next pp. The k-th backward runs the same
// micro-batch on chunk v - 1 - (k % (pp v)) / pp. Warm-up (Megatron-LM's count):
// (pp - rank - 1) * 2 + (v - 1) * pp forwards, at most v*m.
void InterleavedActions(const StageMap& map, int m, int rank, std::vector<Action>& out) {
  const int pp = map.pp, v = map.chunks, total = v * m;
  const auto micro_batch = [&](int k) { return k / (pp * v) * pp + k % pp; };
  const auto forward_chunk = [&](int k) { return k % (pp * v) / pp; };
  const auto backward_chunk = [&](int k) { return v - 1 - forward_chunk(k); };
  const int warmup = std::min((pp - rank - 1) * 2 + (v - 1) * pp, total);
  for (int k = 0; k < warmup; ++k) AppendForward(map, rank, micro_batch(k), forward_chunk(k), out);
  for (int k = 0; k < total - warmup; ++k) {
    const int f = warmup + k;
    AppendForward(map, rank, micro_batch(f), forward_chunk(f), out);
    AppendBackward(map, rank, micro_batch(k), backward_chunk(k), out);
  }
  for (int k = total - warmup; k < total; ++k) {
    AppendBackward(map, rank, micro_batch(k), backward_chunk(k), out);
  }
}

}  // namespace

std::string_view PipelineScheduleName(PipelineSchedule schedule) {
  return NameOf(kPipelineScheduleNames, schedule);
}

StatusOr<PipelineSchedule> ParsePipelineSchedule(std::string_view name) {
  if (std::optional<PipelineSchedule> s = FindByName(kPipelineScheduleNames, name)) return *s;
  return InvalidArgument("unknown pipeline schedule \"", std::string(name), "\" (expected ",
                         JoinNames(kPipelineScheduleNames, " or "), ")");
}

std::string_view ActionKindName(ActionKind kind) {
  switch (kind) {
    case ActionKind::kForward:
      return "forward";
    case ActionKind::kBackward:
      return "backward";
    case ActionKind::kSendActivation:
      return "send-activation";
    case ActionKind::kRecvActivation:
      return "recv-activation";
    case ActionKind::kSendGradient:
      return "send-gradient";
    case ActionKind::kRecvGradient:
      return "recv-gradient";
  }
  return "?";
}

std::string FormatAction(const Action& action) {
  std::string out = StrCat(ActionKindName(action.kind), " mb ", action.micro_batch, " chunk ",
                           action.chunk);
  if (!IsCompute(action.kind)) {
    out += StrCat(IsSend(action.kind) ? " to rank " : " from rank ", action.peer);
  }
  return out;
}

Status CheckScheduleArgs(PipelineSchedule schedule, int pp, int micro_batches,
                         int virtual_stages) {
  const std::string_view name = PipelineScheduleName(schedule);
  if (pp < 1) return InvalidArgument("pp must be >= 1, got ", pp);
  if (micro_batches < 1) return InvalidArgument("micro-batches must be >= 1, got ", micro_batches);
  if (virtual_stages < 1) {
    return InvalidArgument("virtual stages must be >= 1, got ", virtual_stages);
  }
  if (schedule != PipelineSchedule::kInterleaved && virtual_stages != 1) {
    return InvalidArgument("virtual stages = ", virtual_stages, " need the interleaved "
                           "schedule; the ", name, " schedule has one chunk per rank");
  }
  if (schedule == PipelineSchedule::kInterleaved) {
    if (virtual_stages < 2) {
      return InvalidArgument("the interleaved schedule needs virtual stages >= 2, got ",
                             virtual_stages);
    }
    if (pp < 2) return InvalidArgument("the interleaved schedule needs pp >= 2, got ", pp);
    if (micro_batches % pp != 0) {
      return InvalidArgument("the interleaved schedule needs micro-batches divisible by pp: ",
                             micro_batches, " micro-batches, pp ", pp);
    }
  }
  const long long forwards = 1LL * pp * virtual_stages * micro_batches;
  if (forwards > kMaxScheduledForwards) {
    return InvalidArgument("pp * virtual stages * micro-batches = ", forwards,
                           " exceeds the limit of ", kMaxScheduledForwards);
  }
  return OkStatus();
}

std::vector<Action> ScheduleActions(PipelineSchedule schedule, int pp, int micro_batches,
                                    int virtual_stages, int rank) {
  std::vector<Action> out;
  pipeline_internal::AppendScheduleActions(schedule, pp, micro_batches, virtual_stages, rank, out);
  return out;
}

int MaxInFlight(const std::vector<Action>& actions) {
  int in_flight = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++in_flight);
    if (a.kind == ActionKind::kBackward) --in_flight;
  }
  return peak;
}

namespace pipeline_internal {

void AppendScheduleActions(PipelineSchedule schedule, int pp, int micro_batches,
                           int virtual_stages, int rank, std::vector<Action>& out) {
  SY_CHECK_OK(CheckScheduleArgs(schedule, pp, micro_batches, virtual_stages));
  SY_CHECK(rank >= 0 && rank < pp) << "rank " << rank << ", pp " << pp;
  const StageMap map{pp, virtual_stages};
  // Room for every micro-batch on every chunk: a forward and a backward, with a message
  // either side of each.
  out.reserve(out.size() + size_t{6} * micro_batches * virtual_stages);
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return GPipeActions(map, micro_batches, rank, out);
    case PipelineSchedule::kOneFOneB:
      return OneFOneBActions(map, micro_batches, rank, out);
    case PipelineSchedule::kInterleaved:
      return InterleavedActions(map, micro_batches, rank, out);
  }
}

std::string Where(int rank, const std::vector<Action>& list, size_t index) {
  return StrCat("rank ", rank, ", action ", index, " (", FormatAction(list[index]), ")");
}

}  // namespace pipeline_internal
}  // namespace switchyard::parallel
