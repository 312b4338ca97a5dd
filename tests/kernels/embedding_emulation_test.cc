// The device code of the embedding ops (kernels/cuda/embedding_kernels.cuh) and of the
// cross-entropy (kernels/cuda/cross_entropy_kernels.cuh) run on the CPU, without a GPU,
// through the host model of CUDA in tests/kernels/cuda_emulation.h, with the .cu files' launch
// shapes (the backward's and the row kernel's from the .cuh helpers; the grid-stride kernels'
// from device_common.cuh's GridFor with its cap lowered so that the loops stride), against the CPU
// twins (kernels/cpu/embedding.cc, kernels/cpu/cross_entropy.cc).
//
// What it checks:
//  - the id check: the first bad position (negative, >= V, INT32_MIN, INT32_MAX) whatever the
//    order the CTAs meet them (a later CTA holds the smallest), no bad id: the word untouched;
//  - the gather: bit-equal rows, a bad id's row left as it was (NaN);
//  - the backward over the ids sorted as cub's stable radix sort leaves them (a stable sort by
//    signed id, done here on the host): rows of ids with <= 64 rows bit-equal to the CPU,
//    runs of exactly 64 across a chunk boundary and on one; hot ids (> 64 rows, pieces cut
//    mid-chunk, ending on a chunk boundary, one of a single row) the same bits as the
//    documented two-level order and within gamma(count) sum |terms| of the exact sum (so
//    within twice that of the CPU's running sum); unused ids' rows untouched; bad ids (a long
//    run of them too) skipped; the same bits for any grid; the partial slots only read once
//    written (NaN-filled);
//  - the positions: forward and backward bit-equal to the CPU, dwpe rows outside the window
//    untouched, a batch of zero;
//  - the cross-entropy: per-row losses and the gradient within bounds by construction of the
//    exact values (double) and of the CPU twin's, the loss sum and count, ignored rows
//    (ignore_index -1 and one inside the vocabulary: loss 0, gradient +0), vocabularies not a
//    multiple of the block (1, 2, 31, 33, 1000, 5000: 32 to 1024 threads), rows past the grid,
//    in place (the same bits as out of place), without a gradient (the same losses),
//    more than 1024 rows for the sum's block, CountTargets, and bad targets (the first bad
//    row whatever the CTA order; loss 0 and gradient 0 there).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/tensor.h"
#include "kernels/cross_entropy.h"
#include "kernels/embedding.h"
#include "tests/kernels/cross_entropy_bound.h"
// Last: the host model defines CUDA's qualifiers as macros. The cross-entropy kernels declare
// their shared arrays inside the kernel: static, they are one array for the CTA's threads.
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

#include "kernels/cuda/cross_entropy_kernels.cuh"
#include "kernels/cuda/embedding_kernels.cuh"

namespace switchyard::kernels {
namespace {

namespace emb = cuda::embedding;
namespace ce = cuda::cross_entropy;

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
using ce_bound::Gamma;
using ce_bound::kU;
using ce_bound::kUd;


std::vector<float> Uniform(int64_t n, uint32_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> pick(lo, hi);
  std::vector<float> x(static_cast<size_t>(n));
  for (float& e : x) e = pick(rng);
  return x;
}

// The .cu's grid (blocks of emb::kThreads covering n) with its cap lowered to `cap`.
unsigned GridFor(int64_t n, int64_t cap) { return cuda::GridFor(n, emb::kThreads, cap); }

template <typename Kernel>
void RunKernel(unsigned blocks, int threads, Kernel kernel) {
  unsigned char unused_smem[1];
  emu::Launch(EmuDim3{blocks, 1, 1}, threads, unused_smem, 0, 0, kernel);
}

bool SameBits(const float* a, const float* b, int64_t n) {
  return n == 0 || std::memcmp(a, b, static_cast<size_t>(n) * sizeof(float)) == 0;
}

// ---- Embedding lookups.

// The id check and the gather as embedding.cu launches them; returns the bad-id word.
unsigned long long RunForward(const std::vector<int32_t>& ids, const std::vector<float>& table,
                              int64_t v, int64_t d, int64_t cap, std::vector<float>& out) {
  const int64_t n = static_cast<int64_t>(ids.size());
  unsigned long long first_bad = emb::kNoBadId;  // the .cu's 0xff memset
  RunKernel(GridFor(n, cap), emb::kThreads,
            [&] { emb::ValidateIdsKernel(ids.data(), n, v, &first_bad); });
  RunKernel(GridFor(n * d, cap), emb::kThreads,
            [&] { emb::GatherKernel(ids.data(), table.data(), out.data(), n, d, v); });
  return first_bad;
}

// n ids in [0, v) with the given (position, bad id) pairs.
std::vector<int32_t> IdsWith(int64_t n, int64_t v, uint32_t seed,
                             const std::vector<std::pair<int64_t, int32_t>>& bad) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(v - 1));
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int32_t& id : ids) id = pick(rng);
  for (const auto& [i, id] : bad) ids[i] = id;
  return ids;
}

