// dense/: every layer's forward against a naive double-precision reference written here,
// every gradient (input and parameters) against central finite differences of the f32
// forward of L = sum(y * dy), gradients accumulating over micro-batches in flight, the
// initialisation (keyed by name and seed; std 0.02, biases zero, norm weights one) and the
// parameter lists.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "dense/attention.h"
#include "engine/parallel/context_parallel.h"
#include "dense/embedding.h"
#include "dense/linear.h"
#include "dense/mlp.h"
#include "dense/norm.h"
#include "engine/core/device_context.h"
#include "kernels/flash_attention.h"
#include "tests/kernels/grad_check.h"
#include "tests/testing/tolerance.h"

namespace switchyard::dense {
namespace {

using testing::Dot;
using testing::ExpectClose;
using testing::NumericGradient;
using testing::RandomTensor;

constexpr int64_t kB = 2, kS = 4, kD = 8;
// Forward vs double: f32 sums of a few dozen O(1) products, through a few layers.
constexpr double kFwdAbsTol = 2e-5, kFwdRelTol = 1e-4;
// Central differences of the f32 forward, step 1e-2: L sums B S d = 64 outputs (f32 rounding
// ~1e-6 over 2h ~5e-5); truncation h^2/6 |L'''| ~ 1e-5 for O(1) activations. A missing or
// wrong gradient term is off by > 1e-2.
constexpr float kStep = 1e-2f;
constexpr double kFdAbsTol = 1e-4, kFdRelTol = 1e-3;

// Overwrites every parameter with O(scale) uniform values (0.02 would make every gradient
// tiny), keyed by stream.
void Randomize(const std::vector<Parameter>& params, uint64_t stream, float scale) {
  for (const Parameter& p : params) {
    Tensor v = p.value;
    v.CopyFrom(RandomTensor(v.shape(), stream++, -scale, scale));
  }
}

// Checks dx (when x is defined) and every parameter gradient against central differences of
// L = sum(forward() * dy). The gradients must hold exactly one backward's worth.
void CheckGradients(const std::string& name, const std::function<Tensor()>& forward,
                    const std::vector<float>& dy, Tensor x, const Tensor& dx,
                    const std::vector<Parameter>& params) {
  auto loss = [&] { return Dot(forward(), dy); };
  if (x.defined()) {
    ExpectClose(dx.ToVector<float>(), NumericGradient(x, loss, kStep), kFdAbsTol, kFdRelTol,
                name + " dx");
  }
  for (const Parameter& p : params) {
    ExpectClose(p.grad.ToVector<float>(), NumericGradient(p.value, loss, kStep), kFdAbsTol,
                kFdRelTol, name + " d" + p.name);
  }
}

std::vector<std::string> Names(const std::vector<Parameter>& params) {
  std::vector<std::string> out;
  for (const Parameter& p : params) out.push_back(p.name);
  return out;
}

// ---- naive double references ----------------------------------------------------------------

// y (N, out) = x (N, in) W (in, out) + b.
std::vector<double> NaiveLinear(const std::vector<double>& x, int64_t n, const Tensor& w,
                                const Tensor& b) {
  const int64_t in = w.dim(0), out = w.dim(1);
  const std::vector<float> wv = w.ToVector<float>();
  const std::vector<float> bv = b.defined() ? b.ToVector<float>() : std::vector<float>(out, 0.0f);
  std::vector<double> y(n * out);
  for (int64_t r = 0; r < n; ++r)
    for (int64_t j = 0; j < out; ++j) {
      double acc = bv[j];
      for (int64_t i = 0; i < in; ++i) acc += x[r * in + i] * wv[i * out + j];
      y[r * out + j] = acc;
    }
  return y;
}

std::vector<double> ToDouble(const Tensor& t) {
  const std::vector<float> v = t.ToVector<float>();
  return std::vector<double>(v.begin(), v.end());
}

// ---- Linear ---------------------------------------------------------------------------------

TEST(LinearTest, ForwardAndGradients) {
  for (bool bias : {false, true}) {
    const std::string name = bias ? "linear+bias" : "linear";
    Linear linear(LinearOptions{.in = kD, .out = 5, .bias = bias});
    Randomize(linear.Parameters(), 1, 0.5f);
    Tensor x = RandomTensor({kB, kS, kD}, 10);  // leading dims flattened
    LinearActivations acts = linear.Forward(x);
    ASSERT_EQ(acts.y.shape(), (Shape{kB, kS, 5}));
    ExpectClose(acts.y.ToVector<float>(),
                NaiveLinear(ToDouble(x), kB * kS, linear.weight(), linear.bias()), kFwdAbsTol,
                kFwdRelTol, name + " forward");
    const std::vector<float> dy = RandomTensor(acts.y.shape(), 11).ToVector<float>();
    Tensor dx = linear.Backward(acts, Tensor::FromVector(dy, acts.y.shape()));
    CheckGradients(
        name, [&] { return linear.Forward(x).y; }, dy, x, dx, linear.Parameters());
    const std::vector<std::string> want_names =
        bias ? std::vector<std::string>{"weight", "bias"} : std::vector<std::string>{"weight"};
    EXPECT_EQ(Names(linear.Parameters()), want_names);
  }
}

TEST(LinearTest, MicroBatchesInFlightAccumulate) {
  Linear linear(LinearOptions{.in = kD, .out = 3, .bias = true});
  Randomize(linear.Parameters(), 2, 0.5f);
  Tensor x1 = RandomTensor({5, kD}, 20), x2 = RandomTensor({3, kD}, 21);
  Tensor dy1 = RandomTensor({5, 3}, 22), dy2 = RandomTensor({3, 3}, 23);
  // Separately: grads of each micro-batch.
  linear.Backward(linear.Forward(x1), dy1);
  const std::vector<float> g1 = linear.grad_weight().ToVector<float>(),
                           b1 = linear.grad_bias().ToVector<float>();
  linear.ZeroGrad();
  EXPECT_EQ(linear.grad_weight().ToVector<float>(), std::vector<float>(kD * 3, 0.0f));
  linear.Backward(linear.Forward(x2), dy2);
  const std::vector<float> g2 = linear.grad_weight().ToVector<float>(),
                           b2 = linear.grad_bias().ToVector<float>();
  linear.ZeroGrad();
  // Both forwards first, backwards in reverse order (a pipeline schedule's pattern).
  LinearActivations a1 = linear.Forward(x1), a2 = linear.Forward(x2);
  linear.Backward(a2, dy2);
  linear.Backward(a1, dy1);
  std::vector<double> want_w, want_b;
  for (size_t i = 0; i < g1.size(); ++i) want_w.push_back(static_cast<double>(g1[i]) + g2[i]);
  for (size_t i = 0; i < b1.size(); ++i) want_b.push_back(static_cast<double>(b1[i]) + b2[i]);
  // dW = x1^T dy1 + x2^T dy2 in one accumulating product vs two: the product bound over the
  // 8 rows (tests/testing/tolerance.h), which no summation order exceeds.
  std::vector<double> scale = test_util::AbsProduct(x1.ToVector<float>(), true,
                                                    dy1.ToVector<float>(), false, kD, 3, 5);
  const std::vector<double> scale2 = test_util::AbsProduct(x2.ToVector<float>(), true,
                                                           dy2.ToVector<float>(), false, kD, 3, 3);
  for (size_t i = 0; i < scale.size(); ++i) scale[i] += scale2[i];
  test_util::ExpectWithinProductBound(linear.grad_weight().ToVector<float>(), want_w, scale,
                                      /*k=*/8, "in flight dweight");
  // db = the column sums of dy1 and dy2: n = 8 terms per element, added in one order in
  // flight and in another as b1 + b2 (each from 0): two sums of the same terms differ by at
  // most 2 (n - 1) u sum |terms|.
  std::vector<double> bias_terms(3, 0.0);
  for (const Tensor* dy : {&dy1, &dy2}) {
    const std::vector<float> v = dy->ToVector<float>();
    for (size_t i = 0; i < v.size(); ++i) bias_terms[i % 3] += std::abs(double(v[i]));
  }
  test_util::ExpectWithinProductBound(linear.grad_bias().ToVector<float>(), want_b, bias_terms,
                                      /*k=*/8 - 1, "in flight dbias", /*c=*/2.0, /*extra=*/0);
}

TEST(LinearTest, FromTensorsRejectsWrongShapes) {
  LinearOptions o{.in = 4, .out = 3, .bias = true};
  StatusOr<Linear> bad =
      Linear::FromTensors(o, {Tensor::Zeros({3, 4}, DType::kF32), Tensor::Zeros({3}, DType::kF32)});
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("linear.weight has shape (3, 4), expected (4, 3)"),
            std::string::npos)
      << bad.status();
  StatusOr<Linear> no_bias = Linear::FromTensors(o, {Tensor::Zeros({4, 3}, DType::kF32), Tensor()});
  ASSERT_FALSE(no_bias.ok());
  EXPECT_NE(no_bias.status().message().find("linear.bias is missing"), std::string::npos);
  EXPECT_TRUE(
      Linear::FromTensors(o, {Tensor::Zeros({4, 3}, DType::kF32), Tensor::Zeros({3}, DType::kF32)})
          .ok());
  const LinearOptions zero_in{.in = 0, .out = 3};
  EXPECT_NE(zero_in.Validate().message().find("linear.in=0"), std::string::npos);
}

// ---- Norm -----------------------------------------------------------------------------------

TEST(NormLayerTest, ForwardAndGradients) {
  for (NormKind kind : {NormKind::kLayerNorm, NormKind::kRmsNorm}) {
    const std::string name = NormKindName(kind);
    Norm norm(NormOptions{.kind = kind, .dim = kD});
    // The standard initialisation first: weight one, bias zero.
    for (const Parameter& p : norm.Parameters()) {
      const float want = p.name == "weight" ? 1.0f : 0.0f;
      EXPECT_EQ(p.value.ToVector<float>(), std::vector<float>(kD, want)) << name << " " << p.name;
    }
    const std::vector<std::string> want_names = kind == NormKind::kLayerNorm
                                                    ? std::vector<std::string>{"weight", "bias"}
                                                    : std::vector<std::string>{"weight"};
    EXPECT_EQ(Names(norm.Parameters()), want_names);
    Randomize(norm.Parameters(), 3, 1.0f);
    Tensor x = RandomTensor({kB, kS, kD}, 30, -2.0f, 2.0f);
    NormActivations acts = norm.Forward(x);
    // Reference: (x - mean) / sqrt(var + eps) * w + b, mean = 0 for rmsnorm.
    const std::vector<double> xv = ToDouble(x), w = ToDouble(norm.weight());
    const std::vector<double> b =
        norm.bias().defined() ? ToDouble(norm.bias()) : std::vector<double>(kD, 0.0);
    std::vector<double> want(xv.size());
    for (int64_t r = 0; r < kB * kS; ++r) {
      double mu = 0.0, var = 0.0;
      if (kind == NormKind::kLayerNorm) {
        for (int64_t j = 0; j < kD; ++j) mu += xv[r * kD + j] / kD;
      }
      for (int64_t j = 0; j < kD; ++j) var += (xv[r * kD + j] - mu) * (xv[r * kD + j] - mu) / kD;
      for (int64_t j = 0; j < kD; ++j)
        want[r * kD + j] = (xv[r * kD + j] - mu) / std::sqrt(var + 1e-5) * w[j] + b[j];
    }
    ExpectClose(acts.y.ToVector<float>(), want, kFwdAbsTol, kFwdRelTol, name + " forward");
    const std::vector<float> dy = RandomTensor(x.shape(), 31).ToVector<float>();
    Tensor dx = norm.Backward(acts, Tensor::FromVector(dy, x.shape()));
    CheckGradients(
        name, [&] { return norm.Forward(x).y; }, dy, x, dx, norm.Parameters());
  }
  EXPECT_FALSE(ParseNormKind("batchnorm").ok());
  EXPECT_EQ(ParseNormKind("rmsnorm").value(), NormKind::kRmsNorm);
}

// ---- Embedding ------------------------------------------------------------------------------

TEST(EmbeddingLayerTest, ForwardAndGradients) {
  constexpr int64_t kV = 11, kSmax = 6;
  for (int64_t max_positions : {int64_t{0}, kSmax}) {
    const std::string name = max_positions ? "embedding+wpe" : "embedding";
    Embedding emb(
        EmbeddingOptions{.vocab_size = kV, .d_model = kD, .max_positions = max_positions});
    Randomize(emb.Parameters(), 4, 1.0f);
    // Token 7 three times (twice in one row), token 0 twice.
    Tensor tokens = Tensor::FromVector<int32_t>({7, 3, 7, 0, 10, 0, 7, 2}, {kB, kS});
    EmbeddingActivations acts = emb.Forward(tokens);
    ASSERT_EQ(acts.y.shape(), (Shape{kB, kS, kD}));
    const std::vector<int32_t> tv = tokens.ToVector<int32_t>();
    const std::vector<float> wte = emb.wte().ToVector<float>();
    const std::vector<float> wpe =
        max_positions ? emb.wpe().ToVector<float>() : std::vector<float>();
    std::vector<double> want(kB * kS * kD);
    for (int64_t r = 0; r < kB * kS; ++r)
      for (int64_t j = 0; j < kD; ++j)
        want[r * kD + j] = wte[tv[r] * kD + j] + (max_positions ? wpe[(r % kS) * kD + j] : 0.0f);
    ExpectClose(acts.y.ToVector<float>(), want, 0.0, 1e-7, name + " forward");
    const std::vector<float> dy = RandomTensor(acts.y.shape(), 41).ToVector<float>();
    emb.Backward(acts, Tensor::FromVector(dy, acts.y.shape()));
    CheckGradients(
        name, [&] { return emb.Forward(tokens).y; }, dy, Tensor(), Tensor(), emb.Parameters());
  }
}

// ---- Attention ------------------------------------------------------------------------------

// The block in double: projections, rotate-half RoPE, causal GQA softmax attention, output
// projection.
std::vector<double> NaiveAttention(const AttentionOptions& o, Attention& attn, const Tensor& x) {
  const int64_t hq = o.n_heads, hkv = o.kv_heads(), hd = o.head_dim(), n = kB * kS;
  const std::vector<double> xv = ToDouble(x);
  std::vector<double> q = NaiveLinear(xv, n, attn.q().weight(), attn.q().bias());
  std::vector<double> k = NaiveLinear(xv, n, attn.k().weight(), attn.k().bias());
  const std::vector<double> v = NaiveLinear(xv, n, attn.v().weight(), attn.v().bias());
  if (o.rope) {
    for (std::vector<double>* t : {&q, &k}) {
      const int64_t heads = t == &q ? hq : hkv;
      for (int64_t r = 0; r < n; ++r) {
        const double pos = static_cast<double>(r % kS);
        for (int64_t h = 0; h < heads; ++h) {
          double* e = t->data() + (r * heads + h) * hd;
          for (int64_t i = 0; i < hd / 2; ++i) {
            const double angle = pos * std::pow(o.rope_base, -2.0 * i / hd);
            const double x1 = e[i], x2 = e[i + hd / 2];
            e[i] = x1 * std::cos(angle) - x2 * std::sin(angle);
            e[i + hd / 2] = x2 * std::cos(angle) + x1 * std::sin(angle);
          }
        }
      }
    }
  }
  std::vector<double> a(n * hq * hd, 0.0);
  for (int64_t b = 0; b < kB; ++b)
    for (int64_t h = 0; h < hq; ++h) {
      const int64_t g = h / (hq / hkv);
      for (int64_t i = 0; i < kS; ++i) {
        std::vector<double> p(i + 1);
        double sum = 0.0;
        for (int64_t j = 0; j <= i; ++j) {
          double s = 0.0;
          for (int64_t e = 0; e < hd; ++e)
            s += q[((b * kS + i) * hq + h) * hd + e] * k[((b * kS + j) * hkv + g) * hd + e];
          p[j] = std::exp(s / std::sqrt(static_cast<double>(hd)));
          sum += p[j];
        }
        for (int64_t j = 0; j <= i; ++j)
          for (int64_t e = 0; e < hd; ++e)
            a[((b * kS + i) * hq + h) * hd + e] +=
                p[j] / sum * v[((b * kS + j) * hkv + g) * hd + e];
      }
    }
  return NaiveLinear(a, n, attn.o().weight(), attn.o().bias());
}

struct AttentionCase {
  int64_t n_heads, n_kv_heads;
  bool rope, bias;
  int64_t head_dim = 0;  // explicit_head_dim; 0: d / n_heads
  std::string Name() const {
    return StrCat("attention Hq=", n_heads, ",Hkv=", n_kv_heads, rope ? ",rope" : "",
                  bias ? ",bias" : "", head_dim > 0 ? StrCat(",hd=", head_dim) : "");
  }
};

TEST(AttentionLayerTest, ForwardAndGradients) {
  // The last two decouple the heads' width from d (model.head_dim): Hq * hd = 24 > d = 8,
  // and 3 heads of 2 (q width 6 < d, and 3 does not divide d).
  for (const AttentionCase& c : {AttentionCase{4, 2, true, true}, AttentionCase{2, 2, false, false},
                                 AttentionCase{2, 1, true, false}, AttentionCase{4, 2, true, true, 6},
                                 AttentionCase{3, 1, true, false, 2}}) {
    const AttentionOptions o{.d_model = kD,
                             .n_heads = c.n_heads,
                             .n_kv_heads = c.n_kv_heads,
                             .explicit_head_dim = c.head_dim,
                             .bias = c.bias,
                             .rope = c.rope};
    if (c.head_dim > 0) {
      ASSERT_EQ(o.head_dim(), c.head_dim);
    }
    Attention attn(o);
    Randomize(attn.Parameters(), 5, 0.6f);
    Tensor x = RandomTensor({kB, kS, kD}, 50);
    AttentionActivations acts = attn.Forward(x);
    ASSERT_EQ(acts.y().shape(), (Shape{kB, kS, kD}));
    ExpectClose(acts.y().ToVector<float>(), NaiveAttention(o, attn, x), kFwdAbsTol, kFwdRelTol,
                c.Name() + " forward");
    const std::vector<float> dy = RandomTensor(x.shape(), 51).ToVector<float>();
    Tensor dx = attn.Backward(acts, Tensor::FromVector(dy, x.shape()));
    CheckGradients(
        c.Name(), [&] { return attn.Forward(x).y(); }, dy, x, dx, attn.Parameters());
  }
}

TEST(AttentionLayerTest, CausalAcrossTheBlock) {
  Attention attn(
      AttentionOptions{.d_model = kD, .n_heads = 4, .n_kv_heads = 2, .bias = true, .rope = true});
  Randomize(attn.Parameters(), 6, 0.6f);
  Tensor x = RandomTensor({1, kS, kD}, 60);
  const std::vector<float> before = attn.Forward(x).y().ToVector<float>();
  Tensor changed = x.Clone();
  for (int64_t j = 0; j < kD; ++j) changed.data<float>()[(kS - 1) * kD + j] += 1.0f;  // last token
  const std::vector<float> after = attn.Forward(changed).y().ToVector<float>();
  for (int64_t i = 0; i < (kS - 1) * kD; ++i) ASSERT_EQ(after[i], before[i]) << "element " << i;
  EXPECT_NE(after.back(), before.back());
}

// bf16 matrix products and head_dim 64 select the fused attention (kernels/flash_attention.h,
// the CPU twin here): Backward hands it delta = rowsum(da * a) from the kept output; with
// CoreAttention::kRecompute the output is recomputed by the same kernel first. Both give the
// same bits, and differ from the exact f32 layer (the operands are rounded).
TEST(AttentionLayerTest, FusedBf16PathKeepsAndRecomputesTheSameGradients) {
  const AttentionOptions o{.d_model = 128, .n_heads = 2, .n_kv_heads = 1, .rope = true};
  auto bf16 = DeviceContext::Create(Device::Cpu());
  bf16->set_matmul_dtype(DType::kBF16);
  ASSERT_TRUE(kernels::UseFlashAttention(bf16.get(), o.head_dim()));
  Tensor x = RandomTensor({2, 70, o.d_model}, 70);
  Tensor dy = RandomTensor(x.shape(), 71);
  std::vector<std::vector<float>> grads[2];
  for (int pass = 0; pass < 2; ++pass) {
    Attention attn(o);
    Randomize(attn.Parameters(), 7, 0.2f);
    const CoreAttention core = pass == 0 ? CoreAttention::kKeep : CoreAttention::kRecompute;
    AttentionActivations acts = attn.Forward(x, bf16.get(), core);
    grads[pass].push_back(attn.Backward(acts, dy, bf16.get()).ToVector<float>());
    for (const Parameter& p : attn.Parameters()) grads[pass].push_back(p.grad.ToVector<float>());
  }
  ASSERT_EQ(grads[0].size(), grads[1].size());
  for (size_t i = 0; i < grads[0].size(); ++i) {
    EXPECT_EQ(grads[0][i], grads[1][i]) << "gradient " << i;
    for (float g : grads[0][i]) ASSERT_TRUE(std::isfinite(g)) << "gradient " << i;
  }
  Attention exact(o);
  Randomize(exact.Parameters(), 7, 0.2f);
  EXPECT_NE(exact.Backward(exact.Forward(x), dy).ToVector<float>(), grads[0][0]);
}

TEST(AttentionLayerTest, OptionsAreValidated) {
  const AttentionOptions bad_heads{.d_model = 8, .n_heads = 3};
  EXPECT_NE(bad_heads.Validate().message().find(
                "attention.n_heads=3 does not divide attention.d_model=8"),
            std::string::npos);
  const AttentionOptions bad_kv{.d_model = 8, .n_heads = 4, .n_kv_heads = 3};
  EXPECT_NE(bad_kv.Validate().message().find(
                "attention.n_kv_heads=3 does not divide attention.n_heads=4"),
            std::string::npos);
  EXPECT_FALSE(
      (AttentionOptions{.d_model = 12, .n_heads = 4, .rope = true}.Validate().ok()));  // hd=3
  EXPECT_TRUE((
      AttentionOptions{.d_model = 8, .n_heads = 4, .n_kv_heads = 1, .rope = true}.Validate().ok()));
  // An explicit head width: any n_heads, an even width under rope.
  EXPECT_TRUE((AttentionOptions{.d_model = 8, .n_heads = 3, .explicit_head_dim = 4, .rope = true}
                   .Validate()
                   .ok()));
  EXPECT_NE((AttentionOptions{.d_model = 8, .n_heads = 4, .explicit_head_dim = 5, .rope = true})
                .Validate()
                .message()
                .find("attention.rope needs an even head_dim, got 5"),
            std::string::npos);
  EXPECT_NE((AttentionOptions{.d_model = 8, .n_heads = 4, .explicit_head_dim = -2})
                .Validate()
                .message()
                .find("attention.explicit_head_dim=-2 must be >= 0"),
            std::string::npos);
}

// ---- MLP ------------------------------------------------------------------------------------

// Context parallelism's local layout by hand: 2 sequences of 8 over cp 2 (4 chunks of 2);
// rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2, each (2B, 2) with chunk i's rows first.
// (The chunks' positions in RoPE and the learned table are checked end to end by
// tests/dist/context_parallel_train_test.cc: a wrong offset changes every loss.)
TEST(ContextParallelTest, ShardSequencesHandCase) {
  std::vector<int32_t> v(16);
  for (int i = 0; i < 16; ++i) v[i] = i;
  const Tensor whole = Tensor::FromVector<int32_t>(v, {2, 8});
  const Tensor r0 = parallel::ShardSequences(whole, 2, 0), r1 = parallel::ShardSequences(whole, 2, 1);
  EXPECT_EQ(r0.shape(), (Shape{4, 2}));
  EXPECT_EQ(r0.ToVector<int32_t>(), (std::vector<int32_t>{0, 1, 8, 9, 6, 7, 14, 15}));
  EXPECT_EQ(r1.ToVector<int32_t>(), (std::vector<int32_t>{2, 3, 10, 11, 4, 5, 12, 13}));
  EXPECT_EQ(parallel::UnshardSequences({r0, r1}).ToVector<int32_t>(), v);
}

TEST(MlpTest, ForwardAndGradients) {
  constexpr int64_t kF = 12;
  for (Activation act : {Activation::kGelu, Activation::kRelu, Activation::kSwiglu}) {
    for (bool bias : {false, true}) {
      const std::string name = StrCat("mlp ", ActivationName(act), bias ? "+bias" : "");
      Mlp mlp(MlpOptions{.d_model = kD, .d_hidden = kF, .activation = act, .bias = bias});
      Randomize(mlp.Parameters(), 7, 0.6f);
      // relu is piecewise linear: central differences are exact unless a step crosses the
      // kink. One step moves a pre-activation by at most kStep (|x| <= 1, |w1| <= 0.6, and
      // b1 by kStep), so pick the first input whose pre-activations all keep |a| > 2 kStep.
      Tensor x;
      for (uint64_t stream = 70; stream < 2070 && !x.defined(); ++stream) {
        Tensor candidate = RandomTensor({kB, kS, kD}, stream);
        bool clear = true;
        for (float a : mlp.Forward(candidate).fc1.y.ToVector<float>())
          clear = clear && std::abs(a) > 2 * kStep;
        if (clear || act != Activation::kRelu) x = candidate;
      }
      ASSERT_TRUE(x.defined()) << "no input keeps relu off the kink";
      MlpActivations acts = mlp.Forward(x);
      // Reference.
      const int64_t n = kB * kS;
      const std::vector<double> a = NaiveLinear(ToDouble(x), n, mlp.w1().weight(), mlp.w1().bias());
      std::vector<double> h(a.size());
      std::vector<double> b3;
      if (act == Activation::kSwiglu) b3 = NaiveLinear(ToDouble(x), n, mlp.w3().weight(), Tensor());
      for (size_t i = 0; i < a.size(); ++i) {
        const double v = a[i];
        switch (act) {
          case Activation::kGelu:
            h[i] = 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
            break;
          case Activation::kRelu:
            h[i] = v > 0 ? v : 0;
            break;
          case Activation::kSwiglu:
            h[i] = v / (1.0 + std::exp(-v)) * b3[i];
            break;
        }
      }
      ExpectClose(acts.y().ToVector<float>(), NaiveLinear(h, n, mlp.w2().weight(), mlp.w2().bias()),
                  kFwdAbsTol, kFwdRelTol, name + " forward");
      const std::vector<float> dy = RandomTensor(x.shape(), 71).ToVector<float>();
      Tensor dx = mlp.Backward(acts, Tensor::FromVector(dy, x.shape()));
      CheckGradients(
          name, [&] { return mlp.Forward(x).y(); }, dy, x, dx, mlp.Parameters());
    }
  }
}

// ---- initialisation -------------------------------------------------------------------------

TEST(InitTest, KeyedByNameAndSeedWithStdAndZeroBiases) {
  const MlpOptions o{
      .d_model = 32, .d_hidden = 64, .activation = Activation::kSwiglu, .bias = true};
  Mlp a = Mlp::Init(o, 1234, "layers.0.mlp"), b = Mlp::Init(o, 1234, "layers.0.mlp");
  Mlp other_name = Mlp::Init(o, 1234, "layers.1.mlp"),
      other_seed = Mlp::Init(o, 99, "layers.0.mlp");
  const std::vector<Parameter> pa = a.Parameters(), pb = b.Parameters(),
                                    pn = other_name.Parameters(), ps = other_seed.Parameters();
  EXPECT_EQ(Names(pa), (std::vector<std::string>{"w1.weight", "w1.bias", "w2.weight", "w2.bias",
                                                 "w3.weight"}));
  std::set<std::vector<float>> distinct_weights;
  for (size_t i = 0; i < pa.size(); ++i) {
    const std::vector<float> v = pa[i].value.ToVector<float>();
    EXPECT_EQ(v, pb[i].value.ToVector<float>()) << pa[i].name << ": same name and seed";
    if (pa[i].name.ends_with("bias")) {
      EXPECT_EQ(v, std::vector<float>(v.size(), 0.0f)) << pa[i].name;
      continue;
    }
    EXPECT_NE(v, pn[i].value.ToVector<float>()) << pa[i].name << ": another name";
    EXPECT_NE(v, ps[i].value.ToVector<float>()) << pa[i].name << ": another seed";
    distinct_weights.insert(v);
    double sum = 0.0, sq = 0.0;
    for (float e : v) sum += e, sq += static_cast<double>(e) * e;
    const double mean = sum / v.size(), std = std::sqrt(sq / v.size() - mean * mean);
    // 2048 draws: the sample std is within ~3% of 0.02 and the mean within ~3 sigma/sqrt(n).
    EXPECT_NEAR(std, 0.02, 0.002) << pa[i].name;
    EXPECT_NEAR(mean, 0.0, 0.002) << pa[i].name;
  }
  EXPECT_EQ(distinct_weights.size(), 3u) << "w1, w2 and w3 draw from different streams";

  Attention attn =
      Attention::Init(AttentionOptions{.d_model = 16, .n_heads = 4, .n_kv_heads = 2, .bias = true},
                      7, "layers.0.attn", 0.02f, /*out_std=*/0.005f);
  EXPECT_EQ(Names(attn.Parameters()),
            (std::vector<std::string>{"q.weight", "q.bias", "k.weight", "k.bias", "v.weight",
                                      "v.bias", "o.weight", "o.bias"}));
  EXPECT_EQ(attn.k().weight().shape(), (Shape{16, 8}));
  double max_o = 0.0;
  for (float e : attn.o().weight().ToVector<float>())
    max_o = std::max(max_o, std::abs(static_cast<double>(e)));
  EXPECT_LT(max_o, 0.005 * 5.0) << "the output projection uses out_std";

  Embedding emb = Embedding::Init(
      EmbeddingOptions{.vocab_size = 50, .d_model = 16, .max_positions = 8}, 7, "embed");
  EXPECT_EQ(Names(emb.Parameters()), (std::vector<std::string>{"wte", "wpe"}));
  EXPECT_NE(emb.wte().ToVector<float>()[0], 0.0f);
}

}  // namespace
}  // namespace switchyard::dense
