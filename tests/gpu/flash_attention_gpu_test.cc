// The fused bf16 attention kernel (kernels/cuda/flash_attention.cu) against its CPU twin
// (kernels/cpu/flash_attention.cc), both selected through kernels/attention.h by a bf16
// DeviceContext: forward out and lse, backward dq, dk, dv (from the twin's lse and delta, and
// the GPU's own end to end; from bf16 q, k and v the same bits), causal and kFull, multi-head,
// GQA and MQA, S = 1, S below, at and past the 64-row block, head_dim 64 and 128, outputs
// NaN-filled first (written, not accumulated).
//
// Tolerance, by construction (tests/kernels/flash_attention_bound.h): the inputs are rounded to
// bf16 here, so the kernel and the twin read the same operands; each is within the bound
// computed with operand_unit = 0 of the exact value on those operands, so they differ by at
// most twice it (f32 summation order inside the tensor-core products, the last ulp of expf,
// and a bf16 rounding of p or ds on the other side of a tie).
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/flash_attention.h"
#include "kernels/random.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/flash_attention_bound.h"

namespace switchyard::kernels {
namespace {

using test_util::AttentionRef;

struct Case {
  int64_t b, s, hq, hkv, hd;
  std::string Name() const {
    return "B=" + std::to_string(b) + " S=" + std::to_string(s) + " Hq=" + std::to_string(hq) +
           " Hkv=" + std::to_string(hkv) + " hd=" + std::to_string(hd);
  }
};

// Uniform in [-1, 1), rounded to bf16.
Tensor RandomBf16Host(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  FillUniform(t, RngKey{61, stream}, 0, -1.0f, 1.0f);
  return test_util::RoundedToBf16(t);
}

Tensor NanFilled(const Shape& shape, DeviceContext* ctx) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return Tensor::FromVector(std::vector<float>(n, NAN), shape).To(ctx->device(), ctx);
}

// |got - want| <= 2 bound elementwise (NaN fails); prints the worst fraction used.
void ExpectTwice(const Tensor& got_dev, const Tensor& want, const std::vector<double>& bound,
                 DeviceContext* ctx, const std::string& what) {
  test_util::ExpectWithinAttentionBound(gpu_test::ValuesOf<float>(got_dev, ctx),
                                        want.ToVector<float>(), bound, 2.0, what);
}

void CheckCase(const Case& c, AttentionMask mask, uint64_t seed) {
  const bool causal = mask == AttentionMask::kCausal;
  const std::string name = c.Name() + (causal ? " causal" : " full");
  auto gpu_ctx = DeviceContext::Create(Device::Cuda(0));
  auto cpu_ctx = DeviceContext::Create(Device::Cpu());
  gpu_ctx->set_matmul_dtype(DType::kBF16);
  cpu_ctx->set_matmul_dtype(DType::kBF16);
  DeviceContext* gpu = gpu_ctx.get();
  DeviceContext* cpu = cpu_ctx.get();
  ASSERT_TRUE(UseFlashAttention(gpu, c.hd)) << name;
  const Device cuda = Device::Cuda(0);
  const Shape q_shape{c.b, c.s, c.hq, c.hd}, kv_shape{c.b, c.s, c.hkv, c.hd};
  const Shape l_shape{c.b, c.hq, c.s};
  Tensor q = RandomBf16Host(q_shape, seed), k = RandomBf16Host(kv_shape, seed + 1);
  Tensor v = RandomBf16Host(kv_shape, seed + 2), dout = RandomBf16Host(q_shape, seed + 3);
  const AttentionRef ref = test_util::FlashAttentionWithBound(q, k, v, dout, causal, 0.0);

  // The twin: forward, delta, backward.
  Tensor out = Tensor::Empty(q_shape, DType::kF32), lse = Tensor::Empty(l_shape, DType::kF32);
  AttentionForward(q, k, v, out, lse, cpu, mask);
  Tensor delta = Tensor::Empty(l_shape, DType::kF32);
  AttentionBackwardDelta(out, dout, delta);
  Tensor dq = Tensor::Empty(q_shape, DType::kF32), dk = Tensor::Empty(kv_shape, DType::kF32);
  Tensor dv = Tensor::Empty(kv_shape, DType::kF32);
  AttentionBackward(q, k, v, lse, dout, dq, dk, dv, cpu, mask, delta);

  Tensor q_d = q.To(cuda, gpu), k_d = k.To(cuda, gpu), v_d = v.To(cuda, gpu);
  Tensor dout_d = dout.To(cuda, gpu);
  Tensor out_d = NanFilled(q_shape, gpu), lse_d = NanFilled(l_shape, gpu);
  AttentionForward(q_d, k_d, v_d, out_d, lse_d, gpu, mask);
  ExpectTwice(out_d, out, ref.out_bound, gpu, name + " out");
  ExpectTwice(lse_d, lse, ref.lse_bound, gpu, name + " lse");
  // A bf16 out (bf16 activation storage): the kernel's f32 out rounded, bit for bit, and the
  // delta of it that of its widened values.
  {
    Tensor out16 = Tensor::Empty(q_shape, DType::kBF16, cuda), lse16 = NanFilled(l_shape, gpu);
    AttentionForward(q_d, k_d, v_d, out16, lse16, gpu, mask);
    Tensor want16 = Tensor::Empty(q_shape, DType::kBF16, cuda);
    Cast(out_d, want16, gpu);
    gpu_test::ExpectBitEqual(out16, want16, gpu, name + " bf16 out");
    gpu_test::ExpectBitEqual(lse16, lse_d, gpu, name + " bf16 out: lse");
    Tensor wide = Tensor::Empty(q_shape, DType::kF32, cuda);
    Cast(out16, wide, gpu);
    Tensor d16 = NanFilled(l_shape, gpu), dw = NanFilled(l_shape, gpu);
    AttentionBackwardDelta(out16, dout_d, d16, gpu);
    AttentionBackwardDelta(wide, dout_d, dw, gpu);
    gpu_test::ExpectBitEqual(d16, dw, gpu, name + " delta of a bf16 out");
  }

  // Backward from the twin's lse and delta: the backward kernels on their own.
  Tensor dq_d = NanFilled(q_shape, gpu), dk_d = NanFilled(kv_shape, gpu);
  Tensor dv_d = NanFilled(kv_shape, gpu);
  AttentionBackward(q_d, k_d, v_d, lse.To(cuda, gpu), dout_d, dq_d, dk_d, dv_d, gpu, mask,
                    delta.To(cuda, gpu));
  ExpectTwice(dq_d, dq, ref.dq_bound, gpu, name + " dq");
  ExpectTwice(dk_d, dk, ref.dk_bound, gpu, name + " dk");
  ExpectTwice(dv_d, dv, ref.dv_bound, gpu, name + " dv");

  // End to end on the GPU: its own lse, delta recomputed by the dispatch.
  Tensor dq_e = NanFilled(q_shape, gpu), dk_e = NanFilled(kv_shape, gpu);
  Tensor dv_e = NanFilled(kv_shape, gpu);
  AttentionBackward(q_d, k_d, v_d, lse_d, dout_d, dq_e, dk_e, dv_e, gpu, mask);
  ExpectTwice(dq_e, dq, ref.dq_bound, gpu, name + " dq (GPU lse and delta)");
  ExpectTwice(dk_e, dk, ref.dk_bound, gpu, name + " dk (GPU lse and delta)");
  ExpectTwice(dv_e, dv, ref.dv_bound, gpu, name + " dv (GPU lse and delta)");

  // q, k and v in bf16 (the attention layer's under bf16 activation storage): the tiles are
  // copied as they are (cp.async), the same operands as rounded f32 rows, so the same bits.
  auto in_bf16 = [&](const Tensor& t) {
    Tensor out16 = Tensor::Empty(t.shape(), DType::kBF16, cuda);
    Cast(t, out16, gpu);
    return out16;
  };
  const Tensor q16 = in_bf16(q_d), k16 = in_bf16(k_d), v16 = in_bf16(v_d);
  Tensor out_b = NanFilled(q_shape, gpu), lse_b = NanFilled(l_shape, gpu);
  AttentionForward(q16, k16, v16, out_b, lse_b, gpu, mask);
  gpu_test::ExpectBitEqual(out_b, out_d, gpu, name + " bf16 inputs: out");
  gpu_test::ExpectBitEqual(lse_b, lse_d, gpu, name + " bf16 inputs: lse");
  Tensor dq_b = NanFilled(q_shape, gpu), dk_b = NanFilled(kv_shape, gpu);
  Tensor dv_b = NanFilled(kv_shape, gpu);
  AttentionBackward(q16, k16, v16, lse_d, dout_d, dq_b, dk_b, dv_b, gpu, mask);
  gpu_test::ExpectBitEqual(dq_b, dq_e, gpu, name + " bf16 inputs: dq");
  gpu_test::ExpectBitEqual(dk_b, dk_e, gpu, name + " bf16 inputs: dk");
  gpu_test::ExpectBitEqual(dv_b, dv_e, gpu, name + " bf16 inputs: dv");
}

TEST(FlashAttentionGpuTest, MatchesTheCpuTwin) {
  SY_REQUIRE_GPU();
  const Case cases[] = {
      {1, 1, 1, 1, 64},     // one token
      {2, 1, 4, 2, 128},    // S = 1 with GQA
      {2, 37, 8, 2, 64},    // GQA 8:2, S below the block
      {1, 64, 3, 3, 128},   // S exactly one block
      {1, 130, 4, 1, 128},  // MQA, the last key block of 2 keys
      {2, 200, 4, 2, 64},   // four blocks, the last partial
      {1, 256, 2, 1, 128},  // four full blocks
  };
  uint64_t seed = 7000;
  for (const Case& c : cases) {
    for (AttentionMask mask : {AttentionMask::kCausal, AttentionMask::kFull}) {
      CheckCase(c, mask, seed += 10);
    }
  }
}

TEST(FlashAttentionGpuTest, NoQueryHeadsWritesZeroKeyGradients) {
  SY_REQUIRE_GPU();
  auto ctx = DeviceContext::Create(Device::Cuda(0));
  ctx->set_matmul_dtype(DType::kBF16);
  DeviceContext* gpu = ctx.get();
  const Shape q_shape{2, 5, 0, 64}, kv_shape{2, 5, 1, 64};
  Tensor q = Tensor::Empty(q_shape, DType::kF32, Device::Cuda(0));
  Tensor k = NanFilled(kv_shape, gpu), v = NanFilled(kv_shape, gpu);
  Tensor lse = Tensor::Empty({2, 0, 5}, DType::kF32, Device::Cuda(0));
  Tensor dq = Tensor::Empty(q_shape, DType::kF32, Device::Cuda(0));
  Tensor dk = NanFilled(kv_shape, gpu), dv = NanFilled(kv_shape, gpu);
  AttentionBackward(q, k, v, lse, q, dq, dk, dv, gpu);
  for (float x : gpu_test::ValuesOf<float>(dk, gpu)) ASSERT_EQ(x, 0.0f);
  for (float x : gpu_test::ValuesOf<float>(dv, gpu)) ASSERT_EQ(x, 0.0f);
}

}  // namespace
}  // namespace switchyard::kernels
