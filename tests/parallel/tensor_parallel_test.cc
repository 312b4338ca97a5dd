// engine/parallel/tensor_parallel.h under mpirun (1, 2, 4 and 8 ranks), on a local group,
// the world and (4+ ranks) pairs. Each mapping against the single-rank operation it stands
// for, on integer-valued inputs that every rank can build for every rank (so the results
// are exact): gathered rows are the concatenation of every rank's input, a reduce-scatter
// is this rank's rows of the sum, and so on. Then the mappings as they are used, against
// one rank and central differences (picotron's test: slice the whole weights into the
// parallel layer, compare outputs and gradient shards):
//   row-parallel     y = g(scatter(x) @ W[rows r])              (Megatron RowParallelLinear)
//   column-parallel  y = gather(f(x) @ W[:, cols r])            (ColumnParallelLinear)
//   sequence-parallel y_s = reduce_scatter(gather_rows(x_s) @ A[:, r] @ B[r, :])  (an MLP)
// with L = sum(c * y); a weight shard's finite difference perturbs one rank's element at a
// time, every rank running the forward.
//
// Between collectives only EXPECT_* (tests/dist/dist_main.cc): every rank reaches every call.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/dist/process.h"
#include "engine/parallel/tensor_parallel.h"
#include "tests/kernels/grad_check.h"
#include "tests/parallel/parallel_test_util.h"
#include "tests/testing/tolerance.h"

namespace switchyard::parallel {
namespace {

using dist::Communicator;
using parallel_test::Code;
using parallel_test::Columns;
using parallel_test::Dot;
using parallel_test::ExpectClose;
using parallel_test::ExpectEqual;
using parallel_test::Fill;
using parallel_test::MatMul;
using parallel_test::RowBlock;
using parallel_test::TpGroups;

class TensorParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = dist::WorldCommunicator();
    groups_ = TpGroups(*world_);
  }
  std::unique_ptr<Communicator> world_;
  std::vector<parallel_test::Group> groups_;
};

// Rank r's tensor of a "one per rank" input: element i is Code(r, i, salt).
Tensor PerRank(const Shape& shape, int rank, int salt) {
  return Fill(shape, [&](int64_t i) { return Code(rank, i, salt); });
}

TEST_F(TensorParallelTest, SequenceShardsTileTheRows) {
  for (int size : {1, 2, 3, 4, 6, 12}) {
    int64_t next = 0;
    for (int r = 0; r < size; ++r) {
      const SequenceShard s = SequenceShardOf(12, r, size);
      EXPECT_EQ(s.begin, next) << size;
      EXPECT_EQ(s.rows(), 12 / size) << size;
      next = s.end;
    }
    EXPECT_EQ(next, 12) << size;
  }
}

TEST_F(TensorParallelTest, CopyToAndReduceFromTheRegion) {
  for (parallel_test::Group& g : groups_) {
    Communicator& tp = *g.comm;
    const Shape shape{3, 2, 5};
    // f: forward is x itself; backward sums every rank's gradient.
    Tensor x = Fill(shape, [](int64_t i) { return Code(i); });
    Tensor y = CopyToTensorParallelRegion(x, tp, nullptr);
    EXPECT_TRUE(y.SharesStorageWith(x)) << g.name;
    Tensor dy = PerRank(shape, tp.rank(), 1);
    Tensor dx = CopyToTensorParallelRegionBackward(dy, tp, nullptr);
    Tensor sum = Fill(shape, [&](int64_t i) {
      float s = 0;
      for (int r = 0; r < tp.size(); ++r) s += Code(r, i, 1);
      return s;
    });
    ExpectEqual(dx, sum, g.name + " f backward");
    ExpectEqual(dy, PerRank(shape, tp.rank(), 1), g.name + " f backward leaves dy");
    // g: forward sums every rank's partial; backward is dy itself.
    Tensor partial = PerRank(shape, tp.rank(), 1);
    ExpectEqual(ReduceFromTensorParallelRegion(partial, tp, nullptr), sum, g.name + " g forward");
    ExpectEqual(partial, PerRank(shape, tp.rank(), 1), g.name + " g forward leaves x");
    EXPECT_TRUE(ReduceFromTensorParallelRegionBackward(dy, tp, nullptr).SharesStorageWith(dy));
  }
}

