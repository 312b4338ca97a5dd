// The MoE routing's statistics and losses on the device (kernels/cuda/moe_routing_kernels.cuh:
// slot and label counts, the probabilities' column sums and column adds, the z-loss;
// kernels/cuda/balance_loss_kernels.cuh: the load-balancing loss's values and gradient column)
// run on the CPU, without a GPU, through the host model of CUDA in
// tests/kernels/cuda_emulation.h, with the .cu files' launch shapes ((32, 8) blocks over
// (column tiles, chunks) for the column sums; 256-thread grid-stride kernels; one 1024-thread
// block for the double sum; one thread for the loss values), against the CPU ops of
// kernels/moe_routing.h and kernels/balance_loss.h. (The router's choice and backward:
// routing_emulation_test.cc.)
//
// Bit-equal where the device does the CPU's operations in the CPU's order: the counts, the
// column adds, the balance values and column. Elsewhere a bound that holds by construction
// (u = 2^-24, the f32 unit roundoff; gamma53(m) = m 2^-53 / (1 - m 2^-53) for m double
// additions): the z-loss and the column sums are double sums of the same terms in another
// order, each rounded to f32 once: |d| <= u (|gpu| + |cpu|) + the double sums' order bound.
#include "tests/kernels/routing_emulation.h"

