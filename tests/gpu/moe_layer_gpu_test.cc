// The whole MoE layer (moe/moe_layer.h) on CUDA against the same layer on the CPU: the same
// weights (Init with the same seed on both, then the CPU values copied into the CUDA layer
// so that both hold identical bits), the same input, forward and backward, for top-1 /
// top-2 / top-4, gelu / relu / swiglu, capacity with drops (position and probability
// policies) and dropless, jitter, the random second expert, expert bias (and its update),
// expert biases, shared experts, several routing groups, evaluation mode; and with
// matmul_dtype = bf16 on BOTH contexts (the CPU DeviceContext rounds GEMM operands exactly
// as the GPU does).
//
// Routing. The routing decisions must agree exactly (indices, the GShard keep, the kept
// assignments and their order: the plan's inverse map). The inputs have O(1) router logits
// (MakeLayer's router weight std 0.8) and ~100 tokens per case, so a near-tie closer than
// the CPU/GPU logit difference (~1e-6 relative: cuBLAS vs OpenBLAS summation order) is
// unlikely; when routing does differ the test FAILS, printing each differing slot with the
// CPU's top-k margin of that token (a tiny margin means a near-tie and the inputs, not the
// kernels, need changing), and skips the value comparisons of that case.
//
// Tolerances, with scale = max |cpu| of each tensor, |gpu - cpu| <= atol * scale + rtol |cpu|:
//  - f32 GEMMs: atol = rtol = 1e-5 (GEMM summation order, propagated through at most a few
//    products) for y, dh and every parameter gradient.
//  - bf16 GEMM operands: atol = rtol = 2e-3 (an f32 difference of ~1e-6 may flip one bf16
//    rounding of an intermediate operand, a 2^-8 change of one term).
//  - counts (tokens per expert before / after dropping, per group, dropped): exact.
//  - aux, z: 1e-5 relative (f32: double sums of probs in another order); entropy 1e-5
//    relative. bf16: 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "engine/core/status.h"
#include "kernels/random.h"
#include "moe/moe_layer.h"
#include "tests/gpu/gpu_test_util.h"
#include "tests/moe/moe_layer_test_util.h"

