// Row softmax in f32 (the attention probabilities and the router use it; MODEL.md section 1:
// softmax in fp32). For each row r of x (N, C):
//   y[r, j] = exp(x[r, j] - max_r) / sum_k exp(x[r, k] - max_r)
// and the backward pass of a row with output y and upstream gradient dy:
//   dx[r, j] = y[r, j] * (dy[r, j] - sum_k dy[r, k] y[r, k]).
// Any tensor whose last dimension is C is read as N = numel / C rows. The public ops check
// the arguments (kernels/softmax.cc) and run kernels/cpu/softmax.cc (the reference: sums in
// 16 f32 lanes, then in double) or kernels/cuda/softmax.cu (one block per row, sums in double).
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// y = softmax(x) over the last dimension; y may be the same tensor as x.
void SoftmaxForward(const Tensor& x, Tensor& y, DeviceContext* ctx = nullptr);
// dx from the forward output y and dy; dx may be the same tensor as dy.
void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx, DeviceContext* ctx = nullptr);

namespace cpu {
// The ops above on checked arguments.
void SoftmaxForward(const Tensor& x, Tensor& y);
void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx);
// One row of n >= 1 values: y = softmax(x), returns logsumexp(x) = max + log(sum exp(x - max))
// (sums in f32 lanes, then double). y may equal x.
float SoftmaxRow(const float* x, float* y, int64_t n);
// One row: dx = y * (dy - sum(dy * y)) (sum in f32 lanes, then double). dx may equal dy.
void SoftmaxRowBackward(const float* y, const float* dy, float* dx, int64_t n);
}  // namespace cpu

namespace cuda {
void SoftmaxForward(const Tensor& x, Tensor& y, DeviceContext* ctx);
void SoftmaxBackward(const Tensor& y, const Tensor& dy, Tensor& dx, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
