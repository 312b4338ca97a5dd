// The MoE routing family on CUDA (kernels/moe_routing.h through moe/router.h, aux_loss.h and
// capacity.h) against the CPU reference on the same inputs: RouterForward with and without
// jitter (the noise drawn again in the backward: the same bits), expert bias, gate normalisation and the random second expert, top-1/2/4, E in
// {4, 8, 64, 128} (and 300, 2048 for the kernel alone), T in {0, 1, 7, 1000}; its backward;
// the load-balancing sums and gradient; the z-loss; the bias update; the counts; capacity
// admission under both policies with keep masks and split-group offsets.
//
// Exact where the op is exact: indices, keep, counts, kept, position, dropped and removed
// must equal the CPU's. Tolerances elsewhere:
//  - RouterTopK on identical logits: both devices sum exp in double; CUDA rounds exp(double)
//    to f32 where the CPU calls expf (<= 0.502 ulp), and the double sums run in another
//    order, so probs and gates may differ by ~1 ulp:  |d| <= 1e-9 + 1e-6 |cpu|.
//  - RouterForward end to end: the logits come from cuBLAS vs OpenBLAS sgemm in another
//    summation order (d = 16..64 terms). Compared scale-relative, |d| <= 1e-5 max|cpu| +
//    1e-5 |cpu| (kernels/gemm's own contract is 1e-5 sum|h||w|, so an absolute 1e-6 would
//    fail a correct sgemm on logits near 0). The typical difference (~1e-6) moves probs by
//    as much relative to themselves: probs and gates |d| <= 1e-7 + 3e-5 |cpu|. A token
//    whose top-(k+1) scores lie within a relative 1e-4 of each other (or whose GShard
//    draw u is within 1e-4 of 2 g2) could legitimately route differently; such tokens are
//    counted (and must be rare) and left out of the exact comparison of that token's
//    indices, gates and keep.
//  - RouterBackward from the same RouterOutput: dlogits are double sums rounded once
//    (|d| <= 1e-9 + 1e-6 |cpu|); dh adds a GEMM over E terms and dWr one over T = 1000
//    tokens (f32 sums of O(1) partial sums in another order, ~sqrt(T) roundings): both
//    scale-relative, |d| <= 1e-5 max|cpu| + 1e-5 |cpu|, as the MoE layer test.
//  - Prob sums: double sums in another order, rounded to f32: 1e-6 relative.
//  - Z-loss: value 1e-6 relative; gradient |d| <= 1e-9 + 1e-6 |cpu|.
//  - The load-balancing gradient and the bias update are bit-identical (host constants,
//    one f32 add per element).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "kernels/moe_routing.h"
#include "kernels/random.h"
#include "moe/aux_loss.h"
#include "moe/capacity.h"
#include "moe/router.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::moe {
namespace {

using gpu_test::ExpectBitEqual;
using gpu_test::ExpectNear;
using gpu_test::HostUniform;
using gpu_test::ValuesOf;

const Device kCuda = Device::Cuda(0);

// Expects the same values in every element (integer tensors).
template <typename T>
void ExpectExact(const Tensor& got, const Tensor& want, DeviceContext* ctx,
                 const std::string& what) {
  const std::vector<T> g = ValuesOf<T>(got, ctx), w = ValuesOf<T>(want, ctx);
  ASSERT_EQ(g.size(), w.size()) << what;
  int64_t mismatches = 0, first = -1;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i] != w[i] && mismatches++ == 0) first = static_cast<int64_t>(i);
  }
  EXPECT_EQ(mismatches, 0) << what << ": " << mismatches << " elements differ, the first at "
                           << first << " (" << (first >= 0 ? +g[first] : 0) << " vs "
                           << (first >= 0 ? +w[first] : 0) << ")";
}

// |got - want| <= tol * max|want| + tol * |want| (GEMM results: summation-order errors
// scale with the sizes of the partial sums, not with each element).
void ExpectNearScaled(const Tensor& got, const Tensor& want, double tol, DeviceContext* ctx,
                      const std::string& what) {
  double scale = 0.0;
  for (float v : ValuesOf<float>(want, ctx)) scale = std::max(scale, std::fabs(double{v}));
  ExpectNear(got, want, tol * scale + 1e-30, tol, ctx, what);
}

MoEConfig Config(int64_t d, int64_t E, int64_t k) {
  MoEConfig c;
  c.d_model = d;
  c.num_experts = E;
  c.top_k = k;
  c.d_expert = 4;
  return c;
}

