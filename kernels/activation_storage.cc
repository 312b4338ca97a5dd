// kernels/activation_storage.h through kernels::MatmulOperand and kernels::Cast.
#include "kernels/activation_storage.h"

#include "kernels/elementwise.h"
#include "kernels/gemm.h"

namespace switchyard::kernels {

Tensor KeptOperand(const Tensor& x, DeviceContext* ctx, KeepInput keep) {
  if (keep == KeepInput::kAsGiven || !StoresBf16(ctx)) return x;
  return MatmulOperand(x, ctx);
}

Tensor KeepRounded(const Tensor& t, DeviceContext* ctx) {
  if (!StoresBf16(ctx) || t.dtype() != DType::kF32) return t;
  Tensor out = Tensor::Empty(t.shape(), DType::kBF16, t.device());
  Cast(t, out, ctx);  // counts the conversion
  return out;
}

Tensor KeptAsF32(const Tensor& t, DeviceContext* ctx) {
  if (!t.defined() || t.dtype() == DType::kF32) return t;
  Tensor out = Tensor::Empty(t.shape(), DType::kF32, t.device());
  Cast(t, out, ctx);  // counts the conversion
  return out;
}

}  // namespace switchyard::kernels
