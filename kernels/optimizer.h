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
// Shapes: p, g, m, v, b are f32 tensors of one shape (any), contiguous, on one device. The
// CPU reference is kernels/cpu/optimizer.cc, the CUDA implementation
// kernels/cuda/optimizer.cu. Both evaluate each element's update with the same f32
// operations in the same order (no fused multiply-add) from the same host-formed scalars
// (AdamWScalarsOf), so the CUDA updates equal the CPU's bit for bit.
//
// The *Many variants apply one op to a list of tensors (the trainer's whole parameter set):
// on CUDA a "multi-tensor apply" — the tensors are cut into chunks, one table of chunk
// descriptors is copied to the device, and one kernel launch covers every chunk — with the
// same per-element results as the single-tensor ops. The tensors of one list live on one
// device, and those a call writes must not share memory with one another.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

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
  // Every gradient element is multiplied by this (in f32) before it is used: the global-norm
  // clip's factor (engine/parallel/clip.h) applied inside the update instead of a pass over
  // the gradients of its own. The same bits as scaling the gradients first; 1 leaves them.
  float grad_scale = 1.0f;
};

// One AdamW update of param with grad; exp_avg (m) and exp_avg_sq (v) are updated in place.
void AdamWUpdate(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                 const AdamWStep& hp, DeviceContext* ctx = nullptr);

// One parameter of AdamWUpdateMany: the four tensors of AdamWUpdate and its weight decay;
// and optionally its bf16 weight shadow (engine/core/weight_shadows.h), a bf16 tensor of
// param's shape on its device that gets the new values rounded to nearest even in the same
// pass: the bits kernels::Cast of the updated param gives (counted as a weight conversion).
struct AdamWTensors {
  Tensor param, grad, exp_avg, exp_avg_sq;
  float weight_decay = 0.0f;
  Tensor shadow;  // undefined: none
};

// AdamWUpdate on every entry, with hp except that each entry's own weight_decay replaces
// hp.weight_decay (ignored). Equal, element for element, to calling AdamWUpdate per entry.
void AdamWUpdateMany(std::span<AdamWTensors> tensors, const AdamWStep& hp,
                     DeviceContext* ctx = nullptr);

// The scalars of one AdamW update, formed in double on the host and rounded to f32 once:
// p <- p * decay - step_size * m / (sqrt(v) / bc2_sqrt + eps), with
// decay = 1 - lr * weight_decay, step_size = lr / (1 - beta1^t), bc2_sqrt = sqrt(1 - beta2^t).
// Shared by the CPU and CUDA implementations so both round identically.
struct AdamWScalars {
  float decay = 1.0f;
  float step_size = 0.0f;
  float bc2_sqrt = 1.0f;
};
AdamWScalars AdamWScalarsOf(const AdamWStep& hp, float weight_decay);

// One SGD update. momentum_buf (b) is required when momentum != 0 and ignored (may be
// undefined) when momentum == 0.
void SgdUpdate(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum,
               float weight_decay, DeviceContext* ctx = nullptr);

// sum_i t[i]^2, accumulated in double (f32 tensor). The result is on the host (on CUDA the
// call waits for the stream). The CUDA sum adds in another order than the CPU's sequential
// one, so the two agree to double rounding (about 1e-16 n relative), not bit for bit; each
// is deterministic.
double SumSquares(const Tensor& t, DeviceContext* ctx = nullptr);

// SumSquares of every tensor, in order, on the host (on CUDA: one launch and one copy back).
std::vector<double> SumSquaresMany(std::span<const Tensor> tensors, DeviceContext* ctx = nullptr);

// SumSquaresMany left on the device, for the training step's single readback
// (engine/core/step_readback.h). SumSquaresPartition gives first (n + 1) for the n tensors
// on `device`; SumSquaresPartials writes partials (first[n]) f64 on that device, and
// 0.0 + partials[first[k]] + ... + partials[first[k + 1] - 1], added on the host in that
// order, is SumSquaresMany's value for tensor k, bit for bit. Nothing is read back.
std::vector<int64_t> SumSquaresPartition(std::span<const Tensor> tensors, Device device);
void SumSquaresPartials(std::span<const Tensor> tensors, Tensor& partials,
                        DeviceContext* ctx = nullptr);

// t <- scale * t (f32 tensor), in place.
void ScaleInPlace(Tensor& t, float scale, DeviceContext* ctx = nullptr);

// ScaleInPlace on every tensor.
void ScaleMany(std::span<Tensor> tensors, float scale, DeviceContext* ctx = nullptr);

namespace cpu {
void AdamWUpdate(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                 const AdamWStep& hp);
void AdamWUpdateMany(std::span<AdamWTensors> tensors, const AdamWStep& hp);
void SgdUpdate(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum,
               float weight_decay);
double SumSquares(const Tensor& t);
std::vector<double> SumSquaresMany(std::span<const Tensor> tensors);
void ScaleInPlace(Tensor& t, float scale);
void ScaleMany(std::span<Tensor> tensors, float scale);
}  // namespace cpu

namespace cuda {
void AdamWUpdate(Tensor& param, const Tensor& grad, Tensor& exp_avg, Tensor& exp_avg_sq,
                 const AdamWStep& hp, DeviceContext* ctx);
void AdamWUpdateMany(std::span<AdamWTensors> tensors, const AdamWStep& hp, DeviceContext* ctx);
void SgdUpdate(Tensor& param, const Tensor& grad, Tensor& momentum_buf, float lr, float momentum,
               float weight_decay, DeviceContext* ctx);
double SumSquares(const Tensor& t, DeviceContext* ctx);
std::vector<double> SumSquaresMany(std::span<const Tensor> tensors, DeviceContext* ctx);
std::vector<int64_t> SumSquaresPartition(std::span<const Tensor> tensors);
void SumSquaresPartials(std::span<const Tensor> tensors, Tensor& partials, DeviceContext* ctx);
void ScaleInPlace(Tensor& t, float scale, DeviceContext* ctx);
void ScaleMany(std::span<Tensor> tensors, float scale, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
