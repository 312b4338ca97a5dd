// attention_gpu_perf: causal attention on one GPU, the fused bf16 kernel
// (kernels/cuda/flash_attention.cu, selected by a bf16 DeviceContext) against the exact f32
// path (cuBLAS per head, S x S scores in scratch), forward and backward, per sequence length:
//
//   q (B, S, Hq, hd), k and v (B, S, Hkv, hd), dout like q, uniform in [-1, 1)
//   fwd    kernels::AttentionForward (out, lse)
//   bwd    kernels::AttentionBackward given delta (AttentionBackwardDelta, outside the timing),
//          as dense/attention.cc calls it
//
//   time     ms per call, CUDA events around -n calls in 5 blocks that alternate fused and
//            exact (so both see the same clocks), after -w warm-up calls; median block
//   TFLOP/s  the causal half's useful work: forward 2 B Hq S^2 hd (q k^T and p v over the
//            S (S + 1) / 2 ~ S^2 / 2 pairs), backward 2.5 x that (FlashAttention-2's count:
//            five products, of which the fused kernel runs seven with its two passes)
//   speedup  exact time / fused time
//   relerr   ||fused - exact|| / ||exact|| over out (fwd) and over dq, dk, dv (bwd, the
//            largest): bf16 operands put it near 2^-9; a broken kernel near 1
//   #wrong   with --check 1: non-finite values, plus one per tensor whose relerr exceeds
//            2^-5 (a sanity check; tests/gpu/flash_attention_gpu_test.cc holds the kernel
//            to its bound against the CPU twin)
//
// Without a CUDA device it prints that it needs one and exits with status 2.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "benchmarks/benchmark.h"
#include "benchmarks/gpu_timing.h"
#include "engine/core/cuda_check.h"
#include "engine/core/device.h"
#include "engine/core/device_context.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/flash_attention.h"
#include "kernels/random.h"

namespace switchyard::bench {
namespace {

constexpr double kSanityRelErr = 1.0 / 32;

// ||got - want|| / ||want|| (both on the device), and the count of non-finite values of got.
struct Compare {
  double rel = 0;
  int64_t nonfinite = 0;
};
Compare CompareTensors(const Tensor& got, const Tensor& want, DeviceContext* ctx) {
  const std::vector<float> g = got.To(Device::Cpu(), ctx).ToVector<float>();
  const std::vector<float> w = want.To(Device::Cpu(), ctx).ToVector<float>();
  double diff = 0, norm = 0;
  Compare c;
  for (size_t i = 0; i < g.size(); ++i) {
    if (!std::isfinite(g[i])) ++c.nonfinite;
    diff += (static_cast<double>(g[i]) - w[i]) * (static_cast<double>(g[i]) - w[i]);
    norm += static_cast<double>(w[i]) * w[i];
  }
  c.rel = norm > 0 ? std::sqrt(diff / norm) : std::sqrt(diff);
  return c;
}

class AttentionGpuPerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    flags.AddInt("batch", &batch_, "B (default 4)");
    flags.AddString("seq_lens", &seq_lens_text_,
                    "S values, comma-separated (default 512,1024,2048)");
    flags.AddInt("heads", &heads_, "Hq (default 16)");
    flags.AddInt("kv_heads", &kv_heads_, "Hkv, dividing Hq; 0 means Hq (default 0)");
    flags.AddInt("head_dim", &head_dim_, "hd: 64 or 128, the fused kernel's widths (default 128)");
    flags.AddInt("seed", &seed_, "seed of the inputs (default 1)");
    flags.AddInt("bf16_inputs", &bf16_inputs_,
                 "1: the fused side reads q, k and v in bf16, as the attention layer hands them "
                 "over under bf16 activation storage (cast once, outside the timing); 0: f32 "
                 "(default 0)");
  }

