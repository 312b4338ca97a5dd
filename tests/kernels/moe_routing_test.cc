// kernels/moe_routing.h on the CPU. The router, aux-loss and admission semantics are tested
// through moe/ (tests/moe/*); here: the ops' edge cases (T = 0, k = E, every assignment
// removed, bad indices counted, -0 gates), and the two formulations the CUDA kernels use,
// replayed on the host against the CPU reference:
//  - top-k by a 32-lane butterfly argmax over lane-strided experts (RouterTopKKernel),
//  - admission by a stable sort on (expert, slot) or (expert, decreasing gate) keys, ranks
//    from segment starts and the counts from the per-key totals (AdmitOnDevice).
#include "kernels/moe_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <climits>
#include <cmath>
#include <cstring>
#include <numeric>
#include <tuple>
#include <vector>

#include "engine/core/captured_work.h"
#include "engine/core/device_context.h"
#include "engine/core/philox.h"
#include "kernels/random.h"

namespace switchyard::kernels {
namespace {

Tensor Uniform(const Shape& shape, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  FillUniform(t, RngKey{seed, 0}, 0, lo, hi);
  return t;
}

struct TopK {
  Tensor probs, indices, gates, keep;
};

TopK RunTopK(const Tensor& logits, const Tensor& bias, int64_t k, bool normalize,
             bool random_second) {
  const int64_t T = logits.dim(0), E = logits.dim(1);
  TopK o{Tensor::Empty({T, E}, DType::kF32), Tensor::Empty({T, k}, DType::kI32),
         Tensor::Empty({T, k}, DType::kF32), Tensor::Empty({T, k}, DType::kU8)};
  RouterTopK(logits, bias, normalize, random_second, RngKey{5, 6}, 0, o.probs, o.indices, o.gates,
             o.keep);
  return o;
}

TEST(MoERoutingTest, RouterTopKEdgeCases) {
  // T = 0.
  TopK empty = RunTopK(Tensor::Empty({0, 4}, DType::kF32), Tensor(), 2, true, true);
  EXPECT_EQ(empty.indices.numel(), 0);
  // k = E: every expert, best first, ties to the lower index; normalised gates sum to 1.
  Tensor logits = Tensor::FromVector(std::vector<float>{0.5f, 2.0f, 0.5f, 1.0f, 2.0f}, {1, 5});
  TopK all = RunTopK(logits, Tensor(), 5, true, false);
  EXPECT_EQ(all.indices.ToVector<int32_t>(), (std::vector<int32_t>{1, 4, 3, 0, 2}));
  const std::vector<float> g = all.gates.ToVector<float>();
  EXPECT_NEAR(std::accumulate(g.begin(), g.end(), 0.0), 1.0, 1e-6);
  EXPECT_EQ(g[0], g[1]);
  EXPECT_EQ(all.keep.ToVector<uint8_t>(), std::vector<uint8_t>(5, 1));
  // The bias picks, the gates stay the unbiased probs.
  Tensor bias = Tensor::FromVector(std::vector<float>{1.0f, 0.0f, 0.0f, 0.0f, 0.0f}, {5});
  TopK biased = RunTopK(logits, bias, 1, false, false);
  EXPECT_EQ(biased.indices.ToVector<int32_t>(), (std::vector<int32_t>{0}));
  EXPECT_EQ(biased.gates.ToVector<float>()[0], biased.probs.ToVector<float>()[0]);
}

// The CUDA top-k, replayed: lane l holds experts l, l + 32, ...; each round every lane
// proposes its best unchosen expert and a butterfly (xor 16, 8, 4, 2, 1) keeps the better of
// each pair; lane 0's winner is taken.
std::vector<int32_t> WarpTopK(const std::vector<float>& score, int64_t k) {
  struct Cand {
    float s;
    int i;
  };
  auto before = [](const Cand& a, const Cand& b) {
    if (b.i == INT_MAX) return a.i != INT_MAX;
    if (a.i == INT_MAX) return false;
    return a.s > b.s || (a.s == b.s && a.i < b.i);
  };
  const int E = static_cast<int>(score.size());
  std::vector<bool> chosen(E, false);
  std::vector<int32_t> out;
  for (int64_t j = 0; j < k; ++j) {
    std::vector<Cand> best(32, Cand{-INFINITY, INT_MAX});
    for (int lane = 0; lane < 32; ++lane) {
      for (int e = lane; e < E; e += 32) {
        if (!chosen[e] && before(Cand{score[e], e}, best[lane])) best[lane] = Cand{score[e], e};
      }
    }
    for (int offset = 16; offset > 0; offset >>= 1) {
      std::vector<Cand> next = best;
      for (int lane = 0; lane < 32; ++lane) {
        if (before(best[lane ^ offset], best[lane])) next[lane] = best[lane ^ offset];
      }
      best = next;
    }
    for (int lane = 1; lane < 32; ++lane) EXPECT_EQ(best[lane].i, best[0].i);
    chosen[best[0].i] = true;
    out.push_back(best[0].i);
  }
  return out;
}

TEST(MoERoutingTest, WarpTopKFormulationEqualsPartialSort) {
  uint64_t seed = 300;
  for (int64_t E : {1, 5, 32, 33, 64, 130, 300}) {
    for (int64_t k : {1, 2, 4, 8}) {
      if (k > E) continue;
      for (bool ties : {false, true}) {
        Tensor logits = Uniform({20, E}, seed += 3, -3.0f, 3.0f);
        if (ties) {
          float* l = logits.data<float>();
          for (int64_t i = 0; i < logits.numel(); ++i) l[i] = std::round(l[i]);
        }
        TopK ref = RunTopK(logits, Tensor(), k, false, false);
        const std::vector<float> p = ref.probs.ToVector<float>();
        const std::vector<int32_t> idx = ref.indices.ToVector<int32_t>();
        for (int64_t t = 0; t < 20; ++t) {
          const std::vector<float> row(p.begin() + t * E, p.begin() + (t + 1) * E);
          EXPECT_EQ(WarpTopK(row, k),
                    std::vector<int32_t>(idx.begin() + t * k, idx.begin() + (t + 1) * k))
              << "E=" << E << " k=" << k << " ties=" << ties << " t=" << t;
        }
      }
    }
  }
}

// kernels::DeviceRng (runtime.cuda_graphs): the second-expert draw and the jitter fill with
// their key stream and first token read from a device tensor are the host-keyed ops' bits,
// and a capture reads the values when it is replayed, not when it was recorded.
TEST(MoERoutingTest, DeviceKeyedDrawsEqualHostKeyedOnes) {
  const int64_t T = 40, E = 6, k = 2;
  const RngKey key{1234, StreamId("device-keyed")};
  const int64_t first_token = 1000, offset = 7;
  std::vector<float> l(T * E);
  for (int64_t i = 0; i < T * E; ++i) l[i] = std::sin(0.37f * static_cast<float>(i));
  const Tensor logits = Tensor::FromVector(l, {T, E});
  auto choose = [&](auto&& call) {
    Tensor probs = Tensor::Empty({T, E}, DType::kF32), indices = Tensor::Empty({T, k}, DType::kI32);
    Tensor gates = Tensor::Empty({T, k}, DType::kF32), keep = Tensor::Empty({T, k}, DType::kU8);
    Tensor scores;
    call(probs, scores, indices, gates, keep);
    return std::make_tuple(probs.ToVector<float>(), indices.ToVector<int32_t>(),
                           gates.ToVector<float>(), keep.ToVector<uint8_t>());
  };
  const kernels::RouterScoring softmax{.normalize = true};
  const auto want = choose([&](Tensor& p, Tensor& s, Tensor& i, Tensor& g, Tensor& kp) {
    kernels::RouterTopKScored(logits, Tensor(), softmax, true, key, first_token + offset, p, s,
                              i, g, kp);
  });
  Tensor values = Tensor::FromVector<int64_t>({static_cast<int64_t>(key.stream), first_token}, {2});
  const kernels::DeviceRng at{.seed = key.seed, .values = values, .token_offset = offset};
  const auto got = choose([&](Tensor& p, Tensor& s, Tensor& i, Tensor& g, Tensor& kp) {
    kernels::RouterTopKScored(logits, Tensor(), softmax, true, at, p, s, i, g, kp);
  });
  EXPECT_TRUE(got == want);
  // Some second choices were dropped and some kept: the draw is exercised.
  const std::vector<uint8_t>& keep = std::get<3>(want);
  int kept = 0;
  for (int64_t t = 0; t < T; ++t) kept += keep[t * k + 1];
  EXPECT_GT(kept, 0);
  EXPECT_LT(kept, T);

  // The jitter fill, and a capture replayed after the values changed.
  const int64_t d = 8, n = 5 * d;
  Tensor fill_want = Tensor::Empty({n}, DType::kF32);
  kernels::FillUniform(fill_want, RngKey{key.seed, key.stream + 1}, (first_token + 3 + offset) * d,
                       0.9f, 1.1f);
  auto ctx = DeviceContext::Create(Device::Cpu());
  Tensor fill_got = Tensor::Empty({n}, DType::kF32);
  ctx->BeginCapture();
  kernels::FillUniform(fill_got,
                       kernels::DeviceRng{.seed = key.seed, .values = values,
                                          .token_offset = offset, .per_token = d},
                       0.9f, 1.1f, ctx.get());
  std::unique_ptr<CapturedWork> work = ctx->EndCapture();
  values.data<int64_t>()[0] = static_cast<int64_t>(key.stream + 1);
  values.data<int64_t>()[1] = first_token + 3;
  work->Replay(ctx.get());
  EXPECT_EQ(fill_got.ToVector<float>(), fill_want.ToVector<float>());
}

TEST(MoERoutingTest, RouterBackwardLogitsEdgeCases) {
  // T = 0 writes nothing; undefined extra gradients equal zero ones.
  Tensor none = Tensor::Empty({0, 3}, DType::kF32);
  Tensor idx0 = Tensor::Empty({0, 2}, DType::kI32), g0 = Tensor::Empty({0, 2}, DType::kF32);
  RouterBackwardLogits(none, idx0, g0, g0, Tensor(), Tensor(), true, none);
  TopK r = RunTopK(Uniform({9, 6}, 31), Tensor(), 2, true, false);
  Tensor dg = Uniform({9, 2}, 32);
  Tensor a = Tensor::Empty({9, 6}, DType::kF32), b = Tensor::Empty({9, 6}, DType::kF32);
  RouterBackwardLogits(r.probs, r.indices, r.gates, dg, Tensor(), Tensor(), true, a);
  RouterBackwardLogits(r.probs, r.indices, r.gates, dg, Tensor::Zeros({9, 6}, DType::kF32),
                       Tensor::Zeros({9, 6}, DType::kF32), true, b);
  EXPECT_EQ(a.ToVector<float>(), b.ToVector<float>());
  // Softmax backward: each row's dlogits sum to zero.
  const std::vector<float> d = a.ToVector<float>();
  for (int64_t t = 0; t < 9; ++t) {
    EXPECT_NEAR(std::accumulate(d.begin() + t * 6, d.begin() + (t + 1) * 6, 0.0), 0.0, 1e-6);
  }
}

TEST(MoERoutingTest, CountSlotAssignmentsCountsBadIndicesApart) {
  Tensor idx = Tensor::FromVector(std::vector<int32_t>{0, 2, 2, -1, 3, 1, 1, 7}, {4, 2});
  Tensor keep = Tensor::FromVector(std::vector<uint8_t>{1, 0, 1, 0, 1, 1, 1, 1}, {4, 2});
  Tensor counts = Tensor::Empty({2 * 4 + 1}, DType::kI64);
  CountSlotAssignments(idx, keep, 4, counts);
  // slot 0: experts 0, 2, 3, 1 ; slot 1 (keep 0, 0, 1, 1): -, -, 1, 7 (bad) ; -1 is bad too.
  EXPECT_EQ(counts.ToVector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 1, 0, 1, 0, 0, 2}));
  CountSlotAssignments(idx, Tensor(), 4, counts);
  EXPECT_EQ(counts.ToVector<int64_t>(), (std::vector<int64_t>{1, 1, 1, 1, 0, 1, 1, 0, 2}));
  Tensor none = Tensor::Empty({3}, DType::kI64);
  CountSlotAssignments(Tensor::Empty({0, 1}, DType::kI32), Tensor(), 2, none);
  EXPECT_EQ(none.ToVector<int64_t>(), (std::vector<int64_t>{0, 0, 0}));
}

