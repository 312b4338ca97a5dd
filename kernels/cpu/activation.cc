// CPU reference implementation of kernels/activation.h: loops over f32 elements, vectorised
// (kernels/cpu/vec_math.h) and split over the compute threads. Every element is read before
// it is written, so outputs may alias inputs. The backward ops read bf16 saved inputs
// widened a block at a time, and write bf16 gradients rounded a block at a time
// (ForGradients), with no full-size f32 copy. Arguments are checked by kernels/activation.cc.
#include "kernels/activation.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "engine/core/thread_pool.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/vec_math.h"

namespace switchyard::kernels::cpu {
namespace {

constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

// Elements per chunk handed to another thread.
constexpr int64_t kActivationChunk = 16384;

SY_VECTOR_CLONES void GeluForwardRange(const float* px, float* py, int64_t n) {
  // 0.5 (1 + tanh u) = sigmoid(2 u).
  for (int64_t i = 0; i < n; ++i) {
    const float v = px[i];
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    py[i] = v / (1.0f + VecExp(-2.0f * u));
  }
}

SY_VECTOR_CLONES void GeluBackwardRange(const float* px, const float* pdy, float* pdx, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float v = px[i];
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    // With s = sigmoid(2 u) = 0.5 (1 + tanh u) and 1 - tanh^2 u = 4 s (1 - s):
    // d/dx [x s] = s + 2 x s (1 - s) du/dx.
    const float s = 1.0f / (1.0f + VecExp(-2.0f * u));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    pdx[i] = pdy[i] * (s + 2.0f * v * s * (1.0f - s) * du);
  }
}

SY_VECTOR_CLONES void SwigluForwardRange(const float* pa, const float* pb, float* po, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float va = pa[i];
    po[i] = va * VecSigmoid(va) * pb[i];
  }
}

SY_VECTOR_CLONES void SwigluBackwardRange(const float* pa, const float* pb, const float* pdo,
                                          float* pda, float* pdb, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float va = pa[i], vb = pb[i], g = pdo[i];
    const float s = VecSigmoid(va);
    pda[i] = g * vb * s * (1.0f + va * (1.0f - s));
    pdb[i] = g * va * s;
  }
}

SY_VECTOR_CLONES void AddRow(float* y, const float* x, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] += x[j];
}

// The backward ops' saved inputs (x; a and b) are f32 or bf16 (kernels/activation.h). A bf16
// input is widened block by block into a local buffer (exact), so an elementwise range
// function sees f32 either way and no full-size copy is made: f(offset, count, p0[, p1]) over
// [b, e), with p0 (and p1) the f32 values of t0 (and t1) there.
constexpr int64_t kWidenBlock = 1024;

const float* WidenedAt(const Tensor& t, int64_t at, int64_t n, float* buffer) {
  if (t.dtype() == DType::kF32) return t.data<float>() + at;
  const BFloat16* p = static_cast<const BFloat16*>(t.raw_data()) + at;
  for (int64_t i = 0; i < n; ++i) buffer[i] = static_cast<float>(p[i]);
  return buffer;
}

// The gradients a backward range writes (kernels/activation.h): into an f32 gradient
// itself, or into a block buffer whose values are then rounded into a bf16 one.
float* GradAt(Tensor* g, int64_t at, float* buffer) {
  if (g == nullptr) return nullptr;
  return g->dtype() == DType::kF32 ? g->data<float>() + at : buffer;
}
void RoundInto(Tensor* g, int64_t at, const float* v, int64_t n) {
  if (g == nullptr || g->dtype() == DType::kF32) return;
  BFloat16* p = static_cast<BFloat16*>(g->raw_data()) + at;
  for (int64_t i = 0; i < n; ++i) p[i] = BFloat16(v[i]);
}

// f(offset, count, p0, p1, d0, d1) over [b, e): p0 (p1) the f32 values of the saved inputs t0
// (t1) there, d0 (d1) where the gradients g0 (g1) go in f32 (GradAt); the whole range at
// once when everything is f32, else blocks of kWidenBlock.
template <typename F>
void ForGradients(const Tensor& t0, const Tensor* t1, Tensor& g0, Tensor* g1, int64_t b,
                  int64_t e, F f) {
  if (t0.dtype() == DType::kF32 && g0.dtype() == DType::kF32) {
    f(b, e - b, t0.data<float>() + b, t1 != nullptr ? t1->data<float>() + b : nullptr,
      g0.data<float>() + b, g1 != nullptr ? g1->data<float>() + b : nullptr);
    return;
  }
  float w0[kWidenBlock], w1[kWidenBlock], o0[kWidenBlock], o1[kWidenBlock];
  for (int64_t at = b; at < e; at += kWidenBlock) {
    const int64_t n = std::min(kWidenBlock, e - at);
    float* d0 = GradAt(&g0, at, o0);
    float* d1 = GradAt(g1, at, o1);
    f(at, n, WidenedAt(t0, at, n, w0), t1 != nullptr ? WidenedAt(*t1, at, n, w1) : nullptr, d0,
      d1);
    RoundInto(&g0, at, d0, n);
    RoundInto(g1, at, d1, n);
  }
}

}  // namespace

