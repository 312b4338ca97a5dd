// The optimizer, the LR schedule and gradient clipping on one rank, against the formulas
// recomputed here in double:
//  - AdamW over several steps vs PyTorch's torch.optim.AdamW update (decoupled decay,
//    bias-corrected moments, eps outside the sqrt); step 1's bias correction in closed form
//    (mhat = g, vhat = g^2); no decay where Parameter::weight_decay is false; parameters
//    with trainable = false untouched and without state; State() names, sharding and
//    shared storage; the step count; a parameter's lr_scale is its own learning rate.
//  - SGD with momentum (and coupled L2 decay) vs torch.optim.SGD's formula.
//  - The schedule at step 0, mid-warmup, the end of warmup, mid-cosine, max_steps, after.
//  - The global norm and clipping vs a hand computation.
// Tolerance: the kernels compute in f32 with a fixed elementwise formula, the reference in
// double from the same f32 hyperparameters; the reference carries, per element, a bound on
// the f32 evaluation's error from the formula's few roundings (u = 2^-24 relative to each
// operation's operands, propagated through the steps; see RefAdamW and the SGD loop), and
// each element must be within 1.01 x its bound (second order).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <numbers>
#include <vector>

#include "engine/parallel/clip.h"
#include "engine/train/optimizer.h"
#include "engine/train/schedule.h"
#include "kernels/optimizer.h"

namespace switchyard::train {
namespace {

using parallel::Parameter;
using parallel::ParameterRegistry;

constexpr double kU = 0x1p-24;  // f32 unit roundoff

// Adds a parameter holding `value` with a zero gradient of the same shape.
void AddParam(ParameterRegistry& reg, const std::string& name, const std::vector<float>& value,
              bool weight_decay = true, bool trainable = true) {
  const Shape shape = {static_cast<int64_t>(value.size())};
  Parameter p = Parameter::Dense(name, Tensor::FromVector(value, shape),
                                 trainable ? Tensor::Zeros(shape, DType::kF32) : Tensor(),
                                 weight_decay);
  reg.Add(std::move(p));
}

void SetGrad(ParameterRegistry& reg, const std::string& name, const std::vector<float>& g) {
  reg.Find(name)->grad.CopyFrom(Tensor::FromVector(g, {static_cast<int64_t>(g.size())}));
}

// |got_i - want_i| <= 1.01 bound_i (a zero bound: equality); prints the fraction used.
void ExpectNear(const std::vector<float>& got, const std::vector<double>& want,
                const std::vector<double>& bound, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  ASSERT_EQ(bound.size(), want.size()) << what;
  double used = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = 1.01 * bound[i], err = std::abs(got[i] - want[i]);
    used = std::max(used, err == 0 ? 0.0 : tol > 0 ? err / tol : INFINITY);
    EXPECT_LE(err, tol) << what << "[" << i << "]: " << got[i] << " vs " << want[i];
  }
  std::printf("    %-24s bound used %.3f\n", what.c_str(), used);
}

// PyTorch's AdamW (torch/optim/adamw.py, single-tensor path) in double, from the f32
// hyperparameters (1 - beta is exact in f32 for beta in [0.5, 1]), with pb, mb, vb: bounds
// on |x_f32 - x| for kernels/cpu/optimizer.cc's AdamWRange (f32 decay = 1 - lr wd, step_size
// = lr / bc1 and bc2_sqrt rounded once each; FMA or not):
//   m = b1 m + (1 - b1) g:   dm <= b1 dm' + 3u (b1 |m'| + (1 - b1) |g|);
//   v = b2 v + (1 - b2) g g: dv <= b2 dv' + 4u (b2 v' + (1 - b2) g^2)   (all terms >= 0);
//   D = sqrt(v) / bc2_sqrt + eps: dD <= sqrt(v / bc2) (dv / (2 v) + 3u) + u D;
//   U = step_size m / D:     dU <= |U| (3u + dD / D) + (lr / bc1) dm / D;
//   p = p decay - U:         dp <= decay dp' + 2u |p' decay| + dU + u |p|.
struct RefAdamW {
  double lr, beta1, beta2, eps, wd;
  std::vector<double> p, m, v;
  std::vector<double> pb = std::vector<double>(p.size()), mb = std::vector<double>(p.size()),
                      vb = std::vector<double>(p.size());
  int64_t t = 0;

