// Pipeline schedules as action lists, their validation and a unit-time simulator; see
// pipeline_schedule.h.
#include "engine/parallel/pipeline_schedule.h"

#include <algorithm>
#include <cstdio>

#include "engine/core/check.h"

namespace switchyard::parallel {
namespace {

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

bool IsCompute(ActionKind kind) {
  return kind == ActionKind::kForward || kind == ActionKind::kBackward;
}
bool IsSend(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kSendGradient;
}
bool IsActivation(ActionKind kind) {
  return kind == ActionKind::kSendActivation || kind == ActionKind::kRecvActivation;
}

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

std::vector<Action> GPipeActions(const StageMap& map, int m, int rank) {
  std::vector<Action> out;
  for (int i = 0; i < m; ++i) AppendForward(map, rank, i, 0, out);
  for (int i = 0; i < m; ++i) AppendBackward(map, rank, i, 0, out);
  return out;
}

// PipeDream-flush: warm-up forwards, then forward i + warmup / backward i pairs, then the
// backwards left.
std::vector<Action> OneFOneBActions(const StageMap& map, int m, int rank) {
  const int warmup = std::min(map.pp - rank - 1, m);
  std::vector<Action> out;
  for (int i = 0; i < warmup; ++i) AppendForward(map, rank, i, 0, out);
  for (int i = 0; i < m - warmup; ++i) {
    AppendForward(map, rank, warmup + i, 0, out);
    AppendBackward(map, rank, i, 0, out);
  }
  for (int i = m - warmup; i < m; ++i) AppendBackward(map, rank, i, 0, out);
  return out;
}

// Interleaved 1F1B. The k-th forward of a rank (k = 0 .. v*m - 1) runs micro-batch
// (k / (pp v)) pp + k % pp on chunk (k % (pp v)) / pp: pp micro-batches through chunk 0,
// the same pp through chunk 1, ..., then the next pp. The k-th backward runs the same
// micro-batch on chunk v - 1 - (k % (pp v)) / pp. Warm-up (Megatron-LM's count):
// (pp - rank - 1) * 2 + (v - 1) * pp forwards, at most v*m.
std::vector<Action> InterleavedActions(const StageMap& map, int m, int rank) {
  const int pp = map.pp, v = map.chunks, total = v * m;
  const auto micro_batch = [&](int k) { return k / (pp * v) * pp + k % pp; };
  const auto forward_chunk = [&](int k) { return k % (pp * v) / pp; };
  const auto backward_chunk = [&](int k) { return v - 1 - forward_chunk(k); };
  const int warmup = std::min((pp - rank - 1) * 2 + (v - 1) * pp, total);
  std::vector<Action> out;
  for (int k = 0; k < warmup; ++k) AppendForward(map, rank, micro_batch(k), forward_chunk(k), out);
  for (int k = 0; k < total - warmup; ++k) {
    const int f = warmup + k;
    AppendForward(map, rank, micro_batch(f), forward_chunk(f), out);
    AppendBackward(map, rank, micro_batch(k), backward_chunk(k), out);
  }
  for (int k = total - warmup; k < total; ++k) {
    AppendBackward(map, rank, micro_batch(k), backward_chunk(k), out);
  }
  return out;
}

std::string Where(int rank, const std::vector<Action>& list, size_t index) {
  return StrCat("rank ", rank, ", action ", index, " (", FormatAction(list[index]), ")");
}

// The schedule's lists executed in order with posted sends and waiting recvs. When timeline
// is given, records every compute action's start and end (forward_cost / backward_cost
// units). Messages must already match per channel (ValidateActionLists' check (b)); a recv
// takes the next message of its channel. Returns InvalidArgument naming every rank left
// waiting when the lists deadlock.
Status Execute(const std::vector<std::vector<Action>>& ranks, int forward_cost,
               int backward_cost, Timeline* timeline) {
  const int pp = static_cast<int>(ranks.size());
  // Channel (sender, receiver) -> post times of its sends so far.
  const auto channel = [pp](int from, int to) { return from * pp + to; };
  std::vector<std::vector<int>> posted(static_cast<size_t>(pp) * pp);
  std::vector<size_t> taken(posted.size(), 0);
  std::vector<size_t> next(pp, 0);
  std::vector<int> clock(pp, 0);
  bool progress = true;
  while (progress) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      const std::vector<Action>& list = ranks[r];
      for (; next[r] < list.size(); ++next[r]) {
        const Action& a = list[next[r]];
        if (IsCompute(a.kind)) {
          const int cost = a.kind == ActionKind::kForward ? forward_cost : backward_cost;
          if (timeline != nullptr) timeline->ranks[r].push_back({a, clock[r], clock[r] + cost});
          clock[r] += cost;
        } else if (IsSend(a.kind)) {
          posted[channel(r, a.peer)].push_back(clock[r]);
        } else {
          const int c = channel(a.peer, r);
          if (taken[c] == posted[c].size()) break;  // its send is not posted yet
          clock[r] = std::max(clock[r], posted[c][taken[c]++]);
        }
        progress = true;
      }
    }
  }
  std::string waiting;
  for (int r = 0; r < pp; ++r) {
    if (next[r] == ranks[r].size()) continue;
    if (!waiting.empty()) waiting += "; ";
    waiting += Where(r, ranks[r], next[r]) + " waits for a send that is never posted";
  }
  if (!waiting.empty()) return InvalidArgument("deadlock: ", waiting);
  if (timeline != nullptr) {
    timeline->makespan = *std::max_element(clock.begin(), clock.end());
    timeline->idle_fraction.assign(pp, 0.0);
    double idle_sum = 0;
    for (int r = 0; r < pp; ++r) {
      int busy = 0;
      for (const TimedAction& t : timeline->ranks[r]) busy += t.end - t.start;
      const double idle =
          timeline->makespan == 0 ? 0.0 : 1.0 - static_cast<double>(busy) / timeline->makespan;
      timeline->idle_fraction[r] = idle;
      idle_sum += idle;
    }
    timeline->bubble = idle_sum / pp;
  }
  return OkStatus();
}