bool Valid(int32_t id, int64_t v) { return id >= 0 && id < v; }

void CheckForward(const std::vector<int32_t>& ids, int64_t v, int64_t d, int64_t cap,
                  unsigned long long want_bad, uint32_t seed) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const std::string name = "gather n " + std::to_string(n) + " v " + std::to_string(v) + " d " +
                           std::to_string(d) + " grid cap " + std::to_string(cap);
  const std::vector<float> table = Uniform(v * d, seed);
  std::vector<float> got(static_cast<size_t>(n * d), kNaN);
  EXPECT_EQ(RunForward(ids, table, v, d, cap, got), want_bad) << name;
  // The CPU twin on the ids with the bad ones replaced by 0 (it fails on a bad id).
  std::vector<int32_t> clean = ids;
  for (int32_t& id : clean) id = Valid(id, v) ? id : 0;
  Tensor want = Tensor::Empty({n, d}, DType::kF32);
  EmbeddingForward(Tensor::FromVector(clean, {n}), Tensor::FromVector(table, {v, d}), want);
  const std::vector<float> w = want.ToVector<float>();
  for (int64_t i = 0; i < n; ++i) {
    const float* row = got.data() + i * d;
    if (Valid(ids[i], v)) {
      ASSERT_TRUE(SameBits(row, w.data() + i * d, d)) << name << " row " << i;
    } else {
      for (int64_t j = 0; j < d; ++j) ASSERT_TRUE(std::isnan(row[j])) << name << " bad row " << i;
    }
  }
}

TEST(EmbeddingEmulationTest, IdCheckAndGather) {
  // Grid cap 2 of 256 threads: CTA 0 checks positions [0, 256) and [512, 768), CTA 1 [256,
  // 512) and [768, 1000). CTA 0 runs first and meets 700 before CTA 1 meets 300.
  CheckForward(IdsWith(1000, 5, 1, {{700, 5}, {300, -1}, {900, INT32_MIN}, {950, INT32_MAX}}), 5,
               33, 2, 300, 11);
  CheckForward(IdsWith(1000, 5, 2, {{999, 7}, {520, -2}}), 5, 3, 2, 520, 12);
  CheckForward(IdsWith(1000, 7, 3, {}), 7, 1, 3, emb::kNoBadId, 13);
  CheckForward(IdsWith(37, 100, 4, {{0, 100}}), 100, 300, 1000, 0, 14);  // 44 CTAs, exact grid
  CheckForward(IdsWith(1, 1, 5, {}), 1, 1, 1000, emb::kNoBadId, 15);
}

// The positions as embedding.cu's IotaKernel writes them and cub's stable radix sort by signed
// id leaves them (a stable sort: each id's positions in increasing order), and those ids.
struct Sorted {
  std::vector<int32_t> ids, rows;
};
Sorted SortById(const std::vector<int32_t>& ids, int64_t cap) {
  const int64_t n = static_cast<int64_t>(ids.size());
  Sorted s;
  s.rows.assign(static_cast<size_t>(n), -1);
  RunKernel(GridFor(n, cap), emb::kThreads, [&] { emb::IotaKernel(s.rows.data(), n); });
  for (int64_t i = 0; i < n; ++i) EXPECT_EQ(s.rows[i], i) << "iota";
  std::stable_sort(s.rows.begin(), s.rows.end(),
                   [&](int32_t a, int32_t b) { return ids[a] < ids[b]; });
  for (int32_t r : s.rows) s.ids.push_back(ids[r]);
  return s;
}

