// The unit-time pipeline simulator (SimulateTimeline), its text chart (RenderTimeline) and
// the bubble formulas it is compared with; see pipeline_schedule.h.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <list>
#include <mutex>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/core/check.h"
#include "engine/parallel/pipeline_internal.h"
#include "engine/parallel/pipeline_schedule.h"

namespace switchyard::parallel {
namespace {

// The chart letter of a forward (a-z) or backward (A-Z), wrapping after 26.
char MicroBatchLetter(int micro_batch, bool backward) {
  return static_cast<char>((backward ? 'A' : 'a') + micro_batch % 26);
}

}  // namespace

namespace pipeline_internal {
namespace {

// The messages posted on one channel (sender, receiver): post time and index in the
// sender's list; `taken` of them received so far.
struct Channel {
  std::vector<std::pair<int64_t, size_t>> posted;
  size_t taken = 0;
};

// One receiver's channel from one sender.
struct Inbound {
  int from;
  Channel channel;
};

// The idle share of a step of `makespan` on a rank busy for `busy` of it.
double IdleShare(int64_t busy, int64_t makespan) {
  return makespan == 0 ? 0.0 : 1.0 - static_cast<double>(busy) / makespan;
}

// The timeline's makespan (the last rank's clock), each rank's idle share and their mean.
void FillIdle(const std::vector<int64_t>& clock, Timeline* timeline) {
  const int pp = static_cast<int>(clock.size());
  timeline->makespan = *std::max_element(clock.begin(), clock.end());
  timeline->idle_fraction.assign(pp, 0.0);
  double idle_sum = 0;
  for (int r = 0; r < pp; ++r) {
    int64_t busy = 0;
    for (const TimedAction& t : timeline->ranks[r]) busy += t.end - t.start;
    const double idle = IdleShare(busy, timeline->makespan);
    timeline->idle_fraction[r] = idle;
    idle_sum += idle;
  }
  timeline->bubble = idle_sum / pp;
}

}  // namespace

// The schedule's lists executed in order with posted sends and waiting recvs. When timeline
// is given, records every compute action's start and end (forward_cost / backward_cost
// units). Messages must already match per channel (ValidateActionLists' check (b)); a recv
// takes the next message of its channel. Returns InvalidArgument naming every rank left
// waiting when the lists deadlock.
Status Execute(const std::vector<std::vector<Action>>& ranks, int forward_cost,
               int backward_cost, Timeline* timeline, ActionTimes* times, int64_t* makespan) {
  const int pp = static_cast<int>(ranks.size());
  if (times != nullptr) {
    times->end.assign(pp, {});
    times->taken.assign(pp, {});
    for (int r = 0; r < pp; ++r) {
      times->end[r].assign(ranks[r].size(), 0);
      times->taken[r].assign(ranks[r].size(), -1);
    }
  }
  // Each rank's channels by sender, only those its lists use: a schedule's rank hears from
  // one or two neighbours, so a short scan finds one (a hash map of (sender, receiver) keys
  // took most of a simulation; a table of all pp * pp would be 10^10 entries for pp = 10^5).
  std::vector<std::vector<Inbound>> inbound(pp);
  const auto channel = [&inbound](int from, int to) -> Channel& {
    std::vector<Inbound>& in = inbound[to];
    for (Inbound& i : in) {
      if (i.from == from) return i.channel;
    }
    return in.emplace_back(Inbound{from, {}}).channel;
  };
  std::vector<size_t> next(pp, 0);
  std::vector<int64_t> clock(pp, 0);  // time units: a cost of up to 2^31 - 1 per action
  std::vector<int> blocked_on(pp, -1);  // the sender a rank's recv waits on
  // Ranks that can make progress. A rank runs until its recv finds no message, and is woken
  // by the send it waits for: every action is visited once (no sweep over all ranks per
  // step, which was quadratic in pp). The times do not depend on this order: a rank's
  // clock depends only on its own list and the post times of the messages it takes.
  std::vector<int> ready(pp);
  for (int r = 0; r < pp; ++r) ready[r] = pp - 1 - r;  // rank 0 first
  while (!ready.empty()) {
    const int r = ready.back();
    ready.pop_back();
    const std::vector<Action>& list = ranks[r];
    for (; next[r] < list.size(); ++next[r]) {
      const Action& a = list[next[r]];
      if (IsCompute(a.kind)) {
        const int64_t cost = a.kind == ActionKind::kForward ? forward_cost : backward_cost;
        if (timeline != nullptr) timeline->ranks[r].push_back({a, clock[r], clock[r] + cost});
        clock[r] += cost;
      } else if (IsSend(a.kind)) {
        channel(r, a.peer).posted.push_back({clock[r], next[r]});
        if (blocked_on[a.peer] == r) {
          blocked_on[a.peer] = -1;
          ready.push_back(a.peer);
        }
      } else {
        Channel& ch = channel(a.peer, r);
        if (ch.taken == ch.posted.size()) {  // its send is not posted yet
          blocked_on[r] = a.peer;
          break;
        }
        const auto [post, send] = ch.posted[ch.taken++];
        clock[r] = std::max(clock[r], post);
        if (times != nullptr) times->taken[a.peer][send] = clock[r];
      }
      if (times != nullptr) times->end[r][next[r]] = clock[r];
    }
  }
  std::string waiting;
  for (int r = 0; r < pp; ++r) {
    if (next[r] == ranks[r].size()) continue;
    if (!waiting.empty()) waiting += "; ";
    waiting += Where(r, ranks[r], next[r]) + " waits for a send that is never posted";
  }
  if (!waiting.empty()) return InvalidArgument("deadlock: ", waiting);
  if (timeline != nullptr) FillIdle(clock, timeline);
  if (makespan != nullptr) *makespan = pp == 0 ? 0 : *std::max_element(clock.begin(), clock.end());
  return OkStatus();
}

namespace {

// Every rank's list of the schedule into `lists` (resized to pp; each list's capacity kept).
void ScheduleAllRanks(PipelineSchedule schedule, int pp, int micro_batches, int virtual_stages,
                      std::vector<std::vector<Action>>& lists) {
  lists.resize(pp);
  for (int r = 0; r < pp; ++r) {
    lists[r].clear();
    AppendScheduleActions(schedule, pp, micro_batches, virtual_stages, r, lists[r]);
  }
}

}  // namespace

}  // namespace pipeline_internal

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
  pipeline_internal::ScheduleAllRanks(schedule, pp, micro_batches, virtual_stages, ranks);
  SY_CHECK_OK(pipeline_internal::Execute(ranks, forward_cost, backward_cost, &timeline));
  return timeline;
}