// Check (a) for one rank: every action belongs to a stage of this rank and names the right
// peer; exactly one of each action per (micro-batch, chunk); the order around each compute.
Status CheckRankActions(const StageMap& map, int m, int rank, const std::vector<Action>& list) {
  constexpr int kKinds = 6;
  // index[(micro_batch * chunks + chunk) * kKinds + kind] = position in list, or -1.
  std::vector<long long> index(static_cast<size_t>(m) * map.chunks * kKinds, -1);
  for (size_t j = 0; j < list.size(); ++j) {
    const Action& a = list[j];
    if (a.micro_batch < 0 || a.micro_batch >= m) {
      return InvalidArgument(Where(rank, list, j), ": micro-batch out of range [0, ", m, ")");
    }
    if (a.chunk < 0 || a.chunk >= map.chunks) {
      return InvalidArgument(Where(rank, list, j), ": chunk out of range [0, ", map.chunks, ")");
    }
    const int stage = map.Stage(rank, a.chunk);
    int want_peer = -1;
    switch (a.kind) {
      case ActionKind::kForward:
      case ActionKind::kBackward:
        break;
      case ActionKind::kRecvActivation:
      case ActionKind::kSendGradient:
        if (map.IsFirst(stage)) {
          return InvalidArgument(Where(rank, list, j), ": stage 0 has no previous stage");
        }
        want_peer = map.RankOf(stage - 1);
        break;
      case ActionKind::kSendActivation:
      case ActionKind::kRecvGradient:
        if (map.IsLast(stage)) {
          return InvalidArgument(Where(rank, list, j), ": stage ", stage,
                                 " is the last stage, it has no next stage");
        }
        want_peer = map.RankOf(stage + 1);
        break;
    }
    if (a.peer != want_peer) {
      return InvalidArgument(Where(rank, list, j), ": the peer of stage ", stage, " is ",
                             want_peer < 0 ? "none" : StrCat("rank ", want_peer));
    }
    long long& slot = index[(static_cast<size_t>(a.micro_batch) * map.chunks + a.chunk) * kKinds +
                            static_cast<int>(a.kind)];
    if (slot >= 0) {
      return InvalidArgument(Where(rank, list, j), ": repeats action ", slot);
    }
    slot = static_cast<long long>(j);
  }
  for (int i = 0; i < m; ++i) {
    for (int c = 0; c < map.chunks; ++c) {
      const long long* at = &index[(static_cast<size_t>(i) * map.chunks + c) * kKinds];
      const auto pos = [&](ActionKind kind) { return at[static_cast<int>(kind)]; };
      const int stage = map.Stage(rank, c);
      const std::string what = StrCat("rank ", rank, ": micro-batch ", i, " on stage ", stage,
                                      " (chunk ", c, ") ");
      const long long f = pos(ActionKind::kForward), b = pos(ActionKind::kBackward);
      if (f < 0) return InvalidArgument(what, "has no forward");
      if (b < 0) return InvalidArgument(what, "has no backward");
      if (b < f) return InvalidArgument(Where(rank, list, b), ": runs before its forward");
      if (!map.IsFirst(stage)) {
        const long long recv = pos(ActionKind::kRecvActivation);
        if (recv < 0) return InvalidArgument(what, "never receives its activation");
        if (recv > f) {
          return InvalidArgument(Where(rank, list, f), ": runs before its activation arrives");
        }
        const long long send = pos(ActionKind::kSendGradient);
        if (send < 0) return InvalidArgument(what, "never sends its input gradient");
        if (send < b) {
          return InvalidArgument(Where(rank, list, send), ": sent before its backward runs");
        }
      }
      if (!map.IsLast(stage)) {
        const long long send = pos(ActionKind::kSendActivation);
        if (send < 0) return InvalidArgument(what, "never sends its activation");
        if (send < f) {
          return InvalidArgument(Where(rank, list, send), ": sent before its forward runs");
        }
        const long long recv = pos(ActionKind::kRecvGradient);
        if (recv < 0) return InvalidArgument(what, "never receives its output gradient");
        if (recv > b) {
          return InvalidArgument(Where(rank, list, b), ": runs before its gradient arrives");
        }
      }
    }
  }
  return OkStatus();
}

