// tp_comm_perf: tensor-parallel training on this machine, tp = the world (launch with
// mpirun -np 1, 2, 4), at a fixed global batch: step time and tokens/s, and the bytes each
// rank's tensor-parallel communicator carried per step, measured (dist::CountingCommunicator
// wrapped around the world) beside the analytic volume.
//
// The analytic volume per micro-batch of N = b s tokens, h = d_model, f32 (Megatron-LM's
// accounting: each dense transformer layer does two all-reduces of b s h forward and two
// backward; sequence parallelism turns each into an all-gather plus a reduce-scatter of the
// same payload):
//   sequence parallel:  all-gather      (2 A + 2 M) N h + N h (head) + N h (embed bwd)
//                                       + R N E (each MoE layer gathers the group's router
//                                       logits, to route the whole group)
//                       reduce-scatter  (2 A + 2 M) N h + N h (embed) + N h (head bwd)
//   without it:         all-reduce      (2 A + 2 M) N h + N h (embed) + N h (head bwd)
//                       all-gather      R (2 N h + N E) (each MoE layer routes this rank's
//                                       rows of the group: its outputs gathered forward,
//                                       its input gradients backward, and the logits)
//   both:               all-reduce      (3 N + 1) 4 B (the vocabulary-parallel loss: the
//                                       rows' max and the vocabulary's end, then the sums of
//                                       exponentials and the target logits)
// with A attention blocks (every layer), M dense MLPs and R MoE layers with E experts.
// Payload bytes are what the
// caller hands the communicator (all-gather: the gathered output; reduce-scatter: the
// input); "ring" is what a rank of an n-rank ring sends for them (2 (n-1)/n of an all-reduce
// payload, (n-1)/n of the others). The measured and analytic payloads must be equal: a
// difference counts as #wrong.
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "benchmarks/harness.h"
#include "benchmarks/train_bench.h"
#include "engine/dist/counting_communicator.h"
#include "engine/config/config.h"
#include "engine/train/trainer.h"