TEST(MoERoutingTest, ColumnSumsAndConstants) {
  Tensor sums = Tensor::Empty({3}, DType::kF32);
  sums.data<float>()[0] = 7.0f;
  ProbColumnSums(Tensor::Empty({0, 3}, DType::kF32), sums);
  EXPECT_EQ(sums.ToVector<float>(), (std::vector<float>{0.0f, 0.0f, 0.0f}));
  Tensor p = Tensor::FromVector(std::vector<float>{0.25f, 0.75f, 0.5f, 0.5f, 1.0f, 0.0f}, {3, 2});
  Tensor s2 = Tensor::Empty({2}, DType::kF32);
  ProbColumnSums(p, s2);
  EXPECT_EQ(s2.ToVector<float>(), (std::vector<float>{1.75f, 1.25f}));
  AddColumnConstants(p, std::vector<float>{1.0f, -0.5f}, Write::kAdd);
  EXPECT_EQ(p.ToVector<float>(), (std::vector<float>{1.25f, 0.25f, 1.5f, 0.0f, 2.0f, -0.5f}));
  // kSet writes +0 + column over whatever p held (NaN here): -0 becomes +0.
  Tensor q = Tensor::FromVector(std::vector<float>(4, std::nanf("")), {2, 2});
  AddColumnConstants(q, std::vector<float>{-0.0f, 3.0f}, Write::kSet);
  const std::vector<float> got = q.ToVector<float>();
  EXPECT_EQ(got, (std::vector<float>{0.0f, 3.0f, 0.0f, 3.0f}));
  EXPECT_FALSE(std::signbit(got[0]) || std::signbit(got[2])) << "kSet: +0 + -0 is +0";
}

