// Mlp (dense/mlp.h): dense::Linear for the products, kernels/activation.h in between.
#include "dense/mlp.h"

#include <utility>

#include "kernels/activation.h"
#include "kernels/activation_storage.h"
#include "kernels/gemm.h"

namespace switchyard::dense {
namespace {

bool IsSwiglu(const MlpOptions& o) { return o.activation == Activation::kSwiglu; }

// (..., n) as rows (N, n).
Tensor Rows2d(const Tensor& t) {
  const int64_t n = t.dim(-1);
  return t.Reshape({n == 0 ? 0 : t.numel() / n, n});
}

// The options of one projection; checks `o` first, since the shapes come from it.
LinearOptions Projection(const MlpOptions& o, int64_t in, int64_t out, bool bias,
                         LinearSplit split) {
  SY_CHECK_OK(o.Validate());
  return LinearOptions{.in = in, .out = out, .bias = bias, .device = o.device,
                       .split = o.tp.active() ? split : LinearSplit::kNone,
                       .tp_rank = o.tp.rank(), .tp_size = o.tp.size()};
}
LinearOptions W1(const MlpOptions& o) {
  return Projection(o, o.d_model, o.d_hidden, o.bias, LinearSplit::kColumn);
}
LinearOptions W2(const MlpOptions& o) {
  return Projection(o, o.d_hidden, o.d_model, o.bias, LinearSplit::kRow);
}
LinearOptions W3(const MlpOptions& o) {
  return Projection(o, o.d_model, o.d_hidden, false, LinearSplit::kColumn);
}

}  // namespace

StatusOr<Activation> ParseActivation(const std::string& name, std::string_view key) {
  if (name == "gelu") return Activation::kGelu;
  if (name == "relu") return Activation::kRelu;
  if (name == "swiglu") return Activation::kSwiglu;
  return InvalidArgument(key, "='", name, "' is not one of gelu, relu, swiglu");
}

const char* ActivationName(Activation activation) {
  switch (activation) {
    case Activation::kGelu:
      return "gelu";
    case Activation::kRelu:
      return "relu";
    case Activation::kSwiglu:
      return "swiglu";
  }
  return "?";
}

Status MlpOptions::Validate() const {
  if (d_model <= 0) return InvalidArgument("mlp.d_model=", d_model, " must be > 0");
  if (d_hidden <= 0) return InvalidArgument("mlp.d_hidden=", d_hidden, " must be > 0");
  if (d_hidden % tp.size() != 0) {
    return InvalidArgument("parallel.tp=", tp.size(), " does not divide the MLP hidden size ",
                           d_hidden, " (model.d_ff)");
  }
  return OkStatus();
}

Mlp::Mlp(const MlpOptions& options, DeviceContext* ctx)
    : Mlp(options, Linear(W1(options), ctx), Linear(W2(options), ctx),
          IsSwiglu(options) ? std::optional<Linear>(Linear(W3(options), ctx)) : std::nullopt) {}

Mlp::Mlp(const MlpOptions& options, Linear w1, Linear w2, std::optional<Linear> w3)
    : options_(options), w1_(std::move(w1)), w2_(std::move(w2)), w3_(std::move(w3)) {}

Mlp Mlp::Init(const MlpOptions& options, uint64_t seed, const std::string& name, float std,
              float out_std, DeviceContext* ctx) {
  return Mlp(options, Linear::Init(W1(options), seed, name + ".w1", std, ctx),
             Linear::Init(W2(options), seed, name + ".w2", out_std, ctx),
             IsSwiglu(options)
                 ? std::optional<Linear>(Linear::Init(W3(options), seed, name + ".w3", std, ctx))
                 : std::nullopt);
}

// W1's bias goes into the activation's kernel (kernels::BiasGeluForward, BiasSwigluForward;
// and their backward computes its gradient): bit-identical to the bias add then the
// activation, one pass over the (N, f) hidden activations less each way. relu keeps the
// unfused sequence.
bool Mlp::FusesBias() const {
  return w1_.adds_bias() && options_.activation != Activation::kRelu;
}

MlpActivations Mlp::Forward(const Tensor& x_in, DeviceContext* ctx) const {
  MlpActivations acts;
  const Tensor x = EnterTensorParallel(options_.tp, x_in, ctx);
  // W1 and W3 read x: under bf16 activation storage it is converted once, and both keep
  // that operand (kernels/activation_storage.h).
  const Tensor x_mm = kernels::KeptOperand(x, ctx);
  const bool fuse = FusesBias();
  acts.fc1 = w1_.Forward(x_mm, ctx, /*add_bias=*/!fuse);  // a (..., f); + b1 below when fused
  // gelu and swiglu run as the fused ops, with the bias or without (an undefined one). Under
  // bf16 storage they write h and what backward keeps of a (and b) in bf16 in their pass
  // (kernels::KeptRounded): the bits of the f32 op, then KeptOperand / KeepRounded.
  const bool fused_act = options_.activation != Activation::kRelu;
  const Tensor b1 = fuse ? w1_.bias() : Tensor();
  const bool kept16 = fused_act && kernels::StoresBf16(ctx);
  const Shape shape = acts.fc1.y.shape();
  Tensor h = Tensor::Empty(shape, kept16 ? DType::kBF16 : DType::kF32, x.device());
  Tensor kept_a = kept16 ? Rows2d(Tensor::Empty(shape, DType::kBF16, x.device())) : Tensor();
  Tensor kept_b;
  {
    Tensor a2 = Rows2d(acts.fc1.y), h2 = Rows2d(h);
    switch (options_.activation) {
      case Activation::kGelu:
        kernels::BiasGeluForward(a2, b1, h2, ctx, {.a = kept16 ? &kept_a : nullptr});
        break;
      case Activation::kRelu:
        kernels::ReluForward(acts.fc1.y, h, ctx);
        break;
      case Activation::kSwiglu:
        acts.fc3 = w3_->Forward(x_mm, ctx);  // b (..., f)
        if (kept16) kept_b = Rows2d(Tensor::Empty(shape, DType::kBF16, x.device()));
        kernels::BiasSwigluForward(a2, b1, Rows2d(acts.fc3.y), h2, ctx,
                                   {.a = kept16 ? &kept_a : nullptr,
                                    .b = kept16 ? &kept_b : nullptr});
        break;
    }
  }
  // The activation's backward reads a (and b): kept rounded to bf16 under bf16 storage, once
  // h has been computed from their f32 values.
  if (kept16) {
    acts.fc1.y = kept_a.Reshape(shape);
    if (kept_b.defined()) acts.fc3.y = kept_b.Reshape(shape);
  } else {
    acts.fc1.y = kernels::KeepRounded(acts.fc1.y, ctx);
    if (acts.fc3.y.defined()) acts.fc3.y = kernels::KeepRounded(acts.fc3.y, ctx);
  }
  acts.fc2 = w2_.Forward(h, ctx);  // keeps h as W2's operand
  acts.out = LeaveTensorParallel(options_.tp, acts.fc2.y, ctx);
  return acts;
}

Tensor Mlp::Backward(const MlpActivations& acts, const Tensor& dy_in, DeviceContext* ctx) {
  const Tensor dy = LeaveTensorParallelBackward(options_.tp, dy_in, ctx);
  Tensor dh = w2_.Backward(acts.fc2, dy, ctx);  // (..., f)
  Tensor db;
  const bool fuse = FusesBias();
  Tensor grad_b1 = fuse ? w1_.grad_bias() : Tensor();
  // The activation's pass writes da (and db) as W1's (W3's) products read them: bf16 in
  // bf16 mode (no conversion), but when W1's own backward sums its bias gradient from da
  // (relu's unfused bias); in f32 in place of dh.
  const bool grads16 = kernels::HiddenGradsInBf16(
      kernels::MatmulOperandDType(ctx) == DType::kBF16, !fuse && w1_.adds_bias());
  const DType grad_dtype = grads16 ? DType::kBF16 : DType::kF32;
  Tensor da = grads16 ? Tensor::Empty(dh.shape(), grad_dtype, dh.device()) : dh;
  // a and b as kept (bf16 under bf16 storage: the kernels read their rounded values as f32).
  const Tensor& a = acts.fc1.y;
  const Tensor& b = acts.fc3.y;
  Tensor a2 = Rows2d(a), dh2 = Rows2d(dh), da2 = Rows2d(da);
  switch (options_.activation) {
    case Activation::kGelu:
      if (fuse) {
        kernels::GeluBackwardBiasGrad(a2, dh2, da2, grad_b1, /*beta=*/1.0f, ctx);
      } else {
        kernels::GeluBackward(a, dh, da, ctx);
      }
      break;
    case Activation::kRelu:
      kernels::ReluBackward(a, dh, da, ctx);
      break;
    case Activation::kSwiglu:
      db = Tensor::Empty(dh.shape(), grad_dtype, dh.device());
      if (fuse) {
        Tensor db2 = Rows2d(db);
        kernels::SwigluBackwardBiasGrad(a2, Rows2d(b), dh2, da2, db2, grad_b1,
                                        /*beta=*/1.0f, ctx);
      } else {
        kernels::SwigluBackward(a, b, dh, da, db, ctx);
      }
      break;
  }
  dh = dh2 = Tensor();  // da holds it now, or replaced it
  Tensor dx = w1_.Backward(acts.fc1, da, ctx, /*bias_grad=*/!fuse);
  if (db.defined()) w3_->BackwardInto(acts.fc3, db, dx, 1.0f, ctx);
  return EnterTensorParallelBackward(options_.tp, dx, ctx);
}

void Mlp::ZeroGrad(DeviceContext* ctx) {
  w1_.ZeroGrad(ctx);
  w2_.ZeroGrad(ctx);
  if (w3_) w3_->ZeroGrad(ctx);
}

std::vector<Parameter> Mlp::Parameters() const {
  std::vector<Parameter> out;
  AppendPrefixed("w1", w1_.Parameters(), out);
  AppendPrefixed("w2", w2_.Parameters(), out);
  if (w3_) AppendPrefixed("w3", w3_->Parameters(), out);
  return out;
}

}  // namespace switchyard::dense
