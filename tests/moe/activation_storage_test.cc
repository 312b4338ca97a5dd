// bf16 activation storage (runtime.activation_dtype=bf16, kernels/activation_storage.h,
// MODEL.md "Activation storage") on the CPU, the exact reference of the GPU's rounding. Each
// layer runs twice with bf16 matrix products: f32 storage (the reference) and bf16 storage.
//  - Linear and Attention keep products' inputs as the bf16 operands the forward products
//    read: the forward, dx and every weight gradient are the same bits (lossless), except
//    where the fused attention's backward reads its kept output o.x back (delta): there they
//    are the f32-storage gradients given o.x rounded by hand.
//  - Mlp (dense) and Experts (MoE) also keep their pre-activations a (and b under swiglu)
//    rounded to bf16: the forward is the same bits, and the backward equals, bit for bit, the
//    f32-storage backward run on activations rounded to bf16 by hand here.
//  - The MoE layer keeps its combine's rows rounded to bf16: the forward is the same bits,
//    and the backward equals, bit for bit, the f32-storage backward given those rows rounded
//    by hand (only the gates' gradient reads them); the experts' and the shared experts'
//    outputs are kept under neither storage.
//  - What is kept is bf16 where the contract says so, and holds the rounded values.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "dense/attention.h"
#include "dense/linear.h"
#include "dense/mlp.h"
#include "engine/core/device_context.h"
#include "engine/core/dtype.h"
#include "kernels/flash_attention.h"
#include "kernels/random.h"
#include "moe/experts.h"
#include "moe/moe_layer.h"
#include "tests/moe/moe_layer_test_util.h"

namespace switchyard {
namespace {

Tensor Random(const Shape& shape, uint64_t stream, float scale = 1.0f) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillUniform(t, RngKey{2026, stream}, 0, -scale, scale);
  return t;
}

// A CPU context with bf16 matrix products and f32 or bf16 activation storage.
std::unique_ptr<DeviceContext> Context(DType storage) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  ctx->set_matmul_dtype(DType::kBF16);
  ctx->set_activation_dtype(storage);
  return ctx;
}

// t's values as f32 (a bf16 tensor widened).
std::vector<float> Values(const Tensor& t) {
  if (t.dtype() == DType::kF32) return t.ToVector<float>();
  std::vector<float> out;
  for (BFloat16 v : t.ToVector<BFloat16>()) out.push_back(static_cast<float>(v));
  return out;
}

// t (f32) rounded to bf16 by hand (round to nearest even), as a new f32 tensor.
Tensor RoundedByHand(const Tensor& t) {
  std::vector<float> v = t.ToVector<float>();
  for (float& x : v) x = BFloat16::ToFloat(BFloat16::FromFloat(x));
  return Tensor::FromVector(v, t.shape());
}

// Same bits, element by element (NaN-safe and -0 vs +0 aware).
void ExpectSameBits(const Tensor& got, const Tensor& want, const std::string& what) {
  const std::vector<float> g = Values(got), w = Values(want);
  ASSERT_EQ(g.size(), w.size()) << what;
  ASSERT_GT(g.size(), 0u) << what;
  EXPECT_EQ(std::memcmp(g.data(), w.data(), g.size() * sizeof(float)), 0) << what << " differs";
}

// Kept as the bf16 operand: a bf16 tensor holding x rounded.
void ExpectBf16Of(const Tensor& kept, const Tensor& f32, const std::string& what) {
  EXPECT_EQ(kept.dtype(), DType::kBF16) << what;
  ExpectSameBits(kept, RoundedByHand(f32), what);
}

TEST(ActivationStorageTest, LinearWeightGradientsAreTheSameBits) {
  auto f32s = Context(DType::kF32), bf16s = Context(DType::kBF16);
  for (bool bias : {false, true}) {
    SCOPED_TRACE(bias ? "bias" : "no bias");
    const dense::LinearOptions o{.in = 24, .out = 20, .bias = bias};
    dense::Linear ref(o), sut(o);
    for (dense::Linear* l : {&ref, &sut}) {
      l->weight().CopyFrom(Random(l->weight().shape(), 1, 0.5f));
      if (bias) l->bias().CopyFrom(Random(l->bias().shape(), 2, 0.5f));
    }
    const Tensor x = Random({3, 7, 24}, 3), dy = Random({3, 7, 20}, 4);
    const dense::LinearActivations ra = ref.Forward(x, f32s.get());
    const dense::LinearActivations sa = sut.Forward(x, bf16s.get());
    EXPECT_EQ(ra.x.dtype(), DType::kF32);
    ExpectBf16Of(sa.x, x, "kept x");
    ExpectSameBits(sa.y, ra.y, "y");
    ExpectSameBits(sut.Backward(sa, dy, bf16s.get()), ref.Backward(ra, dy, f32s.get()), "dx");
    ExpectSameBits(sut.grad_weight(), ref.grad_weight(), "dW");
    if (bias) ExpectSameBits(sut.grad_bias(), ref.grad_bias(), "db");
    // kAsGiven keeps x itself.
    EXPECT_EQ(sut.Forward(x, bf16s.get(), true, kernels::KeepInput::kAsGiven).x.dtype(),
              DType::kF32);
  }
}

