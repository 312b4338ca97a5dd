// CUDA random fills (kernels/random.h): Philox at each element's global index, as the CPU;
// uniform fills are the CPU's bits (the scaling rounded step by step, never a fused
// multiply-add, which nvcc would otherwise form), normal fills differ through the device's
// log and cos.
#include <cuda_bf16.h>

#include "kernels/cuda/common.cuh"
#include "kernels/random.h"

namespace switchyard::kernels::cuda {
namespace {

enum class Dist { kUniform, kNormal };

// at (kernels::DeviceRng's values), when not null: the key's stream and the first index are
// read here, {stream, first_token} -> (first_token + token_offset) * per_token.
template <typename T, Dist D>
__global__ void FillKernel(T* out, int64_t n, RngKey key, int64_t first, float a, float b,
                           const int64_t* at = nullptr, int64_t token_offset = 0,
                           int64_t per_token = 1) {
  if (at != nullptr) {
    key.stream = static_cast<uint64_t>(at[0]);
    first = (at[1] + token_offset) * per_token;
  }
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    uint64_t g = static_cast<uint64_t>(first + i);
    // Rounded as the CPU's lo + (hi - lo) u and mean + std z (no fused multiply-add).
    float v = D == Dist::kUniform
                  ? __fadd_rn(a, __fmul_rn(__fsub_rn(b, a), UniformAt(key, g)))
                  : __fadd_rn(a, __fmul_rn(b, NormalAt(key, g)));
    if constexpr (sizeof(T) == 4) {
      out[i] = v;
    } else {
      out[i] = __float2bfloat16_rn(v);
    }
  }
}

__global__ void BitsKernel(int32_t* out, int64_t n, RngKey key, int64_t first) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    out[i] = static_cast<int32_t>(RandomBitsAt(key, static_cast<uint64_t>(first + i)));
  }
}

template <Dist D>
void Launch(Tensor& out, RngKey key, int64_t first, float a, float b, DeviceContext* ctx,
            const int64_t* at = nullptr, int64_t token_offset = 0, int64_t per_token = 1) {
  int64_t n = out.numel();
  if (n == 0) return;
  if (out.dtype() == DType::kF32) {
    FillKernel<float, D><<<GridFor(n), 256, 0, StreamOf(ctx)>>>(
        static_cast<float*>(out.raw_data()), n, key, first, a, b, at, token_offset, per_token);
  } else {
    SY_CHECK(out.dtype() == DType::kBF16) << "random fill of " << DTypeName(out.dtype());
    FillKernel<__nv_bfloat16, D><<<GridFor(n), 256, 0, StreamOf(ctx)>>>(
        static_cast<__nv_bfloat16*>(out.raw_data()), n, key, first, a, b, at, token_offset,
        per_token);
  }
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace

void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi,
                 DeviceContext* ctx) {
  Launch<Dist::kUniform>(out, key, first_index, lo, hi, ctx);
}

void FillUniform(Tensor& out, const DeviceRng& at, float lo, float hi, DeviceContext* ctx) {
  Launch<Dist::kUniform>(out, RngKey{at.seed, 0}, 0, lo, hi, ctx, at.values.data<int64_t>(),
                         at.token_offset, at.per_token);
}

void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std,
                DeviceContext* ctx) {
  Launch<Dist::kNormal>(out, key, first_index, mean, std, ctx);
}

void FillRandomBits(Tensor& out, RngKey key, int64_t first_index, DeviceContext* ctx) {
  int64_t n = out.numel();
  if (n == 0) return;
  BitsKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(out.data<int32_t>(), n, key, first_index);
  SY_CUDA_CHECK_LAUNCH();
}

}  // namespace switchyard::kernels::cuda
