// dense/ring_attention.h under mpirun (2 and 4 ranks): every rank builds q, k, v and dout of
// the WHOLE sequences from the same seed, runs plain causal kernels::AttentionForward and
// AttentionBackward on them, and keeps as the expected values its own rows in the local
// layout (rows [0, B) chunk i, rows [B, 2B) chunk 2c-1-i of every sequence); then
// RingAttentionForward/Backward on its shards must give out, lse, dq, dk and dv within
//   |ring - whole| <= 2 bound
// with bound tests/kernels/attention_bound.h's forward-error bound of the whole causal
// attention evaluated with up to M = 2c - 1 merges (a query chunk sees at most 2c key chunks:
// the first merge into -inf is a copy) and the blocks' sums of dq, dk and dv (covered by its
// G S + 2 M + 2 roundings per term): the whole call (M = 0) and the ring are each within
// that bound of the same exact values. The largest fraction of it used over the ranks is
// printed.
//
// Cases: cp = the world (2 or 4), cp groups of 2 inside 4 ranks whose group ranks are not
// the world ranks, and cp = 1 (a local communicator); grouped-query heads (Hq = 4, Hkv = 1)
// and multi-head (Hq = Hkv = 2); B = 2; Sc = 1, 3 and 16 (at cp 4, S = 128: 7 of every
// rank's 16 blocks per pass are skipped). The balance: RingAttentionStats.pairs is the same
// on every rank of the group (all-gathered) and equals the whole causal pair count / c;
// blocks computed 2c+1 and skipped 2c-1 per pass; bytes sent (c-1)/c of the whole k+v per
// pass (forward one, backward two).
//
// The fused bf16 path (kernels/flash_attention.h, selected by a bf16 context with hd 64 or
// 128; its CPU twin here): the same checks with a bf16 context on both sides and
// tests/kernels/flash_attention_bound.h's bound with the same M merges instead (the whole
// call and the ring are each within it of the exact values), hd 64 and 128, Sc 3, 16 and 40
// (the ring's blocks are not the fused kernel's 64-row blocks).
//
// Between collectives only EXPECT_* (never ASSERT_*): every rank must reach every call.
#include "dense/ring_attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/philox.h"
#include "engine/dist/communicator.h"
#include "engine/dist/process.h"
#include "engine/core/device_context.h"
#include "kernels/attention.h"
#include "kernels/flash_attention.h"
#include "kernels/random.h"
#include "tests/kernels/attention_bound.h"
#include "tests/kernels/flash_attention_bound.h"

