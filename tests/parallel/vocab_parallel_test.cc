// The vocabulary-parallel loss and embedding under mpirun (1, 2, 4 and 8 ranks), on a local
// group, the world and (4+ ranks) pairs, against the single-rank kernels on the whole
// vocabulary: every rank builds the whole logits / table from the same seed and keeps its
// VocabRangeOf shard, the padding columns / rows filled with NaN (logits) so that reading
// one shows.
//
//  - VocabParallelCrossEntropy vs kernels::CrossEntropyForwardBackward on the whole logits:
//    V = 37 (not a multiple of tp), 3 (ranks of padding only at tp >= 4) and 64; ignored
//    rows; loss_sum within 1e-6 relative and bit-identical on every rank of the group, the
//    count exact, each gradient shard within 1e-6 of the matching columns of the whole
//    gradient, padding columns exactly 0; forward only and dlogits == logits give the same.
//  - The embedding: the sum over ranks of VocabShardEmbeddingForward is EmbeddingForward on
//    the whole table exactly, and the VocabShardEmbeddingBackward shards are exactly the
//    matching rows of EmbeddingBackward (accumulating into a non-zero table).
//
// Between collectives only EXPECT_* (tests/dist/dist_main.cc): every rank reaches every call.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "engine/dist/communicator.h"
#include "engine/dist/process.h"
#include "engine/parallel/vocab_parallel.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "kernels/vocab_parallel.h"
#include "tests/kernels/grad_check.h"
#include "tests/parallel/cross_entropy_bound.h"
#include "tests/parallel/parallel_test_util.h"

namespace switchyard::parallel {
namespace {

using dist::Communicator;
using parallel_test::Columns;
using parallel_test::ExpectClose;
using parallel_test::ExpectEqual;
using parallel_test::RowBlock;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

class VocabParallelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    world_ = dist::WorldCommunicator();
    groups_ = parallel_test::TpGroups(*world_);
  }
  std::unique_ptr<Communicator> world_;
  std::vector<parallel_test::Group> groups_;
};

// This rank's (rows, shard_cols) block of a whole (rows, V) tensor: the valid columns of
// the range, then `pad` in the padding columns.
Tensor ShardColumns(const Tensor& whole, const VocabRange& range, float pad) {
  const int64_t rows = whole.dim(0);
  const std::vector<float> mine =
      Columns(whole, range.start, range.start + range.valid_cols).ToVector<float>();
  std::vector<float> out(rows * range.shard_cols, pad);
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t j = 0; j < range.valid_cols; ++j)
      out[i * range.shard_cols + j] = mine[i * range.valid_cols + j];
  return Tensor::FromVector(out, {rows, range.shard_cols});
}

// Whether x is the same double on every rank of tp (its bits' max == min).
bool SameOnEveryRank(double x, Communicator& tp) {
  int64_t bits = 0;
  std::memcpy(&bits, &x, sizeof(bits));
  Tensor hi = Tensor::FromVector(std::vector<int64_t>{bits}, {1}), lo = hi.Clone();
  tp.AllReduce(hi, dist::ReduceOp::kMax);
  tp.AllReduce(lo, dist::ReduceOp::kMin);
  return hi.ToVector<int64_t>()[0] == lo.ToVector<int64_t>()[0];
}

TEST_F(VocabParallelTest, VocabRangesTileThePaddedVocabulary) {
  for (int64_t v : {1, 3, 37, 64, 50257}) {
    for (int tp : {1, 2, 3, 4, 8}) {
      EXPECT_EQ(PaddedVocab(v, tp) % tp, 0);
      EXPECT_LT(PaddedVocab(v, tp) - v, tp);
      int64_t next = 0, valid = 0;
      for (int r = 0; r < tp; ++r) {
        const VocabRange range = VocabRangeOf(v, tp, r);
        EXPECT_EQ(range.start, next) << v << " " << tp;
        EXPECT_EQ(range.shard_cols, PaddedVocab(v, tp) / tp);
        EXPECT_EQ(range.valid_cols, std::min(range.shard_cols, std::max<int64_t>(0, v - next)));
        next += range.shard_cols;
        valid += range.valid_cols;
      }
      EXPECT_EQ(valid, v) << v << " " << tp;
    }
  }
}

