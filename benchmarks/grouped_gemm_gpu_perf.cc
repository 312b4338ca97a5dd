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
//   sizes  host: the group sizes on the host (one cuBLAS GEMM per expert,
//          kernels/cuda/gemm.cu); device: the same products with the sizes as offsets on the
//          GPU (one tiled kernel that reads them, kernels/cuda/grouped_gemm.cu: no host wait
//          in training), the same shapes, outputs and dense reference
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
// f32 activations (the grouped op casts all E weight matrices, the dense one a single one;
// the device-sized kernel rounds f32 operands as it loads them, with no copies).
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <functional>
#include <string>
#include <vector>

#include "benchmarks/gpu_timing.h"
#include "benchmarks/benchmark.h"
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

// The three products, in the table's order.
enum Op { kFwd, kDx, kDw, kOps };
constexpr const char* kNames[] = {"fwd", "dx", "dw"};
// Where the grouped products find the group sizes.
enum Sizes { kHost, kDevice, kSizes };
constexpr const char* kSizeNames[] = {"host", "device"};

// A row of the result (n values) against its double host product, and sum |a||b| per entry.
struct Expected {
  std::vector<double> want, mag;
  explicit Expected(int64_t n) : want(n, 0.0), mag(n, 0.0) {}
  void Add(int64_t j, double a, double b) {
    want[j] += a * b;
    mag[j] += std::fabs(a * b);
  }
};

class GroupedGemmGpuPerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    flags.AddInt("tokens", &tokens_, "tokens (default 16384); R = tokens * topk rows");
    flags.AddInt("hidden", &hidden_, "d, the model width (default 4096, Mixtral 8x7B)");
    flags.AddInt("ffn", &ffn_, "f, the expert's hidden width (default 14336, Mixtral 8x7B)");
    flags.AddInt("experts", &experts_, "E (default 8)");
    flags.AddInt("topk", &topk_, "experts per token (default 2)");
    flags.AddString("dtype", &dtype_text_, "bf16 (default) or f32: the GEMMs' input type");
    flags.AddInt("cast", &cast_,
                 "1: with --dtype bf16, keep f32 operands and round them every call "
                 "(matmul_dtype bf16), as training does (default 0)");
    flags.AddString("skew", &skew_text_, "uneven split: expert e chosen ~ 1/(e+1)^s (Zipf)");
    flags.AddInt("hot", &hot_, "1: uneven split, expert 0 gets --hot_share of the rows");
    flags.AddString("hot_share", &hot_share_text_, "the hot expert's share (default 0.75)");
    flags.AddInt("seed", &seed_, "seed of the routing draw and the inputs (default 1)");
  }

  Status Setup(Harness& h) override {
    if (tokens_ < 1 || hidden_ < 1 || ffn_ < 1) {
      return InvalidArgument("--tokens, --hidden and --ffn must be >= 1");
    }
    if (experts_ < 1 || topk_ < 1 || topk_ > experts_) {
      return InvalidArgument("--experts=", experts_, " and --topk=", topk_,
                             " need 1 <= topk <= experts");
    }
    if (dtype_text_ != "bf16" && dtype_text_ != "f32") {
      return InvalidArgument("--dtype must be bf16 or f32, got \"", dtype_text_, "\"");
    }
    if (cast_ != 0 && cast_ != 1) return InvalidArgument("--cast=", cast_, " must be 0 or 1");
    if (cast_ && dtype_text_ != "bf16") return InvalidArgument("--cast 1 needs --dtype bf16");
    SY_ASSIGN_OR_RETURN(spec_,
                        RoutingSpecFromFlags(skew_text_, hot_, hot_share_text_, experts_, seed_));
    if (!CudaAvailable()) {
      return absl::UnavailableError("needs a CUDA device and none is visible; nothing was measured");
    }
    if (h.ranks() != 1) return InvalidArgument("runs as one process on one GPU (no mpirun)");
    r_ = static_cast<int64_t>(tokens_) * topk_, d_ = hidden_, f_ = ffn_, e_ = experts_;
    rows_ = DrawRowsPerExpert(spec_, r_, 0);
    MakeTensors(h.options().check != 0);
    PrintSetting(h);
    return OkStatus();
  }

  Table MakeTable(Harness& h) override {
    return Table({{{"op", "", 4, 0},
                   {"sizes", "", 6, 0},
                   {"m", "", 7, 0},
                   {"n", "", 7, 0},
                   {"k", "", 7, 0}},
                  {{"grouped", "(ms)", 9, 3},
                   {"grp_tflops", "(TFLOP/s)", 10, 1},
                   {"dense", "(ms)", 9, 3},
                   {"dns_tflops", "(TFLOP/s)", 10, 1},
                   {"ratio", "(grp/dns)", 9, 3},
                   {"#wrong", "", 6, 0}}},
                 h.printing());
  }

  // fwd, dx, dw with the sizes on the host, then on the device; each "all" row follows in
  // Conclude.
  int NumCases() const override { return static_cast<int>(kSizes) * static_cast<int>(kOps); }

  // One product: grouped beside dense in alternating blocks, then the grouped result checked.
  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    const int op = index % kOps, sizes = index / kOps;
    const std::function<void()>& grouped = (sizes == kHost ? grouped_ : device_sized_)[op];
    const std::vector<double> t =
        TimeGpuOps({grouped, dense_[op]}, h.options().iters, h.options().warmup, ctx());
    int64_t wrong = 0;
    if (h.options().check) {
      grouped();  // the dense call wrote the same output last
      ctx()->Synchronize();
      wrong = op == kDw ? CheckWeightGrad() : CheckRows(static_cast<Op>(op));
    }
    // A copy: a pointer into the returned temporary would dangle past this line (the table
    // printed m, n, k and TFLOP/s as 0).
    const std::array<int64_t, 3> mnk = Mnk(op);
    const double flop = 2.0 * mnk[0] * mnk[1] * mnk[2];
    Totals& sum = totals_[sizes];
    sum.flop += flop, sum.grouped += t[0], sum.dense += t[1], sum.wrong += wrong;
    table.AddRow({std::string(kNames[op]), std::string(kSizeNames[sizes]), mnk[0], mnk[1],
                  mnk[2], t[0], flop / (t[0] * 1e-3) / 1e12, t[1], flop / (t[1] * 1e-3) / 1e12,
                  t[0] / t[1], wrong});
    return wrong;
  }

  // The three together: one forward and backward of a linear expert layer, per sizes.
  void Conclude(Harness& h, Table& table) override {
    for (int sizes = 0; sizes < kSizes; ++sizes) {
      const Totals& sum = totals_[sizes];
      table.AddRow({std::string("all"), std::string(kSizeNames[sizes]), r_, f_, d_, sum.grouped,
                    sum.flop / (sum.grouped * 1e-3) / 1e12, sum.dense,
                    sum.flop / (sum.dense * 1e-3) / 1e12, sum.grouped / sum.dense, sum.wrong});
    }
    h.Printf("# grouped / dense time, forward + backward: %.3f (sizes on the host), %.3f (on the "
             "device)\n",
             totals_[kHost].grouped / totals_[kHost].dense,
             totals_[kDevice].grouped / totals_[kDevice].dense);
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"gpu", gpu_name_},
            {"tokens", tokens_},
            {"topk", topk_},
            {"rows", r_},
            {"hidden", d_},
            {"ffn", f_},
            {"experts", e_},
            {"dtype", dtype_text_},
            {"cast", cast_},
            {"routing", spec_.Name()},
            {"rows_per_expert", rows_},
            {"tflops_grouped_all", Tflops(totals_[kHost].grouped)},
            {"tflops_device_sized_all", Tflops(totals_[kDevice].grouped)},
            {"tflops_dense_all", Tflops(totals_[kHost].dense)},
            {"ratio_all", totals_[kHost].grouped / totals_[kHost].dense},
            {"ratio_device_sized_all", totals_[kDevice].grouped / totals_[kDevice].dense},
            {"timing", "CUDA events, ms per call, median of 5 blocks"}};
  }

 private:
  DeviceContext* ctx() const { return ctx_.get(); }
  // TFLOP/s of the three products in `ms` milliseconds.
  double Tflops(double ms) const { return totals_[kHost].flop / (ms * 1e-3) / 1e12; }
  // m x n x k of product `op`.
  std::array<int64_t, 3> Mnk(int op) const {
    const std::array<int64_t, 3> mnk[] = {{r_, f_, d_}, {r_, d_, f_}, {d_, f_, r_}};
    return mnk[op];
  }

  // Inputs uniform in [-1, 1) drawn on the device, f32 outputs, the calls, and with --check
  // the inputs on the host as the GEMMs read them.
  void MakeTensors(bool check) {
    const bool bf16 = dtype_text_ == "bf16";
    const DType stored = bf16 && !cast_ ? DType::kBF16 : DType::kF32;
    const Device gpu = Device::Cuda(0);
    ctx_ = DeviceContext::Create(gpu);
    ctx_->set_matmul_dtype(bf16 ? DType::kBF16 : DType::kF32);
    x_ = Tensor::Empty({r_, d_}, stored, gpu), w_ = Tensor::Empty({e_, d_, f_}, stored, gpu);
    dy_ = Tensor::Empty({r_, f_}, stored, gpu);
    const uint64_t s = static_cast<uint64_t>(seed_);
    kernels::FillUniform(x_, RngKey{s, 1}, 0, -1.0f, 1.0f, ctx());
    kernels::FillUniform(w_, RngKey{s, 2}, 0, -1.0f, 1.0f, ctx());
    kernels::FillUniform(dy_, RngKey{s, 3}, 0, -1.0f, 1.0f, ctx());
    out_ = Tensor::Empty({r_, f_}, DType::kF32, gpu), dx_ = Tensor::Empty({r_, d_}, DType::kF32, gpu);
    dw_ = Tensor::Empty({e_, d_, f_}, DType::kF32, gpu);
    const Tensor w0 = w_.View({d_, f_});  // the dense products' weight: expert 0's
    Tensor dw0 = dw_.View({d_, f_});
    DeviceContext* c = ctx();
    grouped_ = {[this, c] { kernels::GroupedGemm(x_, rows_, w_, false, out_, 1.0f, 0.0f, c); },
                [this, c] { kernels::GroupedGemm(dy_, rows_, w_, true, dx_, 1.0f, 0.0f, c); },
                [this, c] { kernels::GroupedGemmWeightGrad(x_, dy_, rows_, dw_, 1.0f, 0.0f, c); }};
    // The same products with the sizes as offsets on the device (uploaded once, as the MoE
    // layer's dispatch leaves them there).
    std::vector<int64_t> offsets(1, 0);
    for (int64_t n : rows_) offsets.push_back(offsets.back() + n);
    offsets_ = Tensor::FromVector(offsets, {e_ + 1}).To(gpu, c);
    device_sized_ = {
        [this, c] { kernels::GroupedGemm(x_, offsets_, w_, false, out_, 1.0f, 0.0f, c); },
        [this, c] { kernels::GroupedGemm(dy_, offsets_, w_, true, dx_, 1.0f, 0.0f, c); },
        [this, c] { kernels::GroupedGemmWeightGrad(x_, dy_, offsets_, dw_, 1.0f, 0.0f, c); }};
    dense_ = {[this, c, w0] { kernels::Gemm(x_, false, w0, false, out_, 1.0f, 0.0f, c); },
              [this, c, w0] { kernels::Gemm(dy_, false, w0, true, dx_, 1.0f, 0.0f, c); },
              [this, c, dw0]() mutable { kernels::Gemm(x_, true, dy_, false, dw0, 1.0f, 0.0f, c); }};
    if (check) {
      xv_ = HostValues(x_, cast_ != 0, c), wv_ = HostValues(w_, cast_ != 0, c);
      dyv_ = HostValues(dy_, cast_ != 0, c);
    }
  }

  // The GPU and the rows per expert, above the table.
  void PrintSetting(Harness& h) {
    cudaDeviceProp prop{};
    SY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    gpu_name_ = prop.name;
    int64_t min_rows = r_, max_rows = 0;
    for (int64_t n : rows_) min_rows = std::min(min_rows, n), max_rows = std::max(max_rows, n);
    h.Printf("# GPU %s; R=%lld rows over E=%lld experts (%s): min %lld, mean %.1f, max %lld "
             "rows per expert\n# dtype %s%s, d=%lld, f=%lld\n#\n",
             prop.name, static_cast<long long>(r_), static_cast<long long>(e_),
             spec_.Name().c_str(), static_cast<long long>(min_rows),
             static_cast<double>(r_) / e_, static_cast<long long>(max_rows), dtype_text_.c_str(),
             cast_ ? " (f32 operands cast every call)" : "", static_cast<long long>(d_),
             static_cast<long long>(f_));
  }

  // n values of `t` from `offset`, on the host.
  std::vector<float> RowOf(const Tensor& t, int64_t offset, int64_t n) const {
    return t.View({n}, offset).To(Device::Cpu(), ctx()).ToVector<float>();
  }

  // fwd (out[i, :] = x[i, :] @ w[g]) or dx (dx[i, p] = sum_j dy[i, j] w[g][p, j]) on the
  // first and last row of every expert's block.
  int64_t CheckRows(Op op) const {
    int64_t wrong = 0, begin = 0;
    for (int64_t g = 0; g < e_; ++g) {
      const float* wg = wv_.data() + g * d_ * f_;  // (d, f)
      for (int64_t i : {begin, begin + rows_[g] - 1}) {
        if (rows_[g] == 0 || (i == begin + rows_[g] - 1 && rows_[g] == 1)) continue;
        Expected want(op == kFwd ? f_ : d_);
        for (int64_t p = 0; p < d_; ++p) {
          for (int64_t j = 0; j < f_; ++j) {
            if (op == kFwd) want.Add(j, xv_[i * d_ + p], wg[p * f_ + j]);
            if (op == kDx) want.Add(p, dyv_[i * f_ + j], wg[p * f_ + j]);
          }
        }
        wrong += op == kFwd ? CountWrong(RowOf(out_, i * f_, f_), want.want, want.mag)
                            : CountWrong(RowOf(dx_, i * d_, d_), want.want, want.mag);
      }
      begin += rows_[g];
    }
    return wrong;
  }

  // dw[g][p, :] = sum over the block's rows i of x[i, p] dy[i, :] (0 for no rows), on the
  // first and last row of every dw[g].
  int64_t CheckWeightGrad() const {
    int64_t wrong = 0, begin = 0;
    for (int64_t g = 0; g < e_; ++g) {
      for (int64_t p : {int64_t{0}, d_ - 1}) {
        if (p == d_ - 1 && d_ == 1) continue;
        Expected want(f_);
        for (int64_t i = begin; i < begin + rows_[g]; ++i) {
          for (int64_t j = 0; j < f_; ++j) want.Add(j, xv_[i * d_ + p], dyv_[i * f_ + j]);
        }
        wrong += CountWrong(RowOf(dw_, (g * d_ + p) * f_, f_), want.want, want.mag);
      }
      begin += rows_[g];
    }
    return wrong;
  }

  int tokens_ = 16384, hidden_ = 4096, ffn_ = 14336, experts_ = 8, topk_ = 2, hot_ = 0, seed_ = 1;
  int cast_ = 0;
  std::string dtype_text_ = "bf16", skew_text_, hot_share_text_ = "0.75";
  RoutingSpec spec_;
  int64_t r_ = 0, d_ = 0, f_ = 0, e_ = 0;
  std::vector<int64_t> rows_;
  std::unique_ptr<DeviceContext> ctx_;
  Tensor x_, w_, dy_, out_, dx_, dw_, offsets_;
  std::vector<std::function<void()>> grouped_, device_sized_, dense_;
  std::vector<float> xv_, wv_, dyv_;
  std::string gpu_name_;
  // Per Sizes: milliseconds of the grouped and the dense products, their flops, #wrong.
  struct Totals {
    double grouped = 0, dense = 0, flop = 0;
    int64_t wrong = 0;
  };
  Totals totals_[kSizes];
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::GroupedGemmGpuPerf>(
      argc, argv, "grouped_gemm_gpu_perf",
      "MoE expert GEMMs on one GPU: grouped (one cuBLAS GEMM per expert, or one kernel with "
      "the group sizes on the device) against one dense GEMM of the same size, forward and "
      "backward.");
}