void GeluForward(const Tensor& x, Tensor& y) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  ParallelFor(x.numel(), kActivationChunk,
              [&](int64_t b, int64_t e) { GeluForwardRange(px + b, py + b, e - b); });
}

void GeluBackward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const float* pdy = dy.data<float>();
  ParallelFor(x.numel(), kActivationChunk, [&](int64_t b, int64_t e) {
    ForGradients(x, nullptr, dx, nullptr, b, e,
                 [&](int64_t at, int64_t n, const float* px, const float*, float* pdx, float*) {
                   GeluBackwardRange(px, pdy + at, pdx, n);
                 });
  });
}

void ReluForward(const Tensor& x, Tensor& y) {
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) py[i] = px[i] > 0.0f ? px[i] : 0.0f;
}

void ReluBackward(const Tensor& x, const Tensor& dy, Tensor& dx) {
  const float* pdy = dy.data<float>();
  ForGradients(x, nullptr, dx, nullptr, 0, x.numel(),
               [&](int64_t at, int64_t n, const float* px, const float*, float* pdx, float*) {
                 for (int64_t i = 0; i < n; ++i) pdx[i] = px[i] > 0.0f ? pdy[at + i] : 0.0f;
               });
}

void SwigluForward(const Tensor& a, const Tensor& b, Tensor& out) {
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  ParallelFor(a.numel(), kActivationChunk,
              [&](int64_t s, int64_t e) { SwigluForwardRange(pa + s, pb + s, po + s, e - s); });
}

void SwigluBackward(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da, Tensor& db) {
  const float* pdo = dout.data<float>();
  ParallelFor(a.numel(), kActivationChunk, [&](int64_t s, int64_t e) {
    ForGradients(a, &b, da, &db, s, e,
                 [&](int64_t at, int64_t n, const float* pa, const float* pb, float* pda,
                     float* pdb) { SwigluBackwardRange(pa, pb, pdo + at, pda, pdb, n); });
  });
}

void AddBias(Tensor& out, const Tensor& bias) {
  const int64_t rows[1] = {out.dim(0)};
  cpu::GroupedAddBias(out, rows, bias.Reshape({1, bias.dim(0)}));
}

void BiasGrad(const Tensor& dy, Tensor& dbias, float beta) {
  const int64_t rows[1] = {dy.dim(0)};
  Tensor grouped = dbias.Reshape({1, dbias.dim(0)});
  cpu::GroupedBiasGrad(dy, rows, grouped, beta);
}

void GroupedAddBias(Tensor& out, std::span<const int64_t> rows, const Tensor& bias) {
  const int64_t n = out.dim(1);
  float* po = out.data<float>();
  const float* pb = bias.data<float>();
  std::vector<int64_t> group_of(static_cast<size_t>(out.dim(0)));  // row -> its group
  int64_t r = 0;
  for (size_t g = 0; g < rows.size(); ++g)
    for (int64_t end = r + rows[g]; r < end; ++r) group_of[r] = static_cast<int64_t>(g);
  ParallelFor(r, RowsPerChunk(n, kActivationChunk), [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) AddRow(po + i * n, pb + group_of[i] * n, n);
  });
}

// The bias gradients' sums: over blocks of columns in parallel, for each group its rows in
// order, `make_row(j0, w)` giving (once per block of columns [j0, j0 + w)) the function
// row(r, dg) that adds row r's columns there into dg, group g's bias gradient from j0, which
// starts as beta times itself (0 for beta 0). Each column's sums follow the rows' order alone,
// whatever the thread count.
template <typename MakeRow>
void SumGroupColumns(int64_t n, std::span<const int64_t> rows, Tensor& dbias, float beta,
                     MakeRow make_row) {
  float* pdb = dbias.data<float>();
  constexpr int64_t kColumns = 64;  // columns per block
  const int64_t blocks = (n + kColumns - 1) / kColumns;
  int64_t total = 0;
  for (int64_t r : rows) total += r;
  const int64_t chunk = RowsPerChunk(total * kColumns, kActivationChunk);
  ParallelFor(blocks, chunk, [&](int64_t cb, int64_t ce) {
    const int64_t j0 = cb * kColumns, w = std::min(n, ce * kColumns) - j0;
    auto row = make_row(j0, w);
    int64_t r = 0;
    for (size_t g = 0; g < rows.size(); ++g) {
      float* dg = pdb + static_cast<int64_t>(g) * n + j0;
      for (int64_t j = 0; j < w; ++j) dg[j] = beta == 0.0f ? 0.0f : beta * dg[j];
      for (int64_t end = r + rows[g]; r < end; ++r) row(r, dg);
    }
  });
}

