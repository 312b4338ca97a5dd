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
  if (tp_size < 1 || tp_rank < 0 || tp_rank >= tp_size) {
    return InvalidArgument("linear: tensor-parallel rank ", tp_rank, " of ", tp_size);
  }
  if (split == LinearSplit::kColumn && out % tp_size != 0) {
    return InvalidArgument("linear.out=", out, " is not divisible by tp=", tp_size);
  }
  if (split == LinearSplit::kRow && in % tp_size != 0) {
    return InvalidArgument("linear.in=", in, " is not divisible by tp=", tp_size);
  }
  return OkStatus();
}

Linear::Linear(const LinearOptions& options, DeviceContext* ctx)
    : Linear(
          options,
          LinearParams{Tensor::Zeros({options.local_in(), options.local_out()}, DType::kF32,
                                     options.device, ctx),
                       options.bias ? Tensor::Zeros({options.local_out()}, DType::kF32,
                                                    options.device, ctx)
                                    : Tensor()},
          ctx) {}

Linear::Linear(const LinearOptions& options, LinearParams params, DeviceContext* ctx)
    : options_(options), weight_(std::move(params.weight)), bias_(std::move(params.bias)) {
  SY_CHECK_OK(options.Validate());
  grad_weight_ = Tensor::Zeros({options.local_in(), options.local_out()}, DType::kF32,
                               options.device, ctx);
  if (options.bias) {
    grad_bias_ = Tensor::Zeros({options.local_out()}, DType::kF32, options.device, ctx);
  }
}

Linear Linear::Init(const LinearOptions& options, uint64_t seed, const std::string& name, float std,
                    DeviceContext* ctx) {
  Linear linear(options, ctx);
  Parameter weight = linear.Parameters()[0];
  parallel::InitNormal(weight, seed, std, ctx, name + ".weight");
  return linear;
}

StatusOr<Linear> Linear::FromTensors(const LinearOptions& options, LinearParams params,
                                     DeviceContext* ctx) {
  SY_RETURN_IF_ERROR(options.Validate());
  SY_RETURN_IF_ERROR(
      CheckParameter("linear.weight", params.weight, {options.local_in(), options.local_out()},
                     options.device));
  if (options.bias) {
    SY_RETURN_IF_ERROR(
        CheckParameter("linear.bias", params.bias, {options.local_out()}, options.device));
  } else if (params.bias.defined()) {
    return InvalidArgument("linear.bias given but linear.bias=false");
  }
  return Linear(options, std::move(params), ctx);
}

LinearActivations Linear::Forward(const Tensor& x, DeviceContext* ctx, bool add_bias,
                                  kernels::KeepInput keep, DType y_dtype) const {
  const int64_t in = options_.local_in(), out = options_.local_out();
  LinearActivations acts;
  acts.x = kernels::KeptOperand(x, ctx, keep);  // what the product reads and Backward keeps
  const Tensor x2 = Rows(acts.x, in, "Linear::Forward: x");
  acts.y = Tensor::Empty(WithLast(x.shape(), out), y_dtype, x.device());
  Tensor y2 = acts.y.Reshape({x2.dim(0), out});  // (N, out)
  if (add_bias && adds_bias()) {
    kernels::GemmBias(x2, false, weight_, false, bias_, y2, ctx);  // the bias in the product's pass
  } else {
    kernels::Gemm(x2, false, weight_, false, y2, 1.0f, 0.0f, ctx);
  }
  return acts;
}

Tensor Linear::Backward(const LinearActivations& acts, const Tensor& dy, DeviceContext* ctx,
                        bool bias_grad) {
  Tensor dx = Tensor::Empty(acts.x.shape(), DType::kF32, acts.x.device());
  BackwardInto(acts, dy, dx, 0.0f, ctx, bias_grad);
  return dx;
}

void Linear::BackwardInto(const LinearActivations& acts, const Tensor& dy, Tensor& dx, float beta,
                          DeviceContext* ctx, bool bias_grad) {
  const int64_t in = options_.local_in(), out = options_.local_out();
  const Tensor x2 = Rows(acts.x, in, "Linear::Backward: x");
  const Tensor dy2 = Rows(dy, out, "Linear::Backward: dy");
  SY_CHECK_EQ(dy2.dim(0), x2.dim(0)) << "Linear::Backward: dy " << ShapeString(dy.shape())
                                     << " for x " << ShapeString(acts.x.shape());
  SY_CHECK(dx.shape() == acts.x.shape()) << "Linear::Backward: dx " << ShapeString(dx.shape())
                                         << " for x " << ShapeString(acts.x.shape());
  // dW (in, out) += x^T dy; db += column sums of dy; dx = beta dx + dy W^T. Both products
  // read dy: in bf16 mode it is converted once for the two, in the bias gradient's pass over
  // dy where there is one (the same bits as BiasGrad then the conversion).
  const Tensor dy_mm = bias_grad && adds_bias()
                           ? kernels::MatmulOperandWithBiasGrad(dy2, grad_bias_, /*beta=*/1.0f, ctx)
                           : kernels::MatmulOperand(dy2, ctx);
  kernels::Gemm(x2, true, dy_mm, false, grad_weight_, 1.0f, 1.0f, ctx);
  Tensor dx2 = dx.Reshape({x2.dim(0), in});
  kernels::Gemm(dy_mm, false, weight_, true, dx2, 1.0f, beta, ctx);
}

void Linear::ZeroGrad(DeviceContext* ctx) {
  grad_weight_.SetZero(ctx);
  if (grad_bias_.defined()) grad_bias_.SetZero(ctx);
}

bool Linear::adds_bias() const {
  return options_.bias && (options_.split != LinearSplit::kRow || options_.tp_rank == 0);
}

std::vector<Parameter> Linear::Parameters() const {
  const LinearOptions& o = options_;
  Parameter w = Parameter::Dense("weight", weight_, grad_weight_, /*weight_decay=*/true);
  if (o.split == LinearSplit::kColumn) w.Split(1, o.tp_rank * o.local_out(), o.out);
  if (o.split == LinearSplit::kRow) w.Split(0, o.tp_rank * o.local_in(), o.in);
  std::vector<Parameter> out = {std::move(w)};
  if (bias_.defined()) {
    Parameter b = Parameter::Dense("bias", bias_, grad_bias_, /*weight_decay=*/false);
    if (o.split == LinearSplit::kColumn) b.Split(0, o.tp_rank * o.local_out(), o.out);
    if (o.split == LinearSplit::kRow) b.ReplicatedOver(dist::Axis::kTp, /*grad_summed=*/true);
    out.push_back(std::move(b));
  }
  return out;
}

}  // namespace switchyard::dense
