// Random fills from the counter-based Philox generator (engine/core/philox.h). Element i
// of `out` receives the value for global index first_index + i, so filling a tensor whole
// or in chunks (or a shard of it at its global offset) gives identical values, on the CPU
// and on CUDA.
#pragma once

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// out[i] = lo + (hi - lo) * UniformAt(key, first_index + i). out: f32 or bf16.
void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi,
                 DeviceContext* ctx = nullptr);

// out[i] = mean + std * NormalAt(key, first_index + i). out: f32 or bf16.
void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std,
                DeviceContext* ctx = nullptr);

// out[i] = RandomBitsAt(key, first_index + i). out: i32 (bit pattern) — for tests and
// for drawing integers.
void FillRandomBits(Tensor& out, RngKey key, int64_t first_index, DeviceContext* ctx = nullptr);

namespace cpu {
void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi);
void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std);
void FillRandomBits(Tensor& out, RngKey key, int64_t first_index);
}  // namespace cpu

namespace cuda {
void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi,
                 DeviceContext* ctx);
void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std,
                DeviceContext* ctx);
void FillRandomBits(Tensor& out, RngKey key, int64_t first_index, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