// Both stages of the backward as embedding.cu launches them, grids capped at max_blocks.
void RunBackward(const Sorted& s, const std::vector<float>& dout, int64_t v, int64_t d,
                 int64_t max_blocks, std::vector<float>& dtable) {
  const int64_t n = static_cast<int64_t>(s.ids.size());
  const emb::BackwardLaunch l = emb::BackwardShape(n, d, max_blocks);
  std::vector<float> partial(static_cast<size_t>(2 * l.chunks * d), kNaN);  // the .cu: unset
  RunKernel(l.chunk_blocks, l.threads, [&] {
    emb::ScatterAddPiecesKernel(s.ids.data(), s.rows.data(), n, dout.data(), dtable.data(),
                                partial.data(), d, v);
  });
  RunKernel(l.blocks, l.threads,
            [&] { emb::AddPiecesKernel(s.ids.data(), n, partial.data(), dtable.data(), d, v); });
}

// Column j of a hot id's row in the documented order: base + the pieces of its sorted run
// [h, e) cut at multiples of kPieceRows, each summed in order from 0.
float TwoLevelSum(float base, const Sorted& s, int64_t h, int64_t e, const std::vector<float>& dout,
                  int64_t d, int64_t j) {
  float acc = base;
  for (int64_t p = h; p < e;) {
    const int64_t end = std::min(e, (p / emb::kPieceRows + 1) * emb::kPieceRows);
    float piece = 0.0f;
    for (int64_t q = p; q < end; ++q) piece += dout[s.rows[q] * d + j];
    acc += piece;
    p = end;
  }
  return acc;
}

// dtable (v, d) after the backward of ids (bad ones among them) and dout, from dtable0.
void CheckBackwardRows(const std::vector<int32_t>& ids, const Sorted& s,
                       const std::vector<float>& dout, const std::vector<float>& dtable0, int64_t v,
                       int64_t d, const std::vector<float>& got, const std::string& name) {
  const int64_t n = static_cast<int64_t>(ids.size());
  // The CPU twin on the valid (id, row) pairs in their order.
  std::vector<int32_t> valid_ids;
  std::vector<float> valid_rows;
  for (int64_t i = 0; i < n; ++i) {
    if (!Valid(ids[i], v)) continue;
    valid_ids.push_back(ids[i]);
    valid_rows.insert(valid_rows.end(), dout.begin() + i * d, dout.begin() + (i + 1) * d);
  }
  const int64_t nv = static_cast<int64_t>(valid_ids.size());
  Tensor want = Tensor::FromVector(dtable0, {v, d});
  EmbeddingBackward(Tensor::FromVector(valid_ids, {nv}), Tensor::FromVector(valid_rows, {nv, d}),
                    want);
  const std::vector<float> w = want.ToVector<float>();
  int64_t hot = 0;
  double used = 0.0;  // the most of the hot ids' bound used against the CPU
  for (int64_t id = 0; id < v; ++id) {
    const auto run = std::equal_range(s.ids.begin(), s.ids.end(), static_cast<int32_t>(id));
    const int64_t h = run.first - s.ids.begin(), e = run.second - s.ids.begin(), count = e - h;
    const float* row = got.data() + id * d;
    if (count == 0) {
      ASSERT_TRUE(SameBits(row, dtable0.data() + id * d, d)) << name << ": unused id " << id;
    } else if (count <= emb::kPieceRows) {
      ASSERT_TRUE(SameBits(row, w.data() + id * d, d))
          << name << ": id " << id << " of " << count << " rows";
    } else {
      ++hot;
      for (int64_t j = 0; j < d; ++j) {
        const float base = dtable0[id * d + j];
        ASSERT_EQ(row[j], TwoLevelSum(base, s, h, e, dout, d, j))
            << name << ": hot id " << id << " of " << count << " rows, column " << j;
        double exact = base, mag = std::fabs(base);
        for (int64_t q = h; q < e; ++q) {
          exact += dout[s.rows[q] * d + j];
          mag += std::fabs(dout[s.rows[q] * d + j]);
        }
        // Any order of the count additions: gamma(count) mag; the double sum's own error.
        const double bound = Gamma(count) * mag + Gamma(count, kUd) * mag;
        ASSERT_LE(std::fabs(row[j] - exact), bound) << name << " hot id " << id << " col " << j;
        const double diff = std::fabs(row[j] - double(w[id * d + j]));
        ASSERT_LE(diff, 2 * bound) << name << " vs cpu";
        used = std::max(used, diff / (2 * bound));
      }
    }
  }
  std::printf("  %-52s %lld hot ids, bound used vs cpu %.3f, others bit-equal\n", name.c_str(),
              static_cast<long long>(hot), used);
}

