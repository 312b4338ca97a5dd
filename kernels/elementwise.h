// Elementwise arithmetic on whole tensors: sums, products, fills and dtype casts, the glue
// between the larger kernels (residual adds, the router's noise gradient, zeroing
// accumulators, rounding f32 weights to bf16 copies).
//
// Tensors are contiguous and live on one device; each op checks that every tensor is on
// the device of its output. Unless an op says otherwise, every tensor is f32 and all have
// one shape. Each element is read before it is written, so an output may be the very same
// tensor as an input (same elements); a partial overlap (an output that is a shifted view
// of an input) is not supported. Results are exact IEEE f32 operations, rounded to nearest
// once per operation (no fused multiply-add), so the CPU and CUDA agree bit for bit.
#pragma once

#include <span>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// out = a + b.
void Add(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx = nullptr);

// y += alpha * x (the product rounded, then the sum).
void Axpy(float alpha, const Tensor& x, Tensor& y, DeviceContext* ctx = nullptr);

// out = a * b.
void Mul(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx = nullptr);

// y += a * b (the product rounded, then the sum), e.g. the router's dh += dx * noise.
void MulAdd(const Tensor& a, const Tensor& b, Tensor& y, DeviceContext* ctx = nullptr);

// t[i] = value. t: f32, or bf16 (value rounded to nearest even).
void Fill(Tensor& t, float value, DeviceContext* ctx = nullptr);

// Every tensor's bytes set to 0 (any dtype, any size; all on one device) in one dispatch:
// on CUDA one launch for every kZeroManyBatch tensors (their addresses and sizes passed by
// value), where Tensor::SetZero is a memset each. The step's gradient zeroing
// (parallel::ParameterRegistry::ZeroGrad: dozens of tensors a step).
void ZeroMany(std::span<Tensor> tensors, DeviceContext* ctx = nullptr);

// dst = src converted elementwise; src and dst have the same number of elements (shapes
// may differ). f32 -> bf16 rounds to nearest even (NaN stays NaN) exactly as BFloat16 in
// engine/core/dtype.h; bf16 -> f32 is exact; equal dtypes (any dtype) copy.
void Cast(const Tensor& src, Tensor& dst, DeviceContext* ctx = nullptr);

namespace cpu {
void Add(const Tensor& a, const Tensor& b, Tensor& out);
void Axpy(float alpha, const Tensor& x, Tensor& y);
void Mul(const Tensor& a, const Tensor& b, Tensor& out);
void MulAdd(const Tensor& a, const Tensor& b, Tensor& y);
void Fill(Tensor& t, float value);
void ZeroMany(std::span<Tensor> tensors);
void Cast(const Tensor& src, Tensor& dst);
}  // namespace cpu

namespace cuda {
void Add(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx);
void Axpy(float alpha, const Tensor& x, Tensor& y, DeviceContext* ctx);
void Mul(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx);
void MulAdd(const Tensor& a, const Tensor& b, Tensor& y, DeviceContext* ctx);
void Fill(Tensor& t, float value, DeviceContext* ctx);
void ZeroMany(std::span<Tensor> tensors, DeviceContext* ctx);
void Cast(const Tensor& src, Tensor& dst, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
