// zero_perf: ZeRO stages 0-3 on this machine, dp = the world (launch with mpirun -np 2, 4,
// 8): per stage, the step time, the bytes each rank holds (parameters, gradients,
// optimizer state between steps, and the workspace peak, from the allocator's ledger)
// beside the dry-run's prediction, and the bytes the data-parallel groups sent per step
// beside the ZeRO paper's volume (section 7):
//
//   stage 0, 1, 2   2 Psi (n-1)/n   (all-reduce = reduce-scatter + all-gather of gradients;
//                                    stages 1-2: reduce-scatter of gradients + all-gather
//                                    of the updated parameters)
//   stage 3         3 Psi (n-1)/n per micro-batch step (a gather forward, a gather backward,
//                                    a reduce-scatter), i.e. (2 A + 1) Psi (n-1)/n with A
//                                    micro-batches; with tied embeddings the table is gathered
//                                    once more per micro-batch (for the head in forward)
//
// Psi is the bytes of the parameters partitioned over each group (dense over dp x cp,
// tp-summed replicas over dp x cp x tp, experts over edp), each with its own n. Measured
// bytes are the counting communicator's ring-equivalent sends; the losses' and statistics'
// few doubles also travel there, so #wrong counts a stage whose measured volume is more than
// 2% from the formula, or whose model states are more than 5% from the dry-run.
#include <algorithm>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/benchmark.h"
#include "benchmarks/train_bench.h"
#include "engine/dist/counting_communicator.h"
#include "engine/parallel/grad_sync.h"
#include "engine/config/config.h"
#include "engine/config/sync_settings.h"
#include "engine/config/sync_settings.h"
#include "engine/plan/dry_run.h"
#include "engine/plan/zero_memory.h"
#include "engine/train/trainer.h"

namespace switchyard::bench {
namespace {

// The ZeRO paper's bytes a rank sends per step for `trainer`'s partitioned parameters.
// Streaming (stages 2-3 accumulating in place) reduce-scatters every micro-batch: stage 2
// (A + 1) Psi (n-1)/n, stage 3 3 A Psi (n-1)/n.
double AnalyticSent(train::Trainer& trainer, int stage, int64_t micro_batches, bool tied,
                    bool stream) {
  const dist::ParallelContext& pc = trainer.parallel_context();
  double sent = 0;
  for (const parallel::Parameter& p : trainer.decoder().registry().params()) {
    if (!p.trainable || p.grad_sum.empty()) continue;
    const int n = parallel::GroupOf(pc, p.view, p.grad_sum).size();
    if (n == 1) continue;
    const double psi = 4.0 * p.grad.numel() * (n - 1) / n;
    const double scatters = stream ? double(micro_batches) : 1.0;
    double times = stage < 2 ? 2.0 : stage == 2 ? scatters + 1 : 2.0 * micro_batches + scatters;
    if (stage == 3 && tied && p.name.rfind("embed.", 0) == 0) times += micro_batches;
    sent += times * psi;
  }
  return sent;
}

constexpr double kMiB = 1024.0 * 1024.0;

// A stage's measured and predicted bytes, each the largest rank's.
struct StageBytes {
  double states = 0, predicted_states = 0, workspace = 0, predicted_workspace = 0;
  // The peak (model states + workspace peak), the dry-run's and the ZeRO paper's model
  // states alone (16P, 8P + 8P/N, 4P + 12P/N, 16P/N; dense N = dp x cp, experts N = edp).
  double peak = 0, predicted_peak = 0, formula = 0;
  double sent = 0, analytic = 0;
};

class ZeroPerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    train_.AddFlags(flags, "micro-batches per rank and step");
    flags.AddInt("ep", &ep_, "expert parallelism (the experts' data-parallel group is ranks / ep)");
    flags.AddString("stages", &stages_, "comma-separated ZeRO stages to run");
    train_.AddSetFlag(flags);
  }

  Status Setup(Harness& h) override { return train_.Prepare(h, "sy_zero_perf"); }

  Table MakeTable(Harness& h) override {
    return Table(
        {{{"stage", "", 6, 0}},
         {{"step_s", "(median)", 10, 4}, {"min", "(s)", 9, 4}, {"max", "(s)", 9, 4}},
         {{"states", "(B)", 11, 0}, {"predicted", "(B)", 11, 0}, {"workspace", "(B pk)", 11, 0},
          {"ws_pred", "(B)", 11, 0}},
         {{"peak", "(MiB)", 8, 1}, {"dry-run", "(MiB)", 8, 1}, {"formula", "(MiB)", 8, 1}},
         {{"sent", "(B/step)", 12, 0}, {"analytic", "(B/step)", 12, 0}}},
        h.printing());
  }

