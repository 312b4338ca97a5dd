// The route / admit phases (moe/group_routing.h) and the statistics phase (moe/moe_stats.h)
// alone, on one process:
//   - whole groups: RouteGroups + AdmitGroups equal RouterForward, the aux / z losses and
//     AdmitToCapacity group by group (bitwise), and OwnRowsOf lays the groups one after the
//     other;
//   - RouterLogits on pieces of a group (jitter keyed by the pieces' global tokens) then
//     RouterChoose on the concatenated logits equal RouterForward on the whole group: what
//     every tp rank does after the logits' all-gather;
//   - a group split into P pieces as tp ranks see it: RouteGroupsBackward of each piece sums
//     to the whole group's backward (dh row blocks, the router gradient), and RoutingStats of
//     the pieces add up to the whole group's statistics (aux, z and groups counted once).
//   - RoutingStats with valid_tokens leaves an evaluation's padding tokens out of the token
//     statistics (a hand-set group, whole, as a tp piece, and with a non-contiguous layout).
// The multi-rank version with a real tp group is tests/dist/moe_layer_tp_test.cc.
#include "moe/group_routing.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "moe/moe_stats.h"
#include "tests/moe/moe_layer_test_util.h"

namespace switchyard::moe {
namespace {

using testing::Config;
using testing::Normal;

MoEConfig TestConfig() {
  MoEConfig c = Config(6, 2, Activation::kGelu);
  c.capacity_factor = 0.75f;
  c.aux_loss_coef = 0.01f;
  c.z_loss_coef = 0.001f;
  c.jitter_eps = 0.1f;
  c.second_expert_policy = SecondExpertPolicy::kRandom;
  return c;
}

template <typename T>
std::vector<T> Vec(const Tensor& t) {
  return t.ToVector<T>();
}

void ExpectNear(const Tensor& got, const Tensor& want, double tol, const char* what) {
  const std::vector<float> g = Vec<float>(got), w = Vec<float>(want);
  ASSERT_EQ(g.size(), w.size()) << what;
  double scale = 0;
  for (float v : w) scale = std::max(scale, double(std::abs(v)));
  for (size_t i = 0; i < g.size(); ++i) {
    EXPECT_NEAR(g[i], w[i], tol * (std::abs(w[i]) + scale)) << what << "[" << i << "]";
  }
}

// The scales of the router backward's products (router.cc), from the whole groups' dlogits
// (each row's dlogits comes from that row's probs, gates and dgates and the group's aux / z
// constants, so a piece's rows get the same values):
//   dh = (dlogits Wr^T) * noise: a product of inner dimension E, then one f32 multiply (into
//     a zeroed dh: the add is exact), so |fl(dh) - dh| <= gamma_{E+1} (|dlogits| |Wr^T|) |noise|
//     for the whole and for a piece alike: the pieces' rows are within twice that (the
//     product bound's 2 (E + 3) u covers it);
//   dWr = sum over groups of x_g^T dlogits_g, accumulated into dWr: the whole adds G products
//     of inner dimension T, the pieces G P products of T / P. Every term x_ti dlogits_te takes
//     at most G T + 1 roundings either way, so both are within gamma_{GT+1} (|X^T| |dlogits|)
//     of the exact sum, i.e. a product bound of inner dimension G T.
struct RouterTermScale {
  std::vector<double> dh;   // (G T, d)
  std::vector<double> dwr;  // (d, E)
};
RouterTermScale RouterTerms(const RoutedGroups& whole, const Tensor& wr, const MoEConfig& c,
                            const Tensor& dgates, std::span<const float> daux,
                            std::span<const float> dz) {
  const int64_t G = static_cast<int64_t>(whole.router.size()), d = wr.dim(0), E = wr.dim(1);
  const std::vector<float> wr_v = Vec<float>(wr);
  std::vector<float> x_all, dl_all;
  RouterTermScale s;
  for (int64_t g = 0; g < G; ++g) {
    const RouterOutput& r = whole.router[g];
    const int64_t T = r.input.dim(0);
    // RouteGroupsBackward's inputs to RouterBackward for a whole group, to get its dlogits.
    Tensor dprobs = Tensor::Zeros({T, E}, DType::kF32);
    BalanceLossBackward(whole.terms[g], c.top_k, c.aux_loss_coef, daux[g], dprobs,
                        kernels::Write::kAdd);
    Tensor dlogits_extra = Tensor::Zeros({T, E}, DType::kF32);
    ZLossBackward(r.logits, c.z_loss_coef, dz[g], dlogits_extra, kernels::Write::kAdd, 0);
    Tensor scratch_dh = Tensor::Zeros({T, d}, DType::kF32), scratch_dwr = Tensor::Zeros({d, E}, DType::kF32);
    const std::vector<float> dl = Vec<float>(RouterBackward(
        r, wr, c, dgates.Slice(g * T, (g + 1) * T), dprobs, dlogits_extra, scratch_dh, scratch_dwr));
    const std::vector<double> dx = test_util::AbsProduct(dl, false, wr_v, true, T, d, E);
    const std::vector<float> noise =
        r.jitter.on ? Vec<float>(JitterNoise(r)) : std::vector<float>(T * d, 1.0f);
    for (int64_t i = 0; i < T * d; ++i) s.dh.push_back(dx[i] * std::abs(double(noise[i])));
    const std::vector<float> x = Vec<float>(r.input);
    x_all.insert(x_all.end(), x.begin(), x.end());
    dl_all.insert(dl_all.end(), dl.begin(), dl.end());
  }
  const int64_t N = static_cast<int64_t>(dl_all.size()) / E;
  s.dwr = test_util::AbsProduct(x_all, true, dl_all, false, d, E, N);
  return s;
}

TEST(GroupRoutingTest, WholeGroupsAreTheRouterGroupByGroup) {
  for (DropPolicy policy : {DropPolicy::kPosition, DropPolicy::kProbability}) {
    MoEConfig c = TestConfig();
    c.drop_policy = policy;
    const int64_t G = 3, T = 16, d = c.d_model, E = c.num_experts, k = c.top_k, first = 100;
    Tensor h = Normal({G * T, d}, 1, 1.0f), wr = Normal({d, E}, 2, 0.8f);
    Tensor bias = Tensor::FromVector<float>({0.01f, 0.0f, -0.02f, 0.03f, 0.0f, 0.01f}, {E});
    RoutedGroups routed =
        RouteGroups(h, T, wr, bias, c, /*training=*/true, RouterRng{c.seed, 5, 2, first}, nullptr);
    AdmitGroups(routed, c.capacity_factor, c);
    ASSERT_EQ(routed.groups, G);
    ASSERT_EQ(routed.group_tokens, T);
    const OwnRouting own = OwnRowsOf(routed);
    const int64_t capacity = ExpertCapacity(c.capacity_factor, T, k, E);
    int64_t dropped = 0;
    for (int64_t g = 0; g < G; ++g) {
      RouterOutput r = RouterForward(h.Slice(g * T, (g + 1) * T), wr, bias, c, true,
                                     RouterRng{c.seed, 5, 2, first + g * T});
      EXPECT_EQ(Vec<float>(routed.router[g].logits), Vec<float>(r.logits));
      EXPECT_EQ(Vec<int32_t>(routed.router[g].indices), Vec<int32_t>(r.indices));
      EXPECT_EQ(Vec<uint8_t>(routed.router[g].keep), Vec<uint8_t>(r.keep));
      EXPECT_EQ(routed.aux[g], LoadBalancingLoss(r.probs, r.indices, c.aux_loss_coef, 0, nullptr));
      EXPECT_EQ(routed.z[g], ZLoss(r.logits, c.z_loss_coef, 0, nullptr));
      EXPECT_EQ(routed.lse_sq[g], ZLoss(r.logits, 1.0f, 0, nullptr));  // z / coef, kept always
      Admission a = AdmitToCapacity(r.indices, r.gates, r.keep, E, capacity, policy);
      EXPECT_EQ(Vec<uint8_t>(routed.admission[g].kept), Vec<uint8_t>(a.kept));
      dropped += a.dropped;
      EXPECT_EQ(Vec<int32_t>(own.experts.Slice(g * T, (g + 1) * T)), Vec<int32_t>(r.indices));
      EXPECT_EQ(Vec<float>(own.gates.Slice(g * T, (g + 1) * T)), Vec<float>(r.gates));
      EXPECT_EQ(Vec<uint8_t>(own.kept.Slice(g * T, (g + 1) * T)), Vec<uint8_t>(a.kept));
    }
    EXPECT_GT(dropped, 0) << "capacity 0.75 should drop";
    const MoEGroupValues v = GroupValuesOf(routed, k);
    EXPECT_EQ(v.aux, routed.aux);
    EXPECT_EQ(v.tokens_per_expert_kept.size(), static_cast<size_t>(G * E));
  }
}

// What each tp rank computes: its piece's logits, then the whole group's choice from the
// gathered logits, equal to one rank routing the whole group.
TEST(GroupRoutingTest, LogitsOfPiecesThenChooseIsTheWholeGroup) {
  const MoEConfig c = TestConfig();
  const int64_t T = 16, P = 4, d = c.d_model, E = c.num_experts, first = 48;
  Tensor h = Normal({T, d}, 3, 1.0f), wr = Normal({d, E}, 4, 0.8f);
  const RouterRng rng{c.seed, 7, 1, first};
  RouterOutput whole = RouterForward(h, wr, Tensor(), c, true, rng);
  RouterOutput gathered;
  gathered.logits = Tensor::Empty({T, E}, DType::kF32);
  for (int64_t r = 0; r < P; ++r) {
    RouterRng piece_rng = rng;
    piece_rng.first_token += r * T / P;
    RouterOutput piece =
        RouterLogits(h.Slice(r * T / P, (r + 1) * T / P), wr, c, true, piece_rng);
    EXPECT_EQ(Vec<float>(JitterNoise(piece)),
              Vec<float>(JitterNoise(whole).Slice(r * T / P, (r + 1) * T / P)))
        << "jitter of piece " << r;
    EXPECT_EQ(Vec<float>(piece.input), Vec<float>(whole.input.Slice(r * T / P, (r + 1) * T / P)))
        << "router input of piece " << r;
    gathered.logits.Slice(r * T / P, (r + 1) * T / P).CopyFrom(piece.logits);
  }
  ExpectNear(gathered.logits, whole.logits, 1e-6, "logits");
  gathered.logits.CopyFrom(whole.logits);  // the choice from the same bits
  RouterChoose(gathered, Tensor(), c, rng);
  EXPECT_EQ(Vec<int32_t>(gathered.indices), Vec<int32_t>(whole.indices));
  EXPECT_EQ(Vec<float>(gathered.gates), Vec<float>(whole.gates));
  EXPECT_EQ(Vec<uint8_t>(gathered.keep), Vec<uint8_t>(whole.keep));
}

// DeepSeek-V3's router on TestConfig's layer: sigmoid scores, normalised gates, 3 groups of
// 2 experts of which each token may use 2, the sequence-wise aux loss over sequences of 5
// tokens (so that sequences straddle the tp pieces of 4 and the last one is shorter).
MoEConfig DeepSeekConfig() {
  MoEConfig c = TestConfig();
  c.score = ScoreFunction::kSigmoid;
  c.normalize_gates = true;
  c.route_groups = 3;
  c.route_group_topk = 2;
  c.aux_loss_scope = AuxLossScope::kSequence;
  c.seq_len = 5;
  c.aux_loss_coef = 0.1f;
  EXPECT_TRUE(c.Validate().ok()) << c.Validate();
  return c;
}

// The pieces of tp ranks (simulated: the whole groups' routing seen with tp_rank r of P)
// add up to the whole: own rows, statistics, and the router's backward; with the default
// router and with DeepSeekConfig's.
TEST(GroupRoutingTest, PiecesAddUpToTheWholeGroup) {
  for (const MoEConfig& c : {TestConfig(), DeepSeekConfig()}) {
  SCOPED_TRACE(StrCat("score=", ScoreFunctionName(c.score), " route_groups=", c.route_groups));
  const int64_t G = 2, T = 12, P = 3, t = T / P, d = c.d_model, E = c.num_experts;
  const int64_t k = c.top_k;
  Tensor h = Normal({G * T, d}, 5, 1.0f), wr = Normal({d, E}, 6, 0.8f);
  RoutedGroups whole = RouteGroups(h, T, wr, Tensor(), c, true, RouterRng{c.seed, 1, 0, 0},
                                   nullptr);
  AdmitGroups(whole, c.capacity_factor, c);
  const OwnRouting all = OwnRowsOf(whole);
  const MoEStats want = RoutingStats(whole, all, E);
  EXPECT_GT(want.dropped(), 0);

  Tensor dgates = Normal({G * T, k}, 7, 1.0f);
  const std::vector<float> daux = {0.5f, 0.75f}, dz = {0.25f, 2.0f};
  Tensor dh = Tensor::Zeros({G * T, d}, DType::kF32), dwr = Tensor::Zeros({d, E}, DType::kF32);
  RouteGroupsBackward(whole.router, whole.terms, wr, c, dgates, daux, dz, 0, dh, dwr);
  const RouterTermScale terms = RouterTerms(whole, wr, c, dgates, daux, dz);

  MoEStats sum;
  Tensor dwr_sum = Tensor::Zeros({d, E}, DType::kF32);
  for (int r = 0; r < P; ++r) {
    SCOPED_TRACE(StrCat("piece ", r));
    // Rank r of P: the same whole-group routing, its own rows' router input.
    RoutedGroups piece = whole;
    piece.tp_rank = r;
    piece.tp_size = P;
    std::vector<int64_t> rows;  // this piece's rows of h, group by group
    for (int64_t g = 0; g < G; ++g) {
      piece.router[g].input = whole.router[g].input.Slice(r * t, (r + 1) * t);
      // Rows r t.. of the group: their noise is drawn from the tokens r t on.
      ASSERT_TRUE(whole.router[g].jitter.runs.empty());
      piece.router[g].jitter.rng.first_token += r * t;
      for (int64_t i = 0; i < t; ++i) rows.push_back(g * T + r * t + i);
    }
    const OwnRouting own = OwnRowsOf(piece);
    const std::vector<int32_t> all_experts = Vec<int32_t>(all.experts);
    const std::vector<int32_t> own_experts = Vec<int32_t>(own.experts);
    const std::vector<uint8_t> all_kept = Vec<uint8_t>(all.kept), own_kept = Vec<uint8_t>(own.kept);
    Tensor own_dgates = Tensor::Empty({G * t, k}, DType::kF32);
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(own_experts[i * k + j], all_experts[rows[i] * k + j]);
        EXPECT_EQ(own_kept[i * k + j], all_kept[rows[i] * k + j]);
      }
      own_dgates.Slice(i, i + 1).CopyFrom(dgates.Slice(rows[i], rows[i] + 1));
    }
    MoEStats s = RoutingStats(piece, own, E);
    EXPECT_EQ(s.groups, r == 0 ? G : 0);
    sum.Add(s);
    Tensor own_dh = Tensor::Zeros({G * t, d}, DType::kF32);
    RouteGroupsBackward(piece.router, piece.terms, wr, c, own_dgates, daux, dz, r, own_dh,
                        dwr_sum);
    std::vector<float> got_dh, want_dh;
    std::vector<double> dh_scale;
    const std::vector<float> own_dh_v = Vec<float>(own_dh), dh_v = Vec<float>(dh);
    for (size_t i = 0; i < rows.size(); ++i) {
      for (int64_t j = 0; j < d; ++j) {
        got_dh.push_back(own_dh_v[i * d + j]);
        want_dh.push_back(dh_v[rows[i] * d + j]);
        dh_scale.push_back(terms.dh[rows[i] * d + j]);
      }
    }
    test_util::ExpectWithinProductBound(got_dh, want_dh, dh_scale, E,
                                        StrCat("piece ", r, " dh rows"));
  }
  test_util::ExpectWithinProductBound(Vec<float>(dwr_sum), Vec<float>(dwr), terms.dwr, G * T,
                                      "router weight gradient");
  EXPECT_EQ(sum.tokens_per_expert, want.tokens_per_expert);
  EXPECT_EQ(sum.tokens_per_expert_kept, want.tokens_per_expert_kept);
  EXPECT_EQ(sum.tokens, want.tokens);
  EXPECT_EQ(sum.assignments, want.assignments);
  EXPECT_EQ(sum.groups, want.groups);
  EXPECT_EQ(sum.aux_sum, want.aux_sum);
  EXPECT_EQ(sum.z_sum, want.z_sum);
  EXPECT_NEAR(sum.entropy_sum, want.entropy_sum, 1e-6 * want.entropy_sum);
  }
}

