// permute_gpu_perf: the MoE token permutation on one GPU (kernels/permute.h) against the
// device's memory bandwidth. N tokens of d f32 values, top-k routing over E experts
// (uniform, or --skew / --hot as benchmarks/routing.h draws), optional capacity:
//
//   op           what                                             bytes moved (read + write)
//   sort         SortAssignments: CUB radix sort by expert, then   N k (4 + 1) + 3 N k 8
//                the (E) counts copied to the host (a wait)        (its interface only; the
//                                                                  sort's own passes and the
//                                                                  host copy are not counted)
//   permute      GatherRows h (N, d) -> rows (A, d)               A d 4 + A 8 + A d 4
//   combine      Combine rows (A, d), gates -> y (N, d)           A d 4 + N k 12 + N d 4
//   combine_bwd  CombineBackward: dout (A, d), dgates (N, k)      2 A d 4 + A 12 + A d 4 + N k 4
//   permute_bwd  ScatterAddRows drows (A, d) written into dh      A d 4 + N k 8 + N d 4
//                (N, d) (Write::kSet, training's: dh not read)
//   memcpy       cudaMemcpyAsync device to device of A d 4 bytes  2 A d 4 (the reference)
//
//   time     microseconds per call, CUDA events around -n calls in 5 blocks that alternate
//            the ops (so all see the same clocks), after -w warm-up calls; median block
//   GB/s     bytes moved / time (10^9 bytes/s)
//   %peak    of the theoretical peak, memory clock x 2 (DDR) x bus width / 8
//   %copy    of the measured device-to-device cudaMemcpy bandwidth (the memcpy row)
//   #wrong   with --check 1, values that differ from the CPU reference ops on the same
//            inputs: integers and copies exactly, sums beyond 1e-6 (1 + |cpu|)
//
// Without a CUDA device it prints that it needs one and exits with status 2.
#include <cuda_runtime.h>

#include <algorithm>
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
#include "kernels/permute.h"
#include "kernels/random.h"

namespace switchyard::bench {
namespace {

// Values of `got` (any device) that differ from `want` (host): exactly, or beyond
// 1e-6 (1 + |want|) when `tolerant`.
template <typename T>
int64_t CountWrong(const Tensor& got, const Tensor& want, bool tolerant, DeviceContext* ctx) {
  const std::vector<T> g = got.To(Device::Cpu(), ctx).ToVector<T>(), w = want.ToVector<T>();
  if (g.size() != w.size()) return static_cast<int64_t>(std::max(g.size(), w.size()));
  int64_t wrong = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (tolerant) {
      const double diff = std::fabs(static_cast<double>(g[i]) - static_cast<double>(w[i]));
      wrong += !(diff <= 1e-6 * (1.0 + std::fabs(static_cast<double>(w[i]))));  // NaN is wrong
    } else {
      wrong += g[i] != w[i];
    }
  }
  return wrong;
}

// One op of the table: its name, the bytes it moves and its call.
struct Op {
  const char* name;
  double bytes;
  std::function<void()> call;
};

class PermuteGpuPerf final : public Benchmark {
 public:
  void AddFlags(cli::FlagSet& flags) override {
    flags.AddInt("tokens", &tokens_, "N tokens (default 16384)");
    flags.AddInt("hidden", &hidden_, "d, f32 values per token (default 4096)");
    flags.AddInt("experts", &experts_, "E (default 8)");
    flags.AddInt("topk", &topk_, "k experts per token (default 2)");
    flags.AddString("skew", &skew_text_, "Zipf routing: expert e chosen ~ 1/(e+1)^s");
    flags.AddInt("hot", &hot_, "1: expert 0 gets --hot_share of the assignments");
    flags.AddString("hot_share", &hot_share_text_, "the hot expert's share (default 0.75)");
    flags.AddString("capacity", &capacity_text_,
                    "capacity factor (position policy, one group); 0 = dropless (default)");
    flags.AddInt("seed", &seed_, "seed of the routing draw and the inputs (default 1)");
  }