// Ids with the given number of rows each (id = index), plus the bad ids, shuffled.
std::vector<int32_t> IdsOfCounts(const std::vector<int64_t>& counts,
                                 const std::vector<int32_t>& bad, uint32_t seed) {
  std::vector<int32_t> ids = bad;
  for (size_t id = 0; id < counts.size(); ++id) ids.insert(ids.end(), counts[id], int32_t(id));
  std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
  return ids;
}

void CheckBackward(const std::vector<int32_t>& ids, int64_t v, int64_t d,
                   const std::vector<int64_t>& caps, uint32_t seed) {
  const int64_t n = static_cast<int64_t>(ids.size());
  const std::vector<float> dout = Uniform(n * d, seed), dtable0 = Uniform(v * d, seed + 1);
  std::vector<float> first;
  for (int64_t cap : caps) {
    const std::string name =
        "backward n " + std::to_string(n) + " v " + std::to_string(v) + " d " + std::to_string(d) +
        (cap == emb::kMaxBlocks ? " full grid" : " grid cap " + std::to_string(cap));
    const Sorted s = SortById(ids, cap);
    std::vector<float> got = dtable0;
    RunBackward(s, dout, v, d, cap, got);
    CheckBackwardRows(ids, s, dout, dtable0, v, d, got, name);
    if (first.empty()) first = got;
    ASSERT_TRUE(SameBits(got.data(), first.data(), v * d)) << name << ": depends on the grid";
  }
}

// Sorted runs (64-row chunks): id 0 [0, 37), id 1 [37, 237) (pieces of 27, 64, 64, 45), id 2
// [237, 301) (64 rows across a boundary), id 3 [301, 366) (65: pieces of 19 and 46), id 4
// unused, id 5 one row, id 6 [367, 431), id 7 [431, 560) (17, 64, 48), id 8 [560, 640) (ends
// on a boundary), id 9 [640, 704) (64 rows, one whole chunk), id 10 [704, 769) (64 then 1),
// id 11 three rows, id 12 unused, id 13 two rows: 774 positions, 13 chunks, the last of 6.
const std::vector<int64_t> kCounts = {37, 200, 64, 65, 0, 1, 64, 129, 80, 64, 65, 3, 0, 2};

TEST(EmbeddingEmulationTest, BackwardPiecesAndShortRuns) {
  const int64_t v = static_cast<int64_t>(kCounts.size());
  // Uncapped (BackwardShape's grids: 13 and 774 blocks) and capped (the stages stride).
  CheckBackward(IdsOfCounts(kCounts, {}, 21), v, 33, {emb::kMaxBlocks, 5}, 31);
  CheckBackward(IdsOfCounts(kCounts, {}, 22), v, 300, {7}, 32);  // 256 threads, 2 columns each
  CheckBackward(IdsOfCounts(kCounts, {}, 23), v, 1, {3}, 33);
  // Bad ids sort first (70 of -1: a long run of them) and last, shifting every chunk.
  const std::vector<int32_t> bad = [&] {
    std::vector<int32_t> b(70, -1);
    b.insert(b.end(), {INT32_MIN, static_cast<int32_t>(v), INT32_MAX, static_cast<int32_t>(v)});
    return b;
  }();
  CheckBackward(IdsOfCounts(kCounts, bad, 24), v, 33, {emb::kMaxBlocks, 4}, 34);
}