TEST(MoERoutingTest, ZLossBackwardEqualsZLossGradient) {
  Tensor logits = Uniform({11, 7}, 41, -2.0f, 2.0f);
  for (int64_t group : {0, 30}) {
    Tensor a = Uniform({11, 7}, 42), b = a.Clone();
    const float z = RouterZLoss(logits, 0.01f, 0.5f, group, &a);
    RouterZLossBackward(logits, 0.01f, 0.5f, group, b, Write::kAdd);
    EXPECT_EQ(a.ToVector<float>(), b.ToVector<float>());
    // kSet over NaN: RouterZLoss's term added into zeros, the same bits.
    Tensor zeros = Tensor::Zeros({11, 7}, DType::kF32);
    RouterZLoss(logits, 0.01f, 0.5f, group, &zeros);
    Tensor set = Tensor::FromVector(std::vector<float>(77, std::nanf("")), {11, 7});
    RouterZLossBackward(logits, 0.01f, 0.5f, group, set, Write::kSet);
    EXPECT_EQ(std::memcmp(set.data<float>(), zeros.data<float>(), 77 * sizeof(float)), 0);
    EXPECT_EQ(RouterZLoss(logits, 0.01f, 0.0f, group, nullptr), z);
    EXPECT_GT(z, 0.0f);
  }
  EXPECT_EQ(RouterZLoss(Tensor::Empty({0, 4}, DType::kF32), 1.0f, 1.0f, 0, nullptr), 0.0f);
}