void GroupedBiasGrad(const Tensor& dy, std::span<const int64_t> rows, Tensor& dbias, float beta) {
  const int64_t n = dy.dim(1);
  const float* pdy = dy.data<float>();
  SumGroupColumns(n, rows, dbias, beta, [&](int64_t j0, int64_t w) {
    return [=](int64_t r, float* dg) { AddRow(dg, pdy + r * n + j0, w); };
  });
}

// The fused ops: each row's bias add then its activation, one row at a time (the row is
// still in cache when the activation reads it), with the very range functions the unfused
// ops run, so every element gets the same operations in the same order: bit-identical to
// AddBias then GeluForward / SwigluForward. Backward: the unfused sequence itself (the bias
// gradient's fixed row order is GroupedBiasGrad's).
void BiasGeluForward(Tensor& a, const Tensor& bias, Tensor& h) {
  const int64_t n = a.dim(1);
  float* pa = a.data<float>();
  float* ph = h.data<float>();
  const float* pb = bias.data<float>();
  ParallelFor(a.dim(0), RowsPerChunk(n, kActivationChunk), [&](int64_t b, int64_t e) {
    for (int64_t r = b; r < e; ++r) {
      AddRow(pa + r * n, pb, n);
      GeluForwardRange(pa + r * n, ph + r * n, n);
    }
  });
}

void BiasSwigluForward(Tensor& a, const Tensor& bias, const Tensor& b, Tensor& out) {
  const int64_t n = a.dim(1);
  float* pa = a.data<float>();
  const float* pbm = b.data<float>();
  float* po = out.data<float>();
  const float* pb = bias.data<float>();
  ParallelFor(a.dim(0), RowsPerChunk(n, kActivationChunk), [&](int64_t s, int64_t e) {
    for (int64_t r = s; r < e; ++r) {
      AddRow(pa + r * n, pb, n);
      SwigluForwardRange(pa + r * n, pbm + r * n, po + r * n, n);
    }
  });
}

// Backward with the bias gradient, in SumGroupColumns' order: a row's block gets the
// activation's gradient (the range functions above, on a and b widened), added into the
// group's bias gradient and stored, in f32 or rounded into bf16 gradients. So every element
// has the expression of GeluBackward / SwigluBackward and every column the sums of
// GroupedBiasGrad: the unfused sequence's bits, with no full-size f32 copy of a bf16 gradient.
void GroupedActBackwardBiasGrad(const Tensor& a, const Tensor* b, const Tensor& dy, Tensor& dx,
                                Tensor* db, std::span<const int64_t> rows, Tensor& dbias,
                                float beta) {
  const int64_t n = dy.dim(1);
  const float* pdy = dy.data<float>();
  SumGroupColumns(n, rows, dbias, beta, [&](int64_t j0, int64_t w) {
    // Per block of columns: the widened a (b) and the f32 gradients of a bf16 output.
    std::vector<float> buffers(static_cast<size_t>(4 * w));
    return [&, j0, w, buffers = std::move(buffers)](int64_t r, float* dg) mutable {
      float* wa = buffers.data();
      float* wb = wa + w;
      float* o0 = wb + w;
      float* o1 = o0 + w;
      const int64_t at = r * n + j0;
      const float* pa = WidenedAt(a, at, w, wa);
      float* d0 = GradAt(&dx, at, o0);
      if (b != nullptr) {
        float* d1 = GradAt(db, at, o1);
        SwigluBackwardRange(pa, WidenedAt(*b, at, w, wb), pdy + at, d0, d1, w);
        RoundInto(db, at, d1, w);
      } else {
        GeluBackwardRange(pa, pdy + at, d0, w);
      }
      AddRow(dg, d0, w);
      RoundInto(&dx, at, d0, w);
    };
  });
}

void GeluBackwardBiasGrad(const Tensor& a, const Tensor& dy, Tensor& dx, Tensor& dbias, float beta) {
  const int64_t rows[1] = {dy.dim(0)};
  Tensor grouped = dbias.Reshape({1, dbias.dim(0)});
  GroupedActBackwardBiasGrad(a, nullptr, dy, dx, nullptr, rows, grouped, beta);
}

void SwigluBackwardBiasGrad(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da,
                            Tensor& db, Tensor& dbias, float beta) {
  const int64_t rows[1] = {dout.dim(0)};
  Tensor grouped = dbias.Reshape({1, dbias.dim(0)});
  GroupedActBackwardBiasGrad(a, &b, dout, da, &db, rows, grouped, beta);
}

}  // namespace switchyard::kernels::cpu
