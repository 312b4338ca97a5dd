// Elementwise activations of the expert MLPs (MODEL.md section 2) and their backward
// passes, plus the bias add over rows and its gradient (column sums), flat and grouped by
// contiguous row blocks like kernels/gemm.h.
//
// All tensors are contiguous f32 on one device (every tensor on the device of the output),
// but the forward inputs a backward op reads (x; a and b): f32 or, under bf16 activation
// storage, the kept bf16 values (both of one dtype), which the op widens as it reads them
// (exact: the f32 op on the widened values, bit for bit).
// Elementwise ops take any shape (inputs and outputs of equal shape) and may run in place
// (an output may be the same tensor as an input; a partial overlap is not supported). The
// CPU reference is kernels/cpu/activation.cc, the CUDA implementation
// kernels/cuda/activation.cu; the bias gradients reduce in a fixed order on both, so
// repeated runs give identical bits.
#pragma once

#include <cstdint>
#include <span>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"

namespace switchyard::kernels {

// ---- gelu, tanh approximation (Hendrycks & Gimpel 2016, as in GPT-2) -------------------
// y = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))).
void GeluForward(const Tensor& x, Tensor& y, DeviceContext* ctx = nullptr);
// dx = dy * gelu'(x), with the derivative of the tanh form above.
void GeluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx = nullptr);

// Every backward op here (GeluBackward, ReluBackward, SwigluBackward and the fused
// *BackwardBiasGrad below) writes its gradients (dx; da and db) in f32, which may be dy's
// memory, or in bf16, the operands the next products read (in bf16 mode): the f32 result
// rounded to nearest even as it is stored, the bits of the f32 op then kernels::Cast, with no
// f32 copy (a fused bias gradient still sums the f32 values). A bf16 gradient is not dy's
// memory; da and db are of one dtype.
//
// The layers' rule (dense::Mlp, moe::Experts, and the dry-run's memory model alike): the
// hidden gradients are written in bf16 when the products are (bf16 mode), unless a bias
// gradient is summed from da after the pass (relu's bias, not fused).
inline bool HiddenGradsInBf16(bool bf16_products, bool unfused_bias_grad) {
  return bf16_products && !unfused_bias_grad;
}

// ---- relu ---------------------------------------------------------------------------------
// y = max(x, 0).
void ReluForward(const Tensor& x, Tensor& y, DeviceContext* ctx = nullptr);
// dx = x > 0 ? dy : 0 (the subgradient at 0 is 0).
void ReluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx = nullptr);

// ---- swiglu (Shazeer 2020, "GLU variants improve transformer") -------------------------
// With a = x @ W1 and b = x @ W3: out = silu(a) * b, silu(a) = a * sigmoid(a).
void SwigluForward(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx = nullptr);
// da = dout * b * silu'(a), silu'(a) = s (1 + a (1 - s)) with s = sigmoid(a);
// db = dout * silu(a). da and db must be distinct tensors (either may alias an input).
void SwigluBackward(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da, Tensor& db,
                    DeviceContext* ctx = nullptr);

// ---- bias over rows -----------------------------------------------------------------------
// out (R, n)[r, :] += bias (n) for every row r.
void AddBias(Tensor& out, const Tensor& bias, DeviceContext* ctx = nullptr);
// dbias (n) = beta * dbias + sum over rows r of dy (R, n)[r, :]. beta = 1 accumulates;
// beta = 0 overwrites (whatever dbias held, NaN included, is not read).
void BiasGrad(const Tensor& dy, Tensor& dbias, float beta = 0.0f, DeviceContext* ctx = nullptr);
// BiasGrad(dy, dbias, beta) and dy16 (R, n) bf16 = dy rounded to nearest even (Cast) in one
// pass over dy: a Linear layer's incoming gradient as its products' bf16 operand beside its
// bias gradient (dense::Linear::Backward in bf16 mode). The bits of BiasGrad then Cast on
// each device (CUDA writes the copy in the bias gradient's first stage, which sums the same
// values in the same order); one conversion counted.
void BiasGradCast(const Tensor& dy, Tensor& dbias, float beta, Tensor& dy16,
                  DeviceContext* ctx = nullptr);

// Grouped over consecutive row blocks of rows[g] rows (sum = out.dim(0)), one bias per
// group: out[block g] (rows[g], n) += bias[g] (n). bias: (G, n). `rows` is on the host
// whatever the tensors' device (the CUDA kernels copy the block offsets to the device).
void GroupedAddBias(Tensor& out, std::span<const int64_t> rows, const Tensor& bias,
                    DeviceContext* ctx = nullptr);
