// CUDA implementation of kernels/gemm.h on cuBLAS. Row-major c (m, n) = op(a) op(b) is the
// column-major c^T (n, m) = op(b)^T op(a)^T, and a row-major matrix with leading dimension ld
// is its own transpose in column-major order with the same ld, so every product is one
// cublasGemmEx with the operands swapped and no data moved. f32 mode: f32 operands with
// CUBLAS_COMPUTE_32F (no TF32: the result matches sgemm to f32 rounding). bf16 mode: f32
// operands are rounded to bf16 copies (stream-ordered temporaries, one per operand per
// call), then bf16 x bf16 products summed in f32 into the f32 output, or into a bf16 output
// (beta 0: cuBLAS rounds the f32 result once as it writes it).
//
// GemmBias (a Linear layer's forward) runs on cuBLASLt with the bias added in the product's
// epilogue (CUBLASLT_EPILOGUE_BIAS: the bias is a vector over the rows of the column-major
// c^T, i.e. over row-major c's columns). Each shape's plan (descriptors and the algorithm
// the heuristic picks for the operands' alignment) is looked up once and kept; a shape
// cuBLASLt offers nothing for runs as Gemm then the bias add, said once on stderr.
#include <cublasLt.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <tuple>

#include "kernels/activation.h"
#include "kernels/cuda/common.cuh"
#include "kernels/elementwise.h"
#include "kernels/gemm.h"

namespace switchyard::kernels::cuda {
namespace {

// out[i] = bf16(in[i]), round to nearest even.
__global__ void CastToBf16Kernel(const float* in, __nv_bfloat16* out, int64_t n) {
  SY_GRID_STRIDE(i, n) { out[i] = ToBf16(in[i]); }
}

// x[i] = beta * x[i]; beta = 0 writes 0 without reading x (as BLAS does for beta = 0).
__global__ void ScaleKernel(float* x, int64_t n, float beta) {
  SY_GRID_STRIDE(i, n) { x[i] = beta == 0.0f ? 0.0f : beta * x[i]; }
}

// x (n) *= beta on the stream; nothing to do for beta = 1.
void Scale(float* x, int64_t n, float beta, DeviceContext* ctx) {
  if (n == 0 || beta == 1.0f) return;
  ScaleKernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(x, n, beta);
  SY_CUDA_CHECK_LAUNCH();
}

// One GEMM operand as cuBLAS reads it. `holder` keeps a bf16 copy alive until the host
// leaves the op; the caching allocator orders its reuse after the queued GEMMs (one stream).
struct Operand {
  const char* base = nullptr;
  cudaDataType_t type = CUDA_R_32F;
  Tensor holder;

