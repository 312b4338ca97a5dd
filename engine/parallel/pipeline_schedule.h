// Pipeline-parallel schedules as data: for one pipeline rank, the ordered list of what it
// does in one training step (forward and backward of each micro-batch on each of its model
// chunks, and the activation / gradient messages around them). No model, no communicator:
// the lists can be printed, compared, checked for deadlocks and timed before anything runs.
//
//   gpipe        Huang et al. 2019: every forward, then every backward (in micro-batch
//                order 0, 1, ..., m-1).
//   1f1b         PipeDream-flush (Narayanan et al. 2021, "Memory-Efficient Pipeline-Parallel
//                DNN Training"): min(pp - rank - 1, m) warm-up forwards, then one forward /
//                one backward in turn, then the remaining backwards.
//   interleaved  Interleaved 1F1B (Narayanan et al. SC'21, "Efficient Large-Scale Language
//                Model Training on GPU Clusters Using Megatron-LM"): each rank holds v model
//                chunks, chunk c of rank r being model stage c * pp + r; micro-batches go
//                through the chunks in groups of pp. Requires pp >= 2, v >= 2 and m % pp == 0.
//
// Every forward of model stage s > 0 is preceded on its rank by the receipt of its input
// activation from stage s - 1, and every forward of a stage before the last is followed by
// sending its output to stage s + 1; every backward of a stage before the last is preceded
// by the receipt of its output gradient from stage s + 1, and every backward of a stage
// s > 0 is followed by sending its input gradient to stage s - 1. docs/pipeline.md shows
// the lists, the validation rule and the bubble definitions.
//
// The generators are in pipeline_schedule.cc, the validator in pipeline_validate.cc, the
// simulator, its chart and the bubble formulas in pipeline_timeline.cc.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "engine/core/enum_names.h"
#include "engine/core/status.h"

namespace switchyard::parallel {

enum class PipelineSchedule { kGPipe, kOneFOneB, kInterleaved };
// The config's parallel.pipeline_schedule values.
inline constexpr EnumName<PipelineSchedule> kPipelineScheduleNames[] = {
    {PipelineSchedule::kGPipe, "gpipe"},
    {PipelineSchedule::kOneFOneB, "1f1b"},
    {PipelineSchedule::kInterleaved, "interleaved"}};

// "gpipe", "1f1b", "interleaved".
std::string_view PipelineScheduleName(PipelineSchedule schedule);
// The inverse of PipelineScheduleName; an unknown name is InvalidArgument listing the three.
StatusOr<PipelineSchedule> ParsePipelineSchedule(std::string_view name);

enum class ActionKind {
  kForward,
  kBackward,
  kSendActivation,  // output activation of a forward, to the next model stage
  kRecvActivation,  // input activation of a forward, from the previous model stage
  kSendGradient,    // input gradient of a backward, to the previous model stage
  kRecvGradient,    // output gradient of a backward, from the next model stage
};

// "forward", "backward", "send-activation", "recv-activation", "send-gradient",
// "recv-gradient".
std::string_view ActionKindName(ActionKind kind);

// One step of one pipeline rank.
struct Action {
  ActionKind kind = ActionKind::kForward;
  int micro_batch = 0;
  // The model chunk on this rank the action belongs to (0 without interleaving): for a
  // send or recv, the chunk whose forward / backward produces or consumes the message.
  int chunk = 0;
  // The pipeline rank at the other end of a send or recv; -1 for forward and backward.
  int peer = -1;

