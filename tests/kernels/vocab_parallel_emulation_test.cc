// The vocabulary-parallel pieces' device code (kernels/cuda/vocab_parallel_kernels.cuh: the
// row max and exp-sum, the target logit, the softmax gradient, the shard's embedding lookup,
// and its backward: local rows, positions, and the runs of the sorted local rows added in
// position order) run on the CPU, without a GPU, through the host model of CUDA in
// tests/kernels/cuda_emulation.h, with vocab_parallel.cu's launch shapes (RowThreads,
// RowBlocks and RunThreads; the grid-stride kernels on device_common.cuh's GridFor; both caps
// lowered so that the loops stride), against the CPU twin (kernels/cpu/vocab_parallel.cc).
// CUB's radix sort between the backward's kernels is a stable sort by local row here: a radix
// sort over bits [0, KeyBits(rows)) is stable, and every key fits in those bits (checked).
//
// What it checks (u = 2^-24, gamma_d(m) = m 2^-53 / (1 - m 2^-53)):
//  - the row max: the CPU's bits, padding columns (1e30) never read, -inf with no valid column;
//  - the exp-sum: within (4u [expf's 2 ulp] + gamma_d(valid) + u [the f32 result]) T of the
//    exact T = sum exp(fl(x - max)) (the same rounded differences on both sides), and within
//    that plus (u + u_d + gamma_d(valid)) T of the CPU's (exp in double); +0 with no valid column;
//  - the target logit: the CPU's bits, for targets of this shard, of other ranks, in the
//    padding columns, negative, and ignored (ignore_index outside and inside the shard);
//  - the softmax gradient: +0 on padding columns and ignored rows; elsewhere
//    |g - g_cpu| <= |scale| |p - p_cpu| + gamma(2) |scale| (|p - t| + |p_cpu - t|) with
//    |p - p_cpu| <= (4u + u + u_d + 2u) q, q = exp(fl(x - m)) / s exact (expf's 2 ulp; the
//    CPU's exp in double rounded to f32; each side's division); dlogits in place of the
//    logits: the same bits; rows of 1 to 5000 columns, padding, valid 0;
//  - the embedding lookup: the CPU's bits, zeros for other ranks' and negative ids, every
//    element written;
//  - the embedding backward: the CPU's bits (each run's rows added in position order, as the
//    CPU's loop), with a hot row (300 positions), ids of other ranks and negative ones, rows
//    never looked up left as they were, d = 1, 40 and 300 (columns striding over 256 threads),
//    runs striding over a capped grid.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/tensor.h"
#include "kernels/vocab_parallel.h"
// Last: the host model defines CUDA's qualifiers as macros. The row kernels declare their
// shared arrays inside the kernel: static, they are one array for the CTA's threads.
#include "tests/kernels/cuda_emulation.h"
#undef __shared__
#define __shared__ static

#include "kernels/cuda/vocab_parallel_kernels.cuh"
#include "tests/kernels/emulation_test_util.h"