  void Step(const std::vector<float>& g) {
    ++t;
    const double bc1 = 1 - std::pow(beta1, t), bc2 = 1 - std::pow(beta2, t);
    pb.resize(p.size());
    mb.resize(p.size());
    vb.resize(p.size());
    for (size_t i = 0; i < p.size(); ++i) {
      const double decay = 1 - lr * wd, gi = g[i];
      const double p0 = p[i], m0 = m[i], v0 = v[i];
      m[i] = beta1 * m0 + (1 - beta1) * gi;
      v[i] = beta2 * v0 + (1 - beta2) * gi * gi;
      mb[i] = beta1 * mb[i] + 3 * kU * (beta1 * std::abs(m0) + (1 - beta1) * std::abs(gi));
      vb[i] = beta2 * vb[i] + 4 * kU * (beta2 * v0 + (1 - beta2) * gi * gi);
      const double mhat = m[i] / bc1, vhat = v[i] / bc2;
      const double D = std::sqrt(vhat) + eps, U = lr * mhat / D;
      const double dD = (v[i] > 0 ? std::sqrt(vhat) * (vb[i] / (2 * v[i]) + 3 * kU) : 0.0) + kU * D;
      const double dU = std::abs(U) * (3 * kU + dD / D) + lr / bc1 * mb[i] / D;
      p[i] = p0 * decay - U;
      pb[i] = decay * pb[i] + 2 * kU * std::abs(p0 * decay) + dU + kU * std::abs(p[i]);
    }
  }
};

// The gradient of step s (1-based) of the AdamW / SGD tests: mixed signs and sizes.
std::vector<float> GradAt(int s, size_t n, float scale) {
  std::vector<float> g(n);
  for (size_t i = 0; i < n; ++i) {
    g[i] = scale * static_cast<float>(std::sin(0.7 * s + 1.3 * i) * (1.0 + 0.5 * i));
  }
  return g;
}

TEST(OptimizerTest, AdamWMatchesPyTorchFormulaOverSeveralSteps) {
  ParameterRegistry reg;
  const std::vector<float> w0 = {0.5f, -1.25f, 2.0f, 0.0f, -0.03f};
  const std::vector<float> b0 = {0.1f, -0.2f, 0.3f};
  AddParam(reg, "w", w0, /*weight_decay=*/true);
  AddParam(reg, "norm.weight", b0, /*weight_decay=*/false);
  OptimizerOptions opt{.kind = OptimizerKind::kAdamW, .weight_decay = 0.1f, .beta1 = 0.9f,
                       .beta2 = 0.95f, .eps = 1e-8f};
  Optimizer optimizer(reg, opt);
  RefAdamW rw{.lr = 0, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .wd = 0.1f,
              .p = {w0.begin(), w0.end()}, .m = std::vector<double>(w0.size()),
              .v = std::vector<double>(w0.size())};
  RefAdamW rb = rw;
  rb.wd = 0.0;  // weight_decay = false
  rb.p = {b0.begin(), b0.end()};
  rb.m = rb.v = std::vector<double>(b0.size());
  const float lrs[] = {1e-2f, 3e-2f, 2e-2f, 5e-3f, 1e-2f};
  for (int s = 1; s <= 5; ++s) {
    const float lr = lrs[s - 1];
    std::vector<float> gw = GradAt(s, w0.size(), s == 3 ? 1e-4f : 1.0f);  // tiny grads too
    std::vector<float> gb = GradAt(s + 10, b0.size(), 0.5f);
    SetGrad(reg, "w", gw);
    SetGrad(reg, "norm.weight", gb);
    EXPECT_EQ(optimizer.step(), s - 1);
    optimizer.Step(lr);
    EXPECT_EQ(optimizer.step(), s);
    rw.lr = rb.lr = lr;
    rw.Step(gw);
    rb.Step(gb);
  }
  ExpectNear(reg.Find("w")->value.ToVector<float>(), rw.p, rw.pb, "adamw w");
  ExpectNear(reg.Find("norm.weight")->value.ToVector<float>(), rb.p, rb.pb, "adamw no-decay");
  std::vector<parallel::Parameter> state = optimizer.State();
  ASSERT_EQ(state.size(), 5u);  // exp_avg, exp_avg_sq of two parameters, and the step
  ExpectNear(state[0].value.ToVector<float>(), rw.m, rw.mb, "adamw exp_avg w");
  ExpectNear(state[1].value.ToVector<float>(), rw.v, rw.vb, "adamw exp_avg_sq w");
  ExpectNear(state[2].value.ToVector<float>(), rb.m, rb.mb, "adamw exp_avg b");
  ExpectNear(state[3].value.ToVector<float>(), rb.v, rb.vb, "adamw exp_avg_sq b");
}

TEST(OptimizerTest, AdamWStepOneIsBiasCorrected) {
  // t = 1: mhat = g and vhat = g^2, so p1 = p0 * (1 - lr * wd) - lr * g / (|g| + eps).
  ParameterRegistry reg;
  const std::vector<float> p0 = {1.0f, -2.0f, 0.25f, 3.0f};
  const std::vector<float> g = {0.3f, -4.0f, 1e-3f, 0.0f};
  AddParam(reg, "p", p0);
  SetGrad(reg, "p", g);
  Optimizer optimizer(reg, {.kind = OptimizerKind::kAdamW, .weight_decay = 0.5f,
                            .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-8f});
  const double lr = 0.1f, eps = 1e-8f;  // the f32 values the optimizer is given
  optimizer.Step(static_cast<float>(lr));
  std::vector<double> want(p0.size());
  for (size_t i = 0; i < p0.size(); ++i) {
    want[i] = p0[i] * (1 - lr * 0.5) - lr * g[i] / (std::abs(double(g[i])) + eps);
  }
  // 1 - 0.05 = 0.95: the decayed values and a step of almost exactly lr * sign(g).
  EXPECT_NEAR(want[0], 0.95 - 0.1, 1e-7);
  EXPECT_EQ(want[3], 3.0 * (1 - lr * 0.5));  // g = 0: decay only
  // The bound of the general formula at t = 1 (RefAdamW), whose values are these.
  RefAdamW ref{.lr = lr, .beta1 = 0.8f, .beta2 = 0.99f, .eps = eps, .wd = 0.5,
               .p = {p0.begin(), p0.end()}, .m = std::vector<double>(p0.size()),
               .v = std::vector<double>(p0.size())};
  ref.Step(g);
  for (size_t i = 0; i < p0.size(); ++i) EXPECT_NEAR(ref.p[i], want[i], 1e-15) << i;
  ExpectNear(reg.Find("p")->value.ToVector<float>(), want, ref.pb, "adamw step 1");
}

TEST(OptimizerTest, NonTrainableParametersAreSkipped) {
  ParameterRegistry reg;
  AddParam(reg, "a", {1.0f, 2.0f});
  AddParam(reg, "expert_bias", {0.5f, -0.5f, 0.25f}, /*weight_decay=*/false, /*trainable=*/false);
  AddParam(reg, "c", {3.0f});
  SetGrad(reg, "a", {1.0f, 1.0f});
  SetGrad(reg, "c", {-1.0f});
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    Optimizer optimizer(reg, {.kind = kind});
    optimizer.Step(0.1f);
    EXPECT_EQ(reg.Find("expert_bias")->value.ToVector<float>(),
              (std::vector<float>{0.5f, -0.5f, 0.25f}));
    EXPECT_NE(reg.Find("a")->value.ToVector<float>()[0], 1.0f);
    for (const Parameter& s : optimizer.State()) {
      EXPECT_EQ(s.name.find("expert_bias"), std::string::npos) << s.name;
    }
  }
}

