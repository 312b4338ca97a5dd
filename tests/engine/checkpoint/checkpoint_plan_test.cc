// The pieces of a checkpoint without files or ranks (engine/checkpoint/piece.h and
// checkpoint_plan.h): CopyCommon against an element-by-element reference on random boxes
// and element ranges in 0-3 dims (empty intersections included) and the runs it walks;
// CheckTiling against a coverage count; CopyBox out of and into a whole tensor on 0-3 dims
// and every dtype; PlanSave over hand-written lists (a tensor split on two dims with
// replicas, ZeRO ranges of one box split over replicas, identical replica pieces written
// once, a whole copy preferred, empty pieces ignored) and its refusals (overlaps, gaps,
// disagreements); the lists' text round trip and LocalSlices' refusals.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "engine/checkpoint/piece.h"
#include "engine/checkpoint/save_plan.h"
#include "tests/engine/checkpoint/checkpoint_test_util.h"

namespace switchyard::train {
namespace {

using testing::GlobalFlat;
using testing::Pattern;
using testing::SameElement;

// ---- Pieces ------------------------------------------------------------------------------

// The tensor index of element k of p's box, computed the slow way.
int64_t SlowGlobalIndex(const checkpoint::Piece& p, const Shape& global, int64_t k) {
  int64_t g = 0, stride = 1;
  for (int d = static_cast<int>(global.size()) - 1; d >= 0; --d) {
    g += (k % p.box[d] + p.offset[d]) * stride;
    k /= p.box[d];
    stride *= global[d];
  }
  return g;
}

// A random piece of `global`: a random box (often whole along a dim, now and then empty on
// one) and, half of the time, a random element range of it (now and then empty).
checkpoint::Piece RandomPiece(const Shape& global, std::mt19937& rng) {
  auto uniform = [&](int64_t lo, int64_t hi) {
    return std::uniform_int_distribution<int64_t>(lo, hi)(rng);
  };
  checkpoint::Piece p;
  for (int64_t g : global) {
    const int64_t kind = uniform(0, 19);  // 0: empty on this dim, 1-8: the whole extent
    const int64_t a = kind == 0 ? uniform(0, g) : kind <= 8 ? 0 : uniform(0, g - 1);
    const int64_t b = kind == 0 ? a : kind <= 8 ? g : uniform(a + 1, g);
    p.offset.push_back(a);
    p.box.push_back(b - a);
  }
  const int64_t n = NumElements(p.box);
  const bool whole = uniform(0, 1) == 0;
  const int64_t a = uniform(0, n), b = uniform(0, n);
  p.begin = whole ? 0 : std::min(a, b);
  p.end = whole ? n : std::max(a, b);
  return p;
}

// CopyCommon against the definition: every element of src's range whose tensor index falls
// in dst's box at a place inside dst's range is copied there, and nothing else changes.
TEST(CopyCommonTest, MatchesAnElementByElementReferenceOnRandomPieces) {
  std::mt19937 rng(2024);
  int64_t cases = 0, empty = 0, copied_total = 0;
  for (int nd = 0; nd <= 3; ++nd) {
    for (int trial = 0; trial < 1500; ++trial) {
      Shape global;
      for (int d = 0; d < nd; ++d) global.push_back(std::uniform_int_distribution<int64_t>(1, 7)(rng));
      const checkpoint::Piece src = RandomPiece(global, rng), dst = RandomPiece(global, rng);
      SCOPED_TRACE("global " + ShapeString(global) + ", src " + checkpoint::PieceString(src, global) +
                   ", dst " + checkpoint::PieceString(dst, global));
      std::vector<int32_t> from(src.numel()), to(dst.numel(), -1), want(dst.numel(), -1);
      for (int64_t k = 0; k < src.numel(); ++k) from[k] = static_cast<int32_t>(1000 + k);
      // The reference: tensor index -> place in dst's data.
      std::vector<int64_t> place(NumElements(global), -1);
      for (int64_t k = dst.begin; k < dst.end; ++k) place[SlowGlobalIndex(dst, global, k)] = k - dst.begin;
      int64_t want_count = 0;
      for (int64_t k = src.begin; k < src.end; ++k) {
        const int64_t at = place[SlowGlobalIndex(src, global, k)];
        if (at >= 0) {
          want[at] = from[k - src.begin];
          ++want_count;
        }
      }
      const int64_t copied = checkpoint::CopyCommon(src, from.data(), dst, to.data(), sizeof(int32_t));
      ASSERT_EQ(copied, want_count);
      ASSERT_EQ(checkpoint::CommonElements(src, dst), want_count);
      ASSERT_EQ(checkpoint::CommonElements(dst, src), want_count);
      ASSERT_EQ(to, want);
      // The runs increase in both pieces and are maximal.
      int64_t last_s = -1, last_d = -1;
      checkpoint::ForEachCommonRun(src, dst, [&](int64_t s, int64_t d, int64_t n) {
        EXPECT_GT(n, 0);
        EXPECT_GE(s, 0);
        EXPECT_LE(s + n, src.numel());
        EXPECT_LE(d + n, dst.numel());
        EXPECT_FALSE(s == last_s && d == last_d) << "two runs that are one";
        EXPECT_TRUE(last_s < 0 || (s >= last_s && d >= last_d)) << "runs out of order";
        last_s = s + n, last_d = d + n;
      });
      ++cases;
      empty += want_count == 0;
      copied_total += copied;
    }
  }
  // The random cases include both kinds.
  EXPECT_GT(empty, cases / 10);
  EXPECT_LT(empty, cases * 9 / 10);
  std::printf("    %lld cases, %lld with nothing in common, %lld elements copied\n",
              static_cast<long long>(cases), static_cast<long long>(empty),
              static_cast<long long>(copied_total));
}

TEST(CopyCommonTest, WholeBoxesCopyInOneRunAndScalarsWork) {
  // Two whole boxes spanning full rows: one run of 3 rows.
  const checkpoint::Piece all = checkpoint::BoxPiece({0, 0}, {4, 5});
  const checkpoint::Piece rows = checkpoint::BoxPiece({1, 0}, {3, 5});
  int runs = 0;
  checkpoint::ForEachCommonRun(all, rows, [&](int64_t s, int64_t d, int64_t n) {
    ++runs;
    EXPECT_EQ(s, 5);
    EXPECT_EQ(d, 0);
    EXPECT_EQ(n, 15);
  });
  EXPECT_EQ(runs, 1);
  // A column block of a ZeRO range: rows [1, 3) x cols [2, 4), of elements [7, 18).
  const checkpoint::Piece range{{0, 0}, {4, 5}, 7, 18};  // (1,2) .. (3,2)
  const checkpoint::Piece block = checkpoint::BoxPiece({1, 2}, {2, 2});
  std::vector<std::pair<int64_t, int64_t>> seen;
  checkpoint::ForEachCommonRun(range, block, [&](int64_t s, int64_t d, int64_t n) {
    EXPECT_EQ(n, 2);
    seen.emplace_back(s, d);
  });
  EXPECT_EQ(seen, (std::vector<std::pair<int64_t, int64_t>>{{0, 0}, {5, 2}}));
  // 0-d: the element is shared only when both ranges hold it.
  const checkpoint::Piece scalar = checkpoint::BoxPiece({}, {});
  float x = 3.5f, y = 0;
  EXPECT_EQ(checkpoint::CopyCommon(scalar, &x, scalar, &y, sizeof(float)), 1);
  EXPECT_EQ(y, 3.5f);
  EXPECT_EQ(checkpoint::CommonElements(scalar, checkpoint::Piece{{}, {}, 1, 1}), 0);
  // Disjoint boxes, and ranges that miss each other inside one box.
  EXPECT_EQ(checkpoint::CommonElements(checkpoint::BoxPiece({0, 0}, {2, 5}), checkpoint::BoxPiece({2, 0}, {2, 5})), 0);
  EXPECT_EQ(checkpoint::CommonElements(checkpoint::Piece{{0, 0}, {4, 5}, 0, 10}, checkpoint::Piece{{0, 0}, {4, 5}, 10, 20}), 0);
}

// Random tilings (a box grid, each box cut into element ranges) tile; moving one cut by
// one element makes an overlap or a gap, which CheckTiling finds.
TEST(CheckTilingTest, FindsOverlapsAndGapsInRandomTilings) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 300; ++trial) {
    const int nd = 1 + trial % 3;
    Shape global;
    for (int d = 0; d < nd; ++d) global.push_back(std::uniform_int_distribution<int64_t>(1, 6)(rng));
    // Cut dim 0 into up to three blocks, each block's elements into up to three ranges.
    std::vector<int64_t> cuts = {0, global[0]};
    for (int c = 0; c < 2; ++c) cuts.push_back(std::uniform_int_distribution<int64_t>(0, global[0])(rng));
    std::sort(cuts.begin(), cuts.end());
    std::vector<checkpoint::Piece> pieces;
    for (size_t b = 0; b + 1 < cuts.size(); ++b) {
      Shape box = global;
      box[0] = cuts[b + 1] - cuts[b];
      std::vector<int64_t> offset(nd, 0);
      offset[0] = cuts[b];
      const int64_t n = NumElements(box);
      std::vector<int64_t> r = {0, n, std::uniform_int_distribution<int64_t>(0, n)(rng),
                                std::uniform_int_distribution<int64_t>(0, n)(rng)};
      std::sort(r.begin(), r.end());
      for (size_t i = 0; i + 1 < r.size(); ++i) pieces.push_back({offset, box, r[i], r[i + 1]});
    }
    SCOPED_TRACE("global " + ShapeString(global));
    checkpoint::TilingProblem ok = checkpoint::CheckTiling(pieces, global);
    ASSERT_EQ(ok.first, -1);
    ASSERT_EQ(ok.covered, NumElements(global));
    // Stretch or shrink a non-empty piece by one element.
    int i = std::uniform_int_distribution<int>(0, static_cast<int>(pieces.size()) - 1)(rng);
    while (pieces[i].numel() == 0) i = (i + 1) % static_cast<int>(pieces.size());
    std::vector<checkpoint::Piece> bad = pieces;
    const bool stretch = bad[i].end < NumElements(bad[i].box);
    bad[i].end += stretch ? 1 : -1;
    // The reference: how often each element is covered.
    std::vector<int> count(NumElements(global), 0);
    for (const checkpoint::Piece& p : bad) {
      for (int64_t k = p.begin; k < p.end; ++k) ++count[SlowGlobalIndex(p, global, k)];
    }
    const bool overlap = std::any_of(count.begin(), count.end(), [](int c) { return c > 1; });
    const checkpoint::TilingProblem found = checkpoint::CheckTiling(bad, global);
    EXPECT_EQ(found.first >= 0, overlap);
    if (found.first >= 0) {
      EXPECT_GT(checkpoint::CommonElements(bad[found.first], bad[found.second]), 0);
    }
    if (!overlap) {
      EXPECT_EQ(found.covered, NumElements(global) - 1);
    }
  }
}