namespace switchyard::kernels {
namespace {

namespace vd = cuda::vocab_dev;

unsigned GridFor(int64_t n, int64_t cap) { return cuda::GridFor(n, vd::kThreads, cap); }

template <typename T>
bool SameBits(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}
bool IsPlusZero(float v) { return v == 0.0f && !std::signbit(v); }

// ---- The cross-entropy pieces.

struct ShardCase {
  int64_t n, c, valid, start;
  int32_t ignore;
  int64_t cap;  // the row grid's and the grid-stride kernels' cap
};

std::string Name(const ShardCase& k, const char* what) {
  return std::string(what) + " n " + std::to_string(k.n) + " c " + std::to_string(k.c) +
         " valid " + std::to_string(k.valid) + " start " + std::to_string(k.start) + " ignore " +
         std::to_string(k.ignore) + " cap " + std::to_string(k.cap);
}

const ShardCase kShardCases[] = {
    {1, 1, 1, 0, -100, 1000},
    {5, 37, 37, 37, -100, 1000},   // 32 threads, two columns for five of them
    {6, 37, 20, 100, 105, 4},      // 17 padding columns; ignore_index inside the shard
    {3, 10, 0, 30, -100, 1000},    // padding only
    {3, 5000, 4999, 0, -1, 2},     // 1024 threads (the cap); rows past the grid
    {40, 33, 33, 66, -100, 3},     // more rows than the capped grid
};

struct ShardData {
  std::vector<float> x;
  std::vector<int32_t> t;
};

// Logits in [-6, 6] with 1e30 in the padding columns (the max or exp-sum of a padding column
// shows); targets of this shard, other ranks', the padding's, negative, and ignored.
ShardData MakeShard(const ShardCase& k, uint32_t seed) {
  ShardData d{Uniform(k.n * k.c, seed, -6.0f, 6.0f), std::vector<int32_t>(k.n)};
  for (int64_t r = 0; r < k.n; ++r) {
    for (int64_t j = k.valid; j < k.c; ++j) d.x[r * k.c + j] = 1e30f;
  }
  std::mt19937 rng(seed);
  for (int64_t r = 0; r < k.n; ++r) {
    const int64_t pick = rng() % 8, col = static_cast<int64_t>(rng() % k.c);
    int64_t id = k.start + std::min<int64_t>(col, std::max<int64_t>(k.valid - 1, 0));
    if (pick == 5) id = k.start + k.c + col;  // the next rank's
    if (pick == 6) id = k.start + k.valid + col % std::max<int64_t>(k.c - k.valid, 1);  // padding
    if (pick == 7) id = r % 2 ? -5 : k.ignore;
    d.t[r] = static_cast<int32_t>(id);
  }
  return d;
}

void CheckRowReductions(const ShardCase& k, const ShardData& d) {
  const std::string name = Name(k, "row max / exp sum");
  const Tensor logits = Tensor::FromVector(d.x, {k.n, k.c});
  std::vector<float> m(static_cast<size_t>(k.n), kNaN), s(static_cast<size_t>(k.n), kNaN);
  RunKernel(vd::RowBlocks(k.n, k.cap), vd::RowThreads(k.valid),
            [&] { vd::RowMaxKernel(d.x.data(), k.n, k.c, k.valid, m.data()); });
  Tensor want_m = Tensor::Empty({k.n}, DType::kF32), want_s = Tensor::Empty({k.n}, DType::kF32);
  cpu::VocabShardRowMax(logits, k.valid, want_m);
  EXPECT_TRUE(SameBits(m, want_m.ToVector<float>())) << name << ": max";
  RunKernel(vd::RowBlocks(k.n, k.cap), vd::RowThreads(k.valid),
            [&] { vd::ExpSumKernel(d.x.data(), k.n, k.c, k.valid, m.data(), s.data()); });
  cpu::VocabShardExpSum(logits, k.valid, want_m, want_s);
  const std::vector<float> cpu_s = want_s.ToVector<float>();
  double used = 0.0;
  for (int64_t r = 0; r < k.n; ++r) {
    if (k.valid == 0) {
      ASSERT_TRUE(IsPlusZero(s[r]) && IsPlusZero(cpu_s[r])) << name << " row " << r;
      continue;
    }
    double exact = 0.0;
    for (int64_t j = 0; j < k.valid; ++j) exact += std::exp(double(d.x[r * k.c + j] - m[r]));
    const double own = 1.01 * (4 * kU + kU + 2 * Gamma(k.valid, kUd)) * exact;
    const double cpu = 1.01 * (kU + kUd + 2 * Gamma(k.valid, kUd)) * exact;
    ASSERT_LE(std::fabs(s[r] - exact), own) << name << " row " << r;
    ASSERT_LE(std::fabs(double(s[r]) - cpu_s[r]), own + cpu) << name << " vs cpu, row " << r;
    used = std::max(used, std::fabs(s[r] - exact) / own);
  }
  std::printf("  %-70s exp sum bound used %.3f\n", name.c_str(), used);
}

void CheckTargetLogit(const ShardCase& k, const ShardData& d) {
  std::vector<float> got(static_cast<size_t>(k.n), kNaN);
  RunKernel(GridFor(k.n, k.cap), vd::kThreads, [&] {
    vd::TargetLogitKernel(d.x.data(), d.t.data(), k.n, k.c, k.start, k.valid, k.ignore,
                          got.data());
  });
  Tensor want = Tensor::Empty({k.n}, DType::kF32);
  cpu::VocabShardTargetLogit(Tensor::FromVector(d.x, {k.n, k.c}),
                             Tensor::FromVector(d.t, {k.n}), k.start, k.valid, k.ignore, want);
  EXPECT_TRUE(SameBits(got, want.ToVector<float>())) << Name(k, "target logit");
}

void RunSoftmaxGrad(const ShardCase& k, const float* x, const ShardData& d,
                    const std::vector<float>& m, const std::vector<float>& s, float scale,
                    float* out) {
  RunKernel(GridFor(k.n * k.c, k.cap), vd::kThreads, [&] {
    vd::SoftmaxGradKernel(x, d.t.data(), k.n, k.c, k.start, k.valid, m.data(), s.data(), scale,
                          k.ignore, out);
  });
}

void CheckSoftmaxGrad(const ShardCase& k, const ShardData& d) {
  const std::string name = Name(k, "softmax grad");
  const Tensor logits = Tensor::FromVector(d.x, {k.n, k.c});
  Tensor m_t = Tensor::Empty({k.n}, DType::kF32), s_t = Tensor::Empty({k.n}, DType::kF32);
  cpu::VocabShardRowMax(logits, k.valid, m_t);
  cpu::VocabShardExpSum(logits, k.valid, m_t, s_t);
  const std::vector<float> m = m_t.ToVector<float>(), s = s_t.ToVector<float>();
  const float scale = 1.0f / 7.0f;
  std::vector<float> g(static_cast<size_t>(k.n * k.c), kNaN);
  RunSoftmaxGrad(k, d.x.data(), d, m, s, scale, g.data());
  Tensor want_t = Tensor::Empty({k.n, k.c}, DType::kF32);
  cpu::VocabShardSoftmaxGrad(logits, Tensor::FromVector(d.t, {k.n}), k.start, k.valid, m_t, s_t,
                             scale, k.ignore, want_t);
  const std::vector<float> want = want_t.ToVector<float>();
  double used = 0.0;
  for (int64_t r = 0; r < k.n; ++r) {
    const bool counted = d.t[r] != k.ignore;
    const int64_t target = d.t[r] - k.start;
    for (int64_t j = 0; j < k.c; ++j) {
      const int64_t i = r * k.c + j;
      if (!counted || j >= k.valid) {
        ASSERT_TRUE(IsPlusZero(g[i]) && IsPlusZero(want[i])) << name << " " << r << " " << j;
        continue;
      }
      const double q = std::exp(double(d.x[i] - m[r])) / s[r], t = j == target ? 1.0 : 0.0;
      const double dp = 1.01 * (7 * kU + kUd) * q;
      const double spread = 2 * (std::fabs(q - t) + dp);
      const double bound = scale * (dp + Gamma(2) * spread);
      const double diff = std::fabs(double(g[i]) - want[i]);
      ASSERT_LE(diff, bound) << name << " row " << r << " column " << j;
      if (bound > 0) used = std::max(used, diff / bound);
    }
  }
  std::vector<float> in_place = d.x;
  RunSoftmaxGrad(k, in_place.data(), d, m, s, scale, in_place.data());
  EXPECT_TRUE(SameBits(in_place, g)) << name << ": in place of the logits";
  std::printf("  %-70s bound used %.3f\n", name.c_str(), used);
}

TEST(VocabParallelEmulationTest, CrossEntropyPiecesAgainstTheCpu) {
  uint32_t seed = 10;
  for (const ShardCase& k : kShardCases) {
    const ShardData d = MakeShard(k, ++seed);
    CheckRowReductions(k, d);
    CheckTargetLogit(k, d);
    CheckSoftmaxGrad(k, d);
  }
}

// ---- The embedding shard.

struct EmbCase {
  int64_t n, rows, d, start, cap;
};

std::string Name(const EmbCase& e, const char* what) {
  return std::string(what) + " n " + std::to_string(e.n) + " rows " + std::to_string(e.rows) +
         " d " + std::to_string(e.d) + " start " + std::to_string(e.start) + " cap " +
         std::to_string(e.cap);
}

// Ids of this shard [start, start + rows) with one hot row (300 positions when n allows), of
// other ranks, and negative ones, shuffled.
std::vector<int32_t> MakeIds(const EmbCase& e, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < std::min<int64_t>(300, e.n / 2); ++i) {
    ids.push_back(static_cast<int32_t>(e.start + e.rows / 2));
  }
  while (static_cast<int64_t>(ids.size()) < e.n) {
    const int64_t pick = rng() % 10;
    int64_t id = e.start + static_cast<int64_t>(rng() % e.rows);
    if (pick == 7) id = e.start + e.rows + static_cast<int64_t>(rng() % 100);  // the next rank
    if (pick == 8) id = e.start > 0 ? static_cast<int64_t>(rng() % e.start) : -1;  // previous
    if (pick == 9) id = -1 - static_cast<int64_t>(rng() % 3);
    ids.push_back(static_cast<int32_t>(id));
  }
  std::shuffle(ids.begin(), ids.end(), rng);
  return ids;
}

void CheckEmbeddingForward(const EmbCase& e, const std::vector<int32_t>& ids, uint32_t seed) {
  const std::vector<float> table = Uniform(e.rows * e.d, seed);
  std::vector<float> out(static_cast<size_t>(e.n * e.d), kNaN);
  RunKernel(GridFor(e.n * e.d, e.cap), vd::kThreads, [&] {
    vd::EmbeddingForwardKernel(ids.data(), table.data(), e.n, e.d, e.start, e.rows, out.data());
  });
  Tensor want = Tensor::Empty({e.n, e.d}, DType::kF32);
  cpu::VocabShardEmbeddingForward(Tensor::FromVector(ids, {e.n}),
                                  Tensor::FromVector(table, {e.rows, e.d}), e.start, want);
  EXPECT_TRUE(SameBits(out, want.ToVector<float>())) << Name(e, "embedding forward");
}

// vocab_parallel.cu's backward: local rows and positions, the stable sort, the runs.
void CheckEmbeddingBackward(const EmbCase& e, const std::vector<int32_t>& ids, uint32_t seed) {
  const std::string name = Name(e, "embedding backward");
  const int64_t n = e.n;
  std::vector<int32_t> local(n, -7), positions(n, -7);
  RunKernel(GridFor(n, e.cap), vd::kThreads, [&] {
    vd::LocalIdsKernel(ids.data(), n, e.start, e.rows, static_cast<int32_t>(e.rows),
                       local.data());
  });
  RunKernel(GridFor(n, e.cap), vd::kThreads, [&] { vd::IotaKernel(positions.data(), n); });
  const int bits = vd::KeyBits(e.rows);
  for (int32_t key : local) {
    ASSERT_TRUE(key >= 0 && key <= e.rows && key < (int64_t{1} << bits)) << name << ": " << key;
  }
  std::vector<int64_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int64_t a, int64_t b) { return local[a] < local[b]; });
  std::vector<int32_t> sorted_rows(n), sorted_positions(n);
  for (int64_t i = 0; i < n; ++i) {
    sorted_rows[i] = local[order[i]];
    sorted_positions[i] = positions[order[i]];
  }
  const std::vector<float> dout = Uniform(n * e.d, seed), dtable0 = Uniform(e.rows * e.d, seed + 1);
  std::vector<float> dtable = dtable0;
  RunKernel(vd::RowBlocks(n, e.cap), vd::RunThreads(e.d), [&] {
    vd::ScatterAddRunsKernel(sorted_rows.data(), sorted_positions.data(), n, dout.data(),
                             dtable.data(), e.d, e.rows);
  });
  Tensor want = Tensor::FromVector(dtable0, {e.rows, e.d});
  cpu::VocabShardEmbeddingBackward(Tensor::FromVector(ids, {n}),
                                   Tensor::FromVector(dout, {n, e.d}), e.start, want);
  EXPECT_TRUE(SameBits(dtable, want.ToVector<float>())) << name;
}

TEST(VocabParallelEmulationTest, EmbeddingShardIsTheCpusBits) {
  const EmbCase cases[] = {
      {1, 1, 1, 0, 1000},       // one id, one row
      {700, 50, 1, 100, 1000},  // one column; 700 run blocks
      {700, 50, 40, 0, 7},      // 7 blocks stride over the runs and the elements
      {650, 33, 300, 33, 5},    // 300 columns over 256 threads
      {40, 1000, 8, 5, 1000},   // most rows never looked up
  };
  uint32_t seed = 40;
  for (const EmbCase& e : cases) {
    const std::vector<int32_t> ids = MakeIds(e, ++seed);
    CheckEmbeddingForward(e, ids, seed + 100);
    CheckEmbeddingBackward(e, ids, seed + 200);
  }
}

}  // namespace
}  // namespace switchyard::kernels
