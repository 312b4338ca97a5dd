// plan_calibrate_gpu: this GPU's parameters for `switchyard plan` (docs/plan.md, "On this
// machine"; plan_calibrate is the CPU's), measured with the device kernels training runs,
// written as a hardware file (engine/plan/hardware.h) that `switchyard plan --gpus 1 --gpu
// FILE` reads:
//
//   gemm       kernels::Gemm (cuBLAS) on device f32 tensors with matmul_dtype bf16 (the
//              operands rounded to bf16, f32 accumulation: what training runs) on an
//              m x n x k grid, timed with CUDA events; t = (F + F_half) / P fitted by least
//              squares on the relative error (F = 2 m n k): peak_flops.bf16 = P, gemm.efficiency
//              1, gemm.half_flops = F_half. The same with matmul_dtype f32 gives peak_flops.fp32.
//   memory     memory_bandwidth = 2 x bytes / time of one device-to-device copy (read + write)
//   attention  attention_efficiency = 3 x 4 B S^2 H hd (the cost model's count of the forward
//              and the backward it prices at twice the forward) / (time of
//              kernels::AttentionForward, AttentionBackwardDelta and AttentionBackward on
//              --attention-shape x the bf16 peak); q, k and v in bf16, as the fused path gets
//              them under bf16 activation storage (f32 where the head width has no fused path)
//   elementwise  elementwise_efficiency: the memory-bound kernels of a layer as training runs
//              them (benchmarks/calibration_ops.h) at --grouped-shape's rows, d and f: the elements
//              the cost model counts for them, 2 bytes each, over their time and the copy's
//              bandwidth (capped at 1)
//   grouped    grouped_gemm_efficiency: the experts' three products (forward, input
//              gradient, weight gradient) on this engine's device-sized kernels
//              (kernels::GroupedGemm / GroupedGemmWeightGrad with offsets on the device, bf16
//              operands as training stores them) at --grouped-shape rows,d,f,experts, rows
//              split evenly: their FLOPs over their time and the bf16 peak, divided by the
//              F / (F + F_half) the cost model applies to one expert's product (capped at 1)
//   overhead   op_latency: a step of --config at d_model 8 on the GPU (the work vanishes): the
//              median step beyond the cost model's prediction for it, over the operations it
//              counts (as plan_calibrate); graph_op_latency: the same with
//              runtime.cuda_graphs=true (the micro-batches replayed as one CUDA graph)
//   links      one GPU: nothing to measure; the copy's bandwidth and 5 us stand in (a plan for
//              several GPUs should use a datasheet file such as h200 for the links)
//
// #wrong counts sampled GEMM entries that differ from the exact value (small integers in
// bf16: exact). Needs a CUDA device; without one it says so and exits 1.
#include <algorithm>
#include <functional>
#include <cmath>
#include <fstream>
#include <sstream>

#include <cuda_runtime.h>

#include "benchmarks/gpu_timing.h"
#include "benchmarks/harness.h"
#include "benchmarks/calibration_ops.h"
#include "benchmarks/train_bench.h"
#include "engine/core/device.h"
#include "engine/core/device_context.h"
#include "engine/plan/cost_model.h"
#include "engine/plan/hardware.h"
#include "kernels/gemm.h"
#include "kernels/random.h"