RouterOutput ToCuda(const RouterOutput& r, DeviceContext* ctx) {
  RouterOutput g;
  auto to = [&](const Tensor& t) { return t.defined() ? t.To(kCuda, ctx) : Tensor(); };
  g.input = to(r.input);
  g.jitter = r.jitter;  // host values: the noise is drawn again where it is used
  g.logits = to(r.logits);
  g.probs = to(r.probs);
  g.indices = to(r.indices);
  g.gates = to(r.gates);
  g.keep = to(r.keep);
  return g;
}

// Tokens whose routing could legitimately differ between devices: the CPU's top-(k+1)
// scores (probs + bias) within a relative `margin` of each other, or the GShard draw within
// `margin` of its threshold.
std::vector<bool> NearTies(const RouterOutput& cpu, const Tensor& bias, const MoEConfig& config,
                           const RouterRng& rng, double margin) {
  const int64_t T = cpu.probs.dim(0), E = cpu.probs.dim(1), k = config.top_k;
  const std::vector<float> p = cpu.probs.ToVector<float>();
  const std::vector<float> b = bias.defined() ? bias.ToVector<float>() : std::vector<float>(E);
  const std::vector<int32_t> idx = cpu.indices.ToVector<int32_t>();
  const RngKey key = SecondExpertRngKey(rng.seed, rng.step, rng.layer);
  std::vector<bool> near(T, false);
  for (int64_t t = 0; t < T; ++t) {
    std::vector<float> s(E);
    for (int64_t e = 0; e < E; ++e) s[e] = p[t * E + e] + b[e];
    std::sort(s.begin(), s.end(), std::greater<float>());
    for (int64_t r = 0; r < std::min(k, E - 1); ++r) {
      const double scale = std::max(std::fabs(s[r]), std::fabs(s[r + 1]));
      if (s[r] - s[r + 1] <= margin * scale) near[t] = true;
    }
    if (config.second_expert_policy == SecondExpertPolicy::kRandom) {
      const float p1 = p[t * E + idx[t * k]], p2 = p[t * E + idx[t * k + 1]];
      const double g2 = p2 / (p1 + p2);
      const double u = UniformAt(key, static_cast<uint64_t>(rng.first_token + t));
      if (std::fabs(u - 2.0 * g2) <= margin) near[t] = true;
    }
  }
  return near;
}

// Compares the per-token routing outputs of `gpu` with `cpu` on the tokens not in `skip`.
void ExpectSameRouting(const RouterOutput& gpu, const RouterOutput& cpu,
                       const std::vector<bool>& skip, double gate_atol, double gate_rtol,
                       DeviceContext* ctx, const std::string& what) {
  const int64_t T = cpu.indices.dim(0), k = cpu.indices.dim(1);
  const std::vector<int32_t> gi = ValuesOf<int32_t>(gpu.indices, ctx);
  const std::vector<int32_t> ci = cpu.indices.ToVector<int32_t>();
  const std::vector<uint8_t> gk = ValuesOf<uint8_t>(gpu.keep, ctx);
  const std::vector<uint8_t> ck = cpu.keep.ToVector<uint8_t>();
  const std::vector<float> gg = ValuesOf<float>(gpu.gates, ctx);
  const std::vector<float> cg = cpu.gates.ToVector<float>();
  int64_t bad_index = 0, bad_keep = 0, bad_gate = 0, skipped = 0;
  for (int64_t t = 0; t < T; ++t) {
    if (skip[t]) {
      ++skipped;
      continue;
    }
    for (int64_t j = 0; j < k; ++j) {
      const int64_t i = t * k + j;
      bad_index += gi[i] != ci[i];
      bad_keep += gk[i] != ck[i];
      bad_gate += !(std::fabs(gg[i] - cg[i]) <= gate_atol + gate_rtol * std::fabs(cg[i]));
    }
  }
  EXPECT_EQ(bad_index, 0) << what << ": indices differ";
  EXPECT_EQ(bad_keep, 0) << what << ": keep differs";
  EXPECT_EQ(bad_gate, 0) << what << ": gates differ beyond tolerance";
  // Near-ties are rare with these random inputs; many would mean the test checks little.
  EXPECT_LE(skipped, std::max<int64_t>(1, T / 50)) << what << ": too many near-tie tokens";
  std::printf("  %-56s exact on %lld/%lld tokens\n", what.c_str(),
              static_cast<long long>(T - skipped), static_cast<long long>(T));
}

struct RouterCase {
  int64_t T, d, E, k;
  bool jitter, bias, normalize, random_second;
};