TEST(MoERoutingTest, UpdateExpertBiasLeavesEqualCountsAlone) {
  // counts (2, 2, 1, 3): mean 2.
  Tensor b = Tensor::FromVector(std::vector<float>{-0.0f, 1.0f, 0.0f, 0.0f}, {4});
  UpdateExpertBias(b, std::vector<int64_t>{2, 2, 1, 3}, 0.25f);
  const std::vector<float> v = b.ToVector<float>();
  EXPECT_TRUE(std::signbit(v[0])) << "-0 with the mean count stays -0";
  EXPECT_EQ(v[1], 1.0f);
  EXPECT_EQ(v[2], 0.25f);
  EXPECT_EQ(v[3], -0.25f);
}

// ---- Admission --------------------------------------------------------------------------

struct Admitted {
  AdmissionCounts counts;
  std::vector<uint8_t> kept;
  std::vector<int64_t> position;
};

Admitted Reference(const Tensor& idx, const Tensor& gates, const Tensor& keep, int64_t E,
                   int64_t C, AdmissionOrder order, std::span<const int64_t> offsets = {}) {
  Tensor kept = Tensor::Empty(idx.shape(), DType::kU8);
  Tensor pos = Tensor::Empty(idx.shape(), DType::kI64);
  Admitted a;
  a.counts = AdmitAssignments(idx, gates, keep, E, C, order, offsets, kept, pos);
  a.kept = kept.ToVector<uint8_t>();
  a.position = pos.ToVector<int64_t>();
  return a;
}

