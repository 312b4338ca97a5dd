// The pipeline schedule validator (ValidateActionLists, pipeline_schedule.h): (a) each
// rank's list on its own, (b) the messages between each pair of ranks, (c) no deadlock.
#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "engine/parallel/pipeline_internal.h"
#include "engine/parallel/pipeline_schedule.h"

namespace switchyard::parallel {
namespace {

using pipeline_internal::Execute;
using pipeline_internal::IsActivation;
using pipeline_internal::IsCompute;
using pipeline_internal::IsSend;
using pipeline_internal::StageMap;
using pipeline_internal::Where;

// The six action kinds.
constexpr int kKinds = 6;

// Check (a) for one rank, its first half: every action belongs to a stage of this rank and
// names the right peer, and appears at most once per (micro-batch, chunk). Fills *index:
// (*index)[(micro_batch * chunks + chunk) * kKinds + kind] = position in list, or -1.
Status IndexRankActions(const StageMap& map, int m, int rank, const std::vector<Action>& list,
                        std::vector<long long>* index) {
  index->assign(static_cast<size_t>(m) * map.chunks * kKinds, -1);
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
    long long& slot = (*index)[(static_cast<size_t>(a.micro_batch) * map.chunks + a.chunk) *
                                   kKinds +
                               static_cast<int>(a.kind)];
    if (slot >= 0) {
      return InvalidArgument(Where(rank, list, j), ": repeats action ", slot);
    }
    slot = static_cast<long long>(j);
  }
  return OkStatus();
}

// Check (a) for one rank, its second half: micro-batch i on chunk c has a forward and a
// backward in that order, with their messages around them. at[kind]: the positions that
// IndexRankActions found, -1 where absent.
Status CheckComputeOrder(const StageMap& map, int rank, int i, int c, const long long* at,
                         const std::vector<Action>& list) {
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
  return OkStatus();
}

// Check (a) for one rank: every action belongs to a stage of this rank and names the right
// peer; exactly one of each action per (micro-batch, chunk); the order around each compute.
Status CheckRankActions(const StageMap& map, int m, int rank, const std::vector<Action>& list) {
  std::vector<long long> index;
  SY_RETURN_IF_ERROR(IndexRankActions(map, m, rank, list, &index));
  for (int i = 0; i < m; ++i) {
    for (int c = 0; c < map.chunks; ++c) {
      SY_RETURN_IF_ERROR(CheckComputeOrder(
          map, rank, i, c, &index[(static_cast<size_t>(i) * map.chunks + c) * kKinds], list));
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
  // (from, to) -> the sends of `from` to `to` and the recvs of `to` from `from`, for the
  // pairs the lists use, in (from, to) order (a table of all pp * pp pairs would not fit
  // for a large pp).
  std::map<std::pair<int, int>, std::pair<std::vector<Message>, std::vector<Message>>> pairs;
  for (int r = 0; r < map.pp; ++r) {
    for (size_t j = 0; j < ranks[r].size(); ++j) {
      const Action& a = ranks[r][j];
      if (IsCompute(a.kind)) continue;
      const int stage = map.Stage(r, a.chunk);
      const bool activation = IsActivation(a.kind);
      if (IsSend(a.kind)) {
        pairs[{r, a.peer}].first.push_back({activation, a.micro_batch, stage, j});
      } else {
        const int from = activation ? stage - 1 : stage + 1;
        pairs[{a.peer, r}].second.push_back({activation, a.micro_batch, from, j});
      }
    }
  }
  for (const auto& [pair, messages] : pairs) {
    const auto [from, to] = pair;
    const std::vector<Message>& sent = messages.first;
    const std::vector<Message>& received = messages.second;
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
  return OkStatus();
}

}  // namespace

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

}  // namespace switchyard::parallel
