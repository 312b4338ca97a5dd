// Normalisation over the last dimension (MODEL.md section 1, `norm`):
//   layernorm (Ba et al. 2016):  y = (x - mean) * rstd * weight + bias,
//                                mean = (1/d) sum x, rstd = 1 / sqrt((1/d) sum (x - mean)^2 + eps)
//   rmsnorm (Zhang & Sennrich 2019): y = x * rstd * weight, rstd = 1 / sqrt((1/d) sum x^2 + eps)
// The variance is the biased one (divide by d), as in PyTorch. Forward keeps mean and rstd
// per row for Backward; row statistics are accumulated in double.
//
// Shapes: x, y, dy, dx (N, d) — any tensor whose last dimension is d is read as N = numel / d
// rows; weight, bias (d); mean, rstd (N). All f32, contiguous, on one device, but a
// forward's y, which may be bf16: the f32 values rounded to nearest even as they are stored
// (the bits of an f32 y then kernels::Cast), for the products that read it as their operand
// under bf16 activation storage (a bf16 y is never x's memory). The public
// ops check the arguments (kernels/norm.cc) and run kernels/cpu/norm.cc (the reference) or
// kernels/cuda/norm.cu, which reduces each row in double as well and sums dweight / dbias
// over rows in a fixed order (deterministic, no atomics).
#pragma once

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "kernels/write.h"

namespace switchyard::kernels {

// y = layernorm(x) with weight and bias (bias may be an undefined tensor: no bias).
// Writes mean and rstd (N). y may be the same tensor as x.
void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& y, Tensor& mean, Tensor& rstd, DeviceContext* ctx = nullptr);

// With xhat = (x - mean) * rstd and g = dy * weight:
//   dx = rstd * (g - mean_j(g) - xhat * mean_j(g * xhat))       (written, or with Write::kAdd
//        added into dx: the residual stream's gradient)
//   dweight += sum over rows of dy * xhat, dbias += sum over rows of dy   (accumulated)
// dbias may be undefined (no bias). dx may be the same tensor as dy under Write::kSet, not
// under kAdd.
void LayerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight,
                       Tensor& dbias, DeviceContext* ctx = nullptr,
                       Write write = Write::kSet);

// y = rmsnorm(x) with weight; writes rstd (N). y may be the same tensor as x.
void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd,
                    DeviceContext* ctx = nullptr);

// With g = dy * weight:
//   dx = rstd * (g - x * rstd^2 * mean_j(g * x))      (written, or added: Write::kAdd)
//   dweight += sum over rows of dy * x * rstd          (accumulated)
// dx may be the same tensor as dy under Write::kSet, not under kAdd.
void RmsNormBackward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                     Tensor& dx, Tensor& dweight, DeviceContext* ctx = nullptr,
                     Write write = Write::kSet);

// ---- residual add + norm (a block's x + attention(...) then its next norm) -------------
// sum = x + r (written: the residual stream, which the block goes on with), then
// y = layernorm(sum) / rmsnorm(sum) with mean / rstd as above: one pass where the unfused
// sequence is kernels::Add then the norm. Bit-identical, on one device, to that sequence.
// sum may be x's memory (x += r in place); y must be neither x, r nor sum.
void AddLayerNormForward(const Tensor& x, const Tensor& r, const Tensor& weight,
                         const Tensor& bias, float eps, Tensor& sum, Tensor& y, Tensor& mean,
                         Tensor& rstd, DeviceContext* ctx = nullptr);
void AddRmsNormForward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                       Tensor& sum, Tensor& y, Tensor& rstd, DeviceContext* ctx = nullptr);

// The implementations behind the ops above, on checked arguments.
namespace cpu {
void AddLayerNormForward(const Tensor& x, const Tensor& r, const Tensor& weight,
                         const Tensor& bias, float eps, Tensor& sum, Tensor& y, Tensor& mean,
                         Tensor& rstd);
void AddRmsNormForward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                       Tensor& sum, Tensor& y, Tensor& rstd);
void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& y, Tensor& mean, Tensor& rstd);
void LayerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight,
                       Tensor& dbias, Write write);
void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd);
void RmsNormBackward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                     Tensor& dx, Tensor& dweight, Write write);
}  // namespace cpu

namespace cuda {
void AddLayerNormForward(const Tensor& x, const Tensor& r, const Tensor& weight,
                         const Tensor& bias, float eps, Tensor& sum, Tensor& y, Tensor& mean,
                         Tensor& rstd, DeviceContext* ctx);
void AddRmsNormForward(const Tensor& x, const Tensor& r, const Tensor& weight, float eps,
                       Tensor& sum, Tensor& y, Tensor& rstd, DeviceContext* ctx);
void LayerNormForward(const Tensor& x, const Tensor& weight, const Tensor& bias, float eps,
                      Tensor& y, Tensor& mean, Tensor& rstd, DeviceContext* ctx);
void LayerNormBackward(const Tensor& x, const Tensor& weight, const Tensor& mean,
                       const Tensor& rstd, const Tensor& dy, Tensor& dx, Tensor& dweight,
                       Tensor& dbias, Write write, DeviceContext* ctx);
void RmsNormForward(const Tensor& x, const Tensor& weight, float eps, Tensor& y, Tensor& rstd,
                    DeviceContext* ctx);
void RmsNormBackward(const Tensor& x, const Tensor& weight, const Tensor& rstd, const Tensor& dy,
                     Tensor& dx, Tensor& dweight, Write write, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