  Status Setup(Harness& h) override {
    if (kv_heads_ == 0) kv_heads_ = heads_;
    if (batch_ < 1 || heads_ < 1 || kv_heads_ < 1 || heads_ % kv_heads_ != 0) {
      return InvalidArgument("--batch=", batch_, ", --heads=", heads_, " and --kv_heads=",
                             kv_heads_, " need B >= 1 and Hkv dividing Hq");
    }
    if (!kernels::FlashAttentionSupports(head_dim_)) {
      return InvalidArgument("--head_dim=", head_dim_, ": the fused kernel takes 64 or 128");
    }
    for (const std::string& text : SplitList(seq_lens_text_)) {
      const int s = std::atoi(text.c_str());
      if (s < 1) return InvalidArgument("--seq_lens: \"", text, "\" is not a length >= 1");
      seq_lens_.push_back(s);
    }
    if (seq_lens_.empty()) return InvalidArgument("--seq_lens is empty");
    if (!CudaAvailable()) {
      return absl::UnavailableError(
          "needs a CUDA device and none is visible; nothing was measured");
    }
    if (h.ranks() != 1) return InvalidArgument("runs as one process on one GPU (no mpirun)");
    ctx_ = DeviceContext::Create(Device::Cuda(0));
    cudaDeviceProp prop{};
    SY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    gpu_name_ = prop.name;
    h.Printf("# GPU %s; B=%d Hq=%d Hkv=%d hd=%d, causal; fused = bf16 operands on tensor cores, "
             "exact = f32; the fused side's q, k, v in %s\n#\n",
             prop.name, batch_, heads_, kv_heads_, head_dim_, bf16_inputs_ ? "bf16" : "f32");
    return OkStatus();
  }

  Table MakeTable(Harness& h) override {
    return Table({{{"S", "", 6, 0}},
                  {{"fused_fwd", "(ms)", 10, 3},
                   {"fwd_tflops", "(TFLOP/s)", 10, 1},
                   {"exact_fwd", "(ms)", 10, 3},
                   {"fwd_speedup", "", 11, 2},
                   {"fwd_relerr", "", 10, 5}},
                  {{"fused_bwd", "(ms)", 10, 3},
                   {"bwd_tflops", "(TFLOP/s)", 10, 1},
                   {"exact_bwd", "(ms)", 10, 3},
                   {"bwd_speedup", "", 11, 2},
                   {"bwd_relerr", "", 10, 5},
                   {"#wrong", "", 6, 0}}},
                 h.printing());
  }

  int NumCases() const override { return static_cast<int>(seq_lens_.size()); }

  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    const int64_t b = batch_, s = seq_lens_[index], hq = heads_, hkv = kv_heads_, hd = head_dim_;
    DeviceContext* c = ctx_.get();
    const Device gpu = c->device();
    const Shape q_shape{b, s, hq, hd}, kv_shape{b, s, hkv, hd}, l_shape{b, hq, s};
    auto uniform = [&](const Shape& shape, uint64_t stream) {
      Tensor t = Tensor::Empty(shape, DType::kF32, gpu);
      kernels::FillUniform(t, RngKey{static_cast<uint64_t>(seed_), stream}, 0, -1.0f, 1.0f, c);
      return t;
    };
    Tensor q = uniform(q_shape, 1), k = uniform(kv_shape, 2), v = uniform(kv_shape, 3);
    Tensor dout = uniform(q_shape, 4);
    // The fused side's q, k, v: the same tensors, or their bf16 values (--bf16_inputs).
    auto fused_input = [&](const Tensor& t) {
      if (bf16_inputs_ == 0) return t;
      Tensor t16 = Tensor::Empty(t.shape(), DType::kBF16, gpu);
      kernels::Cast(t, t16, c);
      return t16;
    };
    const Tensor in[2][3] = {{fused_input(q), fused_input(k), fused_input(v)}, {q, k, v}};
    // [0]: fused, [1]: exact.
    Tensor out[2], lse[2], delta[2], dq[2], dk[2], dv[2];
    for (int p = 0; p < 2; ++p) {
      out[p] = Tensor::Empty(q_shape, DType::kF32, gpu);
      lse[p] = Tensor::Empty(l_shape, DType::kF32, gpu);
      delta[p] = Tensor::Empty(l_shape, DType::kF32, gpu);
      dq[p] = Tensor::Empty(q_shape, DType::kF32, gpu);
      dk[p] = Tensor::Empty(kv_shape, DType::kF32, gpu);
      dv[p] = Tensor::Empty(kv_shape, DType::kF32, gpu);
    }
    auto precision = [c](int p) { c->set_matmul_dtype(p == 0 ? DType::kBF16 : DType::kF32); };
    auto forward = [&](int p) {
      precision(p);
      kernels::AttentionForward(in[p][0], in[p][1], in[p][2], out[p], lse[p], c);
    };
    auto backward = [&](int p) {
      precision(p);
      kernels::AttentionBackward(in[p][0], in[p][1], in[p][2], lse[p], dout, dq[p], dk[p],
                                 dv[p], c, kernels::AttentionMask::kCausal, delta[p]);
    };
    const int iters = h.options().iters, warmup = h.options().warmup;
    const std::vector<double> tf = TimeGpuOps({[&] { forward(0); }, [&] { forward(1); }}, iters,
                                              warmup, c);
    for (int p = 0; p < 2; ++p) kernels::AttentionBackwardDelta(out[p], dout, delta[p], c);
    const std::vector<double> tb = TimeGpuOps({[&] { backward(0); }, [&] { backward(1); }}, iters,
                                              warmup, c);
    c->Synchronize();