TEST(EmbeddingEmulationTest, BackwardOfOneIdAndRandomIds) {
  CheckBackward(IdsOfCounts({65}, {}, 41), 1, 8, {emb::kMaxBlocks}, 51);  // pieces of 64 and 1
  CheckBackward(IdsOfCounts({0, 64}, {}, 42), 2, 8, {emb::kMaxBlocks}, 52);
  CheckBackward(IdsOfCounts({3, 125}, {}, 46), 2, 8, {emb::kMaxBlocks}, 56);  // ends at n = 128
  CheckBackward(IdsOfCounts({1}, {}, 43), 1, 1, {emb::kMaxBlocks}, 53);
  CheckBackward(IdsWith(1000, 7, 44, {}), 7, 31, {9}, 54);     // every id hot
  CheckBackward(IdsWith(1000, 300, 45, {}), 300, 2, {9}, 55);  // none hot
}

// ---- Learned positions.

void CheckPositions(int64_t nb, int64_t s, int64_t d, int64_t s_max, int64_t offset, int64_t cap,
                    uint32_t seed) {
  const std::string name = "positions (" + std::to_string(nb) + ", " + std::to_string(s) + ", " +
                           std::to_string(d) + ") offset " + std::to_string(offset);
  const std::vector<float> x0 = Uniform(nb * s * d, seed), wpe = Uniform(s_max * d, seed + 1);
  const int64_t total = nb * s * d;
  std::vector<float> x = x0;
  if (total > 0) {
    RunKernel(GridFor(total, cap), emb::kThreads,
              [&] { emb::AddPositionKernel(x.data(), wpe.data(), total, s, d, offset); });
  }
  Tensor want_x = Tensor::FromVector(x0, {nb, s, d});
  AddPositionEmbedding(want_x, Tensor::FromVector(wpe, {s_max, d}), offset);
  EXPECT_TRUE(SameBits(x.data(), want_x.ToVector<float>().data(), total)) << name << " forward";

  const std::vector<float> dwpe0 = Uniform(s_max * d, seed + 2);
  std::vector<float> dwpe = dwpe0;
  RunKernel(GridFor(s * d, cap), emb::kThreads,
            [&] { emb::PositionBackwardKernel(x0.data(), dwpe.data(), nb, s, d, offset); });
  Tensor want = Tensor::FromVector(dwpe0, {s_max, d});
  PositionEmbeddingBackward(Tensor::FromVector(x0, {nb, s, d}), want, offset);
  EXPECT_TRUE(SameBits(dwpe.data(), want.ToVector<float>().data(), s_max * d)) << name;
  EXPECT_TRUE(SameBits(dwpe.data(), dwpe0.data(), offset * d)) << name << ": rows before";
  const int64_t after = (offset + s) * d;
  EXPECT_TRUE(SameBits(dwpe.data() + after, dwpe0.data() + after, s_max * d - after)) << name;
}

TEST(EmbeddingEmulationTest, PositionsBitEqualToCpu) {
  CheckPositions(1, 1, 1, 1, 0, 1000, 61);
  CheckPositions(3, 7, 33, 16, 5, 1000, 62);
  CheckPositions(2, 31, 100, 40, 9, 3, 63);  // 6200 elements over 3 blocks of 256
  CheckPositions(5, 3, 200, 4, 1, 1, 64);    // one block: the backward strides over 600
  CheckPositions(0, 4, 8, 8, 2, 1000, 65);   // no batch: dwpe as it was
}

// ---- Cross-entropy.

// The row kernel and (sum_rows) the sum as cross_entropy.cu's RunCrossEntropy launches them
// (the row grid capped at max_blocks); dlogits null: no gradient, or the logits' memory.
ce::DeviceSums RunCrossEntropy(const float* logits, const std::vector<int32_t>& targets,
                               float* dlogits, int64_t v, double grad_scale, int32_t ignore_index,
                               int64_t max_blocks, std::vector<double>& row_loss, double* slots,
                               bool sum_rows = true) {
  const int64_t n = static_cast<int64_t>(targets.size());
  ce::DeviceSums sums{0.0, 0, ce::kNoBadRow};  // as the .cu's NewDeviceSums
  row_loss.assign(static_cast<size_t>(n), std::numeric_limits<double>::quiet_NaN());
  const ce::RowLaunch l = ce::RowShape(n, v, max_blocks);
  RunKernel(l.blocks, l.threads, [&] {
    ce::CrossEntropyRowKernel(logits, targets.data(), dlogits, n, v, static_cast<float>(grad_scale),
                              ignore_index, row_loss.data(), &sums.first_bad_row);
  });
  if (sum_rows) {
    RunKernel(1, ce::kSumThreads, [&] {
      ce::SumRowsKernel(row_loss.data(), targets.data(), n, ignore_index, &sums, slots);
    });
  }
  return sums;
}