TEST(OptimizerTest, StateIsShardedLikeItsParameterAndSharesStorage) {
  ParameterRegistry reg;
  // An expert weight slice: experts [2, 4) of 4, each (3,).
  Parameter w = Parameter::Expert("layers.0.moe.experts.w1", Tensor::Zeros({2, 3}, DType::kF32),
                                  Tensor::Zeros({2, 3}, DType::kF32), true);
  w.Split(0, 2, 4);
  reg.Add(w);
  AddParam(reg, "ln.bias", {0.0f, 0.0f}, /*weight_decay=*/false);

  Optimizer adamw(reg, {.kind = OptimizerKind::kAdamW});
  std::vector<Parameter> state = adamw.State();
  ASSERT_EQ(state.size(), 5u);
  const char* names[] = {"optimizer.exp_avg.layers.0.moe.experts.w1",
                         "optimizer.exp_avg_sq.layers.0.moe.experts.w1",
                         "optimizer.exp_avg.ln.bias", "optimizer.exp_avg_sq.ln.bias",
                         "optimizer.step"};
  for (size_t i = 0; i < state.size(); ++i) {
    EXPECT_EQ(state[i].name, names[i]);
    EXPECT_FALSE(state[i].trainable);
    EXPECT_FALSE(state[i].grad.defined());
  }
  EXPECT_EQ(state[0].global_shape, (Shape{4, 3}));
  EXPECT_EQ(state[0].offset, (std::vector<int64_t>{2, 0}));
  EXPECT_EQ(state[0].view, dist::View::kExpert);
  EXPECT_EQ(state[0].replicated, parallel::AxisSet{dist::Axis::kDp});
  EXPECT_TRUE(state[0].grad_sum.empty());
  EXPECT_EQ(state[0].value.shape(), (Shape{2, 3}));
  EXPECT_TRUE(state[2].is_whole());
  EXPECT_EQ(state[4].value.dtype(), DType::kI64);
  EXPECT_EQ(state[4].value.ndim(), 0);
  // A checkpoint load writes into the state: the optimizer sees it.
  *state[4].value.data<int64_t>() = 41;
  EXPECT_EQ(adamw.step(), 41);
  state[0].value.CopyFrom(Tensor::FromVector<float>({1, 2, 3, 4, 5, 6}, {2, 3}));
  EXPECT_EQ(adamw.State()[0].value.ToVector<float>(), (std::vector<float>{1, 2, 3, 4, 5, 6}));
  // A registry round trip: the state parameters register like the model's.
  ParameterRegistry ckpt;
  for (Parameter& s : state) ckpt.Add(s);
  EXPECT_EQ(ckpt.params().size(), 5u);

  Optimizer sgd(reg, {.kind = OptimizerKind::kSgd, .momentum = 0.9f});
  std::vector<Parameter> sgd_state = sgd.State();
  ASSERT_EQ(sgd_state.size(), 3u);
  EXPECT_EQ(sgd_state[0].name, "optimizer.momentum.layers.0.moe.experts.w1");
  EXPECT_EQ(sgd_state[1].name, "optimizer.momentum.ln.bias");
  Optimizer plain(reg, {.kind = OptimizerKind::kSgd, .momentum = 0.0f});
  EXPECT_EQ(plain.State().size(), 1u);  // the step only
}