// Check (b): per channel (sender, receiver), the n-th send carries the message the n-th
// recv expects. A message is (activation or gradient, micro-batch, sending stage). Both
// kinds share the channel of a pair of ranks (with interleaving, rank pp-1 sends rank 0
// activations and gradients): NCCL matches messages between two ranks in posting order,
// whatever their tags.
Status CheckChannels(const StageMap& map, const std::vector<std::vector<Action>>& ranks) {
  struct Message {
    bool activation;
    int micro_batch;
    int from_stage;
    size_t index;  // the action on its rank

    bool SameAs(const Message& o) const {
      return activation == o.activation && micro_batch == o.micro_batch &&
             from_stage == o.from_stage;
    }
  };
  const int pp = map.pp;
  // [from * pp + to]: the sends of `from` to `to`, and the recvs of `to` from `from`.
  std::vector<std::vector<Message>> sends(static_cast<size_t>(pp) * pp), recvs(sends.size());
  for (int r = 0; r < pp; ++r) {
    for (size_t j = 0; j < ranks[r].size(); ++j) {
      const Action& a = ranks[r][j];
      if (IsCompute(a.kind)) continue;
      const int stage = map.Stage(r, a.chunk);
      const bool activation = IsActivation(a.kind);
      if (IsSend(a.kind)) {
        sends[r * pp + a.peer].push_back({activation, a.micro_batch, stage, j});
      } else {
        const int from = activation ? stage - 1 : stage + 1;
        recvs[a.peer * pp + r].push_back({activation, a.micro_batch, from, j});
      }
    }
  }
  for (int from = 0; from < pp; ++from) {
    for (int to = 0; to < pp; ++to) {
      const std::vector<Message>& sent = sends[from * pp + to];
      const std::vector<Message>& received = recvs[from * pp + to];
      const size_t common = std::min(sent.size(), received.size());
      for (size_t n = 0; n < common; ++n) {
        const Message& got = sent[n];
        if (got.SameAs(received[n])) continue;
        return InvalidArgument(Where(to, ranks[to], received[n].index), ": message ", n,
                               " from rank ", from, " is its ",
                               FormatAction(ranks[from][got.index]), " (action ", got.index,
                               "): the sends and recvs between the two ranks are in "
                               "different orders");
      }
      if (received.size() > common) {
        return InvalidArgument(Where(to, ranks[to], received[common].index), ": rank ", from,
                               " sends only ", sent.size(), " messages to rank ", to);
      }
      if (sent.size() > common) {
        return InvalidArgument(Where(from, ranks[from], sent[common].index),
                               ": never received (rank ", to, " posts only ", received.size(),
                               " recvs from rank ", from, ")");
      }
    }
  }
  return OkStatus();
}

