#include "kernels/gemm.h"

namespace switchyard::kernels {
namespace {

void CheckCpuF32(const Tensor& t, const char* what) {
  SY_CHECK(t.device().is_cpu()) << what << " on " << t.device()
                                << ": CUDA matrix products land with the CUDA backend";
  SY_CHECK_EQ(t.dtype(), DType::kF32) << what;
}

}  // namespace

void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
          float beta, DeviceContext* ctx) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&a, &b, &c}) {
    CheckCpuF32(*t, "Gemm");
    SY_CHECK_EQ(t->ndim(), 2) << "Gemm operands are 2-d, got " << ShapeString(t->shape());
  }
  const int64_t m = trans_a ? a.dim(1) : a.dim(0);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  const int64_t kb = trans_b ? b.dim(1) : b.dim(0);
  const int64_t n = trans_b ? b.dim(0) : b.dim(1);
  SY_CHECK(k == kb && c.dim(0) == m && c.dim(1) == n)
      << "Gemm shapes: a " << ShapeString(a.shape()) << (trans_a ? "^T" : "") << ", b "
      << ShapeString(b.shape()) << (trans_b ? "^T" : "") << ", c " << ShapeString(c.shape());
  cpu::Sgemm(trans_a, trans_b, m, n, k, alpha, a.data<float>(), a.dim(1), b.data<float>(),
             b.dim(1), beta, c.data<float>(), n);
}

void GroupedGemm(const Tensor& x, std::span<const int64_t> rows, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha, float beta, DeviceContext* ctx) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &w, &out}) CheckCpuF32(*t, "GroupedGemm");
  SY_CHECK(x.ndim() == 2 && w.ndim() == 3 && out.ndim() == 2 &&
           w.dim(0) == static_cast<int64_t>(rows.size()))
      << "GroupedGemm shapes: x " << ShapeString(x.shape()) << ", w " << ShapeString(w.shape())
      << ", out " << ShapeString(out.shape()) << ", " << rows.size() << " groups";
  const int64_t k = x.dim(1), n = out.dim(1);
  SY_CHECK(trans_w ? (w.dim(1) == n && w.dim(2) == k) : (w.dim(1) == k && w.dim(2) == n))
      << "GroupedGemm: w " << ShapeString(w.shape()) << (trans_w ? "^T" : "") << " for k=" << k
      << ", n=" << n;
  int64_t begin = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t r = rows[g];
    SY_CHECK(r >= 0 && begin + r <= x.dim(0)) << "GroupedGemm: rows exceed x";
    cpu::Sgemm(false, trans_w, r, n, k, alpha, x.data<float>() + begin * k, k,
               w.data<float>() + static_cast<int64_t>(g) * k * n, trans_w ? k : n, beta,
               out.data<float>() + begin * n, n);
    begin += r;
  }
  SY_CHECK_EQ(begin, x.dim(0)) << "GroupedGemm: rows do not cover x";
}

void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> rows,
                           Tensor& dw, float alpha, float beta, DeviceContext* ctx) {
  for (const Tensor* t : std::initializer_list<const Tensor*>{&x, &dy, &dw}) CheckCpuF32(*t, "GroupedGemmWeightGrad");
  const int64_t k = x.dim(1), n = dy.dim(1);
  SY_CHECK(x.ndim() == 2 && dy.ndim() == 2 && dw.ndim() == 3 && x.dim(0) == dy.dim(0) &&
           dw.dim(0) == static_cast<int64_t>(rows.size()) && dw.dim(1) == k && dw.dim(2) == n)
      << "GroupedGemmWeightGrad shapes: x " << ShapeString(x.shape()) << ", dy "
      << ShapeString(dy.shape()) << ", dw " << ShapeString(dw.shape());
  int64_t begin = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t r = rows[g];
    cpu::Sgemm(true, false, k, n, r, alpha, x.data<float>() + begin * k, k,
               dy.data<float>() + begin * n, n, beta,
               dw.data<float>() + static_cast<int64_t>(g) * k * n, n);
    begin += r;
  }
  SY_CHECK_EQ(begin, x.dim(0)) << "GroupedGemmWeightGrad: rows do not cover x";
}

}  // namespace switchyard::kernels
