// CPU reference implementation of kernels/activation.h: plain loops over f32 elements.
// Every element is read before it is written, so outputs may alias inputs.
#include "kernels/activation.h"

#include <cmath>
#include <initializer_list>

namespace switchyard::kernels {
namespace {

constexpr float kSqrt2OverPi = 0.79788456080286535588f;  // sqrt(2 / pi)
constexpr float kGeluCubic = 0.044715f;

void CheckCpuF32(const Tensor& t, const char* op) {
  SY_CHECK(t.defined()) << op << ": undefined tensor";
  SY_CHECK(t.device().is_cpu()) << op << " on " << t.device()
                                << ": CUDA activation kernels land with the CUDA backend";
  SY_CHECK_EQ(t.dtype(), DType::kF32) << op;
}

// Checks that every tensor is host f32 and has the shape of the first.
void CheckElementwise(const char* op, std::initializer_list<const Tensor*> tensors) {
  const Tensor& first = **tensors.begin();
  for (const Tensor* t : tensors) {
    CheckCpuF32(*t, op);
    SY_CHECK(t->shape() == first.shape())
        << op << ": shapes " << ShapeString(first.shape()) << " and " << ShapeString(t->shape());
  }
}

// Checks out (R, n) against a per-group bias (G, n) and rows (G counts summing to R).
void CheckGroupedBias(const char* op, const Tensor& rowwise, std::span<const int64_t> rows,
                      const Tensor& bias) {
  CheckCpuF32(rowwise, op);
  CheckCpuF32(bias, op);
  SY_CHECK(rowwise.ndim() == 2 && bias.ndim() == 2 &&
           bias.dim(0) == static_cast<int64_t>(rows.size()) && bias.dim(1) == rowwise.dim(1))
      << op << " shapes: rows-tensor " << ShapeString(rowwise.shape()) << ", bias "
      << ShapeString(bias.shape()) << ", " << rows.size() << " groups";
  int64_t total = 0;
  for (int64_t r : rows) {
    SY_CHECK_GE(r, 0) << op << ": negative group size";
    total += r;
  }
  SY_CHECK_EQ(total, rowwise.dim(0)) << op << ": rows do not cover the tensor";
}

inline float Sigmoid(float a) { return 1.0f / (1.0f + std::exp(-a)); }

}  // namespace

void GeluForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  CheckElementwise("GeluForward", {&x, &y});
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = x.numel();
  // 0.5 (1 + tanh u) = sigmoid(2 u): one expf instead of a tanhf (about 3x cheaper here).
  for (int64_t i = 0; i < n; ++i) {
    const float v = px[i];
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    py[i] = v / (1.0f + std::exp(-2.0f * u));
  }
}

void GeluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  CheckElementwise("GeluBackward", {&x, &dy, &dx});
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float v = px[i];
    const float u = kSqrt2OverPi * (v + kGeluCubic * v * v * v);
    // With s = sigmoid(2 u) = 0.5 (1 + tanh u) and 1 - tanh^2 u = 4 s (1 - s):
    // d/dx [x s] = s + 2 x s (1 - s) du/dx.
    const float s = 1.0f / (1.0f + std::exp(-2.0f * u));
    const float du = kSqrt2OverPi * (1.0f + 3.0f * kGeluCubic * v * v);
    pdx[i] = pdy[i] * (s + 2.0f * v * s * (1.0f - s) * du);
  }
}

void ReluForward(const Tensor& x, Tensor& y, DeviceContext* ctx) {
  CheckElementwise("ReluForward", {&x, &y});
  const float* px = x.data<float>();
  float* py = y.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) py[i] = px[i] > 0.0f ? px[i] : 0.0f;
}

