// pipeline_perf: pipeline-parallel training per schedule (gpipe, 1f1b) and
// layout — pp = ranks, and pp = ranks / 2 with dp 2 when that is 2 or more (launch with
// mpirun -np 2, 4, 8) — on a small config; per pipeline rank:
//
//   (a) the bubble: the share of the step the rank spends outside forward and backward
//       compute (waiting in recvs, posting sends, waiting for its sends at the end), from
//       PipelineRunner's per-action trace: 1 - busy / makespan, the makespan being the pp
//       group's, from the latest rank's begin of the step (before it, a rank that began
//       early waits for the others to leave the previous step) to the latest end, busy the
//       compute inside it (all ranks run on one machine, so their steady clocks agree);
//       median and spread over the timed
//       steps, beside parallel::AnalyticBubble = (p-1)/(m+p-1), which assumes equal stages,
//       and beside the schedule simulated with the stages' measured forward and backward
//       times (the idle the stages' imbalance leaves, noise aside);
//   (b) the workspace peak (the allocator's ledger, Trainer::memory()) beside the dry-run's
//       PredictRankMemory, and the activations the dry-run puts in it (the micro-batches in
//       flight x one micro-batch's activations of the stage, PlanPipeline);
//   (c) the bytes the rank sent point to point per step (the counting communicator of the
//       pp group) beside the analytic volume: one activation forward to the next stage and
//       one gradient backward to the previous per micro-batch, m x H each (H = micro_batch
//       x seq_len x d_model f32), so the group sends 2 x m x H per boundary; with tied
//       embeddings the first and last stage also exchange their token table's gradient.
//
// #wrong counts a row whose bytes differ from the analytic volume by more than 0.5% or
// whose workspace peak is more than 10% from the dry-run's prediction. The bubble is never
// checked: on a 2-core machine with oversubscribed ranks it is mostly the operating
// system's scheduling.
#include <algorithm>
#include <cstdio>
#include <map>
#include <tuple>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/benchmark.h"
#include "benchmarks/train_bench.h"
#include "engine/dist/counting_communicator.h"
#include "engine/config/config.h"
#include "engine/plan/dry_run.h"
#include "engine/train/trainer.h"

namespace switchyard::bench {
namespace {

using parallel::ActionKind;

struct Layout {
  int pp, dp;
};

// This rank's compute seconds (forwards and backwards) of a traced step inside [from, to].
double Busy(const train::PipelineRunner::StepTrace& trace, double from, double to) {
  double busy = 0;
  for (const auto& t : trace.actions) {
    if (t.action.kind == ActionKind::kForward || t.action.kind == ActionKind::kBackward)
      busy += std::max(0.0, std::min(t.end, to) - std::max(t.start, from));
  }
  return busy;
}

// Mean seconds of this rank's forwards and of its backwards in a traced step.
std::pair<double, double> MeanComputeTimes(const train::PipelineRunner::StepTrace& trace) {
  double f = 0, b = 0;
  int nf = 0, nb = 0;
  for (const auto& t : trace.actions) {
    if (t.action.kind == ActionKind::kForward) f += t.end - t.start, ++nf;
    if (t.action.kind == ActionKind::kBackward) b += t.end - t.start, ++nb;
  }
  return {nf > 0 ? f / nf : 0, nb > 0 ? b / nb : 0};
}

// Each rank's idle share of the makespan when rank r's forwards take forward[r] and its
// backwards backward[r] seconds, messages take none, a send never waits and a recv waits
// for its send (parallel::SimulateTimeline's rules with each stage's own costs): what the
// schedule leaves idle with these stages, noise aside.
std::vector<double> SimulatedIdle(const std::vector<std::vector<parallel::Action>>& lists,
                                  const std::vector<double>& forward,
                                  const std::vector<double>& backward) {
  const int pp = static_cast<int>(lists.size());
  std::vector<double> clock(pp, 0), busy(pp, 0);
  std::vector<size_t> next(pp, 0);
  // Post time of each message: (from, to, gradient?, micro-batch) -> seconds.
  std::map<std::tuple<int, int, bool, int>, double> posted;
  for (bool progress = true; progress;) {
    progress = false;
    for (int r = 0; r < pp; ++r) {
      for (; next[r] < lists[r].size(); ++next[r]) {
        const parallel::Action& a = lists[r][next[r]];
        if (a.kind == ActionKind::kForward || a.kind == ActionKind::kBackward) {
          const double cost = a.kind == ActionKind::kForward ? forward[r] : backward[r];
          clock[r] += cost;
          busy[r] += cost;
        } else if (a.kind == ActionKind::kSendActivation || a.kind == ActionKind::kSendGradient) {
          posted[{r, a.peer, a.kind == ActionKind::kSendGradient, a.micro_batch}] = clock[r];
        } else {
          auto it = posted.find({a.peer, r, a.kind == ActionKind::kRecvGradient, a.micro_batch});
          if (it == posted.end()) break;  // blocked until the peer posts it
          clock[r] = std::max(clock[r], it->second);
        }
        progress = true;
      }
    }
  }
  const double makespan = *std::max_element(clock.begin(), clock.end());
  std::vector<double> idle(pp);
  for (int r = 0; r < pp; ++r) idle[r] = makespan > 0 ? 1 - busy[r] / makespan : 0;
  return idle;
}

// The p2p bytes pipeline rank `stage` of `pp` sends per step by the schedule's rule, and the
// tied table's gradient exchanged between the first and last stage.
double AnalyticSent(int stage, int pp, int micro_batches, double hidden, double tied_table) {
  double sent = 0;
  if (stage + 1 < pp) sent += micro_batches * hidden;  // activations forward
  if (stage > 0) sent += micro_batches * hidden;       // gradients backward
  if (pp > 1 && (stage == 0 || stage == pp - 1)) sent += tied_table;
  return sent;
}

// What one rank measured over the timed steps of a case.
struct Measured {
  std::vector<double> bubbles;  // per step, sorted
  double sent = 0;              // p2p bytes of the last step
  double forward_s = 0, backward_s = 0;  // mean forward and backward seconds
};

// The columns every rank contributes to its row; gathered from every rank.
enum Field { kMedian, kMin, kMax, kPeak, kPredicted, kSent, kAnalytic, kBad, kFwd, kBwd, kFields };

class PipelinePerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    train_.AddFlags(flags, "micro-batches per step (m)");
    flags.AddString("schedules", &schedules_flag_, "comma-separated schedules: gpipe, 1f1b");
    train_.AddSetFlag(flags);
  }

