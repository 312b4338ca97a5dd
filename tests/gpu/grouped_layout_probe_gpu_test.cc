// A probe of the device-sized grouped GEMM's data layout (kernels/cuda/grouped_gemm*.cu*), for
// the tiles the process runs on (mma.sync by default; wgmma with SWITCHYARD_GROUPED_WGMMA=1,
// as scripts/gpu_run.sh runs the DeviceSized* tests). Random operands (gemm_gpu_test.cc) say
// that a result is wrong; these say where each wrong value came from, so that a layout
// mistake (a swizzle, a descriptor's stride, an accumulator's place) can be read off the log.
//
// Every x row holds one 1, at column Sel(i) = (37 i + 11) mod k, and w is 0-free: out[i][j] is
// then the single w element (Sel(i), j) (exact: a product by 1 and sums of zeros). Two w
// patterns decode it: w = p + 1 + 128 g names the k index (and group) that landed, and
// w = j + 1 names the column. The weight gradient the same way, with dy = the row in its
// group + 1 and dy = j + 1. All values are integers of at most 256, exact in bf16. Each
// probe runs on the CPU first (which checks the expectations) and then on the GPU.
#include <gtest/gtest.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "kernels/gemm.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

constexpr int64_t kK = 128;  // two K steps of 64; a power of two, so 37 i + 11 is a bijection

int64_t Sel(int64_t i) { return (37 * i + 11) % kK; }

Tensor Bf16(const std::vector<float>& values, const Shape& shape) {
  std::vector<BFloat16> bf;
  for (float v : values) bf.emplace_back(v);
  return Tensor::FromVector(bf, shape);
}

// Compares got with want and prints the first wrong values, decoded by `decode` (what a
// value says landed there). Returns the number wrong.
template <typename Decode>
int64_t Report(const std::string& what, const std::vector<float>& got,
               const std::vector<float>& want, int64_t cols, Decode decode) {
  int64_t wrong = 0;
  for (size_t at = 0; at < got.size(); ++at) {
    if (got[at] == want[at]) continue;
    if (wrong++ < 12) {
      const int64_t r = static_cast<int64_t>(at) / cols, c = static_cast<int64_t>(at) % cols;
      std::printf("  %s: [%lld][%lld] is %g (%s), expected %g (%s)\n", what.c_str(),
                  static_cast<long long>(r), static_cast<long long>(c), got[at],
                  decode(got[at]).c_str(), want[at], decode(want[at]).c_str());
    }
  }
  std::printf("  %-58s %lld of %zu wrong\n", what.c_str(), static_cast<long long>(wrong),
              got.size());
  return wrong;
}

// out = x @ w[g] (trans_w: w[g]^T) over groups of `rows`, on ctx's device.
std::vector<float> Forward(const std::vector<int64_t>& rows, const std::vector<float>& w, int64_t n,
                           bool trans_w, DeviceContext* ctx, Device device) {
  std::vector<int64_t> offsets(1, 0);
  for (int64_t r : rows) offsets.push_back(offsets.back() + r);
  const int64_t total = offsets.back(), g = static_cast<int64_t>(rows.size());
  std::vector<float> x(static_cast<size_t>(total * kK), 0.0f);
  for (int64_t i = 0; i < total; ++i) x[i * kK + Sel(i)] = 1.0f;
  const Tensor xt = Bf16(x, {total, kK}).To(device, ctx);
  const Tensor wt = Bf16(w, trans_w ? Shape{g, n, kK} : Shape{g, kK, n}).To(device, ctx);
  const Tensor off = Tensor::FromVector(offsets, {g + 1}).To(device, ctx);
  Tensor out = Tensor::Zeros({total, n}, DType::kF32, device);
  GroupedGemm(xt, off, wt, trans_w, out, 1.0f, 0.0f, ctx);
  return out.To(Device::Cpu(), ctx).ToVector<float>();
}

// dw[g] = x[g]^T @ dy[g], each group kK rows (every k index once: Sel is a bijection).
std::vector<float> WeightGrad(int64_t groups, const std::vector<float>& dy, int64_t n,
                              DeviceContext* ctx, Device device) {
  const int64_t total = groups * kK;
  std::vector<int64_t> offsets;
  for (int64_t e = 0; e <= groups; ++e) offsets.push_back(e * kK);
  std::vector<float> x(static_cast<size_t>(total * kK), 0.0f);
  for (int64_t i = 0; i < total; ++i) x[i * kK + Sel(i)] = 1.0f;
  const Tensor xt = Bf16(x, {total, kK}).To(device, ctx);
  const Tensor dyt = Bf16(dy, {total, n}).To(device, ctx);
  const Tensor off = Tensor::FromVector(offsets, {groups + 1}).To(device, ctx);
  Tensor dw = Tensor::Zeros({groups, kK, n}, DType::kF32, device);
  GroupedGemmWeightGrad(xt, dyt, off, dw, 1.0f, 0.0f, ctx);
  return dw.To(Device::Cpu(), ctx).ToVector<float>();
}

