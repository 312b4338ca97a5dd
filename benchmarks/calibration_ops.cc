#include "benchmarks/calibration_ops.h"

#include <memory>

#include "engine/core/philox.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "kernels/flash_attention.h"
#include "kernels/norm.h"
#include "kernels/random.h"

namespace switchyard::bench {
namespace {

// Tensors on ctx's device, uniform in [-1, 1) (a stream each), shared by the ops' closures.
struct Filler {
  DeviceContext* ctx;
  uint64_t stream = 0;
  std::shared_ptr<Tensor> operator()(const Shape& shape, DType dtype) {
    auto t = std::make_shared<Tensor>(Tensor::Empty(shape, dtype, ctx->device()));
    kernels::FillUniform(*t, RngKey{11, ++stream}, 0, -1.0f, 1.0f, ctx);
    return t;
  }
};

}  // namespace

std::vector<MemoryOp> MemoryBoundOps(int64_t tokens, int64_t d, int64_t ff, DeviceContext* ctx) {
  Filler filled{ctx};
  const double td = double(tokens) * d, tf = double(tokens) * ff;
  std::vector<MemoryOp> ops;

  // x + r, then LayerNorm of the sum: reads x and r, writes the sum (f32) and y (bf16).
  auto x = filled({tokens, d}, DType::kF32), r = filled({tokens, d}, DType::kF32);
  auto sum = filled({tokens, d}, DType::kF32), y = filled({tokens, d}, DType::kBF16);
  auto weight = filled({d}, DType::kF32), bias = filled({d}, DType::kF32);
  auto mean = filled({tokens}, DType::kF32), rstd = filled({tokens}, DType::kF32);
  ops.push_back({"add + layernorm forward", 4 * td, [=] {
                   kernels::AddLayerNormForward(*x, *r, *weight, *bias, 1e-5f, *sum, *y, *mean,
                                                *rstd, ctx);
                 }});
  // LayerNorm's backward into the residual gradient: reads x, dy and dx, writes dx.
  auto dy = filled({tokens, d}, DType::kF32), dx = filled({tokens, d}, DType::kF32);
  auto dweight = filled({d}, DType::kF32), dbias = filled({d}, DType::kF32);
  ops.push_back({"layernorm backward (dx added)", 4 * td, [=] {
                   kernels::LayerNormBackward(*sum, *weight, *mean, *rstd, *dy, *dx, *dweight,
                                              *dbias, ctx, kernels::Write::kAdd);
                 }});
  // The MLP's activation: reads W1's f32 product, writes bf16 h and the kept bf16 a.
  auto a = filled({tokens, ff}, DType::kF32), b1 = filled({ff}, DType::kF32);
  auto h = filled({tokens, ff}, DType::kBF16), kept = filled({tokens, ff}, DType::kBF16);
  ops.push_back({"bias + gelu forward", 3 * tf,
                 [=] { kernels::BiasGeluForward(*a, *b1, *h, ctx, {.a = kept.get()}); }});
  // Its backward: reads the kept a and W2's f32 input gradient, writes bf16 da and db1.
  auto dh = filled({tokens, ff}, DType::kF32), da = filled({tokens, ff}, DType::kBF16);
  auto db1 = filled({ff}, DType::kF32);
  ops.push_back({"gelu backward + bias gradient", 3 * tf,
                 [=] { kernels::GeluBackwardBiasGrad(*kept, *dh, *da, *db1, 1.0f, ctx); }});
  // A gradient converted for the products that read it.
  auto g = filled({tokens, d}, DType::kF32), g16 = filled({tokens, d}, DType::kBF16);
  ops.push_back({"cast f32 -> bf16", 2 * td, [=] { kernels::Cast(*g, *g16, ctx); }});
  return ops;
}

AttentionOps MakeAttentionOps(int64_t B, int64_t S, int64_t H, int64_t hd, DeviceContext* ctx) {
  AttentionOps ops;
  ops.bf16_inputs = kernels::UseFlashAttention(ctx, hd);
  const DType in = ops.bf16_inputs ? DType::kBF16 : DType::kF32;
  Filler filled{ctx, 100};
  auto q = filled({B, S, H, hd}, in), k = filled({B, S, H, hd}, in), v = filled({B, S, H, hd}, in);
  auto out = filled({B, S, H, hd}, in), lse = filled({B, H, S}, DType::kF32);
  auto delta = filled({B, H, S}, DType::kF32), dout = filled({B, S, H, hd}, DType::kF32);
  auto dq = filled({B, S, H, hd}, DType::kF32), dk = filled({B, S, H, hd}, DType::kF32);
  auto dv = filled({B, S, H, hd}, DType::kF32);
  kernels::AttentionForward(*q, *k, *v, *out, *lse, ctx);  // the lse the backward reads
  ops.forward = {"attention forward", 0,
                 [=] { kernels::AttentionForward(*q, *k, *v, *out, *lse, ctx); }};
  ops.backward = {"attention backward", 0, [=] {
                    kernels::AttentionBackwardDelta(*out, *dout, *delta, ctx);
                    kernels::AttentionBackward(*q, *k, *v, *lse, *dout, *dq, *dk, *dv, ctx,
                                               kernels::AttentionMask::kCausal, *delta);
                  }};
  return ops;
}

}  // namespace switchyard::bench
