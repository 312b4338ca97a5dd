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
#include <functional>
#include <optional>

#include "benchmarks/benchmark.h"
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

class MoELayerPerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    flags.AddInt("tokens", &tokens_, "T, tokens per rank (default 4096)");
    flags.AddInt("hidden", &hidden_, "d (default 512)");
    flags.AddInt("ffn", &ffn_, "f, each expert's hidden size (default 1024)");
    flags.AddInt("experts", &experts_, "E, a multiple of the ranks (default 8)");
    flags.AddInt("topk", &topk_, "k (default 2)");
    flags.AddString("activation", &activation_, "gelu, relu or swiglu (default gelu)");
    flags.AddString("capacity", &capacity_text_, "capacity factor; 0 = dropless (default 1.25)");
    flags.AddInt("group", &group_, "tokens per routing group (default: all T of a rank)");
    flags.AddInt("seed", &seed_, "weight and input seed (default 1)");
    flags.AddInt("peak_n", &peak_n_, "n of the n^3 sgemm that measures the peak (default 2048)");
  }

  // The layer, its inputs, one untimed iteration (the rows the experts get, and y, dh to
  // compare later ones with) and the FLOPs it counts.
  Status Setup(Harness& h) override {
    dist::Communicator& ep = h.world();
    SY_ASSIGN_OR_RETURN(cf_, ParseDouble("capacity", capacity_text_));
    SY_ASSIGN_OR_RETURN(act_, moe::ParseActivation(activation_));
    if (group_ == 0) group_ = tokens_;
    if (tokens_ < 1 || group_ < 1 || tokens_ % group_ != 0) {
      return InvalidArgument("--tokens=", tokens_, " must be a positive multiple of --group=", group_);
    }
    moe::MoEConfig config;
    config.d_model = hidden_;
    config.num_experts = experts_;
    config.top_k = topk_;
    config.d_expert = ffn_;
    config.activation = act_;
    config.capacity_factor = static_cast<float>(cf_);
    config.aux_loss_coef = 0.01f;
    SY_RETURN_IF_ERROR(config.Validate());
    SY_RETURN_IF_ERROR(config.ExpertsPerRank(ep.size()).status());

    const int64_t t = tokens_, d = hidden_;
    layer_.emplace(moe::MoELayer::Init(config, 0, &ep, seed_));
    x_ = Tensor::Empty({t, d}, DType::kF32), dy_ = Tensor::Empty({t, d}, DType::kF32);
    kernels::FillNormal(x_, {uint64_t(seed_), StreamId("bench.x")}, ep.rank() * t * d, 0.0f, 1.0f);
    kernels::FillNormal(dy_, {uint64_t(seed_), StreamId("bench.dy")}, ep.rank() * t * d, 0.0f, 1.0f);
    daux_.assign(t / group_, 1.0f), dz_.assign(t / group_, 0.0f);
    first_.emplace(layer_->Forward(x_, group_, /*training=*/true, /*step=*/0, ep.rank() * t));
    first_dh_ = layer_->Backward(first_->acts, dy_, daux_, dz_);
    CountFlops(h);
    h.Printf(
        "# MoE layer fwd+bwd, %d rank(s) = ep; FLOPs/iter %.3g (experts %.3g of nominal "
        "T*k %.3g, router %.3g)\n#\n",
        ep.size(), flops_, expert_flops_, nominal_expert_flops_, router_flops_);
    return OkStatus();
  }

  Table MakeTable(Harness& h) override {
    return Table({{{"tokens", "/rank", 7, 0},
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
  }

  // The layer, its expert GEMMs alone and the sgemm peak, in the same interleaved blocks
  // (so they share the machine's load); fwd and bwd are the hand-timed halves of the layer.
  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    dist::Communicator& ep = h.world();
    std::vector<double> fwd_s, bwd_s;  // seconds per timed call, this rank
    Tensor last_y, last_dh;
    int calls = 0;
    auto layer_op = [&] {
      const double t0 = Now();
      moe::MoEForward out =
          layer_->Forward(x_, group_, /*training=*/true, /*step=*/calls, ep.rank() * tokens_);
      const double t1 = Now();
      last_dh = layer_->Backward(out.acts, dy_, daux_, dz_);
      if (calls++ >= h.options().warmup) fwd_s.push_back(t1 - t0), bwd_s.push_back(Now() - t1);
      last_y = out.y;
    };
    const std::vector<double> times =
        h.TimeInterleaved({layer_op, ExpertGemmsOp(), MakeSgemmOp(peak_n_)});
    total_ = times[0], gemm_ = times[1];
    fwd_ = h.MedianOfMax(fwd_s), bwd_ = h.MedianOfMax(bwd_s);
    peak_ = ep.size() * 2.0 * peak_n_ * peak_n_ * peak_n_ / times[2];
    const int64_t wrong = h.Check([&] {
      int64_t bad = NonFinite(last_y) + NonFinite(last_dh) + NonFinite(layer_->grad_router_weight());
      for (const auto& p : layer_->experts().Parameters()) bad += NonFinite(p.grad);
      return bad + Differ(first_->y, last_y) + Differ(first_dh_, last_dh);
    });
    const double dropped = first_->stats.dropped_fraction();
    table.AddRow({int64_t{tokens_}, int64_t{hidden_}, int64_t{ffn_}, int64_t{experts_},
                  int64_t{topk_}, activation_, cf_, 100 * dropped, fwd_ * 1e3, bwd_ * 1e3,
                  total_ * 1e3, flops_ / total_ / 1e9, 100 * flops_ / total_ / peak_, wrong,
                  gemm_ * 1e3, expert_flops_ / gemm_ / 1e9, 100 * expert_flops_ / gemm_ / peak_,
                  100 * gemm_ / total_, peak_ / 1e9});
    return wrong;
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"fwd_ms", fwd_ * 1e3},
            {"bwd_ms", bwd_ * 1e3},
            {"total_ms", total_ * 1e3},
            {"flops_per_iter", flops_},
            {"expert_flops", expert_flops_},
            {"nominal_expert_flops", nominal_expert_flops_},
            {"router_flops", router_flops_},
            {"peak_flops", peak_},
            {"achieved_flops", flops_ / total_},
            {"gemm_ms", gemm_ * 1e3},
            {"gemm_flops", expert_flops_ / gemm_},
            {"group", group_},
            {"activation", activation_},
            {"capacity", cf_}};
  }

 private:
  // The FLOPs of one iteration, summed over ranks (see the file comment).
  void CountFlops(Harness& h) {
    const double rows = static_cast<double>(first_->acts.plan->received_rows());  // R
    const double d = hidden_, f = ffn_, m = act_ == moe::Activation::kSwiglu ? 3 : 2;
    expert_flops_ = h.Sum(3.0 * 2 * rows * d * f * m);
    router_flops_ = h.Sum(3.0 * 2 * double(tokens_) * d * experts_);
    flops_ = expert_flops_ + router_flops_;
    nominal_expert_flops_ = 3.0 * 2 * double(tokens_) * h.ranks() * topk_ * d * f * m;
  }

  // The expert GEMMs alone, the calls Experts::Forward / Backward make, on the rows the
  // experts got in the first iteration.
  std::function<void()> ExpertGemmsOp() {
    const bool swiglu = act_ == moe::Activation::kSwiglu;
    const moe::Experts& ex = layer_->experts();
    const moe::ExpertsActivations& acts = first_->acts.experts;
    const int64_t rows = first_->acts.plan->received_rows();
    // Host-sized or device-sized experts (the dropless default): the counts either way.
    std::vector<int64_t> counts = acts.rows;
    if (acts.offsets.defined()) {
      const int64_t* o = acts.offsets.data<int64_t>();
      for (int64_t e = 0; e + 1 < acts.offsets.numel(); ++e) counts.push_back(o[e + 1] - o[e]);
    }
    // The kept rows (a device-sized plan's operands carry its bound's rows).
    const Tensor xs = acts.x.Slice(0, rows), hs = acts.h.Slice(0, rows);
    Tensor a = Tensor::Empty({rows, ffn_}, DType::kF32), y = Tensor::Empty({rows, hidden_}, DType::kF32);
    Tensor dx = Tensor::Empty({rows, hidden_}, DType::kF32), dye = Tensor::Empty({rows, hidden_}, DType::kF32);
    kernels::FillNormal(dye, {uint64_t(seed_), StreamId("bench.dye")}, 0, 0.0f, 1.0f);
    Tensor gw1 = Tensor::Zeros(ex.w1().shape(), DType::kF32),
           gw2 = Tensor::Zeros(ex.w2().shape(), DType::kF32);
    return [=, &ex]() mutable {
      const std::span<const int64_t> per(counts);  // the lambda's own copy
      kernels::GroupedGemm(xs, per, ex.w1(), false, a);  // forward
      if (swiglu) kernels::GroupedGemm(xs, per, ex.w3(), false, a);
      kernels::GroupedGemm(hs, per, ex.w2(), false, y);
      kernels::GroupedGemmWeightGrad(hs, dye, per, gw2, 1.0f, 1.0f);  // backward
      kernels::GroupedGemm(dye, per, ex.w2(), true, a);
      kernels::GroupedGemmWeightGrad(xs, a, per, gw1, 1.0f, 1.0f);
      kernels::GroupedGemm(a, per, ex.w1(), true, dx);
      if (swiglu) {
        kernels::GroupedGemmWeightGrad(xs, a, per, gw1, 1.0f, 1.0f);
        kernels::GroupedGemm(a, per, ex.w3(), true, dx, 1.0f, 1.0f);
      }
    };
  }

  int tokens_ = 4096, hidden_ = 512, ffn_ = 1024, experts_ = 8, topk_ = 2, group_ = 0, seed_ = 1,
      peak_n_ = 2048;
  std::string activation_ = "gelu", capacity_text_ = "1.25";
  double cf_ = 0;
  moe::Activation act_{};
  std::optional<moe::MoELayer> layer_;
  Tensor x_, dy_, first_dh_;
  std::vector<float> daux_, dz_;
  std::optional<moe::MoEForward> first_;
  double expert_flops_ = 0, router_flops_ = 0, flops_ = 0, nominal_expert_flops_ = 0;
  double total_ = 0, gemm_ = 0, fwd_ = 0, bwd_ = 0, peak_ = 0;
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::MoELayerPerf>(
      argc, argv, "moe_layer_perf",
      "Forward + backward of one MoE layer, ep = all ranks, vs the sgemm peak.");
}