uint32_t OrderedBits(float g) {
  if (g == 0.0f) g = 0.0f;
  uint32_t bits;
  std::memcpy(&bits, &g, 4);
  return (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
}

// The CUDA admission (kernels/cuda/moe_routing.cu, AdmitOnDevice), replayed on the host.
Admitted SortFormulation(const Tensor& idx_t, const Tensor& gates_t, const Tensor& keep_t,
                         int64_t E, int64_t C, AdmissionOrder order,
                         std::span<const int64_t> offsets = {}) {
  const int64_t T = idx_t.dim(0), k = idx_t.dim(1), n = T * k;
  const bool by_prob = order == AdmissionOrder::kProbability;
  const std::vector<int32_t> idx = idx_t.ToVector<int32_t>();
  const std::vector<float> g = by_prob ? gates_t.ToVector<float>() : std::vector<float>(n);
  const std::vector<uint8_t> keep =
      keep_t.defined() ? keep_t.ToVector<uint8_t>() : std::vector<uint8_t>(n, 1);
  const int64_t classes = k * E + 2;
  std::vector<int64_t> counts(classes, 0);
  std::vector<uint64_t> keys(n);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t e = idx[i];
    const int64_t j = i % k;
    int64_t cls;
    if (e < 0 || e >= E) {
      cls = k * E + 1;
      keys[i] = by_prob ? static_cast<uint64_t>(E + 1) << 32 : cls;
    } else if (!keep[i]) {
      cls = k * E;
      keys[i] = by_prob ? static_cast<uint64_t>(E) << 32 : cls;
    } else {
      cls = e * k + j;
      keys[i] = by_prob ? (static_cast<uint64_t>(e) << 32) | static_cast<uint32_t>(~OrderedBits(g[i]))
                        : cls;
    }
    ++counts[cls];
  }
  const int end_bit = by_prob ? 32 + std::bit_width(static_cast<uint64_t>(E) + 1)
                              : std::bit_width(static_cast<uint64_t>(classes - 1));
  for (uint64_t key : keys) EXPECT_LT(key, uint64_t{1} << end_bit) << "a key outside end_bit";
  std::vector<int64_t> starts(classes, 0);
  for (int64_t c = 1; c < classes; ++c) starts[c] = starts[c - 1] + counts[c - 1];
  std::vector<int32_t> sorted(n);
  std::iota(sorted.begin(), sorted.end(), 0);
  std::stable_sort(sorted.begin(), sorted.end(),
                   [&](int32_t a, int32_t b) { return keys[a] < keys[b]; });

  Admitted a;
  a.kept.assign(n, 0);
  a.position.assign(n, -1);
  for (int64_t s = 0; s < n; ++s) {
    const int32_t v = sorted[s];
    const uint64_t key = keys[v];
    int64_t e, j;
    if (by_prob) {
      e = static_cast<int64_t>(key >> 32);
      if (e >= E) continue;
      j = v % k;
    } else {
      if (key >= static_cast<uint64_t>(k * E)) continue;
      e = static_cast<int64_t>(key) / k;
      j = static_cast<int64_t>(key) % k;
    }
    const int64_t base = !offsets.empty() ? starts[e * k + j] - offsets[j * E + e] : starts[e * k];
    const int64_t rank = s - base;
    if (C < 0 || rank < C) {
      a.kept[v] = 1;
      a.position[v] = rank;
    }
  }
  EXPECT_EQ(counts[k * E + 1], 0) << "bad expert indices";
  a.counts.removed = counts[k * E];
  a.counts.before.assign(E, 0);
  a.counts.after.assign(E, 0);
  for (int64_t e = 0; e < E; ++e) {
    int64_t earlier = 0;
    for (int64_t j = 0; j < k; ++j) {
      const int64_t len = counts[e * k + j];
      a.counts.before[e] += len;
      if (!by_prob) {
        const int64_t base = offsets.empty() ? earlier : offsets[j * E + e];
        a.counts.after[e] += C >= 0 ? std::clamp<int64_t>(C - base, 0, len) : len;
      }
      earlier += len;
    }
    if (by_prob) a.counts.after[e] = C >= 0 ? std::min(a.counts.before[e], C) : a.counts.before[e];
  }
  return a;
}

