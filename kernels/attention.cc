// Device dispatch for kernels/attention.h: shape, dtype, device and mask checks (the same on
// every device), then the CPU or CUDA implementation: the exact f32 one, or the fused bf16
// one (kernels/flash_attention.h) when UseFlashAttention selects it.
#include "kernels/attention.h"

#include "kernels/dispatch.h"
#include "kernels/elementwise.h"
#include "kernels/flash_attention.h"

namespace switchyard::kernels {
namespace {

// t is defined, f32 (bf16 with `bf16`), on `device` (the output's) and of shape `want`.
void CheckTensor(const Tensor& t, const Shape& want, Device device, const char* op,
                 const char* what, bool bf16 = false) {
  SY_CHECK(t.defined()) << op << ": " << what << " is undefined";
  SY_CHECK(t.device() == device) << op << ": " << what << " is on " << t.device()
                                 << " but the output is on " << device;
  const DType dtype = bf16 ? DType::kBF16 : DType::kF32;
  SY_CHECK(t.dtype() == dtype) << op << ": " << what << " is " << DTypeName(t.dtype())
                               << ", expected " << DTypeName(dtype);
  SY_CHECK(t.shape() == want) << op << ": " << what << " " << ShapeString(t.shape())
                              << ", expected " << ShapeString(want);
}

// Checks q (B, S, Hq, hd), k and v (B, S, Hkv, hd) and lse (B, Hq, S) on `device`. q, k and v
// are f32, or on the fused path (UseFlashAttention(ctx, hd)) all three bf16: the operands the
// kernel would round them to.
void CheckInputs(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                 Device device, const DeviceContext* ctx, const char* op) {
  SY_CHECK(q.defined() && k.defined()) << op << ": q or k is undefined";
  SY_CHECK_EQ(q.ndim(), 4) << op << ": q is (B, S, Hq, hd), got " << ShapeString(q.shape());
  SY_CHECK_EQ(k.ndim(), 4) << op << ": k is (B, S, Hkv, hd), got " << ShapeString(k.shape());
  const int64_t b = q.dim(0), s = q.dim(1), hq = q.dim(2), hd = q.dim(3), hkv = k.dim(2);
  SY_CHECK_GE(hd, 1) << op << ": empty heads, q " << ShapeString(q.shape());
  SY_CHECK(hkv >= 1 && hq % hkv == 0) << op << ": Hq=" << hq << " is not a multiple of Hkv="
                                      << hkv;
  const bool bf16 = q.dtype() == DType::kBF16;
  SY_CHECK(!bf16 || UseFlashAttention(ctx, hd))
      << op << ": q, k and v in bf16 need the fused path (bf16 products, head_dim 64 or 128), "
      << "got head_dim " << hd;
  CheckTensor(q, q.shape(), device, op, "q", bf16);
  CheckTensor(k, {b, s, hkv, hd}, device, op, "k", bf16);
  CheckTensor(v, {b, s, hkv, hd}, device, op, "v", bf16);
  CheckTensor(lse, {b, hq, s}, device, op, "lse");
}

void CheckMask(AttentionMask mask, const char* op) {
  SY_CHECK(mask == AttentionMask::kCausal || mask == AttentionMask::kFull)
      << op << ": unknown mask " << static_cast<int>(mask);
}

// delta (B, Hq, S) of the fused path when the caller has none (q's rows are a whole
// softmax): the fused forward's out again, then rowsum(dout * out).
Tensor FlashDelta(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                  AttentionMask mask, DeviceContext* ctx) {
  const Shape lse_shape{q.dim(0), q.dim(2), q.dim(1)};
  Tensor out = Tensor::Empty(q.shape(), DType::kF32, q.device());
  Tensor lse = Tensor::Empty(lse_shape, DType::kF32, q.device());
  AttentionForward(q, k, v, out, lse, ctx, mask);
  Tensor delta = Tensor::Empty(lse_shape, DType::kF32, q.device());
  AttentionBackwardDelta(out, dout, delta, ctx);
  return delta;
}

// out: f32, or bf16 (the output projection's operand under bf16 activation storage).
void CheckOut(const Tensor& out, const Shape& want, Device device, const char* op) {
  SY_CHECK(out.dtype() == DType::kF32 || out.dtype() == DType::kBF16)
      << op << ": out is " << DTypeName(out.dtype()) << ", expected f32 or bf16";
  SY_CHECK(out.device() == device) << op << ": out is on " << out.device()
                                   << " but the output is on " << device;
  SY_CHECK(out.shape() == want) << op << ": out " << ShapeString(out.shape()) << ", expected "
                                << ShapeString(want);
}

}  // namespace

bool UseFlashAttention(const DeviceContext* ctx, int64_t head_dim) {
  return ctx != nullptr && ctx->matmul_dtype() == DType::kBF16 && FlashAttentionSupports(head_dim);
}

void AttentionForward(const Tensor& q, const Tensor& k, const Tensor& v, Tensor& out, Tensor& lse,
                      DeviceContext* ctx, AttentionMask mask) {
  constexpr const char* kOp = "AttentionForward";
  SY_CHECK(out.defined()) << kOp << ": out is undefined";
  CheckInputs(q, k, v, lse, out.device(), ctx, kOp);
  CheckOut(out, q.shape(), out.device(), kOp);
  CheckMask(mask, kOp);
  if (UseFlashAttention(ctx, q.dim(3))) {
    // A bf16 out: the fused kernel rounds its f32 out as it stores it; the CPU rounds its
    // twin's.
    auto on_cpu = [=]() mutable {
      if (out.dtype() == DType::kF32) return cpu::FlashAttentionForward(q, k, v, out, lse, mask);
      Tensor out32 = Tensor::Empty(out.shape(), DType::kF32);
      cpu::FlashAttentionForward(q, k, v, out32, lse, mask);
      cpu::Cast(out32, out);
    };
    SY_DISPATCH_DEVICE(out, ctx, on_cpu(),
                       cuda::FlashAttentionForward(q, k, v, out, lse, mask, ctx));
    return;
  }
  SY_CHECK(out.dtype() == DType::kF32)
      << kOp << ": a bf16 out needs the fused path (bf16 products, head_dim 64 or 128), got "
      << "head_dim " << q.dim(3);
  SY_DISPATCH_DEVICE(out, ctx, cpu::AttentionForward(q, k, v, out, lse, mask),
                     cuda::AttentionForward(q, k, v, out, lse, mask, ctx));
}

void AttentionBackward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& lse,
                       const Tensor& dout, Tensor& dq, Tensor& dk, Tensor& dv, DeviceContext* ctx,
                       AttentionMask mask, const Tensor& delta) {
  constexpr const char* kOp = "AttentionBackward";
  SY_CHECK(dq.defined()) << kOp << ": dq is undefined";
  CheckInputs(q, k, v, lse, dq.device(), ctx, kOp);
  CheckTensor(dout, q.shape(), dq.device(), kOp, "dout");
  CheckTensor(dq, q.shape(), dq.device(), kOp, "dq");
  CheckTensor(dk, k.shape(), dq.device(), kOp, "dk");
  CheckTensor(dv, v.shape(), dq.device(), kOp, "dv");
  if (delta.defined()) CheckTensor(delta, lse.shape(), dq.device(), kOp, "delta");
  CheckMask(mask, kOp);
  if (UseFlashAttention(ctx, q.dim(3))) {
    const Tensor d = delta.defined() ? delta : FlashDelta(q, k, v, dout, mask, ctx);
    SY_DISPATCH_DEVICE(dq, ctx,
                       cpu::FlashAttentionBackward(q, k, v, lse, dout, d, dq, dk, dv, mask),
                       cuda::FlashAttentionBackward(q, k, v, lse, dout, d, dq, dk, dv, mask, ctx));
    return;
  }
  SY_DISPATCH_DEVICE(dq, ctx, cpu::AttentionBackward(q, k, v, lse, dout, dq, dk, dv, mask, delta),
                     cuda::AttentionBackward(q, k, v, lse, dout, dq, dk, dv, mask, delta, ctx));
}

