// Internal to the pipeline schedule files (pipeline_schedule.cc, pipeline_validate.cc,
// pipeline_timeline.cc): where each model stage lives, and the in-order executor of action
// lists that both the validator (deadlock freedom) and the simulator (timing) run.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/status.h"
#include "engine/parallel/pipeline_schedule.h"

namespace switchyard::parallel::pipeline_internal {

// Where model stage s = chunk * pp + rank lives, and its neighbours.
struct StageMap {
  int pp = 1;
  int chunks = 1;  // virtual stages per rank

  int stages() const { return pp * chunks; }
  int Stage(int rank, int chunk) const { return chunk * pp + rank; }
  int RankOf(int stage) const { return stage % pp; }
  int ChunkOf(int stage) const { return stage / pp; }
  bool IsFirst(int stage) const { return stage == 0; }
  bool IsLast(int stage) const { return stage == stages() - 1; }
};

// Forward or backward (not a message).
inline bool IsCompute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward;
}
// A send of either kind.
inline bool IsSend(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kSendGradient;
}
// A send or recv of an activation (not a gradient).
inline bool IsActivation(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kRecvActivation;
}

// ScheduleActions appended to `out` (whose capacity a caller simulating many schedules
// reuses).
void AppendScheduleActions(PipelineSchedule schedule, int pp, int micro_batches,
                           int virtual_stages, int rank, std::vector<Action>& out);

// "rank 1, action 4 (recv-activation mb 0 chunk 0 from rank 0)": list[index] of `rank`.
std::string Where(int rank, const std::vector<Action>& list, size_t index);

// Per rank and action of an execution: when the action ends (the rank's clock after it)
// and, for a send, when the peer's recv took its message (-1 for other actions).
struct ActionTimes {
  std::vector<std::vector<int64_t>> end, taken;
};

// The schedule's lists executed in order with posted sends and waiting recvs. When timeline
// is given, records every compute action's start and end (forward_cost / backward_cost
// units); when times is given, every action's end and each send's taking; when makespan is
// given, the last rank's clock. Messages must already match per channel
// (ValidateActionLists' check (b)); a recv takes the next message of its channel. Returns
// InvalidArgument naming every rank left waiting when the lists deadlock.
Status Execute(const std::vector<std::vector<Action>>& ranks, int forward_cost,
               int backward_cost, Timeline* timeline, ActionTimes* times = nullptr,
               int64_t* makespan = nullptr);

}  // namespace switchyard::parallel::pipeline_internal
