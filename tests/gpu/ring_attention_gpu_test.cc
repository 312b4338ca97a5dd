// dense/ring_attention.h on CUDA tensors: a cp group of one rank (a local communicator on
// the device, whose context orders the kernels) against the same call on the CPU. One GPU
// cannot run a ring of several ranks; this checks the device path of the block loop (packed
// key/value views, merges, accumulators) that NCCL rings use. Tolerances as in
// attention_gpu_test.cc: out, lse 2e-5 (1 + |cpu|); dq, dk, dv 1e-4 max|cpu| + 1e-4 |cpu|.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "dense/ring_attention.h"
#include "engine/core/device_context.h"
#include "engine/dist/communicator.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::dense {
namespace {

using gpu_test::ExpectNear;
using gpu_test::HostUniform;

TEST(RingAttentionGpuTest, OneRankRingMatchesCpu) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(Device::Cuda(0));
  DeviceContext* gpu = ctx.get();
  const Device cuda = Device::Cuda(0);
  auto cpu_cp = dist::MakeLocalCommunicator(Device::Cpu());
  auto gpu_cp = dist::MakeLocalCommunicator(cuda, 0, gpu);
  const int64_t b = 2, sc = 37, hq = 8, hkv = 2, hd = 64;
  const Shape qs{2 * b, sc, hq, hd}, kvs{2 * b, sc, hkv, hd}, ls{2 * b, hq, sc};
  Tensor q = HostUniform(qs, 61), k = HostUniform(kvs, 62), v = HostUniform(kvs, 63);
  Tensor dout = HostUniform(qs, 64);

  Tensor out = Tensor::Empty(qs, DType::kF32), lse = Tensor::Empty(ls, DType::kF32);
  RingAttentionForward(q, k, v, out, lse, *cpu_cp);
  Tensor dq = Tensor::Empty(qs, DType::kF32), dk = Tensor::Empty(kvs, DType::kF32),
         dv = Tensor::Empty(kvs, DType::kF32);
  RingAttentionBackward(q, k, v, out, lse, dout, dq, dk, dv, *cpu_cp);

  Tensor q_d = q.To(cuda, gpu), k_d = k.To(cuda, gpu), v_d = v.To(cuda, gpu);
  Tensor out_d = Tensor::Empty(qs, DType::kF32, cuda), lse_d = Tensor::Empty(ls, DType::kF32, cuda);
  RingAttentionStats stats;
  RingAttentionForward(q_d, k_d, v_d, out_d, lse_d, *gpu_cp, gpu, &stats);
  ExpectNear(out_d, out, 2e-5, 2e-5, gpu, "ring out");
  ExpectNear(lse_d, lse, 2e-5, 2e-5, gpu, "ring lse");
  Tensor dq_d = Tensor::Empty(qs, DType::kF32, cuda), dk_d = Tensor::Empty(kvs, DType::kF32, cuda),
         dv_d = Tensor::Empty(kvs, DType::kF32, cuda);
  // The backward from the CPU's out and lse, so it is tested on its own.
  RingAttentionBackward(q_d, k_d, v_d, out.To(cuda, gpu), lse.To(cuda, gpu), dout.To(cuda, gpu),
                        dq_d, dk_d, dv_d, *gpu_cp, gpu, &stats);
  for (auto [got, want, name] : {std::tuple{&dq_d, &dq, "ring dq"}, std::tuple{&dk_d, &dk, "ring dk"},
                                 std::tuple{&dv_d, &dv, "ring dv"}}) {
    double max_abs = 0.0;
    for (float x : want->ToVector<float>()) max_abs = std::max(max_abs, std::fabs(double{x}));
    ExpectNear(*got, *want, 1e-4 * max_abs, 1e-4, gpu, name);
  }
  EXPECT_EQ(stats.bytes_sent, 0);
  EXPECT_EQ(stats.pairs, 2 * b * hq * (2 * sc) * (2 * sc + 1) / 2);  // forward + backward
}

}  // namespace
}  // namespace switchyard::dense