double SimulateBubble(PipelineSchedule schedule, int pp, int micro_batches, int virtual_stages,
                      int forward_cost, int backward_cost) {
  SY_CHECK(forward_cost >= 1 && backward_cost >= 1)
      << "forward_cost " << forward_cost << ", backward_cost " << backward_cost;
  // The lists' memory is kept for the next call (the planner makes thousands, and fresh
  // lists of a few MB each cost more in page faults than the simulation), unless large.
  thread_local std::vector<std::vector<Action>> ranks;
  pipeline_internal::ScheduleAllRanks(schedule, pp, micro_batches, virtual_stages, ranks);
  int64_t makespan = 0;
  SY_CHECK_OK(
      pipeline_internal::Execute(ranks, forward_cost, backward_cost, nullptr, nullptr, &makespan));
  // As FillIdle sums a timeline's idle shares: in rank order, then over pp.
  double idle_sum = 0;
  for (const std::vector<Action>& list : ranks) {
    int64_t busy = 0;
    for (const Action& a : list) {
      if (a.kind == ActionKind::kForward) busy += forward_cost;
      if (a.kind == ActionKind::kBackward) busy += backward_cost;
    }
    idle_sum += pipeline_internal::IdleShare(busy, makespan);
  }
  size_t kept = 0;
  for (const std::vector<Action>& list : ranks) kept += list.capacity();
  if (kept * sizeof(Action) > (size_t{64} << 20)) ranks.clear();
  return idle_sum / pp;
}