  size_t ElementBytes() const { return type == CUDA_R_16BF ? 2 : 4; }
  // The address of element `offset` (row-major, in elements).
  const void* At(int64_t offset) const { return base + offset * static_cast<int64_t>(ElementBytes()); }
};

// t as cuBLAS will read it: as it is (f32 in f32 mode, or already bf16), or a bf16 copy.
Operand Prepare(const Tensor& t, DType matmul_dtype, DeviceContext* ctx) {
  Operand op;
  if (t.dtype() == DType::kBF16) {
    op.base = static_cast<const char*>(t.raw_data());
    op.type = CUDA_R_16BF;
    return op;
  }
  SY_CHECK(t.dtype() == DType::kF32) << "GEMM operand of " << DTypeName(t.dtype());
  if (matmul_dtype != DType::kBF16) {
    op.base = static_cast<const char*>(t.raw_data());
    op.type = CUDA_R_32F;
    return op;
  }
  const int64_t n = t.numel();
  op.holder = Tensor::Empty(t.shape(), DType::kBF16, t.device());
  op.base = static_cast<const char*>(op.holder.raw_data());
  op.type = CUDA_R_16BF;
  CastToBf16Kernel<<<GridFor(n), 256, 0, StreamOf(ctx)>>>(
      static_cast<const float*>(t.raw_data()), static_cast<__nv_bfloat16*>(op.holder.raw_data()),
      n);
  SY_CUDA_CHECK_LAUNCH();
  return op;
}

int Int(int64_t v, const char* what) {
  SY_CHECK(v >= 0 && v <= INT_MAX) << "cuBLAS GEMM: " << what << " = " << v
                                   << " does not fit a 32-bit int";
  return static_cast<int>(v);
}

// Row-major c (m, n) = alpha op(a) op(b) + beta c (m, n, k >= 1; leading dimensions in
// elements), as the column-major c^T = op(b)^T op(a)^T. a and b of one type (f32 or
// bf16), c f32 (or bf16, with bf16 operands: c_type), f32 accumulation.
void RowMajorGemm(DeviceContext* ctx, bool trans_a, bool trans_b, int64_t m, int64_t n,
                  int64_t k, float alpha, const void* a, int64_t lda, const void* b, int64_t ldb,
                  cudaDataType_t type, float beta, void* c, int64_t ldc,
                  cudaDataType_t c_type = CUDA_R_32F) {
  SY_CUBLAS_CHECK(Cublas().GemmEx(CublasOf(ctx), trans_b ? CUBLAS_OP_T : CUBLAS_OP_N,
                                  trans_a ? CUBLAS_OP_T : CUBLAS_OP_N, Int(n, "n"), Int(m, "m"),
                                  Int(k, "k"), &alpha, b, type, Int(ldb, "ldb"), a, type,
                                  Int(lda, "lda"), &beta, c, c_type, Int(ldc, "ldc"),
                                  CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
}

void CheckSameType(const Operand& a, const Operand& b) {
  SY_CHECK(a.type == b.type) << "cuBLAS GEMM operands of different types: an op with a bf16 "
                                "operand must run in bf16 mode (kernels/gemm.cc resolves it)";
}

constexpr int kExactTile = 16;

// RowExactGemm: a 16 x 16 tile of c per block (rows along the grid's x), one element per thread, a and b staged
// through shared memory 16 columns of k at a time; each thread sums its products in
// ascending p with explicit round-to-nearest multiply and add (no FMA), as the CPU does.
__global__ void RowExactGemmKernel(const float* a, const float* b, float* c, int64_t m,
                                   int64_t n, int64_t k) {
  __shared__ float as[kExactTile][kExactTile];
  __shared__ float bs[kExactTile][kExactTile + 1];
  const int64_t row = static_cast<int64_t>(blockIdx.x) * kExactTile + threadIdx.y;
  const int64_t col = static_cast<int64_t>(blockIdx.y) * kExactTile + threadIdx.x;
  float acc = 0.0f;
  for (int64_t p0 = 0; p0 < k; p0 += kExactTile) {
    const int64_t pa = p0 + threadIdx.x, pb = p0 + threadIdx.y;
    as[threadIdx.y][threadIdx.x] = row < m && pa < k ? a[row * k + pa] : 0.0f;
    bs[threadIdx.y][threadIdx.x] = pb < k && col < n ? b[pb * n + col] : 0.0f;
    __syncthreads();
    const int steps = k - p0 < kExactTile ? static_cast<int>(k - p0) : kExactTile;
    for (int p = 0; p < steps; ++p)
      acc = __fadd_rn(acc, __fmul_rn(as[threadIdx.y][p], bs[p][threadIdx.x]));
    __syncthreads();
  }
  if (row < m && col < n) c[row * n + col] = acc;
}

// ---- cuBLASLt with the bias in the epilogue ---------------------------------------------

constexpr size_t kLtWorkspace = size_t{4} << 20;  // bytes cuBLASLt may use (the context's)

// The largest power of two (at most 256) dividing every address: what the heuristic may
// assume of the operands' alignment.
uint32_t AlignmentOf(std::initializer_list<const void*> ptrs) {
  uint32_t align = 256;
  for (const void* p : ptrs) {
    while (align > 1 && reinterpret_cast<uintptr_t>(p) % align != 0) align /= 2;
  }
  return align;
}

struct LtKey {
  int device;
  bool trans_a, trans_b;
  int64_t m, n, k, lda, ldb;
  cudaDataType_t type, out_type;  // the operands', and c's (f32, or bf16 with bf16 operands)
  uint32_t align;
  bool operator<(const LtKey& o) const {
    return std::tie(device, trans_a, trans_b, m, n, k, lda, ldb, type, out_type, align) <
           std::tie(o.device, o.trans_a, o.trans_b, o.m, o.n, o.k, o.lda, o.ldb, o.type,
                    o.out_type, o.align);
  }
};

// One shape's product as cuBLASLt runs it: c^T (n, m) = op(b^T) op(a^T), b's matrix first.
struct LtPlan {
  bool ok = false;  // the heuristic offered an algorithm
  cublasLtMatmulDesc_t desc = nullptr;
  cublasLtMatrixLayout_t first = nullptr, second = nullptr, out = nullptr;
  cublasLtMatmulAlgo_t algo{};
};

struct LtState {
  std::mutex mu;
  std::map<int, cublasLtHandle_t> handles;  // per device, for the process's life
  std::map<LtKey, LtPlan> plans;
};
LtState& Lt() {
  static LtState* state = new LtState();
  return *state;
}

bool LtEnabled() {
  static const bool enabled = EnvSwitch("SWITCHYARD_CUBLASLT", true);
  return enabled;
}

// The plan for `key` (made at its first use); call with Lt().mu held.
LtPlan& PlanFor(const LtKey& key, cublasLtHandle_t handle) {
  auto [it, fresh] = Lt().plans.try_emplace(key);
  LtPlan& p = it->second;
  if (!fresh) return p;
  const CublasApi& api = Cublas();
  const cublasOperation_t op_first = key.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;
  const cublasOperation_t op_second = key.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;
  SY_CUBLAS_CHECK(api.LtMatmulDescCreate(&p.desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
  SY_CUBLAS_CHECK(api.LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_first,
                                               sizeof(op_first)));
  SY_CUBLAS_CHECK(api.LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_second,
                                               sizeof(op_second)));
  const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
  SY_CUBLAS_CHECK(api.LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue,
                                               sizeof(epilogue)));
  const cudaDataType_t bias_type = CUDA_R_32F;
  SY_CUBLAS_CHECK(api.LtMatmulDescSetAttribute(p.desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE,
                                               &bias_type, sizeof(bias_type)));
  // Column-major shapes: b (k, n) row-major is (n, k) with ld ldb, or b (n, k) is (k, n);
  // a (m, k) row-major is (k, m) with ld lda, or a (k, m) is (m, k); c^T is (n, m), ld n.
  SY_CUBLAS_CHECK(api.LtMatrixLayoutCreate(&p.first, key.type, key.trans_b ? key.k : key.n,
                                           key.trans_b ? key.n : key.k, key.ldb));
  SY_CUBLAS_CHECK(api.LtMatrixLayoutCreate(&p.second, key.type, key.trans_a ? key.m : key.k,
                                           key.trans_a ? key.k : key.m, key.lda));
  SY_CUBLAS_CHECK(api.LtMatrixLayoutCreate(&p.out, key.out_type, key.n, key.m, key.n));
  cublasLtMatmulPreference_t pref = nullptr;
  SY_CUBLAS_CHECK(api.LtMatmulPreferenceCreate(&pref));
  const uint64_t workspace = kLtWorkspace;
  SY_CUBLAS_CHECK(api.LtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                     &workspace, sizeof(workspace)));
  for (auto attr : {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES,
                    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES}) {
    SY_CUBLAS_CHECK(api.LtMatmulPreferenceSetAttribute(pref, attr, &key.align, sizeof(key.align)));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t status = api.LtMatmulAlgoGetHeuristic(
      handle, p.desc, p.first, p.second, p.out, p.out, pref, 1, &result, &found);
  SY_CUBLAS_CHECK(api.LtMatmulPreferenceDestroy(pref));
  p.ok = status == CUBLAS_STATUS_SUCCESS && found > 0;
  if (p.ok) {
    p.algo = result.algo;
  } else {
    std::fprintf(stderr,
                 "GemmBias: cuBLASLt offers no algorithm for m %lld n %lld k %lld into %s (%s); "
                 "this shape runs %s\n",
                 static_cast<long long>(key.m), static_cast<long long>(key.n),
                 static_cast<long long>(key.k), key.out_type == CUDA_R_16BF ? "bf16" : "f32",
                 api.GetStatusName(status),
                 key.out_type == CUDA_R_16BF ? "into f32, then a cast to bf16"
                                             : "as the product then the bias add");
  }
  return p;
}

// c = op(a) op(b) + bias on cuBLASLt; false when it has no algorithm for the shape.
bool LtGemmBias(DeviceContext* ctx, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                const Operand& a, int64_t lda, const Operand& b, int64_t ldb, const float* bias,
                void* c, cudaDataType_t c_type) {
  const LtKey key{ctx->device().index, trans_a, trans_b, m, n, k, lda, ldb, a.type, c_type,
                  AlignmentOf({a.base, b.base, c, bias})};
  LtState& lt = Lt();
  std::lock_guard<std::mutex> lock(lt.mu);
  cublasLtHandle_t& handle = lt.handles[key.device];
  if (handle == nullptr) SY_CUBLAS_CHECK(Cublas().LtCreate(&handle));
  LtPlan& plan = PlanFor(key, handle);
  if (!plan.ok) return false;
  void* workspace = ctx->Workspace(kLtWorkspace);
  SY_CUBLAS_CHECK(Cublas().LtMatmulDescSetAttribute(plan.desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER,
                                                    &bias, sizeof(bias)));
  const float alpha = 1.0f, beta = 0.0f;
  const cublasStatus_t status = Cublas().LtMatmul(
      handle, plan.desc, &alpha, b.base, plan.first, a.base, plan.second, &beta, c, plan.out, c,
      plan.out, &plan.algo, workspace, kLtWorkspace, StreamOf(ctx));
  if (status != CUBLAS_STATUS_SUCCESS) {
    // An algorithm the heuristic offered but the call refuses: this shape takes the product
    // and the bias add apart from now on (said once), rather than ending the run.
    plan.ok = false;
    SY_LOG(WARNING) << "cuBLASLt refused the bias product " << m << " x " << n << " x " << k << " ("
                    << Cublas().GetStatusString(status)
                    << "): the product and the bias add run apart for this shape";
    return false;
  }
  return true;
}

}  // namespace

void GemmBias(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, const Tensor& bias,
              Tensor& c, DType matmul_dtype, DeviceContext* ctx) {
  const int64_t m = c.dim(0), n = c.dim(1);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  if (m == 0 || n == 0) return;
  // cuBLASLt takes alignment hints for the matrices, not the bias: a bias off 16 bytes (a view
  // into a larger tensor) takes the unfused path rather than risk a kernel that assumes it.
  const bool bias_aligned = reinterpret_cast<uintptr_t>(bias.raw_data()) % 16 == 0;
  if (k > 0 && LtEnabled() && bias_aligned) {
    const Operand pa = Prepare(a, matmul_dtype, ctx), pb = Prepare(b, matmul_dtype, ctx);
    CheckSameType(pa, pb);
    if (LtGemmBias(ctx, trans_a, trans_b, m, n, k, pa, a.dim(1), pb, b.dim(1),
                   bias.data<float>(), c.raw_data(),
                   c.dtype() == DType::kBF16 ? CUDA_R_16BF : CUDA_R_32F)) {
      return;
    }
    if (c.dtype() == DType::kBF16) {
      // No bf16 output beside the f32 bias for this shape: the f32 epilogue, then the cast
      // (the f32 result rounded once all the same).
      Tensor f32 = Tensor::Empty(c.shape(), DType::kF32, c.device());
      if (LtGemmBias(ctx, trans_a, trans_b, m, n, k, pa, a.dim(1), pb, b.dim(1),
                     bias.data<float>(), f32.raw_data(), CUDA_R_32F)) {
        Cast(f32, c, ctx);
        return;
      }
    }
  }
  // The product then the bias add, in f32 (a bf16 c: into a temporary, rounded once after).
  Tensor f32 = c.dtype() == DType::kF32 ? c : Tensor::Empty(c.shape(), DType::kF32, c.device());
  Gemm(a, trans_a, b, trans_b, f32, 1.0f, 0.0f, matmul_dtype, ctx);
  AddBias(f32, bias, ctx);
  if (c.dtype() == DType::kBF16) Cast(f32, c, ctx);
}

void RowExactGemm(const Tensor& a, const Tensor& b, Tensor& c, DeviceContext* ctx) {
  const int64_t m = a.dim(0), k = a.dim(1), n = b.dim(1);
  if (m == 0 || n == 0) return;
  SY_CHECK((n + kExactTile - 1) / kExactTile <= 65535)
      << "RowExactGemm: " << n << " columns exceed the grid's y limit";
  const dim3 block(kExactTile, kExactTile);
  const dim3 grid(static_cast<unsigned>((m + kExactTile - 1) / kExactTile),
                  static_cast<unsigned>((n + kExactTile - 1) / kExactTile));
  RowExactGemmKernel<<<grid, block, 0, StreamOf(ctx)>>>(a.data<float>(), b.data<float>(),
                                                        c.data<float>(), m, n, k);
  SY_CUDA_CHECK_LAUNCH();
}

void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
          float beta, DType matmul_dtype, DeviceContext* ctx) {
  const int64_t m = c.dim(0), n = c.dim(1);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  if (m == 0 || n == 0) return;
  const bool bf16_c = c.dtype() == DType::kBF16;  // beta 0 (kernels/gemm.cc checks)
  if (k == 0) {
    if (bf16_c) return Fill(c, 0.0f, ctx);
    Scale(c.data<float>(), m * n, beta, ctx);
    return;
  }
  const Operand pa = Prepare(a, matmul_dtype, ctx), pb = Prepare(b, matmul_dtype, ctx);
  CheckSameType(pa, pb);
  RowMajorGemm(ctx, trans_a, trans_b, m, n, k, alpha, pa.base, a.dim(1), pb.base, b.dim(1),
               pa.type, beta, c.raw_data(), n, bf16_c ? CUDA_R_16BF : CUDA_R_32F);
}

void GroupedGemm(const Tensor& x, std::span<const int64_t> rows, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha, float beta, DType matmul_dtype, DeviceContext* ctx) {
  const int64_t k = x.dim(1), n = out.dim(1);
  if (x.dim(0) == 0 || n == 0) return;
  float* po = out.data<float>();
  if (k == 0) {
    Scale(po, out.numel(), beta, ctx);
    return;
  }
  // One cast of all of x and all of w per call (not per group).
  const Operand px = Prepare(x, matmul_dtype, ctx), pw = Prepare(w, matmul_dtype, ctx);
  CheckSameType(px, pw);
  int64_t begin = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t r = rows[g];
    if (r > 0) {
      // out[block g] (r, n) = x[block g] (r, k) @ op(w[g]), w[g] (k, n) or (n, k).
      RowMajorGemm(ctx, false, trans_w, r, n, k, alpha, px.At(begin * k), k,
                   pw.At(static_cast<int64_t>(g) * k * n), trans_w ? k : n, px.type, beta,
                   po + begin * n, n);
    }
    begin += r;
  }
}

void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> rows,
                           Tensor& dw, float alpha, float beta, DType matmul_dtype,
                           DeviceContext* ctx) {
  const int64_t k = x.dim(1), n = dy.dim(1);
  if (k == 0 || n == 0) return;  // dw is empty
  float* pdw = dw.data<float>();
  Operand px, pdy;
  if (x.dim(0) > 0) {
    px = Prepare(x, matmul_dtype, ctx);
    pdy = Prepare(dy, matmul_dtype, ctx);
    CheckSameType(px, pdy);
  }
  int64_t begin = 0;
  for (size_t g = 0; g < rows.size(); ++g) {
    const int64_t r = rows[g];
    float* dwg = pdw + static_cast<int64_t>(g) * k * n;
    if (r == 0) {
      Scale(dwg, k * n, beta, ctx);  // no rows: dw[g] = beta * dw[g]
    } else {
      // dw[g] (k, n) = x[block g]^T (k, r) @ dy[block g] (r, n).
      RowMajorGemm(ctx, true, false, k, n, r, alpha, px.At(begin * k), k, pdy.At(begin * n), n,
                   px.type, beta, dwg, n);
    }
    begin += r;
  }
}

}  // namespace switchyard::kernels::cuda
