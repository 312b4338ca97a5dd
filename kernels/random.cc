// Device dispatch for kernels/random.h.
#include "kernels/random.h"

#include "kernels/dispatch.h"

namespace switchyard::kernels {


void FillUniform(Tensor& out, RngKey key, int64_t first_index, float lo, float hi,
                 DeviceContext* ctx) {
  SY_DISPATCH_DEVICE(out, ctx, cpu::FillUniform(out, key, first_index, lo, hi),
                     cuda::FillUniform(out, key, first_index, lo, hi, ctx));
}

void FillUniform(Tensor& out, const DeviceRng& at, float lo, float hi, DeviceContext* ctx) {
  SY_CHECK(out.defined() && at.values.defined() && at.values.dtype() == DType::kI64 &&
           at.values.numel() == 2 && at.values.device() == out.device())
      << "FillUniform: DeviceRng values must be (2) i64 on " << out.device() << ", got "
      << at.values.DebugString();
  // The CPU reads the values when the fill runs (at each replay of a capture).
  auto on_cpu = [=]() mutable {
    const int64_t* v = at.values.data<int64_t>();
    cpu::FillUniform(out, RngKey{at.seed, static_cast<uint64_t>(v[0])},
                     (v[1] + at.token_offset) * at.per_token, lo, hi);
  };
  SY_DISPATCH_DEVICE(out, ctx, on_cpu(), cuda::FillUniform(out, at, lo, hi, ctx));
}

namespace {

void CheckMulUniform(const Tensor& x, const Tensor& out) {
  SY_CHECK(x.defined() && out.defined() && x.dtype() == DType::kF32 &&
           out.dtype() == DType::kF32 && x.numel() == out.numel() &&
           x.device() == out.device())
      << "MulUniform: x and out must be f32 of as many elements on one device, got "
      << x.DebugString() << " and " << out.DebugString();
}

}  // namespace

void MulUniform(const Tensor& x, Tensor& out, RngKey key, int64_t first_index, float lo,
                float hi, Write write, DeviceContext* ctx) {
  CheckMulUniform(x, out);
  SY_DISPATCH_DEVICE(out, ctx, cpu::MulUniform(x, out, key, first_index, lo, hi, write),
                     cuda::MulUniform(x, out, key, first_index, lo, hi, write, ctx));
}

void MulUniform(const Tensor& x, Tensor& out, const DeviceRng& at, float lo, float hi,
                Write write, DeviceContext* ctx) {
  CheckMulUniform(x, out);
  SY_CHECK(at.values.defined() && at.values.dtype() == DType::kI64 &&
           at.values.numel() == 2 && at.values.device() == out.device())
      << "MulUniform: DeviceRng values must be (2) i64 on " << out.device() << ", got "
      << at.values.DebugString();
  // The CPU reads the values when it runs (at each replay of a capture).
  auto on_cpu = [=]() mutable {
    const int64_t* v = at.values.data<int64_t>();
    cpu::MulUniform(x, out, RngKey{at.seed, static_cast<uint64_t>(v[0])},
                    (v[1] + at.token_offset) * at.per_token, lo, hi, write);
  };
  SY_DISPATCH_DEVICE(out, ctx, on_cpu(), cuda::MulUniform(x, out, at, lo, hi, write, ctx));
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
