// grouped_gemm_gpu_perf: the expert GEMMs of one MoE layer on one GPU against the ceiling a
// grouped GEMM can reach, ONE dense cuBLAS GEMM of the same total size. R = tokens * topk
// rows are split over E experts (uniform, or --skew / --hot as benchmarks/routing.h draws):
//
//   op   grouped (kernels/gemm.h)                          dense (kernels::Gemm)    m x n x k
//   fwd  GroupedGemm: x (R, d) @ w[e] (d, f) per block     x @ w[0]                 R x f x d
//   dx   GroupedGemm, trans_w: dy (R, f) @ w[e]^T (f, d)   dy @ w[0]^T              R x d x f
//   dw   GroupedGemmWeightGrad: x^T (d, R) @ dy (R, f)     x^T @ dy into dw[0]      d x f x R
//   all  the three together (one forward and backward of a linear expert layer)
//
//   time     ms per call, CUDA events around -n calls in 5 blocks alternating grouped and
//            dense (so both see the same clocks), after -w warm-up calls; median block
//   TFLOP/s  2 m n k / time
//   ratio    grouped time / dense time: 1.00 means grouping the rows costs nothing
//   #wrong   sampled entries of the grouped results (the first and last row of every
//            expert's block for fwd and dx, the first and last row of every dw[e]) that
//            differ from a double host product of the same (rounded) inputs by more than
//            kCheckRel * sum |a||b|
//
// Precision (--dtype): bf16 stores x, w and dy as bf16 tensors (the GEMMs alone: bf16
// products summed in f32 into f32 outputs); f32 is f32 throughout (CUBLAS_COMPUTE_32F, no
// TF32). --cast 1 with bf16 keeps f32 operands and sets DeviceContext::matmul_dtype to bf16,
// so every call also rounds its operands to bf16 copies, as the training engine does with
// f32 activations (the grouped op casts all E weight matrices, the dense one a single one).
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/gpu_timing.h"
#include "benchmarks/harness.h"
#include "benchmarks/routing.h"
#include "engine/core/cuda_check.h"
#include "engine/core/device.h"
#include "engine/core/device_context.h"
#include "kernels/gemm.h"
#include "kernels/random.h"

