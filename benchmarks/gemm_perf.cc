// gemm_perf: the fp32 matrix peak of this machine, the denominator of every "fraction of
// peak" and MFU figure: OpenBLAS sgemm (kernels::cpu::Sgemm, what the layers call) on
// square n x n x n products at the thread count in use.
//
//   time    seconds per product (max over ranks; under mpirun every rank multiplies at once,
//           so the figure is the per-rank peak with the cores shared as in a real run)
//   GFLOP/s 2 n^3 / time per rank; `peak` in the summary is the best size
//   #wrong  entries of C that differ from the exact product (inputs are small integers so
//           fp32 sums are exact; checked on a sample of rows)
#include <algorithm>
#include <sstream>

#include "benchmarks/harness.h"
#include "engine/core/thread_pool.h"
#include "kernels/gemm.h"

namespace switchyard::bench {
namespace {

int Main(int argc, char** argv) {
  Harness h("gemm_perf", "fp32 sgemm throughput (OpenBLAS) on square products: the matrix peak.",
            {});
  std::string sizes_text = "256,512,1024,2048";
  h.flags().AddString("sizes", &sizes_text,
                      "comma-separated n of the n x n x n products (default 256,512,1024,2048)");
  if (auto code = h.Start(argc, argv)) return *code;

  std::vector<int64_t> sizes;
  std::stringstream in(sizes_text);
  for (std::string item; std::getline(in, item, ',');) {
    StatusOr<int64_t> n = ParseBytes(item);
    if (!n.ok() || *n < 1 || *n > 16384) {
      return h.Fail("--sizes: expected n values in [1, 16384], got \"" + item + "\"");
    }
    sizes.push_back(*n);
  }
  Table table({{{"n", "", 6, 0}, {"threads", "", 7, 0}},
               {{"time", "(us)", 12, 1}, {"GFLOP/s", "per rank", 9, 2}, {"#wrong", "", 6, 0}}},
              h.printing());
  table.PrintHeader();
  double peak = 0;
  int64_t total_wrong = 0;
  for (int64_t n : sizes) {
    // Small integers (|a|, |b| <= 4): every partial sum is an exact fp32 integer.
    std::vector<float> a(n * n), b(n * n), c(n * n);
    for (int64_t i = 0; i < n * n; ++i) {
      a[i] = static_cast<float>(i * 7 % 9) - 4.0f;
      b[i] = static_cast<float>(i * 5 % 7) - 3.0f;
    }
    auto call = [&] {
      kernels::cpu::Sgemm(false, false, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    };
    const double t = h.Time(call);
    int64_t wrong = 0;
    if (h.options().check) {
      std::fill(c.begin(), c.end(), -1e30f);
      call();
      for (int64_t i = 0; i < n; i += std::max<int64_t>(1, n / 16)) {
        for (int64_t j = 0; j < n; ++j) {
          double want = 0;
          for (int64_t l = 0; l < n; ++l) want += double(a[i * n + l]) * b[l * n + j];
          wrong += c[i * n + j] != static_cast<float>(want);
        }
      }
    }
    wrong = h.Sum(wrong);
    total_wrong += wrong;
    const double gflops = 2.0 * n * n * n / t / 1e9;
    peak = std::max(peak, gflops);
    table.AddRow({n, int64_t{ComputeThreads()}, t * 1e6, gflops, wrong});
  }
  if (h.printing()) std::printf("# sgemm peak           : %.2f GFLOP/s per rank\n", peak);
  return h.Finish(table, total_wrong, {{"peak_gflops_per_rank", peak}, {"threads", ComputeThreads()}});
}

}  // namespace
}  // namespace switchyard::bench

int main(int argc, char** argv) { return switchyard::bench::Main(argc, argv); }