// ---- Boxes --------------------------------------------------------------------------------


struct BoxCase {
  Shape global;
  std::vector<int64_t> offset;  // empty: all zero
  Shape size;
};

TEST(CopyBoxTest, CutsAndPastesBoxesOnZeroToThreeDimsByteForByte) {
  const std::vector<BoxCase> cases = {
      {{}, {}, {}},                       // a 0-d scalar
      {{7}, {0}, {7}},                    // whole
      {{7}, {2}, {3}},                    // inside
      {{7}, {6}, {1}},                    // the last element
      {{7}, {3}, {0}},                    // empty
      {{4, 5}, {1, 2}, {2, 3}},           // inside on both dims
      {{4, 5}, {0, 4}, {4, 1}},           // one column
      {{4, 5}, {}, {1, 5}},               // the first row, offsets omitted
      {{3, 4, 6}, {1, 0, 3}, {2, 4, 3}},  // ep on dim 0 and etp on dim 2 at once
      {{3, 4, 6}, {0, 1, 0}, {1, 2, 6}},  // runs whole along the last dim
      {{3, 4, 6}, {2, 3, 5}, {1, 1, 1}},  // one corner element
      {{3, 4, 6}, {0, 0, 0}, {3, 4, 6}},  // whole
  };
  for (DType dtype : {DType::kF32, DType::kBF16, DType::kI32, DType::kI64, DType::kU8,
                      DType::kF64}) {
    for (const BoxCase& c : cases) {
      SCOPED_TRACE(std::string(DTypeName(dtype)) + " box " + ShapeString(c.size) + " of " +
                   ShapeString(c.global));
      const Tensor whole = Pattern(c.global, dtype, 7);
      // Out of the whole tensor: every element from its global place.
      Tensor part = Pattern(c.size, dtype, 99);
      checkpoint::CopyBox(whole, part, c.offset, /*paste=*/false);
      for (int64_t k = 0; k < part.numel(); ++k) {
        ASSERT_TRUE(SameElement(part, k, whole, GlobalFlat(c.global, c.offset, c.size, k)))
            << "element " << k;
      }
      // Back into a zero tensor: the box holds it, everything else stays zero.
      Tensor pasted = Tensor::Zeros(c.global, dtype);
      checkpoint::CopyBox(pasted, part, c.offset, /*paste=*/true);
      std::vector<bool> in_box(pasted.numel(), false);
      for (int64_t k = 0; k < part.numel(); ++k) {
        const int64_t g = GlobalFlat(c.global, c.offset, c.size, k);
        in_box[g] = true;
        ASSERT_TRUE(SameElement(pasted, g, whole, g)) << "global element " << g;
      }
      const Tensor zero = Tensor::Zeros({1}, dtype);
      for (int64_t g = 0; g < pasted.numel(); ++g) {
        if (!in_box[g]) {
          ASSERT_TRUE(SameElement(pasted, g, zero, 0)) << "global element " << g;
        }
      }
    }
  }
}

