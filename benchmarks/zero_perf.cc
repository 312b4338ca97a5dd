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
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/harness.h"
#include "benchmarks/train_bench.h"
#include "engine/dist/counting_communicator.h"
#include "engine/parallel/grad_sync.h"
#include "engine/config/config.h"
#include "engine/plan/dry_run.h"
#include "engine/train/trainer.h"

namespace switchyard::bench {
namespace {

namespace fs = std::filesystem;

// The ZeRO paper's bytes a rank sends per step for `trainer`'s partitioned parameters.
double AnalyticSent(train::Trainer& trainer, int stage, int64_t micro_batches, bool tied) {
  const dist::ParallelContext& pc = trainer.parallel_context();
  double sent = 0;
  for (const parallel::Parameter& p : trainer.decoder().registry().params()) {
    if (!p.trainable || p.grad_sum.empty()) continue;
    const int n = parallel::GroupOf(pc, p.view, p.grad_sum).size();
    if (n == 1) continue;
    const double psi = 4.0 * p.grad.numel() * (n - 1) / n;
    double times = stage < 3 ? 2.0 : 2.0 * micro_batches + 1;
    if (stage == 3 && tied && p.name.rfind("embed.", 0) == 0) times += micro_batches;
    sent += times * psi;
  }
  return sent;
}

int Main(int argc, char** argv) {
  Harness h("zero_perf",
            "ZeRO stages 0-3 (dp = ranks): step time, bytes held per rank beside the dry-run, "
            "bytes sent beside the ZeRO paper's volume",
            {});
  std::string config_path = "configs/switch-tiny.yaml", data_dir, sets, stages_flag = "0,1,2,3";
  int steps = 4, grad_accum = 1, ep = 1;
  h.flags().AddString("config", &config_path, "the model config (switch-tiny)");
  h.flags().AddString("data", &data_dir, "prepared data (switchyard prep); default: a synthetic corpus");
  h.flags().AddInt("steps", &steps, "timed training steps after one warm-up step");
  h.flags().AddInt("grad_accum", &grad_accum, "micro-batches per rank and step");
  h.flags().AddInt("ep", &ep, "expert parallelism (the experts' data-parallel group is ranks / ep)");
  h.flags().AddString("stages", &stages_flag, "comma-separated ZeRO stages to run");
  h.flags().AddString("set", &sets, "comma-separated config overrides (section.key=value,...)");
  if (auto code = h.Start(argc, argv)) return *code;

  std::string tmp;
  if (data_dir.empty()) {
    auto made = MakeSyntheticData(h.world(), "sy_zero_perf", 2000);
    if (!made.ok()) return h.Fail(Message(made.status()));
    tmp = *made;
    data_dir = (fs::path(tmp) / "data").string();
  }
  std::vector<int> all(h.ranks());
  for (int r = 0; r < h.ranks(); ++r) all[r] = r;
  dist::CountingCommunicator world(h.world().Split({all}));

  Table table({{{"stage", "", 6, 0}},
               {{"step_s", "(median)", 10, 4}, {"min", "(s)", 9, 4}, {"max", "(s)", 9, 4}},
               {{"states", "(B)", 11, 0}, {"predicted", "(B)", 11, 0}, {"workspace", "(B pk)", 11, 0},
                {"ws_pred", "(B)", 11, 0}},
               {{"sent", "(B/step)", 12, 0}, {"analytic", "(B/step)", 12, 0}}},
              h.printing());
  table.PrintHeader();
  int64_t wrong = 0;
  nlohmann::json extra = {{"ranks", h.ranks()}, {"ep", ep}, {"config", config_path}};
  for (size_t at = 0; at < stages_flag.size(); at += 2) {
    const int stage = stages_flag[at] - '0';
    std::vector<std::string> overrides = {
        "data.dir=" + data_dir, "parallel.ep=" + std::to_string(ep),
        "parallel.zero_stage=" + std::to_string(stage), "train.grad_accum=" + std::to_string(grad_accum),
        "train.eval_every=0", "train.max_steps=" + std::to_string(steps + 1), "train.warmup_steps=0"};
    for (size_t s = 0; !sets.empty() && s != std::string::npos;) {
      const size_t comma = sets.find(',', s);
      overrides.push_back(sets.substr(s, comma == std::string::npos ? comma : comma - s));
      s = comma == std::string::npos ? comma : comma + 1;
    }
    auto config = config::LoadConfig(config_path, overrides);
    if (!config.ok()) return h.Fail(Message(config.status()));
    const std::string out =
        (fs::temp_directory_path() / ("sy_zero_perf_run_" + std::to_string(stage))).string();
    auto created = train::Trainer::Create(*config, out, world);
    if (!created.ok()) return h.Fail(Message(created.status()));
    std::unique_ptr<train::Trainer> trainer = std::move(*created);
    if (Status ran = RunQuietly(*trainer, 1); !ran.ok()) return h.Fail(Message(ran));  // warm-up
    const dist::ParallelContext& pc = trainer->parallel_context();
    std::vector<dist::CountingCommunicator*> groups;  // the data-parallel groups, once each
    for (dist::Communicator* c : {&pc.dp_cp(), &pc.dp_cp_tp(), &pc.edp(), &pc.edp_etp()}) {
      auto* counting = dynamic_cast<dist::CountingCommunicator*>(c);
      if (counting && std::find(groups.begin(), groups.end(), counting) == groups.end())
        groups.push_back(counting);
    }
    std::vector<double> step_s;
    double sent = 0;
    for (int s = 0; s < steps; ++s) {
      for (auto* g : groups) g->ResetTraffic();
      const double t0 = Now();
      if (Status ran = RunQuietly(*trainer, 1); !ran.ok()) return h.Fail(Message(ran));
      step_s.push_back(Now() - t0);
      sent = 0;
      for (auto* g : groups) sent += g->traffic().RingBytes(g->size());
    }
    const double analytic =
        AnalyticSent(*trainer, stage, grad_accum, config->model.tie_embeddings);
    const train::Trainer::Memory m = trainer->memory();
    auto mesh = dist::Mesh::Create(h.ranks(), config->parallel.MeshSizes(), config->parallel.order);
    const plan::RankMemory predicted = plan::PredictRankMemory(*config, *mesh, h.rank());
    std::vector<double> sorted = step_s;
    std::sort(sorted.begin(), sorted.end());
    const double median = h.MedianOfMax(step_s);
    const double lo = h.Max(sorted.front()), hi = h.Max(sorted.back());
    const double measured_states = h.Max(static_cast<double>(m.model_states()));
    const double predicted_states = h.Max(predicted.model_states());
    const double workspace = h.Max(static_cast<double>(m.workspace_peak));
    const double sent_max = h.Max(sent), analytic_max = h.Max(analytic);
    const bool volume_ok = analytic_max == 0 ? sent_max < 1024 : std::abs(sent_max / analytic_max - 1) <= 0.02;
    const bool memory_ok = std::abs(measured_states / predicted_states - 1) <= 0.05;
    if (!volume_ok || !memory_ok) ++wrong;
    table.AddRow({int64_t{stage}, median, lo, hi, static_cast<int64_t>(measured_states),
                  static_cast<int64_t>(predicted_states), static_cast<int64_t>(workspace),
                  static_cast<int64_t>(h.Max(predicted.workspace)), static_cast<int64_t>(sent_max),
                  static_cast<int64_t>(analytic_max)});
    trainer.reset();
    world.Barrier();
    if (h.rank() == 0) {
      std::error_code ec;
      fs::remove_all(out, ec);
    }
  }
  if (h.printing()) {
    std::printf("# dp %d, ep %d, %d micro-batch(es) per rank and step; the largest rank's bytes; "
                "sent = ring-equivalent bytes of the data-parallel groups\n",
                h.ranks(), ep, grad_accum);
  }
  if (h.rank() == 0 && !tmp.empty()) {
    std::error_code ec;
    fs::remove_all(tmp, ec);
  }
  return h.Finish(table, wrong, extra);
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
