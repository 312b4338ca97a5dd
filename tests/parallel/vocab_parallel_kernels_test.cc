// kernels/vocab_parallel.h on the CPU (one process), against direct double-precision
// formulas on the valid columns: padding columns hold NaN, so a kernel that reads one
// fails; a shard of padding only (valid_cols = 0); dlogits aliasing the logits; one shard
// holding the whole vocabulary composes to kernels::CrossEntropyForwardBackward; the
// embedding pieces against kernels/embedding.h on the shard's rows; and the argument checks
// (with the composite's check of the targets, on a size-1 group).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/parallel/vocab_parallel.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/vocab_parallel.h"
#include "tests/kernels/grad_check.h"
#include "tests/parallel/cross_entropy_bound.h"

namespace switchyard::kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr int64_t kRows = 5, kCols = 9, kValid = 6, kStart = 20;

// (kRows, kCols) logits in [-3, 3) with NaN in the columns >= kValid.
Tensor ShardLogits() {
  Tensor x = testing::RandomTensor({kRows, kCols}, 300, -3.0f, 3.0f);
  float* p = x.data<float>();
  for (int64_t r = 0; r < kRows; ++r)
    for (int64_t j = kValid; j < kCols; ++j) p[r * kCols + j] = kNaN;
  return x;
}

// Global targets: rows 0..4 -> own column 2, the last own column, another rank's id, ignored,
// and own column 0.
Tensor ShardTargets() {
  return Tensor::FromVector(std::vector<int32_t>{kStart + 2, kStart + kValid - 1, 3, -1, kStart},
                            {kRows});
}

TEST(VocabParallelKernelsTest, RowReductionsAndTargetLogit) {
  Tensor x = ShardLogits(), targets = ShardTargets();
  Tensor m = Tensor::Empty({kRows}, DType::kF32), s = Tensor::Empty({kRows}, DType::kF32);
  Tensor t = Tensor::Empty({kRows}, DType::kF32);
  VocabShardRowMax(x, kValid, m);
  VocabShardExpSum(x, kValid, m, s);
  VocabShardTargetLogit(x, targets, kStart, kValid, -1, t);
  const std::vector<float> xv = x.ToVector<float>(), mv = m.ToVector<float>();
  const std::vector<int32_t> tv = targets.ToVector<int32_t>();
  // The exp sum (vocab_parallel.cc): each argument f32(x - m) rounded (u |x - m|), exp and
  // the sum in double (~1e-16), the sum rounded to f32 (u sum): |ds| <= 1.01 u sum_j e_j
  // (|x_j - m| + 1).
  std::vector<double> want_m, want_s, want_t, bound_s;
  for (int64_t r = 0; r < kRows; ++r) {
    double best = -INFINITY, sum = 0, bound = 0;
    for (int64_t j = 0; j < kValid; ++j) best = std::max<double>(best, xv[r * kCols + j]);
    for (int64_t j = 0; j < kValid; ++j) {
      const double e = std::exp(xv[r * kCols + j] - best);
      sum += e;
      bound += 1.01 * test_util::kF32Unit * e * (std::abs(xv[r * kCols + j] - best) + 1);
    }
    const int64_t l = tv[r] - kStart;
    want_m.push_back(best);
    want_s.push_back(sum);
    bound_s.push_back(bound);
    want_t.push_back(tv[r] != -1 && l >= 0 && l < kValid ? xv[r * kCols + l] : 0.0);
  }
  EXPECT_EQ(std::vector<double>(mv.begin(), mv.end()), want_m) << "row max (exact)";
  test_util::ExpectWithinElementBound(s.ToVector<float>(), want_s, bound_s, "exp sum");
  const std::vector<float> got_t = t.ToVector<float>();
  EXPECT_EQ(std::vector<double>(got_t.begin(), got_t.end()), want_t) << "target logit (exact)";
}