// Which (group, k index) a forward value of the k probe names, and which row of a group
// takes that k index ("rows r, r + 128, ...").
std::string KIndex(float v) {
  const int64_t p = static_cast<int64_t>(v) - 1;
  if (v != static_cast<float>(p + 1) || p < 0) return "not a probe value";
  const int64_t k = p % kK;
  int64_t row = 0;
  while (Sel(row) != k) ++row;
  return "k " + std::to_string(k) + " of group " + std::to_string(p / kK) + ": row " +
         std::to_string(row) + " (mod 128)'s";
}
std::string Column(float v) {
  return v >= 1.0f ? "column " + std::to_string(static_cast<int64_t>(v) - 1) : "nothing";
}
std::string GroupRow(float v) {
  return v >= 1.0f ? "group row " + std::to_string(static_cast<int64_t>(v) - 1) : "nothing";
}

struct Probe {
  std::unique_ptr<DeviceContext> cpu = DeviceContext::Create(Device::Cpu());
  std::unique_ptr<DeviceContext> gpu;
  Probe() {
    cpu->set_matmul_dtype(DType::kBF16);
    if (CudaAvailable()) {
      gpu = DeviceContext::Create(Device::Cuda(0));
      gpu->set_matmul_dtype(DType::kBF16);
    }
  }
  // The CPU's result must be `want` (the probe's own check); then the GPU's.
  template <typename Run, typename Decode>
  void Check(const std::string& what, const std::vector<float>& want, int64_t cols, Run run,
             Decode decode) {
    EXPECT_EQ(Report("cpu " + what, run(cpu.get(), Device::Cpu()), want, cols, decode), 0);
    if (gpu) {
      EXPECT_EQ(Report("gpu " + what, run(gpu.get(), Device::Cuda(0)), want, cols, decode), 0);
    }
  }
};

TEST(DeviceSizedLayoutProbeGpuTest, ForwardNamesTheKIndexAndColumnOfEveryValue) {
  Probe probe;
  const std::vector<int64_t> rows = {192, 130};  // a full and a partial row tile each
  const int64_t g = 2, n = 256, total = 322;
  for (bool trans_w : {false, true}) {
    std::vector<float> wk(static_cast<size_t>(g * kK * n)), wj(wk.size());
    for (int64_t e = 0; e < g; ++e) {
      for (int64_t p = 0; p < kK; ++p) {
        for (int64_t j = 0; j < n; ++j) {
          const int64_t at = trans_w ? (e * n + j) * kK + p : (e * kK + p) * n + j;
          wk[at] = static_cast<float>(p + 1 + kK * e);
          wj[at] = static_cast<float>(j + 1);
        }
      }
    }
    std::vector<float> want_k(static_cast<size_t>(total * n)), want_j(want_k.size());
    for (int64_t i = 0; i < total; ++i) {
      for (int64_t j = 0; j < n; ++j) {
        want_k[i * n + j] = static_cast<float>(Sel(i) + 1 + kK * (i >= rows[0]));
        want_j[i * n + j] = static_cast<float>(j + 1);
      }
    }
    const std::string tag = trans_w ? " trans_w" : "";
    probe.Check(
        "forward k probe" + tag, want_k, n,
        [&](DeviceContext* c, Device d) { return Forward(rows, wk, n, trans_w, c, d); }, KIndex);
    probe.Check(
        "forward column probe" + tag, want_j, n,
        [&](DeviceContext* c, Device d) { return Forward(rows, wj, n, trans_w, c, d); }, Column);
  }
  if (!probe.gpu)
    GTEST_SKIP()
        << "the probe's expectations hold on the CPU; no CUDA device visible for the GPU half";
}

TEST(DeviceSizedLayoutProbeGpuTest, WeightGradNamesTheRowAndColumnOfEveryValue) {
  Probe probe;
  const int64_t g = 2, n = 256, total = g * kK;
  std::vector<float> dy_row(static_cast<size_t>(total * n)), dy_col(dy_row.size());
  for (int64_t i = 0; i < total; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      dy_row[i * n + j] = static_cast<float>(i % kK + 1);
      dy_col[i * n + j] = static_cast<float>(j + 1);
    }
  }
  std::vector<float> want_row(static_cast<size_t>(g * kK * n)), want_col(want_row.size());
  for (int64_t i = 0; i < total; ++i) {  // row i of group i / kK is the one with Sel(i) = p
    for (int64_t j = 0; j < n; ++j) {
      const int64_t at = ((i / kK) * kK + Sel(i)) * n + j;
      want_row[at] = static_cast<float>(i % kK + 1);
      want_col[at] = static_cast<float>(j + 1);
    }
  }
  probe.Check(
      "weight gradient row probe", want_row, n,
      [&](DeviceContext* c, Device d) { return WeightGrad(g, dy_row, n, c, d); }, GroupRow);
  probe.Check(
      "weight gradient column probe", want_col, n,
      [&](DeviceContext* c, Device d) { return WeightGrad(g, dy_col, n, c, d); }, Column);
  if (!probe.gpu)
    GTEST_SKIP()
        << "the probe's expectations hold on the CPU; no CUDA device visible for the GPU half";
}

}  // namespace
}  // namespace switchyard::kernels
