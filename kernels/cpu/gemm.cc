// CPU reference implementation of kernels/gemm.h: OpenBLAS sgemm. In bf16 mode the operands
// are first rounded to bf16-representable f32 values (bf16 tensors are widened), so the
// products and sums are exactly those of the GPU's bf16 inputs with f32 accumulation, up to
// summation order. A build without OpenBLAS (SWITCHYARD_BLAS=OFF: the GPU machine's build,
// whose CPU side is only the tests' reference) uses the blocked loop below instead.
#ifdef SY_HAVE_BLAS
#include <cblas.h>
extern "C" void openblas_set_num_threads(int num_threads);
// OpenBLAS's work buffers (driver/others/memory.c), which its shared library exports; weak,
// so that another BLAS links as well (then nothing is reserved).
extern "C" void* blas_memory_alloc(int procpos) __attribute__((weak));
extern "C" void blas_memory_free(void* buffer) __attribute__((weak));
#endif

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <vector>

#include "engine/core/allocator.h"
#include "engine/core/thread_pool.h"
#include "kernels/cpu/rows.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/gemm.h"

namespace switchyard::kernels::cpu {
namespace {

// The f32 values the products read from t: t itself (f32 mode), a copy rounded to bf16
// (bf16 mode), or t widened (a bf16 tensor). `scratch` owns any copy.
const float* F32Operand(const Tensor& t, DType matmul_dtype, std::vector<float>& scratch) {
  const int64_t n = t.numel();
  if (t.dtype() == DType::kBF16) {
    const BFloat16* src = t.data<BFloat16>();
    scratch.resize(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) scratch[i] = static_cast<float>(src[i]);
    return scratch.data();
  }
  const float* src = t.data<float>();
  if (matmul_dtype != DType::kBF16) return src;
  scratch.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) scratch[i] = BFloat16::ToFloat(BFloat16::FromFloat(src[i]));
  return scratch.data();
}

#ifndef SY_HAVE_BLAS
// c = alpha * op(a) op(b) + beta * c without BLAS: op(b) is packed row-major into a
// (k, n) panel once, then each row of c accumulates a row of op(a) times the panel in f32,
// k in blocks so the panel rows stay in cache. Correct for any sizes; a few GFLOP/s.
void LoopSgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
               const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
               int64_t ldc) {
  std::vector<float> panel(static_cast<size_t>(k * n));
  for (int64_t p = 0; p < k; ++p)
    for (int64_t j = 0; j < n; ++j) panel[p * n + j] = trans_b ? b[j * ldb + p] : b[p * ldb + j];
  std::vector<float> acc(static_cast<size_t>(n));
  constexpr int64_t kBlock = 256;
  for (int64_t i = 0; i < m; ++i) {
    std::fill(acc.begin(), acc.end(), 0.0f);
    for (int64_t p0 = 0; p0 < k; p0 += kBlock) {
      const int64_t p1 = std::min(k, p0 + kBlock);
      for (int64_t p = p0; p < p1; ++p) {
        const float av = trans_a ? a[p * lda + i] : a[i * lda + p];
        const float* row = panel.data() + p * n;
        for (int64_t j = 0; j < n; ++j) acc[j] += av * row[j];
      }
    }
    float* ci = c + i * ldc;
    for (int64_t j = 0; j < n; ++j) ci[j] = alpha * acc[j] + (beta == 0.0f ? 0.0f : beta * ci[j]);
  }
}
#endif

#ifdef SY_HAVE_BLAS
// OpenBLAS (0.3.21, Debian 12) takes a work buffer of 128 MiB of address space for each
// product that runs while others hold theirs, keeps it for later products, and retries
// forever when the allocation fails: under an address-space limit (ulimit -v, a batch
// system's virtual-memory limit) a product would hang. So before the first product of a
// thread count, as many buffers as the compute threads can hold at once are taken and given
// back (OpenBLAS keeps them), once the memory is known to be there: if it is not, the process
// ends with one line and exit 5 (ExitNoWorkMemory) instead of hanging.
constexpr size_t kBlasBufferProbe = (size_t{129} << 20);  // the buffer and its header
std::atomic<int> g_blas_buffers{0};

