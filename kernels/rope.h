// Rotary position embeddings (Su et al. 2021, "RoFormer"), applied to q and k (MODEL.md
// section 1, position = rope), in the GPT-NeoX / Llama "rotate half" convention: within a
// head of hd (even) elements, element i is paired with element i + hd/2, for i < hd/2, and
// the pair is rotated by the angle pos * theta_i, theta_i = base^(-2i / hd):
//   y[i]        = x[i] cos(pos theta_i) - x[i + hd/2] sin(pos theta_i)
//   y[i + hd/2] = x[i + hd/2] cos(pos theta_i) + x[i] sin(pos theta_i)
// (HF transformers' rotate_half; NOT the interleaved (2i, 2i + 1) pairs of GPT-J / the
// original RoFormer.) The token at sequence index s has pos = position_offset + s. Angles,
// cos and sin are evaluated in double and rounded to f32.
//
// Shapes: x, y, dy, dx (B, S, H, hd), f32, contiguous. The public ops check the arguments
// (kernels/rope.cc) and run kernels/cpu/rope.cc (the reference) or kernels/cuda/rope.cu,
// which evaluates the same double-precision angles, so both round cos and sin alike (up to
// the last-ulp accuracy of each libm).
#pragma once

#include <cstdint>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// The default base (MODEL.md).
inline constexpr float kRopeBase = 10000.0f;

// y = rotate(x); y may be the same tensor as x.
void RopeForward(const Tensor& x, Tensor& y, float base = kRopeBase, int64_t position_offset = 0,
                 DeviceContext* ctx = nullptr);
// dx = rotate^T(dy), the rotation by the opposite angle; dx may be the same tensor as dy.
void RopeBackward(const Tensor& dy, Tensor& dx, float base = kRopeBase, int64_t position_offset = 0,
                  DeviceContext* ctx = nullptr);

// The implementations on checked arguments: y = x rotated by sign * angle (sign = +1 for
// the forward pass, -1 for the backward).
namespace cpu {
void RopeRotate(const Tensor& x, Tensor& y, float base, int64_t position_offset, float sign);
}  // namespace cpu

namespace cuda {
void RopeRotate(const Tensor& x, Tensor& y, float base, int64_t position_offset, float sign,
                DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