// dbias[g] (n) = beta * dbias[g] + column sums of dy[block g]. dy: (R, n), dbias: (G, n).
// A group with zero rows gets dbias[g] = beta * dbias[g].
void GroupedBiasGrad(const Tensor& dy, std::span<const int64_t> rows, Tensor& dbias,
                     float beta = 0.0f, DeviceContext* ctx = nullptr);

// The same with the blocks sized on the device: offsets (G + 1) i64 on out's device, as the
// device-sized GroupedGemm takes them (kernels/gemm.h); rows from offsets[G] on belong to no
// group and are neither changed nor summed. The host never reads the offsets on CUDA; the
// CPU runs the host-sized op on the grouped rows (the same bits). CUDA's GroupedBiasGrad
// sums the rows in the host-sized CUDA op's chunks, in parallel (so within the host-sized
// op's bound of the CPU's running sum, not bit-identical to it).
void GroupedAddBias(Tensor& out, const Tensor& offsets, const Tensor& bias,
                    DeviceContext* ctx = nullptr);
void GroupedBiasGrad(const Tensor& dy, const Tensor& offsets, Tensor& dbias, float beta = 0.0f,
                     DeviceContext* ctx = nullptr);

// ---- fused bias + activation (the dense MLP's first projection) ------------------------
// One pass where the unfused sequence is two or three: a (R, n) is the product x W1 without
// its bias. Each is bit-identical, on one device, to the unfused ops it replaces (the same
// expressions in the same order); on CUDA one kernel (forward) or one kernel plus the bias
// gradient's short second stage (backward) instead of two or three.
//
// Under bf16 activation storage the forward ops also write what the layer keeps in bf16, in
// the same pass: h (out) may be a bf16 tensor (the activation rounded to nearest even as it
// is written: the bits of an f32 h then kernels::Cast), and with KeptRounded the
// pre-activations the backward reads are written rounded to bf16 instead of back into a
// (*a = bf16(a + bias); swiglu's *b = bf16(b)), a then only read: the bits of the f32 op then
// KeepRounded (kernels/activation_storage.h). Each kept tensor is bf16 of a's shape.
struct KeptRounded {
  Tensor* a = nullptr;
  Tensor* b = nullptr;
};

// The forward ops take an undefined bias for none: then only the activation (a is not
// written), with the same outputs (bf16 h, KeptRounded): a layer without W1's bias keeps its
// bf16 tensors in the activation's pass too.
//
// a += bias (in place: a then holds x W1 + b1, what backward reads), h = gelu(a).
// = AddBias(a, bias); GeluForward(a, h). h must not be a.
void BiasGeluForward(Tensor& a, const Tensor& bias, Tensor& h, DeviceContext* ctx = nullptr,
                     KeptRounded kept = {});
// a += bias, out = silu(a) * b.  = AddBias(a, bias); SwigluForward(a, b, out). out must not be a.
void BiasSwigluForward(Tensor& a, const Tensor& bias, const Tensor& b, Tensor& out,
                       DeviceContext* ctx = nullptr, KeptRounded kept = {});
// dx = dy * gelu'(a) (dx may be dy), then dbias (n) = beta * dbias + column sums of dx
// (R, n).  = GeluBackward(a, dy, dx); BiasGrad(dx, dbias, beta).
void GeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx, Tensor& dbias,
                          float beta, DeviceContext* ctx = nullptr);
// da, db as SwigluBackward, then dbias = beta * dbias + column sums of da (the bias is a's).
// = SwigluBackward(a, b, dout, da, db); BiasGrad(da, dbias, beta).
void SwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da,
                            Tensor& db, Tensor& dbias, float beta, DeviceContext* ctx = nullptr);

// ---- the same, grouped (the experts' first projection) ----------------------------------
// The row groups of a grouped op: host counts `rows` (summing to the rows), or, when
// `offsets` is defined, the device-sized groups of kernels/gemm.h ((G + 1) i64 offsets on the
// tensors' device; rows from offsets[G] on belong to no group).
struct RowGroups {
  std::span<const int64_t> rows;
  Tensor offsets;
};
// One bias per group (bias (G, n), as GroupedAddBias). Bit-identical, on one device, to the
// unfused sequences: forward GroupedAddBias then the activation (rows past the groups get the
// activation of their a, without a bias, as there); backward the activation's backward then
// GroupedBiasGrad, over the groups' rows (dx, da and db of rows past the groups are left as
// they were). On CUDA one kernel forward; backward the grouped bias gradient's two stages
// with the activation's gradient computed (and written) in the first.
void GroupedBiasGeluForward(Tensor& a, const RowGroups& groups, const Tensor& bias, Tensor& h,
                            DeviceContext* ctx = nullptr, KeptRounded kept = {});
