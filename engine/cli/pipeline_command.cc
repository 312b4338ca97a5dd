// `switchyard pipeline`: builds a pipeline schedule's action lists for every rank, validates
// them (engine/parallel/pipeline_schedule.h), and prints the unit-time chart, the bubble
// measured and analytic, and each rank's idle share and peak in-flight micro-batches.
// With --actions, each rank's ordered action list follows. See docs/pipeline.md.
#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "engine/cli/args.h"
#include "engine/cli/commands.h"
#include "engine/cli/common.h"
#include "engine/parallel/pipeline_schedule.h"

namespace switchyard::cli {
namespace {

using parallel::PipelineSchedule;

constexpr char kCommand[] = "switchyard pipeline";

// Bounds that keep the chart (one character per time unit and rank) and the memory small:
// only the ratio of the costs matters, and the chart is read by eye.
constexpr int kMaxCost = 1000;
constexpr int kMaxPipelineRanks = 1024;
constexpr long long kMaxChartCharacters = 1LL << 24;  // 16 MiB of chart

// The flags' ranges (docs/pipeline.md); CheckScheduleArgs checks the rest.
Status CheckRanges(int pp, int forward_cost, int backward_cost) {
  if (pp > kMaxPipelineRanks) {
    return InvalidArgument("--pp must be at most ", kMaxPipelineRanks,
                           " (one chart line per rank), got ", pp);
  }
  for (const auto& [flag, cost] : {std::pair{"--forward-cost", forward_cost},
                                   std::pair{"--backward-cost", backward_cost}}) {
    if (cost < 1 || cost > kMaxCost) {
      return InvalidArgument(flag, " must be in [1, ", kMaxCost,
                             "] time units (only the ratio of the two costs matters), got ", cost);
    }
  }
  return OkStatus();
}

// OK when the chart of `timeline` is at most kMaxChartCharacters.
Status CheckChartSize(const parallel::Timeline& timeline) {
  const long long lines = 1LL * timeline.pp * (timeline.virtual_stages > 1 ? 2 : 1);
  const long long characters = lines * timeline.makespan;
  if (characters <= kMaxChartCharacters) return OkStatus();
  return InvalidArgument("the chart would be ", characters, " characters (", lines, " lines of ",
                         timeline.makespan, " time units), more than ", kMaxChartCharacters,
                         "; lower --forward-cost and --backward-cost (keep their ratio), "
                         "--micro-batches or --pp");
}

// "rank  idle share  peak in flight" with one row per rank.
std::string RankTable(const parallel::Timeline& timeline, const std::vector<int>& peaks) {
  const bool chunks = timeline.virtual_stages > 1;
  std::string out = StrCat("rank  idle share  peak in flight (",
                           chunks ? "micro-batch chunks" : "micro-batches", ")\n");
  for (int r = 0; r < timeline.pp; ++r) {
    char row[64];
    std::snprintf(row, sizeof(row), "%4d  %10.4f  %d\n", r, timeline.idle_fraction[r], peaks[r]);
    out += row;
  }
  return out;
}

}  // namespace

int RunPipeline(const std::vector<std::string>& args) {
  int pp = 0, micro_batches = 0, virtual_stages = 1, forward_cost = 1, backward_cost = 2;
  std::string schedule_name = "1f1b";
  bool actions = false;
  FlagSet flags(kCommand,
                "Validates a pipeline-parallel schedule (every forward and backward once, in\n"
                "dependency order, messages matched in order, no deadlock) and prints its\n"
                "timeline with unit costs, the bubble measured and analytic, and the peak\n"
                "number of micro-batches each rank holds. See docs/pipeline.md.");
  flags.AddInt("pp", &pp, "pipeline stages (ranks), 1 to 1024", /*required=*/true);
  flags.AddInt("micro-batches", &micro_batches, "micro-batches per step (train.grad_accum)",
               /*required=*/true);
  flags.AddString("schedule", &schedule_name, "gpipe, 1f1b or interleaved (default 1f1b)");
  flags.AddInt("virtual-stages", &virtual_stages,
               "model chunks per rank, >= 2 for interleaved (default 1)");
  flags.AddInt("forward-cost", &forward_cost, "time units of a forward, 1 to 1000 (default 1)");
  flags.AddInt("backward-cost", &backward_cost,
               "time units of a backward, 1 to 1000 (default 2); the chart, one character\n"
               "per time unit and rank, may hold at most 16 MiB");
  flags.AddBool("actions", &actions, "also print every rank's ordered action list");
  if (Status status = flags.Parse(args); !status.ok()) {
    return UsageError(kCommand, std::string(status.message()));
  }
  if (flags.help_requested()) {
    std::fputs(flags.Usage().c_str(), stdout);
    return kExitOk;
  }
  StatusOr<PipelineSchedule> schedule = parallel::ParsePipelineSchedule(schedule_name);
  if (!schedule.ok()) return UsageError(kCommand, std::string(schedule.status().message()));
  Status args_ok = CheckRanges(pp, forward_cost, backward_cost);
  if (args_ok.ok()) {
    args_ok = parallel::CheckScheduleArgs(*schedule, pp, micro_batches, virtual_stages);
  }
  if (Status status = args_ok; !status.ok()) {
    return UsageError(kCommand, std::string(status.message()));
  }
  // The lists are generated, so a failure here is a bug in the schedule, not a usage error.
  if (Status status = parallel::ValidateSchedules(*schedule, pp, micro_batches, virtual_stages);
      !status.ok()) {
    PrintError(kCommand, std::string(status.message()));
    return kExitFailure;
  }

  const parallel::Timeline timeline = parallel::SimulateTimeline(
      *schedule, pp, micro_batches, virtual_stages, forward_cost, backward_cost);
  if (Status status = CheckChartSize(timeline); !status.ok()) {
    return UsageError(kCommand, std::string(status.message()));
  }
  std::vector<std::vector<parallel::Action>> lists;
  std::vector<int> peaks;
  for (int r = 0; r < pp; ++r) {
    lists.push_back(parallel::ScheduleActions(*schedule, pp, micro_batches, virtual_stages, r));
    peaks.push_back(parallel::MaxInFlight(lists.back()));
  }
  std::string out = "schedule validated: every forward and backward once and in dependency "
                    "order, messages matched in order, no deadlock\n\n";
  out += parallel::RenderTimeline(timeline) + "\n" + RankTable(timeline, peaks);
  if (actions) {
    for (int r = 0; r < pp; ++r) {
      out += StrCat("\nrank ", r, " actions\n");
      for (size_t i = 0; i < lists[r].size(); ++i) {
        char index[32];
        std::snprintf(index, sizeof(index), "%5zu  ", i);
        out += index + parallel::FormatAction(lists[r][i]) + "\n";
      }
    }
  }
  std::fputs(out.c_str(), stdout);
  return kExitOk;
}

}  // namespace switchyard::cli
