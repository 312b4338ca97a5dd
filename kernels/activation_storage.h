// What a layer keeps of its forward for its backward, in the element type the context asks
// for (DeviceContext::activation_dtype, runtime.activation_dtype; MODEL.md "Activation
// storage"). Under bf16 storage:
//  - a product's input, kept only for the weight gradient's product, is kept as the bf16
//    operand the forward product itself read (KeptOperand): one conversion serves both
//    products, and the backward product sees the values it would have rounded to anyway, so
//    the weight gradients are the same bits as under f32 storage;
//  - a tensor kept for an elementwise backward (an MLP's pre-activations) is kept rounded to
//    bf16 (KeepRounded, round to nearest even as engine/core/dtype.h) after the forward has
//    used the f32 values, and its backward reads it back as f32 (KeptAsF32): the backward
//    of f32 storage run on the rounded values, bit for bit, on the CPU as on the GPU.
// Under f32 storage (the default, and a null context) each returns its input unchanged.
#pragma once

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// Whether ctx keeps activations in bf16.
inline bool StoresBf16(const DeviceContext* ctx) {
  return ctx != nullptr && ctx->activation_dtype() == DType::kBF16;
}

// What a layer keeps of a product's input x for backward.
//   kOperand: under bf16 storage the bf16 operand the products read (MatmulOperand: one
//             conversion; x itself when it is bf16 already), else x;
//   kAsGiven: x as given, whatever the storage (an input another backward reads in f32,
//             or one its producer keeps anyway).
enum class KeepInput { kOperand, kAsGiven };

// x, or under bf16 storage with kOperand its bf16 operand (kernels::MatmulOperand). Pass the
// result to the forward's products and keep it.
Tensor KeptOperand(const Tensor& x, DeviceContext* ctx, KeepInput keep = KeepInput::kOperand);

// t (f32), or under bf16 storage a bf16 copy of it rounded to nearest even (one conversion).
Tensor KeepRounded(const Tensor& t, DeviceContext* ctx);

// A kept tensor as f32 for a backward kernel: t itself when f32, else a new f32 tensor of
// its values (exact; one conversion).
Tensor KeptAsF32(const Tensor& t, DeviceContext* ctx);

}  // namespace switchyard::kernels
