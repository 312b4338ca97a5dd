// kernels/embedding.h on CUDA against the CPU reference on the same random inputs: token
// lookups with many repeated ids (a vocabulary of 3 or 7 for 1000 tokens), a GPT-2 sized
// table, widths 1, 31, 33 and 768, one token, no tokens; learned positions at offsets 0 and
// 5 and their backward; and an id outside the table (forward and backward), which must be
// fatal naming the id and its position, as on the CPU.
//
// Exact: the gather copies; the backward of an id with at most 64 rows adds its rows in the
// CPU's order (a stable sort by id, then one ordered f32 sum per run); the position backward
// adds the batch in order b = 0, 1, ... So those must be bit-identical.
// A hot id (more than 64 rows: the vocabularies of 3 and 7 above, and a batch where one token
// is 80% of 5000) is summed on the GPU in pieces of 64 rows, then the pieces: another order
// of the same m = rows + 1 terms (dtable's value included). Any order of an f32 sum of m
// terms is within (m - 1) u sum |terms| of the exact sum (u = 2^-24, to first order), so the
// two devices are within 2 gamma_(m-1) sum |terms| <= 2.02 (m - 1) u sum |terms| of each
// other (gamma_k = k u / (1 - k u), with k u < 1% here); and two GPU runs must give the same
// bits (a fixed order).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "kernels/embedding.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::HostUniform;

const Device kCuda = Device::Cuda(0);

constexpr int64_t kSerialRows = 64;  // kernels/cuda/embedding.cu's kPieceRows

// n ids in [0, v) from a fixed seed; with hot_share > 0 that share of them is id hot.
Tensor RandomIds(int64_t n, int64_t v, uint32_t seed, double hot_share = 0.0, int32_t hot = 0) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(v - 1));
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = coin(rng) < hot_share ? hot : pick(rng);
  return Tensor::FromVector(ids, {n});
}

// dtable rows of ids with at most kSerialRows rows: bit-identical; rows of hot ids: within
// 2.02 (m - 1) u sum |terms| (m = count + 1 terms, the table's value included).
void ExpectBackwardMatches(const Tensor& ids, const Tensor& dout, const Tensor& dtable0,
                           const Tensor& got_d, const Tensor& want, DeviceContext* gpu,
                           const std::string& what) {
  const int64_t v = want.dim(0), d = want.dim(1);
  const std::vector<int32_t> idv = ids.ToVector<int32_t>();
  const std::vector<float> dv = dout.ToVector<float>(), t0 = dtable0.ToVector<float>();
  const std::vector<float> got = gpu_test::ValuesOf<float>(got_d, gpu), w = want.ToVector<float>();
  std::vector<int64_t> count(static_cast<size_t>(v), 0);
  std::vector<double> abs_sum(t0.size(), 0.0);
  for (size_t e = 0; e < t0.size(); ++e) abs_sum[e] = std::fabs(t0[e]);
  for (size_t i = 0; i < idv.size(); ++i) {
    ++count[idv[i]];
    for (int64_t j = 0; j < d; ++j) abs_sum[idv[i] * d + j] += std::fabs(dv[i * d + j]);
  }
  int64_t exact_bad = 0, hot_rows = 0;
  double worst = 0.0;
  for (int64_t r = 0; r < v; ++r) {
    hot_rows += count[r] > kSerialRows;
    for (int64_t j = 0; j < d; ++j) {
      const size_t e = static_cast<size_t>(r * d + j);
      if (count[r] <= kSerialRows) {
        exact_bad += std::memcmp(&got[e], &w[e], sizeof(float)) != 0;
      } else {
        const double tol = 2.02 * static_cast<double>(count[r]) * 0x1p-24 * abs_sum[e] + 1e-30;
        worst = std::max(worst, std::fabs(static_cast<double>(got[e]) - w[e]) / tol);
      }
    }
  }
  EXPECT_EQ(exact_bad, 0) << what << ": rows of ids with <= 64 rows must be bit-identical";
  EXPECT_LE(worst, 1.0) << what << ": a hot id's row is outside the summation bound";
  std::printf("  %-56s %lld hot ids, bound used %.3f, others bit-identical\n", what.c_str(),
              static_cast<long long>(hot_rows), worst);
}