namespace switchyard::kernels {
namespace {

using namespace routing_emulation;  // NOLINT: the shared helpers of routing_emulation.h

// ---- Counts, column sums, column adds ----------------------------------------------------

// indices (T, k) in [0, E) with some outside it (E, -1, INT_MAX, INT_MIN); keep ~1/4 zeros.
void MakeAssignments(int64_t T, int64_t k, int64_t E, uint64_t stream,
                     std::vector<int32_t>& idx, std::vector<uint8_t>& keep) {
  const std::vector<float> u = Uniform(2 * T * k, stream, 0.0f, 1.0f);
  idx.resize(T * k);
  keep.resize(T * k);
  for (int64_t i = 0; i < T * k; ++i) {
    idx[i] = static_cast<int32_t>(u[i] * u[i] * E);  // skewed to low experts
    keep[i] = u[T * k + i] < 0.75f ? 1 : 0;
  }
  const int32_t bad[] = {static_cast<int32_t>(E), -1, std::numeric_limits<int32_t>::max(),
                         std::numeric_limits<int32_t>::min()};
  for (int b = 0; b < 4 && b * 37 + 5 < T * k; ++b) idx[b * 37 + 5] = bad[b];
}

TEST(RoutingSumsEmulationTest, SlotCountsEqualTheCpu) {
  struct Case {
    int64_t T, k, E;
    unsigned blocks;  // 0: the .cu's GridFor(n)
  };
  const Case cases[] = {{0, 2, 8, 0},     {1, 1, 1, 0},     {333, 2, 12, 0},
                        {1000, 4, 40, 0}, {1000, 4, 40, 3}, {77, 8, 300, 1}};
  uint64_t stream = 900;
  for (const Case& c : cases) {
    for (bool with_keep : {false, true}) {
      const std::string name = "T=" + std::to_string(c.T) + " k=" + std::to_string(c.k) +
                               " E=" + std::to_string(c.E) + " blocks " +
                               std::to_string(c.blocks) + (with_keep ? " keep" : "");
      std::vector<int32_t> idx;
      std::vector<uint8_t> keep;
      MakeAssignments(c.T, c.k, c.E, stream += 10, idx, keep);
      // moe_routing.cu's CountSlotAssignments: counts zeroed, then the kernel when n > 0.
      std::vector<unsigned long long> got(c.k * c.E + 1, 0);
      const int64_t n = c.T * c.k;
      if (n > 0) {
        Launch(c.blocks > 0 ? c.blocks : GridFor(n), kThreads, [&] {
          rt::CountSlotAssignmentsKernel(idx.data(), with_keep ? keep.data() : nullptr, n,
                                         static_cast<int>(c.k), static_cast<int>(c.E),
                                         got.data());
        });
      }
      Tensor want = Tensor::Empty({c.k * c.E + 1}, DType::kI64);
      CountSlotAssignments(Tensor::FromVector(idx, {c.T, c.k}),
                           with_keep ? Tensor::FromVector(keep, {c.T, c.k}) : Tensor(), c.E,
                           want);
      const std::vector<int64_t> w = want.ToVector<int64_t>();
      ASSERT_EQ(got.size(), w.size());
      for (size_t i = 0; i < w.size(); ++i) {
        ASSERT_EQ(static_cast<int64_t>(got[i]), w[i]) << name << " count " << i;
      }
      if (n > 8) {
        EXPECT_GT(w.back(), 0) << name << ": the bad indices are counted";
      }
    }
  }
}

// moe_routing.cu's AddLabelAssignmentCounts: the kernel adds to what the counts hold (a step's
// micro-batches add into one range), so both start from the same nonzero values; labels
// include -1 and L (not counted), the indices MakeAssignments' bad ones (counted apart).
TEST(RoutingSumsEmulationTest, LabelCountsEqualTheCpu) {
  struct Case {
    int64_t T, k, E, L;
    unsigned blocks;  // 0: the .cu's GridFor(n)
  };
  const Case cases[] = {{0, 2, 8, 3, 0}, {1, 1, 1, 1, 0}, {333, 2, 12, 5, 0},
                        {1000, 4, 40, 2, 3}, {77, 8, 300, 7, 1}};
  uint64_t stream = 1900;
  for (const Case& c : cases) {
    const std::string name = "T=" + std::to_string(c.T) + " k=" + std::to_string(c.k) +
                             " E=" + std::to_string(c.E) + " L=" + std::to_string(c.L);
    std::vector<int32_t> idx;
    std::vector<uint8_t> unused;
    MakeAssignments(c.T, c.k, c.E, stream += 10, idx, unused);
    std::vector<int32_t> labels(c.T);
    const std::vector<float> u = Uniform(std::max<int64_t>(c.T, 1), stream + 1, 0.0f, 1.0f);
    for (int64_t t = 0; t < c.T; ++t) {
      labels[t] = static_cast<int32_t>(u[t] * (c.L + 2)) - 1;  // -1 .. L
    }
    std::vector<double> got(c.L * c.E + 1);
    for (size_t i = 0; i < got.size(); ++i) got[i] = static_cast<double>(i % 7);
    Tensor want = Tensor::FromVector(got, {c.L * c.E + 1});
    const int64_t n = c.T * c.k;
    if (n > 0) {
      Launch(c.blocks > 0 ? c.blocks : GridFor(n), kThreads, [&] {
        rt::AddLabelAssignmentCountsKernel(idx.data(), labels.data(), n, static_cast<int>(c.k),
                                           static_cast<int>(c.L), static_cast<int>(c.E),
                                           got.data());
      });
    }
    AddLabelAssignmentCounts(Tensor::FromVector(idx, {c.T, c.k}),
                             Tensor::FromVector(labels, {c.T}), c.L, c.E, want);
    const std::vector<double> w = want.ToVector<double>();
    ASSERT_EQ(got.size(), w.size());
    double added = 0;
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_EQ(got[i], w[i]) << name << " count " << i;
      added += w[i] - static_cast<double>(i % 7);
    }
    if (n > 100) {
      const double bad_start = static_cast<double>((w.size() - 1) % 7);
      EXPECT_GT(w.back(), bad_start) << name << ": a labelled bad index is counted apart";
      EXPECT_LT(added, static_cast<double>(n)) << name << ": labels -1 and L are not counted";
      EXPECT_GT(added, 0.0) << name;
    }
  }
}

// moe_routing.cu's ProbColumnSums: partial sums over the (capped) chunks, then the final sums
// (on `final_blocks` blocks when not 0, else GridFor(E)).
std::vector<float> RunColumnSums(const std::vector<float>& probs, int64_t T, int64_t E,
                                 int64_t max_chunks, unsigned final_blocks = 0) {
  const rt::ColumnSumShape shape = rt::ColumnSumShapeOf(T, E, max_chunks);
  std::vector<double> partial(std::max<int64_t>(shape.chunks * E, 1),
                              std::numeric_limits<double>::quiet_NaN());
  if (shape.chunks > 0) {
    emu::Launch(EmuDim3{shape.col_tiles, static_cast<unsigned>(shape.chunks), 1},
                EmuDim3{rt::kSumCols, rt::kSumRowLanes, 1}, no_smem, 0, 0, [&] {
                  rt::ColumnPartialSumsKernel(probs.data(), T, static_cast<int>(E),
                                              shape.rows_per_chunk, partial.data());
                });
  }
  std::vector<float> sums(E, kNaN);
  Launch(final_blocks > 0 ? final_blocks : GridFor(E), kThreads, [&] {
    rt::ColumnFinalSumsKernel(partial.data(), shape.chunks, static_cast<int>(E), sums.data());
  });
  return sums;
}

TEST(RoutingSumsEmulationTest, ProbColumnSumsWithinTheOrderBound) {
  struct Case {
    int64_t T, E, max_chunks;
    unsigned final_blocks;
  };
  // One row; chunks with a partial last one; chunks capped (lanes of many rows, a last chunk
  // short, chunks past T empty); more columns than one tile and than one final block.
  const Case cases[] = {{0, 5, rt::kMaxSumChunks, 0},   {1, 1, rt::kMaxSumChunks, 0},
                        {257, 33, rt::kMaxSumChunks, 0}, {1000, 70, 3, 0},
                        {1001, 7, 1000, 0},             {300, 300, rt::kMaxSumChunks, 0},
                        {300, 300, rt::kMaxSumChunks, 1}};
  uint64_t stream = 1300;
  for (const Case& c : cases) {
    const std::string name = "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                             " max chunks " + std::to_string(c.max_chunks);
    for (bool integers : {false, true}) {
      // Integer values: every sum exact, so the sums must be the CPU's bits (each element
      // added once); else within the bound of double sums in another order, rounded once.
      std::vector<float> probs = Uniform(c.T * c.E, stream += 10, 0.0f, 1.0f);
      if (integers) {
        for (float& v : probs) v = std::floor(v * 64.0f);
      }
      const std::vector<float> got = RunColumnSums(probs, c.T, c.E, c.max_chunks,
                                                   c.final_blocks);
      Tensor want = Tensor::Empty({c.E}, DType::kF32);
      ProbColumnSums(Tensor::FromVector(probs, {c.T, c.E}), want);
      const std::vector<float> w = want.ToVector<float>();
      for (int64_t e = 0; e < c.E; ++e) {
        double mag = 0.0;
        for (int64_t t = 0; t < c.T; ++t) mag += probs[t * c.E + e];
        const double bound = integers ? 0.0
                                      : kU * (std::fabs(got[e]) + std::fabs(w[e])) +
                                            2 * Gamma53(c.T) * mag + kTiny;
        ASSERT_LE(std::fabs(double(got[e]) - w[e]), bound)
            << name << (integers ? " integers" : "") << " column " << e << ": " << got[e]
            << " vs " << w[e];
      }
    }
  }
}

// Capped chunks with empty ones at the end: T = C * 256 + 1 rows in C chunks of 257 rows,
// the last chunk's rows past T. The real cap C = 1024 does that (its shape checked); the run
// uses C = 300, a third of the CTAs.
TEST(RoutingSumsEmulationTest, ProbColumnSumsWithEmptyChunksPastTheCap) {
  const rt::ColumnSumShape cap = rt::ColumnSumShapeOf(rt::kMaxSumChunks * 256 + 1, 3);
  ASSERT_EQ(cap.chunks, rt::kMaxSumChunks);
  ASSERT_EQ(cap.rows_per_chunk, 257);
  const int64_t max_chunks = 300, T = max_chunks * 256 + 1, E = 3;
  const rt::ColumnSumShape shape = rt::ColumnSumShapeOf(T, E, max_chunks);
  ASSERT_EQ(shape.chunks, max_chunks);
  ASSERT_GE(shape.rows_per_chunk * (shape.chunks - 1), T) << "no empty chunk";
  std::vector<float> probs = Uniform(T * E, 77, 0.0f, 1.0f);
  for (float& v : probs) v = std::floor(v * 64.0f);  // integers: exact sums in any order
  const std::vector<float> got = RunColumnSums(probs, T, E, max_chunks);
  Tensor want = Tensor::Empty({E}, DType::kF32);
  ProbColumnSums(Tensor::FromVector(probs, {T, E}), want);
  ExpectBits(got, want.ToVector<float>(), "T=" + std::to_string(T));
}

// Both writes: kAdd into x0, kSet over NaN (never read), which gives the bits of adding into
// zeros (a -0 column entry included: +0 + -0 = +0).
TEST(RoutingSumsEmulationTest, AddColumnConstantsEqualsTheCpu) {
  struct Case {
    int64_t T, E;
    unsigned blocks;
  };
  const Case cases[] = {{1, 1, 0}, {5, 7, 0}, {300, 33, 0}, {300, 33, 2}};
  for (const Case& c : cases) {
    std::vector<float> column = Uniform(c.E, 1800 + c.E, -1.0f, 1.0f);
    column[0] = -0.0f;
    const int64_t n = c.T * c.E;
    for (const Write write : {Write::kAdd, Write::kSet}) {
      const bool set = write == Write::kSet;
      const std::string name = "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                               (set ? " kSet" : " kAdd");
      const std::vector<float> x0 =
          set ? std::vector<float>(n, kNaN) : Uniform(n, 1700 + c.T + c.blocks, -1.0f, 1.0f);
      std::vector<float> got = x0;
      Launch(c.blocks > 0 ? c.blocks : GridFor(n), kThreads, [&] {
        rt::AddColumnConstantsKernel(got.data(), column.data(), n, static_cast<int>(c.E), write);
      });
      Tensor want = Tensor::FromVector(x0, {c.T, c.E});
      AddColumnConstants(want, column, write);
      ExpectBits(got, want.ToVector<float>(), name);
      if (set) {
        Tensor zeros = Tensor::Zeros({c.T, c.E}, DType::kF32);
        AddColumnConstants(zeros, column, Write::kAdd);
        ExpectBits(got, zeros.ToVector<float>(), name + " vs kAdd into zeros");
      }
    }
  }
}

// ---- Z-loss ---------------------------------------------------------------------------

// SumDoublesKernel adds every element once: integer values, so the sum is exact in any order.
TEST(RoutingSumsEmulationTest, SumDoublesAddsEveryElementOnce) {
  for (int64_t n : {int64_t{1}, int64_t{31}, int64_t{1024}, int64_t{2500}}) {
    const std::vector<float> u = Uniform(n, 2000 + n, 0.0f, 1.0f);
    std::vector<double> x(n);
    double want = 0.0;
    for (int64_t i = 0; i < n; ++i) want += x[i] = std::floor(u[i] * 1048576.0f) - 1000.0;
    double got = std::numeric_limits<double>::quiet_NaN();
    Launch(1, rt::kSumDoublesThreads, [&] { rt::SumDoublesKernel(x.data(), n, &got); });
    EXPECT_EQ(got, want) << "n=" << n;
  }
}

// The z-loss of the .cu's RouterZLoss (gradient and value) and RouterZLossInto (value).
struct ZLossRun {
  std::vector<float> dlogits;
  std::vector<double> lse_sq;
  double value = 0.0;  // the f32 value as a double (ZLossValueKernel)
};

ZLossRun RunZLoss(const std::vector<float>& logits, int64_t T, int64_t E, float coef,
                  float grad, int64_t n, const std::vector<float>* dlogits) {
  ZLossRun r;
  if (dlogits != nullptr) r.dlogits = *dlogits;
  r.lse_sq.assign(T, std::numeric_limits<double>::quiet_NaN());
  const double grad_coef = dlogits != nullptr ? rt::ZLossGradCoef(grad, coef) : 0.0;
  Launch(rt::TokenBlocks(T), rt::kTokenThreads, [&] {
    rt::ZLossKernel(logits.data(), T, static_cast<int>(E), grad_coef, n, r.lse_sq.data(),
                    dlogits != nullptr ? r.dlogits.data() : nullptr, Write::kAdd);
  });
  double total = std::numeric_limits<double>::quiet_NaN();
  Launch(1, rt::kSumDoublesThreads, [&] { rt::SumDoublesKernel(r.lse_sq.data(), T, &total); });
  r.value = std::numeric_limits<double>::quiet_NaN();
  RunOneThread([&] { rt::ZLossValueKernel(&total, coef, n, &r.value); });
  // RouterZLoss's host expression on the same sum: the same f32.
  EXPECT_EQ(r.value, static_cast<double>(static_cast<float>(coef * total / n)));
  return r;
}

TEST(RoutingSumsEmulationTest, ZLossWithinTheOrderBound) {
  struct Case {
    int64_t T, E;
    float range;
  };
  const Case cases[] = {{1, 1, 3.0f},  {9, 7, 3.0f},  {13, 40, 3.0f},
                        {6, 300, 30.0f}, {3, 2048, 3.0f}, {5, 33, 0.01f}};
  const float coef = 0.001f, grad = 1.3f;
  uint64_t stream = 2500;
  for (const Case& c : cases) {
    const std::vector<float> logits = Uniform(c.T * c.E, stream += 10, -c.range, c.range);
    const std::vector<float> start = Uniform(c.T * c.E, stream + 1, -1.0f, 1.0f);
    for (int64_t group : {int64_t{0}, 2 * c.T + 3}) {
      const std::string name = "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                               " range " + std::to_string(c.range) + " group " +
                               std::to_string(group);
      const int64_t n = group > 0 ? group : c.T;
      const ZLossRun got = RunZLoss(logits, c.T, c.E, coef, grad, n, &start);
      Tensor want = Tensor::FromVector(start, {c.T, c.E});
      Tensor alone = Tensor::Zeros({c.T, c.E}, DType::kF32);  // the CPU's added term
      const Tensor l = Tensor::FromVector(logits, {c.T, c.E});
      const float z = RouterZLoss(l, coef, grad, group, &want);
      RouterZLoss(l, coef, grad, group, &alone);
      // RouterZLossBackward's kSet over NaN: the added term's bits.
      Tensor set = Tensor::FromVector(std::vector<float>(c.T * c.E, kNaN), {c.T, c.E});
      RouterZLossBackward(l, coef, grad, group, set, Write::kSet);
      ExpectBits(set.ToVector<float>(), alone.ToVector<float>(), name + " CPU kSet");
      const std::vector<float> w = want.ToVector<float>(), b = alone.ToVector<float>();

      // Per token: lse and its share of the error of the double sums (ordered differently).
      double sum_sq = 0.0, sum_dsq = 0.0;
      const double gc = std::fabs(rt::ZLossGradCoef(grad, coef)) / n;
      for (int64_t t = 0; t < c.T; ++t) {
        const float* lt = logits.data() + t * c.E;
        const double m = *std::max_element(lt, lt + c.E);
        double s = 0.0;
        for (int64_t e = 0; e < c.E; ++e) s += std::exp(lt[e] - m);
        const double lse = m + std::log(s);
        const double dlse = 4 * Gamma53(c.E + 2) * (1 + std::fabs(lse));
        sum_sq += lse * lse;
        sum_dsq += 2 * std::fabs(lse) * dlse + dlse * dlse;
        for (int64_t e = 0; e < c.E; ++e) {
          const int64_t i = t * c.E + e;
          // v (double) of both within delta; each rounded to f32, then added to start.
          const double delta = 4 * Gamma53(c.E + 2) * std::fabs(b[i]) +
                               gc * (std::exp(lt[e] - m) / s) * dlse * 2;
          const double bound = delta + kU * (4 * std::fabs(b[i]) + 2 * delta) +
                               kU * (std::fabs(got.dlogits[i]) + std::fabs(w[i])) + kTiny;
          ASSERT_LE(std::fabs(double(got.dlogits[i]) - w[i]), bound)
              << name << " dlogits " << i << ": " << got.dlogits[i] << " vs " << w[i];
        }
      }
      const double dsum = 2 * Gamma53(c.T) * sum_sq + sum_dsq;
      const double zbound = kU * (std::fabs(got.value) + std::fabs(z)) +
                            std::fabs(coef) * dsum / n * (1 + 1e-12) + kTiny;
      EXPECT_LE(std::fabs(got.value - z), zbound) << name << " value " << got.value << " vs " << z;

      // RouterZLossBackward (no lse_sq) and RouterZLossInto (no dlogits): the same bits; its
      // kSet over NaN, the bits of adding into zeros.
      const auto gradient_only = [&](std::vector<float> dl, Write write) {
        Launch(rt::TokenBlocks(c.T), rt::kTokenThreads, [&] {
          rt::ZLossKernel(logits.data(), c.T, static_cast<int>(c.E),
                          rt::ZLossGradCoef(grad, coef), n, nullptr, dl.data(), write);
        });
        return dl;
      };
      ExpectBits(gradient_only(start, Write::kAdd), got.dlogits,
                 name + " gradient without the value");
      ExpectBits(gradient_only(std::vector<float>(c.T * c.E, kNaN), Write::kSet),
                 gradient_only(std::vector<float>(c.T * c.E, 0.0f), Write::kAdd),
                 name + " kSet vs kAdd into zeros");
      if (group == 0) {
        const ZLossRun value_only = RunZLoss(logits, c.T, c.E, coef, grad, n, nullptr);
        ExpectBits(value_only.lse_sq, got.lse_sq, name + " lse^2 without the gradient");
        EXPECT_EQ(value_only.value, got.value) << name;
      }
    }
  }
}

// ---- The load-balancing loss -------------------------------------------------------------

// balance_loss.cu's two ops on counts and prob sums made by the routing kernels (with out-of-
// range indices, which `bad` counts) against the CPU's, bit for bit.
TEST(RoutingSumsEmulationTest, BalanceValuesAndColumnEqualTheCpu) {
  struct Case {
    int64_t T, E, k;
    unsigned blocks;  // AddColumnKernel's grid; 0: GridFor(n)
  };
  const Case cases[] = {{0, 12, 2, 0},   {333, 12, 2, 0}, {5, 1, 1, 0},
                        {100, 300, 4, 0}, {100, 300, 4, 3}, {64, 40, 8, 0}};
  const float coef = 0.01f, grad = 0.37f;
  uint64_t stream = 3300;
  for (const Case& c : cases) {
    const std::string name = "T=" + std::to_string(c.T) + " E=" + std::to_string(c.E) +
                             " k=" + std::to_string(c.k) + " blocks " + std::to_string(c.blocks);
    std::vector<int32_t> idx;
    std::vector<uint8_t> keep;
    MakeAssignments(c.T, c.k, c.E, stream += 10, idx, keep);
    std::vector<int64_t> counts(c.k * c.E + 1, 0);
    const int64_t n_idx = c.T * c.k;
    if (n_idx > 0) {
      Launch(GridFor(n_idx), kThreads, [&] {
        rt::CountSlotAssignmentsKernel(idx.data(), nullptr, n_idx, static_cast<int>(c.k),
                                       static_cast<int>(c.E),
                                       reinterpret_cast<unsigned long long*>(counts.data()));
      });
    }
    const std::vector<float> probs = Uniform(c.T * c.E, stream + 1, 0.0f, 1.0f);
    const std::vector<float> sums = RunColumnSums(probs, c.T, c.E, rt::kMaxSumChunks);
    const Tensor counts_t = Tensor::FromVector(counts, {c.k * c.E + 1});
    const Tensor sums_t = Tensor::FromVector(sums, {c.E});

    std::vector<double> values(c.E + 2, std::numeric_limits<double>::quiet_NaN());
    RunOneThread([&] {
      bl::BalanceValuesKernel(counts.data(), sums.data(), c.E, c.k, c.T, coef, values.data());
    });
    Tensor want = Tensor::Zeros({c.E + 2}, DType::kF64);
    BalanceValuesInto(counts_t, sums_t, c.T, c.k, coef, want);
    ExpectBits(values, want.ToVector<double>(), name + " values");
    if (c.T * c.k > 8) {
      EXPECT_GT(values.back(), 0.0) << name << ": bad indices counted";
    }

    // AddBalanceColumn: the column, then its add to every row (nothing when T = 0); kSet
    // over NaN, the bits of adding into zeros.
    const int64_t n = c.T * c.E;
    std::vector<float> col(c.E, kNaN);
    if (c.T > 0) {
      Launch(GridFor(c.E), kThreads, [&] {
        bl::BalanceColumnKernel(counts.data(), c.E, c.k, c.T, coef, grad, col.data());
      });
    }
    for (const Write write : {Write::kAdd, Write::kSet}) {
      const bool set = write == Write::kSet;
      const std::vector<float> start =
          set ? std::vector<float>(n, kNaN) : Uniform(n, stream + 2, -1.0f, 1.0f);
      std::vector<float> got = start;
      if (c.T > 0) {
        Launch(c.blocks > 0 ? c.blocks : GridFor(n), kThreads,
               [&] { bl::AddColumnKernel(got.data(), col.data(), n, c.E, write); });
      }
      Tensor want_dp = Tensor::FromVector(start, {c.T, c.E});
      AddBalanceColumn(want_dp, counts_t, c.T, c.k, coef, grad, write);
      ExpectBits(got, want_dp.ToVector<float>(), name + (set ? " dprobs kSet" : " dprobs"));
      if (set) {
        Tensor zeros = Tensor::Zeros({c.T, c.E}, DType::kF32);
        AddBalanceColumn(zeros, counts_t, c.T, c.k, coef, grad, Write::kAdd);
        ExpectBits(got, zeros.ToVector<float>(), name + " kSet vs kAdd into zeros");
      }
    }
  }
}

}  // namespace
}  // namespace switchyard::kernels