TEST(VocabParallelKernelsTest, SoftmaxGradZeroOnPaddingAndIgnoredRows) {
  Tensor x = ShardLogits(), targets = ShardTargets();
  // A global max and sum as if other ranks held more columns: max + 0.5, sum * 3.
  Tensor m = Tensor::Empty({kRows}, DType::kF32), s = Tensor::Empty({kRows}, DType::kF32);
  VocabShardRowMax(x, kValid, m);
  VocabShardExpSum(x, kValid, m, s);
  std::vector<float> mv = m.ToVector<float>(), sv = s.ToVector<float>();
  for (int64_t r = 0; r < kRows; ++r) {
    mv[r] += 0.5f;
    sv[r] = static_cast<float>(sv[r] * std::exp(-0.5) * 3.0);
  }
  Tensor gm = Tensor::FromVector(mv, {kRows}), gs = Tensor::FromVector(sv, {kRows});
  const float scale = 0.25f;
  Tensor d = Tensor::Empty({kRows, kCols}, DType::kF32);
  VocabShardSoftmaxGrad(x, targets, kStart, kValid, gm, gs, scale, -1, d);
  const std::vector<float> xv = x.ToVector<float>();
  const std::vector<int32_t> tv = targets.ToVector<int32_t>();
  // From the given max and sum (vocab_parallel.cc): the argument f32(x - m) (u |x - m|),
  // f32 of the double exp and the quotient (2u), - onehot (u |p - onehot|), * scale (u |g|):
  // |dg| <= 1.01 scale (p (|x - m| + 3) u + 2u |p - onehot|); zero elsewhere, exactly.
  std::vector<double> want(kRows * kCols, 0.0), bound(kRows * kCols, 0.0);
  for (int64_t r = 0; r < kRows; ++r) {
    if (tv[r] == -1) continue;
    for (int64_t j = 0; j < kValid; ++j) {
      const double arg = static_cast<double>(xv[r * kCols + j]) - mv[r];
      const double p = std::exp(arg) / sv[r], onehot = j == tv[r] - kStart ? 1.0 : 0.0;
      want[r * kCols + j] = scale * (p - onehot);
      bound[r * kCols + j] = 1.01 * scale * test_util::kF32Unit *
                             (p * (std::abs(arg) + 3) + 2 * std::abs(p - onehot));
    }
  }
  test_util::ExpectWithinElementBound(d.ToVector<float>(), want, bound, "softmax grad");
  // Written over the logits: the same values.
  VocabShardSoftmaxGrad(x, targets, kStart, kValid, gm, gs, scale, -1, x);
  EXPECT_EQ(x.ToVector<float>(), d.ToVector<float>());
}

TEST(VocabParallelKernelsTest, ShardOfPaddingOnly) {
  Tensor x = ShardLogits(), targets = ShardTargets();
  Tensor m = Tensor::Empty({kRows}, DType::kF32), s = Tensor::Empty({kRows}, DType::kF32);
  Tensor t = Tensor::Empty({kRows}, DType::kF32), d = Tensor::Empty({kRows, kCols}, DType::kF32);
  Tensor zero = Tensor::Zeros({kRows, kCols}, DType::kF32);
  Tensor nan_x = Tensor::FromVector(std::vector<float>(kRows * kCols, kNaN), {kRows, kCols});
  VocabShardRowMax(nan_x, 0, m);
  for (float v : m.ToVector<float>()) EXPECT_EQ(v, -INFINITY);
  Tensor global_max = Tensor::FromVector(std::vector<float>(kRows, 1.0f), {kRows});
  VocabShardExpSum(nan_x, 0, global_max, s);
  for (float v : s.ToVector<float>()) EXPECT_EQ(v, 0.0f);
  VocabShardTargetLogit(nan_x, targets, kStart, 0, -1, t);
  for (float v : t.ToVector<float>()) EXPECT_EQ(v, 0.0f);
  VocabShardSoftmaxGrad(nan_x, targets, kStart, 0, global_max, global_max, 1.0f, -1, d);
  EXPECT_EQ(d.ToVector<float>(), zero.ToVector<float>());
}

TEST(VocabParallelKernelsTest, OneShardComposesToTheWholeCrossEntropy) {
  const int64_t n = 7, v = 11;
  Tensor x = testing::RandomTensor({n, v}, 301, -5.0f, 5.0f);
  Tensor targets = Tensor::FromVector(std::vector<int32_t>{0, 10, -1, 4, 4, -1, 7}, {n});
  Tensor dwant = Tensor::Empty({n, v}, DType::kF32);
  const CrossEntropySums want = CrossEntropyForwardBackward(x, targets, dwant, 0.2);
  Tensor m = Tensor::Empty({n}, DType::kF32), s = Tensor::Empty({n}, DType::kF32);
  Tensor t = Tensor::Empty({n}, DType::kF32), d = Tensor::Empty({n, v}, DType::kF32);
  VocabShardRowMax(x, v, m);
  VocabShardExpSum(x, v, m, s);
  VocabShardTargetLogit(x, targets, 0, v, -1, t);
  VocabShardSoftmaxGrad(x, targets, 0, v, m, s, 0.2f, -1, d);
  const std::vector<float> mv = m.ToVector<float>(), sv = s.ToVector<float>(),
                           tv = t.ToVector<float>();
  const std::vector<int32_t> ids = targets.ToVector<int32_t>();
  double loss = 0.0;
  for (int64_t r = 0; r < n; ++r) {
    if (ids[r] != -1) loss += std::log(static_cast<double>(sv[r])) + mv[r] - tv[r];
  }
  EXPECT_NEAR(loss, want.loss_sum, 1e-6 * std::abs(want.loss_sum));
  // Two evaluations of the same gradient (tests/parallel/cross_entropy_bound.h), one shard.
  test_util::ExpectWithinElementBound(
      d.ToVector<float>(), dwant.ToVector<float>(),
      test_util::CrossEntropyGradBound(x.ToVector<float>(), n, v, ids, 0.2, -1, 1),
      "one shard gradient vs CrossEntropyForwardBackward");
}

