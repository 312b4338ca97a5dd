// kernels/attention.h on CUDA (cuBLAS strided-batched GEMMs + row softmax kernels) against
// the CPU reference on the same random inputs: forward out and lse, backward dq, dk, dv, for
// multi-head, grouped-query (8:2) and multi-query heads, S = 1, head widths 16/64/128, random
// shapes, an empty batch, and a shape whose score matrices exceed the scratch budget so the
// batch is processed in chunks. The block operations of ring attention: the kFull mask
// (forward and backward), backward with a given delta under both masks, AttentionBackwardDelta
// and AttentionMerge (with rows that have seen nothing, lse = -inf), on the same tolerances.
//
// Tolerances: both sides compute in f32 (attention ignores matmul_dtype) and differ in
// summation order, and the CPU sums softmax rows in double where the GPU uses f32:
//   out, lse: |gpu - cpu| <= 2e-5 (1 + |cpu|)   (convex combinations of |v| <= 1; lse is
//             O(log S + |s|))
//   dq, dk, dv: |gpu - cpu| <= 1e-4 max|cpu| + 1e-4 |cpu| + 2 bound  (sums of up to
//             S * Hq / Hkv terms of dp ~ sqrt(hd) size; an indexing error is O(max|cpu|)),
//             with bound tests/kernels/attention_bound.h's forward-error bound of any f32
//             evaluation, from the magnitudes involved: where the exact value is 0 (S = 1:
//             ds = p (dp - p dp) = 0) the first two terms vanish with it while the rounding
//             of either side does not (the CPU's dq ~ 4.5e-8 against the GPU's -0).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "kernels/attention.h"
#include "kernels/random.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/kernels/attention_bound.h"