namespace switchyard::moe {
namespace {

using gpu_test::ExpectNear;
using gpu_test::ValuesOf;

const Device kCuda = Device::Cuda(0);
constexpr uint64_t kSeed = 7;

struct Case {
  std::string name;
  MoEConfig config;
  int64_t groups = 2, group_tokens = 48;
  bool training = true;
};

MoEConfig BaseConfig(int64_t e, int64_t k, Activation act) {
  MoEConfig c;
  c.d_model = 32;
  c.num_experts = e;
  c.top_k = k;
  c.d_expert = 48;
  c.activation = act;
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  return c;
}

std::vector<Case> Cases() {
  std::vector<Case> cases;
  {
    Case c{"top-1 gelu, capacity 1.0 (drops)", BaseConfig(8, 1, Activation::kGelu)};
    c.config.capacity_factor = 1.0f;
    cases.push_back(c);
  }
  {
    Case c{"top-2 swiglu, dropless, normalized gates", BaseConfig(8, 2, Activation::kSwiglu)};
    c.config.capacity_factor = 0.0f;
    c.config.normalize_gates = true;
    cases.push_back(c);
  }
  {
    Case c{"top-2 gelu, capacity 1.0 by probability, expert biases",
           BaseConfig(8, 2, Activation::kGelu)};
    c.config.capacity_factor = 1.0f;
    c.config.drop_policy = DropPolicy::kProbability;
    c.config.bias = true;
    cases.push_back(c);
  }
  {
    Case c{"top-2 swiglu, jitter, capacity 1.25", BaseConfig(8, 2, Activation::kSwiglu)};
    c.config.jitter_eps = 0.1f;
    cases.push_back(c);
  }
  {
    Case c{"top-2 relu, expert bias (aux-loss-free)", BaseConfig(8, 2, Activation::kRelu)};
    c.config.expert_bias_rate = 0.01f;
    c.config.capacity_factor = 1.0f;
    cases.push_back(c);
  }
  {
    Case c{"top-2 swiglu, 2 shared experts, biases", BaseConfig(8, 2, Activation::kSwiglu)};
    c.config.num_shared_experts = 2;
    c.config.d_shared = 16;
    c.config.bias = true;
    cases.push_back(c);
  }
  {
    Case c{"top-2 swiglu, normalized gates, routed scaling 2.5, a shared expert",
           BaseConfig(8, 2, Activation::kSwiglu)};
    c.config.normalize_gates = true;
    c.config.routed_scaling_factor = 2.5f;
    c.config.num_shared_experts = 1;
    cases.push_back(c);
  }
  {
    Case c{"top-2 gelu, random second expert, 3 groups", BaseConfig(8, 2, Activation::kGelu)};
    c.config.second_expert_policy = SecondExpertPolicy::kRandom;
    c.config.normalize_gates = true;
    c.groups = 3;
    c.group_tokens = 32;
    cases.push_back(c);
  }
  {
    Case c{"top-4 E=16 gelu, capacity 1.0, 4 groups", BaseConfig(16, 4, Activation::kGelu)};
    c.config.capacity_factor = 1.0f;
    c.groups = 4;
    c.group_tokens = 32;
    cases.push_back(c);
  }
  {
    Case c{"top-2 swiglu, evaluation (eval capacity 1.0)", BaseConfig(8, 2, Activation::kSwiglu)};
    c.config.eval_capacity_factor = 1.0f;
    c.config.jitter_eps = 0.1f;  // off in evaluation
    c.training = false;
    cases.push_back(c);
  }
  return cases;
}

using testing::Param;
using testing::ParamsOf;

// A CPU layer with O(1) router logits and non-zero biases (as tests/moe's MakeLayer), and
// a CUDA layer from Init on ctx whose values are then overwritten by the CPU layer's.
MoELayer MakeCpuLayer(const MoEConfig& config, dist::Communicator* ep, DeviceContext* cpu_ctx) {
  MoELayer layer = MoELayer::Init(config, /*layer_id=*/3, ep, kSeed, /*std=*/0.35f, cpu_ctx);
  Tensor wr = layer.router_weight();
  kernels::FillNormal(wr, RngKey{kSeed, 901}, 0, 0.0f, 0.8f);
  auto fill_bias = [&](Experts& ex, uint64_t stream) {
    if (Tensor b1 = ex.b1(); b1.defined()) {
      kernels::FillNormal(b1, RngKey{kSeed, stream}, 0, 0.0f, 0.2f);
    }
    if (Tensor b2 = ex.b2(); b2.defined()) {
      kernels::FillNormal(b2, RngKey{kSeed, stream + 1}, 0, 0.0f, 0.2f);
    }
  };
  fill_bias(layer.experts(), 910);
  if (layer.shared()) fill_bias(layer.shared()->experts(), 920);
  if (Tensor b = layer.expert_bias(); b.defined()) {
    kernels::FillNormal(b, RngKey{kSeed, 930}, 0, 0.0f, 0.05f);
  }
  return layer;
}

MoELayer MakeGpuLayer(MoELayer& cpu, dist::Communicator* ep, DeviceContext* ctx) {
  MoELayer gpu = MoELayer::Init(cpu.config(), cpu.layer_id(), ep, kSeed, 0.35f, ctx);
  EXPECT_EQ(gpu.device(), kCuda);
  // Init draws the same values on both devices (FillNormal on each): compare the untouched
  // w1 with a fresh CPU Init's, then make every parameter identical.
  MoELayer fresh = MoELayer::Init(cpu.config(), cpu.layer_id(), ep, kSeed, 0.35f);
  ExpectNear(gpu.experts().w1(), fresh.experts().w1(), 1e-7, 1e-6, ctx,
             "Init experts.w1: CUDA vs CPU");
  std::vector<Param> from = ParamsOf(cpu), to = ParamsOf(gpu);
  EXPECT_EQ(from.size(), to.size());
  for (size_t i = 0; i < from.size() && i < to.size(); ++i) {
    EXPECT_EQ(to[i].value.device(), kCuda) << to[i].name;
    EXPECT_EQ(to[i].grad.device(), kCuda) << to[i].name;
    to[i].value.CopyFrom(from[i].value, ctx);
  }
  EXPECT_EQ(gpu.expert_bias().defined(), cpu.expert_bias().defined());
  if (cpu.expert_bias().defined()) {
    Tensor b = gpu.expert_bias();
    EXPECT_EQ(b.device(), kCuda);
    b.CopyFrom(cpu.expert_bias(), ctx);
  }
  return gpu;
}

// scale-relative comparison (see the header).
void Compare(const Tensor& gpu, const Tensor& cpu, double tol, DeviceContext* ctx,
             const std::string& what) {
  double scale = 0;
  for (float v : cpu.ToVector<float>()) scale = std::max(scale, std::fabs(static_cast<double>(v)));
  ExpectNear(gpu, cpu, tol * scale + 1e-30, tol, ctx, what);
}

// The CPU's top-k margin of every token: k-th minus (k+1)-th score (probs + bias).
std::vector<double> TopKMargins(const MoEForward& f, const MoELayer& layer) {
  const int64_t e = layer.config().num_experts, k = layer.config().top_k;
  std::vector<float> bias = layer.expert_bias().defined() ? layer.expert_bias().ToVector<float>()
                                                          : std::vector<float>(e, 0.0f);
  std::vector<double> margins;
  for (const RouterOutput& r : f.acts.router) {
    const std::vector<float> p = r.probs.ToVector<float>();
    for (int64_t t = 0; t < r.probs.dim(0); ++t) {
      std::vector<double> s(e);
      for (int64_t i = 0; i < e; ++i) s[i] = static_cast<double>(p[t * e + i]) + bias[i];
      std::sort(s.rbegin(), s.rend());
      margins.push_back(k < e ? s[k - 1] - s[k] : 1.0);
    }
  }
  return margins;
}

// Whether both runs routed every slot the same way; prints the differences.
bool SameRouting(const MoEForward& cpu, const MoEForward& gpu, const MoELayer& layer,
                 DeviceContext* ctx) {
  std::vector<int32_t> ic, ig;
  std::vector<uint8_t> kc, kg;
  for (size_t g = 0; g < cpu.acts.router.size(); ++g) {
    for (int32_t v : ValuesOf<int32_t>(cpu.acts.router[g].indices, ctx)) ic.push_back(v);
    for (int32_t v : ValuesOf<int32_t>(gpu.acts.router[g].indices, ctx)) ig.push_back(v);
    for (uint8_t v : ValuesOf<uint8_t>(cpu.acts.router[g].keep, ctx)) kc.push_back(v);
    for (uint8_t v : ValuesOf<uint8_t>(gpu.acts.router[g].keep, ctx)) kg.push_back(v);
  }
  const std::vector<int64_t> inv_c = ValuesOf<int64_t>(cpu.acts.plan->inverse(), ctx);
  const std::vector<int64_t> inv_g = ValuesOf<int64_t>(gpu.acts.plan->inverse(), ctx);
  const std::vector<double> margins = TopKMargins(cpu, layer);
  const int64_t k = layer.config().top_k;
  int64_t differ = 0;
  for (size_t s = 0; s < ic.size(); ++s) {
    if (ic[s] != ig[s] || kc[s] != kg[s] || inv_c[s] != inv_g[s]) {
      if (differ++ < 10) {
        ADD_FAILURE() << "slot " << s << " (token " << s / k << "): CPU expert " << ic[s]
                      << " keep " << int(kc[s]) << " row " << inv_c[s] << ", CUDA expert "
                      << ig[s] << " keep " << int(kg[s]) << " row " << inv_g[s]
                      << "; the token's CPU top-k margin is " << margins[s / k];
      }
    }
  }
  EXPECT_EQ(differ, 0) << "slots routed differently";
  return differ == 0;
}

void RunCase(const Case& c, DType matmul) {
  const bool bf16 = matmul == DType::kBF16;
  SCOPED_TRACE(StrCat(c.name, bf16 ? " [bf16 GEMMs]" : " [f32]"));
  std::printf("%s%s\n", c.name.c_str(), bf16 ? " [bf16 GEMMs]" : "");
  auto gctx = DeviceContext::Create(kCuda);
  auto cctx = DeviceContext::Create(Device::Cpu());
  gctx->set_matmul_dtype(matmul);
  cctx->set_matmul_dtype(matmul);
  DeviceContext* g = gctx.get();
  DeviceContext* h_ctx = cctx.get();
  auto ep = dist::MakeLocalCommunicator();  // ep = 1: a host communicator serves both
  MoELayer cpu = MakeCpuLayer(c.config, ep.get(), h_ctx);
  MoELayer gpu = MakeGpuLayer(cpu, ep.get(), g);
  const double tol = bf16 ? 2e-3 : 1e-5, stat_tol = bf16 ? 1e-3 : 1e-5;

  const int64_t n = c.groups * c.group_tokens, d = c.config.d_model;
  Tensor x = Tensor::Empty({n, d}, DType::kF32);
  kernels::FillNormal(x, RngKey{kSeed, 1000}, 0, 0.0f, 1.0f);
  const int64_t step = 5, first = 1000;
  MoEForward fc = cpu.Forward(x, c.group_tokens, c.training, step, first, h_ctx);
  MoEForward fg = gpu.Forward(x.To(kCuda, g), c.group_tokens, c.training, step, first, g);
  ASSERT_EQ(fg.y.device(), kCuda);

  // Statistics: counts exact, sums close.
  EXPECT_EQ(fg.stats.tokens_per_expert, fc.stats.tokens_per_expert);
  EXPECT_EQ(fg.stats.tokens_per_expert_kept, fc.stats.tokens_per_expert_kept);
  EXPECT_EQ(fg.stats.tokens, fc.stats.tokens);
  EXPECT_EQ(fg.stats.assignments, fc.stats.assignments);
  EXPECT_EQ(fg.stats.groups, fc.stats.groups);
  EXPECT_EQ(fg.stats.dropped(), fc.stats.dropped());
  EXPECT_EQ(fg.groups.tokens_per_expert_kept, fc.groups.tokens_per_expert_kept);
  EXPECT_EQ(fg.groups.dropped, fc.groups.dropped);
  if (c.config.capacity_factor == 1.0f && c.training) {
    EXPECT_GT(fc.stats.dropped(), 0) << "the case should drop assignments";
  }
  EXPECT_NEAR(fg.stats.entropy_sum, fc.stats.entropy_sum, stat_tol * fc.stats.entropy_sum);
  EXPECT_NEAR(fg.stats.aux_sum, fc.stats.aux_sum, stat_tol * fc.stats.aux_sum);
  EXPECT_NEAR(fg.stats.z_sum, fc.stats.z_sum, stat_tol * fc.stats.z_sum);
  ASSERT_EQ(fg.groups.aux.size(), fc.groups.aux.size());
  for (size_t i = 0; i < fc.groups.aux.size(); ++i) {
    EXPECT_NEAR(fg.groups.aux[i], fc.groups.aux[i], stat_tol * std::fabs(fc.groups.aux[i]));
    EXPECT_NEAR(fg.groups.z[i], fc.groups.z[i], stat_tol * std::fabs(fc.groups.z[i]));
  }
  EXPECT_EQ(fg.acts.plan->num_assignments(), fc.acts.plan->num_assignments());
  if (!SameRouting(fc, fg, cpu, g)) return;

  Compare(fg.y, fc.y, tol, g, "y");

  // Backward, twice: the second adds into the gradients (accumulation on the device).
  Tensor dy = Tensor::Empty({n, d}, DType::kF32);
  kernels::FillNormal(dy, RngKey{kSeed, 1001}, 0, 0.0f, 1.0f);
  std::vector<float> daux(c.groups), dz(c.groups);
  for (int64_t i = 0; i < c.groups; ++i) daux[i] = 0.5f + 0.25f * i, dz[i] = 1.5f - 0.25f * i;
  const Tensor dy_gpu = dy.To(kCuda, g);
  for (int pass = 0; pass < 2; ++pass) {
    Tensor dh_c = cpu.Backward(fc.acts, dy, daux, dz, h_ctx);
    Tensor dh_g = gpu.Backward(fg.acts, dy_gpu, daux, dz, g);
    ASSERT_EQ(dh_g.device(), kCuda);
    Compare(dh_g, dh_c, tol, g, StrCat("dh, pass ", pass));
  }
  std::vector<Param> pc = ParamsOf(cpu), pg = ParamsOf(gpu);
  for (size_t i = 0; i < pc.size(); ++i) {
    Compare(pg[i].grad, pc[i].grad, tol, g, "grad " + pc[i].name + " (2 passes)");
  }

  // The bias update on the device: bit-identical (host counts, one f32 add per element).
  if (c.config.expert_bias_rate > 0) {
    Tensor bc = cpu.expert_bias(), bg = gpu.expert_bias();
    UpdateExpertBias(bc, fc.stats.tokens_per_expert, c.config.expert_bias_rate, h_ctx);
    UpdateExpertBias(bg, fg.stats.tokens_per_expert, c.config.expert_bias_rate, g);
    gpu_test::ExpectBitEqual(bg, bc, g, "expert bias after UpdateExpertBias");
  }

  gpu.ZeroGrad(g);
  for (const Param& p : ParamsOf(gpu)) {
    for (float v : ValuesOf<float>(p.grad, g)) {
      ASSERT_EQ(v, 0.0f) << p.name << " after ZeroGrad";
    }
  }
}

TEST(MoELayerGpuTest, MatchesTheCpuLayerF32) {
  SY_REQUIRE_GPU();
  for (const Case& c : Cases()) RunCase(c, DType::kF32);
}

TEST(MoELayerGpuTest, MatchesTheCpuLayerBf16Gemms) {
  SY_REQUIRE_GPU();
  std::vector<Case> cases = Cases();
  RunCase(cases[1], DType::kBF16);  // top-2 swiglu dropless
  RunCase(cases[5], DType::kBF16);  // shared experts
  RunCase(cases[0], DType::kBF16);  // top-1 with drops
}

TEST(MoELayerGpuTest, RejectsMixedDevices) {
  SY_REQUIRE_GPU();
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  auto run = [] {
    auto ctx = DeviceContext::Create(kCuda);
    auto ep = dist::MakeLocalCommunicator();
    MoEConfig c = BaseConfig(4, 1, Activation::kGelu);
    MoELayer layer = MoELayer::Init(c, 0, ep.get(), kSeed, 0.02f, ctx.get());
    Tensor h = Tensor::Zeros({8, c.d_model}, DType::kF32);  // on the host
    layer.Forward(h, 8, true, 0, 0, ctx.get());
  };
  EXPECT_DEATH(run(), "MoE input on cpu, the layer on cuda:0");
  auto no_ctx = [] {
    auto ctx = DeviceContext::Create(kCuda);
    auto ep = dist::MakeLocalCommunicator();
    MoEConfig c = BaseConfig(4, 1, Activation::kGelu);
    MoELayer layer = MoELayer::Init(c, 0, ep.get(), kSeed, 0.02f, ctx.get());
    Tensor h = Tensor::Zeros({8, c.d_model}, DType::kF32, kCuda, ctx.get());
    layer.Forward(h, 8, true, 0, 0, nullptr);
  };
  EXPECT_DEATH(no_ctx(), "needs that device's DeviceContext");
}

}  // namespace
}  // namespace switchyard::moe