std::string Name(const RouterCase& c) {
  return StrCat("T=", c.T, " d=", c.d, " E=", c.E, " k=", c.k, c.jitter ? " jitter" : "",
                c.bias ? " bias" : "", c.normalize ? " norm" : "",
                c.random_second ? " random2" : "");
}

const RouterCase kRouterCases[] = {
    {1, 16, 4, 1, false, false, false, false},   {7, 16, 4, 2, true, false, true, false},
    {7, 33, 8, 2, false, true, false, true},     {1000, 64, 8, 2, true, true, true, true},
    {1000, 64, 64, 1, true, false, false, false}, {1000, 48, 64, 4, false, true, true, false},
    {1000, 64, 128, 2, true, false, true, true},  {7, 64, 128, 4, true, true, false, false},
    {1000, 32, 4, 4, false, false, true, false},  {0, 16, 8, 2, true, true, true, false},
};

TEST(MoERoutingGpuTest, RouterForwardAndBackwardMatchCpu) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  uint64_t seed = 7000;
  for (const RouterCase& c : kRouterCases) {
    const std::string name = Name(c);
    MoEConfig config = Config(c.d, c.E, c.k);
    config.jitter_eps = c.jitter ? 0.1f : 0.0f;
    config.normalize_gates = c.normalize;
    config.second_expert_policy =
        c.random_second ? SecondExpertPolicy::kRandom : SecondExpertPolicy::kAll;
    const RouterRng rng{config.seed, 3, 1, 5000};
    Tensor h = HostUniform({c.T, c.d}, seed += 10);
    Tensor wr = HostUniform({c.d, c.E}, seed + 1);
    Tensor bias = c.bias ? HostUniform({c.E}, seed + 2, -0.05f, 0.05f) : Tensor();

    const RouterOutput cpu = RouterForward(h, wr, bias, config, true, rng);
    Tensor h_d = h.To(kCuda, gpu), wr_d = wr.To(kCuda, gpu);
    Tensor bias_d = c.bias ? bias.To(kCuda, gpu) : Tensor();
    const RouterOutput out = RouterForward(h_d, wr_d, bias_d, config, true, rng, gpu);
    ASSERT_TRUE(out.probs.device() == kCuda) << name;
    ASSERT_EQ(out.jitter.on, c.jitter) << name;
    if (c.jitter) {
      // Philox and the scaling are the CPU's operations: the same noise, and x = h * noise
      // is one f32 multiply on both.
      ExpectNear(JitterNoise(out, gpu), JitterNoise(cpu), 0.0, 0.0, gpu, name + " noise");
      ExpectNear(out.input, cpu.input, 0.0, 0.0, gpu, name + " router input");
    }
    ExpectNearScaled(out.logits, cpu.logits, 1e-5, gpu, name + " logits");
    ExpectNear(out.probs, cpu.probs, 1e-7, 3e-5, gpu, name + " probs");
    ExpectSameRouting(out, cpu, NearTies(cpu, bias, config, rng, 1e-4), 1e-7, 3e-5, gpu,
                      name + " routing");

    // Backward from the CPU's RouterOutput on both devices, with both extra gradients.
    const RouterOutput same = ToCuda(cpu, gpu);
    Tensor dgates = HostUniform({c.T, c.k}, seed + 3);
    Tensor dprobs = HostUniform({c.T, c.E}, seed + 4, -0.1f, 0.1f);
    Tensor dextra = HostUniform({c.T, c.E}, seed + 5, -0.1f, 0.1f);
    Tensor dh = HostUniform({c.T, c.d}, seed + 6), dwr = HostUniform({c.d, c.E}, seed + 7);
    Tensor dh_d = dh.To(kCuda, gpu), dwr_d = dwr.To(kCuda, gpu);
    Tensor dl = RouterBackward(cpu, wr, config, dgates, dprobs, dextra, dh, dwr);
    Tensor dl_d = RouterBackward(same, wr_d, config, dgates.To(kCuda, gpu),
                                 dprobs.To(kCuda, gpu), dextra.To(kCuda, gpu), dh_d, dwr_d, gpu);
    ExpectNear(dl_d, dl, 1e-9, 1e-6, gpu, name + " dlogits");
    ExpectNearScaled(dh_d, dh, 1e-5, gpu, name + " dh");
    ExpectNearScaled(dwr_d, dwr, 1e-5, gpu, name + " dWr");
    // Without the optional gradients.
    Tensor dl2 = RouterBackward(cpu, wr, config, dgates, Tensor(), Tensor(), dh, dwr);
    Tensor dl2_d = RouterBackward(same, wr_d, config, dgates.To(kCuda, gpu), Tensor(), Tensor(),
                                  dh_d, dwr_d, gpu);
    ExpectNear(dl2_d, dl2, 1e-9, 1e-6, gpu, name + " dlogits (gates only)");
  }
}