// Both paths of the core attention. The exact f32 kernel (head_dim 4) never reads the kept
// output o.x, so there every gradient is the same bits as under f32 storage (lossless). The
// fused bf16 one (head_dim 64) reads o.x back for delta = rowsum(da * o.x): its gradients
// are those of f32 storage given o.x rounded to bf16 by hand. It keeps q, k and v in bf16,
// the operands its kernels round f32 ones to: no other change.
TEST(ActivationStorageTest, AttentionGradientsAreTheF32GradientsOfTheKeptOperands) {
  auto f32s = Context(DType::kF32), bf16s = Context(DType::kBF16);
  dense::AttentionOptions options[2];
  options[0].d_model = 16, options[0].n_heads = 4, options[0].n_kv_heads = 2;
  options[0].bias = true, options[0].rope = true;
  options[1].d_model = 128, options[1].n_heads = 2, options[1].n_kv_heads = 1;
  options[1].rope = true;
  for (const dense::AttentionOptions& o : options) {
    SCOPED_TRACE("d_model " + std::to_string(o.d_model));
    dense::Attention ref(o), sut(o);
    uint64_t stream = 10;
    for (dense::Attention* a : {&ref, &sut}) {
      stream = 10;
      for (const dense::Parameter& p : a->Parameters()) {
        Tensor v = p.value;
        v.CopyFrom(Random(v.shape(), stream++, 0.3f));
      }
    }
    const Tensor x = Random({2, 9, o.d_model}, 40), dy = Random({2, 9, o.d_model}, 41);
    dense::AttentionActivations ra = ref.Forward(x, f32s.get());
    const dense::AttentionActivations sa = sut.Forward(x, bf16s.get());
    ExpectBf16Of(sa.q.x, x, "q/k/v's kept x");
    EXPECT_TRUE(sa.q.x.SharesStorageWith(sa.k.x) && sa.q.x.SharesStorageWith(sa.v.x))
        << "q, k and v share one operand";
    EXPECT_FALSE(sa.x.defined());
    ExpectBf16Of(sa.o.x, ra.o.x, "o.x");
    ExpectSameBits(sa.y(), ra.y(), "y");
    const bool fused = kernels::UseFlashAttention(bf16s.get(), o.head_dim());
    ASSERT_EQ(fused, o.head_dim() == 64);
    if (fused) {
      // q, k and v (after RoPE) kept as the kernels' bf16 operands, the f32 ones let go.
      ExpectBf16Of(sa.q.y, ra.q.y, "q");
      ExpectBf16Of(sa.k_heads, ra.k_heads, "k");
      ExpectBf16Of(sa.v_heads, ra.v_heads, "v");
      ra.o.x = RoundedByHand(ra.o.x);
    } else {
      for (const Tensor* t : {&sa.q.y, &sa.k_heads, &sa.v_heads}) {
        EXPECT_EQ(t->dtype(), DType::kF32) << "the exact path keeps q, k, v in f32";
      }
    }
    ExpectSameBits(sut.Backward(sa, dy, bf16s.get()), ref.Backward(ra, dy, f32s.get()), "dx");
    const std::vector<dense::Parameter> rp = ref.Parameters(), sp = sut.Parameters();
    for (size_t i = 0; i < rp.size(); ++i) ExpectSameBits(sp[i].grad, rp[i].grad, rp[i].name);
  }
}

