// The CPU kernels on the compute pool (engine/core/thread_pool.h) give the same bits on 1, 2
// and 3 threads: each splits only work whose per-element result does not depend on the
// split, and sums fixed blocks in order. The matrix products, which OpenBLAS computes with
// another kernel for another block size, agree with one thread within the forward-error
// bound of a product, c k u |A||B| (tests/testing/tolerance.h), on any OpenBLAS core type.
// Also VecExp (kernels/cpu/vec_math.h): within 2 ulp of exp over its range, NaN kept.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/core/thread_pool.h"
#include "kernels/activation.h"
#include "kernels/attention.h"
#include "kernels/cpu/vec_math.h"
#include "kernels/cross_entropy.h"
#include "kernels/gemm.h"
#include "kernels/optimizer.h"
#include "kernels/random.h"
#include "kernels/softmax.h"
#include "tests/testing/tolerance.h"

namespace switchyard::kernels {
namespace {

Tensor Random(const Shape& shape, uint64_t stream, float lo = -3.0f, float hi = 3.0f) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  FillUniform(t, RngKey{23, stream}, 0, lo, hi);
  return t;
}

// The f32 outputs of `run` (which builds its inputs itself) on `threads` threads.
using Outputs = std::vector<std::vector<float>>;
Outputs RunOn(int threads, const std::function<Outputs()>& run) {
  SetComputeThreads(threads);
  Outputs out = run();
  SetComputeThreads(1);
  return out;
}

// Bit equality of every output on 2 and 3 threads with 1 thread.
void ExpectSameBits(const std::string& what, const std::function<Outputs()>& run) {
  const Outputs one = RunOn(1, run);
  for (int threads : {2, 3}) {
    const Outputs many = RunOn(threads, run);
    ASSERT_EQ(many.size(), one.size());
    for (size_t o = 0; o < one.size(); ++o) {
      ASSERT_EQ(many[o].size(), one[o].size());
      size_t differ = 0;
      for (size_t i = 0; i < one[o].size(); ++i) {
        differ += std::memcmp(&many[o][i], &one[o][i], sizeof(float)) != 0;
      }
      EXPECT_EQ(differ, 0u) << what << ": output " << o << " on " << threads << " threads";
    }
  }
}

TEST(ThreadsTest, ElementwiseAndRowKernelsGiveTheSameBitsOnAnyThreadCount) {
  ExpectSameBits("gelu", [] {
    Tensor x = Random({300, 257}, 1), dy = Random({300, 257}, 2);
    Tensor y = Tensor::Empty(x.shape(), DType::kF32), dx = Tensor::Empty(x.shape(), DType::kF32);
    GeluForward(x, y);
    GeluBackward(x, dy, dx);
    return Outputs{y.ToVector<float>(), dx.ToVector<float>()};
  });
  ExpectSameBits("swiglu", [] {
    Tensor a = Random({300, 257}, 3), b = Random({300, 257}, 4), g = Random({300, 257}, 5);
    Tensor o = Tensor::Empty(a.shape(), DType::kF32), da = Tensor::Empty(a.shape(), DType::kF32),
           db = Tensor::Empty(a.shape(), DType::kF32);
    SwigluForward(a, b, o);
    SwigluBackward(a, b, g, da, db);
    return Outputs{o.ToVector<float>(), da.ToVector<float>(), db.ToVector<float>()};
  });
  ExpectSameBits("softmax", [] {
    Tensor x = Random({777, 131}, 6, -20.0f, 20.0f), dy = Random({777, 131}, 7);
    Tensor y = Tensor::Empty(x.shape(), DType::kF32), dx = Tensor::Empty(x.shape(), DType::kF32);
    SoftmaxForward(x, y);
    SoftmaxBackward(y, dy, dx);
    return Outputs{y.ToVector<float>(), dx.ToVector<float>()};
  });
  ExpectSameBits("cross-entropy", [] {
    Tensor logits = Random({513, 1000}, 8, -8.0f, 8.0f);
    std::vector<int32_t> t(513);
    for (size_t i = 0; i < t.size(); ++i) t[i] = i % 7 == 3 ? kIgnoreIndex : (i * 37) % 1000;
    Tensor targets = Tensor::FromVector(t, {513});
    Tensor dlogits = Tensor::Empty(logits.shape(), DType::kF32);
    const CrossEntropySums s = CrossEntropyForwardBackward(logits, targets, dlogits, 0.01);
    const double sum = s.loss_sum;
    float bits[2];
    std::memcpy(bits, &sum, sizeof(sum));
    return Outputs{dlogits.ToVector<float>(), {bits[0], bits[1], static_cast<float>(s.count)}};
  });
  ExpectSameBits("bias", [] {
    Tensor y = Random({1000, 300}, 9), bias = Random({3, 300}, 10), db = Random({3, 300}, 11);
    const std::vector<int64_t> rows = {600, 0, 400};
    GroupedAddBias(y, rows, bias);
    GroupedBiasGrad(y, rows, db, 0.5f);
    return Outputs{y.ToVector<float>(), db.ToVector<float>()};
  });
  ExpectSameBits("adamw and sums of squares", [] {
    Tensor p = Random({200001}, 12), g = Random({200001}, 13), m = Random({200001}, 14),
           v = Random({200001}, 15, 0.0f, 1.0f);
    AdamWStep hp;
    hp.lr = 1e-3f;
    hp.weight_decay = 0.1f;
    hp.step = 3;
    AdamWUpdate(p, g, m, v, hp);
    const double ss = SumSquares(p);
    float bits[2];
    std::memcpy(bits, &ss, sizeof(ss));
    ScaleInPlace(g, 0.25f);
    return Outputs{p.ToVector<float>(), m.ToVector<float>(), v.ToVector<float>(),
                   g.ToVector<float>(), {bits[0], bits[1]}};
  });
  ExpectSameBits("attention (GQA)", [] {
    const Shape qs{3, 40, 4, 16}, kvs{3, 40, 2, 16};
    Tensor q = Random(qs, 16), k = Random(kvs, 17), v = Random(kvs, 18), dout = Random(qs, 19);
    Tensor out = Tensor::Empty(qs, DType::kF32), lse = Tensor::Empty({3, 4, 40}, DType::kF32);
    Tensor dq = Tensor::Empty(qs, DType::kF32), dk = Tensor::Empty(kvs, DType::kF32),
           dv = Tensor::Empty(kvs, DType::kF32);
    AttentionForward(q, k, v, out, lse);
    AttentionBackward(q, k, v, lse, dout, dq, dk, dv);
    return Outputs{out.ToVector<float>(), lse.ToVector<float>(), dq.ToVector<float>(),
                   dk.ToVector<float>(), dv.ToVector<float>()};
  });
}

// The products of the test below: C = 0.5 op(A) op(B) + 0.25 C0 for three shapes, then for
// two group splits the grouped y = x_g w_g and dw_g = x_g^T dy_g + dw0_g. Each entry holds
// its inputs' scale (|alpha| |A| |B| + |beta| |C0|, elementwise) and inner dimension, so the
// thread counts' results are compared against the product bound (tests/testing/tolerance.h),
// which holds whatever order OpenBLAS's kernel for this machine sums in.
struct Product {
  std::vector<float> c;
  std::vector<double> scale;
  int64_t k = 0;
};

std::vector<Product> SplitAndGroupedProducts(bool with_scales) {
  std::vector<Product> out;
  for (auto [m, n, k, ta, tb] : {std::tuple{300, 70, 200, false, false},
                                 std::tuple{70, 300, 200, true, true},
                                 std::tuple{257, 513, 65, false, true}}) {
    Tensor a = Random(ta ? Shape{k, m} : Shape{m, k}, 20), b = Random(tb ? Shape{n, k} : Shape{k, n}, 21);
    Tensor c = Random({m, n}, 22);
    Product p;
    p.k = k;
    if (with_scales) {
      p.scale = test_util::AbsProduct(a.ToVector<float>(), ta, b.ToVector<float>(), tb, m, n, k);
      for (double& s : p.scale) s *= 0.5;
      test_util::AddAbsScaled(p.scale, 0.25, c.ToVector<float>());
    }
    Gemm(a, ta, b, tb, c, 0.5f, 0.25f);
    p.c = c.ToVector<float>();
    out.push_back(std::move(p));
  }
  for (const std::vector<int64_t>& rows :
       {std::vector<int64_t>{100, 90, 0, 110, 100}, std::vector<int64_t>{350, 20, 30}}) {
    int64_t total = 0, most = 0;
    for (int64_t r : rows) total += r, most = std::max(most, r);
    const int64_t g = static_cast<int64_t>(rows.size());
    Tensor x = Random({total, 96}, 23), w = Random({g, 96, 130}, 24), dy = Random({total, 130}, 25);
    Tensor y = Tensor::Empty({total, 130}, DType::kF32), dw = Random({g, 96, 130}, 26);
    Product py, pw;
    py.k = 96;
    pw.k = most;
    if (with_scales) {
      const std::vector<float> xv = x.ToVector<float>(), wv = w.ToVector<float>(),
                               dyv = dy.ToVector<float>(), dw0 = dw.ToVector<float>();
      int64_t r0 = 0;
      for (int64_t e = 0; e < g; ++e) {
        const std::vector<float> xe(xv.begin() + r0 * 96, xv.begin() + (r0 + rows[e]) * 96),
            dye(dyv.begin() + r0 * 130, dyv.begin() + (r0 + rows[e]) * 130),
            we(wv.begin() + e * 96 * 130, wv.begin() + (e + 1) * 96 * 130);
        const std::vector<double> ys = test_util::AbsProduct(xe, false, we, false, rows[e], 130, 96);
        py.scale.insert(py.scale.end(), ys.begin(), ys.end());
        const std::vector<double> ws = test_util::AbsProduct(xe, true, dye, false, 96, 130, rows[e]);
        pw.scale.insert(pw.scale.end(), ws.begin(), ws.end());
        r0 += rows[e];
      }
      test_util::AddAbsScaled(pw.scale, 1.0, dw0);
    }
    GroupedGemm(x, rows, w, /*trans_w=*/false, y);
    GroupedGemmWeightGrad(x, dy, rows, dw, 1.0f, 1.0f);
    py.c = y.ToVector<float>();
    pw.c = dw.ToVector<float>();
    out.push_back(std::move(py));
    out.push_back(std::move(pw));
  }
  return out;
}

TEST(ThreadsTest, SplitAndGroupedProductsEqualOneThreadToRounding) {
  // Rows > columns (split by rows), columns > rows (split by columns), transposes, beta;
  // grouped products with balanced groups (one group per thread) and one large group.
  const std::vector<Product> one = SplitAndGroupedProducts(/*with_scales=*/true);
  for (int threads : {2, 3}) {
    SetComputeThreads(threads);
    const std::vector<Product> many = SplitAndGroupedProducts(/*with_scales=*/false);
    SetComputeThreads(1);
    ASSERT_EQ(many.size(), one.size());
    for (size_t o = 0; o < one.size(); ++o) {
      // Both sides are rounded: c = 2 (the default) covers the two.
      test_util::ExpectWithinProductBound(many[o].c, one[o].c, one[o].scale, one[o].k,
                                          "product " + std::to_string(o) + " on " +
                                              std::to_string(threads) + " threads");
    }
  }
}

TEST(VecExpTest, WithinTwoUlpOfExpAndNaNStaysNaN) {
  double worst = 0.0;
  float at = 0.0f;
  for (float x = -87.0f; x <= 88.0f; x += 0.00731f) {
    const float got = cpu::VecExp(x);
    const double want = std::exp(static_cast<double>(x));
    const float w = static_cast<float>(want);
    const double ulp = std::nextafter(w, std::numeric_limits<float>::infinity()) - w;
    const double err = std::abs(got - want) / ulp;
    if (err > worst) worst = err, at = x;
  }
  EXPECT_LE(worst, 2.0) << "at x = " << at;
  EXPECT_EQ(cpu::VecExp(0.0f), 1.0f);
  EXPECT_TRUE(std::isnan(cpu::VecExp(std::numeric_limits<float>::quiet_NaN())));
  // Clamped: finite at the ends, tiny below, huge above, never inf or 0.
  EXPECT_GT(cpu::VecExp(-1000.0f), 0.0f);
  EXPECT_LT(cpu::VecExp(-1000.0f), 2e-38f);
  EXPECT_GT(cpu::VecExp(1000.0f), 1e38f);
  EXPECT_TRUE(std::isfinite(cpu::VecExp(std::numeric_limits<float>::infinity())));
}

}  // namespace
}  // namespace switchyard::kernels