TEST(MoERoutingGpuTest, RouterLogitsStayF32UnderBf16Matmuls) {
  SY_REQUIRE_GPU();
  auto f32_context = DeviceContext::Create(kCuda);
  auto bf16_context = DeviceContext::Create(kCuda);
  bf16_context->set_matmul_dtype(DType::kBF16);
  MoEConfig config = Config(64, 16, 2);
  Tensor h = HostUniform({100, 64}, 71).To(kCuda, f32_context.get());
  Tensor wr = HostUniform({64, 16}, 72).To(kCuda, f32_context.get());
  f32_context->Synchronize();
  const RouterOutput a = RouterForward(h, wr, Tensor(), config, false, {}, f32_context.get());
  // a's logits are written on f32_context's stream and read below on bf16_context's: the
  // two (non-blocking) streams are not ordered, so wait for the first one here.
  f32_context->Synchronize();
  const RouterOutput b = RouterForward(h, wr, Tensor(), config, false, {}, bf16_context.get());
  ExpectBitEqual(b.logits, a.logits, bf16_context.get(), "logits under a bf16 context");
  EXPECT_EQ(bf16_context->matmul_dtype(), DType::kBF16) << "the context's setting is restored";
}

// The random second-expert draw keyed from device memory (kernels::DeviceRng,
// runtime.cuda_graphs) on the GPU: the same outputs as the host-keyed draw on the GPU.
TEST(MoERoutingGpuTest, DeviceKeyedSecondExpertEqualsHostKeyed) {
  SY_REQUIRE_GPU();
  auto ctx_owner = DeviceContext::Create(Device::Cuda(0));
  DeviceContext* ctx = ctx_owner.get();
  const int64_t T = 300, E = 8, k = 2, first_token = 4000, offset = 9;
  const RngKey key{11, 22};
  std::vector<float> l(T * E);
  for (int64_t i = 0; i < T * E; ++i) l[i] = std::sin(0.41f * static_cast<float>(i));
  const Tensor logits = Tensor::FromVector(l, {T, E}).To(Device::Cuda(0), ctx);
  auto run = [&](bool device_key) {
    const Device dev = Device::Cuda(0);
    Tensor probs = Tensor::Empty({T, E}, DType::kF32, dev), scores;
    Tensor indices = Tensor::Empty({T, k}, DType::kI32, dev);
    Tensor gates = Tensor::Empty({T, k}, DType::kF32, dev);
    Tensor keep = Tensor::Empty({T, k}, DType::kU8, dev);
    const kernels::RouterScoring softmax{.normalize = true};
    if (device_key) {
      const Tensor values = Tensor::FromVector<int64_t>(
          {static_cast<int64_t>(key.stream), first_token}, {2}).To(dev, ctx);
      kernels::RouterTopKScored(logits, Tensor(), softmax, true,
                                kernels::DeviceRng{.seed = key.seed, .values = values,
                                                   .token_offset = offset},
                                probs, scores, indices, gates, keep, ctx);
    } else {
      kernels::RouterTopKScored(logits, Tensor(), softmax, true, key, first_token + offset,
                                probs, scores, indices, gates, keep, ctx);
    }
    return std::make_pair(indices.ToVector<int32_t>(), keep.ToVector<uint8_t>());
  };
  const auto host = run(false), device = run(true);
  EXPECT_EQ(device.first, host.first);
  EXPECT_EQ(device.second, host.second);
}