TEST(ActivationStorageTest, MlpBackwardIsTheF32BackwardOfRoundedActivations) {
  auto f32s = Context(DType::kF32), bf16s = Context(DType::kBF16);
  for (dense::Activation act :
       {dense::Activation::kGelu, dense::Activation::kRelu, dense::Activation::kSwiglu}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(StrCat(dense::ActivationName(act), bias ? " + bias" : ""));
      dense::MlpOptions o;
      o.d_model = 16, o.d_hidden = 40, o.activation = act, o.bias = bias;
      dense::Mlp ref(o), sut(o);
      for (dense::Mlp* m : {&ref, &sut}) {
        uint64_t stream = 20;
        for (const dense::Parameter& p : m->Parameters()) {
          Tensor v = p.value;
          v.CopyFrom(Random(v.shape(), stream++, 0.6f));
        }
      }
      const Tensor x = Random({3, 5, 16}, 50), dy = Random({3, 5, 16}, 51);
      dense::MlpActivations ra = ref.Forward(x, f32s.get());
      const dense::MlpActivations sa = sut.Forward(x, bf16s.get());
      ExpectSameBits(sa.y(), ra.y(), "y (the forward is unchanged)");
      // Kept: x and h as the products' bf16 operands, a and b rounded.
      ExpectBf16Of(sa.fc1.x, x, "x");
      ExpectBf16Of(sa.fc2.x, ra.fc2.x, "h");
      ExpectBf16Of(sa.fc1.y, ra.fc1.y, "a");
      if (act == dense::Activation::kSwiglu) {
        EXPECT_TRUE(sa.fc3.x.SharesStorageWith(sa.fc1.x)) << "W1 and W3 share one operand";
        ExpectBf16Of(sa.fc3.y, ra.fc3.y, "b");
      }
      // The reference: f32 storage's backward on a and b rounded by hand.
      ra.fc1.y = RoundedByHand(ra.fc1.y);
      if (ra.fc3.y.defined()) ra.fc3.y = RoundedByHand(ra.fc3.y);
      ExpectSameBits(sut.Backward(sa, dy, bf16s.get()), ref.Backward(ra, dy, f32s.get()), "dx");
      const std::vector<dense::Parameter> rp = ref.Parameters(), sp = sut.Parameters();
      for (size_t i = 0; i < rp.size(); ++i) ExpectSameBits(sp[i].grad, rp[i].grad, rp[i].name);
    }
  }
}

TEST(ActivationStorageTest, ExpertsBackwardIsTheF32BackwardOfRoundedActivations) {
  auto f32s = Context(DType::kF32), bf16s = Context(DType::kBF16);
  const std::vector<int64_t> rows = {7, 0, 12};  // expert 1 gets no rows
  for (moe::Activation act :
       {moe::Activation::kGelu, moe::Activation::kRelu, moe::Activation::kSwiglu}) {
    for (bool bias : {false, true}) {
      SCOPED_TRACE(StrCat(dense::ActivationName(act), bias ? " + bias" : ""));
      const moe::ExpertsOptions o{.d_model = 16, .d_hidden = 24, .activation = act,
                                  .bias = bias, .num_local = 3};
      moe::Experts ref(o), sut(o);
      for (moe::Experts* e : {&ref, &sut}) {
        uint64_t stream = 30;
        for (Tensor t : {e->w1(), e->w2(), e->w3(), e->b1(), e->b2()}) {
          if (t.defined()) t.CopyFrom(Random(t.shape(), stream, 0.6f));
          ++stream;
        }
      }
      const Tensor x = Random({19, 16}, 60), dy = Random({19, 16}, 61);
      moe::ExpertsActivations ra = ref.Forward(x, rows, f32s.get());
      const moe::ExpertsActivations sa = sut.Forward(x, rows, bf16s.get());
      ExpectSameBits(sa.y, ra.y, "y (the forward is unchanged)");
      ExpectBf16Of(sa.x, x, "x");
      ExpectBf16Of(sa.h, ra.h, "h");
      ExpectBf16Of(sa.a, ra.a, "a");
      if (act == moe::Activation::kSwiglu) ExpectBf16Of(sa.b, ra.b, "b");
      // The device-sized groups (offsets; GELU with a bias goes through GroupedGemmBiasGelu):
      // the same forward, the same kept tensors.
      const Tensor offsets = Tensor::FromVector(std::vector<int64_t>{0, 7, 7, 19}, {4});
      const moe::ExpertsActivations so = sut.Forward(x, offsets, bf16s.get());
      ExpectSameBits(so.y, ra.y, "y, device-sized groups");
      ExpectBf16Of(so.h, ra.h, "h, device-sized groups");
      ExpectBf16Of(so.a, ra.a, "a, device-sized groups");
      ra.a = RoundedByHand(ra.a);
      if (ra.b.defined()) ra.b = RoundedByHand(ra.b);
      ExpectSameBits(sut.Backward(sa, dy, bf16s.get()), ref.Backward(ra, dy, f32s.get()), "dx");
      ExpectSameBits(sut.grad_w1(), ref.grad_w1(), "dW1");
      ExpectSameBits(sut.grad_w2(), ref.grad_w2(), "dW2");
      if (act == moe::Activation::kSwiglu) ExpectSameBits(sut.grad_w3(), ref.grad_w3(), "dW3");
      if (bias) {
        ExpectSameBits(sut.grad_b1(), ref.grad_b1(), "db1");
        ExpectSameBits(sut.grad_b2(), ref.grad_b2(), "db2");
      }
      // The rounding is real: the gradients differ from the f32-storage run's unrounded
      // backward for at least one of the activations (a few hundred rounded values).
      if (act == moe::Activation::kGelu) {
        moe::Experts plain(o);
        plain.w1().CopyFrom(ref.w1());
        plain.w2().CopyFrom(ref.w2());
        if (bias) {
          plain.b1().CopyFrom(ref.b1());
          plain.b2().CopyFrom(ref.b2());
        }
        plain.Backward(plain.Forward(x, rows, f32s.get()), dy, f32s.get());
        EXPECT_NE(Values(plain.grad_w1()), Values(sut.grad_w1()));
      }
      // The shared experts' input (kAsGiven) stays the caller's f32 tensor.
      const moe::ExpertsActivations shared =
          sut.Forward(x, rows, bf16s.get(), kernels::GroupSchedule::kAuto,
                      kernels::KeepInput::kAsGiven);
      EXPECT_TRUE(shared.x.SharesStorageWith(x));
    }
  }
}