// ---- Plans -------------------------------------------------------------------------------

// A piece of f32 `global`: the box `size` at `offset`, elements [begin, end) (-1: the box).
checkpoint::SliceEntry Box(const std::string& name, const Shape& global, std::vector<int64_t> offset,
               const Shape& size, DType dtype = DType::kF32, int file = checkpoint::kModelTensors,
               int64_t begin = 0, int64_t end = -1) {
  return {file, name, dtype, global,
          checkpoint::Piece{std::move(offset), size, begin, end < 0 ? NumElements(size) : end}};
}

TEST(PlanSaveTest, TilesATensorSplitOnTwoDimsFromTheLowestRankOfEachBox) {
  // (E, d, f) = (4, 3, 6) over ep 2 (dim 0) x etp 2 (dim 2), each box on two edp replicas:
  // rank r holds ep index (r / 2) % 2 and etp index r % 2; ranks r and r + 4 hold the same.
  const Shape global = {4, 3, 6};
  std::vector<std::vector<checkpoint::SliceEntry>> per_rank(8);
  for (int r = 0; r < 8; ++r) {
    const int64_t e = (r / 2) % 2, t = r % 2;
    per_rank[r].push_back(Box("experts.w1", global, {2 * e, 0, 3 * t}, {2, 3, 3}));
  }
  auto plan = checkpoint::PlanSave(per_rank);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 1u);
  const checkpoint::SaveItem& item = (*plan)[0];
  EXPECT_EQ(item.name, "experts.w1");
  EXPECT_EQ(item.global, global);
  ASSERT_EQ(item.pieces.size(), 4u) << "the replicas' identical pieces are written once";
  for (int r = 0; r < 4; ++r) {
    EXPECT_EQ(item.pieces[r].rank, r);
    EXPECT_EQ(item.pieces[r].index, 0);
    EXPECT_EQ(item.pieces[r].piece.offset,
              (std::vector<int64_t>{2 * ((r / 2) % 2), 0, 3 * (r % 2)}));
    EXPECT_EQ(item.pieces[r].piece.box, (Shape{2, 3, 3}));
    EXPECT_TRUE(item.pieces[r].piece.whole_box());
  }
}