// RouterTopK on identical logits: ~1 ulp probs; exact ties (equal logits) resolved alike.
TEST(MoERoutingGpuTest, RouterTopKOnSameLogits) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  struct Case {
    int64_t T, E, k;
    bool quantized, bias, normalize, random_second;
  };
  const Case cases[] = {
      {1, 4, 4, false, false, true, false},     {33, 7, 3, true, false, false, false},
      {1000, 64, 2, true, true, true, true},    {1000, 128, 8, false, true, false, false},
      {257, 300, 4, true, false, true, false},  {5, 2048, 2, false, true, true, true},
      {64, 2048, 6, true, false, false, false}, {0, 8, 2, false, false, false, false},
  };
  uint64_t seed = 8100;
  for (const Case& c : cases) {
    const std::string name = StrCat("RouterTopK T=", c.T, " E=", c.E, " k=", c.k,
                                    c.quantized ? " ties" : "", c.bias ? " bias" : "",
                                    c.normalize ? " norm" : "", c.random_second ? " random2" : "");
    Tensor logits = HostUniform({c.T, c.E}, seed += 10, -4.0f, 4.0f);
    if (c.quantized) {  // values on a 0.5 grid: many exact ties per row
      float* l = logits.data<float>();
      for (int64_t i = 0; i < logits.numel(); ++i) l[i] = std::round(l[i] * 2.0f) / 2.0f;
    }
    Tensor bias = c.bias ? HostUniform({c.E}, seed + 1, -0.01f, 0.01f) : Tensor();
    if (c.bias && c.quantized) {  // equal bias on pairs too
      float* b = bias.data<float>();
      for (int64_t e = 0; e < c.E; ++e) b[e] = (e % 3) * 0.005f;
    }
    const RngKey key{11, 22};
    auto run = [&](Device dev, DeviceContext* ctx) {
      RouterOutput o;
      o.probs = Tensor::Empty({c.T, c.E}, DType::kF32, dev);
      o.indices = Tensor::Empty({c.T, c.k}, DType::kI32, dev);
      o.gates = Tensor::Empty({c.T, c.k}, DType::kF32, dev);
      o.keep = Tensor::Empty({c.T, c.k}, DType::kU8, dev);
      kernels::RouterTopK(logits.To(dev, ctx), bias.defined() ? bias.To(dev, ctx) : Tensor(),
                          c.normalize, c.random_second, key, 100, o.probs, o.indices, o.gates,
                          o.keep, ctx);
      return o;
    };
    const RouterOutput cpu = run(Device::Cpu(), nullptr);
    const RouterOutput out = run(kCuda, gpu);
    ExpectNear(out.probs, cpu.probs, 1e-9, 1e-6, gpu, name + " probs");
    // Exact ties (equal logit and equal bias) give bit-equal scores on each device and must
    // resolve alike; only near ties between different values may differ: skip those tokens.
    std::vector<bool> skip(c.T, false);
    const std::vector<float> p = cpu.probs.ToVector<float>();
    const std::vector<float> l = logits.ToVector<float>();
    const std::vector<float> b = c.bias ? bias.ToVector<float>() : std::vector<float>(c.E, 0.0f);
    const std::vector<int32_t> idx = cpu.indices.ToVector<int32_t>();
    for (int64_t t = 0; t < c.T; ++t) {
      std::vector<int64_t> order(c.E);
      for (int64_t e = 0; e < c.E; ++e) order[e] = e;
      auto score = [&](int64_t e) { return p[t * c.E + e] + b[e]; };
      std::stable_sort(order.begin(), order.end(),
                       [&](int64_t x, int64_t y) { return score(x) > score(y); });
      for (int64_t r = 0; r < std::min(c.k, c.E - 1); ++r) {
        const int64_t x = order[r], y = order[r + 1];
        const bool same = l[t * c.E + x] == l[t * c.E + y] && b[x] == b[y];
        if (!same && score(x) - score(y) <= 1e-6f * std::fabs(score(x))) skip[t] = true;
      }
      if (c.random_second) {
        const float p1 = p[t * c.E + idx[t * c.k]], p2 = p[t * c.E + idx[t * c.k + 1]];
        const double u = UniformAt(key, static_cast<uint64_t>(100 + t));
        if (std::fabs(u - 2.0 * p2 / (p1 + p2)) <= 1e-6) skip[t] = true;
      }
    }
    ExpectSameRouting(out, cpu, skip, 1e-9, 1e-6, gpu, name);
  }
}

