// Device dispatch for kernels/attention.h: shape, dtype and device checks (the same on every
// device), then the CPU or CUDA implementation.
#include "kernels/attention.h"

#include "kernels/dispatch.h"

namespace switchyard::kernels {
namespace {

// t is defined, f32, on `device` (the output's) and of shape `want`.
void CheckTensor(const Tensor& t, const Shape& want, Device device, const char* op,
                 const char* what) {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.device() == device) << op << ": " << what << " is on " << t.device()
                                 << " but the output is on " << device;
  SY_CHECK(t.dtype() == DType::kF32) << op << ": " << what << " is " << DTypeName(t.dtype())
                                     << ", expected f32";
  SY_CHECK(t.shape() == want) << op << ": " << what << " " << ShapeString(t.shape())
                              << ", expected " << ShapeString(want);
}

// Checks q (B, S, Hq, hd), k and v (B, S, Hkv, hd) and lse (B, Hq, S) on `device`.
void CheckInputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                 Device device, const char* op) {
  SY_CHECK(q.defined() && k.defined()) << op << ": q or k is undefined";
  SY_CHECK_EQ(q.ndim(), 4) << op << ": q is (B, S, Hq, hd), got " << ShapeString(q.shape());
  SY_CHECK_EQ(k.ndim(), 4) << op << ": k is (B, S, Hkv, hd), got " << ShapeString(k.shape());
  const int64_t b = q.dim(0), s = q.dim(1), hq = q.dim(2), hd = q.dim(3), hkv = k.dim(2);
  SY_CHECK_GE(hd, 1) << op << ": empty heads, q " << ShapeString(q.shape());
  SY_CHECK(hkv >= 1 && hq % hkv == 0) << op << ": Hq=" << hq << " is not a multiple of Hkv="
                                      << hkv;
  CheckTensor(q, q.shape(), device, op, "q");
  CheckTensor(k, {b, s, hkv, hd}, device, op, "k");
  CheckTensor(v, {b, s, hkv, hd}, device, op, "v");
  CheckTensor(lse, {b, hq, s}, device, op, "lse");
}

}  // namespace

void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      DeviceContext* ctx) {
  constexpr const char* kOp = "AttentionForward";
  SY_CHECK(out.defined()) << kOp << ": out is undefined";
  CheckInputs(q, k, v, lse, out.device(), kOp);
  CheckTensor(out, q.shape(), out.device(), kOp, "out");
  SY_DISPATCH_DEVICE(out, ctx, cpu::AttentionForward(q, k, v, out, lse),
                     cuda::AttentionForward(q, k, v, out, lse, ctx));
}

void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, DeviceContext* ctx) {
  constexpr const char* kOp = "AttentionBackward";
  SY_CHECK(dq.defined()) << kOp << ": dq is undefined";
  CheckInputs(q, k, v, lse, dq.device(), kOp);
  CheckTensor(dout, q.shape(), dq.device(), kOp, "dout");
  CheckTensor(dq, q.shape(), dq.device(), kOp, "dq");
  CheckTensor(dk, k.shape(), dq.device(), kOp, "dk");
  CheckTensor(dv, v.shape(), dq.device(), kOp, "dv");
  SY_DISPATCH_DEVICE(dq, ctx, cpu::AttentionBackward(q, k, v, lse, dout, dq, dk, dv),
                     cuda::AttentionBackward(q, k, v, lse, dout, dq, dk, dv, ctx));
}

}  // namespace switchyard::kernels
