// Random fills from the counter-based Philox generator (engine/core/philox.h). Element i
// of `out` receives the value for global index first_index + i, so filling a tensor whole
// or in chunks (or a shard of it at its global offset) gives identical values, on the CPU
// and on CUDA.
#pragma once

#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "engine/core/tensor.h"
#include "kernels/write.h"

namespace switchyard::kernels {

// out[i] = lo + (hi - lo) * UniformAt(key, first_index + i). out: f32 or bf16.
void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi,
                 DeviceContext* ctx = nullptr);

// A draw whose key stream and first token are read from device memory when it runs
// (runtime.cuda_graphs: a replay of captured work then draws the step's numbers, not the
// capture's). values: (2) i64 on the output's device, {stream, first_token}; the draw's key
// is RngKey{seed, stream} and element i draws at (first_token + token_offset) * per_token + i.
struct DeviceRng {
  uint64_t seed = 0;
  Tensor values = Tensor();
  int64_t token_offset = 0;
  int64_t per_token = 1;
};
// FillUniform at a DeviceRng: the same numbers as FillUniform with that key and first index.
void FillUniform(Tensor& out, const DeviceRng& at, float lo, float hi,
                 DeviceContext* ctx = nullptr);
// MulUniform at a DeviceRng: the same bits as MulUniform with that key and first index.
void MulUniform(const Tensor& x, Tensor& out, const DeviceRng& at, float lo, float hi,
                Write write, DeviceContext* ctx = nullptr);

// out[i] = mean + std * NormalAt(key, first_index + i). out: f32 or bf16.
void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std,
                DeviceContext* ctx = nullptr);

// x times uniform noise that is drawn where it is used and never stored (the router's
// jitter, moe/router.h, draws it in its forward and again in its backward): with
// u_i = lo + (hi - lo) * UniformAt(key, first_index + i), FillUniform's value,
//   Write::kSet: out[i] = x[i] * u_i    (the bits of FillUniform, then Mul)
//   Write::kAdd: out[i] += x[i] * u_i   (the bits of FillUniform, then MulAdd)
// x, out: f32, as many elements.
void MulUniform(const Tensor& x, Tensor& out, RngKey key, int64_t first_index, float lo,
                float hi, Write write, DeviceContext* ctx = nullptr);

// out[i] = RandomBitsAt(key, first_index + i). out: i32 (bit pattern) — for tests and
// for drawing integers.
void FillRandomBits(Tensor& out, RngKey key, int64_t first_index, DeviceContext* ctx = nullptr);

namespace cpu {
void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi);
void MulUniform(const Tensor& x, Tensor& out, RngKey key, int64_t first_index, float lo,
                float hi, Write write);
void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std);
void FillRandomBits(Tensor& out, RngKey key, int64_t first_index);
}  // namespace cpu

namespace cuda {
void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi,
                 DeviceContext* ctx);
void FillUniform(Tensor& out, const DeviceRng& at, float lo, float hi, DeviceContext* ctx);
void MulUniform(const Tensor& x, Tensor& out, RngKey key, int64_t first_index, float lo,
                float hi, Write write, DeviceContext* ctx);
void MulUniform(const Tensor& x, Tensor& out, const DeviceRng& at, float lo, float hi,
                Write write, DeviceContext* ctx);
void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std,
                DeviceContext* ctx);
void FillRandomBits(Tensor& out, RngKey key, int64_t first_index, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