namespace switchyard::dense {
namespace {

struct Case {
  int64_t b, sc, hq, hkv, hd;
  std::string Name(int c) const {
    return "cp=" + std::to_string(c) + " B=" + std::to_string(b) + " Sc=" + std::to_string(sc) +
           " Hq=" + std::to_string(hq) + " Hkv=" + std::to_string(hkv);
  }
};

Tensor Uniform(const Shape& shape, uint64_t stream) {
  Tensor t = Tensor::Empty(shape, DType::kF32);
  kernels::FillUniform(t, RngKey{14, stream}, 0, -1.0f, 1.0f);
  return t;
}

// x (B, S, H, hd) of the whole sequences -> the local (2B, Sc, H, hd) of cp rank i of c.
Tensor Shard(const Tensor& x, int c, int i) {
  const int64_t b = x.dim(0), s = x.dim(1), sc = s / (2 * c), row = x.dim(2) * x.dim(3);
  Tensor out = Tensor::Empty({2 * b, sc, x.dim(2), x.dim(3)}, DType::kF32);
  const int chunks[2] = {i, 2 * c - 1 - i};
  for (int h = 0; h < 2; ++h)
    for (int64_t bi = 0; bi < b; ++bi)
      std::copy_n(x.data<float>() + (bi * s + chunks[h] * sc) * row, sc * row,
                  out.data<float>() + ((h * b + bi) * sc) * row);
  return out;
}

// lse (B, H, S) of the whole sequences -> the local (2B, H, Sc).
Tensor ShardLse(const Tensor& x, int c, int i) {
  const int64_t b = x.dim(0), hq = x.dim(1), s = x.dim(2), sc = s / (2 * c);
  Tensor out = Tensor::Empty({2 * b, hq, sc}, DType::kF32);
  const int chunks[2] = {i, 2 * c - 1 - i};
  for (int h = 0; h < 2; ++h)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t head = 0; head < hq; ++head)
        std::copy_n(x.data<float>() + (bi * hq + head) * s + chunks[h] * sc, sc,
                    out.data<float>() + ((h * b + bi) * hq + head) * sc);
  return out;
}

// Shard's and ShardLse's row selection on a bound in double: (B, S, row) -> (2B, Sc, row)
// and (B, H, S) -> (2B, H, Sc).
std::vector<double> ShardBound(const std::vector<double>& x, int64_t b, int64_t s, int64_t row,
                               int c, int i) {
  const int64_t sc = s / (2 * c);
  std::vector<double> out(2 * b * sc * row);
  const int chunks[2] = {i, 2 * c - 1 - i};
  for (int h = 0; h < 2; ++h)
    for (int64_t bi = 0; bi < b; ++bi)
      std::copy_n(x.begin() + (bi * s + chunks[h] * sc) * row, sc * row,
                  out.begin() + ((h * b + bi) * sc) * row);
  return out;
}
std::vector<double> ShardLseBound(const std::vector<double>& x, int64_t b, int64_t hq, int64_t s,
                                  int c, int i) {
  const int64_t sc = s / (2 * c);
  std::vector<double> out(2 * b * hq * sc);
  const int chunks[2] = {i, 2 * c - 1 - i};
  for (int h = 0; h < 2; ++h)
    for (int64_t bi = 0; bi < b; ++bi)
      for (int64_t head = 0; head < hq; ++head)
        std::copy_n(x.begin() + (bi * hq + head) * s + chunks[h] * sc, sc,
                    out.begin() + ((h * b + bi) * hq + head) * sc);
  return out;
}

// Largest fraction of 2 bound any element uses on any rank of `world` (NaN counts as
// infinitely much); collective.
double WorstShare(const Tensor& got, const Tensor& want, const std::vector<double>& bound,
                  dist::Communicator& world) {
  const std::vector<float> g = got.ToVector<float>(), w = want.ToVector<float>();
  double worst = g.size() == w.size() && bound.size() == w.size() ? 0.0 : INFINITY;
  if (worst == 0.0) worst = test_util::WorstFractionOfBound(g, w, bound, 2.0).fraction;
  Tensor t = Tensor::FromVector(std::vector<double>{worst}, {1});
  world.AllReduce(t, dist::ReduceOp::kMax);
  return t.data<double>()[0];
}

void ExpectWithin(const Tensor& got, const Tensor& want, const std::vector<double>& bound,
                  dist::Communicator& world, const std::string& what) {
  const double share = WorstShare(got, want, bound, world);
  EXPECT_LE(share, 1.0) << what << ": " << share << " of the bound 2 x attention_bound.h's";
  if (world.rank() == 0) std::printf("  %-44s bound used %.3f\n", what.c_str(), share);
}

// Every rank of cp reports the same value, and it equals `want`.
void ExpectOnEveryRank(int64_t value, int64_t want, dist::Communicator& cp,
                       const std::string& what) {
  Tensor mine = Tensor::FromVector(std::vector<int64_t>{value}, {1});
  Tensor all = Tensor::Empty({cp.size()}, DType::kI64);
  cp.AllGather(mine, all);
  const std::vector<int64_t> v = all.ToVector<int64_t>();
  for (int r = 0; r < cp.size(); ++r) {
    EXPECT_EQ(v[r], want) << what << " on cp rank " << r << " (of " << cp.size() << ")";
  }
}

// The whole-sequence reference against the ring on cp; `world` reports the worst shares.
// ctx: null (exact f32 attention) or a bf16 CPU context (the fused path's twin).
void CheckCase(const Case& cs, dist::Communicator& cp, dist::Communicator& world, uint64_t seed,
               DeviceContext* ctx = nullptr) {
  const int c = cp.size(), i = cp.rank();
  const int64_t s = 2 * c * cs.sc;
  const std::string name = cs.Name(c) + (ctx != nullptr ? " bf16" : "");
  Tensor q = Uniform({cs.b, s, cs.hq, cs.hd}, seed), k = Uniform({cs.b, s, cs.hkv, cs.hd}, seed + 1),
         v = Uniform({cs.b, s, cs.hkv, cs.hd}, seed + 2), dout = Uniform(q.shape(), seed + 3);
  Tensor out = Tensor::Empty(q.shape(), DType::kF32);
  Tensor lse = Tensor::Empty({cs.b, cs.hq, s}, DType::kF32);
  kernels::AttentionForward(q, k, v, out, lse, ctx);
  Tensor dq = Tensor::Empty(q.shape(), DType::kF32), dk = Tensor::Empty(k.shape(), DType::kF32),
         dv = Tensor::Empty(v.shape(), DType::kF32);
  kernels::AttentionBackward(q, k, v, lse, dout, dq, dk, dv, ctx);
  const test_util::AttentionRef ref =
      ctx != nullptr
          ? test_util::FlashAttentionWithBound(q, k, v, dout, true, test_util::kBf16Unit, 2 * c - 1)
          : test_util::AttentionWithBound(q, k, v, dout, true, 2 * c - 1);
  const int64_t qrow = cs.hq * cs.hd, kvrow = cs.hkv * cs.hd;

  Tensor lq = Shard(q, c, i), lk = Shard(k, c, i), lv = Shard(v, c, i), ldo = Shard(dout, c, i);
  Tensor lout = Tensor::Empty(lq.shape(), DType::kF32);
  Tensor llse = Tensor::Empty({2 * cs.b, cs.hq, cs.sc}, DType::kF32);
  RingAttentionStats fwd;
  RingAttentionForward(lq, lk, lv, lout, llse, cp, ctx, &fwd);
  ExpectWithin(lout, Shard(out, c, i), ShardBound(ref.out_bound, cs.b, s, qrow, c, i), world,
               name + " out");
  ExpectWithin(llse, ShardLse(lse, c, i), ShardLseBound(ref.lse_bound, cs.b, cs.hq, s, c, i),
               world, name + " lse");

  // Garbage in the gradients: they are written, not accumulated.
  Tensor ldq = Uniform(lq.shape(), 90), ldk = Uniform(lk.shape(), 91), ldv = Uniform(lv.shape(), 92);
  RingAttentionStats bwd;
  RingAttentionBackward(lq, lk, lv, lout, llse, ldo, ldq, ldk, ldv, cp, ctx, &bwd);
  ExpectWithin(ldq, Shard(dq, c, i), ShardBound(ref.dq_bound, cs.b, s, qrow, c, i), world,
               name + " dq");
  ExpectWithin(ldk, Shard(dk, c, i), ShardBound(ref.dk_bound, cs.b, s, kvrow, c, i), world,
               name + " dk");
  ExpectWithin(ldv, Shard(dv, c, i), ShardBound(ref.dv_bound, cs.b, s, kvrow, c, i), world,
               name + " dv");

  // Balance: the whole causal pair count B Hq S (S + 1) / 2, split evenly.
  const int64_t total = cs.b * cs.hq * s * (s + 1) / 2;
  EXPECT_EQ(total % c, 0) << name;
  ExpectOnEveryRank(fwd.pairs, total / c, cp, name + " forward pairs");
  ExpectOnEveryRank(bwd.pairs, total / c, cp, name + " backward pairs");
  for (const RingAttentionStats* st : {&fwd, &bwd}) {
    EXPECT_EQ(st->blocks_computed, 2 * c + 1) << name;
    EXPECT_EQ(st->blocks_skipped, 2 * c - 1) << name;
  }
  // (c-1)/c of the whole k + v bytes per pass.
  const int64_t whole_kv = 2 * cs.b * s * cs.hkv * cs.hd * static_cast<int64_t>(sizeof(float));
  EXPECT_EQ(fwd.bytes_sent, whole_kv * (c - 1) / c) << name;
  EXPECT_EQ(bwd.bytes_sent, 2 * whole_kv * (c - 1) / c) << name;
}

const Case kCases[] = {
    {2, 1, 4, 1, 8},   // Sc = 1, GQA 4:1
    {2, 1, 2, 2, 8},   // Sc = 1, multi-head
    {2, 3, 4, 1, 8},
    {2, 3, 2, 2, 8},
    {2, 16, 4, 1, 8},  // longer: half of the blocks skipped
    {2, 16, 2, 2, 8},
};

// Head widths the fused bf16 path takes.
const Case kFusedCases[] = {
    {2, 3, 4, 1, 64},
    {2, 16, 2, 2, 128},
    {1, 40, 4, 2, 64},  // at cp 1, S = 80: the whole call's second 64-row block is partial
};

std::unique_ptr<DeviceContext> Bf16Context() {
  auto ctx = DeviceContext::Create(Device::Cpu());
  ctx->set_matmul_dtype(DType::kBF16);
  return ctx;
}

class RingAttentionTest : public testing::Test {
 protected:
  void SetUp() override { world_ = dist::WorldCommunicator(); }
  void TearDown() override { world_.reset(); }
  std::unique_ptr<dist::Communicator> world_;
};

TEST_F(RingAttentionTest, WorldRingMatchesWholeSequenceAttention) {
  uint64_t seed = 1000;
  for (const Case& cs : kCases) CheckCase(cs, *world_, *world_, seed += 10);
}

TEST_F(RingAttentionTest, RingOfTwoInsideTheWorld) {
  // cp groups {0, 2} and {1, 3} (or the world itself on 2 ranks): group ranks differ from
  // world ranks, and two rings run at once.
  const int n = world_->size();
  std::vector<std::vector<int>> groups;
  if (n % 2 == 0 && n > 2) {
    for (int g = 0; g < n / 2; ++g) groups.push_back({g, g + n / 2});
  } else {
    std::vector<int> all(n);
    for (int r = 0; r < n; ++r) all[r] = r;
    groups.push_back(all);
  }
  std::unique_ptr<dist::Communicator> cp = world_->Split(groups);
  uint64_t seed = 2000;
  for (const Case& cs : {kCases[2], kCases[5]}) CheckCase(cs, *cp, *world_, seed += 10);
}

TEST_F(RingAttentionTest, FusedBf16PathOnTheWorldRingMatchesWholeSequenceAttention) {
  auto ctx = Bf16Context();
  EXPECT_TRUE(kernels::UseFlashAttention(ctx.get(), 64));
  uint64_t seed = 4000;
  for (const Case& cs : kFusedCases) CheckCase(cs, *world_, *world_, seed += 10, ctx.get());
}

TEST_F(RingAttentionTest, FusedBf16PathOnOneRank) {
  auto ctx = Bf16Context();
  std::unique_ptr<dist::Communicator> cp = dist::MakeLocalCommunicator(Device::Cpu(), world_->rank());
  uint64_t seed = 5000;
  for (const Case& cs : kFusedCases) CheckCase(cs, *cp, *world_, seed += 10, ctx.get());
}

TEST_F(RingAttentionTest, OneRankHoldsBothChunks) {
  // cp = 1: chunks 0 and 1 of every sequence, one step, nothing sent.
  std::unique_ptr<dist::Communicator> cp = dist::MakeLocalCommunicator(Device::Cpu(), world_->rank());
  uint64_t seed = 3000;
  for (const Case& cs : kCases) CheckCase(cs, *cp, *world_, seed += 10);
}

}  // namespace
}  // namespace switchyard::dense