void GroupedBiasSwigluForward(Tensor& a, const RowGroups& groups, const Tensor& bias,
                              const Tensor& b, Tensor& out, DeviceContext* ctx = nullptr,
                              KeptRounded kept = {});
void GroupedGeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx,
                                 const RowGroups& groups, Tensor& dbias, float beta,
                                 DeviceContext* ctx = nullptr);
void GroupedSwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout,
                                   Tensor& da, Tensor& db, const RowGroups& groups,
                                   Tensor& dbias, float beta, DeviceContext* ctx = nullptr);

namespace cpu {
void BiasGeluForward(Tensor& a, const Tensor& bias, Tensor& h);
void BiasSwigluForward(Tensor& a, const Tensor& bias, const Tensor& b, Tensor& out);
void GeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx, Tensor& dbias, float beta);
void SwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da,
                            Tensor& db, Tensor& dbias, float beta);
void GeluForward(const Tensor& x, Tensor& y);
void GeluBackward(const Tensor& x, const Tensor& dy, Tensor& dx);
void ReluForward(const Tensor& x, Tensor& y);
void ReluBackward(const Tensor& x, const Tensor& dy, Tensor& dx);
void SwigluForward(const Tensor& a, const Tensor& b, Tensor& out);
void SwigluBackward(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da, Tensor& db);
void AddBias(Tensor& out, const Tensor& bias);
void BiasGrad(const Tensor& dy, Tensor& dbias, float beta);
void GroupedAddBias(Tensor& out, std::span<const int64_t> rows, const Tensor& bias);
void GroupedBiasGrad(const Tensor& dy, std::span<const int64_t> rows, Tensor& dbias, float beta);
// The grouped fused backward over the rows in groups (sum of rows = dy.dim(0)): gelu's
// (b null) or swiglu's gradient and the groups' bias gradients in one streaming pass.
void GroupedActBackwardBiasGrad(const Tensor& a, const Tensor* b, const Tensor& dy, Tensor& dx,
                                Tensor* db, std::span<const int64_t> rows, Tensor& dbias,
                                float beta);
}  // namespace cpu

namespace cuda {
void BiasGeluForward(Tensor& a, const Tensor& bias, Tensor& h, KeptRounded kept,
                     DeviceContext* ctx);
void BiasSwigluForward(Tensor& a, const Tensor& bias, const Tensor& b, Tensor& out,
                       KeptRounded kept, DeviceContext* ctx);
void GeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx, Tensor& dbias,
                          float beta, DeviceContext* ctx);
void SwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da,
                            Tensor& db, Tensor& dbias, float beta, DeviceContext* ctx);
void GeluForward(const Tensor& x, Tensor& y, DeviceContext* ctx);
void GeluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx);
void ReluForward(const Tensor& x, Tensor& y, DeviceContext* ctx);
void ReluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx);
void SwigluForward(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx);
void SwigluBackward(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da, Tensor& db,
                    DeviceContext* ctx);
void AddBias(Tensor& out, const Tensor& bias, DeviceContext* ctx);
void BiasGrad(const Tensor& dy, Tensor& dbias, float beta, DeviceContext* ctx);
void BiasGradCast(const Tensor& dy, Tensor& dbias, float beta, Tensor& dy16, DeviceContext* ctx);
void GroupedAddBias(Tensor& out, std::span<const int64_t> rows, const Tensor& bias,
                    DeviceContext* ctx);
void GroupedBiasGrad(const Tensor& dy, std::span<const int64_t> rows, Tensor& dbias, float beta,
                     DeviceContext* ctx);
void GroupedAddBias(Tensor& out, const Tensor& offsets, const Tensor& bias, DeviceContext* ctx);
void GroupedBiasGrad(const Tensor& dy, const Tensor& offsets, Tensor& dbias, float beta,
                     DeviceContext* ctx);
void GroupedBiasGeluForward(Tensor& a, const RowGroups& groups, const Tensor& bias, Tensor& h,
                            KeptRounded kept, DeviceContext* ctx);
void GroupedBiasSwigluForward(Tensor& a, const RowGroups& groups, const Tensor& bias,
                              const Tensor& b, Tensor& out, KeptRounded kept,
                              DeviceContext* ctx);
void GroupedGeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx,
                                 const RowGroups& groups, Tensor& dbias, float beta,
                                 DeviceContext* ctx);
void GroupedSwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout,
                                   Tensor& da, Tensor& db, const RowGroups& groups,
                                   Tensor& dbias, float beta, DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