// The routed and shared experts' pre-activations rounded by hand, as bf16 storage keeps them.
void RoundPreActivations(moe::MoEActivations& acts) {
  for (moe::ExpertsActivations* e : {&acts.experts, acts.shared ? &*acts.shared : nullptr}) {
    if (e == nullptr) continue;
    e->a = RoundedByHand(e->a);
    if (e->b.defined()) e->b = RoundedByHand(e->b);
  }
}

TEST(ActivationStorageTest, MoELayerKeepsItsCombineRowsRounded) {
  auto f32s = Context(DType::kF32), bf16s = Context(DType::kBF16);
  auto ep = dist::MakeLocalCommunicator();
  for (int64_t shared : {0, 1}) {
    SCOPED_TRACE(shared ? "a shared expert" : "no shared expert");
    moe::MoEConfig config = moe::testing::Config(/*E=*/4, /*k=*/2, moe::Activation::kSwiglu);
    config.d_model = 16;
    config.d_expert = 24;
    config.normalize_gates = true;
    config.num_shared_experts = shared;
    config.aux_loss_coef = 0.01f;
    moe::MoELayer ref = moe::testing::MakeLayer(config, ep.get()), sut = moe::testing::MakeLayer(config, ep.get());
    const Tensor h = Random({12, 16}, 70), dy = Random({12, 16}, 71);
    moe::MoEForward rf = ref.Forward(h, 12, /*training=*/true, 0, 0, f32s.get());
    const moe::MoEForward sf = sut.Forward(h, 12, /*training=*/true, 0, 0, bf16s.get());
    ExpectSameBits(sf.y, rf.y, "y (the forward is unchanged)");
    ExpectBf16Of(sf.acts.expert_out, rf.acts.expert_out, "the combine's rows");
    for (const moe::MoEForward* f : {static_cast<const moe::MoEForward*>(&rf), &sf}) {
      EXPECT_FALSE(f->acts.experts.y.defined()) << "the experts' output is kept";
      if (shared) {
        EXPECT_FALSE(f->acts.shared->y.defined()) << "the shared experts' output is kept";
      }
    }
    // The f32-storage backward given what bf16 storage rounds: the combine's rows, and the
    // routed and shared experts' pre-activations (ExpertsBackwardIsTheF32Backward... above).
    rf.acts.expert_out = RoundedByHand(rf.acts.expert_out);
    RoundPreActivations(rf.acts);
    const std::vector<float> daux(1, 1.0f), dz(1, 0.0f);
    ExpectSameBits(sut.Backward(sf.acts, dy, daux, dz, bf16s.get()),
                   ref.Backward(rf.acts, dy, daux, dz, f32s.get()), "dh");
    ExpectSameBits(sut.grad_router_weight(), ref.grad_router_weight(), "the router's gradient");
    ExpectSameBits(sut.experts().grad_w1(), ref.experts().grad_w1(), "dW1");
    ExpectSameBits(sut.experts().grad_w2(), ref.experts().grad_w2(), "dW2");
    // The rows' rounding is real: with the pre-activations rounded alone, the router's
    // gradient differs.
    moe::MoELayer plain = moe::testing::MakeLayer(config, ep.get());
    moe::MoEForward pf = plain.Forward(h, 12, /*training=*/true, 0, 0, f32s.get());
    RoundPreActivations(pf.acts);
    plain.Backward(pf.acts, dy, daux, dz, f32s.get());
    EXPECT_NE(Values(plain.grad_router_weight()), Values(sut.grad_router_weight()));
  }
}

// A context refuses bf16 storage without bf16 products.
TEST(ActivationStorageDeathTest, Bf16StorageNeedsBf16Products) {
  auto ctx = DeviceContext::Create(Device::Cpu());
  EXPECT_DEATH(ctx->set_activation_dtype(DType::kBF16), "needs bf16 matrix products");
  ctx->set_matmul_dtype(DType::kBF16);
  ctx->set_activation_dtype(DType::kBF16);
  EXPECT_EQ(ctx->activation_dtype(), DType::kBF16);
}

}  // namespace
}  // namespace switchyard