// The kernel's bounds: tests/kernels/cross_entropy_bound.h. The CPU twin's, for comparing the
// two: VecExp's 2 ulp, x - max rounded, summed in 16 f32 lanes (gamma(v / 16 + 1)), then
// double; its gradient relative to scale p: VecExp (4u), x - max rounded (u |x - max|), S's
// error, the division's cast and the product (3u).
double CpuLogBound(const ce_bound::RowBounds& b, int64_t v) {
  return 1.01 * (4 * kU + kU * b.range + Gamma(static_cast<double>(v / 16 + 1)));
}

struct CeCase {
  int64_t n, v;
  double p_ignore;
  int32_t ignore_index;
  int64_t cap;  // row grid cap
};

std::vector<int32_t> RandomTargets(int64_t n, int64_t v, double p_ignore, int32_t ignore,
                                   uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<int32_t> pick(0, static_cast<int32_t>(v - 1));
  std::bernoulli_distribution drop(p_ignore);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& target : t) target = drop(rng) ? ignore : pick(rng);
  return t;
}

// The emulated row losses, gradient and sums against the exact values and the CPU twin's.
void CheckAgainstCpu(const CeCase& c, const std::vector<float>& logits,
                     const std::vector<int32_t>& targets, double scale,
                     const std::vector<double>& row_loss, const std::vector<float>& dl,
                     const ce::DeviceSums& sums, const std::string& name) {
  const int64_t n = c.n, v = c.v;
  Tensor want_dl = Tensor::Empty({n, v}, DType::kF32);
  const CrossEntropySums want =
      CrossEntropyForwardBackward(Tensor::FromVector(logits, {n, v}),
                                  Tensor::FromVector(targets, {n}), want_dl, scale, c.ignore_index);
  const std::vector<float> w = want_dl.ToVector<float>();
  EXPECT_EQ(static_cast<int64_t>(sums.count), want.count) << name;
  double sum_bound = 0.0, loss_mag = 0.0;
  double used_loss = 0.0, used_grad = 0.0, used_grad_cpu = 0.0;  // the most of a bound used
  for (int64_t r = 0; r < n; ++r) {
    const float* x = logits.data() + r * v;
    const int32_t t = targets[r];
    if (t == c.ignore_index) {
      ASSERT_EQ(row_loss[r], 0.0) << name << " ignored row " << r;
      ASSERT_TRUE(SameBits(dl.data() + r * v, w.data() + r * v, v)) << name << " ignored " << r;
      continue;
    }
    const ce_bound::RowBounds b = ce_bound::BoundsOf(x, v, t);
    const double log_cpu = CpuLogBound(b, v);
    ASSERT_LE(std::fabs(row_loss[r] - b.loss), b.loss_bound()) << name << " row " << r;
    used_loss = std::max(used_loss, std::fabs(row_loss[r] - b.loss) / b.loss_bound());
    sum_bound += b.loss_bound() + log_cpu + b.slack;
    loss_mag += std::fabs(b.loss);
    for (int64_t j = 0; j < v; ++j) {
      const double p = std::exp(double(x[j]) - b.lse);
      const float got = dl[r * v + j], cpu = w[r * v + j];
      const ce_bound::GradBound g = ce_bound::GpuGradBound(b, x[j], scale, j == t, got);
      const double exact = g.exact, bound = g.bound;
      const double eps_cpu = 1.01 * (6 * kU + kU * b.range + log_cpu);
      // The GPU's bound with the CPU's relative error added, and u of the CPU's target.
      const double bound_cpu = bound + eps_cpu * scale * p + (j == t) * kU * std::fabs(cpu);
      ASSERT_LE(std::fabs(got - exact), bound) << name << " row " << r << " column " << j;
      ASSERT_LE(std::fabs(double(got) - cpu), bound_cpu)
          << name << " vs cpu, row " << r << " column " << j;
      if (bound > 0) used_grad = std::max(used_grad, std::fabs(got - exact) / bound);
      if (bound_cpu > 0) {
        used_grad_cpu = std::max(used_grad_cpu, std::fabs(double(got) - cpu) / bound_cpu);
      }
    }
  }
  // Both add the row losses in double, in other orders.
  const double bound = ce_bound::SumBound(sum_bound, loss_mag, n);
  EXPECT_LE(std::fabs(sums.loss_sum - want.loss_sum), bound) << name;
  std::printf("  %-52s bound used: row loss %.3f, loss sum %.3f, gradient %.3f (vs cpu %.3f)\n",
              name.c_str(), used_loss,
              bound > 0 ? std::fabs(sums.loss_sum - want.loss_sum) / bound : 0.0, used_grad,
              used_grad_cpu);
}