char MicroBatchLetter(int micro_batch, bool backward) {
  return static_cast<char>((backward ? 'A' : 'a') + micro_batch % 26);
}

}  // namespace

std::string_view PipelineScheduleName(PipelineSchedule schedule) {
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return "gpipe";
    case PipelineSchedule::kOneFOneB:
      return "1f1b";
    case PipelineSchedule::kInterleaved:
      return "interleaved";
  }
  return "?";
}

StatusOr<PipelineSchedule> ParsePipelineSchedule(std::string_view name) {
  for (PipelineSchedule s : {PipelineSchedule::kGPipe, PipelineSchedule::kOneFOneB,
                             PipelineSchedule::kInterleaved}) {
    if (PipelineScheduleName(s) == name) return s;
  }
  return InvalidArgument("unknown pipeline schedule \"", std::string(name),
                         "\" (expected gpipe, 1f1b or interleaved)");
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
  SY_CHECK_OK(CheckScheduleArgs(schedule, pp, micro_batches, virtual_stages));
  SY_CHECK(rank >= 0 && rank < pp) << "rank " << rank << ", pp " << pp;
  const StageMap map{pp, virtual_stages};
  switch (schedule) {
    case PipelineSchedule::kGPipe:
      return GPipeActions(map, micro_batches, rank);
    case PipelineSchedule::kOneFOneB:
      return OneFOneBActions(map, micro_batches, rank);
    case PipelineSchedule::kInterleaved:
      return InterleavedActions(map, micro_batches, rank);
  }
  return {};
}

Status ValidateActionLists(const std::vector<std::vector<Action>>& ranks, int pp,
                           int micro_batches, int virtual_stages) {
  if (pp < 1 || micro_batches < 1 || virtual_stages < 1) {
    return InvalidArgument("pp, micro-batches and virtual stages must be >= 1, got ", pp, ", ",
                           micro_batches, ", ", virtual_stages);
  }
  if (static_cast<int>(ranks.size()) != pp) {
    return InvalidArgument("expected the lists of ", pp, " ranks, got ", ranks.size());
  }
  const StageMap map{pp, virtual_stages};
  for (int r = 0; r < pp; ++r) {
    SY_RETURN_IF_ERROR(CheckRankActions(map, micro_batches, r, ranks[r]));
  }
  SY_RETURN_IF_ERROR(CheckChannels(map, ranks));
  return Execute(ranks, 1, 1, nullptr);
}

Status ValidateSchedules(PipelineSchedule schedule, int pp, int micro_batches,
                         int virtual_stages) {
  SY_RETURN_IF_ERROR(CheckScheduleArgs(schedule, pp, micro_batches, virtual_stages));
  std::vector<std::vector<Action>> ranks;
  for (int r = 0; r < pp; ++r) {
    ranks.push_back(ScheduleActions(schedule, pp, micro_batches, virtual_stages, r));
  }
  return ValidateActionLists(ranks, pp, micro_batches, virtual_stages);
}