namespace switchyard::bench {
namespace {

// f32 sums of up to ~3e4 products in another order: a random walk of ~1e-5 relative to
// sum |a||b| at most; an indexing error is O(1) of it.
constexpr double kCheckRel = 1e-4;

// The values a GEMM reads from t, on the host in f32: bf16 tensors widened, f32 ones
// rounded to bf16 when `round` (the --cast path), else as they are.
std::vector<float> HostValues(const Tensor& t, bool round, DeviceContext* ctx) {
  Tensor host = t.To(Device::Cpu(), ctx);
  std::vector<float> v(static_cast<size_t>(host.numel()));
  if (host.dtype() == DType::kBF16) {
    const BFloat16* p = host.data<BFloat16>();
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(p[i]);
  } else {
    const float* p = host.data<float>();
    for (size_t i = 0; i < v.size(); ++i) {
      v[i] = round ? BFloat16::ToFloat(BFloat16::FromFloat(p[i])) : p[i];
    }
  }
  return v;
}

// Entries of `got` (n values of one output row) outside kCheckRel * sum|a||b| of `want`.
int64_t CountWrong(const std::vector<float>& got, const std::vector<double>& want,
                   const std::vector<double>& mag) {
  int64_t wrong = 0;
  for (size_t j = 0; j < got.size(); ++j) {
    wrong += !(std::fabs(got[j] - want[j]) <= kCheckRel * mag[j]);  // NaN is wrong
  }
  return wrong;
}

int Main(int argc, char** argv) {
  Harness h("grouped_gemm_gpu_perf",
            "MoE expert GEMMs on one GPU: grouped (one cuBLAS GEMM per expert) against one dense "
            "GEMM of the same size, forward and backward.",
            {});
  int tokens = 16384, hidden = 4096, ffn = 14336, experts = 8, topk = 2, hot = 0, seed = 1;
  int cast = 0;
  std::string dtype_text = "bf16", skew_text, hot_share_text = "0.75";
  h.flags().AddInt("tokens", &tokens, "tokens (default 16384); R = tokens * topk rows");
  h.flags().AddInt("hidden", &hidden, "d, the model width (default 4096, Mixtral 8x7B)");
  h.flags().AddInt("ffn", &ffn, "f, the expert's hidden width (default 14336, Mixtral 8x7B)");
  h.flags().AddInt("experts", &experts, "E (default 8)");
  h.flags().AddInt("topk", &topk, "experts per token (default 2)");
  h.flags().AddString("dtype", &dtype_text, "bf16 (default) or f32: the GEMMs' input type");
  h.flags().AddInt("cast", &cast,
                   "1: with --dtype bf16, keep f32 operands and round them every call "
                   "(matmul_dtype bf16), as training does (default 0)");
  h.flags().AddString("skew", &skew_text, "uneven split: expert e chosen ~ 1/(e+1)^s (Zipf)");
  h.flags().AddInt("hot", &hot, "1: uneven split, expert 0 gets --hot_share of the rows");
  h.flags().AddString("hot_share", &hot_share_text, "the hot expert's share (default 0.75)");
  h.flags().AddInt("seed", &seed, "seed of the routing draw and the inputs (default 1)");
  if (auto code = h.Start(argc, argv)) return *code;

  if (tokens < 1 || hidden < 1 || ffn < 1) {
    return h.Fail("--tokens, --hidden and --ffn must be >= 1");
  }
  if (experts < 1 || topk < 1 || topk > experts) {
    return h.Fail(StrCat("--experts=", experts, " and --topk=", topk,
                         " need 1 <= topk <= experts"));
  }
  if (dtype_text != "bf16" && dtype_text != "f32") {
    return h.Fail("--dtype must be bf16 or f32, got \"" + dtype_text + "\"");
  }
  if (cast != 0 && cast != 1) return h.Fail(StrCat("--cast=", cast, " must be 0 or 1"));
  if (cast && dtype_text != "bf16") return h.Fail("--cast 1 needs --dtype bf16");
  StatusOr<RoutingSpec> spec = RoutingSpecFromFlags(skew_text, hot, hot_share_text, experts, seed);
  if (!spec.ok()) return h.Fail(Message(spec.status()));
  if (!CudaAvailable()) {
    std::fprintf(stderr,
                 "grouped_gemm_gpu_perf: needs a CUDA device and none is visible; nothing "
                 "was measured\n");
    return cli::kExitUsage;
  }
  if (h.ranks() != 1) return h.Fail("runs as one process on one GPU (no mpirun)");

  const int64_t r = static_cast<int64_t>(tokens) * topk, d = hidden, f = ffn, e = experts;
  const std::vector<int64_t> rows = DrawRowsPerExpert(*spec, r, 0);
  const bool bf16 = dtype_text == "bf16";
  const DType stored = bf16 && !cast ? DType::kBF16 : DType::kF32;

  const Device gpu = Device::Cuda(0);
  auto owned_ctx = DeviceContext::Create(gpu);
  DeviceContext* ctx = owned_ctx.get();
  ctx->set_matmul_dtype(bf16 ? DType::kBF16 : DType::kF32);
  cudaDeviceProp prop{};
  SY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));

  // Inputs uniform in [-1, 1) drawn on the device; outputs f32.
  Tensor x = Tensor::Empty({r, d}, stored, gpu), w = Tensor::Empty({e, d, f}, stored, gpu);
  Tensor dy = Tensor::Empty({r, f}, stored, gpu);
  const uint64_t s = static_cast<uint64_t>(seed);
  kernels::FillUniform(x, RngKey{s, 1}, 0, -1.0f, 1.0f, ctx);
  kernels::FillUniform(w, RngKey{s, 2}, 0, -1.0f, 1.0f, ctx);
  kernels::FillUniform(dy, RngKey{s, 3}, 0, -1.0f, 1.0f, ctx);
  Tensor out = Tensor::Empty({r, f}, DType::kF32, gpu), dx = Tensor::Empty({r, d}, DType::kF32, gpu);
  Tensor dw = Tensor::Empty({e, d, f}, DType::kF32, gpu);
  const Tensor w0 = w.View({d, f});  // the dense products' weight: expert 0's
  Tensor dw0 = dw.View({d, f});

