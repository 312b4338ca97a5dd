#include "benchmarks/gpu_timing.h"

#include <cuda_runtime.h>

#include <algorithm>

#include "engine/core/cuda_check.h"

namespace switchyard::bench {

std::vector<double> TimeGpuOps(const std::vector<std::function<void()>>& ops, int iters,
                               int warmup, DeviceContext* ctx) {
  constexpr int kBlocks = 5;
  cudaStream_t stream = static_cast<cudaStream_t>(ctx->stream());
  for (const auto& op : ops) {
    for (int i = 0; i < warmup; ++i) op();
  }
  cudaEvent_t start, stop;
  SY_CUDA_CHECK(cudaEventCreate(&start));
  SY_CUDA_CHECK(cudaEventCreate(&stop));
  const int blocks = std::clamp(kBlocks, 1, std::max(iters, 1));
  std::vector<std::vector<double>> ms(ops.size());
  for (int b = 0; b < blocks; ++b) {
    const int n = (b + 1) * iters / blocks - b * iters / blocks;
    if (n == 0) continue;
    for (size_t o = 0; o < ops.size(); ++o) {
      SY_CUDA_CHECK(cudaEventRecord(start, stream));
      for (int i = 0; i < n; ++i) ops[o]();
      SY_CUDA_CHECK(cudaEventRecord(stop, stream));
      SY_CUDA_CHECK(cudaEventSynchronize(stop));
      float elapsed = 0;
      SY_CUDA_CHECK(cudaEventElapsedTime(&elapsed, start, stop));
      ms[o].push_back(static_cast<double>(elapsed) / n);
    }
  }
  SY_CUDA_CHECK(cudaEventDestroy(start));
  SY_CUDA_CHECK(cudaEventDestroy(stop));
  std::vector<double> median;
  for (auto& v : ms) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    median.push_back(n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]));
  }
  return median;
}

}  // namespace switchyard::bench
