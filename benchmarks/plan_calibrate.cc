// plan_calibrate: this machine's parameters for `switchyard plan` (docs/plan.md, "On this
// machine"), written as a hardware file (engine/plan/hardware.h):
//
//   gemm      sgemm (kernels::cpu::Sgemm, what the layers call) on an m x n x k grid, every
//             rank at once; seconds t = (F + F_half) / P fitted by least squares on the
//             relative error (F = 2 m n k), so peak_flops.fp32 = P (the asymptotic rate,
//             gemm.efficiency 1) and gemm.half_flops = F_half
//   memory    memory_bandwidth = 2 x bytes / time of one large copy per rank (read + write)
//   links     MPI all-reduce on loopback, sizes 8 B .. --max-message: t = 2 (p - 1) alpha +
//             2 (p - 1) / p x bytes / beta fitted the same way (intra_node = inter_node: one
//             machine, gpus_per_node = 1024); with one rank nothing is measured and the
//             memory bandwidth and 1 us stand in
//   attention attention_efficiency = 4 S^2 H hd (the cost model's count: scores and values,
//             causal masking not subtracted) / (time of kernels::AttentionForward on one
//             sequence of --attention-shape S,H,hd x P)
//
//   cores     cores_per_node = the machine's online cores (mpirun may bind a rank to one); the
//             figures above are divided by the threads each rank ran, so they are one core's
//
// #wrong counts sampled sgemm entries and all-reduce sums that differ from the exact value
// (small integers: exact in fp32). Timings need a quiet machine; the bench label runs it at
// tiny sizes to check that it works, never its figures.
#include <sys/sysinfo.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "benchmarks/harness.h"
#include "benchmarks/train_bench.h"
#include "engine/plan/cost_model.h"
#include "engine/plan/hardware.h"
#include "engine/core/thread_pool.h"
#include "kernels/attention.h"
#include "kernels/gemm.h"