// One case of the loss: V columns, n rows, targets from (row * 7 + salt) % V with every
// fifth row ignored, grad_scale 1 / count.
void CheckCrossEntropy(Communicator& tp, int64_t v, int64_t n, int32_t ignore_index,
                       const std::string& name) {
  const VocabRange range = VocabRangeOf(v, tp.size(), tp.rank());
  Tensor logits = testing::RandomTensor({n, v}, 100 + v, -4.0f, 4.0f);
  std::vector<int32_t> t(n);
  for (int64_t r = 0; r < n; ++r) {
    t[r] = r % 5 == 3 ? ignore_index : static_cast<int32_t>((r * 7 + 2) % v);
  }
  t[0] = static_cast<int32_t>(v - 1);  // the last real id (on the last rank with any)
  Tensor targets = Tensor::FromVector(t, {n});
  const int64_t count = kernels::CountTargets(targets, ignore_index);
  const double scale = 1.0 / static_cast<double>(count);

  Tensor dwhole = Tensor::Empty({n, v}, DType::kF32);
  const kernels::CrossEntropySums want =
      kernels::CrossEntropyForwardBackward(logits, targets, dwhole, scale, ignore_index);

  Tensor shard = ShardColumns(logits, range, kNaN);
  Tensor dshard = Tensor::Empty(shard.shape(), DType::kF32);
  const kernels::CrossEntropySums got = VocabParallelCrossEntropy(
      shard, targets, range.start, range.valid_cols, tp, &dshard, scale, nullptr, ignore_index);
  EXPECT_EQ(got.count, want.count) << name;
  EXPECT_NEAR(got.loss_sum, want.loss_sum, 1e-6 * std::abs(want.loss_sum)) << name;
  EXPECT_TRUE(SameOnEveryRank(got.loss_sum, tp)) << name << ": loss_sum differs between ranks";
  // Two evaluations of the same gradient, tp shards (tests/parallel/cross_entropy_bound.h).
  const std::vector<double> bound = test_util::CrossEntropyGradBound(
      logits.ToVector<float>(), n, v, t, scale, ignore_index, tp.size());
  std::vector<double> shard_bound;
  for (int64_t r = 0; r < n; ++r)
    shard_bound.insert(shard_bound.end(), bound.begin() + r * v + range.start,
                       bound.begin() + r * v + range.start + range.valid_cols);
  test_util::ExpectWithinElementBound(
      Columns(dshard, 0, range.valid_cols).ToVector<float>(),
      Columns(dwhole, range.start, range.start + range.valid_cols).ToVector<float>(), shard_bound,
      name + " gradient shard");
  const std::vector<float> padding =
      Columns(dshard, range.valid_cols, range.shard_cols).ToVector<float>();
  for (float p : padding) EXPECT_EQ(p, 0.0f) << name << ": padding gradient";

  // Forward only, and the gradient written over the logits: the same results.
  const kernels::CrossEntropySums fwd = VocabParallelCrossEntropy(
      shard, targets, range.start, range.valid_cols, tp, nullptr, scale, nullptr, ignore_index);
  EXPECT_EQ(fwd.loss_sum, got.loss_sum) << name;
  EXPECT_EQ(fwd.count, got.count) << name;
  Tensor in_place = shard.Clone();
  const kernels::CrossEntropySums alias = VocabParallelCrossEntropy(
      in_place, targets, range.start, range.valid_cols, tp, &in_place, scale, nullptr,
      ignore_index);
  EXPECT_EQ(alias.loss_sum, got.loss_sum) << name;
  ExpectEqual(in_place, dshard, name + " dlogits == logits");
}

TEST_F(VocabParallelTest, CrossEntropyMatchesTheWholeVocabulary) {
  for (parallel_test::Group& g : groups_) {
    Communicator& tp = *g.comm;
    for (int64_t v : {37, 3, 64}) {
      CheckCrossEntropy(tp, v, 12, kernels::kIgnoreIndex,
                        g.name + " V=" + std::to_string(v));
    }
    // Another ignore_index, one that is a real id: those rows are masked, not looked up.
    CheckCrossEntropy(tp, 37, 12, 5, g.name + " V=37 ignore_index=5");
  }
}

TEST_F(VocabParallelTest, EmbeddingMatchesTheWholeTable) {
  const int64_t v = 37, d = 6, n = 40;
  for (parallel_test::Group& g : groups_) {
    Communicator& tp = *g.comm;
    const VocabRange range = VocabRangeOf(v, tp.size(), tp.rank());
    std::vector<int32_t> id_values(n);
    for (int64_t i = 0; i < n; ++i) id_values[i] = static_cast<int32_t>((i * 11 + 3) % v);
    Tensor ids = Tensor::FromVector(id_values, {n / 4, 4});  // any shape of n ids
    Tensor table = testing::RandomTensor({v, d}, 200);
    // This rank's rows of the table; padding rows (ids >= V) are zero, as the layer keeps them.
    Tensor table_shard = Tensor::Zeros({range.shard_cols, d}, DType::kF32);
    table_shard.Slice(0, range.valid_cols)
        .CopyFrom(RowBlock(table, range.start, range.start + range.valid_cols));

    Tensor want = Tensor::Empty({n / 4, 4, d}, DType::kF32);
    kernels::EmbeddingForward(ids, table, want);
    Tensor out = Tensor::Empty({n / 4, 4, d}, DType::kF32);
    kernels::VocabShardEmbeddingForward(ids, table_shard, range.start, out);
    tp.AllReduce(out, dist::ReduceOp::kSum);
    ExpectEqual(out, want, g.name + " embedding forward (sum over ranks)");

    // Backward into a non-zero table: the shard is those rows of the whole backward.
    Tensor dout = testing::RandomTensor({n / 4, 4, d}, 201);
    Tensor dtable = testing::RandomTensor({v, d}, 202);
    Tensor dshard = Tensor::Zeros({range.shard_cols, d}, DType::kF32);
    dshard.Slice(0, range.valid_cols)
        .CopyFrom(RowBlock(dtable, range.start, range.start + range.valid_cols));
    kernels::EmbeddingBackward(ids, dout, dtable);
    kernels::VocabShardEmbeddingBackward(ids, dout, range.start, dshard);
    ExpectEqual(RowBlock(dshard, 0, range.valid_cols),
                RowBlock(dtable, range.start, range.start + range.valid_cols),
                g.name + " embedding backward shard");
    ExpectEqual(RowBlock(dshard, range.valid_cols, range.shard_cols),
                Tensor::Zeros({range.shard_cols - range.valid_cols, d}, DType::kF32),
                g.name + " embedding backward padding rows");
  }
}

}  // namespace
}  // namespace switchyard::parallel