  // The flags, the routing, the inputs; every op timed in the same blocks (the memcpy row
  // is the reference the lines above the table quote) and checked.
  Status Setup(Harness& h) override {
    if (tokens_ < 1 || hidden_ < 1) return InvalidArgument("--tokens and --hidden must be >= 1");
    if (experts_ < 1 || topk_ < 1 || topk_ > experts_) {
      return InvalidArgument("--experts=", experts_, " and --topk=", topk_,
                             " need 1 <= topk <= experts");
    }
    SY_ASSIGN_OR_RETURN(cf_, ParseDouble("capacity", capacity_text_));
    SY_ASSIGN_OR_RETURN(spec_,
                        RoutingSpecFromFlags(skew_text_, hot_, hot_share_text_, experts_, seed_));
    if (!CudaAvailable()) {
      return absl::UnavailableError("needs a CUDA device and none is visible; nothing was measured");
    }
    if (h.ranks() != 1) return InvalidArgument("runs as one process on one GPU (no mpirun)");
    n_ = tokens_, d_ = hidden_, k_ = topk_, e_ = experts_;
    MakeInputs();
    MakeOps();
    std::vector<std::function<void()>> calls;
    for (const Op& op : ops_) calls.push_back(op.call);
    us_ = TimeGpuOps(calls, h.options().iters, h.options().warmup, ctx());
    for (double& t : us_) t *= 1e3;  // ms -> us
    copy_gbs_ = ops_.back().bytes / (us_.back() * 1e-6) / 1e9;
    wrong_.assign(ops_.size(), 0);
    if (h.options().check) Check();
    PrintSetting(h);
    return OkStatus();
  }

  Table MakeTable(Harness& h) override {
    return Table({{{"op", "", 12, 0}, {"bytes", "(MB)", 10, 1}},
                  {{"time", "(us)", 10, 1},
                   {"GB/s", "", 8, 0},
                   {"%peak", "", 6, 1},
                   {"%copy", "", 6, 1},
                   {"#wrong", "", 7, 0}}},
                 h.printing());
  }

  // One row per op.
  int NumCases() const override { return static_cast<int>(ops_.size()); }

  StatusOr<int64_t> RunCase(Harness& h, int index, Table& table) override {
    const Op& op = ops_[index];
    const double us = us_[index], gbs = op.bytes / (us * 1e-6) / 1e9;
    table.AddRow({std::string(op.name), op.bytes / 1e6, us, gbs, 100.0 * gbs / peak_gbs_,
                  100.0 * gbs / copy_gbs_, wrong_[index]});
    per_op_[op.name] = {{"bytes", op.bytes}, {"time_us", us}, {"gbs", gbs}};
    return wrong_[index];
  }

  nlohmann::json Extra(const Harness& h) const override {
    return {{"gpu", gpu_name_},     {"peak_gbs", peak_gbs_},  {"memcpy_gbs", copy_gbs_},
            {"tokens", tokens_},    {"hidden", hidden_},      {"experts", experts_},
            {"topk", topk_},        {"capacity", cf_},        {"routing", spec_.Name()},
            {"kept_rows", a_},      {"ops", per_op_},
            {"timing", "CUDA events, us per call, median of 5 blocks"}};
  }

 private:
  DeviceContext* ctx() const { return ctx_.get(); }

  // Routing, then capacity admission in GShard's position order (slot, then token); the
  // host copies (for the check) and device tensors; the sort, and the permuted rows.
  void MakeInputs() {
    const int64_t nk = n_ * k_;
    const std::vector<int32_t> choice = DrawTopK(spec_, n_, k_, 0);
    std::vector<uint8_t> kept(nk, 1);
    if (cf_ > 0) {
      const int64_t capacity = static_cast<int64_t>(std::ceil(cf_ * static_cast<double>(nk) / e_));
      std::vector<int64_t> taken(e_, 0);
      for (int64_t j = 0; j < k_; ++j) {
        for (int64_t t = 0; t < n_; ++t) kept[t * k_ + j] = taken[choice[t * k_ + j]]++ < capacity;
      }
    }
    const Device gpu = Device::Cuda(0);
    ctx_ = DeviceContext::Create(gpu);
    const uint64_t s = static_cast<uint64_t>(seed_);
    experts_host_ = Tensor::FromVector(choice, {n_, k_});
    kept_host_ = Tensor::FromVector(kept, {n_, k_});
    h_host_ = Tensor::Empty({n_, d_}, DType::kF32), dy_host_ = Tensor::Empty({n_, d_}, DType::kF32);
    gates_host_ = Tensor::Empty({n_, k_}, DType::kF32);
    kernels::FillUniform(h_host_, RngKey{s, 1}, 0, -1.0f, 1.0f);
    kernels::FillUniform(dy_host_, RngKey{s, 2}, 0, -1.0f, 1.0f);
    kernels::FillUniform(gates_host_, RngKey{s, 3}, 0, 0.0f, 1.0f);
    experts_dev_ = experts_host_.To(gpu, ctx()), kept_dev_ = kept_host_.To(gpu, ctx());
    h_dev_ = h_host_.To(gpu, ctx()), dy_dev_ = dy_host_.To(gpu, ctx());
    gates_dev_ = gates_host_.To(gpu, ctx());
    token_ = Tensor::Empty({nk}, DType::kI64, gpu);
    slot_ = Tensor::Empty({nk}, DType::kI64, gpu);
    inverse_ = Tensor::Empty({nk}, DType::kI64, gpu);
    for (int64_t c : kernels::SortAssignments(experts_dev_, kept_dev_, e_, token_, slot_, inverse_,
                                              ctx())) {
      a_ += c;
    }
    token_a_ = token_.Slice(0, a_), slot_a_ = slot_.Slice(0, a_);
    inverse_nk_ = inverse_.Reshape({n_, k_});
    rows_ = Tensor::Empty({a_, d_}, DType::kF32, gpu);  // permuted rows, then expert outputs
    y_ = Tensor::Empty({n_, d_}, DType::kF32, gpu);
    dout_ = Tensor::Empty({a_, d_}, DType::kF32, gpu);
    dgates_ = Tensor::Empty({n_, k_}, DType::kF32, gpu);
    dh_ = Tensor::Zeros({n_, d_}, DType::kF32, gpu, ctx());
    copy_ = Tensor::Empty({a_, d_}, DType::kF32, gpu);
    kernels::GatherRows(h_dev_, token_a_, rows_, ctx());
  }