void CheckCrossEntropy(const CeCase& c, uint32_t seed) {
  const int64_t n = c.n, v = c.v;
  const std::string name = "cross entropy n " + std::to_string(n) + " v " + std::to_string(v) +
                           " ignore " + std::to_string(c.ignore_index) + " row grid cap " +
                           std::to_string(c.cap);
  const std::vector<float> logits = Uniform(n * v, seed, -4.0f, 4.0f);
  const std::vector<int32_t> targets = RandomTargets(n, v, c.p_ignore, c.ignore_index, seed);
  const int64_t count = cpu::CountTargets(Tensor::FromVector(targets, {n}), c.ignore_index);
  const double scale = count > 0 ? 1.0 / static_cast<double>(count) : 0.0;

  std::vector<float> dl(static_cast<size_t>(n * v), kNaN);  // every element must be written
  std::vector<double> row_loss;
  double slots[2] = {kNaN, kNaN};
  const ce::DeviceSums sums = RunCrossEntropy(logits.data(), targets, dl.data(), v, scale,
                                              c.ignore_index, c.cap, row_loss, slots);
  EXPECT_EQ(sums.first_bad_row, ce::kNoBadRow) << name;
  EXPECT_EQ(slots[0], sums.loss_sum) << name;
  EXPECT_EQ(slots[1], static_cast<double>(sums.count)) << name;
  CheckAgainstCpu(c, logits, targets, scale, row_loss, dl, sums, name);

  // In place over the logits: the same bits. Without a gradient: the same losses. (The sum
  // of the same row losses is skipped: its 1024 threads are the slow part here.)
  std::vector<float> in_place = logits;
  std::vector<double> loss_in_place, loss_no_grad;
  RunCrossEntropy(in_place.data(), targets, in_place.data(), v, scale, c.ignore_index, c.cap,
                  loss_in_place, nullptr, false);
  EXPECT_TRUE(SameBits(in_place.data(), dl.data(), n * v)) << name << " in place";
  RunCrossEntropy(logits.data(), targets, nullptr, v, scale, c.ignore_index, c.cap, loss_no_grad,
                  nullptr, false);
  const size_t bytes = static_cast<size_t>(n) * sizeof(double);
  EXPECT_EQ(0, std::memcmp(loss_in_place.data(), row_loss.data(), bytes)) << name << " in place";
  EXPECT_EQ(0, std::memcmp(loss_no_grad.data(), row_loss.data(), bytes)) << name << " no grad";
}

TEST(CrossEntropyEmulationTest, LossAndGradientWithinBoundsOfTheCpu) {
  const CeCase cases[] = {
      {1, 1, 0.0, -1, 1000},      // one logit: loss 0, gradient 0
      {7, 33, 0.3, -1, 3},        // 32 threads, rows past the grid
      {5, 1000, 0.25, -1, 1000},  // 256 threads, 1000 = 3 x 256 + 232
      {2, 5000, 0.0, -1, 1},      // 1024 threads (the cap), 5000 = 4 x 1024 + 904
      {50, 31, 0.4, 3, 4},        // ignore_index inside the vocabulary
      {4, 17, 1.0, -1, 1000},     // every row ignored
      {1100, 2, 0.95, -1, 8},     // more rows than the sum's 1024 threads (most ignored)
  };
  uint32_t seed = 70;
  for (const CeCase& c : cases) CheckCrossEntropy(c, ++seed);
}