int MaxInFlight(const std::vector<Action>& actions) {
  int in_flight = 0, peak = 0;
  for (const Action& a : actions) {
    if (a.kind == ActionKind::kForward) peak = std::max(peak, ++in_flight);
    if (a.kind == ActionKind::kBackward) --in_flight;
  }
  return peak;
}

double AnalyticBubble(PipelineSchedule schedule, int pp, int micro_batches,
                      int virtual_stages) {
  const double share = static_cast<double>(pp - 1) / (micro_batches + pp - 1);
  return schedule == PipelineSchedule::kInterleaved ? share / virtual_stages : share;
}

double LiteratureInterleavedBubble(int pp, int micro_batches, int virtual_stages) {
  return static_cast<double>(pp - 1) / (virtual_stages * micro_batches + pp - 1);
}

Timeline SimulateTimeline(PipelineSchedule schedule, int pp, int micro_batches,
                          int virtual_stages, int forward_cost, int backward_cost) {
  SY_CHECK(forward_cost >= 1 && backward_cost >= 1)
      << "forward_cost " << forward_cost << ", backward_cost " << backward_cost;
  Timeline timeline;
  timeline.schedule = schedule;
  timeline.pp = pp;
  timeline.micro_batches = micro_batches;
  timeline.virtual_stages = virtual_stages;
  timeline.forward_cost = forward_cost;
  timeline.backward_cost = backward_cost;
  timeline.ranks.resize(pp);
  std::vector<std::vector<Action>> ranks;
  for (int r = 0; r < pp; ++r) {
    ranks.push_back(ScheduleActions(schedule, pp, micro_batches, virtual_stages, r));
  }
  SY_CHECK_OK(Execute(ranks, forward_cost, backward_cost, &timeline));
  return timeline;
}

std::string RenderTimeline(const Timeline& timeline) {
  const bool chunks = timeline.virtual_stages > 1;
  std::string out = StrCat(PipelineScheduleName(timeline.schedule), ": pp ", timeline.pp, ", ",
                           timeline.micro_batches, " micro-batches");
  if (chunks) out += StrCat(", ", timeline.virtual_stages, " virtual stages");
  out += StrCat(", forward ", timeline.forward_cost, " / backward ", timeline.backward_cost,
                " time units per ", chunks ? "chunk" : "stage", "\n");
  for (int r = 0; r < timeline.pp; ++r) {
    std::string line(timeline.makespan, '.');
    std::string chunk_line(timeline.makespan, ' ');
    for (const TimedAction& t : timeline.ranks[r]) {
      const bool backward = t.action.kind == ActionKind::kBackward;
      for (int u = t.start; u < t.end; ++u) {
        line[u] = MicroBatchLetter(t.action.micro_batch, backward);
        chunk_line[u] = static_cast<char>('0' + t.action.chunk % 10);
      }
    }
    char head[32];
    std::snprintf(head, sizeof(head), "rank %-3d |", r);
    out += head + line + "|\n";
    if (chunks) out += "   chunk |" + chunk_line + "|\n";
  }
  out += "legend: a-z forward of micro-batch 0-25, A-Z its backward (letters wrap after 26), "
         "one letter per time unit, '.' idle\n";
  const bool interleaved = timeline.schedule == PipelineSchedule::kInterleaved;
  const double analytic = AnalyticBubble(timeline.schedule, timeline.pp,
                                         timeline.micro_batches, timeline.virtual_stages);
  char tail[256];
  std::snprintf(tail, sizeof(tail),
                "makespan %d time units\n"
                "bubble (idle share of the step): measured %.4f, analytic %s = %.4f",
                timeline.makespan, timeline.bubble,
                interleaved ? "(p-1)/(v(m+p-1))" : "(p-1)/(m+p-1)", analytic);
  out += tail;
  if (interleaved) {
    std::snprintf(tail, sizeof(tail), ", literature (p-1)/(vm+p-1) = %.4f",
                  LiteratureInterleavedBubble(timeline.pp, timeline.micro_batches,
                                              timeline.virtual_stages));
    out += tail;
  }
  return out + "\n";
}

}  // namespace switchyard::parallel