// ZeRO: the replicas of each ep box own near-equal element ranges of it (flat_value or
// not, they offer just that range); every range is written once, by its owner.
TEST(PlanSaveTest, ReplicasOwningRangesOfABoxEachWriteTheirRange) {
  const Shape global = {4, 5};
  // ep 2 boxes of 2 rows (10 elements), each over 3 replicas owning [0, 4), [4, 7), [7, 10).
  const int64_t cuts[] = {0, 4, 7, 10};
  std::vector<std::vector<checkpoint::SliceEntry>> per_rank(6);
  for (int r = 0; r < 6; ++r) {
    const int64_t e = r % 2, z = r / 2;
    per_rank[r].push_back(Box("w", global, {2 * e, 0}, {2, 5}, DType::kF32, checkpoint::kOptimizerTensors,
                              cuts[z], cuts[z + 1]));
    // A replicated scalar, offered by all: written once, by rank 0.
    per_rank[r].push_back(Box("optimizer.step", {}, {}, {}, DType::kI64, checkpoint::kOptimizerTensors));
  }
  auto plan = checkpoint::PlanSave(per_rank);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 2u);
  EXPECT_EQ((*plan)[0].name, "optimizer.step");
  ASSERT_EQ((*plan)[0].pieces.size(), 1u);
  EXPECT_EQ((*plan)[0].pieces[0].rank, 0);
  const checkpoint::SaveItem& w = (*plan)[1];
  ASSERT_EQ(w.pieces.size(), 6u);
  for (int r = 0; r < 6; ++r) {
    EXPECT_EQ(w.pieces[r].rank, r);
    EXPECT_EQ(w.pieces[r].index, 0);
    EXPECT_EQ(w.pieces[r].piece.begin, cuts[r / 2]);
    EXPECT_EQ(w.pieces[r].piece.end, cuts[r / 2 + 1]);
  }
  // Replicas that cut the box differently overlap: one clear error naming the tensor.
  per_rank[4][0].piece.begin = 6;  // [6, 10) of box 0, overlapping rank 2's [4, 7)
  plan = checkpoint::PlanSave(per_rank);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(plan.status().message().find(
                "the pieces of 'w' held by ranks 2 and 4 overlap without being equal (box (2, 5) "
                "at [0, 0], elements [4, 7); box (2, 5) at [0, 0], elements [6, 10))"),
            std::string::npos)
      << plan.status();
  // And a range left out is a gap.
  per_rank[4][0].piece.begin = 8;
  plan = checkpoint::PlanSave(per_rank);
  EXPECT_NE(plan.status().message().find("the pieces of 'w' (4, 5) cover 19 of its 20 elements"),
            std::string::npos)
      << plan.status();
}