  // The ops and the bytes each moves (the file comment).
  void MakeOps() {
    const double rows_bytes = 4.0 * a_ * d_, token_bytes = 4.0 * n_ * d_, nk = n_ * k_;
    DeviceContext* c = ctx();
    ops_ = {{"sort", nk * (4.0 + 1.0) + 3.0 * nk * 8,
             [this, c] {
               kernels::SortAssignments(experts_dev_, kept_dev_, e_, token_, slot_, inverse_, c);
             }},
            {"permute", 2 * rows_bytes + 8.0 * a_,
             [this, c] { kernels::GatherRows(h_dev_, token_a_, rows_, c); }},
            {"combine", rows_bytes + 12.0 * nk + token_bytes,
             [this, c] { kernels::Combine(rows_, gates_dev_, inverse_nk_, Tensor(), y_, c); }},
            {"combine_bwd", 3 * rows_bytes + 12.0 * a_ + 4.0 * nk,
             [this, c] {
               kernels::CombineBackward(dy_dev_, rows_, gates_dev_, slot_a_, dout_, dgates_, c);
             }},
            {"permute_bwd", rows_bytes + token_bytes + 8.0 * nk,
             [this, c] { kernels::ScatterAddRows(rows_, inverse_nk_, dh_, kernels::Write::kSet, c); }},
            {"memcpy", 2 * rows_bytes, [this] { Copy(); }}};
  }

  // The memcpy row: rows to copy, device to device.
  void Copy() {
    if (a_ > 0) {
      SY_CUDA_CHECK(cudaMemcpyAsync(copy_.raw_data(), rows_.raw_data(), copy_.nbytes(),
                                    cudaMemcpyDeviceToDevice,
                                    static_cast<cudaStream_t>(ctx()->stream())));
    }
  }