  const std::function<void()> grouped[] = {
      [&] { kernels::GroupedGemm(x, rows, w, false, out, 1.0f, 0.0f, ctx); },
      [&] { kernels::GroupedGemm(dy, rows, w, true, dx, 1.0f, 0.0f, ctx); },
      [&] { kernels::GroupedGemmWeightGrad(x, dy, rows, dw, 1.0f, 0.0f, ctx); }};
  const std::function<void()> dense[] = {
      [&] { kernels::Gemm(x, false, w0, false, out, 1.0f, 0.0f, ctx); },
      [&] { kernels::Gemm(dy, false, w0, true, dx, 1.0f, 0.0f, ctx); },
      [&] { kernels::Gemm(x, true, dy, false, dw0, 1.0f, 0.0f, ctx); }};
  const char* names[] = {"fwd", "dx", "dw"};
  const int64_t mnk[3][3] = {{r, f, d}, {r, d, f}, {d, f, r}};

  int64_t min_rows = r, max_rows = 0;
  for (int64_t n : rows) min_rows = std::min(min_rows, n), max_rows = std::max(max_rows, n);
  if (h.printing()) {
    std::printf("# GPU %s; R=%lld rows over E=%lld experts (%s): min %lld, mean %.1f, max %lld "
                "rows per expert\n# dtype %s%s, d=%lld, f=%lld\n#\n",
                prop.name, static_cast<long long>(r), static_cast<long long>(e),
                spec->Name().c_str(), static_cast<long long>(min_rows),
                static_cast<double>(r) / e, static_cast<long long>(max_rows), dtype_text.c_str(),
                cast ? " (f32 operands cast every call)" : "", static_cast<long long>(d),
                static_cast<long long>(f));
  }

  Table table({{{"op", "", 4, 0}, {"m", "", 7, 0}, {"n", "", 7, 0}, {"k", "", 7, 0}},
               {{"grouped", "(ms)", 9, 3},
                {"grp_tflops", "(TFLOP/s)", 10, 1},
                {"dense", "(ms)", 9, 3},
                {"dns_tflops", "(TFLOP/s)", 10, 1},
                {"ratio", "(grp/dns)", 9, 3},
                {"#wrong", "", 6, 0}}},
              h.printing());
  table.PrintHeader();

  // --- timing ---
  const int iters = h.options().iters, warmup = h.options().warmup;
  double total_grouped = 0, total_dense = 0, total_flop = 0;
  std::vector<double> t_grouped(3), t_dense(3);
  for (int o = 0; o < 3; ++o) {
    const std::vector<double> t = TimeGpuOps({grouped[o], dense[o]}, iters, warmup, ctx);
    t_grouped[o] = t[0];
    t_dense[o] = t[1];
  }