TEST(OptimizerTest, SgdWithMomentumMatchesTheFormula) {
  ParameterRegistry reg;
  const std::vector<float> w0 = {0.5f, -1.0f, 2.0f};
  const std::vector<float> b0 = {0.25f, 0.75f};
  AddParam(reg, "w", w0, /*weight_decay=*/true);
  AddParam(reg, "b", b0, /*weight_decay=*/false);
  const double mu = 0.9f, wd = 0.01f;  // the f32 values the optimizer is given
  Optimizer optimizer(reg, {.kind = OptimizerKind::kSgd, .weight_decay = float(wd),
                            .momentum = float(mu)});
  std::vector<double> pw(w0.begin(), w0.end()), pb(b0.begin(), b0.end());
  std::vector<double> bw(w0.size(), 0.0), bb(b0.size(), 0.0);
  // Bounds on the f32 evaluation (kernels/cpu/optimizer.cc: d = g + wd p, buf = mu buf + d,
  // p -= lr buf, one rounding per operation, FMA or not):
  //   dd <= wd dp' + u (wd |p'|) + u |d|;  dbuf <= mu dbuf' + dd + u mu |buf'| + u |buf|;
  //   dp <= dp' + lr dbuf + u lr |buf| + u |p|.
  std::vector<double> pw_b(w0.size(), 0.0), pb_b(b0.size(), 0.0);
  std::vector<double> bw_b(w0.size(), 0.0), bb_b(b0.size(), 0.0);
  auto step = [&](double wdx, double g, double& p, double& buf, double& p_b, double& buf_b,
                  bool first) {
    const double d = g + wdx * p, buf0 = buf;
    const double d_b = wdx * p_b + kU * wdx * std::abs(p) + kU * std::abs(d);
    buf = first ? d : mu * buf + d;
    buf_b = mu * buf_b + d_b + kU * mu * std::abs(buf0) + kU * std::abs(buf);
    return d;
  };
  for (int s = 1; s <= 4; ++s) {
    const double lr = static_cast<float>(0.05 * s);
    std::vector<float> gw = GradAt(s, w0.size(), 1.0f), gb = GradAt(s + 3, b0.size(), 2.0f);
    SetGrad(reg, "w", gw);
    SetGrad(reg, "b", gb);
    optimizer.Step(static_cast<float>(lr));
    // torch.optim.SGD: d = g + wd * p; buf = mu * buf + d (buf = d at the first step);
    // p -= lr * buf.
    for (size_t i = 0; i < pw.size(); ++i) {
      step(wd, gw[i], pw[i], bw[i], pw_b[i], bw_b[i], s == 1);
      pw[i] -= lr * bw[i];
      pw_b[i] += lr * bw_b[i] + kU * lr * std::abs(bw[i]) + kU * std::abs(pw[i]);
    }
    for (size_t i = 0; i < pb.size(); ++i) {
      step(0.0, gb[i], pb[i], bb[i], pb_b[i], bb_b[i], s == 1);
      pb[i] -= lr * bb[i];
      pb_b[i] += lr * bb_b[i] + kU * lr * std::abs(bb[i]) + kU * std::abs(pb[i]);
    }
  }
  ExpectNear(reg.Find("w")->value.ToVector<float>(), pw, pw_b, "sgd w");
  ExpectNear(reg.Find("b")->value.ToVector<float>(), pb, pb_b, "sgd no-decay");
  ExpectNear(optimizer.State()[0].value.ToVector<float>(), bw, bw_b, "sgd momentum w");
  EXPECT_EQ(optimizer.step(), 4);
}

