// Linear (dense/linear.h) through kernels::Gemm and the bias kernels of kernels/activation.h.
#include "dense/linear.h"

#include <utility>

#include "engine/core/philox.h"
#include "kernels/activation.h"
#include "kernels/gemm.h"
#include "kernels/random.h"

namespace switchyard::dense {
namespace {

// x (..., features) as (N, features).
Tensor Rows(const Tensor& x, int64_t features, const char* what) {
  SY_CHECK(x.ndim() >= 1 && x.dim(-1) == features)
      << what << " " << ShapeString(x.shape()) << ", expected (..., " << features << ")";
  return x.Reshape({x.numel() / features, features});
}

// `shape` with its last dimension replaced.
Shape WithLast(Shape shape, int64_t last) {
  shape.back() = last;
  return shape;
}

}  // namespace

Status LinearOptions::Validate() const {
  if (in <= 0) return InvalidArgument("linear.in=", in, " must be > 0");
  if (out <= 0) return InvalidArgument("linear.out=", out, " must be > 0");
  return OkStatus();
}

Linear::Linear(const LinearOptions& options, DeviceContext* ctx)
    : Linear(
          options,
          LinearParams{Tensor::Zeros({options.in, options.out}, DType::kF32, options.device, ctx),
                       options.bias ? Tensor::Zeros({options.out}, DType::kF32, options.device, ctx)
                                    : Tensor()},
          ctx) {}

Linear::Linear(const LinearOptions& options, LinearParams params, DeviceContext* ctx)
    : options_(options), weight_(std::move(params.weight)), bias_(std::move(params.bias)) {
  SY_CHECK_OK(options.Validate());
  grad_weight_ = Tensor::Zeros({options.in, options.out}, DType::kF32, options.device, ctx);
  if (options.bias) grad_bias_ = Tensor::Zeros({options.out}, DType::kF32, options.device, ctx);
}

Linear Linear::Init(const LinearOptions& options, uint64_t seed, const std::string& name, float std,
                    DeviceContext* ctx) {
  Linear linear(options, ctx);
  kernels::FillNormal(linear.weight_, RngKey{seed, StreamId(name + ".weight")}, 0, 0.0f, std, ctx);
  return linear;
}

StatusOr<Linear> Linear::FromTensors(const LinearOptions& options, LinearParams params,
                                     DeviceContext* ctx) {
  SY_RETURN_IF_ERROR(options.Validate());
  SY_RETURN_IF_ERROR(
      CheckParameter("linear.weight", params.weight, {options.in, options.out}, options.device));
  if (options.bias) {
    SY_RETURN_IF_ERROR(CheckParameter("linear.bias", params.bias, {options.out}, options.device));
  } else if (params.bias.defined()) {
    return InvalidArgument("linear.bias given but linear.bias=false");
  }
  return Linear(options, std::move(params), ctx);
}

LinearActivations Linear::Forward(const Tensor& x, DeviceContext* ctx) const {
  const Tensor x2 = Rows(x, options_.in, "Linear::Forward: x");
  LinearActivations acts;
  acts.x = x;
  acts.y = Tensor::Empty(WithLast(x.shape(), options_.out), DType::kF32, x.device());
  Tensor y2 = acts.y.Reshape({x2.dim(0), options_.out});  // (N, out)
  kernels::Gemm(x2, false, weight_, false, y2, 1.0f, 0.0f, ctx);
  if (options_.bias) kernels::AddBias(y2, bias_, ctx);
  return acts;
}

Tensor Linear::Backward(const LinearActivations& acts, const Tensor& dy, DeviceContext* ctx) {
  Tensor dx = Tensor::Empty(acts.x.shape(), DType::kF32, acts.x.device());
  BackwardInto(acts, dy, dx, 0.0f, ctx);
  return dx;
}

void Linear::BackwardInto(const LinearActivations& acts, const Tensor& dy, Tensor& dx, float beta,
                          DeviceContext* ctx) {
  const Tensor x2 = Rows(acts.x, options_.in, "Linear::Backward: x");
  const Tensor dy2 = Rows(dy, options_.out, "Linear::Backward: dy");
  SY_CHECK_EQ(dy2.dim(0), x2.dim(0)) << "Linear::Backward: dy " << ShapeString(dy.shape())
                                     << " for x " << ShapeString(acts.x.shape());
  SY_CHECK(dx.shape() == acts.x.shape()) << "Linear::Backward: dx " << ShapeString(dx.shape())
                                         << " for x " << ShapeString(acts.x.shape());
  // dW (in, out) += x^T dy; db += column sums of dy; dx = beta dx + dy W^T.
  kernels::Gemm(x2, true, dy2, false, grad_weight_, 1.0f, 1.0f, ctx);
  if (options_.bias) kernels::BiasGrad(dy2, grad_bias_, /*beta=*/1.0f, ctx);
  Tensor dx2 = dx.Reshape({x2.dim(0), options_.in});
  kernels::Gemm(dy2, false, weight_, true, dx2, 1.0f, beta, ctx);
}

void Linear::ZeroGrad(DeviceContext* ctx) {
  grad_weight_.SetZero(ctx);
  if (grad_bias_.defined()) grad_bias_.SetZero(ctx);
}

std::vector<NamedParameter> Linear::Parameters() const {
  std::vector<NamedParameter> out = {{"weight", weight_, grad_weight_}};
  if (bias_.defined()) out.push_back({"bias", bias_, grad_bias_});
  return out;
}

}  // namespace switchyard::dense