  // One case per stage of --stages, read one character every two ("0,1,2,3").
  int NumCases() const override { return static_cast<int>(stages_.size() + 1) / 2; }

  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    const int stage = stages_[2 * index] - '0';
    SY_ASSIGN_OR_RETURN(const config::Config config,
                        train_.LoadConfig({"parallel.ep=" + std::to_string(ep_),
                                           "parallel.zero_stage=" + std::to_string(stage)}));
    const std::string out = "sy_zero_perf_run_" + std::to_string(stage);
    SY_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> trainer, train_.StartTrainer(config, out));
    const dist::ParallelContext& pc = trainer->parallel_context();
    std::vector<dist::CountingCommunicator*> groups;  // the data-parallel groups, once each
    for (dist::Communicator* c : {&pc.dp_cp(), &pc.dp_cp_tp(), &pc.edp(), &pc.edp_etp()}) {
      auto* counting = dynamic_cast<dist::CountingCommunicator*>(c);
      if (counting && std::find(groups.begin(), groups.end(), counting) == groups.end())
        groups.push_back(counting);
    }
    double sent = 0;
    SY_ASSIGN_OR_RETURN(const std::vector<double> step_s,
                        train_.RunSteps(
                            *trainer, [&] { for (auto* g : groups) g->ResetTraffic(); },
                            [&] {
                              sent = 0;
                              for (auto* g : groups) sent += g->traffic().RingBytes(g->size());
                            }));
    const StepSeconds t = SummarizeSteps(h, step_s);
    const StageBytes b = Bytes(h, *trainer, config, stage, sent);
    const bool volume_ok = b.analytic == 0 ? b.sent < 1024 : std::abs(b.sent / b.analytic - 1) <= 0.02;
    const bool memory_ok = std::abs(b.states / b.predicted_states - 1) <= 0.05 &&
                           std::abs(b.predicted_peak / b.peak - 1) <= 0.10;
    table.AddRow({int64_t{stage}, t.median, t.min, t.max, static_cast<int64_t>(b.states),
                  static_cast<int64_t>(b.predicted_states), static_cast<int64_t>(b.workspace),
                  static_cast<int64_t>(b.predicted_workspace), b.peak / kMiB,
                  b.predicted_peak / kMiB, b.formula / kMiB, static_cast<int64_t>(b.sent),
                  static_cast<int64_t>(b.analytic)});
    train_.EndTrainer(std::move(trainer), out);
    return volume_ok && memory_ok ? 0 : 1;
  }

  void Conclude(Harness& h, Table& table) override {
    h.Printf("# dp %d, ep %d, %d micro-batch(es) per rank and step; the largest rank's bytes; "
             "sent = ring-equivalent bytes of the data-parallel groups\n",
             h.ranks(), ep_, train_.grad_accum());
    train_.Cleanup(h);
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"ranks", h.ranks()}, {"ep", ep_}, {"config", train_.config_path()}};
  }

 private:
  // The trainer's bytes beside the dry-run's and the ZeRO paper's, the largest rank's.
  StageBytes Bytes(Harness& h, train::Trainer& trainer, const config::Config& config, int stage,
                   double sent) {
    const double analytic =
        AnalyticSent(trainer, stage, train_.grad_accum(), config.model.tie_embeddings,
                     config::SyncPolicyOf(config).stream);
    const train::Trainer::Memory m = trainer.memory();
    auto mesh = dist::Mesh::Create(h.ranks(), config.parallel.MeshSizes(), config.parallel.order);
    const plan::RankMemory predicted = plan::PredictRankMemory(config, *mesh, h.rank());
    StageBytes b;
    b.states = h.Max(static_cast<double>(m.model_states()));
    b.predicted_states = h.Max(predicted.model_states());
    b.workspace = h.Max(static_cast<double>(m.workspace_peak));
    b.sent = h.Max(sent);
    b.analytic = h.Max(analytic);
    b.predicted_workspace = h.Max(predicted.workspace);
    b.peak = h.Max(static_cast<double>(m.model_states() + m.workspace_peak));
    b.predicted_peak = h.Max(predicted.total());
    const plan::RankParams held = plan::EstimateRankParams(config, *mesh, h.rank());
    auto paper = [stage](double p, double n) {
      const double bytes = 4 * p;  // f32 weights; gradients 4, AdamW 8 more per element
      return stage == 0 ? 4 * bytes
             : stage == 1 ? 2 * bytes + 2 * bytes / n
             : stage == 2 ? bytes + 3 * bytes / n
                          : 4 * bytes / n;
    };
    b.formula = h.Max(paper(double(held.dense + held.replicated), double(mesh->dp()) * mesh->cp()) +
                      paper(double(held.expert), mesh->edp()));
    return b;
  }

  TrainBench train_{4, 1};
  int ep_ = 1;
  std::string stages_ = "0,1,2,3";
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::ZeroPerf>(
      argc, argv, "zero_perf",
      "ZeRO stages 0-3 (dp = ranks): step time, bytes held per rank beside the dry-run, "
      "bytes sent beside the ZeRO paper's volume");
}