TEST(OptimizerTest, PlainSgdHasNoBuffer) {
  ParameterRegistry reg;
  AddParam(reg, "w", {1.0f, -2.0f});
  SetGrad(reg, "w", {0.5f, 0.25f});
  Optimizer optimizer(reg, {.kind = OptimizerKind::kSgd, .weight_decay = 0.0f, .momentum = 0.0f});
  optimizer.Step(0.1f);
  optimizer.Step(0.1f);
  // p -= lr g twice, lr = 0.1f: each step's product and difference one rounding each:
  // dp <= dp' + u lr |g| + u |p|.
  const double lr = 0.1f;
  std::vector<double> want = {1.0, -2.0}, bound = {0.0, 0.0};
  const double g[2] = {0.5, 0.25};
  for (int s = 0; s < 2; ++s) {
    for (int i = 0; i < 2; ++i) {
      want[i] -= lr * g[i];
      bound[i] += kU * lr * g[i] + kU * std::abs(want[i]);
    }
  }
  ExpectNear(reg.Find("w")->value.ToVector<float>(), want, bound, "plain sgd");
}

// ZeRO-Offload's path (state on the host, owned values and gradients copied there and
// back) gives the same bits as the update in place, for AdamW and SGD with momentum.
TEST(OptimizerTest, OffloadedUpdateEqualsTheInPlaceOne) {
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    ParameterRegistry in_place, offloaded;
    for (ParameterRegistry* reg : {&in_place, &offloaded}) {
      AddParam(*reg, "w", {0.5f, -1.25f, 2.0f, 0.125f});
      AddParam(*reg, "b", {0.1f, -0.2f}, /*weight_decay=*/false);
    }
    OptimizerOptions options{.kind = kind};
    Optimizer a(in_place, options);
    options.offload = true;
    Optimizer b(offloaded, options);
    for (int step = 0; step < 3; ++step) {
      for (ParameterRegistry* reg : {&in_place, &offloaded}) {
        SetGrad(*reg, "w", {0.3f * step - 0.1f, 0.2f, -0.7f, 1.5f});
        SetGrad(*reg, "b", {-0.05f, 0.4f * step});
      }
      a.Step(1e-2f);
      b.Step(1e-2f);
    }
    for (const char* name : {"w", "b"}) {
      EXPECT_EQ(in_place.Find(name)->value.ToVector<float>(),
                offloaded.Find(name)->value.ToVector<float>())
          << config::OptimizerKindName(kind) << " " << name;
    }
  }
}