  // Every op once more on fresh outputs, against the CPU ops on the same inputs: wrong_.
  void Check() {
    const int64_t nk = n_ * k_;
    Tensor tok_c = Tensor::Empty({nk}, DType::kI64), slot_c = Tensor::Empty({nk}, DType::kI64),
           inv_c = Tensor::Empty({nk}, DType::kI64);
    const std::vector<int64_t> counts_c =
        kernels::SortAssignments(experts_host_, kept_host_, e_, tok_c, slot_c, inv_c);
    const std::vector<int64_t> counts_g =
        kernels::SortAssignments(experts_dev_, kept_dev_, e_, token_, slot_, inverse_, ctx());
    for (int64_t i = 0; i < e_; ++i) wrong_[0] += counts_c[i] != counts_g[i];
    wrong_[0] += CountWrong<int64_t>(token_, tok_c, false, ctx()) +
                 CountWrong<int64_t>(slot_, slot_c, false, ctx()) +
                 CountWrong<int64_t>(inverse_, inv_c, false, ctx());
    const Tensor inv_c_nk = inv_c.Reshape({n_, k_});

    Tensor rows_c = Tensor::Empty({a_, d_}, DType::kF32);
    kernels::GatherRows(h_host_, tok_c.Slice(0, a_), rows_c);
    kernels::GatherRows(h_dev_, token_a_, rows_, ctx());
    wrong_[1] = CountWrong<float>(rows_, rows_c, false, ctx());

    Tensor y_c = Tensor::Empty({n_, d_}, DType::kF32);
    kernels::Combine(rows_c, gates_host_, inv_c_nk, Tensor(), y_c);
    kernels::Combine(rows_, gates_dev_, inverse_nk_, Tensor(), y_, ctx());
    wrong_[2] = CountWrong<float>(y_, y_c, true, ctx());

    Tensor dout_c = Tensor::Empty({a_, d_}, DType::kF32);
    Tensor dgates_c = Tensor::Empty({n_, k_}, DType::kF32);
    kernels::CombineBackward(dy_host_, rows_c, gates_host_, slot_c.Slice(0, a_), dout_c, dgates_c);
    kernels::CombineBackward(dy_dev_, rows_, gates_dev_, slot_a_, dout_, dgates_, ctx());
    wrong_[3] = CountWrong<float>(dout_, dout_c, true, ctx()) +
                CountWrong<float>(dgates_, dgates_c, true, ctx());

    Tensor dh_c = dy_host_.Clone();
    Tensor dh_g = dy_dev_.Clone(ctx());
    kernels::ScatterAddRows(rows_c, inv_c_nk, dh_c, kernels::Write::kSet);
    kernels::ScatterAddRows(rows_, inverse_nk_, dh_g, kernels::Write::kSet, ctx());
    wrong_[4] = CountWrong<float>(dh_g, dh_c, true, ctx());

    kernels::GatherRows(h_dev_, token_a_, rows_, ctx());
    SY_CUDA_CHECK(cudaMemcpyAsync(copy_.raw_data(), rows_.raw_data(), copy_.nbytes(),
                                  cudaMemcpyDeviceToDevice,
                                  static_cast<cudaStream_t>(ctx()->stream())));
    wrong_[5] = CountWrong<float>(copy_, rows_c, false, ctx());
  }

  // The GPU, its peak and measured copy bandwidth, and the routing, above the table.
  void PrintSetting(Harness& h) {
    cudaDeviceProp prop{};
    SY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
    gpu_name_ = prop.name;
    int mem_clock_khz = 0, bus_bits = 0;
    SY_CUDA_CHECK(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0));
    SY_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
    peak_gbs_ = 1e3 * mem_clock_khz * 2.0 * (bus_bits / 8.0) / 1e9;
    h.Printf(
        "# GPU %s: peak memory bandwidth %.0f GB/s (memory clock %d MHz x 2 x %d-bit bus), "
        "measured device-to-device cudaMemcpy %.0f GB/s\n"
        "# N=%lld tokens, d=%lld (f32 rows), E=%lld, top-%lld, routing %s, capacity %s: "
        "A=%lld rows kept (%.1f%% dropped)\n#\n",
        prop.name, peak_gbs_, mem_clock_khz / 1000, bus_bits, copy_gbs_,
        static_cast<long long>(n_), static_cast<long long>(d_), static_cast<long long>(e_),
        static_cast<long long>(k_), spec_.Name().c_str(),
        cf_ > 0 ? capacity_text_.c_str() : "dropless", static_cast<long long>(a_),
        100.0 * (1.0 - static_cast<double>(a_) / static_cast<double>(n_ * k_)));
  }

  int tokens_ = 16384, hidden_ = 4096, experts_ = 8, topk_ = 2, hot_ = 0, seed_ = 1;
  std::string skew_text_, hot_share_text_ = "0.75", capacity_text_ = "0";
  double cf_ = 0;
  RoutingSpec spec_;
  int64_t n_ = 0, d_ = 0, k_ = 0, e_ = 0, a_ = 0;  // a_: the rows kept
  std::unique_ptr<DeviceContext> ctx_;
  Tensor experts_host_, kept_host_, h_host_, dy_host_, gates_host_;
  Tensor experts_dev_, kept_dev_, h_dev_, dy_dev_, gates_dev_;
  Tensor token_, slot_, inverse_, token_a_, slot_a_, inverse_nk_;
  Tensor rows_, y_, dout_, dgates_, dh_, copy_;
  std::vector<Op> ops_;
  std::vector<double> us_;
  std::vector<int64_t> wrong_;
  double copy_gbs_ = 0, peak_gbs_ = 0;
  std::string gpu_name_;
  nlohmann::json per_op_ = nlohmann::json::object();
};

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) {
  return switchyard::bench::RunBenchmark<switchyard::bench::PermuteGpuPerf>(
      argc, argv, "permute_gpu_perf",
      "MoE token permutation on one GPU (sort, permute, combine and their backward) "
      "against the device's memory bandwidth.");
}
