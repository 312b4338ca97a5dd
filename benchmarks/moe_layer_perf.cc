// moe_layer_perf: forward + backward of one MoE layer (moe/moe_layer.h; ep = the world,
// each rank routing --tokens tokens) and how close its matrix products come to the
// machine's fp32 peak, measured in the same run.
//
// FLOPs counted per iteration, summed over ranks (R = rows the experts really processed,
// i.e. kept assignments, T*k when nothing is dropped; m = 3 matrices for swiglu, else 2):
//   experts  forward 2 R d f m; backward twice that (dX and dW of every matrix)
//   router   forward 2 T d E;   backward 4 T d E
// Softmax, top-k, activations, permutes, the combine and the all-to-alls are not counted
// (they are not matrix products). FLOP/s = FLOPs / (fwd + bwd time); peak = 2 n^3 / time
// of an n = 2048 OpenBLAS sgemm on every rank at once at the same thread count, times the
// ranks (harness.h MakeSgemmOp). "gemm" columns time the layer's expert GEMMs alone (the
// same grouped calls on the same rows, forward and backward). The layer, the GEMMs and the
// sgemm are timed in the same interleaved blocks (harness.h TimeInterleaved: medians of
// the slowest rank), so the fractions compare figures taken under the same load; fwd and
// bwd are the medians of the hand-timed halves of the same calls.
//
// #wrong counts non-finite values of y, dh and the gradients, plus the elements of y and dh
// that differ between the first and the last timed iteration (routing does not depend on
// the step here, so they must be bitwise equal).
#include <cmath>

#include "benchmarks/harness.h"
#include "kernels/gemm.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"