void CheckLookup(int64_t n, int64_t v, int64_t d, uint64_t seed, double hot_share = 0.0) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const std::string name =
      "embedding N=" + std::to_string(n) + " V=" + std::to_string(v) + " d=" + std::to_string(d) +
      (hot_share > 0 ? " hot " + std::to_string(hot_share).substr(0, 4) : "");
  Tensor ids = RandomIds(n, v, static_cast<uint32_t>(seed), hot_share, static_cast<int32_t>(v / 2));
  Tensor table = HostUniform({v, d}, seed + 1);
  Tensor out = Tensor::Empty({n, d}, DType::kF32);
  EmbeddingForward(ids, table, out);
  Tensor ids_d = ids.To(kCuda, gpu), table_d = table.To(kCuda, gpu);
  Tensor out_d = Tensor::Empty({n, d}, DType::kF32, kCuda);
  EmbeddingForward(ids_d, table_d, out_d, gpu);
  ExpectBitEqual(out_d, out, gpu, name + " forward");

  // Backward into a non-zero dtable (accumulates; rows no id uses stay as they were).
  Tensor dout = HostUniform({n, d}, seed + 2);
  Tensor dtable = HostUniform({v, d}, seed + 3);
  const Tensor dtable0 = dtable.Clone();
  Tensor dtable_d = dtable.To(kCuda, gpu), again_d = dtable.To(kCuda, gpu);
  const Tensor dout_d = dout.To(kCuda, gpu);
  EmbeddingBackward(ids, dout, dtable);
  EmbeddingBackward(ids_d, dout_d, dtable_d, gpu);
  ExpectBackwardMatches(ids, dout, dtable0, dtable_d, dtable, gpu, name + " backward");
  EmbeddingBackward(ids_d, dout_d, again_d, gpu);
  ExpectBitEqual(again_d, dtable_d, gpu, name + " backward, run twice");
}

TEST(EmbeddingGpuTest, LookupsMatchCpu) {
  SY_REQUIRE_GPU();
  struct Case {
    int64_t n, v, d;
  };
  const Case cases[] = {{1, 1, 1},        {1, 5, 33},    {1000, 3, 31},
                        {1000, 7, 33},    {257, 100, 1}, {300, 50257, 64},
                        {4096, 512, 768}, {0, 5, 8},     {6, 4, 0}};
  uint64_t seed = 900;
  for (const Case& c : cases) CheckLookup(c.n, c.v, c.d, seed += 10);
}

// A hot token: 80% of 5000 ids are one id (4000 rows: 63 pieces), the rest spread over a
// vocabulary of 2000 (short runs, exact), d 1024 and an odd width.
TEST(EmbeddingGpuTest, HotTokenBackwardIsParallelDeterministicAndWithinTheBound) {
  SY_REQUIRE_GPU();
  CheckLookup(5000, 2000, 1024, 1201, 0.8);
  CheckLookup(4097, 2000, 33, 1202, 0.5);
  CheckLookup(65, 3, 8, 1203, 1.0);  // one run of 65: two pieces, the second of one row
}

void CheckPositions(const Shape& x_shape, int64_t s_max, int64_t offset, uint64_t seed) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const std::string name =
      "positions x" + ShapeString(x_shape) + " offset " + std::to_string(offset);
  const int64_t d = x_shape[2];
  Tensor x = HostUniform(x_shape, seed), wpe = HostUniform({s_max, d}, seed + 1);
  Tensor x_d = x.To(kCuda, gpu);
  AddPositionEmbedding(x, wpe, offset);
  AddPositionEmbedding(x_d, wpe.To(kCuda, gpu), offset, gpu);
  ExpectBitEqual(x_d, x, gpu, name + " forward");

  Tensor dx = HostUniform(x_shape, seed + 2), dwpe = HostUniform({s_max, d}, seed + 3);
  Tensor dwpe_d = dwpe.To(kCuda, gpu);
  PositionEmbeddingBackward(dx, dwpe, offset);
  PositionEmbeddingBackward(dx.To(kCuda, gpu), dwpe_d, offset, gpu);
  ExpectBitEqual(dwpe_d, dwpe, gpu, name + " backward");
}

TEST(EmbeddingGpuTest, PositionsMatchCpuExactly) {
  SY_REQUIRE_GPU();
  CheckPositions({1, 1, 1}, 1, 0, 1000);
  CheckPositions({3, 7, 33}, 16, 5, 1010);
  CheckPositions({8, 128, 64}, 128, 0, 1020);
  CheckPositions({2, 31, 1000}, 40, 9, 1030);
  CheckPositions({0, 4, 8}, 8, 0, 1040);
}

// Runs `op` with ids {0, 2, 9, 1, 11} against a table of 5 rows on the GPU.
void RunWithBadIds(bool backward) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  Tensor ids = Tensor::FromVector<int32_t>({0, 2, 9, 1, 11}, {5}).To(kCuda, gpu);
  Tensor table = Tensor::Zeros({5, 4}, DType::kF32, kCuda, gpu);
  Tensor rows = Tensor::Zeros({5, 4}, DType::kF32, kCuda, gpu);
  if (backward) {
    EmbeddingBackward(ids, rows, table, gpu);
  } else {
    EmbeddingForward(ids, table, rows, gpu);
  }
}

TEST(EmbeddingGpuDeathTest, IdOutsideTheTableIsFatalNamingIt) {
  SY_REQUIRE_GPU();
  // The child process re-executes the binary (a forked CUDA context is unusable).
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_DEATH(RunWithBadIds(false), "EmbeddingForward: id 9 at 2 is outside the table of 5 rows");
  EXPECT_DEATH(RunWithBadIds(true), "EmbeddingBackward: id 9 at 2 is outside the table of 5 rows");
}

}  // namespace
}  // namespace switchyard::kernels