namespace {

// Every rank's action list and send releases from one execution of the lists.
struct Executed {
  std::vector<std::vector<Action>> lists;
  std::vector<std::vector<int>> release;
};

Executed ExecuteAll(PipelineSchedule schedule, int pp, int micro_batches, int virtual_stages,
                    int forward_cost, int backward_cost) {
  Executed e;
  pipeline_internal::ScheduleAllRanks(schedule, pp, micro_batches, virtual_stages, e.lists);
  pipeline_internal::ActionTimes times;
  SY_CHECK_OK(pipeline_internal::Execute(e.lists, forward_cost, backward_cost, nullptr, &times));
  e.release.resize(pp);
  for (int r = 0; r < pp; ++r) {
    const std::vector<Action>& mine = e.lists[r];
    const int n = static_cast<int>(mine.size());
    e.release[r].assign(n, -1);
    for (int i = 0; i < n; ++i) {
      if (!pipeline_internal::IsSend(mine[i].kind)) continue;
      int j = i;
      while (j < n && times.end[r][j] <= times.taken[r][i]) ++j;
      e.release[r][i] = j;
    }
  }
  return e;
}

// The actions an execution holds (its lists' lengths summed).
size_t ActionCount(const Executed& e) {
  size_t n = 0;
  for (const std::vector<Action>& list : e.lists) n += list.size();
  return n;
}

// `rank`'s list and releases. Pure, and asked for by the planner for every rank of every
// layout whose memory it checks: it visits them fastest first, so the keys come back in no
// order (in published_moe_runs_test, 4,900 executions for 177 distinct keys with only the
// last two kept; keeping more took its time from 14.2 to 12.4 s). The executions are kept most recently used
// first, up to kKeptActions actions in all (about 100 MB with the releases); one larger than
// that is still kept, alone.
std::pair<std::vector<Action>, std::vector<int>> RankOf(PipelineSchedule schedule, int pp,
                                                        int micro_batches, int virtual_stages,
                                                        int rank, int forward_cost,
                                                        int backward_cost) {
  SY_CHECK(forward_cost >= 1 && backward_cost >= 1 && rank >= 0 && rank < pp)
      << "forward_cost " << forward_cost << ", backward_cost " << backward_cost << ", rank "
      << rank << " of " << pp;
  constexpr size_t kKeptActions = size_t{1} << 22;
  using Key = std::tuple<PipelineSchedule, int, int, int, int, int>;
  struct Kept {
    Key key;
    Executed executed;
    size_t actions;
  };
  static std::mutex mu;
  static std::list<Kept> kept;  // most recently used first
  static size_t kept_actions = 0;
  const Key key{schedule, pp, micro_batches, virtual_stages, forward_cost, backward_cost};
  std::lock_guard<std::mutex> lock(mu);
  auto it = std::find_if(kept.begin(), kept.end(), [&](const Kept& k) { return k.key == key; });
  if (it != kept.end()) {
    kept.splice(kept.begin(), kept, it);
  } else {
    Executed e =
        ExecuteAll(schedule, pp, micro_batches, virtual_stages, forward_cost, backward_cost);
    const size_t actions = ActionCount(e);
    while (!kept.empty() && kept_actions + actions > kKeptActions) {
      kept_actions -= kept.back().actions;
      kept.pop_back();
    }
    kept.push_front({key, std::move(e), actions});
    kept_actions += actions;
  }
  const Executed& e = kept.front().executed;
  return {e.lists[rank], e.release[rank]};
}

}  // namespace

std::vector<int> SendReleases(PipelineSchedule schedule, int pp, int micro_batches,
                              int virtual_stages, int rank, int forward_cost,
                              int backward_cost) {
  return RankOf(schedule, pp, micro_batches, virtual_stages, rank, forward_cost, backward_cost)
      .second;
}

std::pair<std::vector<Action>, std::vector<int>> ScheduleWithReleases(
    PipelineSchedule schedule, int pp, int micro_batches, int virtual_stages, int rank,
    int forward_cost, int backward_cost) {
  return RankOf(schedule, pp, micro_batches, virtual_stages, rank, forward_cost, backward_cost);
}

std::vector<bool> ActivationReleases(const std::vector<Action>& actions,
                                     const std::vector<bool>& embedding) {
  std::vector<bool> frees(actions.size(), false);
  for (size_t i = 0; i < actions.size(); ++i) {
    const Action& a = actions[i];
    SY_CHECK(a.chunk >= 0 && static_cast<size_t>(a.chunk) < embedding.size())
        << "ActivationReleases: chunk " << a.chunk << " of " << embedding.size();
    frees[i] = embedding[a.chunk] ? a.kind == ActionKind::kBackward
                                  : a.kind == ActionKind::kSendGradient;
  }
  return frees;
}

std::string RenderTimeline(const Timeline& timeline) {
  const bool chunks = timeline.virtual_stages > 1;
  std::string out = StrCat(PipelineScheduleName(timeline.schedule), ": pp ", timeline.pp, ", ",
                           timeline.micro_batches, " micro-batches");
  if (chunks) out += StrCat(", ", timeline.virtual_stages, " virtual stages");
  out += StrCat(", forward ", timeline.forward_cost, " / backward ", timeline.backward_cost,
                " time units per ", chunks ? "chunk" : "stage", "\n");
  for (int r = 0; r < timeline.pp; ++r) {
    std::string line(static_cast<size_t>(timeline.makespan), '.');
    std::string chunk_line(static_cast<size_t>(timeline.makespan), ' ');
    for (const TimedAction& t : timeline.ranks[r]) {
      const bool backward = t.action.kind == ActionKind::kBackward;
      for (int64_t u = t.start; u < t.end; ++u) {
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
                "makespan %lld time units\n"
                "bubble (idle share of the step): measured %.4f, analytic %s = %.4f",
                static_cast<long long>(timeline.makespan), timeline.bubble,
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