    double fwd_rel = 0, bwd_rel = 0;
    int64_t wrong = 0;
    if (h.options().check) {
      const Compare o = CompareTensors(out[0], out[1], c);
      fwd_rel = o.rel;
      wrong += o.nonfinite + (o.rel > kSanityRelErr);
      for (Tensor* t : {dq, dk, dv}) {
        const Compare g = CompareTensors(t[0], t[1], c);
        bwd_rel = std::max(bwd_rel, g.rel);
        wrong += g.nonfinite + (g.rel > kSanityRelErr);
      }
    }
    const double fwd_flop = 2.0 * b * hq * static_cast<double>(s) * s * hd;
    const double bwd_flop = 2.5 * fwd_flop;
    table.AddRow({s, tf[0], fwd_flop / (tf[0] * 1e-3) / 1e12, tf[1], tf[1] / tf[0], fwd_rel,
                  tb[0], bwd_flop / (tb[0] * 1e-3) / 1e12, tb[1], tb[1] / tb[0], bwd_rel, wrong});
    last_ = {static_cast<double>(s), fwd_flop / (tf[0] * 1e-3) / 1e12, tf[1] / tf[0],
             bwd_flop / (tb[0] * 1e-3) / 1e12, tb[1] / tb[0]};
    return wrong;
  }

  // One line for scripts/gpu_run.sh's summary: the longest sequence's figures.
  void Conclude(Harness& h, Table& table) override {
    h.Printf("# summary: S=%.0f fused fwd %.1f TFLOP/s (%.2fx exact), "
             "bwd %.1f TFLOP/s (%.2fx exact)\n",
             last_[0], last_[1], last_[2], last_[3], last_[4]);
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"gpu", gpu_name_},
            {"batch", batch_},
            {"heads", heads_},
            {"kv_heads", kv_heads_},
            {"head_dim", head_dim_},
            {"bf16_inputs", bf16_inputs_},
            {"timing", "CUDA events, ms per call, median of 5 blocks"},
            {"flops", "causal: forward 2 B Hq S^2 hd, backward 2.5 x forward"}};
  }

 private:
  int batch_ = 4, heads_ = 16, kv_heads_ = 0, head_dim_ = 128, seed_ = 1, bf16_inputs_ = 0;
  std::string seq_lens_text_ = "512,1024,2048";
  std::vector<int> seq_lens_;
  std::unique_ptr<DeviceContext> ctx_;
  std::string gpu_name_;
  std::vector<double> last_ = std::vector<double>(5, 0.0);  // S, fwd TFLOP/s, x, bwd, x
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::AttentionGpuPerf>(
      argc, argv, "attention_gpu_perf",
      "Causal attention on one GPU: the fused bf16 tensor-core kernel against the exact f32 "
      "path, forward and backward.");
}