  // The layouts: pp = ranks, and pp = ranks / 2 with dp 2 when that is 2 or more.
  Status Setup(Harness& h) override {
    if (train_.steps() < 1) return InvalidArgument("--steps must be >= 1");
    if (h.ranks() >= 2) layouts_.push_back({h.ranks(), 1});
    if (h.ranks() % 2 == 0 && h.ranks() / 2 >= 2) layouts_.push_back({h.ranks() / 2, 2});
    if (layouts_.empty()) return InvalidArgument("pipeline_perf needs 2 or more ranks (mpirun -np N)");
    schedules_ = SplitList(schedules_flag_);
    return train_.Prepare(h, "sy_pipeline_perf");
  }

  Table MakeTable(Harness& h) override {
    return Table({{{"schedule", "", 8, 0}, {"pp", "", 3, 0}, {"dp", "", 3, 0}, {"m", "", 3, 0},
                   {"stage", "", 5, 0}},
                  {{"fwd", "(ms)", 7, 2}, {"bwd", "(ms)", 7, 2}},
                  {{"bubble", "(median)", 8, 3}, {"min", "", 6, 3}, {"max", "", 6, 3},
                   {"sim", "", 6, 3}, {"analytic", "", 8, 3}},
                  {{"ws_peak", "(B)", 10, 0}, {"ws_pred", "(B)", 10, 0}, {"err", "(%)", 6, 1},
                   {"act_pred", "(B)", 10, 0}, {"in_flight", "", 9, 0}},
                  {{"sent", "(B/step)", 11, 0}, {"volume", "(B/step)", 11, 0}}},
                 h.printing());
  }