TEST_F(TensorParallelTest, ScatterToAndGatherFromTheLastDim) {
  for (parallel_test::Group& g : groups_) {
    Communicator& tp = *g.comm;
    const int size = tp.size(), me = tp.rank();
    const int64_t a = 2, b = 3, c = 5;  // blocks of c columns; x (a, b, size * c)
    // Element (i, j, k) of the whole tensor; rank r's block holds k in [r*c, (r+1)*c).
    auto whole = [&](int salt) {
      return Fill({a, b, size * c}, [&](int64_t e) { return Code(e / (size * c), e % (size * c), salt); });
    };
    auto block = [&](int r, int salt) {
      return Fill({a, b, c}, [&](int64_t e) { return Code(e / c, r * c + e % c, salt); });
    };
    ExpectEqual(ScatterToTensorParallelRegion(whole(0), tp, nullptr), block(me, 0),
                g.name + " scatter last dim");
    ExpectEqual(ScatterToTensorParallelRegionBackward(block(me, 1), tp, nullptr), whole(1),
                g.name + " scatter backward (gather last dim)");
    ExpectEqual(GatherFromTensorParallelRegion(block(me, 2), tp, nullptr), whole(2),
                g.name + " gather last dim");
    ExpectEqual(GatherFromTensorParallelRegionBackward(whole(3), tp, nullptr), block(me, 3),
                g.name + " gather backward (own block)");
    // Any dtype of whole 4-byte words: i32 through the same path.
    std::vector<int32_t> ids(size * 4 * 2);
    for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(i);
    Tensor whole_ids = Tensor::FromVector(ids, {2, size * 4});
    Tensor mine = ScatterToTensorParallelRegion(whole_ids, tp, nullptr);
    ExpectEqual(GatherFromTensorParallelRegion(mine, tp, nullptr), whole_ids,
                g.name + " i32 scatter then gather");
  }
}

TEST_F(TensorParallelTest, SequenceParallelRows) {
  for (parallel_test::Group& g : groups_) {
    Communicator& tp = *g.comm;
    const int size = tp.size(), me = tp.rank();
    const int64_t n = 4 * size, d = 3;  // (n, 2, d): rows with two dims after them
    const SequenceShard s = SequenceShardOf(n, me, size);
    auto whole = [&](int salt) {
      return Fill({n, 2, d}, [&](int64_t e) { return Code(e / (2 * d), e % (2 * d), salt); });
    };
    auto rows = [&](int r, int salt) {
      const SequenceShard q = SequenceShardOf(n, r, size);
      return RowBlock(whole(salt), q.begin, q.end);
    };
    // Rank r's (n, 2, d) partial sums and this rank's rows of their sum.
    auto partial = [&](int r, int salt) {
      return Fill({n, 2, d}, [&](int64_t e) { return Code(r + 10 * e, salt); });
    };
    Tensor my_sum_rows = Fill({s.rows(), 2, d}, [&](int64_t e) {
      float v = 0;
      for (int r = 0; r < size; ++r) v += Code(r + 10 * (s.begin * 2 * d + e), 4);
      return v;
    });

    Tensor x = whole(0);
    Tensor scattered = ScatterToSequenceParallelRegion(x, tp, nullptr);
    ExpectEqual(scattered, rows(me, 0), g.name + " scatter rows");
    EXPECT_EQ(scattered.SharesStorageWith(x), size == 1) << g.name;
    ExpectEqual(ScatterToSequenceParallelRegionBackward(rows(me, 1), tp, nullptr), whole(1),
                g.name + " scatter rows backward (gather)");
    ExpectEqual(GatherFromSequenceParallelRegion(rows(me, 2), tp, nullptr), whole(2),
                g.name + " gather rows");
    ExpectEqual(GatherFromSequenceParallelRegionBackward(partial(me, 4), tp, nullptr),
                my_sum_rows, g.name + " gather rows backward (reduce-scatter)");
    ExpectEqual(ReduceScatterToSequenceParallelRegion(partial(me, 4), tp, nullptr), my_sum_rows,
                g.name + " reduce-scatter rows");
    ExpectEqual(ReduceScatterToSequenceParallelRegionBackward(rows(me, 3), tp, nullptr), whole(3),
                g.name + " reduce-scatter backward (gather)");
  }
}