// RoutingStats with valid_tokens (an evaluation's padding rows left out of the token
// statistics), on a group of T = 4 tokens over E = 2 experts, top-1, set by hand:
//   token     0       1          2          3
//   expert    0       1          1          0
//   kept      1       1          0          1
//   probs   (1, 0) (0.5, 0.5) (0.5, 0.5)  (1, 0)      entropy 0, ln 2, ln 2, 0
// aux 0.25, z 0.5. valid_tokens 2 on the whole group: tokens 0, 1 -> 2 tokens, 2
// assignments, 1 per expert before dropping and after, entropy ln 2; aux, z and the group
// still counted (the padding was routed). As tp rank 1 of 2 (own rows = tokens 2, 3) with
// valid 3: token 2 alone -> 1 token, expert 1, not kept, entropy ln 2, no group (rank 0
// counts it). With a non-contiguous layout whose own rows are tokens 3, 0 (valid 3): token 0
// alone -> expert 0, kept, entropy 0. valid_tokens -1 or >= T: every token.
TEST(GroupRoutingTest, RoutingStatsLeavesOutPaddingTokens) {
  const int64_t T = 4, E = 2;
  RoutedGroups r;
  r.groups = 1;
  r.group_tokens = T;
  r.top_k = 1;
  RouterOutput out;
  out.probs = Tensor::FromVector<float>({1, 0, 0.5f, 0.5f, 0.5f, 0.5f, 1, 0}, {T, E});
  out.indices = Tensor::FromVector<int32_t>({0, 1, 1, 0}, {T, 1});
  r.router.push_back(out);
  LoadBalanceSums sums;
  sums.assignments = {2, 2};
  sums.prob_sums = {3, 1};
  sums.tokens = T;
  r.balance.push_back(sums);
  Admission adm;
  adm.kept = Tensor::FromVector<uint8_t>({1, 1, 0, 1}, {T, 1});
  adm.counts_before = {2, 2};
  adm.counts_after = {2, 1};
  r.admission.push_back(adm);
  r.aux = {0.25f};
  r.z = {0.5f};
  r.lse_sq = {500.0f};
  const OwnRouting all{out.indices, Tensor(), adm.kept};
  const double ln2 = std::log(2.0);

  const MoEStats every = RoutingStats(r, all, E);
  EXPECT_EQ(every.tokens, 4);
  EXPECT_EQ(every.tokens_per_expert, (std::vector<int64_t>{2, 2}));
  EXPECT_EQ(every.tokens_per_expert_kept, (std::vector<int64_t>{2, 1}));
  for (int64_t v : {int64_t{4}, int64_t{9}}) {
    const MoEStats s = RoutingStats(r, all, E, nullptr, v);
    EXPECT_EQ(s.tokens, every.tokens) << v;
    EXPECT_EQ(s.tokens_per_expert, every.tokens_per_expert) << v;
    EXPECT_EQ(s.tokens_per_expert_kept, every.tokens_per_expert_kept) << v;
    EXPECT_EQ(s.entropy_sum, every.entropy_sum) << v;
  }

  const MoEStats two = RoutingStats(r, all, E, nullptr, 2);
  EXPECT_EQ(two.tokens, 2);
  EXPECT_EQ(two.assignments, 2);
  EXPECT_EQ(two.tokens_per_expert, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(two.tokens_per_expert_kept, (std::vector<int64_t>{1, 1}));
  EXPECT_NEAR(two.entropy_sum, ln2, 1e-6);
  EXPECT_EQ(two.groups, 1);
  EXPECT_EQ(two.aux_sum, 0.25);
  EXPECT_EQ(two.z_sum, 0.5);
  EXPECT_EQ(two.lse_sq_sum, 500.0);  // a group value: the padding rows' logits count
  const MoEStats none = RoutingStats(r, all, E, nullptr, 0);
  EXPECT_EQ(none.tokens, 0);
  EXPECT_EQ(none.tokens_per_expert, (std::vector<int64_t>{0, 0}));
  EXPECT_EQ(none.entropy_sum, 0.0);

  RoutedGroups piece = r;  // tp rank 1 of 2: rows 2, 3
  piece.tp_rank = 1;
  piece.tp_size = 2;
  const OwnRouting own{out.indices.Slice(2, 4), Tensor(), adm.kept.Slice(2, 4)};
  const MoEStats p = RoutingStats(piece, own, E, nullptr, 3);
  EXPECT_EQ(p.tokens, 1);
  EXPECT_EQ(p.assignments, 1);
  EXPECT_EQ(p.tokens_per_expert, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(p.tokens_per_expert_kept, (std::vector<int64_t>{0, 0}));
  EXPECT_NEAR(p.entropy_sum, ln2, 1e-6);
  EXPECT_EQ(p.groups, 0);

  piece.own_rows = Tensor::FromVector<int64_t>({3, 0}, {2});  // rows: tokens 3, then 0
  const OwnRouting own2{Tensor::FromVector<int32_t>({0, 0}, {2, 1}), Tensor(),
                        Tensor::FromVector<uint8_t>({1, 1}, {2, 1})};
  const MoEStats q = RoutingStats(piece, own2, E, nullptr, 3);
  EXPECT_EQ(q.tokens, 1);
  EXPECT_EQ(q.tokens_per_expert, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(q.tokens_per_expert_kept, (std::vector<int64_t>{1, 0}));
  EXPECT_EQ(q.entropy_sum, 0.0);
}

}  // namespace
}  // namespace switchyard::moe
