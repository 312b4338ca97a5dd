// Device dispatch for kernels/random.h.
#include "kernels/random.h"

#include "kernels/dispatch.h"

namespace switchyard::kernels {


void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi,
                 DeviceContext* ctx) {
  SY_DISPATCH_DEVICE(out, ctx, cpu::FillUniform(out, key, first_index, lo, hi),
                     cuda::FillUniform(out, key, first_index, lo, hi, ctx));
}

void FillNormal(Tensor& out, RngKey key, int64_t first_index, float mean, float std,
                DeviceContext* ctx) {
  SY_DISPATCH_DEVICE(out, ctx, cpu::FillNormal(out, key, first_index, mean, std),
                     cuda::FillNormal(out, key, first_index, mean, std, ctx));
}

void FillRandomBits(Tensor& out, RngKey key, int64_t first_index, DeviceContext* ctx) {
  SY_DISPATCH_DEVICE(out, ctx, cpu::FillRandomBits(out, key, first_index),
                     cuda::FillRandomBits(out, key, first_index, ctx));
}

}  // namespace switchyard::kernels