void ReluBackward(const Tensor& x, const Tensor& dy, Tensor& dx, DeviceContext* ctx) {
  CheckElementwise("ReluBackward", {&x, &dy, &dx});
  const float* px = x.data<float>();
  const float* pdy = dy.data<float>();
  float* pdx = dx.data<float>();
  const int64_t n = x.numel();
  for (int64_t i = 0; i < n; ++i) pdx[i] = px[i] > 0.0f ? pdy[i] : 0.0f;
}

void SwigluForward(const Tensor& a, const Tensor& b, Tensor& out, DeviceContext* ctx) {
  CheckElementwise("SwigluForward", {&a, &b, &out});
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* po = out.data<float>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float va = pa[i];
    po[i] = va * Sigmoid(va) * pb[i];
  }
}

void SwigluBackward(const Tensor& a, const Tensor& b, const Tensor& dout, Tensor& da, Tensor& db,
                    DeviceContext* ctx) {
  CheckElementwise("SwigluBackward", {&a, &b, &dout, &da, &db});
  SY_CHECK(da.numel() == 0 || da.raw_data() != db.raw_data())
      << "SwigluBackward: da and db are the same memory";
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  const float* pdo = dout.data<float>();
  float* pda = da.data<float>();
  float* pdb = db.data<float>();
  const int64_t n = a.numel();
  for (int64_t i = 0; i < n; ++i) {
    const float va = pa[i], vb = pb[i], g = pdo[i];
    const float s = Sigmoid(va);
    pda[i] = g * vb * s * (1.0f + va * (1.0f - s));
    pdb[i] = g * va * s;
  }
}

void AddBias(Tensor& out, const Tensor& bias, DeviceContext* ctx) {
  SY_CHECK_EQ(bias.ndim(), 1) << "AddBias: bias " << ShapeString(bias.shape());
  SY_CHECK_EQ(out.ndim(), 2) << "AddBias: out " << ShapeString(out.shape());
  const int64_t rows[1] = {out.dim(0)};
  GroupedAddBias(out, rows, bias.Reshape({1, bias.dim(0)}), ctx);
}

void BiasGrad(const Tensor& dy, Tensor& dbias, float beta, DeviceContext* ctx) {
  SY_CHECK_EQ(dbias.ndim(), 1) << "BiasGrad: dbias " << ShapeString(dbias.shape());
  SY_CHECK_EQ(dy.ndim(), 2) << "BiasGrad: dy " << ShapeString(dy.shape());
  const int64_t rows[1] = {dy.dim(0)};
  Tensor grouped = dbias.Reshape({1, dbias.dim(0)});
  GroupedBiasGrad(dy, rows, grouped, beta, ctx);
}

void GroupedAddBias(Tensor& out, std::span<const int64_t> rows, const Tensor& bias,
                    DeviceContext* ctx) {
  CheckGroupedBias("GroupedAddBias", out, rows, bias);
  const int64_t n = out.dim(1);
  float* po = out.data<float>();
  const float* pb = bias.data<float>();
  int64_t r = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const float* bg = pb + static_cast<int64_t>(g) * n;
    for (int64_t end = r + rows[g]; r < end; ++r) {
      float* row = po + r * n;
      for (int64_t j = 0; j < n; ++j) row[j] += bg[j];
    }
  }
}

void GroupedBiasGrad(const Tensor& dy, std::span<const int64_t> rows, Tensor& dbias, float beta,
                     DeviceContext* ctx) {
  CheckGroupedBias("GroupedBiasGrad", dy, rows, dbias);
  const int64_t n = dy.dim(1);
  const float* pdy = dy.data<float>();
  float* pdb = dbias.data<float>();
  int64_t r = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    float* dg = pdb + static_cast<int64_t>(g) * n;
    for (int64_t j = 0; j < n; ++j) dg[j] = beta == 0.0f ? 0.0f : beta * dg[j];
    for (int64_t end = r + rows[g]; r < end; ++r) {
      const float* row = pdy + r * n;
      for (int64_t j = 0; j < n; ++j) dg[j] += row[j];
    }
  }
}

}  // namespace switchyard::kernels
