// kernels/attention.h's block operations (ring attention's building blocks): the kFull mask
// against a naive loop in double, and its gradients against finite differences; a causal
// attention of length 2L split into key blocks — the first half's queries on the first
// half's keys (kCausal), the second half's on the first half's (kFull) merged with the
// second half's (kCausal), the backward of each block with the final lse and delta — equals
// plain causal AttentionForward/AttentionBackward of the whole length, with and without
// grouped-query heads; AttentionMerge with rows that have seen nothing (-inf) and rows
// whose exp(lse) overflows f32; delta against its definition.
//
// Tolerances: tests/kernels/attention_bound.h's forward-error bounds, which hold for any f32
// evaluation, whole or as merged key blocks (M merges). kFull against its exact value: within
// the bound (M = 0). Blocks against the whole: each side within its bound of the same exact
// value, so within twice the bound of M = 1 (the larger). The same with and without delta.
// The merge's own tests derive theirs from its few f32 operations (MergeBound).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernels/attention.h"
#include "kernels/elementwise.h"
#include "tests/kernels/attention_bound.h"
#include "tests/kernels/grad_check.h"
#include "tests/testing/tolerance.h"

namespace switchyard::kernels {
namespace {

using testing::Dot;
using testing::ExpectClose;
using testing::NumericGradient;
using testing::RandomTensor;

using test_util::AttentionWithBound;
using test_util::ExpectWithinAttentionBound;
constexpr float kInf = std::numeric_limits<float>::infinity();

struct Heads {
  int64_t hq, hkv;
  std::string Name() const { return "Hq=" + std::to_string(hq) + ",Hkv=" + std::to_string(hkv); }
};
const Heads kHeads[] = {{2, 2}, {4, 1}, {4, 2}};

Tensor Empty(const Shape& shape) { return Tensor::Empty(shape, DType::kF32); }

// Positions [s0, s0 + len) of x (B, S, H, hd) as a new (B, len, H, hd) tensor.
Tensor Positions(const Tensor& x, int64_t s0, int64_t len) {
  const int64_t b = x.dim(0), s = x.dim(1), row = x.dim(2) * x.dim(3);
  Tensor out = Empty({b, len, x.dim(2), x.dim(3)});
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < len * row; ++i)
      out.data<float>()[bi * len * row + i] = x.data<float>()[(bi * s + s0) * row + i];
  return out;
}

// Joins (B, L, H, hd) halves into (B, 2L, H, hd).
Tensor JoinPositions(const Tensor& a, const Tensor& c) {
  const int64_t b = a.dim(0), l = a.dim(1), row = a.dim(2) * a.dim(3);
  Tensor out = Empty({b, 2 * l, a.dim(2), a.dim(3)});
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < l * row; ++i) {
      out.data<float>()[(bi * 2 * l) * row + i] = a.data<float>()[bi * l * row + i];
      out.data<float>()[(bi * 2 * l + l) * row + i] = c.data<float>()[bi * l * row + i];
    }
  return out;
}

// Joins (B, H, L) lse halves into (B, H, 2L).
Tensor JoinLse(const Tensor& a, const Tensor& c) {
  const int64_t bh = a.dim(0) * a.dim(1), l = a.dim(2);
  Tensor out = Empty({a.dim(0), a.dim(1), 2 * l});
  for (int64_t r = 0; r < bh; ++r)
    for (int64_t i = 0; i < l; ++i) {
      out.data<float>()[r * 2 * l + i] = a.data<float>()[r * l + i];
      out.data<float>()[r * 2 * l + l + i] = c.data<float>()[r * l + i];
    }
  return out;
}

Tensor Sum(const Tensor& a, const Tensor& c) {
  Tensor out = Empty(a.shape());
  Add(a, c, out);
  return out;
}

// ---- kFull --------------------------------------------------------------------------------