void ExpectSame(const Admitted& got, const Admitted& want, const std::string& what) {
  EXPECT_EQ(got.kept, want.kept) << what;
  EXPECT_EQ(got.position, want.position) << what;
  EXPECT_EQ(got.counts.before, want.counts.before) << what;
  EXPECT_EQ(got.counts.after, want.counts.after) << what;
  EXPECT_EQ(got.counts.removed, want.counts.removed) << what;
}

// Random assignments: distinct experts per token skewed to the low ones, gates on a 1/8
// grid (exact ties; some -0), keep about 3/4 ones.
void RandomCase(int64_t T, int64_t E, int64_t k, uint64_t seed, Tensor* idx, Tensor* gates,
                Tensor* keep) {
  std::vector<int32_t> iv(T * k);
  std::vector<float> gv(T * k);
  std::vector<uint8_t> kv(T * k);
  const RngKey key{seed, 9};
  uint64_t n = 0;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> pool(E);
    std::iota(pool.begin(), pool.end(), 0);
    for (int64_t j = 0; j < k; ++j) {
      const float u = UniformAt(key, n++);
      const int64_t pick = std::min<int64_t>(E - j - 1, static_cast<int64_t>(u * u * (E - j)));
      iv[t * k + j] = pool[pick];
      pool.erase(pool.begin() + pick);
      const float v = std::floor(UniformAt(key, n++) * 8.0f) / 8.0f;
      gv[t * k + j] = v == 0.0f && UniformAt(key, n++) < 0.5f ? -0.0f : v;
      kv[t * k + j] = UniformAt(key, n++) < 0.75f ? 1 : 0;
    }
  }
  *idx = Tensor::FromVector(iv, {T, k});
  *gates = Tensor::FromVector(gv, {T, k});
  *keep = Tensor::FromVector(kv, {T, k});
}

TEST(MoERoutingTest, SortFormulationOfAdmissionEqualsTheReference) {
  uint64_t seed = 700;
  for (int64_t T : {1, 2, 7, 64, 513}) {
    for (int64_t E : {1, 3, 8, 64}) {
      for (int64_t k : {1, 2, 4}) {
        if (k > E) continue;
        Tensor idx, gates, keep;
        RandomCase(T, E, k, seed += 7, &idx, &gates, &keep);
        for (bool with_keep : {false, true}) {
          const Tensor kp = with_keep ? keep : Tensor();
          for (int64_t C : {int64_t{-1}, int64_t{0}, int64_t{1}, (T * k + E - 1) / E, T}) {
            for (AdmissionOrder order : {AdmissionOrder::kPosition, AdmissionOrder::kProbability}) {
              const std::string what =
                  StrCat("T=", T, " E=", E, " k=", k, " C=", C, " keep=", with_keep,
                         order == AdmissionOrder::kPosition ? " position" : " probability");
              ExpectSame(SortFormulation(idx, gates, kp, E, C, order),
                         Reference(idx, gates, kp, E, C, order), what);
            }
          }
          // Offsets of a later piece: the first half's counts come before it.
          if (T >= 2) {
            const int64_t half = T / 2;
            Tensor first = idx.Slice(0, half), second = idx.Slice(half, T);
            Tensor first_keep = with_keep ? keep.Slice(0, half) : Tensor();
            Tensor second_keep = with_keep ? keep.Slice(half, T) : Tensor();
            Tensor c1 = Tensor::Empty({k * E + 1}, DType::kI64);
            Tensor call = Tensor::Empty({k * E + 1}, DType::kI64);
            CountSlotAssignments(first, first_keep, E, c1);
            CountSlotAssignments(idx, kp, E, call);
            const std::vector<int64_t> p1 = c1.ToVector<int64_t>(), all = call.ToVector<int64_t>();
            std::vector<int64_t> offsets(k * E);
            std::vector<int64_t> earlier(E, 0);
            for (int64_t j = 0; j < k; ++j) {
              for (int64_t e = 0; e < E; ++e) {
                offsets[j * E + e] = earlier[e] + p1[j * E + e];
                earlier[e] += all[j * E + e];
              }
            }
            const int64_t C = (T * k + E - 1) / E;
            ExpectSame(SortFormulation(second, Tensor(), second_keep, E, C,
                                       AdmissionOrder::kPosition, offsets),
                       Reference(second, Tensor(), second_keep, E, C, AdmissionOrder::kPosition,
                                 offsets),
                       StrCat("offsets T=", T, " E=", E, " k=", k, " keep=", with_keep));
          }
        }
      }
    }
  }
}