namespace switchyard::bench {
namespace {

// Least squares of t = a x + c on relative error: minimises sum ((a x_i + c - t_i) / t_i)^2.
std::pair<double, double> FitLine(const std::vector<double>& x, const std::vector<double>& t) {
  double sxx = 0, sx = 0, s1 = 0, sxt = 0, st = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (t[i] * t[i]);
    sxx += w * x[i] * x[i], sx += w * x[i], s1 += w, sxt += w * x[i] * t[i], st += w * t[i];
  }
  const double det = sxx * s1 - sx * sx;
  double a = (sxt * s1 - sx * st) / det, c = (sxx * st - sx * sxt) / det;
  if (!(c > 0)) c = 1e-9, a = sxt / sxx;  // no measurable fixed cost
  return {a, c};
}

std::vector<int64_t> ParseList(const std::string& text) {
  std::vector<int64_t> out;
  std::stringstream in(text);
  for (std::string item; std::getline(in, item, ',');) {
    StatusOr<int64_t> n = ParseBytes(item);
    out.push_back(n.ok() ? *n : -1);
  }
  return out;
}

struct Fit {
  double peak = 0, half = 0;  // GEMM
  double bandwidth = 0;       // memory
  double alpha = 1e-6, beta = 0;  // links
  int64_t wrong = 0;
};

void MeasureGemms(Harness& h, const std::vector<int64_t>& sizes, Fit& fit) {
  Table table({{{"m", "", 6, 0}, {"n=k", "", 6, 0}}, {{"time", "(us)", 12, 1}, {"GFLOP/s", "per rank", 9, 2}}},
              h.printing());
  table.PrintHeader();
  std::vector<double> flops, secs;
  for (int64_t m : sizes) {
    for (int64_t n : sizes) {
      std::vector<float> a(m * n), b(n * n), c(m * n);
      for (int64_t i = 0; i < m * n; ++i) a[i] = float(i * 7 % 9) - 4.0f;
      for (int64_t i = 0; i < n * n; ++i) b[i] = float(i * 5 % 7) - 3.0f;
      auto call = [&] { kernels::cpu::Sgemm(false, false, m, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n); };
      const double t = h.Time(call);
      call();
      double want = 0;  // c[0][n-1]
      for (int64_t l = 0; l < n; ++l) want += double(a[l]) * b[l * n + n - 1];
      fit.wrong += h.Check([&] { return int64_t{c[n - 1] != float(want)}; });
      flops.push_back(2.0 * m * n * n), secs.push_back(t);
      table.AddRow({m, n, t * 1e6, flops.back() / t / 1e9});
    }
  }
  const auto [a, c] = FitLine(flops, secs);
  fit.peak = 1.0 / a, fit.half = c / a;
}

void MeasureMemory(Harness& h, int64_t bytes, Fit& fit) {
  std::vector<char> from(bytes, 1), to(bytes);
  const double t = h.Time([&] { std::memcpy(to.data(), from.data(), bytes); });
  fit.bandwidth = 2.0 * bytes / t;
  h.Printf("# copy of %lld bytes: %.3f ms, %.2f GB/s per rank\n", static_cast<long long>(bytes), t * 1e3,
           fit.bandwidth / 1e9);
}

void MeasureLinks(Harness& h, int64_t max_bytes, Fit& fit) {
  const int p = h.ranks();
  if (p == 1) {
    fit.beta = fit.bandwidth;
    h.Printf("# one rank: no link to measure (memory bandwidth and 1 us stand in)\n");
    return;
  }
  std::vector<double> bytes, secs;
  for (int64_t n = 8; n <= max_bytes; n *= 8) {
    Tensor t = Tensor::Empty({n / 4}, DType::kF32);
    auto fill = [&] { for (int64_t i = 0; i < n / 4; ++i) t.data<float>()[i] = float(h.rank() + 1); };
    fill();
    const double s = h.Time([&] { h.world().AllReduce(t, dist::ReduceOp::kSum); });
    fill();
    h.world().AllReduce(t, dist::ReduceOp::kSum);
    fit.wrong += h.Check([&] { return int64_t{t.data<float>()[0] != float(p * (p + 1) / 2)}; });
    bytes.push_back(double(n)), secs.push_back(s);
    h.Printf("# all-reduce %10lld B: %10.1f us\n", static_cast<long long>(n), s * 1e6);
  }
  const auto [a, c] = FitLine(bytes, secs);
  fit.alpha = c / (2.0 * (p - 1));
  fit.beta = 2.0 * (p - 1) / p / a;
}

// The fixed cost of an operation: --config trained at a size where the work vanishes
// (d_model 8, sequences of 8 tokens, 2 a micro-batch); the median step beyond what the cost
// model predicts for it without op_latency, over the operations it counts (the prediction
// is linear in op_latency, so two predictions give the count).
StatusOr<double> MeasureOpLatency(Harness& h, TrainBench& bench, const std::string& yaml) {
  SY_RETURN_IF_ERROR(bench.Prepare(h, "plan_calibrate"));
  SY_ASSIGN_OR_RETURN(config::Config config,
                      bench.LoadConfig({"model.d_model=8", "model.n_heads=2", "model.d_ff=16",
                                        "moe.d_expert=8", "model.seq_len=8", "train.micro_batch_size=2",
                                        "logging.routing_every=0"}));
  SY_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> trainer, bench.StartTrainer(config, "overhead"));
  SY_ASSIGN_OR_RETURN(std::vector<double> step_s, bench.RunSteps(*trainer, [] {}, [] {}));
  bench.EndTrainer(std::move(trainer), "overhead");
  bench.Cleanup(h);
  const double measured = SummarizeSteps(h, step_s).median;
  SY_ASSIGN_OR_RETURN(plan::Hardware hw, plan::ParseHardware(yaml, "plan_calibrate"));
  plan::PlanInputs in;
  in.config = config;
  in.world = h.ranks();
  in.precision = "fp32";
  in.global_batch = config.train.micro_batch_size * config.train.grad_accum * h.ranks();
  const plan::Layout layout = plan::LayoutOf(config);
  plan::CostCache cache;
  hw.op_latency = 0;
  const double without = plan::PredictStepTime(in, layout, hw, cache).total();
  hw.op_latency = 1;
  const double ops = plan::PredictStepTime(in, layout, hw, cache).total() - without;
  const double latency = std::max(0.0, (measured - without) / ops);
  h.Printf("# overhead: a step of %s at d_model 8: %.1f us measured, %.1f us of work predicted, "
           "%.0f operations: %.2f us each\n", bench.config_path().c_str(), measured * 1e6, without * 1e6,
           ops, latency * 1e6);
  return latency;
}

// The engine's causal attention forward on one sequence: its share of the fitted peak.
double MeasureAttention(Harness& h, const std::vector<int64_t>& shape, double peak) {
  const int64_t S = shape[0], H = shape[1], hd = shape[2];
  Tensor q = Tensor::Empty({1, S, H, hd}, DType::kF32), k = q.Clone(), v = q.Clone();
  for (Tensor* t : {&q, &k, &v}) {
    for (int64_t i = 0; i < t->numel(); ++i) t->data<float>()[i] = float(i % 13) / 13.0f - 0.5f;
  }
  Tensor out = Tensor::Empty({1, S, H, hd}, DType::kF32), lse = Tensor::Empty({1, H, S}, DType::kF32);
  const double t = h.Time([&] { kernels::AttentionForward(q, k, v, out, lse); });
  const double eff = 4.0 * S * S * H * hd / t / peak;
  h.Printf("# attention S %lld H %lld hd %lld: %.1f us, %.3f of the fitted peak\n",
           static_cast<long long>(S), static_cast<long long>(H), static_cast<long long>(hd), t * 1e6, eff);
  return std::min(1.0, eff);
}