// Parameter::lr_scale (moe.router_lr_scale for the routers): a scaled parameter moves
// exactly as it would alone at lr times its scale, and the others exactly as at lr, over
// several steps, for AdamW and SGD.
TEST(OptimizerTest, LrScaleIsTheLearningRateOfItsParameter) {
  constexpr float kLr = 1e-2f, kScale = 8.0f;
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    ParameterRegistry mixed, plain, scaled;
    for (ParameterRegistry* reg : {&mixed, &plain, &scaled}) {
      AddParam(*reg, "w", {0.5f, -1.25f, 2.0f, 0.125f});
      AddParam(*reg, "router", {0.1f, -0.2f, 0.3f});
    }
    mixed.Find("router")->lr_scale = kScale;
    const OptimizerOptions options{.kind = kind};
    Optimizer a(mixed, options), b(plain, options), c(scaled, options);
    for (int step = 0; step < 4; ++step) {
      for (ParameterRegistry* reg : {&mixed, &plain, &scaled}) {
        SetGrad(*reg, "w", {0.3f * step - 0.1f, 0.2f, -0.7f, 1.5f});
        SetGrad(*reg, "router", {-0.05f, 0.4f * step, 0.25f});
      }
      a.Step(kLr);
      b.Step(kLr);
      c.Step(kLr * kScale);
    }
    const std::string k = config::OptimizerKindName(kind);
    EXPECT_EQ(mixed.Find("w")->value.ToVector<float>(), plain.Find("w")->value.ToVector<float>()) << k;
    EXPECT_EQ(mixed.Find("router")->value.ToVector<float>(), scaled.Find("router")->value.ToVector<float>())
        << k;
    EXPECT_NE(mixed.Find("router")->value.ToVector<float>(), plain.Find("router")->value.ToVector<float>())
        << k;
  }
}

TEST(OptimizerTest, ParsesKindNames) {
  EXPECT_EQ(*config::ParseOptimizerKind("adamw"), OptimizerKind::kAdamW);
  EXPECT_EQ(*config::ParseOptimizerKind("sgd"), OptimizerKind::kSgd);
  EXPECT_EQ(config::ParseOptimizerKind("adam").status().message(),
            "train.optimizer='adam' is not one of adamw, sgd");
  EXPECT_STREQ(config::OptimizerKindName(OptimizerKind::kSgd), "sgd");
}

TEST(ScheduleTest, WarmupCosineConstant) {
  const LrSchedule s{.lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .max_steps = 110};
  EXPECT_FLOAT_EQ(s.LrAt(0), 0.1f);   // (0 + 1) / 10: the first update is not at lr 0
  EXPECT_FLOAT_EQ(s.LrAt(4), 0.5f);   // mid-warmup
  EXPECT_FLOAT_EQ(s.LrAt(9), 1.0f);   // the last warmup step reaches lr
  EXPECT_FLOAT_EQ(s.LrAt(10), 1.0f);  // the cosine starts at lr
  EXPECT_FLOAT_EQ(s.LrAt(60), 0.55f); // halfway: (lr + min_lr) / 2
  const double q = 0.1 + 0.9 * 0.5 * (1 + std::cos(std::numbers::pi * 25 / 100));
  EXPECT_FLOAT_EQ(s.LrAt(35), static_cast<float>(q));
  EXPECT_FLOAT_EQ(s.LrAt(110), 0.1f);  // max_steps: min_lr
  EXPECT_FLOAT_EQ(s.LrAt(111), 0.1f);  // and constant after
  EXPECT_FLOAT_EQ(s.LrAt(100000), 0.1f);
  // Monotone: up through warmup, down through the decay.
  for (int64_t i = 1; i < 10; ++i) EXPECT_GT(s.LrAt(i), s.LrAt(i - 1));
  for (int64_t i = 11; i <= 110; ++i) EXPECT_LT(s.LrAt(i), s.LrAt(i - 1));
}