TEST(PlanSaveTest, AWholeCopyWinsEmptyPiecesAreSkippedAndItemsAreSorted) {
  std::vector<std::vector<checkpoint::SliceEntry>> per_rank(3);
  // "b": a half on rank 0, whole on ranks 1 and 2: rank 1's copy is the one piece.
  per_rank[0].push_back(Box("b", {6}, {0}, {3}));
  per_rank[1].push_back(Box("b", {6}, {0}, {6}));
  per_rank[2].push_back(Box("b", {6}, {0}, {6}));
  // "a": two halves, an empty box (a rank with nothing of it), index 1 on rank 2.
  per_rank[0].push_back(Box("a", {2, 4}, {0, 0}, {2, 2}));
  per_rank[1].push_back(Box("a", {2, 4}, {0, 2}, {2, 0}));
  per_rank[2].push_back(Box("a", {2, 4}, {0, 2}, {2, 2}));
  // An optimizer scalar, and a model tensor that sorts after it by name.
  per_rank[0].push_back(Box("optimizer.step", {}, {}, {}, DType::kI64, checkpoint::kOptimizerTensors));
  per_rank[2].push_back(Box("z", {}, {}, {}));
  // "c": whole on rank 0 but owning no element (an empty range), whole on rank 2.
  per_rank[0].push_back(Box("c", {3}, {0}, {3}, DType::kF32, checkpoint::kModelTensors, 0, 0));
  per_rank[2].push_back(Box("c", {3}, {0}, {3}));
  auto plan = checkpoint::PlanSave(per_rank);
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 5u);
  EXPECT_EQ((*plan)[0].name, "a");
  EXPECT_EQ((*plan)[1].name, "b");
  EXPECT_EQ((*plan)[2].name, "c");
  EXPECT_EQ((*plan)[3].name, "z");
  EXPECT_EQ((*plan)[4].name, "optimizer.step");
  EXPECT_EQ((*plan)[4].file, checkpoint::kOptimizerTensors);
  const auto& a = (*plan)[0].pieces;
  ASSERT_EQ(a.size(), 2u);
  EXPECT_EQ(a[0].rank, 0);
  EXPECT_EQ(a[1].rank, 2);
  EXPECT_EQ(a[1].index, 1);
  EXPECT_EQ(a[1].piece.offset, (std::vector<int64_t>{0, 2}));
  const auto& b = (*plan)[1].pieces;
  ASSERT_EQ(b.size(), 1u);
  EXPECT_EQ(b[0].rank, 1);
  EXPECT_EQ(b[0].piece.box, Shape{6});
  ASSERT_EQ((*plan)[2].pieces.size(), 1u);
  EXPECT_EQ((*plan)[2].pieces[0].rank, 2);
  ASSERT_EQ((*plan)[3].pieces.size(), 1u);
  EXPECT_EQ((*plan)[3].pieces[0].rank, 2);
}

