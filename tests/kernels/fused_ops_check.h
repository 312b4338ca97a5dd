// The fused elementwise ops (kernels/activation.h: bias + gelu / swiglu forward, their
// backward with the bias gradient, the bias gradient with dy's bf16 copy; kernels/norm.h: residual add + layernorm / rmsnorm)
// against the unfused sequence each replaces, on one device: the same bits, since they
// evaluate the same expressions in the same order (and the bias gradient sums in the same
// chunks and order). Shared by tests/kernels/fused_ops_test.cc (CPU) and
// tests/gpu/fused_ops_gpu_test.cc (CUDA). Shapes: no rows, one element, odd widths, a tall
// input whose bias gradient is cut into many chunks; beta 0 over NaN, 1 and 0.5; in place;
// the grouped ops over host counts and device offsets.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "engine/core/device_context.h"
#include "engine/core/tensor.h"
#include "kernels/activation.h"
#include "kernels/elementwise.h"
#include "kernels/norm.h"
#include "tests/gpu/gpu_test_util.h"

namespace switchyard::kernels::fused_check {

inline Tensor Uniform(const Shape& shape, uint64_t seed, Device dev, DeviceContext* ctx,
                      float lo = -3.0f, float hi = 3.0f) {
  Tensor host = gpu_test::HostUniform(shape, seed, lo, hi);
  return dev.is_cpu() ? host : host.To(dev, ctx);
}

inline Tensor Filled(const Shape& shape, float v, Device dev, DeviceContext* ctx) {
  Tensor host = Tensor::Empty(shape, DType::kF32);
  float* p = host.data<float>();
  for (int64_t i = 0; i < host.numel(); ++i) p[i] = v;
  return dev.is_cpu() ? host : host.To(dev, ctx);
}

inline std::string Name(const char* op, const Shape& s) { return std::string(op) + " " + ShapeString(s); }

// Two bf16 tensors of one shape, bit for bit.
inline void ExpectBf16Equal(const Tensor& got, const Tensor& want, DeviceContext* ctx,
                            const std::string& what) {
  ASSERT_EQ(got.dtype(), DType::kBF16) << what;
  ASSERT_EQ(want.dtype(), DType::kBF16) << what;
  ASSERT_EQ(got.shape(), want.shape()) << what;
  const Tensor g = got.device().is_cpu() ? got : got.To(Device::Cpu(), ctx);
  const Tensor w = want.device().is_cpu() ? want : want.To(Device::Cpu(), ctx);
  if (g.numel() == 0) return;  // nothing to compare (and no buffer to hand memcmp)
  EXPECT_EQ(0, std::memcmp(g.raw_data(), w.raw_data(), g.numel() * 2)) << what;
}

// bf16 storage's outputs of a fused forward pair, gelu(a, h, kept) and swiglu(a, out, kept):
// h and the kept a (and b) rounded in the pass, the bits of the f32 outputs then Cast (a_ref
// = a + bias, h_ref, o_ref); a only read.
template <typename Gelu, typename Swiglu>
void CheckKeptForward(const Tensor& a0, const Tensor& b, const Tensor& a_ref, const Tensor& h_ref,
                      const Tensor& o_ref, DeviceContext* ctx, const std::string& what,
                      Gelu gelu, Swiglu swiglu) {
  const Device dev = a0.device();
  auto bf16 = [&]() { return Tensor::Empty(a0.shape(), DType::kBF16, dev); };
  auto bf16_of = [&](const Tensor& t) {
    Tensor r = bf16();
    Cast(t, r, ctx);
    return r;
  };
  Tensor ka = bf16(), kb = bf16(), h16 = bf16(), o16 = bf16(), ga = a0.Clone(ctx);
  gelu(ga, h16, KeptRounded{.a = &ka});
  gpu_test::ExpectBitEqual(ga, a0, ctx, "BiasGeluForward kept: a unchanged " + what);
  ExpectBf16Equal(ka, bf16_of(a_ref), ctx, "BiasGeluForward kept a " + what);
  ExpectBf16Equal(h16, bf16_of(h_ref), ctx, "BiasGeluForward bf16 h " + what);
  swiglu(ga, o16, KeptRounded{.a = &ka, .b = &kb});
  ExpectBf16Equal(ka, bf16_of(a_ref), ctx, "BiasSwigluForward kept a " + what);
  ExpectBf16Equal(kb, bf16_of(b), ctx, "BiasSwigluForward kept b " + what);
  ExpectBf16Equal(o16, bf16_of(o_ref), ctx, "BiasSwigluForward bf16 out " + what);
}

// A backward op on bf16 activation storage's kept inputs: op(a, b, outs...) with a and b
// bf16 gives the bits of op on their values widened to f32. `run(a, b)` returns the outputs.
template <typename Run>
void CheckKeptBackward(const Tensor& a, const Tensor& b, DeviceContext* ctx,
                       const std::string& what, Run run) {
  const Device dev = a.device();
  auto rounded = [&](const Tensor& t, DType dtype, const Tensor& from) {
    Tensor r = Tensor::Empty(t.shape(), dtype, dev);
    Cast(from, r, ctx);
    return r;
  };
  const Tensor a16 = rounded(a, DType::kBF16, a), b16 = rounded(b, DType::kBF16, b);
  const Tensor aw = rounded(a, DType::kF32, a16), bw = rounded(b, DType::kF32, b16);
  const std::vector<Tensor> got = run(a16, b16), want = run(aw, bw);
  ASSERT_EQ(got.size(), want.size());
  for (size_t k = 0; k < got.size(); ++k) {
    gpu_test::ExpectBitEqual(got[k], want[k], ctx,
                             what + " on bf16 inputs, output " + std::to_string(k));
  }
}

// t rounded to bf16 (Cast).
inline Tensor Bf16Of(const Tensor& t, DeviceContext* ctx) {
  Tensor r = Tensor::Empty(t.shape(), DType::kBF16, t.device());
  Cast(t, r, ctx);
  return r;
}

// A gradient output in `dtype` that starts as `init`'s values (rounded in bf16), so the rows
// an op leaves as they were compare too.
inline Tensor GradOut(const Tensor& init, DType dtype, DeviceContext* ctx) {
  return dtype == DType::kF32 ? init.Clone(ctx) : Bf16Of(init, ctx);
}

// A backward op writing its gradients in bf16, the products' operands (kernels/activation.h):
// the bits of its f32 gradients then Cast, and its f32 outputs (the bias gradient) the same
// bits. `run(dtype)` returns the gradients in dtype (the first `grads`), then the f32 outputs.
template <typename Run>
void CheckBf16Grads(size_t grads, DeviceContext* ctx, const std::string& what, Run run) {
  const std::vector<Tensor> f = run(DType::kF32), h = run(DType::kBF16);
  ASSERT_EQ(f.size(), h.size()) << what;
  for (size_t k = 0; k < f.size(); ++k) {
    const std::string w = what + ", output " + std::to_string(k);
    if (k < grads) {
      ExpectBf16Equal(h[k], Bf16Of(f[k], ctx), ctx, w + " in bf16");
    } else {
      gpu_test::ExpectBitEqual(h[k], f[k], ctx, w);
    }
  }
}

const std::vector<Shape> kRowShapes = {{0, 7}, {1, 1}, {5, 77}, {300, 1000}, {70001, 3}};

inline void CheckBiasActivations(Device dev, DeviceContext* ctx) {
  uint64_t seed = 100;
  for (const Shape& s : kRowShapes) {
    const Shape bias_shape = {s[1]};
    const Tensor a0 = Uniform(s, ++seed, dev, ctx), b = Uniform(s, ++seed, dev, ctx);
    const Tensor bias = Uniform(bias_shape, ++seed, dev, ctx, -1.0f, 1.0f);
    // gelu forward: AddBias then GeluForward.
    Tensor a_ref = a0.Clone(ctx), h_ref = Tensor::Empty(s, DType::kF32, dev);
    AddBias(a_ref, bias, ctx);
    GeluForward(a_ref, h_ref, ctx);
    Tensor a = a0.Clone(ctx), h = Tensor::Empty(s, DType::kF32, dev);
    BiasGeluForward(a, bias, h, ctx);
    gpu_test::ExpectBitEqual(a, a_ref, ctx, Name("BiasGeluForward a", s));
    gpu_test::ExpectBitEqual(h, h_ref, ctx, Name("BiasGeluForward h", s));
    // swiglu forward.
    Tensor sa_ref = a0.Clone(ctx), o_ref = Tensor::Empty(s, DType::kF32, dev);
    AddBias(sa_ref, bias, ctx);
    SwigluForward(sa_ref, b, o_ref, ctx);
    Tensor sa = a0.Clone(ctx), o = Tensor::Empty(s, DType::kF32, dev);
    BiasSwigluForward(sa, bias, b, o, ctx);
    gpu_test::ExpectBitEqual(sa, sa_ref, ctx, Name("BiasSwigluForward a", s));
    gpu_test::ExpectBitEqual(o, o_ref, ctx, Name("BiasSwigluForward out", s));
    CheckKeptForward(a0, b, a_ref, h_ref, o_ref, ctx, Name("", s),
                     [&](Tensor& a, Tensor& h, KeptRounded k) {
                       BiasGeluForward(a, bias, h, ctx, k);
                     },
                     [&](Tensor& a, Tensor& o, KeptRounded k) {
                       BiasSwigluForward(a, bias, b, o, ctx, k);
                     });
    // No bias (undefined): the activation alone, a not written, with every kind of output.
    {
      Tensor nh_ref = Tensor::Empty(s, DType::kF32, dev), no_ref = Tensor::Empty(s, DType::kF32, dev);
      GeluForward(a0, nh_ref, ctx);
      SwigluForward(a0, b, no_ref, ctx);
      Tensor na = a0.Clone(ctx), nh = Tensor::Empty(s, DType::kF32, dev);
      BiasGeluForward(na, Tensor(), nh, ctx);
      gpu_test::ExpectBitEqual(na, a0, ctx, Name("BiasGeluForward no bias: a", s));
      gpu_test::ExpectBitEqual(nh, nh_ref, ctx, Name("BiasGeluForward no bias: h", s));
      Tensor no = Tensor::Empty(s, DType::kF32, dev);
      BiasSwigluForward(na, Tensor(), b, no, ctx);
      gpu_test::ExpectBitEqual(na, a0, ctx, Name("BiasSwigluForward no bias: a", s));
      gpu_test::ExpectBitEqual(no, no_ref, ctx, Name("BiasSwigluForward no bias: out", s));
      CheckKeptForward(a0, b, a0, nh_ref, no_ref, ctx, Name(" no bias", s),
                       [&](Tensor& a, Tensor& h, KeptRounded k) {
                         BiasGeluForward(a, Tensor(), h, ctx, k);
                       },
                       [&](Tensor& a, Tensor& o, KeptRounded k) {
                         BiasSwigluForward(a, Tensor(), b, o, ctx, k);
                       });
    }
    // backward, dx in place over dy as dense::Mlp runs it; beta 0 over NaN, 1, 0.5.
    for (float beta : {0.0f, 1.0f, 0.5f}) {
      const std::string tag = " beta " + std::to_string(beta).substr(0, 3);
      const Tensor dy = Uniform(s, ++seed, dev, ctx, -1.0f, 1.0f);
      const Tensor db0 = beta == 0.0f ? Filled(bias_shape, std::numeric_limits<float>::quiet_NaN(), dev, ctx)
                                      : Uniform(bias_shape, ++seed, dev, ctx);
      // BiasGradCast: BiasGrad then Cast (a Linear's dy as its products' bf16 operand).
      {
        Tensor cast_ref = Tensor::Empty(s, DType::kBF16, dev), cast = Tensor::Empty(s, DType::kBF16, dev);
        Tensor db_ref = db0.Clone(ctx), db = db0.Clone(ctx);
        BiasGrad(dy, db_ref, beta, ctx);
        Cast(dy, cast_ref, ctx);
        BiasGradCast(dy, db, beta, cast, ctx);
        gpu_test::ExpectBitEqual(db, db_ref, ctx, Name("BiasGradCast dbias", s) + tag);
        ExpectBf16Equal(cast, cast_ref, ctx, Name("BiasGradCast dy16", s) + tag);
      }
      Tensor dx_ref = dy.Clone(ctx), dbias_ref = db0.Clone(ctx);
      GeluBackward(a, dx_ref, dx_ref, ctx);
      BiasGrad(dx_ref, dbias_ref, beta, ctx);
      Tensor dx = dy.Clone(ctx), dbias = db0.Clone(ctx);
      GeluBackwardBiasGrad(a, dx, dx, dbias, beta, ctx);
      gpu_test::ExpectBitEqual(dx, dx_ref, ctx, Name("GeluBackwardBiasGrad dx", s) + tag);
      gpu_test::ExpectBitEqual(dbias, dbias_ref, ctx, Name("GeluBackwardBiasGrad dbias", s) + tag);

      Tensor da_ref = dy.Clone(ctx), dbm_ref = Tensor::Empty(s, DType::kF32, dev);
      Tensor sdb_ref = db0.Clone(ctx);
      SwigluBackward(sa, b, da_ref, da_ref, dbm_ref, ctx);
      BiasGrad(da_ref, sdb_ref, beta, ctx);
      Tensor da = dy.Clone(ctx), dbm = Tensor::Empty(s, DType::kF32, dev), sdb = db0.Clone(ctx);
      SwigluBackwardBiasGrad(sa, b, da, da, dbm, sdb, beta, ctx);
      gpu_test::ExpectBitEqual(da, da_ref, ctx, Name("SwigluBackwardBiasGrad da", s) + tag);
      gpu_test::ExpectBitEqual(dbm, dbm_ref, ctx, Name("SwigluBackwardBiasGrad db", s) + tag);
      gpu_test::ExpectBitEqual(sdb, sdb_ref, ctx, Name("SwigluBackwardBiasGrad dbias", s) + tag);

      CheckKeptBackward(a, b, ctx, Name("GeluBackwardBiasGrad", s) + tag,
                        [&](const Tensor& ka, const Tensor&) {
                          Tensor kdx = dy.Clone(ctx), kdb = db0.Clone(ctx);
                          GeluBackwardBiasGrad(ka, kdx, kdx, kdb, beta, ctx);
                          return std::vector<Tensor>{kdx, kdb};
                        });
      CheckKeptBackward(sa, b, ctx, Name("SwigluBackwardBiasGrad", s) + tag,
                        [&](const Tensor& ka, const Tensor& kb) {
                          Tensor kda = dy.Clone(ctx), kdbm = Tensor::Empty(s, DType::kF32, dev);
                          Tensor kdb = db0.Clone(ctx);
                          SwigluBackwardBiasGrad(ka, kb, kda, kda, kdbm, kdb, beta, ctx);
                          return std::vector<Tensor>{kda, kdbm, kdb};
                        });
      // The gradients written in bf16 (out of place; f32 in place), from f32 and from kept
      // bf16 inputs.
      for (bool kept : {false, true}) {
        const Tensor ka = kept ? Bf16Of(a, ctx) : a, ksa = kept ? Bf16Of(sa, ctx) : sa;
        const Tensor kb = kept ? Bf16Of(b, ctx) : b;
        const std::string kt = tag + (kept ? " kept bf16" : "");
        CheckBf16Grads(1, ctx, Name("GeluBackwardBiasGrad", s) + kt, [&](DType dt) {
          Tensor gx = GradOut(dy, dt, ctx), gb = db0.Clone(ctx);
          GeluBackwardBiasGrad(ka, dt == DType::kF32 ? gx : dy, gx, gb, beta, ctx);
          return std::vector<Tensor>{gx, gb};
        });
        CheckBf16Grads(2, ctx, Name("SwigluBackwardBiasGrad", s) + kt, [&](DType dt) {
          Tensor ga = GradOut(dy, dt, ctx), gm = GradOut(Filled(s, 7.0f, dev, ctx), dt, ctx);
          Tensor gb = db0.Clone(ctx);
          SwigluBackwardBiasGrad(ksa, kb, dt == DType::kF32 ? ga : dy, ga, gm, gb, beta, ctx);
          return std::vector<Tensor>{ga, gm, gb};
        });
      }
    }
    // The unfused backward ops read the kept bf16 inputs too.
    const Tensor g = Uniform(s, ++seed, dev, ctx, -1.0f, 1.0f);
    CheckKeptBackward(a, b, ctx, Name("GeluBackward", s), [&](const Tensor& ka, const Tensor&) {
      Tensor dx = g.Clone(ctx);
      GeluBackward(ka, dx, dx, ctx);
      return std::vector<Tensor>{dx};
    });
    CheckKeptBackward(a, b, ctx, Name("ReluBackward", s), [&](const Tensor& ka, const Tensor&) {
      Tensor dx = g.Clone(ctx);
      ReluBackward(ka, dx, dx, ctx);
      return std::vector<Tensor>{dx};
    });
    CheckKeptBackward(a, b, ctx, Name("SwigluBackward", s),
                      [&](const Tensor& ka, const Tensor& kb) {
                        Tensor da = g.Clone(ctx), db = Tensor::Empty(s, DType::kF32, dev);
                        SwigluBackward(ka, kb, da, da, db, ctx);
                        return std::vector<Tensor>{da, db};
                      });
    // And their gradients written in bf16, from f32 and from kept bf16 inputs.
    for (bool kept : {false, true}) {
      const Tensor ka = kept ? Bf16Of(a, ctx) : a, kb = kept ? Bf16Of(b, ctx) : b;
      const std::string kt = kept ? " kept bf16" : "";
      CheckBf16Grads(1, ctx, Name("GeluBackward", s) + kt, [&](DType dt) {
        Tensor gx = GradOut(g, dt, ctx);
        GeluBackward(ka, dt == DType::kF32 ? gx : g, gx, ctx);
        return std::vector<Tensor>{gx};
      });
      CheckBf16Grads(1, ctx, Name("ReluBackward", s) + kt, [&](DType dt) {
        Tensor gx = GradOut(g, dt, ctx);
        ReluBackward(ka, dt == DType::kF32 ? gx : g, gx, ctx);
        return std::vector<Tensor>{gx};
      });
      CheckBf16Grads(2, ctx, Name("SwigluBackward", s) + kt, [&](DType dt) {
        Tensor ga = GradOut(g, dt, ctx), gm = GradOut(Filled(s, 7.0f, dev, ctx), dt, ctx);
        SwigluBackward(ka, kb, dt == DType::kF32 ? ga : g, ga, gm, ctx);
        return std::vector<Tensor>{ga, gm};
      });
    }
  }
}

// The grouped fused ops (one bias per group: the experts' first projection) against
// GroupedAddBias / GroupedBiasGrad and the activation, over host counts and device offsets
// (with rows past the groups: the forward treats them as the unfused ops do, the backward
// leaves them as they were). Empty groups, a group with no rows at all, no groups, a tall
// split whose bias gradient is cut into many chunks; beta 0 over NaN and 1; dx over dy.
inline void CheckGroupedBiasActivations(Device dev, DeviceContext* ctx) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  struct Case {
    std::vector<int64_t> rows;
    int64_t n, past;  // columns; rows past the groups (device offsets only)
  };
  const std::vector<Case> cases = {
      {{3, 0, 70, 1}, 77, 6}, {{0, 0}, 5, 4}, {{40000, 25000, 5001}, 3, 9}, {{1}, 1, 0},
      {{}, 6, 5}};  // no groups: every row past them
  uint64_t seed = 900;
  for (const Case& c : cases) {
    const int64_t groups = static_cast<int64_t>(c.rows.size());
    std::vector<int64_t> offsets(groups + 1, 0);
    for (int64_t g = 0; g < groups; ++g) offsets[g + 1] = offsets[g] + c.rows[g];
    const int64_t used = offsets[groups];
    for (bool sized : {false, true}) {
      const int64_t total = used + (sized ? c.past : 0);
      const Shape s = {total, c.n};
      const Tensor offs_host = Tensor::FromVector(offsets, {groups + 1});
      const Tensor offs = dev.is_cpu() ? offs_host : offs_host.To(dev, ctx);
      const RowGroups rg = sized ? RowGroups{{}, offs} : RowGroups{c.rows, Tensor()};
      auto add_bias = [&](Tensor& t, const Tensor& bias) {
        if (sized) {
          GroupedAddBias(t, offs, bias, ctx);
        } else {
          GroupedAddBias(t, c.rows, bias, ctx);
        }
      };
      auto bias_grad = [&](const Tensor& dy, Tensor& dbias, float beta) {
        if (sized) {
          GroupedBiasGrad(dy, offs, dbias, beta, ctx);
        } else {
          GroupedBiasGrad(dy, c.rows, dbias, beta, ctx);
        }
      };
      const std::string tag = std::string(sized ? " offsets" : " counts") + " " + ShapeString(s);
      const Tensor a0 = Uniform(s, ++seed, dev, ctx), b = Uniform(s, ++seed, dev, ctx);
      const Tensor bias = Uniform({groups, c.n}, ++seed, dev, ctx, -1.0f, 1.0f);
      Tensor a_ref = a0.Clone(ctx), h_ref = Tensor::Empty(s, DType::kF32, dev);
      add_bias(a_ref, bias);
      GeluForward(a_ref, h_ref, ctx);
      Tensor a = a0.Clone(ctx), h = Tensor::Empty(s, DType::kF32, dev);
      GroupedBiasGeluForward(a, rg, bias, h, ctx);
      gpu_test::ExpectBitEqual(a, a_ref, ctx, "GroupedBiasGeluForward a" + tag);
      gpu_test::ExpectBitEqual(h, h_ref, ctx, "GroupedBiasGeluForward h" + tag);
      Tensor o_ref = Tensor::Empty(s, DType::kF32, dev), o = Tensor::Empty(s, DType::kF32, dev);
      SwigluForward(a_ref, b, o_ref, ctx);  // a_ref holds a0 + bias
      Tensor sa = a0.Clone(ctx);
      GroupedBiasSwigluForward(sa, rg, bias, b, o, ctx);
      gpu_test::ExpectBitEqual(sa, a_ref, ctx, "GroupedBiasSwigluForward a" + tag);
      gpu_test::ExpectBitEqual(o, o_ref, ctx, "GroupedBiasSwigluForward out" + tag);
      CheckKeptForward(a0, b, a_ref, h_ref, o_ref, ctx, "Grouped" + tag,
                       [&](Tensor& a, Tensor& h, KeptRounded k) {
                         GroupedBiasGeluForward(a, rg, bias, h, ctx, k);
                       },
                       [&](Tensor& a, Tensor& o, KeptRounded k) {
                         GroupedBiasSwigluForward(a, rg, bias, b, o, ctx, k);
                       });

      for (float beta : {0.0f, 1.0f}) {
        const std::string bt = tag + (beta == 0.0f ? " beta 0" : " beta 1");
        const Tensor dy = Uniform(s, ++seed, dev, ctx, -1.0f, 1.0f);
        const Tensor db0 = beta == 0.0f ? Filled({groups, c.n}, nan, dev, ctx)
                                        : Uniform({groups, c.n}, ++seed, dev, ctx);
        // The reference over the groups' rows; past them the fused ops leave dy (and db).
        Tensor dx_ref = dy.Clone(ctx), dbias_ref = db0.Clone(ctx);
        Tensor used_ref = dx_ref.Slice(0, used);
        GeluBackward(a_ref.Slice(0, used), dy.Slice(0, used), used_ref, ctx);
        bias_grad(dx_ref, dbias_ref, beta);
        Tensor dx = dy.Clone(ctx), dbias = db0.Clone(ctx);
        GroupedGeluBackwardBiasGrad(a_ref, dx, dx, rg, dbias, beta, ctx);
        gpu_test::ExpectBitEqual(dx, dx_ref, ctx, "GroupedGeluBackwardBiasGrad dx" + bt);
        gpu_test::ExpectBitEqual(dbias, dbias_ref, ctx,
                                 "GroupedGeluBackwardBiasGrad dbias" + bt);

        Tensor da_ref = dy.Clone(ctx), dbm_ref = Filled(s, 7.0f, dev, ctx);
        Tensor sdb_ref = db0.Clone(ctx);
        Tensor da_used = da_ref.Slice(0, used), dbm_used = dbm_ref.Slice(0, used);
        SwigluBackward(a_ref.Slice(0, used), b.Slice(0, used), dy.Slice(0, used), da_used,
                       dbm_used, ctx);
        bias_grad(da_ref, sdb_ref, beta);
        Tensor da = dy.Clone(ctx), dbm = Filled(s, 7.0f, dev, ctx), sdb = db0.Clone(ctx);
        GroupedSwigluBackwardBiasGrad(a_ref, b, da, da, dbm, rg, sdb, beta, ctx);
        gpu_test::ExpectBitEqual(da, da_ref, ctx, "GroupedSwigluBackwardBiasGrad da" + bt);
        gpu_test::ExpectBitEqual(dbm, dbm_ref, ctx, "GroupedSwigluBackwardBiasGrad db" + bt);
        gpu_test::ExpectBitEqual(sdb, sdb_ref, ctx, "GroupedSwigluBackwardBiasGrad dbias" + bt);

        CheckKeptBackward(a_ref, b, ctx, "GroupedGeluBackwardBiasGrad" + bt,
                          [&](const Tensor& ka, const Tensor&) {
                            Tensor kdx = dy.Clone(ctx), kdb = db0.Clone(ctx);
                            GroupedGeluBackwardBiasGrad(ka, kdx, kdx, rg, kdb, beta, ctx);
                            return std::vector<Tensor>{kdx, kdb};
                          });
        CheckKeptBackward(a_ref, b, ctx, "GroupedSwigluBackwardBiasGrad" + bt,
                          [&](const Tensor& ka, const Tensor& kb) {
                            Tensor kda = dy.Clone(ctx), kdbm = Filled(s, 7.0f, dev, ctx);
                            Tensor kdb = db0.Clone(ctx);
                            GroupedSwigluBackwardBiasGrad(ka, kb, kda, kda, kdbm, rg, kdb, beta,
                                                          ctx);
                            return std::vector<Tensor>{kda, kdbm, kdb};
                          });
        // The gradients written in bf16 (the rows past the groups keep their start values).
        for (bool kept : {false, true}) {
          const Tensor ka = kept ? Bf16Of(a_ref, ctx) : a_ref, kb = kept ? Bf16Of(b, ctx) : b;
          const std::string kt = bt + (kept ? " kept bf16" : "");
          CheckBf16Grads(1, ctx, "GroupedGeluBackwardBiasGrad" + kt, [&](DType dt) {
            Tensor gx = GradOut(dy, dt, ctx), gb = db0.Clone(ctx);
            GroupedGeluBackwardBiasGrad(ka, dt == DType::kF32 ? gx : dy, gx, rg, gb, beta, ctx);
            return std::vector<Tensor>{gx, gb};
          });
          CheckBf16Grads(2, ctx, "GroupedSwigluBackwardBiasGrad" + kt, [&](DType dt) {
            Tensor ga = GradOut(dy, dt, ctx), gm = GradOut(Filled(s, 7.0f, dev, ctx), dt, ctx);
            Tensor gb = db0.Clone(ctx);
            GroupedSwigluBackwardBiasGrad(ka, kb, dt == DType::kF32 ? ga : dy, ga, gm, rg, gb,
                                          beta, ctx);
            return std::vector<Tensor>{ga, gm, gb};
          });
        }
      }
    }
  }
}