  bool operator==(const Action&) const = default;
};

// "forward mb 3 chunk 1", "recv-activation mb 3 chunk 0 from rank 2",
// "send-gradient mb 0 chunk 0 to rank 1".
std::string FormatAction(const Action& action);

// Upper bound on pp * virtual_stages * micro_batches (the forward count of a step), so
// every list fits in memory and int arithmetic never overflows.
inline constexpr long long kMaxScheduledForwards = 1 << 20;

// OK when the schedule can be built, else InvalidArgument naming the first impossible
// setting: pp < 1, micro_batches < 1, virtual_stages < 1, virtual_stages > 1 without the
// interleaved schedule, interleaved with virtual_stages < 2, with pp < 2 or with
// micro_batches not a multiple of pp, or more than kMaxScheduledForwards forwards.
Status CheckScheduleArgs(PipelineSchedule schedule, int pp, int micro_batches,
                         int virtual_stages);

// The ordered actions of pipeline rank `rank` (0 .. pp-1) in one step. virtual_stages is 1
// except for the interleaved schedule. CHECK-fails unless CheckScheduleArgs is OK and
// 0 <= rank < pp.
std::vector<Action> ScheduleActions(PipelineSchedule schedule, int pp, int micro_batches,
                                    int virtual_stages, int rank);

// Checks the lists of all ranks (ranks[r] is rank r's list) against a pipeline of pp ranks,
// virtual_stages chunks each and micro_batches micro-batches:
//  (a) each (micro-batch, model stage) has exactly one forward and one backward, on the
//      rank and chunk that hold the stage, the backward after the forward; a forward of
//      stage s > 0 comes after the receipt of its activation and a forward of a stage
//      before the last is followed by the send of its output (the mirror for backwards),
//      and there is no other send or recv: with (b) this puts the backward of stage s
//      after the backward of stage s + 1 and the forward of stage s + 1 after that of s;
//  (b) the sends from each rank to each other rank carry the same messages (kind,
//      micro-batch, stage) in the same order as the receiver's recvs from it: one channel
//      per ordered pair of ranks for both kinds, stricter than one per kind, because NCCL
//      matches the messages between two ranks in posting order whatever their tags (with
//      interleaving, rank pp-1 sends rank 0 both activations and gradients);
//  (c) executing every list in order terminates when a send never waits (it is posted)
//      and a recv waits until the matching send has been posted (no deadlock). Sends that
//      block until received would deadlock 1F1B (docs/pipeline.md): an executor posts them
//      and waits on them later, or together with its next recv.
// The first failure is InvalidArgument naming the rank, the action (index and text) and
// the reason.
Status ValidateActionLists(const std::vector<std::vector<Action>>& ranks, int pp,
                           int micro_batches, int virtual_stages);

// ValidateActionLists on ScheduleActions of every rank; CheckScheduleArgs' error if the
// settings are impossible.
Status ValidateSchedules(PipelineSchedule schedule, int pp, int micro_batches,
                         int virtual_stages);

// The most (micro-batch, chunk) pairs whose forward has run and backward has not, over the
// list: the activations the rank holds at its peak. Without interleaving chunk is always
// 0, so this counts micro-batches: m for GPipe, min(pp - rank, m) for 1F1B. Interleaved:
// min((pp - rank - 1) * 2 + (v - 1) * pp + 1, v * m) chunk activations, each 1/v of the
// rank's layers.
int MaxInFlight(const std::vector<Action>& actions);

// The pipeline bubble as specified (docs/pipeline.md): (pp - 1) / (m + pp - 1) for GPipe
// and 1F1B, that value divided by virtual_stages for interleaved. For GPipe and 1F1B it is the idle
// share of the step, bubble / (bubble + ideal) with ideal = m (t_f + t_b) and bubble =
// (pp - 1)(t_f + t_b), and SimulateTimeline measures exactly it for any uniform costs.
// Interleaved: Narayanan et al. (SC'21, section 2.2.2) give bubble / ideal = (pp - 1) /
// (v m), an idle share of (pp - 1) / (v m + pp - 1) = LiteratureInterleavedBubble, which is
// what the simulator measures; the specified value is below it (3/22 against 3/19 for pp 4,
// m 8, v 2): it divides the share, not the bubble, by v.
double AnalyticBubble(PipelineSchedule schedule, int pp, int micro_batches, int virtual_stages);

// (pp - 1) / (v m + pp - 1): the interleaved schedule's idle share of a step from Narayanan
// et al.'s bubble / ideal = (pp - 1) / (v m). With v = 1 it equals AnalyticBubble of 1F1B.
double LiteratureInterleavedBubble(int pp, int micro_batches, int virtual_stages);

// A compute action placed in time (unit-time simulation).
struct TimedAction {
  Action action;  // kForward or kBackward
  int64_t start = 0;  // time units; 64 bits: up to 2^20 actions of up to 2^31 - 1 units
  int64_t end = 0;
};

// Every rank's forwards and backwards in time, as SimulateTimeline computes them.
struct Timeline {
  PipelineSchedule schedule = PipelineSchedule::kOneFOneB;
  int pp = 1;
  int micro_batches = 1;
  int virtual_stages = 1;
  int forward_cost = 1;
  int backward_cost = 2;
  std::vector<std::vector<TimedAction>> ranks;  // ranks[r]: rank r's compute, in order
  int64_t makespan = 0;                         // end of the last action of any rank
  std::vector<double> idle_fraction;            // per rank: 1 - busy / makespan
  double bubble = 0;  // the mean idle fraction (all ranks do the same work, so every rank's)
};

// Runs every rank's ScheduleActions: a forward takes forward_cost time units, a backward
// backward_cost (per chunk), messages take no time, a send never waits and a recv waits for
// its send. CHECK-fails unless CheckScheduleArgs is OK and both costs are >= 1 (and the
// schedule validates: ScheduleActions' lists always do).
Timeline SimulateTimeline(PipelineSchedule schedule, int pp, int micro_batches,
                          int virtual_stages, int forward_cost = 1, int backward_cost = 2);

// SimulateTimeline(...).bubble, bit for bit, without recording the timeline: what the
// planner asks of every layout it times (thousands of schedules for a cluster of 256-2048
// GPUs). Same checks.
double SimulateBubble(PipelineSchedule schedule, int pp, int micro_batches, int virtual_stages,
                      int forward_cost = 1, int backward_cost = 2);

// When PipelineRunner releases each send of `rank` (it drops the completed sends after
// every action and waits for the rest at the end of the step), in the timeline
// SimulateTimeline runs with these costs: a send's message is taken when the peer's recv of
// it completes, and the send is released after the first action of the rank, from the send
// on, that ends strictly later than that (ties held: a conservative rule). release[i] for a
// send at action i is that action's index, or actions.size() when none ends later (held to
// the end of the step); -1 for actions that are not sends. Same checks as SimulateTimeline.
std::vector<int> SendReleases(PipelineSchedule schedule, int pp, int micro_batches,
                              int virtual_stages, int rank, int forward_cost = 1,
                              int backward_cost = 2);
// ScheduleActions and SendReleases of `rank` from one execution of the lists, the most
// recently used executions kept (the planner's walk of a step needs both, for every rank of
// every layout it sizes).
std::pair<std::vector<Action>, std::vector<int>> ScheduleWithReleases(
    PipelineSchedule schedule, int pp, int micro_batches, int virtual_stages, int rank,
    int forward_cost = 1, int backward_cost = 2);

// The executor's rule for what a micro-batch holds on a chunk (its forward's activations
// and the messages received for it), read by PipelineRunner (engine/train/pipeline_runner.h)
// and the planner's walk of a step (engine/plan/activation_memory.h): it is freed after the
// backward on a chunk that holds the embedding (nothing goes back from there), else after
// the send of its input gradient (the gradient lives in the backward's output until then).
// frees[i]: action i of `actions` frees its (chunk, micro-batch). embedding[c]: chunk c
// holds the embedding (one entry per chunk the actions name).
std::vector<bool> ActivationReleases(const std::vector<Action>& actions,
                                     const std::vector<bool>& embedding);

// A text chart of the timeline, one line per rank and one character per time unit:
// forward of micro-batch i as the letter 'a' + i, its backward as 'A' + i (wrapping after
// 26), '.' idle; with interleaving a second line per rank gives each unit's chunk. Then a
// legend, the makespan and the bubble measured and analytic (and, interleaved, the
// literature's value).
std::string RenderTimeline(const Timeline& timeline);

}  // namespace switchyard::parallel
