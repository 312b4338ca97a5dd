// The language-model loss (MODEL.md section 1): for logits (N, V) and targets (N),
//   loss = mean over counted rows r of -log softmax(logits[r, :])[targets[r]]
//        = mean over counted rows of (logsumexp(logits[r, :]) - logits[r, targets[r]]),
// where a row whose target equals ignore_index (default -1: a masked position) is not
// counted. Fused with the gradient: dlogits[r, :] = grad_scale * (softmax(logits[r, :]) -
// onehot(targets[r])) for counted rows and 0 for ignored ones. The softmax is f32 and the
// loss is accumulated in double.
//
// MODEL.md's mean is over every target of the GLOBAL batch, so the kernels return the sum and
// the count; the caller divides by the global count and passes grad_scale = 1 / that count
// (CrossEntropyMean is the one-batch shortcut).
//
// Shapes: logits, dlogits (N, V) f32 — or any (..., V); targets (N) i32 — any shape with N
// elements. A target outside [0, V) other than ignore_index is a fatal check. The public ops
// check the arguments (kernels/cross_entropy.cc) and run kernels/cpu/cross_entropy.cc (the
// reference) or kernels/cuda/cross_entropy.cu: one block per row, per-row losses summed on
// the device in double in a fixed order, then one device->host copy of (loss_sum, count,
// first bad row), which synchronises the stream — the ops return host values.
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// The default ignore index: targets equal to it are masked out of the loss.
inline constexpr int32_t kIgnoreIndex = -1;

// What one call adds to the loss: the sum over counted rows and how many there were.
struct CrossEntropySums {
  double loss_sum = 0.0;
  int64_t count = 0;
  // loss_sum / count, 0 when nothing was counted.
  double Mean() const { return count > 0 ? loss_sum / static_cast<double>(count) : 0.0; }
};

// Number of targets != ignore_index (on CUDA: a device count, then one synchronising copy).
int64_t CountTargets(const Tensor& targets, int32_t ignore_index = kIgnoreIndex,
                     DeviceContext* ctx = nullptr);

// The loss sums without a gradient.
CrossEntropySums CrossEntropyForward(const Tensor& logits, const Tensor& targets,
                                     int32_t ignore_index = kIgnoreIndex,
                                     DeviceContext* ctx = nullptr);

// The loss sums, and dlogits = grad_scale * d(loss_sum)/d(logits) (written, not accumulated).
// dlogits may be the same tensor as logits (the logits are then overwritten).
CrossEntropySums CrossEntropyForwardBackward(const Tensor& logits, const Tensor& targets,
                                             Tensor& dlogits, double grad_scale,
                                             int32_t ignore_index = kIgnoreIndex,
                                             DeviceContext* ctx = nullptr);

// CrossEntropyForwardBackward with its sums left on the device, for the training step's
// single readback (engine/core/step_readback.h): sums (2) f64 on dlogits' device gets
// {loss_sum, count} (the values CrossEntropyForwardBackward returns); nothing is read back.
// On CUDA a bad target is not reported here (the trainer checks the targets on the host
// where the batch comes from, engine/train/runtime.h); the CPU still checks them.
void CrossEntropyForwardBackwardInto(const Tensor& logits, const Tensor& targets,
                                     Tensor& dlogits, double grad_scale, int32_t ignore_index,
                                     Tensor& sums, DeviceContext* ctx = nullptr);

// The mean over this batch's counted targets, with dlogits its gradient (grad_scale =
// 1 / count). All targets ignored: returns 0 and dlogits = 0.
double CrossEntropyMean(const Tensor& logits, const Tensor& targets, Tensor& dlogits,
                        int32_t ignore_index = kIgnoreIndex, DeviceContext* ctx = nullptr);

// The implementations on checked shapes (the targets are checked against V here); dlogits
// null: no gradient. `op` names the public op in the message about a bad target.
namespace cpu {
int64_t CountTargets(const Tensor& targets, int32_t ignore_index);
CrossEntropySums CrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits,
                              double grad_scale, int32_t ignore_index, const char* op);
}  // namespace cpu

namespace cuda {
int64_t CountTargets(const Tensor& targets, int32_t ignore_index, DeviceContext* ctx);
CrossEntropySums CrossEntropy(const Tensor& logits, const Tensor& targets, Tensor* dlogits,
                              double grad_scale, int32_t ignore_index, const char* op,
                              DeviceContext* ctx);
// CrossEntropy with dlogits, the sums written to sums (2) f64 on the device, no copy back.
void CrossEntropyInto(const Tensor& logits, const Tensor& targets, Tensor& dlogits,
                      double grad_scale, int32_t ignore_index, Tensor& sums, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