// Unmasked attention, one (b, h, i) at a time in double.
void NaiveFull(const Tensor& q_t, const Tensor& k_t, const Tensor& v_t, std::vector<double>& out,
               std::vector<double>& lse) {
  const int64_t b = q_t.dim(0), s = q_t.dim(1), hq = q_t.dim(2), hd = q_t.dim(3);
  const int64_t hkv = k_t.dim(2), group = hq / hkv;
  const std::vector<float> q = q_t.ToVector<float>(), k = k_t.ToVector<float>(),
                           v = v_t.ToVector<float>();
  out.assign(q.size(), 0.0);
  lse.assign(b * hq * s, 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t h = 0; h < hq; ++h)
      for (int64_t i = 0; i < s; ++i) {
        std::vector<double> sc(s);
        double max = -1e300, sum = 0.0;
        for (int64_t j = 0; j < s; ++j) {  // every key
          double dot = 0.0;
          for (int64_t e = 0; e < hd; ++e)
            dot += q[((bi * s + i) * hq + h) * hd + e] *
                   static_cast<double>(k[((bi * s + j) * hkv + h / group) * hd + e]);
          sc[j] = scale * dot;
          max = std::max(max, sc[j]);
        }
        for (int64_t j = 0; j < s; ++j) sum += std::exp(sc[j] - max);
        lse[(bi * hq + h) * s + i] = max + std::log(sum);
        for (int64_t j = 0; j < s; ++j)
          for (int64_t e = 0; e < hd; ++e)
            out[((bi * s + i) * hq + h) * hd + e] +=
                std::exp(sc[j] - max) / sum * v[((bi * s + j) * hkv + h / group) * hd + e];
      }
}

TEST(AttentionBlockTest, FullMaskMatchesNaiveLoop) {
  for (const Heads& c : kHeads) {
    for (int64_t s : {1, 6}) {
      const int64_t b = 2, hd = 4;
      Tensor q = RandomTensor({b, s, c.hq, hd}, 100), k = RandomTensor({b, s, c.hkv, hd}, 101),
             v = RandomTensor({b, s, c.hkv, hd}, 102);
      Tensor out = Empty(q.shape()), lse = Empty({b, c.hq, s});
      AttentionForward(q, k, v, out, lse, nullptr, AttentionMask::kFull);
      std::vector<double> want_out, want_lse;
      NaiveFull(q, k, v, want_out, want_lse);
      const test_util::AttentionRef ref = AttentionWithBound(q, k, v, Tensor(), false, 0);
      const std::string what = c.Name() + " S=" + std::to_string(s) + " full";
      ExpectWithinAttentionBound(out.ToVector<float>(), want_out, ref.out_bound, 1.0, what + " out");
      ExpectWithinAttentionBound(lse.ToVector<float>(), want_lse, ref.lse_bound, 1.0, what + " lse");
    }
  }
}

TEST(AttentionBlockTest, FullMaskGradientsMatchFiniteDifferences) {
  // As attention_test.cc: central differences of the f32 forward, step 1e-2.
  for (const Heads& c : kHeads) {
    const int64_t b = 2, s = 4, hd = 4;
    Tensor q = RandomTensor({b, s, c.hq, hd}, 110), k = RandomTensor({b, s, c.hkv, hd}, 111),
           v = RandomTensor({b, s, c.hkv, hd}, 112);
    const std::vector<float> dout = RandomTensor(q.shape(), 113).ToVector<float>();
    Tensor out = Empty(q.shape()), lse = Empty({b, c.hq, s});
    auto loss = [&] {
      AttentionForward(q, k, v, out, lse, nullptr, AttentionMask::kFull);
      return Dot(out, dout);
    };
    loss();
    Tensor dq = RandomTensor(q.shape(), 99, 5.0f, 6.0f), dk = RandomTensor(k.shape(), 98, 5.0f, 6.0f),
           dv = RandomTensor(v.shape(), 97, 5.0f, 6.0f);  // written, not accumulated
    AttentionBackward(q, k, v, lse, Tensor::FromVector(dout, q.shape()), dq, dk, dv, nullptr,
                      AttentionMask::kFull);
    ExpectClose(dq.ToVector<float>(), NumericGradient(q, loss, 1e-2f), 1e-4, 1e-3,
                c.Name() + " full dq");
    ExpectClose(dk.ToVector<float>(), NumericGradient(k, loss, 1e-2f), 1e-4, 1e-3,
                c.Name() + " full dk");
    ExpectClose(dv.ToVector<float>(), NumericGradient(v, loss, 1e-2f), 1e-4, 1e-3,
                c.Name() + " full dv");
  }
}

