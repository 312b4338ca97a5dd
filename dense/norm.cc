// Norm (dense/norm.h) over kernels/norm.h.
#include "dense/norm.h"

#include <utility>

#include "kernels/norm.h"

namespace switchyard::dense {
namespace {

bool IsLayerNorm(const NormOptions& o) { return o.kind == NormKind::kLayerNorm; }

}  // namespace

StatusOr<NormKind> ParseNormKind(const std::string& name) {
  if (name == "layernorm") return NormKind::kLayerNorm;
  if (name == "rmsnorm") return NormKind::kRmsNorm;
  return InvalidArgument("norm=\"", name, "\" is not one of layernorm, rmsnorm");
}

const char* NormKindName(NormKind kind) {
  return kind == NormKind::kLayerNorm ? "layernorm" : "rmsnorm";
}

Status NormOptions::Validate() const {
  if (dim <= 0) return InvalidArgument("norm.dim=", dim, " must be > 0");
  if (!(eps > 0.0f)) return InvalidArgument("norm.eps=", eps, " must be > 0");
  return OkStatus();
}

Norm::Norm(const NormOptions& options, DeviceContext* ctx)
    : Norm(options,
           NormParams{Filled({options.dim}, 1.0f, options.device, ctx),
                      IsLayerNorm(options)
                          ? Tensor::Zeros({options.dim}, DType::kF32, options.device, ctx)
                          : Tensor()},
           ctx) {}

Norm::Norm(const NormOptions& options, NormParams params, DeviceContext* ctx)
    : options_(options), weight_(std::move(params.weight)), bias_(std::move(params.bias)) {
  SY_CHECK_OK(options.Validate());
  grad_weight_ = Tensor::Zeros({options.dim}, DType::kF32, options.device, ctx);
  if (IsLayerNorm(options))
    grad_bias_ = Tensor::Zeros({options.dim}, DType::kF32, options.device, ctx);
}

StatusOr<Norm> Norm::FromTensors(const NormOptions& options, NormParams params,
                                 DeviceContext* ctx) {
  SY_RETURN_IF_ERROR(options.Validate());
  SY_RETURN_IF_ERROR(CheckParameter("norm.weight", params.weight, {options.dim}, options.device));
  if (IsLayerNorm(options)) {
    SY_RETURN_IF_ERROR(CheckParameter("norm.bias", params.bias, {options.dim}, options.device));
  } else if (params.bias.defined()) {
    return InvalidArgument("norm.bias given but rmsnorm has no bias");
  }
  return Norm(options, std::move(params), ctx);
}

NormActivations Norm::Forward(const Tensor& x, DeviceContext* ctx, DType y_dtype) const {
  SY_CHECK(x.ndim() >= 1 && x.dim(-1) == options_.dim)
      << "Norm::Forward: x " << ShapeString(x.shape()) << " for dim=" << options_.dim;
  const int64_t n = x.numel() / options_.dim;
  NormActivations acts;
  acts.x = x;
  acts.y = Tensor::Empty(x.shape(), y_dtype, x.device());
  acts.rstd = Tensor::Empty({n}, DType::kF32, x.device());
  if (IsLayerNorm(options_)) {
    acts.mean = Tensor::Empty({n}, DType::kF32, x.device());
    kernels::LayerNormForward(x, weight_, bias_, options_.eps, acts.y, acts.mean, acts.rstd, ctx);
  } else {
    kernels::RmsNormForward(x, weight_, options_.eps, acts.y, acts.rstd, ctx);
  }
  return acts;
}

NormActivations Norm::AddForward(const Tensor& x, const Tensor& r, DeviceContext* ctx,
                                 DType y_dtype) const {
  SY_CHECK(x.ndim() >= 1 && x.dim(-1) == options_.dim && r.numel() == x.numel())
      << "Norm::AddForward: x " << ShapeString(x.shape()) << ", r " << ShapeString(r.shape())
      << " for dim=" << options_.dim;
  const int64_t n = x.numel() / options_.dim;
  const Tensor r_as_x = r.Reshape(x.shape());
  NormActivations acts;
  acts.x = Tensor::Empty(x.shape(), DType::kF32, x.device());
  acts.y = Tensor::Empty(x.shape(), y_dtype, x.device());
  acts.rstd = Tensor::Empty({n}, DType::kF32, x.device());
  if (IsLayerNorm(options_)) {
    acts.mean = Tensor::Empty({n}, DType::kF32, x.device());
    kernels::AddLayerNormForward(x, r_as_x, weight_, bias_, options_.eps, acts.x, acts.y,
                                 acts.mean, acts.rstd, ctx);
  } else {
    kernels::AddRmsNormForward(x, r_as_x, weight_, options_.eps, acts.x, acts.y, acts.rstd, ctx);
  }
  return acts;
}

Tensor Norm::Backward(const NormActivations& acts, const Tensor& dy, DeviceContext* ctx) {
  Tensor dx = Tensor::Empty(acts.x.shape(), DType::kF32, acts.x.device());
  RunBackward(acts, dy, dx, kernels::Write::kSet, ctx);
  return dx;
}

void Norm::BackwardInto(const NormActivations& acts, const Tensor& dy, Tensor& into,
                        DeviceContext* ctx) {
  SY_CHECK_EQ(into.numel(), acts.x.numel()) << "Norm::BackwardInto: " << ShapeString(into.shape())
                                            << " for x " << ShapeString(acts.x.shape());
  Tensor dx = into.Reshape(acts.x.shape());
  RunBackward(acts, dy, dx, kernels::Write::kAdd, ctx);
}

void Norm::RunBackward(const NormActivations& acts, const Tensor& dy, Tensor& dx,
                       kernels::Write write, DeviceContext* ctx) {
  if (IsLayerNorm(options_)) {
    kernels::LayerNormBackward(acts.x, weight_, acts.mean, acts.rstd, dy, dx, grad_weight_,
                               grad_bias_, ctx, write);
  } else {
    kernels::RmsNormBackward(acts.x, weight_, acts.rstd, dy, dx, grad_weight_, ctx, write);
  }
}

void Norm::ZeroGrad(DeviceContext* ctx) {
  grad_weight_.SetZero(ctx);
  if (grad_bias_.defined()) grad_bias_.SetZero(ctx);
}

std::vector<Parameter> Norm::Parameters() const {
  std::vector<Parameter> out = {Parameter::Dense("weight", weight_, grad_weight_, false)};
  if (bias_.defined()) out.push_back(Parameter::Dense("bias", bias_, grad_bias_, false));
  return out;
}

}  // namespace switchyard::dense