TEST(PlanSaveTest, PiecesThatOverlapWithoutBeingEqualAreRefused) {
  // (4, 6) cut into 2 x 3 boxes by ranks 0 and 2, and one by rank 1 shifted by one row
  // that overlaps both boxes of the first column.
  std::vector<std::vector<checkpoint::SliceEntry>> per_rank(3);
  per_rank[0].push_back(Box("w", {4, 6}, {0, 0}, {2, 3}));
  per_rank[1].push_back(Box("w", {4, 6}, {1, 0}, {2, 3}));
  per_rank[2].push_back(Box("w", {4, 6}, {2, 3}, {2, 3}));
  auto plan = checkpoint::PlanSave(per_rank);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_NE(plan.status().message().find(
                "the pieces of 'w' held by ranks 0 and 1 overlap without being equal"),
            std::string::npos)
      << plan.status();
  // Overlapping on dim 2 only (etp halves of different widths) is an overlap too.
  per_rank = {{Box("x", {2, 3, 6}, {0, 0, 0}, {2, 3, 4})},
              {Box("x", {2, 3, 6}, {0, 0, 3}, {2, 3, 3})}};
  plan = checkpoint::PlanSave(per_rank);
  EXPECT_NE(plan.status().message().find("'x' held by ranks 0 and 1 overlap"), std::string::npos)
      << plan.status();
  // A range of a box against another box it crosses: rows 1-2 of (4, 2) as a range of the
  // whole tensor, and the box of rows [2, 4).
  per_rank = {{Box("y", {4, 2}, {0, 0}, {4, 2}, DType::kF32, checkpoint::kModelTensors, 2, 6)},
              {Box("y", {4, 2}, {2, 0}, {2, 2})}};
  plan = checkpoint::PlanSave(per_rank);
  EXPECT_NE(plan.status().message().find("'y' held by ranks 0 and 1 overlap"), std::string::npos)
      << plan.status();
  // A piece outside its tensor.
  per_rank = {{Box("v", {4}, {0}, {4}, DType::kF32, checkpoint::kModelTensors, 0, 5)}};
  plan = checkpoint::PlanSave(per_rank);
  EXPECT_NE(plan.status().message().find("rank 0's piece of 'v' (the whole tensor, elements [0, 5)) "
                                         "is not inside (4)"),
            std::string::npos)
      << plan.status();
}