  // Every layout under every schedule.
  int NumCases() const override { return static_cast<int>(layouts_.size() * schedules_.size()); }

  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    const Layout layout = layouts_[index / schedules_.size()];
    const std::string& schedule = schedules_[index % schedules_.size()];
    SY_ASSIGN_OR_RETURN(const config::Config c,
                        train_.LoadConfig({"parallel.pp=" + std::to_string(layout.pp),
                                           "parallel.pipeline_schedule=" + schedule}));
    const std::string out = StrCat("sy_pipeline_perf_run_", schedule, "_", layout.pp);
    SY_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> trainer, train_.StartTrainer(c, out));
    auto* pp = dynamic_cast<dist::CountingCommunicator*>(&trainer->parallel_context().pp());
    if (pp == nullptr) return FailedPrecondition("the pp group is not counted (a device communicator?)");
    SY_ASSIGN_OR_RETURN(const Measured m, Measure(h, *trainer, *pp));

    // The analytic volume: H per message, and the tied table's gradient.
    const double hidden = 4.0 * c.train.micro_batch_size * c.model.seq_len * c.model.d_model /
                          (c.parallel.tp > 1 && c.parallel.sequence_parallel ? c.parallel.tp : 1);
    double tied_table = 0;
    if (c.model.tie_embeddings) {
      for (const parallel::Parameter& p : trainer->decoder().registry().params())
        if (p.name == "embed.wte") tied_table = 4.0 * p.grad.numel();
    }
    const double analytic =
        AnalyticSent(pp->rank(), layout.pp, train_.grad_accum(), hidden, tied_table);
    SY_ASSIGN_OR_RETURN(const dist::Mesh mesh,
                        dist::Mesh::Create(h.ranks(), c.parallel.MeshSizes(), c.parallel.order));
    const plan::RankMemory predicted = plan::PredictRankMemory(c, mesh, h.rank());
    SY_ASSIGN_OR_RETURN(const plan::PipelinePlan plan, plan::PlanPipeline(c, mesh));
    const double peak = static_cast<double>(trainer->memory().workspace_peak);
    const double err = peak / predicted.workspace - 1;
    const bool bytes_ok = std::abs(m.sent - analytic) <= 0.005 * std::max(analytic, 1.0);
    const bool memory_ok = std::abs(err) <= 0.10;
    const std::vector<double> row = {m.bubbles[m.bubbles.size() / 2], m.bubbles.front(),
                                     m.bubbles.back(), peak, predicted.workspace, m.sent,
                                     analytic, double(bytes_ok && memory_ok ? 0 : 1),
                                     m.forward_s, m.backward_s};
    const int64_t wrong = AddRows(h, layout, schedule, mesh, plan, row, table);
    nlohmann::json& group = groups_.back();
    group["activation_message_bytes"] = hidden;
    group["tied_table_bytes"] = tied_table;
    h.Printf("#   %s pp %d dp %d: the pp group sent %.0f B/step; analytic 2 x m x H x "
             "(pp-1) = 2 x %d x %.0f x %d = %.0f, + the tied table's gradient both ways "
             "2 x %.0f = %.0f\n",
             schedule.c_str(), layout.pp, layout.dp, group["group_sent"].get<double>(),
             train_.grad_accum(), hidden, layout.pp - 1,
             2.0 * train_.grad_accum() * hidden * (layout.pp - 1), tied_table,
             group["group_analytic"].get<double>());
    train_.EndTrainer(std::move(trainer), out);
    return wrong;
  }

  void Conclude(Harness& h, Table& table) override {
    h.Printf(
        "# bubble: 1 - (forward + backward time) / the pp group's step makespan (from its last\n"
        "#   rank's begin), median [min, max] over %d steps; noisy with oversubscribed ranks (the\n"
        "#   OS scheduler, not the schedule, decides much of the idle time); sim: the schedule's\n"
        "#   idle share with the stages' measured mean forward (fwd) and backward (bwd) times and\n"
        "#   free messages; analytic: (p-1)/(m+p-1), equal stages.\n"
        "# ws: the workspace peak (ledger) vs the dry-run; act_pred: in_flight x one micro-batch's\n"
        "#   activations of the stage (part of ws_pred). sent: p2p bytes; volume: m x H per\n"
        "#   neighbour (+ the tied table's gradient). Rows: dp replica 0; #wrong counts every rank.\n",
        train_.steps());
    train_.Cleanup(h);
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"config", train_.config_path()},
            {"steps", train_.steps()},
            {"grad_accum", train_.grad_accum()},
            {"groups", groups_}};
  }

 private:
  // The timed steps with PipelineRunner's trace on: each step's bubble, the last step's
  // p2p bytes, the mean forward and backward.
  StatusOr<Measured> Measure(Harness& h, train::Trainer& trainer, dist::CountingCommunicator& pp) {
    train::PipelineRunner::StepTrace trace;
    trainer.pipeline().set_trace(&trace);
    Measured m;
    const int steps = train_.steps();
    StatusOr<std::vector<double>> ran = train_.RunSteps(trainer, [&] { pp.ResetTraffic(); }, [&] {
      m.sent = static_cast<double>(pp.traffic().p2p_bytes);
      // The pp group's makespan: every rank's (begin, end) over the world (not counted).
      const std::vector<double> mine = {trace.begin, trace.end};
      Tensor times = Tensor::Empty({2 * h.ranks()}, DType::kF64);
      h.world().AllGather(Tensor::FromVector(mine, {2}), times);
      const std::vector<double> t = times.ToVector<double>();
      // The step runs from the moment the group's last rank begins it (the ranks leave
      // the previous step at different times: rank 0 logs and writes more) to the end
      // of its last rank.
      double begin = trace.begin, end = trace.end;
      for (int r : pp.world_ranks()) begin = std::max(begin, t[2 * r]), end = std::max(end, t[2 * r + 1]);
      m.bubbles.push_back(1.0 - Busy(trace, begin, end) / (end - begin));
      const auto [f, b] = MeanComputeTimes(trace);
      m.forward_s += f / steps;
      m.backward_s += b / steps;
    });
    trainer.pipeline().set_trace(nullptr);
    if (!ran.ok()) return ran.status();
    std::sort(m.bubbles.begin(), m.bubbles.end());
    return m;
  }

  // Gathers every rank's `row` (Field order), adds one table row per pipeline rank of dp
  // replica 0 and the case's entry of "groups"; returns the ranks' #wrong.
  int64_t AddRows(Harness& h, const Layout& layout, const std::string& schedule,
                  const dist::Mesh& mesh, const plan::PipelinePlan& plan,
                  const std::vector<double>& row, Table& table) {
    Tensor rows = Tensor::Empty({int64_t{kFields} * h.ranks()}, DType::kF64);
    h.world().AllGather(Tensor::FromVector(row, {int64_t{kFields}}), rows);
    const std::vector<double> v = rows.ToVector<double>();
    const std::vector<int> group0 = mesh.GroupOf(0, dist::View::kDense, {dist::Axis::kPp});
    int64_t wrong = 0;
    for (int r = 0; r < h.ranks(); ++r) wrong += static_cast<int64_t>(v[r * kFields + kBad]);
    // The schedule's idle shares with replica 0's measured stage times.
    std::vector<std::vector<parallel::Action>> lists;
    std::vector<double> forward, backward;
    for (int s = 0; s < layout.pp; ++s) {
      lists.push_back(
          parallel::ScheduleActions(plan.schedule, layout.pp, train_.grad_accum(), 1, s));
      forward.push_back(v[group0[s] * kFields + kFwd]);
      backward.push_back(v[group0[s] * kFields + kBwd]);
    }
    const std::vector<double> simulated = SimulatedIdle(lists, forward, backward);
    double group_sent = 0, group_analytic = 0;
    for (int s = 0; s < layout.pp; ++s) {
      const double* x = &v[group0[s] * kFields];
      const plan::PipelineStagePlan& sp = plan.stages[s];
      table.AddRow({schedule, int64_t{layout.pp}, int64_t{layout.dp},
                    int64_t{train_.grad_accum()}, int64_t{s}, 1e3 * x[kFwd], 1e3 * x[kBwd],
                    x[kMedian], x[kMin], x[kMax], simulated[s], plan.bubble,
                    static_cast<int64_t>(x[kPeak]), static_cast<int64_t>(x[kPredicted]),
                    100 * (x[kPeak] / x[kPredicted] - 1),
                    static_cast<int64_t>(sp.activation_bytes()), int64_t{sp.in_flight},
                    static_cast<int64_t>(x[kSent]), static_cast<int64_t>(x[kAnalytic])});
      group_sent += x[kSent];
      group_analytic += x[kAnalytic];
    }
    groups_.push_back({{"schedule", schedule}, {"pp", layout.pp}, {"dp", layout.dp},
                       {"group_sent", group_sent}, {"group_analytic", group_analytic}});
    return wrong;
  }

  TrainBench train_{5, 8};
  std::string schedules_flag_ = "gpipe,1f1b";
  std::vector<Layout> layouts_;
  std::vector<std::string> schedules_;
  nlohmann::json groups_ = nlohmann::json::array();
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::PipelinePerf>(
      argc, argv, "pipeline_perf",
      "pipeline parallelism per schedule and layout: bubble measured beside analytic, "
      "workspace peak beside the dry-run, p2p bytes beside the analytic volume");
}