namespace switchyard::kernels {
namespace {

constexpr double kFwdTol = 2e-5;
constexpr double kBwdAbsOfMax = 1e-4, kBwdRel = 1e-4;

struct Case {
  int64_t b, s, hq, hkv, hd;
  std::string Name() const {
    return "B=" + std::to_string(b) + " S=" + std::to_string(s) + " Hq=" + std::to_string(hq) +
           " Hkv=" + std::to_string(hkv) + " hd=" + std::to_string(hd);
  }
};

Tensor RandomHost(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  FillUniform(t, RngKey{47, stream}, 0, -1.0f, 1.0f);
  return t;
}

// |got - want| <= abs + rel |want| + 2 bound[i] per element, abs = abs_const + abs_of_max *
// max|want| (bound empty: no such term).
void ExpectClose(const Tensor& got_dev, const Tensor& want, double abs_const, double abs_of_max,
                 double rel, DeviceContext* ctx, const std::string& what,
                 const std::vector<double>& bound = {}) {
  const std::vector<float> g = got_dev.To(Device::Cpu(), ctx).ToVector<float>();
  const std::vector<float> w = want.ToVector<float>();
  ASSERT_EQ(g.size(), w.size()) << what;
  double max_abs = 0.0;
  for (float v : w) max_abs = std::max(max_abs, std::fabs(static_cast<double>(v)));
  const double abs = abs_const + abs_of_max * max_abs;
  double worst = 0.0;
  size_t worst_i = 0;
  for (size_t i = 0; i < g.size(); ++i) {
    const double err = std::fabs(static_cast<double>(g[i]) - w[i]);
    const double tol = abs + rel * std::fabs(static_cast<double>(w[i])) +
                       (bound.empty() ? 0.0 : 2.0 * bound[i]);
    const double used = err <= tol ? (tol > 0 ? err / tol : 0.0) : INFINITY;  // NaN fails
    if (used > worst) worst = used, worst_i = i;
  }
  EXPECT_LE(worst, 1.0) << what << ": element " << worst_i << " is " << g[worst_i]
                        << ", expected " << w[worst_i];
  std::printf("  %-52s tolerance used %.3f\n", what.c_str(), worst);
}

// The f32 forward-error bounds of the backward (tests/kernels/attention_bound.h), or none
// (empty vectors) where its double loop would be too long (B Hq S^2 hd > 2^26: the
// chunking case, whose values are far from 0).
test_util::AttentionRef BoundOf(const Tensor& q, const Tensor& k, const Tensor& v,
                                const Tensor& dout, bool causal) {
  if (q.dim(0) * q.dim(2) * q.dim(1) * q.dim(1) * q.dim(3) > (int64_t{1} << 26)) return {};
  return test_util::AttentionWithBound(q, k, v, dout, causal, /*merges=*/0);
}

void CheckCase(const Case& c, uint64_t seed) {
  auto ctx = DeviceContext::Create(Device::Cuda(0));
  DeviceContext* gpu = ctx.get();
  const Device cuda = Device::Cuda(0);
  const Shape q_shape{c.b, c.s, c.hq, c.hd}, kv_shape{c.b, c.s, c.hkv, c.hd};
  Tensor q = RandomHost(q_shape, seed), k = RandomHost(kv_shape, seed + 1);
  Tensor v = RandomHost(kv_shape, seed + 2), dout = RandomHost(q_shape, seed + 3);

  Tensor out = Tensor::Empty(q_shape, DType::kF32);
  Tensor lse = Tensor::Empty({c.b, c.hq, c.s}, DType::kF32);
  AttentionForward(q, k, v, out, lse);
  Tensor q_d = q.To(cuda, gpu), k_d = k.To(cuda, gpu), v_d = v.To(cuda, gpu);
  Tensor out_d = Tensor::Empty(q_shape, DType::kF32, cuda);
  Tensor lse_d = Tensor::Empty({c.b, c.hq, c.s}, DType::kF32, cuda);
  AttentionForward(q_d, k_d, v_d, out_d, lse_d, gpu);
  ExpectClose(out_d, out, kFwdTol, 0.0, kFwdTol, gpu, c.Name() + " out");
  ExpectClose(lse_d, lse, kFwdTol, 0.0, kFwdTol, gpu, c.Name() + " lse");

  // Backward from the CPU's lse on both sides, so it is tested on its own.
  Tensor dq = Tensor::Empty(q_shape, DType::kF32), dk = Tensor::Empty(kv_shape, DType::kF32);
  Tensor dv = Tensor::Empty(kv_shape, DType::kF32);
  AttentionBackward(q, k, v, lse, dout, dq, dk, dv);
  // NaN-filled outputs: dq, dk and dv must be written, not accumulated.
  Tensor nan_q = Tensor::FromVector(std::vector<float>(q.numel(), NAN), q_shape);
  Tensor nan_kv = Tensor::FromVector(std::vector<float>(k.numel(), NAN), kv_shape);
  Tensor dq_d = nan_q.To(cuda, gpu), dk_d = nan_kv.To(cuda, gpu), dv_d = nan_kv.To(cuda, gpu);
  AttentionBackward(q_d, k_d, v_d, lse.To(cuda, gpu), dout.To(cuda, gpu), dq_d, dk_d, dv_d, gpu);
  const test_util::AttentionRef ref = BoundOf(q, k, v, dout, /*causal=*/true);
  ExpectClose(dq_d, dq, 0.0, kBwdAbsOfMax, kBwdRel, gpu, c.Name() + " dq", ref.dq_bound);
  ExpectClose(dk_d, dk, 0.0, kBwdAbsOfMax, kBwdRel, gpu, c.Name() + " dk", ref.dk_bound);
  ExpectClose(dv_d, dv, 0.0, kBwdAbsOfMax, kBwdRel, gpu, c.Name() + " dv", ref.dv_bound);
}

// kFull forward, backward with delta under both masks, delta and merge: GPU against CPU.
void CheckBlockOps(const Case& c, uint64_t seed) {
  auto ctx = DeviceContext::Create(Device::Cuda(0));
  DeviceContext* gpu = ctx.get();
  const Device cuda = Device::Cuda(0);
  const Shape q_shape{c.b, c.s, c.hq, c.hd}, kv_shape{c.b, c.s, c.hkv, c.hd}, l_shape{c.b, c.hq, c.s};
  Tensor q = RandomHost(q_shape, seed), k = RandomHost(kv_shape, seed + 1);
  Tensor v = RandomHost(kv_shape, seed + 2), dout = RandomHost(q_shape, seed + 3);
  Tensor q_d = q.To(cuda, gpu), k_d = k.To(cuda, gpu), v_d = v.To(cuda, gpu);
  Tensor dout_d = dout.To(cuda, gpu);

  Tensor out = Tensor::Empty(q_shape, DType::kF32), lse = Tensor::Empty(l_shape, DType::kF32);
  AttentionForward(q, k, v, out, lse, nullptr, AttentionMask::kFull);
  Tensor out_d = Tensor::Empty(q_shape, DType::kF32, cuda);
  Tensor lse_d = Tensor::Empty(l_shape, DType::kF32, cuda);
  AttentionForward(q_d, k_d, v_d, out_d, lse_d, gpu, AttentionMask::kFull);
  ExpectClose(out_d, out, kFwdTol, 0.0, kFwdTol, gpu, c.Name() + " full out");
  ExpectClose(lse_d, lse, kFwdTol, 0.0, kFwdTol, gpu, c.Name() + " full lse");

  Tensor delta = Tensor::Empty(l_shape, DType::kF32);
  AttentionBackwardDelta(out, dout, delta);
  Tensor delta_d = Tensor::Empty(l_shape, DType::kF32, cuda);
  AttentionBackwardDelta(out.To(cuda, gpu), dout_d, delta_d, gpu);
  ExpectClose(delta_d, delta, kFwdTol, 0.0, kFwdTol, gpu, c.Name() + " delta");

  // Backward with the CPU's lse and delta on both sides, under both masks (under kCausal
  // the full-mask lse and delta stand for a larger softmax this block is part of).
  // The bound of the kFull softmax, which lse and delta are; it is the causal one's too
  // at S = 1 (one key either way), where dq and dk are exactly 0.
  const test_util::AttentionRef ref = BoundOf(q, k, v, dout, /*causal=*/false);
  for (AttentionMask mask : {AttentionMask::kFull, AttentionMask::kCausal}) {
    const std::string name = c.Name() + (mask == AttentionMask::kFull ? " full" : " causal");
    const bool bounded = mask == AttentionMask::kFull || c.s == 1;
    const std::vector<double> none;
    Tensor dq = Tensor::Empty(q_shape, DType::kF32), dk = Tensor::Empty(kv_shape, DType::kF32);
    Tensor dv = Tensor::Empty(kv_shape, DType::kF32);
    AttentionBackward(q, k, v, lse, dout, dq, dk, dv, nullptr, mask, delta);
    Tensor dq_d = Tensor::Empty(q_shape, DType::kF32, cuda);
    Tensor dk_d = Tensor::Empty(kv_shape, DType::kF32, cuda);
    Tensor dv_d = Tensor::Empty(kv_shape, DType::kF32, cuda);
    AttentionBackward(q_d, k_d, v_d, lse.To(cuda, gpu), dout_d, dq_d, dk_d, dv_d, gpu, mask,
                      delta.To(cuda, gpu));
    ExpectClose(dq_d, dq, 0.0, kBwdAbsOfMax, kBwdRel, gpu, name + " dq with delta",
                bounded ? ref.dq_bound : none);
    ExpectClose(dk_d, dk, 0.0, kBwdAbsOfMax, kBwdRel, gpu, name + " dk with delta",
                bounded ? ref.dk_bound : none);
    ExpectClose(dv_d, dv, 0.0, kBwdAbsOfMax, kBwdRel, gpu, name + " dv with delta",
                bounded ? ref.dv_bound : none);
  }

  // Merge the causal result into the full one; every third row of the running lse is -inf
  // (nothing seen: takes the block).
  Tensor out_c = Tensor::Empty(q_shape, DType::kF32), lse_c = Tensor::Empty(l_shape, DType::kF32);
  AttentionForward(q, k, v, out_c, lse_c);
  for (int64_t r = 0; r < lse.numel(); r += 3) lse.data<float>()[r] = -INFINITY;
  Tensor m_out = out.Clone(), m_lse = lse.Clone();
  AttentionMerge(m_out, m_lse, out_c, lse_c);
  Tensor m_out_d = out.To(cuda, gpu), m_lse_d = lse.To(cuda, gpu);
  AttentionMerge(m_out_d, m_lse_d, out_c.To(cuda, gpu), lse_c.To(cuda, gpu), gpu);
  ExpectClose(m_out_d, m_out, kFwdTol, 0.0, kFwdTol, gpu, c.Name() + " merged out");
  ExpectClose(m_lse_d, m_lse, kFwdTol, 0.0, kFwdTol, gpu, c.Name() + " merged lse");
}

TEST(AttentionGpuTest, BlockOperationsMatchCpu) {
  SY_REQUIRE_GPU();
  const Case cases[] = {{2, 1, 4, 2, 64}, {2, 37, 8, 2, 64}, {1, 70, 4, 1, 128}, {3, 17, 3, 3, 16}};
  uint64_t seed = 5000;
  for (const Case& c : cases) CheckBlockOps(c, seed += 10);
}

TEST(AttentionGpuTest, MatchesCpuOnChosenShapes) {
  SY_REQUIRE_GPU();
  const Case cases[] = {
      {1, 1, 1, 1, 16},     // one token, one head
      {2, 1, 4, 2, 64},     // S = 1 with GQA
      {2, 37, 8, 2, 64},    // GQA 8:2
      {1, 70, 4, 1, 128},   // MQA, hd = 128
      {3, 17, 3, 3, 16},    // multi-head, odd sizes
      {2, 129, 2, 2, 32},   // S past a multiple of 32 and 128
      {1, 300, 8, 2, 128},  // longer rows (more than one pass of the row block)
  };
  uint64_t seed = 1000;
  for (const Case& c : cases) CheckCase(c, seed += 10);
}

TEST(AttentionGpuTest, MatchesCpuOnRandomShapes) {
  SY_REQUIRE_GPU();
  Tensor draws = Tensor::Empty({60}, DType::kI32);
  FillRandomBits(draws, RngKey{5, 77}, 0);
  const int32_t* r = draws.data<int32_t>();
  const int64_t hds[] = {16, 64, 128}, groups[] = {1, 2, 4};
  for (int t = 0; t < 10; ++t) {
    auto pick = [&](int i, int64_t n) { return static_cast<int64_t>(static_cast<uint32_t>(r[t * 6 + i]) % n); };
    const int64_t hkv = 1 + pick(0, 3);
    const Case c{1 + pick(1, 3), 1 + pick(2, 100), hkv * groups[pick(3, 3)], hkv, hds[pick(4, 3)]};
    CheckCase(c, 2000 + 10 * t);
  }
}

TEST(AttentionGpuTest, EmptyBatchIsANoOp) {
  SY_REQUIRE_GPU();
  CheckCase({0, 5, 2, 1, 16}, 3000);
  // No query heads: nothing reads k or v, so dk = dv = 0 (written over the NaN fill).
  CheckCase({2, 5, 0, 1, 16}, 3010);
}

TEST(AttentionGpuTest, ChunksTheBatchWhenScoresExceedTheScratchBudget) {
  SY_REQUIRE_GPU();
  // Hq S^2 floats = 512 MiB per batch element against a 1 GiB budget: the forward runs the
  // batch in chunks of 2 (2 + 1), the backward (two score buffers) in chunks of 1.
  CheckCase({3, 2048, 32, 8, 16}, 4000);
}

}  // namespace
}  // namespace switchyard::kernels