TEST(PlanSaveTest, PiecesThatLeaveAGapAreRefused) {
  // Diagonal blocks of (4, 4): disjoint, half the elements.
  std::vector<std::vector<checkpoint::SliceEntry>> per_rank = {{Box("w", {4, 4}, {0, 0}, {2, 2})},
                                                   {Box("w", {4, 4}, {2, 2}, {2, 2})}};
  auto plan = checkpoint::PlanSave(per_rank);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument) << plan.status();
  EXPECT_NE(plan.status().message().find("the pieces of 'w' (4, 4) cover 8 of its 16 elements"),
            std::string::npos)
      << plan.status();
  // Only empty pieces: nothing covered.
  per_rank = {{Box("v", {3}, {0}, {0})}};
  plan = checkpoint::PlanSave(per_rank);
  EXPECT_NE(plan.status().message().find("'v' (3) cover 0 of its 3 elements"), std::string::npos)
      << plan.status();
}

TEST(PlanSaveTest, RanksThatDisagreeOnADtypeShapeOrKindAreRefused) {
  std::vector<std::vector<checkpoint::SliceEntry>> per_rank = {
      {Box("w", {4}, {0}, {2})}, {Box("w", {4}, {2}, {2}, DType::kBF16)}};
  auto plan = checkpoint::PlanSave(per_rank);
  EXPECT_NE(plan.status().message().find("'w' is f32 (4) on rank 0 but bf16 (4) on rank 1"),
            std::string::npos)
      << plan.status();
  per_rank = {{Box("w", {4}, {0}, {4})}, {Box("w", {2, 2}, {0, 0}, {2, 2})}};
  plan = checkpoint::PlanSave(per_rank);
  EXPECT_NE(plan.status().message().find("'w' is f32 (4) on rank 0 but f32 (2, 2) on rank 1"),
            std::string::npos)
      << plan.status();
  per_rank = {{Box("w", {4}, {0}, {4})}, {Box("w", {4}, {0}, {4}, DType::kF32, checkpoint::kOptimizerTensors)}};
  plan = checkpoint::PlanSave(per_rank);
  EXPECT_NE(plan.status().message().find("'w' is model state on rank 0 but optimizer state on rank 1"),
            std::string::npos)
      << plan.status();
}

TEST(SliceListTest, TextRoundTripKeepsEveryField) {
  const std::vector<checkpoint::SliceEntry> entries = {
      Box("experts.w1", {8, 4, 6}, {4, 0, 3}, {4, 4, 3}, DType::kF32, checkpoint::kModelTensors, 5, 17),
      Box("norm", {4}, {0}, {4}, DType::kBF16),
      Box("optimizer.step", {}, {}, {}, DType::kI64, checkpoint::kOptimizerTensors)};
  const std::vector<checkpoint::SliceEntry> back = checkpoint::DeserializeSlices(checkpoint::SerializeSlices(entries));
  ASSERT_EQ(back.size(), entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    EXPECT_EQ(back[i].file, entries[i].file);
    EXPECT_EQ(back[i].name, entries[i].name);
    EXPECT_EQ(back[i].dtype, entries[i].dtype);
    EXPECT_EQ(back[i].global, entries[i].global);
    EXPECT_EQ(back[i].piece, entries[i].piece);
  }
  EXPECT_TRUE(checkpoint::DeserializeSlices("").empty());
  EXPECT_TRUE(checkpoint::DeserializeSlices(checkpoint::SerializeSlices({})).empty());
}

