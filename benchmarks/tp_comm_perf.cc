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

#include <memory>
#include <string>
#include <vector>

#include "benchmarks/benchmark.h"
#include "benchmarks/train_bench.h"
#include "engine/dist/counting_communicator.h"
#include "engine/config/config.h"
#include "engine/train/trainer.h"

namespace switchyard::bench {
namespace {

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
  for (int64_t i = 0; i < m.n_layers; ++i) (c.moe.IsMoELayer(i) ? moe : mlp) += 1;
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

class TpCommPerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    train_.AddFlags(flags, "micro-batches per step (the global batch is fixed: dp = 1)");
    flags.AddBool("no_sp", &no_sp_, "turn sequence parallelism off");
    train_.AddSetFlag(flags);
  }

  // The data (a synthetic corpus prepared by rank 0 unless --data) and the config.
  Status Setup(Harness& h) override {
    tp_ = h.ranks();
    SY_RETURN_IF_ERROR(train_.Prepare(h, "sy_tp_comm"));
    SY_ASSIGN_OR_RETURN(config_, train_.LoadConfig({"parallel.tp=" + std::to_string(tp_),
                                                    "parallel.ep=1",
                                                    std::string("parallel.sequence_parallel=") +
                                                        (no_sp_ ? "false" : "true")}));
    return OkStatus();
  }

  Table MakeTable(Harness& h) override {
    return Table({{{"op", "", 16, 0}, {"calls", "/step", 8, 0}},
                  {{"measured", "(B/step)", 14, 0}, {"analytic", "(B/step)", 14, 0},
                   {"ring_sent", "(B/step)", 14, 0}}},
                 h.printing());
  }

  // The training run, then one row per collective: measured beside analytic.
  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    const std::string out = "sy_tp_comm_run_" + std::to_string(::getpid());
    SY_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> trainer, train_.StartTrainer(config_, out));
    auto* tp_comm = dynamic_cast<dist::CountingCommunicator*>(&trainer->parallel_context().tp());
    auto* grad_comm =
        dynamic_cast<dist::CountingCommunicator*>(&trainer->parallel_context().dp_cp_tp());
    dist::TrafficCounters traffic;
    SY_ASSIGN_OR_RETURN(const std::vector<double> step_s,
                        train_.RunSteps(
                            *trainer,
                            [&] {
                              if (tp_comm) tp_comm->ResetTraffic();
                              if (grad_comm) grad_comm->ResetTraffic();
                            },
                            [&] {
                              if (tp_comm) traffic = tp_comm->traffic();
                              if (grad_comm) grads_ = grad_comm->traffic();
                            }));
    steps_ = SummarizeSteps(h, step_s);
    const Volume want = Analytic(config_, tp_);
    int64_t wrong = 0;
    auto row = [&](const char* op, int64_t calls, int64_t measured, int64_t analytic, double ring) {
      if (measured != analytic) ++wrong;
      table.AddRow({std::string(op), calls, measured, analytic, ring});
    };
    const double f = tp_ > 1 ? static_cast<double>(tp_ - 1) / tp_ : 0.0;
    row("all_reduce", traffic.all_reduce_calls, traffic.all_reduce_bytes, want.all_reduce,
        2 * f * traffic.all_reduce_bytes);
    row("all_gather", traffic.all_gather_calls, traffic.all_gather_bytes, want.all_gather,
        f * traffic.all_gather_bytes);
    row("reduce_scatter", traffic.reduce_scatter_calls, traffic.reduce_scatter_bytes,
        want.reduce_scatter, f * traffic.reduce_scatter_bytes);
    train_.EndTrainer(std::move(trainer), out);
    return wrong;
  }

  void Conclude(Harness& h, Table& table) override {
    h.Printf("# tp %d, sequence parallel %s, global batch %lld tokens (%lld micro-batches)\n",
             tp_, sequence_parallel() ? "on" : "off", static_cast<long long>(Tokens()),
             static_cast<long long>(train_.grad_accum()));
    h.Printf("# step time: median %.4f s (min %.4f, max %.4f over %lld steps), %.0f tokens/s\n",
             steps_.median, steps_.min, steps_.max, static_cast<long long>(train_.steps()),
             Tokens() / steps_.median);
    h.Printf("# gradient sync over dp x cp x tp (replicated weights): %.0f B/step sent (ring)\n",
             grads_.RingBytes(tp_));
    train_.Cleanup(h);
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"tp", tp_},
            {"sequence_parallel", sequence_parallel()},
            {"step_s_median", steps_.median},
            {"step_s_min", steps_.min},
            {"step_s_max", steps_.max},
            {"tokens_per_s", Tokens() / steps_.median},
            {"grad_sync_ring_bytes", grads_.RingBytes(tp_)}};
  }

 private:
  // Tokens per step: the global batch.
  int64_t Tokens() const {
    return config_.train.micro_batch_size * train_.grad_accum() * config_.model.seq_len;
  }
  bool sequence_parallel() const { return config_.parallel.sequence_parallel && tp_ > 1; }

  TrainBench train_{6, 2};
  bool no_sp_ = false;
  int tp_ = 1;
  config::Config config_;
  StepSeconds steps_;
  dist::TrafficCounters grads_;
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::TpCommPerf>(
      argc, argv, "tp_comm_perf",
      "tensor-parallel training (tp = ranks) at a fixed global batch: step time, "
      "tokens/s, and the tp communicator's bytes beside the analytic volume");
}