TEST(MoERoutingGpuTest, LoadBalanceAndZLossMatchCpu) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  struct Case {
    int64_t T, E, k;
  };
  const Case cases[] = {{1, 4, 1}, {7, 8, 2}, {1000, 64, 2}, {1000, 128, 4}, {5000, 8, 1},
                        {300000, 16, 2}, {0, 8, 2}};
  uint64_t seed = 9100;
  for (const Case& c : cases) {
    const std::string name = StrCat("T=", c.T, " E=", c.E, " k=", c.k);
    // Real router outputs (softmax rows, top-k indices) from logits.
    Tensor logits = HostUniform({c.T, c.E}, seed += 10, -3.0f, 3.0f);
    Tensor probs = Tensor::Empty({c.T, c.E}, DType::kF32);
    Tensor indices = Tensor::Empty({c.T, c.k}, DType::kI32);
    Tensor gates = Tensor::Empty({c.T, c.k}, DType::kF32);
    Tensor keep = Tensor::Empty({c.T, c.k}, DType::kU8);
    kernels::RouterTopK(logits, Tensor(), false, false, {}, 0, probs, indices, gates, keep);
    Tensor probs_d = probs.To(kCuda, gpu), indices_d = indices.To(kCuda, gpu);
    Tensor logits_d = logits.To(kCuda, gpu);

    const LoadBalanceSums s = LoadBalanceSumsOf(probs, indices);
    const LoadBalanceSums s_d = LoadBalanceSumsOf(probs_d, indices_d, gpu);
    EXPECT_EQ(s_d.tokens, s.tokens) << name;
    EXPECT_EQ(s_d.assignments, s.assignments) << name << " assignments";
    ASSERT_EQ(s_d.prob_sums.size(), s.prob_sums.size()) << name;
    for (size_t e = 0; e < s.prob_sums.size(); ++e) {
      EXPECT_NEAR(s_d.prob_sums[e], s.prob_sums[e], 1e-6 * std::fabs(s.prob_sums[e]))
          << name << " prob sum " << e;
    }
    std::vector<int64_t> counts(c.E, 3), counts_d(c.E, 3);
    CountAssignments(indices, counts);
    CountAssignments(indices_d, counts_d, gpu);
    EXPECT_EQ(counts_d, counts) << name << " CountAssignments";
    EXPECT_EQ(SlotExpertCounts(indices_d, keep.To(kCuda, gpu), c.E, gpu),
              SlotExpertCounts(indices, keep, c.E))
        << name << " SlotExpertCounts";

    // The load-balancing gradient from the same sums: bit-identical.
    Tensor dprobs = HostUniform({c.T, c.E}, seed + 1);
    Tensor dprobs_d = dprobs.To(kCuda, gpu);
    const float aux = LoadBalancingLoss(probs, indices, 0.01f, 0.7f, &dprobs);
    LoadBalancingLossBackward(s, c.k, 0.01f, 0.7f, dprobs_d, kernels::Write::kAdd, gpu);
    ExpectBitEqual(dprobs_d, dprobs, gpu, name + " lb dprobs");
    // kSet over NaN (never read): the CPU's kSet bits.
    const Tensor nan_rows = Tensor::FromVector(
        std::vector<float>(c.T * c.E, std::numeric_limits<float>::quiet_NaN()), {c.T, c.E});
    Tensor set = nan_rows.Clone(), set_d = nan_rows.To(kCuda, gpu);
    LoadBalancingLossBackward(s, c.k, 0.01f, 0.7f, set, kernels::Write::kSet);
    LoadBalancingLossBackward(s, c.k, 0.01f, 0.7f, set_d, kernels::Write::kSet, gpu);
    ExpectBitEqual(set_d, set, gpu, name + " lb dprobs kSet");
    const float aux_d = LoadBalancingLoss(probs_d, indices_d, 0.01f, 0.7f, nullptr, gpu);
    EXPECT_NEAR(aux_d, aux, 1e-6 * std::fabs(aux) + 1e-12) << name << " aux";

    // Z-loss, whole group and as a piece of a larger group.
    for (int64_t group : {int64_t{0}, 2 * c.T + 3}) {
      Tensor dl = HostUniform({c.T, c.E}, seed + 2);
      Tensor dl_d = dl.To(kCuda, gpu), dl2_d = dl.To(kCuda, gpu);
      const float z = ZLoss(logits, 0.001f, 1.3f, &dl, group);
      const float z_d = ZLoss(logits_d, 0.001f, 1.3f, &dl_d, group, gpu);
      EXPECT_NEAR(z_d, z, 1e-6 * std::fabs(z) + 1e-12) << name << " z, group " << group;
      ExpectNear(dl_d, dl, 1e-9, 1e-6, gpu, StrCat(name, " z dlogits, group ", group));
      ZLossBackward(logits_d, 0.001f, 1.3f, dl2_d, kernels::Write::kAdd, group, gpu);
      ExpectBitEqual(dl2_d, dl_d, gpu, name + " ZLossBackward vs ZLoss");
      // kSet over NaN: the bits of ZLoss's term added into zeros.
      Tensor zeros_d = Tensor::Zeros({c.T, c.E}, DType::kF32, kCuda, gpu);
      ZLoss(logits_d, 0.001f, 1.3f, &zeros_d, group, gpu);
      Tensor set_dl_d = nan_rows.To(kCuda, gpu);
      ZLossBackward(logits_d, 0.001f, 1.3f, set_dl_d, kernels::Write::kSet, group, gpu);
      ExpectBitEqual(set_dl_d, zeros_d.To(Device::Cpu(), gpu), gpu,
                     name + " ZLossBackward kSet vs into zeros");
      EXPECT_NEAR(ZLoss(logits_d, 0.001f, 0.0f, nullptr, group, gpu), z,
                  1e-6 * std::fabs(z) + 1e-12);
    }
  }
}