// ---- Block decomposition ------------------------------------------------------------------

// Causal attention of length 2L as key blocks, forward and backward, against the plain call.
void CheckDecomposition(const Heads& c, int64_t l, uint64_t seed) {
  const int64_t b = 2, s = 2 * l, hd = 8;
  const std::string name = c.Name() + " L=" + std::to_string(l);
  Tensor q = RandomTensor({b, s, c.hq, hd}, seed), k = RandomTensor({b, s, c.hkv, hd}, seed + 1),
         v = RandomTensor({b, s, c.hkv, hd}, seed + 2), dout = RandomTensor(q.shape(), seed + 3);
  Tensor out = Empty(q.shape()), lse = Empty({b, c.hq, s});
  AttentionForward(q, k, v, out, lse);
  Tensor dq = Empty(q.shape()), dk = Empty(k.shape()), dv = Empty(v.shape());
  AttentionBackward(q, k, v, lse, dout, dq, dk, dv);

  Tensor q0 = Positions(q, 0, l), q1 = Positions(q, l, l), k0 = Positions(k, 0, l),
         k1 = Positions(k, l, l), v0 = Positions(v, 0, l), v1 = Positions(v, l, l);
  Tensor do0 = Positions(dout, 0, l), do1 = Positions(dout, l, l);
  // Forward: queries 0 see keys 0 causally; queries 1 see keys 0 fully, keys 1 causally.
  Tensor o0 = Empty(q0.shape()), l0 = Empty({b, c.hq, l});
  AttentionForward(q0, k0, v0, o0, l0);
  Tensor o1 = Empty(q1.shape()), l1 = Tensor::FromVector(std::vector<float>(b * c.hq * l, -kInf),
                                                          {b, c.hq, l});
  Tensor ob = Empty(q1.shape()), lb = Empty({b, c.hq, l});
  AttentionForward(q1, k0, v0, ob, lb, nullptr, AttentionMask::kFull);
  AttentionMerge(o1, l1, ob, lb);  // from nothing seen (-inf): takes the block
  AttentionForward(q1, k1, v1, ob, lb, nullptr, AttentionMask::kCausal);
  AttentionMerge(o1, l1, ob, lb);
  // Queries 1 take one real merge (the first merge is into -inf: a copy).
  const test_util::AttentionRef ref = AttentionWithBound(q, k, v, dout, true, 1);
  ExpectWithinAttentionBound(JoinPositions(o0, o1).ToVector<float>(), out.ToVector<float>(),
                             ref.out_bound, 2.0, name + " blocks out");
  ExpectWithinAttentionBound(JoinLse(l0, l1).ToVector<float>(), lse.ToVector<float>(),
                             ref.lse_bound, 2.0, name + " blocks lse");

  // Backward: every block with the final lse and the final out's delta.
  Tensor d0 = Empty({b, c.hq, l}), d1 = Empty({b, c.hq, l});
  AttentionBackwardDelta(o0, do0, d0);
  AttentionBackwardDelta(o1, do1, d1);
  Tensor dq0 = Empty(q0.shape()), dk00 = Empty(k0.shape()), dv00 = Empty(v0.shape());
  AttentionBackward(q0, k0, v0, l0, do0, dq0, dk00, dv00, nullptr, AttentionMask::kCausal, d0);
  Tensor dq10 = Empty(q1.shape()), dk10 = Empty(k0.shape()), dv10 = Empty(v0.shape());
  AttentionBackward(q1, k0, v0, l1, do1, dq10, dk10, dv10, nullptr, AttentionMask::kFull, d1);
  Tensor dq11 = Empty(q1.shape()), dk11 = Empty(k1.shape()), dv11 = Empty(v1.shape());
  AttentionBackward(q1, k1, v1, l1, do1, dq11, dk11, dv11, nullptr, AttentionMask::kCausal, d1);
  ExpectWithinAttentionBound(JoinPositions(dq0, Sum(dq10, dq11)).ToVector<float>(),
                             dq.ToVector<float>(), ref.dq_bound, 2.0, name + " blocks dq");
  ExpectWithinAttentionBound(JoinPositions(Sum(dk00, dk10), dk11).ToVector<float>(),
                             dk.ToVector<float>(), ref.dk_bound, 2.0, name + " blocks dk");
  ExpectWithinAttentionBound(JoinPositions(Sum(dv00, dv10), dv11).ToVector<float>(),
                             dv.ToVector<float>(), ref.dv_bound, 2.0, name + " blocks dv");
}