namespace switchyard::bench {
namespace {

namespace fs = std::filesystem;

struct Volume {
  int64_t all_reduce = 0, all_gather = 0, reduce_scatter = 0;
};

// The analytic payload bytes of one step (see the file comment).
Volume Analytic(const config::Config& c, int tp) {
  Volume v;
  if (tp == 1) return v;
  const model::ModelConfig& m = c.model;
  const int64_t n = c.train.micro_batch_size * m.seq_len, h = m.d_model, e = c.moe.num_experts;
  int64_t a = m.n_layers, mlp = 0, moe = 0;
  for (int64_t i = 0; i < m.n_layers; ++i) (c.moe.IsMoeLayer(i) ? moe : mlp) += 1;
  const int64_t nh = n * h * 4, ne = n * e * 4;
  if (c.parallel.sequence_parallel) {
    v.all_gather = (2 * a + 2 * mlp) * nh + nh + nh + moe * ne;
    v.reduce_scatter = (2 * a + 2 * mlp) * nh + nh + nh;
  } else {
    v.all_reduce = (2 * a + 2 * mlp) * nh + nh + nh;
    v.all_gather = moe * (2 * nh + ne);
  }
  v.all_reduce += (3 * n + 1) * 4;
  const int64_t micro = c.train.grad_accum;
  v.all_reduce *= micro;
  v.all_gather *= micro;
  v.reduce_scatter *= micro;
  return v;
}

int Main(int argc, char** argv) {
  Harness h("tp_comm_perf",
            "tensor-parallel training (tp = ranks) at a fixed global batch: step time, "
            "tokens/s, and the tp communicator's bytes beside the analytic volume",
            {});
  std::string config_path = "configs/switch-tiny.yaml", data_dir, sets;
  int steps = 6, grad_accum = 2;
  bool no_sp = false;
  h.flags().AddString("config", &config_path, "the model config (switch-tiny)");
  h.flags().AddString("data", &data_dir, "prepared data (switchyard prep); default: a synthetic corpus");
  h.flags().AddInt("steps", &steps, "timed training steps after one warm-up step");
  h.flags().AddInt("grad_accum", &grad_accum, "micro-batches per step (the global batch is fixed: dp = 1)");
  h.flags().AddBool("no_sp", &no_sp, "turn sequence parallelism off");
  h.flags().AddString("set", &sets, "comma-separated config overrides (section.key=value,...)");
  if (auto code = h.Start(argc, argv)) return *code;
  const int tp = h.ranks();

  // Data: the given directory, or a synthetic corpus prepared by rank 0 in a temp dir.
  std::string tmp;
  if (data_dir.empty()) {
    auto made = MakeSyntheticData(h.world(), "sy_tp_comm", 2000);
    if (!made.ok()) return h.Fail(Message(made.status()));
    tmp = *made;
    data_dir = (fs::path(tmp) / "data").string();
  }
  std::vector<std::string> overrides = {
      "data.dir=" + data_dir, "parallel.tp=" + std::to_string(tp), "parallel.ep=1",
      "train.grad_accum=" + std::to_string(grad_accum), "train.eval_every=0",
      "train.max_steps=" + std::to_string(steps + 1), "train.warmup_steps=0",
      std::string("parallel.sequence_parallel=") + (no_sp ? "false" : "true")};
  for (size_t at = 0; !sets.empty() && at != std::string::npos;) {
    const size_t comma = sets.find(',', at);
    overrides.push_back(sets.substr(at, comma == std::string::npos ? comma : comma - at));
    at = comma == std::string::npos ? comma : comma + 1;
  }
  auto config = config::LoadConfig(config_path, overrides);
  if (!config.ok()) return h.Fail(Message(config.status()));

  // A counting copy of the world: every group the trainer splits from it counts.
  std::vector<int> all(tp);
  for (int r = 0; r < tp; ++r) all[r] = r;
  dist::CountingCommunicator world(h.world().Split({all}));
  const std::string out = (fs::temp_directory_path() / ("sy_tp_comm_run_" + std::to_string(::getpid()))).string();
  auto created = train::Trainer::Create(*config, out, world);
  if (!created.ok()) return h.Fail(Message(created.status()));
  std::unique_ptr<train::Trainer> trainer = std::move(*created);
  // The trainer's progress lines would interleave with the table.
  if (Status ran = RunQuietly(*trainer, 1); !ran.ok()) return h.Fail(Message(ran));  // warm-up
  auto* tp_comm = dynamic_cast<dist::CountingCommunicator*>(&trainer->parallel_context().tp());
  auto* grad_comm =
      dynamic_cast<dist::CountingCommunicator*>(&trainer->parallel_context().dp_cp_tp());
  std::vector<double> step_s;
  dist::TrafficCounters traffic, grads;
  for (int64_t s = 0; s < steps; ++s) {
    if (tp_comm) tp_comm->ResetTraffic();
    if (grad_comm) grad_comm->ResetTraffic();
    const double t0 = Now();
    Status ran = RunQuietly(*trainer, 1);
    const double t1 = Now();
    if (!ran.ok()) return h.Fail(Message(ran));
    step_s.push_back(t1 - t0);
    if (tp_comm) traffic = tp_comm->traffic();
    if (grad_comm) grads = grad_comm->traffic();
  }
  std::vector<double> sorted = step_s;
  std::sort(sorted.begin(), sorted.end());
  const double median = h.MedianOfMax(step_s);
  const double lo = h.Max(sorted.front()), hi = h.Max(sorted.back());
  const int64_t tokens = config->train.micro_batch_size * grad_accum * config->model.seq_len;

  const Volume want = Analytic(*config, tp);
  int64_t wrong = 0;
  Table table({{{"op", "", 16, 0}, {"calls", "/step", 8, 0}},
               {{"measured", "(B/step)", 14, 0}, {"analytic", "(B/step)", 14, 0},
                {"ring_sent", "(B/step)", 14, 0}}},
              h.printing());
  table.PrintHeader();
  auto row = [&](const char* op, int64_t calls, int64_t measured, int64_t analytic, double ring) {
    if (measured != analytic) ++wrong;
    table.AddRow({std::string(op), calls, measured, analytic, ring});
  };
  const double f = tp > 1 ? static_cast<double>(tp - 1) / tp : 0.0;
  row("all_reduce", traffic.all_reduce_calls, traffic.all_reduce_bytes, want.all_reduce,
      2 * f * traffic.all_reduce_bytes);
  row("all_gather", traffic.all_gather_calls, traffic.all_gather_bytes, want.all_gather,
      f * traffic.all_gather_bytes);
  row("reduce_scatter", traffic.reduce_scatter_calls, traffic.reduce_scatter_bytes,
      want.reduce_scatter, f * traffic.reduce_scatter_bytes);
  if (h.printing()) {
    std::printf("# tp %d, sequence parallel %s, global batch %lld tokens (%lld micro-batches)\n", tp,
                config->parallel.sequence_parallel && tp > 1 ? "on" : "off",
                static_cast<long long>(tokens), static_cast<long long>(grad_accum));
    std::printf("# step time: median %.4f s (min %.4f, max %.4f over %lld steps), %.0f tokens/s\n",
                median, lo, hi, static_cast<long long>(steps), tokens / median);
    std::printf("# gradient sync over dp x cp x tp (replicated weights): %.0f B/step sent (ring)\n",
                grads.RingBytes(tp));
  }
  nlohmann::json extra = {{"tp", tp},
                          {"sequence_parallel", config->parallel.sequence_parallel && tp > 1},
                          {"step_s_median", median},
                          {"step_s_min", lo},
                          {"step_s_max", hi},
                          {"tokens_per_s", tokens / median},
                          {"grad_sync_ring_bytes", grads.RingBytes(tp)}};
  world.Barrier();
  if (h.rank() == 0) {
    std::error_code ec;
    fs::remove_all(out, ec);
    if (!tmp.empty()) fs::remove_all(tmp, ec);
  }
  return h.Finish(table, wrong, extra);
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