  // --- correctness of the grouped results on sampled rows ---
  int64_t wrong[3] = {0, 0, 0};
  if (h.options().check) {
    for (const auto& op : grouped) op();  // the dense calls wrote the same outputs last
    ctx->Synchronize();
    const bool round = cast != 0;
    const std::vector<float> xv = HostValues(x, round, ctx), wv = HostValues(w, round, ctx),
                             dyv = HostValues(dy, round, ctx);
    auto row_of = [&](const Tensor& t, int64_t offset, int64_t n) {
      return t.View({n}, offset).To(Device::Cpu(), ctx).ToVector<float>();
    };
    int64_t begin = 0;
    for (int64_t g = 0; g < e; ++g) {
      const float* wg = wv.data() + g * d * f;  // (d, f)
      for (int64_t i : {begin, begin + rows[g] - 1}) {
        if (rows[g] == 0 || (i == begin + rows[g] - 1 && rows[g] == 1)) continue;
        // fwd: out[i, :] = x[i, :] @ w[g] (d, f).
        std::vector<double> want(f, 0.0), mag(f, 0.0);
        for (int64_t p = 0; p < d; ++p) {
          const double a = xv[i * d + p];
          for (int64_t j = 0; j < f; ++j) {
            want[j] += a * wg[p * f + j];
            mag[j] += std::fabs(a * wg[p * f + j]);
          }
        }
        wrong[0] += CountWrong(row_of(out, i * f, f), want, mag);
        // dx: dx[i, :] = dy[i, :] @ w[g]^T, dx[i, p] = sum_j dy[i, j] w[g][p, j].
        std::vector<double> want_dx(d, 0.0), mag_dx(d, 0.0);
        for (int64_t p = 0; p < d; ++p) {
          for (int64_t j = 0; j < f; ++j) {
            const double prod = static_cast<double>(dyv[i * f + j]) * wg[p * f + j];
            want_dx[p] += prod;
            mag_dx[p] += std::fabs(prod);
          }
        }
        wrong[1] += CountWrong(row_of(dx, i * d, d), want_dx, mag_dx);
      }
      for (int64_t p : {int64_t{0}, d - 1}) {
        if (p == d - 1 && d == 1) continue;
        // dw: dw[g][p, :] = sum over the block's rows i of x[i, p] dy[i, :] (0 for no rows).
        std::vector<double> want(f, 0.0), mag(f, 0.0);
        for (int64_t i = begin; i < begin + rows[g]; ++i) {
          const double a = xv[i * d + p];
          for (int64_t j = 0; j < f; ++j) {
            want[j] += a * dyv[i * f + j];
            mag[j] += std::fabs(a * dyv[i * f + j]);
          }
        }
        wrong[2] += CountWrong(row_of(dw, (g * d + p) * f, f), want, mag);
      }
      begin += rows[g];
    }
  }

  // --- table ---
  for (int o = 0; o < 3; ++o) {
    const double flop = 2.0 * mnk[o][0] * mnk[o][1] * mnk[o][2];
    total_flop += flop;
    total_grouped += t_grouped[o];
    total_dense += t_dense[o];
    table.AddRow({std::string(names[o]), mnk[o][0], mnk[o][1], mnk[o][2], t_grouped[o],
                  flop / (t_grouped[o] * 1e-3) / 1e12, t_dense[o],
                  flop / (t_dense[o] * 1e-3) / 1e12, t_grouped[o] / t_dense[o], wrong[o]});
  }
  const int64_t total_wrong = wrong[0] + wrong[1] + wrong[2];
  table.AddRow({std::string("all"), r, f, d, total_grouped,
                total_flop / (total_grouped * 1e-3) / 1e12, total_dense,
                total_flop / (total_dense * 1e-3) / 1e12, total_grouped / total_dense,
                total_wrong});
  nlohmann::json extra = {
      {"gpu", std::string(prop.name)},
      {"tokens", tokens},
      {"topk", topk},
      {"rows", r},
      {"hidden", d},
      {"ffn", f},
      {"experts", e},
      {"dtype", dtype_text},
      {"cast", cast},
      {"routing", spec->Name()},
      {"rows_per_expert", rows},
      {"tflops_grouped_all", total_flop / (total_grouped * 1e-3) / 1e12},
      {"tflops_dense_all", total_flop / (total_dense * 1e-3) / 1e12},
      {"ratio_all", total_grouped / total_dense},
      {"timing", "CUDA events, ms per call, median of 5 blocks"}};
  if (h.printing()) {
    std::printf("# grouped / dense time, forward + backward: %.3f\n", total_grouped / total_dense);
  }
  return h.Finish(table, total_wrong, extra);
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