TEST(AttentionBlockTest, CausalBlocksMergeToTheWholeAttention) {
  uint64_t seed = 200;
  for (const Heads& c : kHeads)
    for (int64_t l : {1, 3, 16}) CheckDecomposition(c, l, seed += 10);
}

TEST(AttentionBlockTest, DeltaOfTheWholeSoftmaxGivesTheSameGradients) {
  // One block that is the whole softmax: passing its own delta changes only rounding.
  for (const Heads& c : kHeads) {
    for (AttentionMask mask : {AttentionMask::kCausal, AttentionMask::kFull}) {
      const int64_t b = 2, s = 7, hd = 8;
      Tensor q = RandomTensor({b, s, c.hq, hd}, 300), k = RandomTensor({b, s, c.hkv, hd}, 301),
             v = RandomTensor({b, s, c.hkv, hd}, 302), dout = RandomTensor(q.shape(), 303);
      Tensor out = Empty(q.shape()), lse = Empty({b, c.hq, s}), delta = Empty({b, c.hq, s});
      AttentionForward(q, k, v, out, lse, nullptr, mask);
      AttentionBackwardDelta(out, dout, delta);
      Tensor dq = Empty(q.shape()), dk = Empty(k.shape()), dv = Empty(v.shape());
      AttentionBackward(q, k, v, lse, dout, dq, dk, dv, nullptr, mask);
      Tensor dq2 = Empty(q.shape()), dk2 = Empty(k.shape()), dv2 = Empty(v.shape());
      AttentionBackward(q, k, v, lse, dout, dq2, dk2, dv2, nullptr, mask, delta);
      const std::string name =
          c.Name() + (mask == AttentionMask::kFull ? " full" : " causal") + " with delta";
      // Both within the bound (M = 0; D covers either route to delta) of the same values.
      const test_util::AttentionRef ref =
          AttentionWithBound(q, k, v, dout, mask == AttentionMask::kCausal, 0);
      ExpectWithinAttentionBound(dq2.ToVector<float>(), dq.ToVector<float>(), ref.dq_bound, 2.0,
                                 name + " dq");
      ExpectWithinAttentionBound(dk2.ToVector<float>(), dk.ToVector<float>(), ref.dk_bound, 2.0,
                                 name + " dk");
      // dv does not read delta: bitwise equal.
      EXPECT_EQ(dv2.ToVector<float>(), dv.ToVector<float>()) << name;
    }
  }
}

