// Optimizer kernels: fused per-tensor updates and the gradient-norm helpers of clipping.
//
// AdamW (Loshchilov & Hutter 2019, "Decoupled Weight Decay Regularization"), exactly as
// PyTorch's torch.optim.AdamW computes it, for step t = 1, 2, ... (t counts this update):
//   p <- p - lr * wd * p                               (decoupled decay, before the moments)
//   m <- beta1 * m + (1 - beta1) * g
//   v <- beta2 * v + (1 - beta2) * g^2
//   p <- p - lr * mhat / (sqrt(vhat) + eps),  mhat = m / (1 - beta1^t), vhat = v / (1 - beta2^t)
// (computed as p - (lr / (1 - beta1^t)) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps), the same
// rearrangement as PyTorch; the bias corrections are formed in double).
//
// SGD with momentum as torch.optim.SGD (dampening 0, no Nesterov); weight decay is the
// coupled L2 term PyTorch's SGD adds to the gradient:
//   d <- g + wd * p
//   b <- momentum * b + d          (b starts at 0, so the first step has b = d)
//   p <- p - lr * b                (momentum == 0: p <- p - lr * d, no buffer)
//
// Shapes: p, g, m, v, b are f32 tensors of one shape (any), contiguous. The CPU
// implementation is kernels/cpu/optimizer.cc; a CUDA tensor is a fatal check until the CUDA
// backend lands.
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// Hyper-parameters of one AdamW update.
struct AdamWStep {
  float lr = 0.0f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;  // 0 for parameters without decay
  int64_t step = 1;           // t >= 1: the number of this update (bias correction)
};

// One AdamW update of param with grad; exp_avg (m) and exp_avg_sq (v) are updated in place.
void AdamWUpdate(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                 const AdamWStep& hp, DeviceContext* ctx = nullptr);

// One SGD update. momentum_buf (b) is required when momentum != 0 and ignored (may be
// undefined) when momentum == 0.
void SgdUpdate(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr,
               float momentum, float weight_decay, DeviceContext* ctx = nullptr);

// sum_i t[i]^2, accumulated in double (f32 tensor). The result is on the host.
double SumSquares(const Tensor& t, DeviceContext* ctx = nullptr);

// t <- scale * t (f32 tensor), in place.
void ScaleInPlace(Tensor& t, float scale, DeviceContext* ctx = nullptr);

}  // namespace switchyard::kernels