namespace switchyard::bench {
namespace {

// Least squares of t = a x + c on relative error (as plan_calibrate).
std::pair<double, double> FitLine(const std::vector<double>& x, const std::vector<double>& t) {
  double sxx = 0, sx = 0, s1 = 0, sxt = 0, st = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double w = 1.0 / (t[i] * t[i]);
    sxx += w * x[i] * x[i], sx += w * x[i], s1 += w, sxt += w * x[i] * t[i], st += w * t[i];
  }
  const double det = sxx * s1 - sx * sx;
  double a = (sxt * s1 - sx * st) / det, c = (sxx * st - sx * sxt) / det;
  if (!(c > 0)) c = 1e-9, a = sxt / sxx;
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

// A device tensor of small integers (exact in bf16), pattern (i * mul % mod) - mod / 2.
Tensor Pattern(const Shape& shape, int mul, int mod, DeviceContext* ctx) {
  Tensor host = Tensor::Empty(shape, DType::kF32);
  for (int64_t i = 0; i < host.numel(); ++i) host.data<float>()[i] = float(i * mul % mod - mod / 2);
  return host.To(ctx->device(), ctx);
}

struct GemmFit {
  double peak = 0, half = 0;
};

GemmFit MeasureGemms(Harness& h, const std::vector<int64_t>& sizes, DType dtype, DeviceContext* ctx,
                     int64_t& wrong) {
  ctx->set_matmul_dtype(dtype);
  const char* name = dtype == DType::kBF16 ? "bf16" : "f32";
  std::vector<double> flops, secs;
  for (int64_t m : sizes) {
    for (int64_t n : sizes) {
      Tensor a = Pattern({m, n}, 7, 9, ctx), b = Pattern({n, n}, 5, 7, ctx);
      Tensor c = Tensor::Empty({m, n}, DType::kF32, ctx->device());
      auto call = [&] { kernels::Gemm(a, false, b, false, c, 1.0f, 0.0f, ctx); };
      const double t = TimeGpuOps({call}, h.options().iters, h.options().warmup, ctx)[0] / 1e3;
      if (h.options().check) {
        call();
        const std::vector<float> av = a.To(Device::Cpu(), ctx).ToVector<float>();
        const std::vector<float> bv = b.To(Device::Cpu(), ctx).ToVector<float>();
        const float got = c.To(Device::Cpu(), ctx).ToVector<float>()[n - 1];
        double want = 0;  // c[0][n-1]
        for (int64_t l = 0; l < n; ++l) want += double(av[l]) * bv[l * n + n - 1];
        wrong += got != float(want);
      }
      flops.push_back(2.0 * m * n * n), secs.push_back(t);
      h.Printf("# gemm %s m %5lld n=k %5lld: %10.1f us %9.1f TFLOP/s\n", name, static_cast<long long>(m),
               static_cast<long long>(n), t * 1e6, flops.back() / t / 1e12);
    }
  }
  const auto [slope, c] = FitLine(flops, secs);
  ctx->set_matmul_dtype(DType::kF32);
  return {1.0 / slope, c / slope};
}

double MeasureCopy(Harness& h, int64_t bytes, DeviceContext* ctx) {
  Tensor from = Tensor::Empty({bytes}, DType::kU8, ctx->device()), to = from.Clone(ctx);
  auto call = [&] {
    SY_CHECK(cudaMemcpyAsync(to.raw_data(), from.raw_data(), bytes, cudaMemcpyDeviceToDevice,
                             static_cast<cudaStream_t>(ctx->stream())) == cudaSuccess);
  };
  const double t = TimeGpuOps({call}, h.options().iters, h.options().warmup, ctx)[0] / 1e3;
  h.Printf("# device copy of %lld bytes: %.3f ms, %.0f GB/s (read + write)\n", static_cast<long long>(bytes),
           t * 1e3, 2.0 * bytes / t / 1e9);
  return 2.0 * bytes / t;
}

double MeasureAttention(Harness& h, const std::vector<int64_t>& shape, double peak, DeviceContext* ctx) {
  const int64_t B = shape[0], S = shape[1], H = shape[2], hd = shape[3];
  ctx->set_matmul_dtype(DType::kBF16);
  const AttentionOps ops = MakeAttentionOps(B, S, H, hd, ctx);
  const std::vector<double> ms = TimeGpuOps({ops.forward.run, ops.backward.run},
                                            h.options().iters, h.options().warmup, ctx);
  ctx->set_matmul_dtype(DType::kF32);
  const double forward = ms[0] / 1e3, backward = ms[1] / 1e3;
  const double eff = 3 * 4.0 * B * S * S * H * hd / (forward + backward) / peak;
  h.Printf(
      "# attention B %lld S %lld H %lld hd %lld (%s q, k, v): forward %.1f us, backward %.1f us "
      "(%.2fx), %.3f of the bf16 peak by the cost model's count\n",
      static_cast<long long>(B), static_cast<long long>(S), static_cast<long long>(H),
      static_cast<long long>(hd), ops.bf16_inputs ? "bf16" : "f32", forward * 1e6, backward * 1e6,
      backward / forward, eff);
  return std::min(1.0, eff);
}

// The memory-bound kernels of a layer at rows x d (f) as training runs them: the elements
// the cost model counts, 2 bytes each, over their time and `bandwidth` (the copy's).
double MeasureElementwise(Harness& h, const std::vector<int64_t>& shape, double bandwidth,
                          DeviceContext* ctx) {
  ctx->set_matmul_dtype(DType::kBF16);  // bf16 storage: the bf16 outputs training writes
  const std::vector<MemoryOp> ops = MemoryBoundOps(shape[0], shape[1], shape[2], ctx);
  std::vector<std::function<void()>> calls;
  for (const MemoryOp& op : ops) calls.push_back(op.run);
  const std::vector<double> ms = TimeGpuOps(calls, h.options().iters, h.options().warmup, ctx);
  ctx->set_matmul_dtype(DType::kF32);
  double elements = 0, seconds = 0;
  for (size_t i = 0; i < ops.size(); ++i) {
    const double t = ms[i] / 1e3;
    h.Printf("# %-32s %8.1f us, %.3f of the copy's bandwidth by the cost model's count\n",
             ops[i].name.c_str(), t * 1e6, 2 * ops[i].elements / t / bandwidth);
    elements += ops[i].elements, seconds += t;
  }
  const double eff = std::min(1.0, 2 * elements / seconds / bandwidth);
  h.Printf("# memory-bound kernels (%lld rows, d %lld, f %lld): elementwise_efficiency %.3f\n",
           static_cast<long long>(shape[0]), static_cast<long long>(shape[1]),
           static_cast<long long>(shape[2]), eff);
  return eff;
}

// The device-sized grouped products of one MoE layer's experts (forward, input gradient,
// weight gradient) at rows x d -> f over `experts` even groups; returns
// grouped_gemm_efficiency for a file whose gemm.half_flops is `half`.
double MeasureGroupedGemm(Harness& h, const std::vector<int64_t>& shape, const GemmFit& bf16,
                          DeviceContext* ctx) {
  const int64_t rows = shape[0], d = shape[1], f = shape[2], experts = shape[3];
  const Device gpu = ctx->device();
  Tensor x = Tensor::Empty({rows, d}, DType::kBF16, gpu), dy = Tensor::Empty({rows, f}, DType::kBF16, gpu);
  Tensor w = Tensor::Empty({experts, d, f}, DType::kBF16, gpu);
  kernels::FillUniform(x, RngKey{7, 1}, 0, -1.0f, 1.0f, ctx);
  kernels::FillUniform(dy, RngKey{7, 2}, 0, -1.0f, 1.0f, ctx);
  kernels::FillUniform(w, RngKey{7, 3}, 0, -1.0f, 1.0f, ctx);
  Tensor out = Tensor::Empty({rows, f}, DType::kF32, gpu), dx = Tensor::Empty({rows, d}, DType::kF32, gpu);
  Tensor dw = Tensor::Empty({experts, d, f}, DType::kF32, gpu);
  std::vector<int64_t> offsets(1, 0);
  for (int64_t e = 0; e < experts; ++e) offsets.push_back(rows * (e + 1) / experts);
  const Tensor dev_offsets = Tensor::FromVector(offsets, {experts + 1}).To(gpu, ctx);
  ctx->set_matmul_dtype(DType::kBF16);
  const std::vector<double> ms = TimeGpuOps(
      {[&] { kernels::GroupedGemm(x, dev_offsets, w, false, out, 1.0f, 0.0f, ctx); },
       [&] { kernels::GroupedGemm(dy, dev_offsets, w, true, dx, 1.0f, 0.0f, ctx); },
       [&] { kernels::GroupedGemmWeightGrad(x, dy, dev_offsets, dw, 1.0f, 0.0f, ctx); }},
      h.options().iters, h.options().warmup, ctx);
  ctx->set_matmul_dtype(DType::kF32);
  const double t = (ms[0] + ms[1] + ms[2]) / 1e3, flops = 3 * 2.0 * rows * d * f;
  const double share = flops / t / bf16.peak, expert_flops = flops / 3 / experts;
  const double eff = std::min(1.0, share * (expert_flops + bf16.half) / expert_flops);
  h.Printf("# grouped products %lld rows, d %lld, f %lld, %lld experts: %.1f us (%.1f TFLOP/s), "
           "%.3f of the bf16 peak: grouped_gemm_efficiency %.3f\n",
           static_cast<long long>(rows), static_cast<long long>(d), static_cast<long long>(f),
           static_cast<long long>(experts), t * 1e6, flops / t / 1e12, share, eff);
  return eff;
}

std::string Yaml(const GemmFit& bf16, const GemmFit& f32, double bandwidth, double attention,
                 double grouped, double elementwise, double memory, double op_latency,
                 double graph_op_latency, const std::string& gpu) {
  std::ostringstream out;
  out.precision(4);
  out << "# This GPU (" << gpu << "), measured by plan_calibrate_gpu (docs/plan.md).\n"
      << "name: gpu-calibrated\nsource: \"plan_calibrate_gpu on " << gpu << "\"\n"
      << "peak_flops: {bf16: " << bf16.peak << ", fp32: " << f32.peak << "}   # fp8 not measured\n"
      << "memory_bytes: " << memory << "\nmemory_bandwidth: " << bandwidth << "\n"
      << "gpus_per_node: 8\n"
      << "intra_node: {bandwidth: " << bandwidth << ", latency: 5e-6}   # not measured (one GPU)\n"
      << "inter_node: {bandwidth: " << bandwidth << ", latency: 5e-6}   # not measured (one GPU)\n"
      << "gemm: {efficiency: 1, half_flops: " << bf16.half << "}\n"
      << "attention_efficiency: " << attention << "\n"
      << "grouped_gemm_efficiency: " << grouped << "\n"
      << "elementwise_efficiency: " << elementwise << "\n";
  if (op_latency > 0) out << "op_latency: " << op_latency << "\n";
  if (graph_op_latency > 0) out << "graph_op_latency: " << graph_op_latency << "\n";
  return out.str();
}

// The fixed cost per operation, from a step of the config at a size where the work vanishes;
// graphs: with the micro-batches replayed as a CUDA graph (runtime.cuda_graphs).
StatusOr<double> MeasureOpLatency(Harness& h, TrainBench& bench, const std::string& yaml,
                                  bool graphs) {
  SY_RETURN_IF_ERROR(bench.Prepare(h, "plan_calibrate_gpu"));
  SY_ASSIGN_OR_RETURN(config::Config config,
                      bench.LoadConfig({"model.d_model=8", "model.n_heads=2", "model.d_ff=16",
                                        "moe.d_expert=8", "model.seq_len=8", "train.micro_batch_size=2",
                                        "logging.routing_every=0", "runtime.device=cuda",
                                        "runtime.precision=bf16",
                                        graphs ? "runtime.cuda_graphs=true" : "runtime.cuda_graphs=false"}));
  SY_ASSIGN_OR_RETURN(std::unique_ptr<train::Trainer> trainer, bench.StartTrainer(config, "overhead"));
  SY_ASSIGN_OR_RETURN(std::vector<double> step_s, bench.RunSteps(*trainer, [] {}, [] {}));
  bench.EndTrainer(std::move(trainer), "overhead");
  bench.Cleanup(h);
  const double measured = SummarizeSteps(h, step_s).median;
  SY_ASSIGN_OR_RETURN(plan::Hardware hw, plan::ParseHardware(yaml, "plan_calibrate_gpu"));
  plan::PlanInputs in;
  in.config = config;
  in.world = 1;
  in.precision = "bf16";
  in.global_batch = config.train.micro_batch_size * config.train.grad_accum;
  const plan::Layout layout = plan::LayoutOf(config);
  plan::CostCache cache;
  // Whichever of the two latencies the step pays (graph_op_latency when graphed).
  hw.op_latency = hw.graph_op_latency = 0;
  const double without = plan::PredictStepTime(in, layout, hw, cache).total();
  hw.op_latency = hw.graph_op_latency = 1;
  const double ops = plan::PredictStepTime(in, layout, hw, cache).total() - without;
  const double latency = std::max(0.0, (measured - without) / ops);
  h.Printf("# overhead%s: a step at d_model 8 on the GPU: %.1f us measured, %.1f us of work "
           "predicted, %.0f operations: %.2f us each\n", graphs ? " (CUDA graph)" : "",
           measured * 1e6, without * 1e6, ops, latency * 1e6);
  return latency;
}

// The flags' shapes, checked: an error names the flag and what it got.
struct Shapes {
  std::vector<int64_t> sizes, attention, grouped;
  int64_t copy_bytes = 0;
};
StatusOr<Shapes> ParseShapes(const std::string& sizes_text, const std::string& attention_text,
                             const std::string& grouped_text, const std::string& copy_text) {
  Shapes s{ParseList(sizes_text), ParseList(attention_text), ParseList(grouped_text)};
  for (int64_t n : s.sizes) {
    if (n < 1 || n > 32768) {
      return InvalidArgument("--gemm-sizes: expected values in [1, 32768], got \"", sizes_text,
                             "\"");
    }
  }
  if (s.sizes.size() < 2)
    return InvalidArgument("--gemm-sizes: give at least two sizes to fit a line");
  const std::vector<int64_t>& a = s.attention;
  if (a.size() != 4 || *std::min_element(a.begin(), a.end()) < 1) {
    return InvalidArgument("--attention-shape: expected B,S,heads,head_dim, got \"", attention_text,
                           "\"");
  }
  const std::vector<int64_t>& g = s.grouped;
  if (g.size() != 4 || *std::min_element(g.begin(), g.end()) < 1 || g[3] > g[0]) {
    return InvalidArgument("--grouped-shape: expected rows,d,f,experts (experts <= rows), got \"",
                           grouped_text, "\"");
  }
  StatusOr<int64_t> cb = ParseBytes(copy_text);
  if (!cb.ok() || *cb < 1024)
    return InvalidArgument("--copy-bytes: expected at least 1K, got \"", copy_text, "\"");
  s.copy_bytes = *cb;
  return s;
}

int Main(int argc, char** argv) {
  Harness h("plan_calibrate_gpu", "this GPU's GEMM, memory, attention and per-operation "
            "parameters as a hardware file for `switchyard plan`.", {});
  std::string out, sizes_text = "512,1024,2048,4096,8192", attention_text = "16,512,16,64",
                   copy_text = "1G", grouped_text = "32768,1024,4096,16";
  h.flags().AddString("out", &out, "hardware YAML to write");
  h.flags().AddString("gemm-sizes", &sizes_text, "m and n = k of the GEMM grid (default 512,...,8192)");
  h.flags().AddString("copy-bytes", &copy_text, "bytes of the device copy (default 1G)");
  h.flags().AddString("attention-shape", &attention_text,
                      "B,S,heads,head_dim (default 16,512,16,64)");
  h.flags().AddString("grouped-shape", &grouped_text,
                      "rows,d,f,experts of the expert products (default 32768,1024,4096,16)");
  TrainBench bench(/*steps=*/20, /*grad_accum=*/1);
  bench.AddFlags(h.flags(), "micro-batches a step of the overhead run (--config at d_model 8)");
  if (auto code = h.Start(argc, argv)) return *code;
  StatusOr<Shapes> parsed = ParseShapes(sizes_text, attention_text, grouped_text, copy_text);
  if (!parsed.ok()) return h.Fail(std::string(parsed.status().message()));
  const std::vector<int64_t>& sizes = parsed->sizes;
  const std::vector<int64_t>& shape = parsed->attention;
  const std::vector<int64_t>& grouped_shape = parsed->grouped;
  if (!CudaAvailable()) {
    h.Printf("plan_calibrate_gpu: no CUDA device is visible (or the build has no CUDA backend); "
             "nothing was measured\n");
    return 1;
  }
  if (h.ranks() != 1) return h.Fail("runs as one process on one GPU (no mpirun)");
  std::unique_ptr<DeviceContext> context = DeviceContext::Create(Device::Cuda(0));
  DeviceContext* ctx = context.get();
  cudaDeviceProp prop{};
  cudaGetDeviceProperties(&prop, 0);
  size_t free_bytes = 0, total_bytes = 0;
  cudaMemGetInfo(&free_bytes, &total_bytes);

  int64_t wrong = 0;
  const GemmFit bf16 = MeasureGemms(h, sizes, DType::kBF16, ctx, wrong);
  const GemmFit f32 = MeasureGemms(h, sizes, DType::kF32, ctx, wrong);
  const double bandwidth = MeasureCopy(h, parsed->copy_bytes, ctx);
  const double attention = MeasureAttention(h, shape, bf16.peak, ctx);
  const double grouped = MeasureGroupedGemm(h, grouped_shape, bf16, ctx);
  const double elementwise =
      MeasureElementwise(h, {grouped_shape[0], grouped_shape[1], grouped_shape[2]}, bandwidth, ctx);
  h.Printf("# fitted: bf16 %.1f TFLOP/s (F_half %.3g), f32 %.1f TFLOP/s, %.0f GB/s\n", bf16.peak / 1e12,
           bf16.half, f32.peak / 1e12, bandwidth / 1e9);
  const double memory = static_cast<double>(total_bytes);
  const std::string partial =
      Yaml(bf16, f32, bandwidth, attention, grouped, elementwise, memory, 0, 0, prop.name);
  double latency = 0, graph_latency = 0;
  for (bool graphs : {false, true}) {
    StatusOr<double> measured = MeasureOpLatency(h, bench, partial, graphs);
    const char* key = graphs ? "graph_op_latency" : "op_latency";
    if (!measured.ok()) {
      h.Printf("# overhead run failed (%s left out): %s\n", key, measured.status().ToString().c_str());
      continue;
    }
    (graphs ? graph_latency : latency) = *measured;
  }
  const std::string yaml = Yaml(bf16, f32, bandwidth, attention, grouped, elementwise, memory,
                                latency, graph_latency, prop.name);
  h.Printf("%s", yaml.c_str());
  if (!out.empty()) {
    std::ofstream file(out);
    file << yaml;
    if (!file) return h.Fail("--out " + out + ": cannot write");
  }
  Table none({{}, {}}, false);
  return h.Finish(none, wrong,
                  {{"peak_flops_bf16", bf16.peak},
                   {"half_flops_bf16", bf16.half},
                   {"peak_flops_fp32", f32.peak},
                   {"memory_bandwidth", bandwidth},
                   {"attention_efficiency", attention},
                   {"grouped_gemm_efficiency", grouped},
                   {"elementwise_efficiency", elementwise},
                   {"op_latency", latency},
                   {"graph_op_latency", graph_latency}});
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