TEST(AttentionBlockTest, DeltaIsTheRowSumOfDoutTimesOut) {
  const int64_t b = 2, s = 3, hq = 2, hd = 5;
  Tensor out = RandomTensor({b, s, hq, hd}, 400), dout = RandomTensor({b, s, hq, hd}, 401);
  Tensor delta = Empty({b, hq, s});
  AttentionBackwardDelta(out, dout, delta);
  const std::vector<float> o = out.ToVector<float>(), g = dout.ToVector<float>();
  std::vector<double> want(b * hq * s, 0.0), scale(b * hq * s, 0.0);
  for (int64_t bi = 0; bi < b; ++bi)
    for (int64_t i = 0; i < s; ++i)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t e = 0; e < hd; ++e) {
          const double t = static_cast<double>(o[((bi * s + i) * hq + h) * hd + e]) *
                           g[((bi * s + i) * hq + h) * hd + e];
          want[(bi * hq + h) * s + i] += t;
          scale[(bi * hq + h) * s + i] += std::abs(t);
        }
  // A double sum of hd exact products (error <= hd 2^-53 sum |t|) rounded once to f32
  // (<= u |delta| <= u sum |t|): within 2 u sum |t| (c = 1, k + extra = 2).
  test_util::ExpectWithinProductBound(delta.ToVector<float>(), want, scale, 0, "delta (B, Hq, S)",
                                      /*c=*/1.0, /*extra=*/2);
}

// ---- Merge --------------------------------------------------------------------------------

// One merge of the rows (oa, la) and (ob, lb), both finite, exact f32 inputs, in double with
// the bound of AttentionMerge's f32 operations (kernels/cpu/attention.cc), u = 2^-24:
//   lo - hi: u |lo - hi|; E = exp(lo - hi) <= 1 (std::exp, taken as 2u): dE <= E (u |lo - hi|
//   + 2u); log1p (slope <= 1, 2u of its value L): dL <= dE + 2u L; merged = hi + L: dl <= dL +
//   u |merged|; w = exp(l - merged): relative eps = dl + u |l - merged| + 2u; out = oa wa + ob
//   wb (two products and a sum): |dout| <= (eps_a + 3u) |oa| wa + (eps_b + 3u) |ob| wb.
// Second order x 1.01. Returns out (hd) then lse, with their bounds.
struct Merged {
  std::vector<double> value, bound;
};
Merged MergeWithBound(const std::vector<float>& oa, double la, const std::vector<float>& ob,
                      double lb) {
  const double u = test_util::kF32Unit, hi = std::max(la, lb), lo = std::min(la, lb);
  const double e = std::exp(lo - hi), l = std::log1p(e), merged = hi + l;
  const double dl = 1.01 * (e * (u * std::abs(lo - hi) + 2 * u) + 2 * u * l + u * std::abs(merged));
  const double wa = std::exp(la - merged), wb = std::exp(lb - merged);
  const double ea = 1.01 * (dl + u * std::abs(la - merged) + 2 * u),
               eb = 1.01 * (dl + u * std::abs(lb - merged) + 2 * u);
  Merged m;
  for (size_t i = 0; i < oa.size(); ++i) {
    m.value.push_back(oa[i] * wa + ob[i] * wb);
    m.bound.push_back((ea + 3 * u) * std::abs(oa[i]) * wa + (eb + 3 * u) * std::abs(ob[i]) * wb);
  }
  m.value.push_back(merged);
  m.bound.push_back(dl);
  return m;
}

