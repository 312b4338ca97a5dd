// Elementwise activations of the expert MLPs (MODEL.md section 2) and their backward
// passes, plus the bias add over rows and its gradient (column sums), flat and grouped by
// contiguous row blocks like kernels/gemm.h.
//
// All tensors are contiguous f32 on one device (every tensor on the device of the output).
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

// Grouped over consecutive row blocks of rows[g] rows (sum = out.dim(0)), one bias per
// group: out[block g] (rows[g], n) += bias[g] (n). bias: (G, n). `rows` is on the host
// whatever the tensors' device (the CUDA kernels copy the block offsets to the device).
void GroupedAddBias(Tensor& out, std::span<const int64_t> rows, const Tensor& bias,
                    DeviceContext* ctx = nullptr);
// dbias[g] (n) = beta * dbias[g] + column sums of dy[block g]. dy: (R, n), dbias: (G, n).
// A group with zero rows gets dbias[g] = beta * dbias[g].
void GroupedBiasGrad(const Tensor& dy, std::span<const int64_t> rows, Tensor& dbias,
                     float beta = 0.0f, DeviceContext* ctx = nullptr);

namespace cpu {
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
}  // namespace cpu

namespace cuda {
void GeluForward(const Tensor& x, Tensor& y, DeviceContext* ctx);
void GeluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx);
void ReluForward(const Tensor& x, Tensor& y, DeviceContext* ctx);
void ReluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx);
void SwigluForward(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx);
void SwigluBackward(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da, Tensor& db,
                    DeviceContext* ctx);
void AddBias(Tensor& out, const Tensor& bias, DeviceContext* ctx);
void BiasGrad(const Tensor& dy, Tensor& dbias, float beta, DeviceContext* ctx);
void GroupedAddBias(Tensor& out, std::span<const int64_t> rows, const Tensor& bias,
                    DeviceContext* ctx);
void GroupedBiasGrad(const Tensor& dy, std::span<const int64_t> rows, Tensor& dbias, float beta,
                     DeviceContext* ctx);
}  // namespace cuda

}  // namespace switchyard::kernels