TEST(MoERoutingTest, AdmissionEdgeCases) {
  // T = 0.
  Tensor none = Tensor::Empty({0, 2}, DType::kI32);
  Admitted empty = Reference(none, Tensor::Empty({0, 2}, DType::kF32), Tensor(), 4, 3,
                             AdmissionOrder::kProbability);
  EXPECT_EQ(empty.counts.before, std::vector<int64_t>(4, 0));
  EXPECT_TRUE(empty.kept.empty());
  // Every assignment removed.
  Tensor idx = Tensor::FromVector(std::vector<int32_t>{0, 1, 1, 0, 2, 3}, {3, 2});
  Tensor gates = Tensor::FromVector(std::vector<float>{0.5f, 0.5f, 0.6f, 0.4f, 0.9f, 0.1f}, {3, 2});
  Tensor removed = Tensor::Zeros({3, 2}, DType::kU8);
  for (AdmissionOrder order : {AdmissionOrder::kPosition, AdmissionOrder::kProbability}) {
    Admitted a = Reference(idx, gates, removed, 4, 1, order);
    EXPECT_EQ(a.counts.removed, 6);
    EXPECT_EQ(a.kept, std::vector<uint8_t>(6, 0));
    EXPECT_EQ(a.position, std::vector<int64_t>(6, -1));
    EXPECT_EQ(a.counts.before, std::vector<int64_t>(4, 0));
    ExpectSame(SortFormulation(idx, gates, removed, 4, 1, order), a, "all removed");
  }
  // k = E, capacity 0: nothing kept, everything competed.
  Tensor full = Tensor::FromVector(std::vector<int32_t>{2, 0, 1, 0, 1, 2}, {2, 3});
  Tensor fg = Tensor::FromVector(std::vector<float>{0.2f, 0.3f, 0.5f, 0.1f, 0.1f, 0.8f}, {2, 3});
  Admitted zero = Reference(full, fg, Tensor(), 3, 0, AdmissionOrder::kProbability);
  EXPECT_EQ(zero.counts.before, (std::vector<int64_t>{2, 2, 2}));
  EXPECT_EQ(zero.counts.after, (std::vector<int64_t>{0, 0, 0}));
  // -0 and +0 gates tie: token then slot order decides.
  Tensor zi = Tensor::FromVector(std::vector<int32_t>{0, 0}, {2, 1});
  Tensor zg = Tensor::FromVector(std::vector<float>{-0.0f, 0.0f}, {2, 1});
  Admitted zeros = Reference(zi, zg, Tensor(), 1, 1, AdmissionOrder::kProbability);
  EXPECT_EQ(zeros.kept, (std::vector<uint8_t>{1, 0}));
  ExpectSame(SortFormulation(zi, zg, Tensor(), 1, 1, AdmissionOrder::kProbability), zeros,
             "signed zeros");
}

}  // namespace
}  // namespace switchyard::kernels