TEST_F(TensorParallelTest, SizeOneGroupIsTheIdentity) {
  std::unique_ptr<Communicator> one = dist::MakeLocalCommunicator();
  Tensor x = Fill({4, 6}, [](int64_t i) { return Code(i); });
  using Mapping = Tensor (*)(const Tensor&, Communicator&, DeviceContext*);
  const Mapping all[] = {
      CopyToTensorParallelRegion, CopyToTensorParallelRegionBackward,
      ReduceFromTensorParallelRegion, ReduceFromTensorParallelRegionBackward,
      ScatterToTensorParallelRegion, ScatterToTensorParallelRegionBackward,
      GatherFromTensorParallelRegion, GatherFromTensorParallelRegionBackward,
      ScatterToSequenceParallelRegion, ScatterToSequenceParallelRegionBackward,
      GatherFromSequenceParallelRegion, GatherFromSequenceParallelRegionBackward,
      ReduceScatterToSequenceParallelRegion, ReduceScatterToSequenceParallelRegionBackward};
  for (size_t i = 0; i < std::size(all); ++i) {
    Tensor y = all[i](x, *one, nullptr);
    EXPECT_TRUE(y.SharesStorageWith(x) && y.shape() == x.shape()) << "mapping " << i;
  }
}

// d L / d t by central differences, L evaluated by every rank together; only rank `owner`
// of tp perturbs its t (owner -1: every rank perturbs its own copy, for a replicated t).
std::vector<double> NumericGradient(Tensor t, int owner, Communicator& tp,
                                    const std::function<double()>& loss, float h) {
  float* p = t.data<float>();
  std::vector<double> grad(static_cast<size_t>(t.numel()));
  const bool mine = owner < 0 || owner == tp.rank();
  for (int64_t i = 0; i < t.numel(); ++i) {
    const float orig = p[i], plus = orig + h, minus = orig - h;
    if (mine) p[i] = plus;
    const double lp = loss();
    if (mine) p[i] = minus;
    const double lm = loss();
    if (mine) p[i] = orig;
    grad[i] = (lp - lm) / (static_cast<double>(plus) - minus);
  }
  return grad;
}

// Finite differences of a bilinear loss in f32: step 1e-2 on O(1) values, 1e-3 tolerance.
constexpr float kStep = 1e-2f;
constexpr double kFdAbs = 1e-3, kFdRel = 1e-3;

// The parallel results against one rank's: the same products summed in another order (and
// x (A B) against (x A) B), so each element is held to the forward-error bound of its
// product, 2 (k + 3) u (|x||A||B|)_ij with k the roundings along a term's way (the inner
// dimensions summed; tests/testing/tolerance.h), which no order exceeds.
using test_util::AbsProduct;

// |t| elementwise, in double.
std::vector<double> Abs(const Tensor& t) {
  const std::vector<float> v = t.ToVector<float>();
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = std::abs(static_cast<double>(v[i]));
  return out;
}

// The block [r0, r1) x [c0, c1) of a (rows, cols) row-major scale.
std::vector<double> ScaleBlock(const std::vector<double>& s, int64_t cols, int64_t r0, int64_t r1,
                               int64_t c0, int64_t c1) {
  std::vector<double> out;
  for (int64_t i = r0; i < r1; ++i)
    for (int64_t j = c0; j < c1; ++j) out.push_back(s[i * cols + j]);
  return out;
}

// got within the bound 2 (k + 3) u scale of want, elementwise.
void ExpectWithinBound(const Tensor& got, const Tensor& want, const std::vector<double>& scale,
                       int64_t k, const std::string& what) {
  EXPECT_EQ(got.shape(), want.shape()) << what;
  test_util::ExpectWithinProductBound(got.ToVector<float>(), want.ToVector<float>(), scale, k,
                                      what);
}

// Checks the gradient of a weight shard against central differences rank by rank.
void CheckShardGradient(Tensor shard, const Tensor& analytic, Communicator& tp,
                        const std::function<double()>& loss, const std::string& what) {
  std::vector<float> got = analytic.ToVector<float>();
  for (int q = 0; q < tp.size(); ++q) {
    const std::vector<double> fd = NumericGradient(shard, q, tp, loss, kStep);
    if (q == tp.rank()) ExpectClose(got, fd, kFdAbs, kFdRel, what + " vs finite differences");
  }
}