TEST(AttentionBlockTest, MergeTakesTheBlockWhereNothingWasSeen) {
  // (B, S, Hq, hd) = (1, 2, 2, 3): rows (i, h); lse (1, 2, 2) indexed [h][i].
  const Shape os{1, 2, 2, 3}, ls{1, 2, 2};
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Row (i=0, h=0) and (i=1, h=1) have seen nothing: their out is garbage (NaN).
  Tensor out = Tensor::FromVector(std::vector<float>{nan, nan, nan, 1, 2, 3, 4, 5, 6, nan, nan, nan},
                                  os);
  Tensor lse = Tensor::FromVector(std::vector<float>{-kInf, 0.5f, 2.0f, -kInf}, ls);
  // The block: row (0, 0) and (0, 1) finite, (1, 0) saw nothing, (1, 1) finite.
  Tensor out_b = Tensor::FromVector(
      std::vector<float>{10, 11, 12, 13, 14, 15, 0, 0, 0, 16, 17, 18}, os);
  Tensor lse_b = Tensor::FromVector(std::vector<float>{1.0f, -kInf, 3.0f, 0.25f}, ls);
  AttentionMerge(out, lse, out_b, lse_b);
  const std::vector<float> o = out.ToVector<float>(), l = lse.ToVector<float>();
  // (0, 0): -inf running -> exactly the block.
  EXPECT_EQ((std::vector<float>{o[0], o[1], o[2]}), (std::vector<float>{10, 11, 12}));
  EXPECT_EQ(l[0], 1.0f);
  // (1, 1): -inf running -> exactly the block.
  EXPECT_EQ((std::vector<float>{o[9], o[10], o[11]}), (std::vector<float>{16, 17, 18}));
  EXPECT_EQ(l[3], 0.25f);
  // (1, 0): the block saw nothing (-inf) -> the running row unchanged.
  EXPECT_EQ((std::vector<float>{o[6], o[7], o[8]}), (std::vector<float>{4, 5, 6}));
  EXPECT_EQ(l[1], 0.5f);
  // (0, 1): both finite: lse' = log(e^2 + e^3), out' = weights e^(2-lse'), e^(3-lse').
  const Merged want = MergeWithBound({1, 2, 3}, 2.0, {13, 14, 15}, 3.0);
  EXPECT_NEAR(want.value[3], std::log(std::exp(2.0) + std::exp(3.0)), 1e-12);
  ExpectWithinAttentionBound(std::vector<float>{o[3], o[4], o[5], l[2]}, want.value, want.bound,
                             1.0, "merged row");
}

TEST(AttentionBlockTest, MergeIsStableWhereExpOverflows) {
  // exp(100) overflows f32: the max + log1p form must not. lse' ~ 100.3 carries f32's
  // rounding at 100 (u |merged| ~ 6e-6) into both weights: MergeWithBound's u |merged| term.
  Tensor out = Tensor::FromVector(std::vector<float>{1, -1}, {1, 1, 1, 2});
  Tensor lse = Tensor::FromVector(std::vector<float>{100.0f}, {1, 1, 1});
  Tensor out_b = Tensor::FromVector(std::vector<float>{3, 5}, {1, 1, 1, 2});
  Tensor lse_b = Tensor::FromVector(std::vector<float>{99.0f}, {1, 1, 1});
  AttentionMerge(out, lse, out_b, lse_b);
  const Merged want = MergeWithBound({1, -1}, 100.0, {3, 5}, 99.0);
  ExpectWithinAttentionBound(
      std::vector<float>{out.data<float>()[0], out.data<float>()[1], lse.data<float>()[0]},
      want.value, want.bound, 1.0, "merge at lse 100 and 99");
}

TEST(AttentionBlockDeathTest, DeltaOfTheWrongShapeIsFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");  // OpenBLAS has started its threads
  Tensor q = Tensor::Zeros({1, 2, 2, 4}, DType::kF32), kv = Tensor::Zeros({1, 2, 1, 4}, DType::kF32);
  Tensor lse = Tensor::Zeros({1, 2, 2}, DType::kF32), delta = Tensor::Zeros({1, 2, 3}, DType::kF32);
  Tensor dq = Tensor::Zeros(q.shape(), DType::kF32), dk = Tensor::Zeros(kv.shape(), DType::kF32),
         dv = Tensor::Zeros(kv.shape(), DType::kF32);
  EXPECT_DEATH(AttentionBackward(q, kv, kv, lse, q, dq, dk, dv, nullptr, AttentionMask::kFull, delta),
               "delta");
}

}  // namespace
}  // namespace switchyard::kernels
