// kernels/vocab_parallel.h on CUDA against the CPU reference (skips where no GPU is
// visible), and VocabParallelCrossEntropy on a device with a size-1 group against the CPU.
// Exact where the operation is: the row max, the target logit and the embedding pieces
// (copies, and the backward's ordered f32 sums) are bit-identical; the sum of exponentials
// and the gradient differ by expf (<= 2 ulp) and the summation order.
#include <gtest/gtest.h>

#include <cstdint>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/dist/communicator.h"
#include "engine/parallel/vocab_parallel.h"
#include "kernels/vocab_parallel.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::ExpectNear;
using gpu_test::HostUniform;

const Device kCuda = Device::Cuda(0);

// n ids in [lo, hi) from a fixed seed.
Tensor RandomIds(int64_t n, int32_t lo, int32_t hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(lo, hi - 1);
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = pick(rng);
  return Tensor::FromVector(ids, {n});
}

// Logits (n, c) in [-6, 6) with NaN in the padding columns >= valid.
Tensor PaddedLogits(int64_t n, int64_t c, int64_t valid, uint64_t seed) {
  Tensor x = HostUniform({n, c}, seed, -6.0f, 6.0f);
  float* p = x.data<float>();
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = valid; j < c; ++j) p[r * c + j] = std::numeric_limits<float>::quiet_NaN();
  return x;
}

void CheckShardKernels(int64_t n, int64_t c, int64_t valid, int64_t start, uint64_t seed) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const std::string name = "shard N=" + std::to_string(n) + " C=" + std::to_string(c) +
                           " valid=" + std::to_string(valid);
  Tensor x = PaddedLogits(n, c, valid, seed);
  Tensor targets = RandomIds(n, static_cast<int32_t>(start - 3),
                             static_cast<int32_t>(start + valid + 3), seed + 1);
  targets.data<int32_t>()[0] = -1;  // an ignored row
  Tensor x_d = x.To(kCuda, gpu), targets_d = targets.To(kCuda, gpu);
  Tensor m = Tensor::Empty({n}, DType::kF32), m_d = Tensor::Empty({n}, DType::kF32, kCuda);
  VocabShardRowMax(x, valid, m);
  VocabShardRowMax(x_d, valid, m_d, gpu);
  ExpectBitEqual(m_d, m, gpu, name + " row max");
  // The CPU's max as the "global" max on both devices (a shard of padding only has -inf).
  Tensor global = valid > 0 ? m : Tensor::Zeros({n}, DType::kF32);
  Tensor global_d = global.To(kCuda, gpu);
  Tensor s = Tensor::Empty({n}, DType::kF32), s_d = Tensor::Empty({n}, DType::kF32, kCuda);
  VocabShardExpSum(x, valid, global, s);
  VocabShardExpSum(x_d, valid, global_d, s_d, gpu);
  ExpectNear(s_d, s, 1e-30, 2e-6, gpu, name + " exp sum");
  Tensor t = Tensor::Empty({n}, DType::kF32), t_d = Tensor::Empty({n}, DType::kF32, kCuda);
  VocabShardTargetLogit(x, targets, start, valid, -1, t);
  VocabShardTargetLogit(x_d, targets_d, start, valid, -1, t_d, gpu);
  ExpectBitEqual(t_d, t, gpu, name + " target logit");
  if (valid == 0) s = Tensor::FromVector(std::vector<float>(n, 1.0f), {n});
  Tensor d = Tensor::Empty({n, c}, DType::kF32);
  VocabShardSoftmaxGrad(x, targets, start, valid, global, s, 0.5f, -1, d);
  // On the device over the logits themselves (aliasing), with the CPU's sums.
  VocabShardSoftmaxGrad(x_d, targets_d, start, valid, global_d, s.To(kCuda, gpu), 0.5f, -1, x_d,
                        gpu);
  ExpectNear(x_d, d, 1e-9, 1e-6, gpu, name + " softmax grad (in place)");
}

TEST(VocabParallelGpuTest, ShardKernels) {
  SY_REQUIRE_GPU();
  CheckShardKernels(300, 1000, 900, 5000, 1);
  CheckShardKernels(7, 50257, 50257, 0, 2);
  CheckShardKernels(33, 8, 0, 64, 3);  // padding only
  CheckShardKernels(1, 1, 1, 0, 4);
}

void CheckEmbedding(int64_t n, int64_t rows, int64_t d, int64_t start, uint64_t seed) {
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const std::string name = "embedding shard N=" + std::to_string(n) + " rows=" +
                           std::to_string(rows) + " d=" + std::to_string(d);
  // Ids over three shards' worth of vocabulary: most are other ranks', many repeat.
  Tensor ids = RandomIds(n, 0, static_cast<int32_t>(start + 2 * rows), static_cast<uint32_t>(seed));
  Tensor table = HostUniform({rows, d}, seed + 1), dout = HostUniform({n, d}, seed + 2);
  Tensor out = Tensor::Empty({n, d}, DType::kF32);
  Tensor out_d = Tensor::Empty({n, d}, DType::kF32, kCuda);
  VocabShardEmbeddingForward(ids, table, start, out);
  VocabShardEmbeddingForward(ids.To(kCuda, gpu), table.To(kCuda, gpu), start, out_d, gpu);
  ExpectBitEqual(out_d, out, gpu, name + " forward");
  Tensor dtable = HostUniform({rows, d}, seed + 3);
  Tensor dtable_d = dtable.To(kCuda, gpu);
  VocabShardEmbeddingBackward(ids, dout, start, dtable);
  VocabShardEmbeddingBackward(ids.To(kCuda, gpu), dout.To(kCuda, gpu), start, dtable_d, gpu);
  ExpectBitEqual(dtable_d, dtable, gpu, name + " backward");
}

TEST(VocabParallelGpuTest, EmbeddingShard) {
  SY_REQUIRE_GPU();
  CheckEmbedding(1000, 7, 33, 7, 10);
  CheckEmbedding(4096, 12564, 768, 12564, 11);
  CheckEmbedding(1, 3, 1, 0, 12);
}

TEST(VocabParallelGpuTest, CrossEntropyOnTheDevice) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  const int64_t n = 64, v = 1001, c = 1004;  // three padding columns
  Tensor x = PaddedLogits(n, c, v, 20);
  Tensor targets = RandomIds(n, 0, static_cast<int32_t>(v), 21);
  targets.data<int32_t>()[5] = kIgnoreIndex;
  auto cpu_group = dist::MakeLocalCommunicator();
  auto gpu_group = dist::MakeLocalCommunicator(kCuda, 0, gpu);
  Tensor d = Tensor::Empty({n, c}, DType::kF32), d_d = Tensor::Empty({n, c}, DType::kF32, kCuda);
  const CrossEntropySums want =
      parallel::VocabParallelCrossEntropy(x, targets, 0, v, *cpu_group, &d, 0.1, nullptr);
  const CrossEntropySums got = parallel::VocabParallelCrossEntropy(
      x.To(kCuda, gpu), targets.To(kCuda, gpu), 0, v, *gpu_group, &d_d, 0.1, gpu);
  EXPECT_EQ(got.count, want.count);
  EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-6 * std::abs(want.loss_sum));
  ExpectNear(d_d, d, 1e-9, 1e-6, gpu, "vocab-parallel cross-entropy gradient");
}

}  // namespace
}  // namespace switchyard::kernels