TEST_F(TensorParallelTest, RowParallelLinearMatchesOneRankAndFiniteDifferences) {
  const int64_t n = 4, k = 8, m = 3;  // x (n, k) @ W (k, m); k splits over tp
  for (parallel_test::Group& g : groups_) {
    Communicator& tp = *g.comm;
    const int64_t kl = k / tp.size(), k0 = tp.rank() * kl;
    Tensor x = testing::RandomTensor({n, k}, 1), w = testing::RandomTensor({k, m}, 2);
    Tensor c = testing::RandomTensor({n, m}, 3);
    Tensor w_r = RowBlock(w, k0, k0 + kl);
    auto forward = [&] {
      Tensor x_r = ScatterToTensorParallelRegion(x, tp, nullptr);
      return ReduceFromTensorParallelRegion(MatMul(x_r, false, w_r, false), tp, nullptr);
    };
    auto loss = [&] { return Dot(forward(), c); };
    // Backward through the mappings.
    Tensor dpartial = ReduceFromTensorParallelRegionBackward(c, tp, nullptr);
    Tensor x_r = ScatterToTensorParallelRegion(x, tp, nullptr);
    Tensor dx = ScatterToTensorParallelRegionBackward(MatMul(dpartial, false, w_r, true), tp,
                                                      nullptr);
    Tensor dw_r = MatMul(x_r, true, dpartial, false);
    // One rank: y = x W, dx = c W^T, dW = x^T c.
    const std::vector<double> ax = Abs(x), aw = Abs(w), ac = Abs(c);
    ExpectWithinBound(forward(), MatMul(x, false, w, false), AbsProduct(ax, false, aw, false, n, m, k),
                      k, g.name + " row-parallel y");
    ExpectWithinBound(dx, MatMul(c, false, w, true), AbsProduct(ac, false, aw, true, n, k, m), m,
                      g.name + " row-parallel dx");
    ExpectWithinBound(dw_r, RowBlock(MatMul(x, true, c, false), k0, k0 + kl),
                      ScaleBlock(AbsProduct(ax, true, ac, false, k, m, n), m, k0, k0 + kl, 0, m), n,
                      g.name + " row-parallel dW shard");
    ExpectClose(dx.ToVector<float>(), NumericGradient(x, -1, tp, loss, kStep), kFdAbs, kFdRel,
                g.name + " row-parallel dx vs finite differences");
    CheckShardGradient(w_r, dw_r, tp, loss, g.name + " row-parallel dW shard");
  }
}

TEST_F(TensorParallelTest, ColumnParallelLinearMatchesOneRankAndFiniteDifferences) {
  const int64_t n = 4, k = 3, m = 8;  // x (n, k) @ W (k, m); m splits over tp
  for (parallel_test::Group& g : groups_) {
    Communicator& tp = *g.comm;
    const int64_t ml = m / tp.size(), m0 = tp.rank() * ml;
    Tensor x = testing::RandomTensor({n, k}, 4), w = testing::RandomTensor({k, m}, 5);
    Tensor c = testing::RandomTensor({n, m}, 6);
    Tensor w_r = Columns(w, m0, m0 + ml);
    auto forward = [&] {
      Tensor x_in = CopyToTensorParallelRegion(x, tp, nullptr);
      return GatherFromTensorParallelRegion(MatMul(x_in, false, w_r, false), tp, nullptr);
    };
    auto loss = [&] { return Dot(forward(), c); };
    Tensor dy_r = GatherFromTensorParallelRegionBackward(c, tp, nullptr);
    Tensor dx = CopyToTensorParallelRegionBackward(MatMul(dy_r, false, w_r, true), tp, nullptr);
    Tensor dw_r = MatMul(x, true, dy_r, false);
    const std::vector<double> ax = Abs(x), aw = Abs(w), ac = Abs(c);
    ExpectWithinBound(forward(), MatMul(x, false, w, false), AbsProduct(ax, false, aw, false, n, m, k),
                      k, g.name + " column-parallel y");
    ExpectWithinBound(dx, MatMul(c, false, w, true), AbsProduct(ac, false, aw, true, n, k, m), m,
                      g.name + " column-parallel dx");
    ExpectWithinBound(dw_r, Columns(MatMul(x, true, c, false), m0, m0 + ml),
                      ScaleBlock(AbsProduct(ax, true, ac, false, k, m, n), m, 0, k, m0, m0 + ml), n,
                      g.name + " column-parallel dW shard");
    ExpectClose(dx.ToVector<float>(), NumericGradient(x, -1, tp, loss, kStep), kFdAbs, kFdRel,
                g.name + " column-parallel dx vs finite differences");
    CheckShardGradient(w_r, dw_r, tp, loss, g.name + " column-parallel dW shard");
  }
}