TEST(SliceListTest, LocalSlicesListsPiecesAndRefusesWhatIsNotOne) {
  using parallel::Parameter;
  Parameter w = Parameter::Expert("experts.w1", Tensor::Zeros({2, 3, 3}, DType::kF32),
                                  Tensor::Zeros({2, 3, 3}, DType::kF32), true);
  w.Split(0, 2, 4).Split(2, 3, 6);
  // Optimizer state of w under ZeRO: elements [4, 11) of its box, held flat.
  Parameter m = w;
  m.name = "optimizer.exp_avg.experts.w1";
  m.flat_value = true;
  m.box_shape = {2, 3, 3};
  m.flat_begin = 4;
  m.flat_end = 11;
  m.value = Tensor::Zeros({7}, DType::kF32);
  m.grad = Tensor();
  m.trainable = false;
  Parameter step;
  step.name = "optimizer.step";
  step.trainable = false;
  step.value = Tensor::Zeros({}, DType::kI64);
  // w owns [2, 9) of its box (a replica's share) but holds it whole.
  Parameter owned = w;
  owned.flat_begin = 2;
  owned.flat_end = 9;
  for (checkpoint::SliceUse use : {checkpoint::SliceUse::kSave, checkpoint::SliceUse::kLoad}) {
    auto slices = checkpoint::LocalSlices({owned}, {m, step}, use);
    ASSERT_TRUE(slices.ok()) << slices.status();
    ASSERT_EQ(slices->size(), 3u);
    const checkpoint::SliceEntry& e = (*slices)[0];
    EXPECT_EQ(e.file, checkpoint::kModelTensors);
    EXPECT_EQ(e.global, (Shape{4, 3, 6}));
    EXPECT_EQ(e.piece.offset, (std::vector<int64_t>{2, 0, 3}));
    EXPECT_EQ(e.piece.box, (Shape{2, 3, 3}));
    // Saving offers the owned range; loading needs the whole box, since value holds it.
    EXPECT_EQ(e.piece.begin, use == checkpoint::SliceUse::kSave ? 2 : 0);
    EXPECT_EQ(e.piece.end, use == checkpoint::SliceUse::kSave ? 9 : 18);
    const checkpoint::SliceEntry& f = (*slices)[1];
    EXPECT_EQ(f.file, checkpoint::kOptimizerTensors);
    EXPECT_EQ(f.piece, (checkpoint::Piece{{2, 0, 3}, {2, 3, 3}, 4, 11}));  // a flat value: both ways
    EXPECT_EQ((*slices)[2].piece, (checkpoint::Piece{{}, {}, 0, 1}));
  }

  auto message = [](const std::vector<Parameter>& params, const std::vector<Parameter>& opt) {
    return std::string(checkpoint::LocalSlices(params, opt, checkpoint::SliceUse::kSave).status().message());
  };
  EXPECT_NE(message({w, w}, {}).find("'experts.w1' is listed twice"), std::string::npos);
  EXPECT_NE(message({w}, {w}).find("'experts.w1' is both a model parameter and optimizer state"),
            std::string::npos);
  Parameter outside = w;
  outside.offset = {3, 0, 3};  // rows [3, 5) of 4
  EXPECT_NE(message({outside}, {}).find("'experts.w1': value (2, 3, 3) is not a box of (4, 3, 6)"),
            std::string::npos)
      << message({outside}, {});
  Parameter long_range = m;
  long_range.flat_end = 19;
  EXPECT_NE(message({}, {long_range}).find("elements [4, 19) are not a range of its box (2, 3, 3)"),
            std::string::npos)
      << message({}, {long_range});
  Parameter short_value = m;
  short_value.value = Tensor::Zeros({6}, DType::kF32);
  EXPECT_NE(message({}, {short_value}).find("a flat value of elements [4, 11) must be 1-D of that "
                                            "length, not (6)"),
            std::string::npos)
      << message({}, {short_value});
  Parameter empty;
  empty.name = "nothing";
  EXPECT_NE(message({empty}, {}).find("'nothing' has no value"), std::string::npos);
}

}  // namespace
}  // namespace switchyard::train