namespace switchyard::bench {
namespace {

int64_t NonFinite(const Tensor& t) {
  int64_t bad = 0;
  const float* p = t.data<float>();
  for (int64_t i = 0; i < t.numel(); ++i) bad += !std::isfinite(p[i]);
  return bad;
}

int64_t Differ(const Tensor& a, const Tensor& b) {
  int64_t bad = 0;
  for (int64_t i = 0; i < a.numel(); ++i) bad += a.data<float>()[i] != b.data<float>()[i];
  return bad;
}

int Main(int argc, char** argv) {
  Harness h("moe_layer_perf",
            "Forward + backward of one MoE layer, ep = all ranks, vs the sgemm peak.", {});
  int tokens = 4096, hidden = 512, ffn = 1024, experts = 8, topk = 2, group = 0, seed = 1,
      peak_n = 2048;
  std::string activation = "gelu", capacity_text = "1.25";
  h.flags().AddInt("tokens", &tokens, "T, tokens per rank (default 4096)");
  h.flags().AddInt("hidden", &hidden, "d (default 512)");
  h.flags().AddInt("ffn", &ffn, "f, each expert's hidden size (default 1024)");
  h.flags().AddInt("experts", &experts, "E, a multiple of the ranks (default 8)");
  h.flags().AddInt("topk", &topk, "k (default 2)");
  h.flags().AddString("activation", &activation, "gelu, relu or swiglu (default gelu)");
  h.flags().AddString("capacity", &capacity_text, "capacity factor; 0 = dropless (default 1.25)");
  h.flags().AddInt("group", &group, "tokens per routing group (default: all T of a rank)");
  h.flags().AddInt("seed", &seed, "weight and input seed (default 1)");
  h.flags().AddInt("peak_n", &peak_n, "n of the n^3 sgemm that measures the peak (default 2048)");
  if (auto code = h.Start(argc, argv)) return *code;

  dist::Communicator& ep = h.world();
  StatusOr<double> cf = ParseDouble("capacity", capacity_text);
  if (!cf.ok()) return h.Fail(Message(cf.status()));
  StatusOr<moe::Activation> act = moe::ParseActivation(activation);
  if (!act.ok()) return h.Fail(Message(act.status()));
  if (group == 0) group = tokens;
  if (tokens < 1 || group < 1 || tokens % group != 0) {
    return h.Fail(StrCat("--tokens=", tokens, " must be a positive multiple of --group=", group));
  }
  moe::MoEConfig config;
  config.d_model = hidden;
  config.num_experts = experts;
  config.top_k = topk;
  config.d_expert = ffn;
  config.activation = *act;
  config.capacity_factor = static_cast<float>(*cf);
  config.aux_loss_coef = 0.01f;
  if (Status s = config.Validate(); !s.ok()) return h.Fail(Message(s));
  if (StatusOr<int64_t> per = config.ExpertsPerRank(ep.size()); !per.ok()) {
    return h.Fail(Message(per.status()));
  }

  const int64_t t = tokens, d = hidden, f = ffn, e = experts, groups = t / group;
  moe::MoELayer layer = moe::MoELayer::Init(config, 0, &ep, seed);
  Tensor x = Tensor::Empty({t, d}, DType::kF32), dy = Tensor::Empty({t, d}, DType::kF32);
  kernels::FillNormal(x, {uint64_t(seed), StreamId("bench.x")}, ep.rank() * t * d, 0.0f, 1.0f);
  kernels::FillNormal(dy, {uint64_t(seed), StreamId("bench.dy")}, ep.rank() * t * d, 0.0f, 1.0f);
  const std::vector<float> daux(groups, 1.0f), dz(groups, 0.0f);

  // One untimed iteration: the rows the experts get, and y, dh to compare later ones with.
  moe::MoEForward first = layer.Forward(x, group, /*training=*/true, /*step=*/0, ep.rank() * t);
  const Tensor first_dh = layer.Backward(first.acts, dy, daux, dz);
  const Tensor first_y = first.y;
  const int64_t rows = first.acts.plan->num_received();  // R, rows this rank's experts got
  const double dropped = first.stats.dropped_fraction();
  const moe::ExpertsActivations& expert_acts = first.acts.experts;

  // The layer, forward then backward, with each half timed by hand (after -w calls).
  std::vector<double> fwd_s, bwd_s;  // seconds per timed call, this rank
  Tensor last_y, last_dh;
  int calls = 0;
  auto layer_op = [&] {
    const double t0 = Now();
    moe::MoEForward out = layer.Forward(x, group, /*training=*/true, /*step=*/calls, ep.rank() * t);
    const double t1 = Now();
    last_dh = layer.Backward(out.acts, dy, daux, dz);
    if (calls++ >= h.options().warmup) fwd_s.push_back(t1 - t0), bwd_s.push_back(Now() - t1);
    last_y = out.y;
  };

  // The expert GEMMs alone, the calls Experts::Forward / Backward make, on the same rows.
  const bool swiglu = *act == moe::Activation::kSwiglu;
  const moe::Experts& ex = layer.experts();
  const std::span<const int64_t> rows_per(expert_acts.rows);
  Tensor a = Tensor::Empty({rows, f}, DType::kF32), y = Tensor::Empty({rows, d}, DType::kF32);
  Tensor dx = Tensor::Empty({rows, d}, DType::kF32), dye = Tensor::Empty({rows, d}, DType::kF32);
  kernels::FillNormal(dye, {uint64_t(seed), StreamId("bench.dye")}, 0, 0.0f, 1.0f);
  Tensor gw1 = Tensor::Zeros(ex.w1().shape(), DType::kF32),
         gw2 = Tensor::Zeros(ex.w2().shape(), DType::kF32);
  auto gemms = [&] {
    kernels::GroupedGemm(expert_acts.x, rows_per, ex.w1(), false, a);  // forward
    if (swiglu) kernels::GroupedGemm(expert_acts.x, rows_per, ex.w3(), false, a);
    kernels::GroupedGemm(expert_acts.h, rows_per, ex.w2(), false, y);
    kernels::GroupedGemmWeightGrad(expert_acts.h, dye, rows_per, gw2, 1.0f, 1.0f);  // backward
    kernels::GroupedGemm(dye, rows_per, ex.w2(), true, a);
    kernels::GroupedGemmWeightGrad(expert_acts.x, a, rows_per, gw1, 1.0f, 1.0f);
    kernels::GroupedGemm(a, rows_per, ex.w1(), true, dx);
    if (swiglu) {
      kernels::GroupedGemmWeightGrad(expert_acts.x, a, rows_per, gw1, 1.0f, 1.0f);
      kernels::GroupedGemm(a, rows_per, ex.w3(), true, dx, 1.0f, 1.0f);
    }
  };

  // All three in the same interleaved blocks, so they share the machine's load.
  const std::vector<double> times = h.TimeInterleaved({layer_op, gemms, MakeSgemmOp(peak_n)});
  const double total = times[0], gemm = times[1];
  const double fwd = h.MedianOfMax(fwd_s), bwd = h.MedianOfMax(bwd_s);
  const double peak = ep.size() * 2.0 * peak_n * peak_n * peak_n / times[2];

  const double m = swiglu ? 3 : 2;
  const double expert_flops = h.Sum(3.0 * 2 * double(rows) * d * f * m);
  const double router_flops = h.Sum(3.0 * 2 * double(t) * d * e);
  const double flops = expert_flops + router_flops;
  const double nominal_expert_flops = 3.0 * 2 * double(t) * ep.size() * topk * d * f * m;

  int64_t wrong = 0;
  if (h.options().check) {
    wrong += NonFinite(last_y) + NonFinite(last_dh) + NonFinite(layer.grad_router_weight());
    for (const auto& p : layer.experts().Parameters()) wrong += NonFinite(p.grad);
    wrong += Differ(first_y, last_y) + Differ(first_dh, last_dh);
  }
  wrong = h.Sum(wrong);

  Table table({{{"tokens", "/rank", 7, 0},
                {"d", "", 5, 0},
                {"f", "", 5, 0},
                {"E", "", 4, 0},
                {"k", "", 2, 0},
                {"act", "", 6, 0},
                {"cf", "", 5, 2},
                {"drop", "(%)", 5, 1}},
               {{"fwd", "(ms)", 9, 2},
                {"bwd", "(ms)", 9, 2},
                {"total", "(ms)", 9, 2},
                {"GFLOP/s", "", 8, 2},
                {"%peak", "", 6, 1},
                {"#wrong", "", 6, 0}},
               {{"gemm", "(ms)", 9, 2},
                {"gemm_GF/s", "", 9, 2},
                {"gemm%peak", "", 9, 1},
                {"gemm%time", "", 9, 1},
                {"peak", "(GF/s)", 8, 2}}},
              h.printing());
  if (h.printing()) {
    std::printf(
        "# MoE layer fwd+bwd, %d rank(s) = ep; FLOPs/iter %.3g (experts %.3g of nominal "
        "T*k %.3g, router %.3g)\n#\n",
        ep.size(), flops, expert_flops, nominal_expert_flops, router_flops);
  }
  table.PrintHeader();
  table.AddRow({int64_t{tokens}, d, f, e, int64_t{topk}, activation, *cf, 100 * dropped, fwd * 1e3,
                bwd * 1e3, total * 1e3, flops / total / 1e9, 100 * flops / total / peak, wrong,
                gemm * 1e3, expert_flops / gemm / 1e9, 100 * expert_flops / gemm / peak,
                100 * gemm / total, peak / 1e9});
  return h.Finish(table, wrong,
                  {{"fwd_ms", fwd * 1e3},
                   {"bwd_ms", bwd * 1e3},
                   {"total_ms", total * 1e3},
                   {"flops_per_iter", flops},
                   {"expert_flops", expert_flops},
                   {"nominal_expert_flops", nominal_expert_flops},
                   {"router_flops", router_flops},
                   {"peak_flops", peak},
                   {"achieved_flops", flops / total},
                   {"gemm_ms", gemm * 1e3},
                   {"gemm_flops", expert_flops / gemm},
                   {"group", group},
                   {"activation", activation},
                   {"capacity", *cf}});
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