std::string Yaml(const Fit& f, double attention, double memory, int cores, double op_latency) {
  std::ostringstream out;
  out.precision(4);
  out << "# This machine, measured by plan_calibrate (docs/plan.md); rerun on a quiet machine.\n"
      << "name: cpu-calibrated\nsource: \"plan_calibrate on this machine\"\n"
      << "peak_flops: {bf16: " << f.peak << ", fp32: " << f.peak << "}\n"
      << "memory_bytes: " << memory << "\nmemory_bandwidth: " << f.bandwidth << "\n"
      << "gpus_per_node: 1024\n"
      << "intra_node: {bandwidth: " << f.beta << ", latency: " << f.alpha << "}\n"
      << "inter_node: {bandwidth: " << f.beta << ", latency: " << f.alpha << "}\n"
      << "gemm: {efficiency: 1, half_flops: " << f.half << "}\n"
      << "attention_efficiency: " << attention << "\n"
      << "cores_per_node: " << cores << "   # the ranks share them: peak and bandwidth are one core's\n";
  if (op_latency > 0) out << "op_latency: " << op_latency << "\n";
  return out.str();
}

int Main(int argc, char** argv) {
  Harness h("plan_calibrate", "this machine's GEMM, memory and MPI parameters as a hardware file "
            "for `switchyard plan`.", {});
  std::string out, sizes_text = "32,64,128,256,512", attention_text = "128,4,16";
  int64_t copy_bytes = 256 << 20, max_message = 8 << 20;
  std::string copy_text = "256M", message_text = "8M";
  h.flags().AddString("out", &out, "hardware YAML to write (rank 0)");
  h.flags().AddString("gemm-sizes", &sizes_text, "m and n = k of the sgemm grid (default 32,64,128,256,512)");
  h.flags().AddString("copy-bytes", &copy_text, "bytes of the copy (default 256M)");
  h.flags().AddString("max-message", &message_text, "largest all-reduce (default 8M)");
  h.flags().AddString("attention-shape", &attention_text, "S,heads,head_dim of the attention measurement (default 128,4,16)");
  TrainBench bench(/*steps=*/20, /*grad_accum=*/1);
  bench.AddFlags(h.flags(), "micro-batches a step of the overhead run (--config at d_model 8)");
  if (auto code = h.Start(argc, argv)) return *code;
  const std::vector<int64_t> sizes = ParseList(sizes_text), shape = ParseList(attention_text);
  for (int64_t n : sizes) {
    if (n < 1 || n > 8192) return h.Fail("--gemm-sizes: expected values in [1, 8192], got \"" + sizes_text + "\"");
  }
  if (sizes.size() < 2) return h.Fail("--gemm-sizes: give at least two sizes to fit a line");
  if (shape.size() != 3 || shape[0] < 1 || shape[1] < 1 || shape[2] < 1) {
    return h.Fail("--attention-shape: expected S,heads,head_dim, got \"" + attention_text + "\"");
  }
  StatusOr<int64_t> cb = ParseBytes(copy_text), mm = ParseBytes(message_text);
  if (!cb.ok() || *cb < 1024) return h.Fail("--copy-bytes: expected at least 1K, got \"" + copy_text + "\"");
  if (!mm.ok() || *mm < 8) return h.Fail("--max-message: expected at least 8, got \"" + message_text + "\"");
  copy_bytes = *cb, max_message = *mm;

  Fit fit;
  MeasureGemms(h, sizes, fit);
  MeasureMemory(h, copy_bytes, fit);
  MeasureLinks(h, max_message, fit);
  const double attention = MeasureAttention(h, shape, fit.peak);
  struct sysinfo info {};
  sysinfo(&info);
  const double memory = double(info.totalram) * info.mem_unit / h.ranks();
  // One core's figures: the ranks ran ComputeThreads() threads each.
  fit.peak /= ComputeThreads(), fit.bandwidth /= ComputeThreads();
  const int cores = std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  StatusOr<double> op_latency = MeasureOpLatency(h, bench, Yaml(fit, attention, memory, cores, 0));
  if (!op_latency.ok()) return h.Fail("the overhead run: " + op_latency.status().ToString());
  const std::string yaml = Yaml(fit, attention, memory, cores, *op_latency);
  h.Printf("%s", yaml.c_str());
  if (h.printing() && !out.empty()) {
    std::ofstream file(out);
    file << yaml;
    if (!file) return h.Fail("--out " + out + ": cannot write");
  }
  Table none({{}, {}}, false);
  return h.Finish(none, fit.wrong, {{"peak_flops", fit.peak}, {"half_flops", fit.half},
                                     {"memory_bandwidth", fit.bandwidth}, {"alpha", fit.alpha},
                                     {"beta", fit.beta}});
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