TEST_F(TensorParallelTest, SequenceParallelMlpMatchesOneRankAndFiniteDifferences) {
  const int64_t n = 8, k = 4, h = 8, m = 3;  // x (n, k) @ A (k, h) @ B (h, m); rows and h split
  for (parallel_test::Group& g : groups_) {
    Communicator& tp = *g.comm;
    const SequenceShard s = SequenceShardOf(n, tp.rank(), tp.size());
    const int64_t hl = h / tp.size(), h0 = tp.rank() * hl;
    Tensor x = testing::RandomTensor({n, k}, 7), a = testing::RandomTensor({k, h}, 8);
    Tensor b = testing::RandomTensor({h, m}, 9), c = testing::RandomTensor({n, m}, 10);
    Tensor x_s = RowBlock(x, s.begin, s.end), a_r = Columns(a, h0, h0 + hl);
    Tensor b_r = RowBlock(b, h0, h0 + hl);
    auto forward = [&] {  // this rank's rows of y
      Tensor x_full = GatherFromSequenceParallelRegion(x_s, tp, nullptr);
      Tensor p = MatMul(MatMul(x_full, false, a_r, false), false, b_r, false);
      return ReduceScatterToSequenceParallelRegion(p, tp, nullptr);
    };
    auto loss = [&] { return Dot(GatherFromSequenceParallelRegion(forward(), tp, nullptr), c); };
    // Backward: dy_s -> all-gather -> through B_r and A_r -> reduce-scatter.
    Tensor x_full = GatherFromSequenceParallelRegion(x_s, tp, nullptr);
    Tensor h_r = MatMul(x_full, false, a_r, false);
    Tensor dp = ReduceScatterToSequenceParallelRegionBackward(RowBlock(c, s.begin, s.end), tp,
                                                              nullptr);
    Tensor dh_r = MatMul(dp, false, b_r, true);
    Tensor db_r = MatMul(h_r, true, dp, false);
    Tensor da_r = MatMul(x_full, true, dh_r, false);
    Tensor dx_s = GatherFromSequenceParallelRegionBackward(MatMul(dh_r, false, a_r, true), tp,
                                                           nullptr);
    // One rank: y = x A B, dx = c B^T A^T, dA = x^T c B^T, dB = (x A)^T c.
    Tensor ab = MatMul(a, false, b, false), cbt = MatMul(c, false, b, true);
    // Three-factor products: a term takes the roundings of both inner dimensions.
    const std::vector<double> ax = Abs(x), aa = Abs(a), abs_b = Abs(b), ac = Abs(c);
    const std::vector<double> xab = AbsProduct(AbsProduct(ax, false, aa, false, n, h, k), false, abs_b,
                                              false, n, m, h);                       // (n, m)
    const std::vector<double> cbtat = AbsProduct(AbsProduct(ac, false, abs_b, true, n, h, m), false,
                                                aa, true, n, k, h);                  // (n, k)
    const std::vector<double> xtcbt = AbsProduct(ax, true, AbsProduct(ac, false, abs_b, true, n, h, m),
                                                false, k, h, n);                     // (k, h)
    const std::vector<double> xatc = AbsProduct(AbsProduct(ax, false, aa, false, n, h, k), true, ac,
                                               false, h, m, n);                      // (h, m)
    ExpectWithinBound(forward(), RowBlock(MatMul(x, false, ab, false), s.begin, s.end),
                      ScaleBlock(xab, m, s.begin, s.end, 0, m), k + h,
                      g.name + " sequence-parallel y rows");
    ExpectWithinBound(dx_s, RowBlock(MatMul(c, false, ab, true), s.begin, s.end),
                      ScaleBlock(cbtat, k, s.begin, s.end, 0, k), m + h,
                      g.name + " sequence-parallel dx rows");
    ExpectWithinBound(da_r, Columns(MatMul(x, true, cbt, false), h0, h0 + hl),
                      ScaleBlock(xtcbt, h, 0, k, h0, h0 + hl), n + m,
                      g.name + " sequence-parallel dA shard");
    ExpectWithinBound(db_r, RowBlock(MatMul(MatMul(x, false, a, false), true, c, false), h0, h0 + hl),
                      ScaleBlock(xatc, m, h0, h0 + hl, 0, m), k + n,
                      g.name + " sequence-parallel dB shard");
    CheckShardGradient(x_s, dx_s, tp, loss, g.name + " sequence-parallel dx rows");
    CheckShardGradient(a_r, da_r, tp, loss, g.name + " sequence-parallel dA shard");
    CheckShardGradient(b_r, db_r, tp, loss, g.name + " sequence-parallel dB shard");
  }
}

}  // namespace
}  // namespace switchyard::parallel
