// Argument checks and device dispatch for kernels/elementwise.h.
#include "kernels/check.h"
#include "kernels/elementwise.h"

#include <initializer_list>
#include <utility>
#include <vector>

#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// Every tensor defined, f32, on the output's device, with the output's shape.
void CheckF32SameShape(const char* op, const Tensor& out,
                       std::initializer_list<std::pair<const Tensor*, const char*>> inputs) {
  SY_CHECK(out.defined()) << op << ": the output is undefined";
  SY_CHECK(out.dtype() == DType::kF32)
      << op << ": the output is " << DTypeName(out.dtype()) << ", expected f32";
  for (const auto& [t, what] : inputs) {
    CheckDefinedOn(*t, out.device(), op, what);
    SY_CHECK(t->dtype() == DType::kF32)
        << op << ": " << what << " is " << DTypeName(t->dtype()) << ", expected f32";
    SY_CHECK(t->shape() == out.shape()) << op << ": " << what << " " << ShapeString(t->shape())
                                        << ", output " << ShapeString(out.shape());
  }
}

}  // namespace

void Add(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx) {
  CheckF32SameShape("Add", out, {{&a, "a"}, {&b, "b"}});
  SY_DISPATCH_DEVICE(out, ctx, cpu::Add(a, b, out), cuda::Add(a, b, out, ctx));
}

void Axpy(float alpha, const Tensor& x, Tensor& y, DeviceContext* ctx) {
  CheckF32SameShape("Axpy", y, {{&x, "x"}});
  SY_DISPATCH_DEVICE(y, ctx, cpu::Axpy(alpha, x, y), cuda::Axpy(alpha, x, y, ctx));
}

void Mul(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx) {
  CheckF32SameShape("Mul", out, {{&a, "a"}, {&b, "b"}});
  SY_DISPATCH_DEVICE(out, ctx, cpu::Mul(a, b, out), cuda::Mul(a, b, out, ctx));
}

void MulAdd(const Tensor& a, const Tensor& b, Tensor& y, DeviceContext* ctx) {
  CheckF32SameShape("MulAdd", y, {{&a, "a"}, {&b, "b"}});
  SY_DISPATCH_DEVICE(y, ctx, cpu::MulAdd(a, b, y), cuda::MulAdd(a, b, y, ctx));
}

void Fill(Tensor& t, float value, DeviceContext* ctx) {
  SY_CHECK(t.defined()) << "Fill: the tensor is undefined";
  SY_CHECK(t.dtype() == DType::kF32 || t.dtype() == DType::kBF16)
      << "Fill: the tensor is " << DTypeName(t.dtype()) << ", expected f32 or bf16";
  SY_DISPATCH_DEVICE(t, ctx, cpu::Fill(t, value), cuda::Fill(t, value, ctx));
}

void ZeroMany(std::span<Tensor> tensors, DeviceContext* ctx) {
  if (tensors.empty()) return;
  Tensor& first = tensors[0];
  for (size_t i = 0; i < tensors.size(); ++i) {
    CheckDefinedOn(tensors[i], first.device(), "ZeroMany", "a tensor");
  }
  // An owned copy of the handles: a capture replays the zeroing later.
  std::vector<Tensor> all(tensors.begin(), tensors.end());
  SY_DISPATCH_DEVICE(first, ctx, cpu::ZeroMany(all), cuda::ZeroMany(all, ctx));
}

void Cast(const Tensor& src, Tensor& dst, DeviceContext* ctx) {
  SY_CHECK(dst.defined()) << "Cast: dst is undefined";
  CheckDefinedOn(src, dst.device(), "Cast", "src");
  SY_CHECK(src.numel() == dst.numel())
      << "Cast: src " << ShapeString(src.shape()) << " has " << src.numel() << " elements, dst "
      << ShapeString(dst.shape()) << " has " << dst.numel();
  const bool supported = src.dtype() == dst.dtype() ||
                         (src.dtype() == DType::kF32 && dst.dtype() == DType::kBF16) ||
                         (src.dtype() == DType::kBF16 && dst.dtype() == DType::kF32);
  SY_CHECK(supported) << "Cast from " << DTypeName(src.dtype()) << " to " << DTypeName(dst.dtype())
                      << " is not supported (f32 <-> bf16, or a copy within one dtype)";
  SY_DISPATCH_DEVICE(dst, ctx, cpu::Cast(src, dst), cuda::Cast(src, dst, ctx));
  if (src.dtype() != dst.dtype() && dst.numel() > 0) {
    counters::CountConversion(src.dtype(), dst.dtype(), dst.numel());
  }
}

}  // namespace switchyard::kernels
