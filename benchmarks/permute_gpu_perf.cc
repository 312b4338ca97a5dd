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
//   permute_bwd  ScatterAddRows drows (A, d) into dh (N, d)       A d 4 + N d 4 + N k 8 + N d 4
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
#include "benchmarks/harness.h"
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

int Main(int argc, char** argv) {
  Harness h("permute_gpu_perf",
            "MoE token permutation on one GPU (sort, permute, combine and their backward) "
            "against the device's memory bandwidth.",
            {});
  int tokens = 16384, hidden = 4096, experts = 8, topk = 2, hot = 0, seed = 1;
  std::string skew_text, hot_share_text = "0.75", capacity_text = "0";
  h.flags().AddInt("tokens", &tokens, "N tokens (default 16384)");
  h.flags().AddInt("hidden", &hidden, "d, f32 values per token (default 4096)");
  h.flags().AddInt("experts", &experts, "E (default 8)");
  h.flags().AddInt("topk", &topk, "k experts per token (default 2)");
  h.flags().AddString("skew", &skew_text, "Zipf routing: expert e chosen ~ 1/(e+1)^s");
  h.flags().AddInt("hot", &hot, "1: expert 0 gets --hot_share of the assignments");
  h.flags().AddString("hot_share", &hot_share_text, "the hot expert's share (default 0.75)");
  h.flags().AddString("capacity", &capacity_text,
                      "capacity factor (position policy, one group); 0 = dropless (default)");
  h.flags().AddInt("seed", &seed, "seed of the routing draw and the inputs (default 1)");
  if (auto code = h.Start(argc, argv)) return *code;

  if (tokens < 1 || hidden < 1) return h.Fail("--tokens and --hidden must be >= 1");
  if (experts < 1 || topk < 1 || topk > experts) {
    return h.Fail(StrCat("--experts=", experts, " and --topk=", topk,
                         " need 1 <= topk <= experts"));
  }
  StatusOr<double> cf = ParseDouble("capacity", capacity_text);
  if (!cf.ok()) return h.Fail(Message(cf.status()));
  StatusOr<RoutingSpec> spec = RoutingSpecFromFlags(skew_text, hot, hot_share_text, experts, seed);
  if (!spec.ok()) return h.Fail(Message(spec.status()));
  if (!CudaAvailable()) {
    std::fprintf(stderr,
                 "permute_gpu_perf: needs a CUDA device and none is visible; nothing was "
                 "measured\n");
    return cli::kExitUsage;
  }
  if (h.ranks() != 1) return h.Fail("runs as one process on one GPU (no mpirun)");

  const int64_t n = tokens, d = hidden, k = topk, e = experts, nk = n * k;
  // Routing, then capacity admission in GShard's position order (slot, then token).
  const std::vector<int32_t> choice = DrawTopK(*spec, n, k, 0);
  std::vector<uint8_t> kept(nk, 1);
  if (*cf > 0) {
    const int64_t capacity = static_cast<int64_t>(std::ceil(*cf * static_cast<double>(nk) / e));
    std::vector<int64_t> taken(e, 0);
    for (int64_t j = 0; j < k; ++j) {
      for (int64_t t = 0; t < n; ++t) kept[t * k + j] = taken[choice[t * k + j]]++ < capacity;
    }
  }

  const Device gpu = Device::Cuda(0);
  auto owned_ctx = DeviceContext::Create(gpu);
  DeviceContext* ctx = owned_ctx.get();
  cudaDeviceProp prop{};
  SY_CUDA_CHECK(cudaGetDeviceProperties(&prop, 0));
  int mem_clock_khz = 0, bus_bits = 0;
  SY_CUDA_CHECK(cudaDeviceGetAttribute(&mem_clock_khz, cudaDevAttrMemoryClockRate, 0));
  SY_CUDA_CHECK(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, 0));
  const double peak_gbs = 1e3 * mem_clock_khz * 2.0 * (bus_bits / 8.0) / 1e9;

  // Inputs: host copies (for the check) and device tensors.
  const uint64_t s = static_cast<uint64_t>(seed);
  Tensor experts_host = Tensor::FromVector(choice, {n, k});
  Tensor kept_host = Tensor::FromVector(kept, {n, k});
  Tensor h_host = Tensor::Empty({n, d}, DType::kF32), dy_host = Tensor::Empty({n, d}, DType::kF32);
  Tensor gates_host = Tensor::Empty({n, k}, DType::kF32);
  kernels::FillUniform(h_host, RngKey{s, 1}, 0, -1.0f, 1.0f);
  kernels::FillUniform(dy_host, RngKey{s, 2}, 0, -1.0f, 1.0f);
  kernels::FillUniform(gates_host, RngKey{s, 3}, 0, 0.0f, 1.0f);
  const Tensor experts_dev = experts_host.To(gpu, ctx), kept_dev = kept_host.To(gpu, ctx);
  const Tensor h_dev = h_host.To(gpu, ctx), dy_dev = dy_host.To(gpu, ctx);
  const Tensor gates_dev = gates_host.To(gpu, ctx);

  Tensor token = Tensor::Empty({nk}, DType::kI64, gpu);
  Tensor slot = Tensor::Empty({nk}, DType::kI64, gpu);
  Tensor inverse = Tensor::Empty({nk}, DType::kI64, gpu);
  const std::vector<int64_t> counts =
      kernels::SortAssignments(experts_dev, kept_dev, e, token, slot, inverse, ctx);
  int64_t a = 0;
  for (int64_t c : counts) a += c;
  const Tensor token_a = token.Slice(0, a), slot_a = slot.Slice(0, a);
  const Tensor inverse_nk = inverse.Reshape({n, k});
  Tensor rows = Tensor::Empty({a, d}, DType::kF32, gpu);   // permuted rows, then expert outputs
  Tensor y = Tensor::Empty({n, d}, DType::kF32, gpu);
  Tensor dout = Tensor::Empty({a, d}, DType::kF32, gpu);
  Tensor dgates = Tensor::Empty({n, k}, DType::kF32, gpu);
  Tensor dh = Tensor::Zeros({n, d}, DType::kF32, gpu, ctx);
  Tensor copy = Tensor::Empty({a, d}, DType::kF32, gpu);
  kernels::GatherRows(h_dev, token_a, rows, ctx);

  const double rows_bytes = 4.0 * a * d, token_bytes = 4.0 * n * d;
  struct Op {
    const char* name;
    double bytes;
    std::function<void()> call;
  };
  const std::vector<Op> ops = {
      {"sort", nk * (4.0 + 1.0) + 3.0 * nk * 8,
       [&] { kernels::SortAssignments(experts_dev, kept_dev, e, token, slot, inverse, ctx); }},
      {"permute", 2 * rows_bytes + 8.0 * a,
       [&] { kernels::GatherRows(h_dev, token_a, rows, ctx); }},
      {"combine", rows_bytes + 12.0 * nk + token_bytes,
       [&] { kernels::Combine(rows, gates_dev, inverse_nk, Tensor(), y, ctx); }},
      {"combine_bwd", 3 * rows_bytes + 12.0 * a + 4.0 * nk,
       [&] { kernels::CombineBackward(dy_dev, rows, gates_dev, slot_a, dout, dgates, ctx); }},
      {"permute_bwd", rows_bytes + 2 * token_bytes + 8.0 * nk,
       [&] { kernels::ScatterAddRows(rows, inverse_nk, dh, ctx); }},
      {"memcpy", 2 * rows_bytes, [&] {
         if (a > 0) {
           SY_CUDA_CHECK(cudaMemcpyAsync(copy.raw_data(), rows.raw_data(), copy.nbytes(),
                                         cudaMemcpyDeviceToDevice,
                                         static_cast<cudaStream_t>(ctx->stream())));
         }
       }}};
  std::vector<std::function<void()>> calls;
  for (const Op& op : ops) calls.push_back(op.call);
  std::vector<double> us = TimeGpuOps(calls, h.options().iters, h.options().warmup, ctx);
  for (double& t : us) t *= 1e3;  // ms -> us
  const double copy_gbs = ops.back().bytes / (us.back() * 1e-6) / 1e9;

  // --- correctness: every op once more on fresh outputs, against the CPU ops ---
  std::vector<int64_t> wrong(ops.size(), 0);
  if (h.options().check) {
    Tensor tok_c = Tensor::Empty({nk}, DType::kI64), slot_c = Tensor::Empty({nk}, DType::kI64),
           inv_c = Tensor::Empty({nk}, DType::kI64);
    const std::vector<int64_t> counts_c =
        kernels::SortAssignments(experts_host, kept_host, e, tok_c, slot_c, inv_c);
    const std::vector<int64_t> counts_g =
        kernels::SortAssignments(experts_dev, kept_dev, e, token, slot, inverse, ctx);
    for (int64_t i = 0; i < e; ++i) wrong[0] += counts_c[i] != counts_g[i];
    wrong[0] += CountWrong<int64_t>(token, tok_c, false, ctx) +
                CountWrong<int64_t>(slot, slot_c, false, ctx) +
                CountWrong<int64_t>(inverse, inv_c, false, ctx);
    const Tensor inv_c_nk = inv_c.Reshape({n, k});

    Tensor rows_c = Tensor::Empty({a, d}, DType::kF32);
    kernels::GatherRows(h_host, tok_c.Slice(0, a), rows_c);
    kernels::GatherRows(h_dev, token_a, rows, ctx);
    wrong[1] = CountWrong<float>(rows, rows_c, false, ctx);

    Tensor y_c = Tensor::Empty({n, d}, DType::kF32);
    kernels::Combine(rows_c, gates_host, inv_c_nk, Tensor(), y_c);
    kernels::Combine(rows, gates_dev, inverse_nk, Tensor(), y, ctx);
    wrong[2] = CountWrong<float>(y, y_c, true, ctx);

    Tensor dout_c = Tensor::Empty({a, d}, DType::kF32);
    Tensor dgates_c = Tensor::Empty({n, k}, DType::kF32);
    kernels::CombineBackward(dy_host, rows_c, gates_host, slot_c.Slice(0, a), dout_c, dgates_c);
    kernels::CombineBackward(dy_dev, rows, gates_dev, slot_a, dout, dgates, ctx);
    wrong[3] = CountWrong<float>(dout, dout_c, true, ctx) +
               CountWrong<float>(dgates, dgates_c, true, ctx);

    Tensor dh_c = dy_host.Clone();
    Tensor dh_g = dy_dev.Clone(ctx);
    kernels::ScatterAddRows(rows_c, inv_c_nk, dh_c);
    kernels::ScatterAddRows(rows, inverse_nk, dh_g, ctx);
    wrong[4] = CountWrong<float>(dh_g, dh_c, true, ctx);

    kernels::GatherRows(h_dev, token_a, rows, ctx);
    SY_CUDA_CHECK(cudaMemcpyAsync(copy.raw_data(), rows.raw_data(), copy.nbytes(),
                                  cudaMemcpyDeviceToDevice,
                                  static_cast<cudaStream_t>(ctx->stream())));
    wrong[5] = CountWrong<float>(copy, rows_c, false, ctx);
  }

  if (h.printing()) {
    std::printf(
        "# GPU %s: peak memory bandwidth %.0f GB/s (memory clock %d MHz x 2 x %d-bit bus), "
        "measured device-to-device cudaMemcpy %.0f GB/s\n"
        "# N=%lld tokens, d=%lld (f32 rows), E=%lld, top-%lld, routing %s, capacity %s: "
        "A=%lld rows kept (%.1f%% dropped)\n#\n",
        prop.name, peak_gbs, mem_clock_khz / 1000, bus_bits, copy_gbs,
        static_cast<long long>(n), static_cast<long long>(d), static_cast<long long>(e),
        static_cast<long long>(k), spec->Name().c_str(),
        *cf > 0 ? capacity_text.c_str() : "dropless", static_cast<long long>(a),
        100.0 * (1.0 - static_cast<double>(a) / static_cast<double>(nk)));
  }
  Table table({{{"op", "", 12, 0}, {"bytes", "(MB)", 10, 1}},
               {{"time", "(us)", 10, 1},
                {"GB/s", "", 8, 0},
                {"%peak", "", 6, 1},
                {"%copy", "", 6, 1},
                {"#wrong", "", 7, 0}}},
              h.printing());
  table.PrintHeader();
  int64_t total_wrong = 0;
  nlohmann::json per_op = nlohmann::json::object();
  for (size_t o = 0; o < ops.size(); ++o) {
    const double gbs = ops[o].bytes / (us[o] * 1e-6) / 1e9;
    table.AddRow({std::string(ops[o].name), ops[o].bytes / 1e6, us[o], gbs, 100.0 * gbs / peak_gbs,
                  100.0 * gbs / copy_gbs, wrong[o]});
    total_wrong += wrong[o];
    per_op[ops[o].name] = {{"bytes", ops[o].bytes}, {"time_us", us[o]}, {"gbs", gbs}};
  }
  return h.Finish(table, total_wrong,
                  {{"gpu", std::string(prop.name)},
                   {"peak_gbs", peak_gbs},
                   {"memcpy_gbs", copy_gbs},
                   {"tokens", tokens},
                   {"hidden", hidden},
                   {"experts", experts},
                   {"topk", topk},
                   {"capacity", *cf},
                   {"routing", spec->Name()},
                   {"kept_rows", a},
                   {"ops", per_op},
                   {"timing", "CUDA events, us per call, median of 5 blocks"}});
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