void ReserveBlasBuffers(int users) {
  static std::mutex mutex;
  std::lock_guard<std::mutex> lock(mutex);
  if (users <= g_blas_buffers.load(std::memory_order_relaxed)) return;
  if (blas_memory_alloc != nullptr && blas_memory_free != nullptr) {
    std::vector<void*> held;
    for (int i = 0; i < users; ++i) {
      void* p = std::malloc(kBlasBufferProbe);
      if (p == nullptr) {
        for (void* q : held) std::free(q);
        const std::string what = "OpenBLAS's work buffers (128 MiB for each of " +
                                 std::to_string(users) + " compute threads)";
        ExitNoWorkMemory(what.c_str(), kBlasBufferProbe * users);
      }
      held.push_back(p);
    }
    for (void* p : held) std::free(p);
    held.clear();
    for (int i = 0; i < users; ++i) held.push_back(blas_memory_alloc(0));
    for (void* p : held) blas_memory_free(p);
  }
  g_blas_buffers.store(users, std::memory_order_release);
}
#endif

// One product on the calling thread.
void SgemmOnThisThread(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                       const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                       float* c, int64_t ldc) {
#ifdef SY_HAVE_BLAS
  // OpenBLAS runs on the calling thread only: the compute pool (engine/core/thread_pool.h) is
  // the process's one set of threads, and it splits the large products below.
  static const bool single = (openblas_set_num_threads(1), true);
  (void)single;
  const int users = ComputeThreads();
  if (g_blas_buffers.load(std::memory_order_acquire) < users) ReserveBlasBuffers(users);
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), alpha, a,
              static_cast<blasint>(lda), b, static_cast<blasint>(ldb), beta, c,
              static_cast<blasint>(ldc));
#else
  LoopSgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
#endif
}

// Calls fn(g, first_row_of_g, whole) for every group, under `schedule` (kAuto:
// GroupScheduleFor(rows)). kWhole: the groups are spread over the compute threads in
// contiguous runs of about equal rows and each product runs whole on one thread (many small
// products keep both cores busy without splitting each one), whole = true; kSplit: they run
// one after another and Sgemm splits each large product, whole = false.
template <typename F>
void ForEachGroup(std::span<const int64_t> rows, GroupSchedule schedule, F&& fn) {
  std::vector<int64_t> first(rows.size() + 1, 0);
  for (size_t g = 0; g < rows.size(); ++g) first[g + 1] = first[g] + rows[g];
  const int64_t total = first.back();
  if (schedule == GroupSchedule::kAuto) schedule = GroupScheduleFor(rows);
  const int threads = InParallelRegion() ? 1 : ComputeThreads();
  if (schedule == GroupSchedule::kSplit || threads == 1 || total == 0) {
    const bool whole = schedule == GroupSchedule::kWhole;
    for (size_t g = 0; g < rows.size(); ++g)
      fn(g, first[g], whole);
    return;
  }
  ParallelFor(threads, 1, [&](int64_t t0, int64_t t1) {
    for (size_t g = 0; g < rows.size(); ++g) {
      const int64_t owner = std::min<int64_t>(threads - 1, (first[g] + rows[g] / 2) * threads / total);
      if (owner >= t0 && owner < t1) fn(g, first[g], true);
    }
  });
}

}  // namespace

void Sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // BLAS leaves c untouched for k = 0 only when beta = 1; be explicit.
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) c[i * ldc + j] = beta == 0.0f ? 0.0f : beta * c[i * ldc + j];
    return;
  }
  // A product of at least kSplitFlops is cut into blocks of whole kTile rows (when m >= n)
  // or columns of c, one per thread. Each element of c is still one dot product over the
  // whole of k (OpenBLAS may pick another kernel for a smaller block, so the last bits can
  // differ with the thread count, as with OpenBLAS's own threads).
  constexpr double kSplitFlops = 4e6;
  constexpr int64_t kTile = 16;
  if (2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) <
          kSplitFlops ||
      InParallelRegion() || ComputeThreads() == 1) {
    SgemmOnThisThread(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  if (m >= n) {
    ParallelFor((m + kTile - 1) / kTile, 1, [&](int64_t t0, int64_t t1) {
      const int64_t i0 = t0 * kTile, i1 = std::min(m, t1 * kTile);
      SgemmOnThisThread(trans_a, trans_b, i1 - i0, n, k, alpha, trans_a ? a + i0 : a + i0 * lda,
                        lda, b, ldb, beta, c + i0 * ldc, ldc);
    });
  } else {
    ParallelFor((n + kTile - 1) / kTile, 1, [&](int64_t t0, int64_t t1) {
      const int64_t j0 = t0 * kTile, j1 = std::min(n, t1 * kTile);
      SgemmOnThisThread(trans_a, trans_b, m, j1 - j0, k, alpha, a, lda,
                        trans_b ? b + j0 * ldb : b + j0, ldb, beta, c + j0, ldc);
    });
  }
}

void Gemm(const Tensor& a, bool trans_a, const Tensor& b, bool trans_b, Tensor& c, float alpha,
          float beta, DType matmul_dtype) {
  const int64_t m = c.dim(0), n = c.dim(1);
  const int64_t k = trans_a ? a.dim(0) : a.dim(1);
  std::vector<float> a_copy, b_copy;
  const float* pa = F32Operand(a, matmul_dtype, a_copy);
  const float* pb = F32Operand(b, matmul_dtype, b_copy);
  Sgemm(trans_a, trans_b, m, n, k, alpha, pa, a.dim(1), pb, b.dim(1), beta, c.data<float>(), n);
}

namespace {

// Rows [i0, i1) of c = a b, each element summed over p in order from +0, products and sums
// rounded separately (the build has -ffp-contract=off), vectorised across the row's n.
SY_VECTOR_CLONES void RowExactRows(const float* pa, const float* pb, float* pc, int64_t i0,
                                   int64_t i1, int64_t k, int64_t n) {
  for (int64_t i = i0; i < i1; ++i) {
    float* ci = pc + i * n;
    for (int64_t j = 0; j < n; ++j) ci[j] = 0.0f;
    for (int64_t p = 0; p < k; ++p) {
      const float av = pa[i * k + p];
      const float* row = pb + p * n;
      for (int64_t j = 0; j < n; ++j) ci[j] += av * row[j];
    }
  }
}

}  // namespace

void RowExactGemm(const Tensor& a, const Tensor& b, Tensor& c) {
  const int64_t m = a.dim(0), k = a.dim(1), n = b.dim(1);
  const float* pa = a.data<float>();
  const float* pb = b.data<float>();
  float* pc = c.data<float>();
  ParallelFor(m, RowsPerChunk(k * n, 65536),
              [&](int64_t i0, int64_t i1) { RowExactRows(pa, pb, pc, i0, i1, k, n); });
}

namespace {

// One group's product: whole on this thread, or through Sgemm (which may split it, and
// handles the empty cases).
void GroupSgemm(bool whole, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                float alpha, const float* a, int64_t lda, const float* b, int64_t ldb, float beta,
                float* c, int64_t ldc) {
  if (whole && m > 0 && n > 0 && k > 0) {
    SgemmOnThisThread(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  } else {
    Sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  }
}

}  // namespace

GroupSchedule GroupScheduleFor(std::span<const int64_t> rows) {
  int64_t total = 0, most = 0;
  for (int64_t r : rows) {
    total += r;
    most = std::max(most, r);
  }
  const int threads = InParallelRegion() ? 1 : ComputeThreads();
  if (threads == 1 || rows.size() < 2 || total == 0 || most * threads > total) {
    return GroupSchedule::kSplit;
  }
  return GroupSchedule::kWhole;
}

void GroupedGemm(const Tensor& x, std::span<const int64_t> rows, const Tensor& w, bool trans_w,
                 Tensor& out, float alpha, float beta, DType matmul_dtype,
                 GroupSchedule schedule) {
  const int64_t k = x.dim(1), n = out.dim(1);
  std::vector<float> x_copy, w_copy;
  const float* px = F32Operand(x, matmul_dtype, x_copy);
  const float* pw = F32Operand(w, matmul_dtype, w_copy);
  float* po = out.data<float>();
  ForEachGroup(rows, schedule, [&](size_t g, int64_t begin, bool whole) {
    GroupSgemm(whole, false, trans_w, rows[g], n, k, alpha, px + begin * k, k,
               pw + static_cast<int64_t>(g) * k * n, trans_w ? k : n, beta, po + begin * n, n);
  });
}

void GroupedGemmWeightGrad(const Tensor& x, const Tensor& dy, std::span<const int64_t> rows,
                           Tensor& dw, float alpha, float beta, DType matmul_dtype,
                           GroupSchedule schedule) {
  const int64_t k = x.dim(1), n = dy.dim(1);
  std::vector<float> x_copy, dy_copy;
  const float* px = F32Operand(x, matmul_dtype, x_copy);
  const float* pdy = F32Operand(dy, matmul_dtype, dy_copy);
  float* pdw = dw.data<float>();
  ForEachGroup(rows, schedule, [&](size_t g, int64_t begin, bool whole) {
    GroupSgemm(whole, true, false, k, n, rows[g], alpha, px + begin * k, k, pdy + begin * n, n,
               beta, pdw + static_cast<int64_t>(g) * k * n, n);
  });
}

}  // namespace switchyard::kernels::cpu