void AttentionBackwardDelta(const Tensor& out, const Tensor& dout, Tensor& delta,
                            DeviceContext* ctx) {
  constexpr const char* kOp = "AttentionBackwardDelta";
  SY_CHECK(out.defined() && delta.defined()) << kOp << ": out or delta is undefined";
  SY_CHECK_EQ(out.ndim(), 4) << kOp << ": out is (B, S, Hq, hd), got "
                             << ShapeString(out.shape());
  const int64_t b = out.dim(0), s = out.dim(1), hq = out.dim(2);
  CheckOut(out, out.shape(), delta.device(), kOp);
  CheckTensor(dout, out.shape(), delta.device(), kOp, "dout");
  CheckTensor(delta, {b, hq, s}, delta.device(), kOp, "delta");
  SY_DISPATCH_DEVICE(delta, ctx, cpu::AttentionBackwardDelta(out, dout, delta),
                     cuda::AttentionBackwardDelta(out, dout, delta, ctx));
}

void AttentionMerge(Tensor& out, Tensor& lse, const Tensor& out_b, const Tensor& lse_b,
                    DeviceContext* ctx) {
  constexpr const char* kOp = "AttentionMerge";
  SY_CHECK(out.defined() && lse.defined()) << kOp << ": out or lse is undefined";
  SY_CHECK_EQ(out.ndim(), 4) << kOp << ": out is (B, S, Hq, hd), got "
                             << ShapeString(out.shape());
  const int64_t b = out.dim(0), s = out.dim(1), hq = out.dim(2);
  CheckTensor(out, out.shape(), out.device(), kOp, "out");
  CheckTensor(lse, {b, hq, s}, out.device(), kOp, "lse");
  CheckTensor(out_b, out.shape(), out.device(), kOp, "out_b");
  CheckTensor(lse_b, {b, hq, s}, out.device(), kOp, "lse_b");
  SY_DISPATCH_DEVICE(out, ctx, cpu::AttentionMerge(out, lse, out_b, lse_b),
                     cuda::AttentionMerge(out, lse, out_b, lse_b, ctx));
}

}  // namespace switchyard::kernels