TEST(MoERoutingGpuTest, UpdateExpertBiasMatchesCpu) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  Tensor b = Tensor::FromVector(std::vector<float>{0.1f, 0.0f, -0.2f, 0.5f, -0.0f, 0.0f}, {6});
  Tensor b_d = b.To(kCuda, gpu);
  const std::vector<int64_t> counts = {9, 3, 6, 6, 6, 6};  // mean 6
  UpdateExpertBias(b, counts, 0.01f);
  UpdateExpertBias(b_d, counts, 0.01f, gpu);
  ExpectBitEqual(b_d, b, gpu, "expert bias (a -0 with diff 0 stays -0)");
}

// ---- Admission --------------------------------------------------------------------------

void ExpectSameAdmission(const Admission& got, const Admission& want, DeviceContext* ctx,
                         const std::string& what) {
  ExpectExact<uint8_t>(got.kept, want.kept, ctx, what + " kept");
  ExpectExact<int64_t>(got.position, want.position, ctx, what + " position");
  EXPECT_EQ(got.counts_before, want.counts_before) << what << " counts_before";
  EXPECT_EQ(got.counts_after, want.counts_after) << what << " counts_after";
  EXPECT_EQ(got.dropped, want.dropped) << what << " dropped";
  EXPECT_EQ(got.removed, want.removed) << what << " removed";
}

// Indices (T, k) with distinct experts per token, skewed towards low experts; gates with
// many exact ties (multiples of 1/8, some -0); keep with ~1/4 zeros (or undefined).
struct Assignments {
  Tensor indices, gates, keep;
};

Assignments RandomAssignments(int64_t T, int64_t E, int64_t k, bool with_keep, uint64_t seed) {
  Assignments a;
  std::vector<int32_t> idx(T * k);
  std::vector<float> g(T * k);
  std::vector<uint8_t> keep(T * k);
  const RngKey key{seed, 1};
  uint64_t n = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool(E);
    for (int64_t e = 0; e < E; ++e) pool[e] = static_cast<int32_t>(e);
    for (int64_t j = 0; j < k; ++j) {
      // Squared uniform: favours the low experts, so capacity binds.
      const float u = UniformAt(key, n++);
      const int64_t pick = std::min<int64_t>(E - j - 1, static_cast<int64_t>(u * u * (E - j)));
      idx[t * k + j] = pool[pick];
      pool.erase(pool.begin() + pick);
      const float v = std::floor(UniformAt(key, n++) * 8.0f) / 8.0f;
      g[t * k + j] = v == 0.0f && UniformAt(key, n++) < 0.5f ? -0.0f : v;
      keep[t * k + j] = UniformAt(key, n++) < 0.75f ? 1 : 0;
    }
  }
  a.indices = Tensor::FromVector(idx, {T, k});
  a.gates = Tensor::FromVector(g, {T, k});
  if (with_keep) a.keep = Tensor::FromVector(keep, {T, k});
  return a;
}

