// kernels/flash_attention.h on the CPU: the twin of the fused bf16 kernel against the exact f32
// attention (kernels/cpu/attention.cc), forward (out, lse) and backward (dq, dk, dv), causal and
// kFull, multi-head, grouped-query and multi-query heads, S = 1, S below, at and past the
// 64-row block, head_dim 64 and 128; the switch (UseFlashAttention) and the dispatch through
// kernels::AttentionForward / AttentionBackward; backward without delta (recomputed from the
// fused forward) equals backward given the forward's delta, bit for bit.
//
// Tolerance, by construction: the exact f32 path is within tests/kernels/attention_bound.h's
// bound of the exact value, the twin within tests/kernels/flash_attention_bound.h's (bf16
// operands, unit 2^-8, derived from sum_e |q_e k_e|, head_dim and the row's magnitudes), so
// |twin - exact| <= the sum of the two.
#include "kernels/flash_attention.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "engine/core/device_context.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "tests/kernels/attention_bound.h"
#include "tests/kernels/flash_attention_bound.h"
#include "tests/kernels/grad_check.h"
#include "tests/testing/tolerance.h"

namespace switchyard::kernels {
namespace {

using test_util::AttentionRef;
using testing::RandomTensor;

struct Case {
  int64_t b, s, hq, hkv, hd;
  std::string Name() const {
    return "B=" + std::to_string(b) + " S=" + std::to_string(s) + " Hq=" + std::to_string(hq) +
           " Hkv=" + std::to_string(hkv) + " hd=" + std::to_string(hd);
  }
};

const Case kCases[] = {
    {1, 1, 1, 1, 64},    // one token
    {2, 1, 4, 2, 64},    // S = 1 with GQA
    {2, 37, 4, 2, 64},   // GQA 4:2, S below the block
    {1, 64, 3, 3, 64},   // multi-head, S exactly one block
    {1, 130, 4, 1, 128},  // MQA, hd 128, three key blocks, the last of 2 keys
    {2, 70, 2, 1, 128},  // GQA 2:1, S past one block
};

// q, k, v and dout of a case, uniform, from streams seed .. seed + 3.
struct Inputs {
  Tensor q, k, v, dout;
};
Inputs RandomInputs(const Case& c, uint64_t seed) {
  const Shape q{c.b, c.s, c.hq, c.hd}, kv{c.b, c.s, c.hkv, c.hd};
  return {RandomTensor(q, seed), RandomTensor(kv, seed + 1), RandomTensor(kv, seed + 2),
          RandomTensor(q, seed + 3)};
}

std::unique_ptr<DeviceContext> Bf16Context() {
  auto ctx = DeviceContext::Create(Device::Cpu());
  ctx->set_matmul_dtype(DType::kBF16);
  return ctx;
}

struct Result {
  Tensor out, lse, dq, dk, dv;
};

// Forward, then backward from dout with the forward's own lse (delta recomputed by the
// dispatch), through kernels/attention.h with `ctx` (bf16: the twin; null: exact f32).
Result RunBoth(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
           AttentionMask mask, DeviceContext* ctx) {
  const int64_t b = q.dim(0), s = q.dim(1), hq = q.dim(2);
  Result r{Tensor::Empty(q.shape(), DType::kF32), Tensor::Empty({b, hq, s}, DType::kF32),
           Tensor::Empty(q.shape(), DType::kF32), Tensor::Empty(k.shape(), DType::kF32),
           Tensor::Empty(k.shape(), DType::kF32)};
  AttentionForward(q, k, v, r.out, r.lse, ctx, mask);
  AttentionBackward(q, k, v, r.lse, dout, r.dq, r.dk, r.dv, ctx, mask);
  return r;
}

// |got - want| <= bound_a + bound_b elementwise; prints the worst fraction used.
void ExpectWithin(const Tensor& got, const Tensor& want, const std::vector<double>& bound_a,
                  const std::vector<double>& bound_b, const std::string& what) {
  std::vector<double> bound(bound_a.size());
  for (size_t i = 0; i < bound.size(); ++i) bound[i] = bound_a[i] + bound_b[i];
  test_util::ExpectWithinAttentionBound(got.ToVector<float>(), want.ToVector<float>(), bound, 1.0,
                                        what);
}

void CheckTwinAgainstExact(const Case& c, AttentionMask mask, uint64_t seed) {
  const bool causal = mask == AttentionMask::kCausal;
  const std::string name = c.Name() + (causal ? " causal" : " full");
  Tensor q = RandomTensor({c.b, c.s, c.hq, c.hd}, seed);
  Tensor k = RandomTensor({c.b, c.s, c.hkv, c.hd}, seed + 1);
  Tensor v = RandomTensor({c.b, c.s, c.hkv, c.hd}, seed + 2);
  Tensor dout = RandomTensor({c.b, c.s, c.hq, c.hd}, seed + 3);
  auto bf16 = Bf16Context();
  const Result twin = RunBoth(q, k, v, dout, mask, bf16.get());
  const Result exact = RunBoth(q, k, v, dout, mask, nullptr);
  const AttentionRef fb = test_util::FlashAttentionWithBound(q, k, v, dout, causal,
                                                             test_util::kBf16Unit);
  const AttentionRef eb = test_util::AttentionWithBound(q, k, v, dout, causal, /*merges=*/0);
  ExpectWithin(twin.out, exact.out, fb.out_bound, eb.out_bound, name + " out");
  ExpectWithin(twin.lse, exact.lse, fb.lse_bound, eb.lse_bound, name + " lse");
  ExpectWithin(twin.dq, exact.dq, fb.dq_bound, eb.dq_bound, name + " dq");
  ExpectWithin(twin.dk, exact.dk, fb.dk_bound, eb.dk_bound, name + " dk");
  ExpectWithin(twin.dv, exact.dv, fb.dv_bound, eb.dv_bound, name + " dv");
  // And each against the exact value on its own (the twin's bound is the one the GPU test
  // and docs/model.md state).
  test_util::ExpectWithinAttentionBound(twin.out.ToVector<float>(), fb.out, fb.out_bound, 1.0,
                                        name + " out vs exact value");
  test_util::ExpectWithinAttentionBound(twin.dq.ToVector<float>(), fb.dq, fb.dq_bound, 1.0,
                                        name + " dq vs exact value");
  test_util::ExpectWithinAttentionBound(twin.dk.ToVector<float>(), fb.dk, fb.dk_bound, 1.0,
                                        name + " dk vs exact value");
  test_util::ExpectWithinAttentionBound(twin.dv.ToVector<float>(), fb.dv, fb.dv_bound, 1.0,
                                        name + " dv vs exact value");
}

TEST(FlashAttentionTest, SwitchSelectsTheFusedPathOnlyForBf16AndSupportedWidths) {
  auto bf16 = Bf16Context();
  auto f32 = DeviceContext::Create(Device::Cpu());
  EXPECT_TRUE(UseFlashAttention(bf16.get(), 64));
  EXPECT_TRUE(UseFlashAttention(bf16.get(), 128));
  EXPECT_FALSE(UseFlashAttention(bf16.get(), 32));
  EXPECT_FALSE(UseFlashAttention(bf16.get(), 96));
  EXPECT_FALSE(UseFlashAttention(f32.get(), 64));
  EXPECT_FALSE(UseFlashAttention(nullptr, 64));
}

TEST(FlashAttentionTest, DispatchRunsTheTwinInBf16AndTheExactPathOtherwise) {
  const Case c{2, 70, 4, 2, 64};
  Tensor q = RandomTensor({c.b, c.s, c.hq, c.hd}, 11);
  Tensor k = RandomTensor({c.b, c.s, c.hkv, c.hd}, 12);
  Tensor v = RandomTensor({c.b, c.s, c.hkv, c.hd}, 13);
  auto bf16 = Bf16Context();
  auto bits = [](const Tensor& a, const Tensor& b) {
    return a.numel() == b.numel() &&
           std::memcmp(a.raw_data(), b.raw_data(), a.numel() * sizeof(float)) == 0;
  };
  for (AttentionMask mask : {AttentionMask::kCausal, AttentionMask::kFull}) {
    Tensor out = Tensor::Empty(q.shape(), DType::kF32);
    Tensor lse = Tensor::Empty({2, 4, 70}, DType::kF32);
    Tensor out_t = out.Clone(), lse_t = lse.Clone(), out_e = out.Clone(), lse_e = lse.Clone();
    AttentionForward(q, k, v, out, lse, bf16.get(), mask);
    cpu::FlashAttentionForward(q, k, v, out_t, lse_t, mask);
    cpu::AttentionForward(q, k, v, out_e, lse_e, mask);
    EXPECT_TRUE(bits(out, out_t) && bits(lse, lse_t)) << "bf16 context: the twin";
    EXPECT_FALSE(bits(out, out_e)) << "the twin rounds its operands; the exact path does not";
    AttentionForward(q, k, v, out, lse, nullptr, mask);
    EXPECT_TRUE(bits(out, out_e) && bits(lse, lse_e)) << "no context: the exact path";
  }
}

TEST(FlashAttentionTest, TwinMatchesExactAttentionWithinTheBf16Bound) {
  uint64_t seed = 100;
  for (const Case& c : kCases) {
    for (AttentionMask mask : {AttentionMask::kCausal, AttentionMask::kFull}) {
      CheckTwinAgainstExact(c, mask, seed += 10);
    }
  }
}

TEST(FlashAttentionTest, BackwardWithoutDeltaEqualsBackwardWithTheForwardsDelta) {
  const auto [q, k, v, dout] = RandomInputs({1, 100, 4, 2, 128}, 21);
  auto bf16 = Bf16Context();
  for (AttentionMask mask : {AttentionMask::kCausal, AttentionMask::kFull}) {
    const Result r = RunBoth(q, k, v, dout, mask, bf16.get());  // delta recomputed
    Tensor delta = Tensor::Empty(r.lse.shape(), DType::kF32);
    AttentionBackwardDelta(r.out, dout, delta);
    Tensor dq = Tensor::Empty(q.shape(), DType::kF32), dk = Tensor::Empty(k.shape(), DType::kF32);
    Tensor dv = Tensor::Empty(k.shape(), DType::kF32);
    AttentionBackward(q, k, v, r.lse, dout, dq, dk, dv, bf16.get(), mask, delta);
    EXPECT_EQ(dq.ToVector<float>(), r.dq.ToVector<float>());
    EXPECT_EQ(dk.ToVector<float>(), r.dk.ToVector<float>());
    EXPECT_EQ(dv.ToVector<float>(), r.dv.ToVector<float>());
  }
}

// q, k and v handed over in bf16 (the attention layer's, under bf16 activation storage) are
// the operands the fused path rounds f32 inputs to: the same bits out, lse, dq, dk and dv as
// from f32 inputs (here not bf16 values, so rounding happens on the f32 side).
TEST(FlashAttentionTest, Bf16InputsGiveTheBitsOfTheirF32Values) {
  const auto [q, k, v, dout] = RandomInputs({2, 70, 4, 2, 64}, 31);
  auto in_bf16 = [](const Tensor& t) {
    Tensor out = Tensor::Empty(t.shape(), DType::kBF16);
    Cast(t, out);
    return out;
  };
  auto bf16 = Bf16Context();
  for (AttentionMask mask : {AttentionMask::kCausal, AttentionMask::kFull}) {
    const Result f32 = RunBoth(q, k, v, dout, mask, bf16.get());
    const Result b16 = RunBoth(in_bf16(q), in_bf16(k), in_bf16(v), dout, mask, bf16.get());
    for (const auto& [got, want, what] :
         {std::tuple{&b16.out, &f32.out, "out"}, {&b16.lse, &f32.lse, "lse"},
          {&b16.dq, &f32.dq, "dq"}, {&b16.dk, &f32.dk, "dk"}, {&b16.dv, &f32.dv, "dv"}}) {
      EXPECT_EQ(got->ToVector<float>(), want->ToVector<float>()) << what;
    }
  }
}

TEST(FlashAttentionDeathTest, Bf16InputsOutsideTheFusedPathAreFatal) {
  const Shape qs{1, 8, 2, 64}, kvs{1, 8, 2, 64};
  Tensor q = Tensor::Zeros(qs, DType::kBF16), k = Tensor::Zeros(kvs, DType::kBF16);
  Tensor v = Tensor::Zeros(kvs, DType::kBF16);
  Tensor out = Tensor::Empty(qs, DType::kF32), lse = Tensor::Empty({1, 2, 8}, DType::kF32);
  EXPECT_DEATH(AttentionForward(q, k, v, out, lse, nullptr),
               "q, k and v in bf16 need the fused path");
  auto bf16 = Bf16Context();
  Tensor v32 = Tensor::Zeros(kvs, DType::kF32);
  EXPECT_DEATH(AttentionForward(q, k, v32, out, lse, bf16.get()), "v is f32, expected bf16");
}

}  // namespace
}  // namespace switchyard::kernels