TEST(ScheduleTest, NoWarmupAndNoDecayPhase) {
  const LrSchedule no_warmup{.lr = 2.0f, .min_lr = 0.0f, .warmup_steps = 0, .max_steps = 4};
  EXPECT_FLOAT_EQ(no_warmup.LrAt(0), 2.0f);
  EXPECT_FLOAT_EQ(no_warmup.LrAt(2), 1.0f);
  EXPECT_FLOAT_EQ(no_warmup.LrAt(4), 0.0f);
  const LrSchedule warmup_only{.lr = 1.0f, .min_lr = 0.25f, .warmup_steps = 4, .max_steps = 4};
  EXPECT_FLOAT_EQ(warmup_only.LrAt(3), 1.0f);
  EXPECT_FLOAT_EQ(warmup_only.LrAt(4), 0.25f);
}

// The other decay styles (schedule.h), by hand: warmup as under cosine, then linear from lr
// to min_lr at max_steps, constant at lr (max_steps included), or wsd: lr until M - D, then
// linear to min_lr over the last D steps.
TEST(ScheduleTest, LinearConstantAndWarmupStableDecay) {
  using config::LrDecayStyle;
  const LrSchedule linear{.lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .max_steps = 110,
                          .style = LrDecayStyle::kLinear};
  EXPECT_FLOAT_EQ(linear.LrAt(4), 0.5f);     // the warmup is the cosine's
  EXPECT_FLOAT_EQ(linear.LrAt(10), 1.0f);    // the decay starts at lr
  EXPECT_FLOAT_EQ(linear.LrAt(35), 0.775f);  // 0.1 + 0.9 * (1 - 25 / 100)
  EXPECT_FLOAT_EQ(linear.LrAt(60), 0.55f);
  EXPECT_FLOAT_EQ(linear.LrAt(109), 0.109f); // 0.1 + 0.9 / 100
  EXPECT_FLOAT_EQ(linear.LrAt(110), 0.1f);
  EXPECT_FLOAT_EQ(linear.LrAt(500), 0.1f);

  const LrSchedule constant{.lr = 2.0f, .min_lr = 0.5f, .warmup_steps = 4, .max_steps = 8,
                            .style = LrDecayStyle::kConstant};
  EXPECT_FLOAT_EQ(constant.LrAt(0), 0.5f);  // 2 * 1 / 4
  EXPECT_FLOAT_EQ(constant.LrAt(3), 2.0f);
  for (int64_t s : {4, 7, 8, 100}) EXPECT_FLOAT_EQ(constant.LrAt(s), 2.0f) << s;

  const LrSchedule wsd{.lr = 1.0f, .min_lr = 0.0f, .warmup_steps = 10, .max_steps = 110,
                       .style = LrDecayStyle::kWsd, .decay_steps = 20};
  EXPECT_FLOAT_EQ(wsd.LrAt(9), 1.0f);
  for (int64_t s : {10, 50, 89, 90}) EXPECT_FLOAT_EQ(wsd.LrAt(s), 1.0f) << s;  // stable to M - D
  EXPECT_FLOAT_EQ(wsd.LrAt(91), 0.95f);    // 1 - 1 / 20
  EXPECT_FLOAT_EQ(wsd.LrAt(100), 0.5f);
  EXPECT_FLOAT_EQ(wsd.LrAt(109), 0.05f);
  EXPECT_FLOAT_EQ(wsd.LrAt(110), 0.0f);
  for (int64_t i = 91; i <= 110; ++i) EXPECT_LT(wsd.LrAt(i), wsd.LrAt(i - 1));
  // D = M - W: the decay spans everything after warmup, as linear does.
  const LrSchedule whole{.lr = 1.0f, .min_lr = 0.1f, .warmup_steps = 10, .max_steps = 110,
                         .style = LrDecayStyle::kWsd, .decay_steps = 100};
  for (int64_t s = 0; s <= 120; ++s) EXPECT_FLOAT_EQ(whole.LrAt(s), linear.LrAt(s)) << s;
}