TEST(MoERoutingGpuTest, AdmissionMatchesCpuExactly) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  struct Case {
    int64_t T, E, k;
  };
  const Case cases[] = {{1, 4, 1},     {7, 4, 2},      {7, 8, 4},     {1000, 8, 2},
                        {1000, 64, 1}, {1000, 64, 4},  {4099, 128, 2}, {100, 4, 4},
                        {0, 8, 2},     {20000, 16, 2}};
  uint64_t seed = 9900;
  for (const Case& c : cases) {
    for (bool with_keep : {false, true}) {
      const Assignments a = RandomAssignments(c.T, c.E, c.k, with_keep, seed += 10);
      Tensor idx_d = a.indices.To(kCuda, gpu), gates_d = a.gates.To(kCuda, gpu);
      Tensor keep_d = with_keep ? a.keep.To(kCuda, gpu) : Tensor();
      const int64_t balanced = ExpertCapacity(1.0, c.T, c.k, c.E);
      for (int64_t capacity : {kDropless, int64_t{0}, int64_t{1}, balanced, 2 * balanced + 1}) {
        for (DropPolicy policy : {DropPolicy::kPosition, DropPolicy::kProbability}) {
          const std::string name =
              StrCat("admission T=", c.T, " E=", c.E, " k=", c.k, " C=", capacity,
                     policy == DropPolicy::kPosition ? " position" : " probability",
                     with_keep ? " keep" : "");
          const Admission want =
              AdmitToCapacity(a.indices, a.gates, a.keep, c.E, capacity, policy);
          const Admission got =
              AdmitToCapacity(idx_d, gates_d, keep_d, c.E, capacity, policy, {}, gpu);
          ASSERT_TRUE(got.kept.device() == kCuda) << name;
          ExpectSameAdmission(got, want, gpu, name);
        }
      }
      // A group split in three pieces, admitted piece by piece with priority offsets.
      if (c.T >= 3) {
        const int64_t cuts[] = {0, c.T / 3, (2 * c.T) / 3 + 1, c.T};
        const std::vector<int64_t> total = SlotExpertCounts(a.indices, a.keep, c.E);
        std::vector<int64_t> prefix(c.k * c.E, 0);
        for (int p = 0; p < 3; ++p) {
          auto piece = [&](const Tensor& t) {
            return t.defined() ? t.Slice(cuts[p], cuts[p + 1]) : Tensor();
          };
          const std::vector<int64_t> offsets = PositionOffsets(prefix, total, c.k, c.E);
          const Tensor pi = piece(a.indices), pk = piece(a.keep);
          const Admission want = AdmitToCapacity(pi, Tensor(), pk, c.E, balanced,
                                                 DropPolicy::kPosition, offsets);
          const Admission got = AdmitToCapacity(pi.To(kCuda, gpu), Tensor(),
                                                pk.defined() ? pk.To(kCuda, gpu) : Tensor(),
                                                c.E, balanced, DropPolicy::kPosition, offsets,
                                                gpu);
          ExpectSameAdmission(got, want, gpu,
                              StrCat("split T=", c.T, " E=", c.E, " k=", c.k, " piece ", p));
          const std::vector<int64_t> piece_counts = SlotExpertCounts(pi, pk, c.E);
          for (size_t i = 0; i < prefix.size(); ++i) prefix[i] += piece_counts[i];
        }
      }
    }
  }
}

TEST(MoERoutingGpuTest, AdmissionEdgeCases) {
  SY_REQUIRE_GPU();
  auto context = DeviceContext::Create(kCuda);
  DeviceContext* gpu = context.get();
  // Every assignment removed; every token to one expert; k = E.
  const int64_t T = 50, E = 4;
  std::vector<int32_t> one(T * 2);
  for (int64_t t = 0; t < T; ++t) one[2 * t] = 2, one[2 * t + 1] = 3;
  Tensor idx = Tensor::FromVector(one, {T, 2});
  Tensor gates = HostUniform({T, 2}, 4242, 0.0f, 1.0f);
  Tensor none = Tensor::Zeros({T, 2}, DType::kU8);
  for (DropPolicy policy : {DropPolicy::kPosition, DropPolicy::kProbability}) {
    for (const Tensor& keep : {none, Tensor()}) {
      const std::string name = StrCat(policy == DropPolicy::kPosition ? "position" : "probability",
                                      keep.defined() ? " all removed" : " one expert");
      const Admission want = AdmitToCapacity(idx, gates, keep, E, 5, policy);
      const Admission got = AdmitToCapacity(
          idx.To(kCuda, gpu), gates.To(kCuda, gpu),
          keep.defined() ? keep.To(kCuda, gpu) : Tensor(), E, 5, policy, {}, gpu);
      ExpectSameAdmission(got, want, gpu, name);
    }
  }
  const Assignments all = RandomAssignments(300, 6, 6, true, 4343);
  for (DropPolicy policy : {DropPolicy::kPosition, DropPolicy::kProbability}) {
    const Admission want = AdmitToCapacity(all.indices, all.gates, all.keep, 6, 40, policy);
    const Admission got =
        AdmitToCapacity(all.indices.To(kCuda, gpu), all.gates.To(kCuda, gpu),
                        all.keep.To(kCuda, gpu), 6, 40, policy, {}, gpu);
    ExpectSameAdmission(got, want, gpu, "k = E");
  }
}

}  // namespace
}  // namespace switchyard::moe
