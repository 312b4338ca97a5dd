// kernels/embedding.h on CUDA against the CPU reference on the same random inputs: token
// lookups with many repeated ids (a vocabulary of 3 or 7 for 1000 tokens), a GPT-2 sized
// table, widths 1, 31, 33 and 768, one token, no tokens; learned positions at offsets 0 and
// 5 and their backward; and an id outside the table (forward and backward), which must be
// fatal naming the id and its position, as on the CPU.
//
// Everything here is exact: the gather copies, the backward adds each id's rows in the
// CPU's order (a stable sort by id, then one ordered f32 sum per run), the position
// backward adds the batch in order b = 0, 1, ... So the GPU must be bit-identical.
#include <gtest/gtest.h>

#include <cstdint>
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

// n ids in [0, v) from a fixed seed.
Tensor RandomIds(int64_t n, int64_t v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(v - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = pick(rng);
  return Tensor::FromVector(ids, {n});
}

void CheckLookup(int64_t n, int64_t v, int64_t d, uint64_t seed) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const std::string name =
      "embedding N=" + std::to_string(n) + " V=" + std::to_string(v) + " d=" + std::to_string(d);
  Tensor ids = RandomIds(n, v, static_cast<uint32_t>(seed));
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
  Tensor dtable_d = dtable.To(kCuda, gpu);
  EmbeddingBackward(ids, dout, dtable);
  EmbeddingBackward(ids_d, dout.To(kCuda, gpu), dtable_d, gpu);
  ExpectBitEqual(dtable_d, dtable, gpu, name + " backward");
}

TEST(EmbeddingGpuTest, LookupsMatchCpuExactly) {
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