TEST(CrossEntropyEmulationTest, BadTargetsAndCountTargets) {
  // ignore_index 3: rows 0 and 4 ignored; rows 1 (50), 6 (-1) and 8 (10 = V) bad. Row grid 3:
  // CTA 0 takes rows 0, 3, 6, 9 and runs first, so it meets row 6 before CTA 1 meets row 1.
  const int64_t n = 10, v = 10;
  const std::vector<int32_t> targets = {3, 50, 2, 0, 3, 9, -1, 4, 10, 1};
  const std::vector<float> logits = Uniform(n * v, 81, -4.0f, 4.0f);
  std::vector<float> dl(static_cast<size_t>(n * v), kNaN);
  std::vector<double> row_loss;
  const ce::DeviceSums sums =
      RunCrossEntropy(logits.data(), targets, dl.data(), v, 0.125, 3, 3, row_loss, nullptr);
  EXPECT_EQ(sums.first_bad_row, 1u);
  // A bad row: loss 0 and gradient 0, as an ignored one; counted (targets != ignore_index).
  for (int64_t r : {1, 6, 8}) {
    EXPECT_EQ(row_loss[r], 0.0) << "bad row " << r;
    for (int64_t j = 0; j < v; ++j) ASSERT_EQ(dl[r * v + j], 0.0f) << "bad row " << r;
  }
  EXPECT_EQ(sums.count, 8u);
  // The other rows as the CPU's with the bad targets ignored.
  std::vector<int32_t> clean = targets;
  for (int64_t r : {1, 6, 8}) clean[r] = 3;
  std::vector<double> clean_loss;
  std::vector<float> clean_dl(static_cast<size_t>(n * v), kNaN);
  const ce::DeviceSums clean_sums =
      RunCrossEntropy(logits.data(), clean, clean_dl.data(), v, 0.125, 3, 3, clean_loss, nullptr);
  EXPECT_TRUE(SameBits(clean_dl.data(), dl.data(), n * v));
  EXPECT_EQ(clean_sums.loss_sum, sums.loss_sum);
  CheckAgainstCpu({n, v, 0.0, 3, 3}, logits, clean, 0.125, clean_loss, clean_dl, clean_sums,
                  "bad targets ignored");
  // The step readback's slots (CrossEntropyInto, training): the loss slot is NaN with a bad
  // target, so the step's non-finite check stops it; the clean targets' slots hold the sums.
  double slots[2] = {-1.0, -1.0}, clean_slots[2] = {-1.0, -1.0};
  RunCrossEntropy(logits.data(), targets, dl.data(), v, 0.125, 3, 3, row_loss, slots);
  EXPECT_TRUE(std::isnan(slots[0])) << slots[0];
  EXPECT_EQ(slots[1], 8.0);
  RunCrossEntropy(logits.data(), clean, clean_dl.data(), v, 0.125, 3, 3, clean_loss, clean_slots);
  EXPECT_EQ(clean_slots[0], clean_sums.loss_sum);
  EXPECT_EQ(clean_slots[1], static_cast<double>(clean_sums.count));

  // CountTargets: the sum kernel without row losses.
  for (int64_t rows : {int64_t{1}, int64_t{1100}}) {
    const std::vector<int32_t> t = RandomTargets(rows, 5, 0.3, -1, 90 + rows);
    ce::DeviceSums count{0.0, 0, ce::kNoBadRow};
    RunKernel(1, ce::kSumThreads, [&] { ce::SumRowsKernel(nullptr, t.data(), rows, -1, &count); });
    EXPECT_EQ(static_cast<int64_t>(count.count),
              cpu::CountTargets(Tensor::FromVector(t, {rows}), -1));
    EXPECT_EQ(count.loss_sum, 0.0);
  }
}

}  // namespace
}  // namespace switchyard::kernels