TEST(VocabParallelKernelsTest, EmbeddingShardMatchesTheTableRows) {
  const int64_t v = 12, d = 3, start = 4, rows = 5;  // the shard holds ids [4, 9)
  Tensor ids = Tensor::FromVector(std::vector<int32_t>{4, 0, 8, 9, 4, 6, 11, 8, 4, -1}, {10});
  Tensor table = testing::RandomTensor({v, d}, 302);
  Tensor shard = table.Slice(start, start + rows).Clone();
  Tensor out = Tensor::Empty({10, d}, DType::kF32);
  VocabShardEmbeddingForward(ids, shard, start, out);
  const std::vector<int32_t> iv = ids.ToVector<int32_t>();
  const std::vector<float> tv = table.ToVector<float>(), ov = out.ToVector<float>();
  for (int64_t i = 0; i < 10; ++i) {
    const bool mine = iv[i] >= start && iv[i] < start + rows;
    for (int64_t j = 0; j < d; ++j) {
      EXPECT_EQ(ov[i * d + j], mine ? tv[iv[i] * d + j] : 0.0f) << i << " " << j;
    }
  }
  // Backward: the shard's rows of the whole backward (ids made valid for the whole table).
  Tensor valid_ids = Tensor::FromVector(std::vector<int32_t>{4, 0, 8, 9, 4, 6, 11, 8, 4, 4}, {10});
  Tensor dout = testing::RandomTensor({10, d}, 303);
  Tensor dtable = testing::RandomTensor({v, d}, 304);
  Tensor dshard = dtable.Slice(start, start + rows).Clone();
  EmbeddingBackward(valid_ids, dout, dtable);
  VocabShardEmbeddingBackward(valid_ids, dout, start, dshard);
  EXPECT_EQ(dshard.ToVector<float>(), dtable.Slice(start, start + rows).ToVector<float>());
}

TEST(VocabParallelKernelsDeathTest, ArgumentChecks) {
  Tensor x = Tensor::Zeros({2, 4}, DType::kF32), out = Tensor::Empty({2}, DType::kF32);
  EXPECT_DEATH(VocabShardRowMax(x, 5, out), "VocabShardRowMax: logits \\(2, 4\\) with 5 valid");
  Tensor three = Tensor::Empty({3}, DType::kF32);
  EXPECT_DEATH(VocabShardExpSum(x, 4, out, three), "VocabShardExpSum: out \\(3\\)");
  Tensor f_targets = Tensor::Zeros({2}, DType::kF32);
  EXPECT_DEATH(VocabShardTargetLogit(x, f_targets, 0, 4, -1, out),
               "VocabShardTargetLogit: targets is f32, expected i32");
  Tensor ids = Tensor::Zeros({2}, DType::kI32), flat = Tensor::Zeros({8}, DType::kF32);
  EXPECT_DEATH(VocabShardEmbeddingForward(ids, flat, 0, x), "table_shard is \\(Vl, d\\)");
  Tensor rows = Tensor::Empty({3, 4}, DType::kF32);
  EXPECT_DEATH(VocabShardEmbeddingBackward(ids, rows, 0, x), "dout \\(3, 4\\) for 2 ids");
  // The composite names a target outside the vocabulary (here V = 3 of 4 columns).
  auto one = dist::MakeLocalCommunicator();
  Tensor targets = Tensor::FromVector(std::vector<int32_t>{1, 3}, {2});
  EXPECT_DEATH(parallel::VocabParallelCrossEntropy(x, targets, 0, 3, *one, nullptr, 1.0, nullptr),
               "target 3 at row 1 is outside the vocabulary of 3");
}

}  // namespace
}  // namespace switchyard::kernels