TEST(ClipTest, GlobalNormAndClippingOnOneRank) {
  ParameterRegistry reg;
  AddParam(reg, "a", {0.0f, 0.0f});
  AddParam(reg, "frozen", {0.0f}, false, /*trainable=*/false);
  reg.Add(Parameter::Expert("experts.w", Tensor::Zeros({4}, DType::kF32),
                            Tensor::FromVector<float>({1, 2, 2, 0}, {4}), true));
  auto world = dist::MakeLocalCommunicator();
  auto pc = dist::ParallelContext::Create(*world, dist::Mesh::Create(1, {}).value());
  ASSERT_TRUE(pc.ok()) << pc.status();
  const dist::ParallelContext& one = **pc;
  SetGrad(reg, "a", {3.0f, 4.0f});
  // sqrt(9 + 16 + 1 + 4 + 4) = sqrt(34).
  EXPECT_DOUBLE_EQ(parallel::GlobalGradNorm(reg, one), std::sqrt(34.0));
  // Below the threshold (and max_norm 0 = off): unchanged.
  EXPECT_DOUBLE_EQ(parallel::ClipGradNorm(reg, 10.0, one), std::sqrt(34.0));
  EXPECT_DOUBLE_EQ(parallel::ClipGradNorm(reg, 0.0, one), std::sqrt(34.0));
  EXPECT_EQ(reg.Find("a")->grad.ToVector<float>(), (std::vector<float>{3.0f, 4.0f}));
  // Above: every grad scaled by max_norm / (norm + 1e-6).
  const double norm = parallel::ClipGradNorm(reg, 2.0, one);
  EXPECT_DOUBLE_EQ(norm, std::sqrt(34.0));
  // g * f32(scale): the factor's rounding and the product's, 2u relative (0 stays 0).
  const double scale = 2.0 / (std::sqrt(34.0) + 1e-6);
  const std::vector<double> want_a = {3 * scale, 4 * scale},
                            want_w = {scale, 2 * scale, 2 * scale, 0};
  auto two_u = [](const std::vector<double>& w) {
    std::vector<double> b;
    for (double x : w) b.push_back(2 * kU * std::abs(x));
    return b;
  };
  ExpectNear(reg.Find("a")->grad.ToVector<float>(), want_a, two_u(want_a), "clipped a");
  ExpectNear(reg.Find("experts.w")->grad.ToVector<float>(), want_w, two_u(want_w),
             "clipped experts");
  EXPECT_NEAR(parallel::GlobalGradNorm(reg, one), 2.0, 1e-6);
}

TEST(ClipTest, TheClipFactorInsideTheUpdateEqualsScalingTheGradientsFirst) {
  // The trainer passes ClipScale's factor to Optimizer::Step instead of scaling the
  // gradients (ClipGradNorm): the same bits, for AdamW and SGD, over three steps.
  EXPECT_EQ(parallel::ClipScale(3.0, 0.0), 1.0f);  // off
  EXPECT_EQ(parallel::ClipScale(3.0, 5.0), 1.0f);  // below
  EXPECT_EQ(parallel::ClipScale(5.0, 2.0), static_cast<float>(2.0 / (5.0 + 1e-6)));
  auto world = dist::MakeLocalCommunicator();
  auto pc = dist::ParallelContext::Create(*world, dist::Mesh::Create(1, {}).value());
  ASSERT_TRUE(pc.ok()) << pc.status();
  for (OptimizerKind kind : {OptimizerKind::kAdamW, OptimizerKind::kSgd}) {
    std::vector<float> got, want;
    for (bool fused : {true, false}) {
      ParameterRegistry reg;
      AddParam(reg, "w", {0.5f, -1.0f, 2.0f, 0.125f, -3.0f});
      Optimizer opt(reg, {.kind = kind, .weight_decay = 0.1f, .momentum = 0.9f});
      for (int s = 1; s <= 3; ++s) {
        SetGrad(reg, "w", GradAt(s, 5, 3.0f));
        if (fused) {
          const double norm = parallel::GlobalGradNorm(reg, **pc);
          opt.Step(1e-2f, parallel::ClipScale(norm, 0.5));
        } else {
          parallel::ClipGradNorm(reg, 0.5, **pc);
          opt.Step(1e-2f);
        }
      }
      (fused ? got : want) = reg.Find("w")->value.ToVector<float>();
    }
    EXPECT_EQ(got, want) << (kind == OptimizerKind::kAdamW ? "adamw" : "sgd");
  }
}

TEST(OptimizerKernelTest, SumSquaresAndScale) {
  Tensor t = Tensor::FromVector<float>({1, -2, 3}, {3});
  EXPECT_DOUBLE_EQ(kernels::SumSquares(t), 14.0);
  kernels::ScaleInPlace(t, 0.5f);
  EXPECT_EQ(t.ToVector<float>(), (std::vector<float>{0.5f, -1.0f, 1.5f}));
}

}  // namespace
}  // namespace switchyard::train