inline void CheckAddNorms(Device dev, DeviceContext* ctx) {
  const std::vector<Shape> shapes = {{0, 8}, {1, 1}, {3, 5}, {17, 1024}, {64, 4097}, {2, 3, 96}};
  uint64_t seed = 500;
  constexpr float kEps = 1e-5f;
  for (const Shape& s : shapes) {
    const int64_t d = s.back(), n = d == 0 ? 0 : Tensor::Empty(s, DType::kF32).numel() / d;
    const Tensor x = Uniform(s, ++seed, dev, ctx), r = Uniform(s, ++seed, dev, ctx);
    const Tensor w = Uniform({d}, ++seed, dev, ctx, 0.5f, 1.5f), bias = Uniform({d}, ++seed, dev, ctx);
    Tensor sum_ref = Tensor::Empty(s, DType::kF32, dev);
    Add(x, r, sum_ref, ctx);
    for (bool with_bias : {true, false}) {
      const Tensor b = with_bias ? bias : Tensor();
      const std::string tag = with_bias ? " (bias)" : " (no bias)";
      Tensor y_ref = Tensor::Empty(s, DType::kF32, dev), m_ref = Tensor::Empty({n}, DType::kF32, dev),
             rs_ref = Tensor::Empty({n}, DType::kF32, dev);
      LayerNormForward(sum_ref, w, b, kEps, y_ref, m_ref, rs_ref, ctx);
      Tensor sum = Tensor::Empty(s, DType::kF32, dev), y = Tensor::Empty(s, DType::kF32, dev),
             m = Tensor::Empty({n}, DType::kF32, dev), rs = Tensor::Empty({n}, DType::kF32, dev);
      AddLayerNormForward(x, r, w, b, kEps, sum, y, m, rs, ctx);
      gpu_test::ExpectBitEqual(sum, sum_ref, ctx, Name("AddLayerNormForward sum", s) + tag);
      gpu_test::ExpectBitEqual(y, y_ref, ctx, Name("AddLayerNormForward y", s) + tag);
      gpu_test::ExpectBitEqual(m, m_ref, ctx, Name("AddLayerNormForward mean", s) + tag);
      gpu_test::ExpectBitEqual(rs, rs_ref, ctx, Name("AddLayerNormForward rstd", s) + tag);
      // A bf16 y (the products' operand under bf16 storage): the f32 y rounded, from the
      // plain and the residual forms.
      Tensor y16_ref = Tensor::Empty(s, DType::kBF16, dev), y16 = Tensor::Empty(s, DType::kBF16, dev);
      Cast(y_ref, y16_ref, ctx);
      LayerNormForward(sum_ref, w, b, kEps, y16, m, rs, ctx);
      ExpectBf16Equal(y16, y16_ref, ctx, Name("LayerNormForward bf16 y", s) + tag);
      y16 = Tensor::Empty(s, DType::kBF16, dev);
      AddLayerNormForward(x, r, w, b, kEps, sum, y16, m, rs, ctx);
      ExpectBf16Equal(y16, y16_ref, ctx, Name("AddLayerNormForward bf16 y", s) + tag);
      gpu_test::ExpectBitEqual(m, m_ref, ctx, Name("AddLayerNormForward bf16 y: mean", s) + tag);
    }
    Tensor y_ref = Tensor::Empty(s, DType::kF32, dev), rs_ref = Tensor::Empty({n}, DType::kF32, dev);
    RmsNormForward(sum_ref, w, kEps, y_ref, rs_ref, ctx);
    // In place: sum over x's own memory.
    Tensor xs = x.Clone(ctx), y = Tensor::Empty(s, DType::kF32, dev), rs = Tensor::Empty({n}, DType::kF32, dev);
    AddRmsNormForward(xs, r, w, kEps, xs, y, rs, ctx);
    gpu_test::ExpectBitEqual(xs, sum_ref, ctx, Name("AddRmsNormForward sum (in place)", s));
    gpu_test::ExpectBitEqual(y, y_ref, ctx, Name("AddRmsNormForward y", s));
    gpu_test::ExpectBitEqual(rs, rs_ref, ctx, Name("AddRmsNormForward rstd", s));
    Tensor y16_ref = Tensor::Empty(s, DType::kBF16, dev), y16 = Tensor::Empty(s, DType::kBF16, dev);
    Cast(y_ref, y16_ref, ctx);
    RmsNormForward(sum_ref, w, kEps, y16, rs, ctx);
    ExpectBf16Equal(y16, y16_ref, ctx, Name("RmsNormForward bf16 y", s));
    y16 = Tensor::Empty(s, DType::kBF16, dev);
    Tensor sum16 = Tensor::Empty(s, DType::kF32, dev);
    AddRmsNormForward(x, r, w, kEps, sum16, y16, rs, ctx);
    ExpectBf16Equal(y16, y16_ref, ctx, Name("AddRmsNormForward bf16 y", s));
    gpu_test::ExpectBitEqual(sum16, sum_ref, ctx, Name("AddRmsNormForward bf16 y: sum", s));
  }
}

}  // namespace switchyard::kernels::fused_check
