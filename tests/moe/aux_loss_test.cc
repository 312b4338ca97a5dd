// The auxiliary losses (moe/aux_loss.h): balanced routing gives exactly aux_loss_coef,
// hand-computed aux and z on two tokens, pieces of a split group adding up to the group,
// and the gradient of aux + z + sum(gates * c) with respect to Wr and h through the whole
// router (jitter, softmax, gate normalisation, z-loss) against central finite differences
// of a double-precision reference with the routing choices held fixed; and the sums left
// on the device for the training step's readback (LoadBalanceSumsInto) giving the host's
// aux, counts and gradient column bit for bit.
#include "moe/aux_loss.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <numeric>
#include <vector>

#include "moe/router.h"

namespace switchyard::moe {
namespace {

// The router's output for logits (T, E) themselves: an identity router (h = logits,
// Wr = I), softmax top-k, no noise.
RouterOutput IdentityRoute(const std::vector<float>& logits, int64_t T, int64_t E, int64_t k) {
  MoEConfig config;
  config.d_model = E;
  config.num_experts = E;
  config.top_k = k;
  std::vector<float> eye(E * E, 0.0f);
  for (int64_t e = 0; e < E; ++e) eye[e * E + e] = 1.0f;
  return RouterForward(Tensor::FromVector(logits, {T, E}), Tensor::FromVector(eye, {E, E}),
                       Tensor(), config, false, RouterRng{});
}

// A (rows, cols) f32 of NaN: what a kSet write must cover, never read.
Tensor NaNs(const Shape& shape) {
  return Tensor::FromVector(
      std::vector<float>(NumElements(shape), std::numeric_limits<float>::quiet_NaN()), shape);
}

TEST(AuxLossTest, BalancedRoutingGivesTheCoefficient) {
  const int64_t T = 8, E = 4, k = 2;
  std::vector<float> probs(T * E, 0.25f);
  std::vector<int32_t> idx(T * k);
  for (int64_t t = 0; t < T; ++t) {
    idx[2 * t] = static_cast<int32_t>(t % E);
    idx[2 * t + 1] = static_cast<int32_t>((t + 1) % E);
  }
  const float coef = 0.01f;
  Tensor dprobs = Tensor::Zeros({T, E}, DType::kF32);
  const float aux = LoadBalancingLoss(Tensor::FromVector(probs, {T, E}),
                                      Tensor::FromVector(idx, {T, k}), coef, 1.0f, &dprobs);
  EXPECT_EQ(aux, coef);
  // d aux / d probs[t, i] = coef * E * f_i / T = 0.01 * 4 * 0.25 / 8.
  for (float v : dprobs.ToVector<float>()) EXPECT_FLOAT_EQ(v, 0.01f * 4 * 0.25f / 8);
}

TEST(AuxLossTest, TwoTokensByHand) {
  // probs: t0 (0.75, 0.25) from logits (ln 3, 0); t1 (0.5, 0.5) from (0, 0). Both choose
  // expert 0 (t1 by the tie rule): f = (1, 0), P = (0.625, 0.375).
  const float coef = 0.1f;
  Tensor probs = Tensor::FromVector(std::vector<float>{0.75f, 0.25f, 0.5f, 0.5f}, {2, 2});
  Tensor idx = Tensor::FromVector(std::vector<int32_t>{0, 0}, {2, 1});
  Tensor dprobs = Tensor::Zeros({2, 2}, DType::kF32);
  // aux = coef * E * (1 * 0.625 + 0 * 0.375) = 1.25 coef.
  EXPECT_FLOAT_EQ(LoadBalancingLoss(probs, idx, coef, 2.0f, &dprobs), 1.25f * coef);
  // grad * coef * E * f_i / T = 2 * 0.1 * 2 * (1, 0) / 2.
  EXPECT_EQ(dprobs.ToVector<float>(), (std::vector<float>{0.2f, 0.0f, 0.2f, 0.0f}));

  // z = coef * ((ln 4)^2 + (ln 2)^2) / 2 = 2.5 coef (ln 2)^2.
  const float ln2 = std::log(2.0f), ln3 = std::log(3.0f);
  Tensor logits = Tensor::FromVector(std::vector<float>{ln3, 0.0f, 0.0f, 0.0f}, {2, 2});
  Tensor dlogits = Tensor::Zeros({2, 2}, DType::kF32);
  EXPECT_NEAR(ZLoss(logits, coef, 1.0f, &dlogits), 2.5 * coef * ln2 * ln2, 1e-7);
  // dz/dlogits[t] = coef * 2 * lse_t / T * softmax_t: t0 0.1 ln 4 (0.75, 0.25), t1 0.1 ln 2 (0.5,
  // 0.5).
  const std::vector<float> dl = dlogits.ToVector<float>();
  const std::vector<double> expected = {0.1 * 2 * ln2 * 0.75, 0.1 * 2 * ln2 * 0.25, 0.1 * ln2 * 0.5,
                                        0.1 * ln2 * 0.5};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(dl[i], expected[i], 1e-7) << i;
}

TEST(AuxLossTest, SplitGroupPiecesAddUpToTheGroup) {
  const int64_t T = 9, E = 3, k = 2;
  std::vector<float> logits(T * E);
  for (int64_t i = 0; i < T * E; ++i) logits[i] = 3.0f * UniformAt({5, 6}, i) - 1.5f;
  RouterOutput r = IdentityRoute(logits, T, E, k);
  Tensor whole_dp = Tensor::Zeros({T, E}, DType::kF32);
  Tensor whole_dl = Tensor::Zeros({T, E}, DType::kF32);
  const float aux = LoadBalancingLoss(r.probs, r.indices, 0.3f, 1.0f, &whole_dp);
  const float z = ZLoss(r.logits, 0.2f, 1.0f, &whole_dl);

  const std::vector<int64_t> cuts = {0, 4, 9};
  LoadBalanceSums group;
  group.assignments.assign(E, 0);
  group.prob_sums.assign(E, 0.0f);
  double z_sum = 0.0;
  Tensor dp = Tensor::Zeros({T, E}, DType::kF32);
  Tensor dl = Tensor::Zeros({T, E}, DType::kF32);
  for (int p = 0; p < 2; ++p) {
    LoadBalanceSums s = LoadBalanceSumsOf(r.probs.Slice(cuts[p], cuts[p + 1]),
                                          r.indices.Slice(cuts[p], cuts[p + 1]));
    for (int64_t e = 0; e < E; ++e) {
      group.assignments[e] += s.assignments[e];
      group.prob_sums[e] += s.prob_sums[e];
    }
    group.tokens += s.tokens;
    Tensor piece_dl = dl.Slice(cuts[p], cuts[p + 1]);
    z_sum += ZLoss(r.logits.Slice(cuts[p], cuts[p + 1]), 0.2f, 1.0f, &piece_dl, T);
  }
  EXPECT_FLOAT_EQ(LoadBalancingLossFromSums(group, k, 0.3f), aux);
  EXPECT_FLOAT_EQ(static_cast<float>(z_sum), z);
  for (int p = 0; p < 2; ++p) {
    Tensor piece = dp.Slice(cuts[p], cuts[p + 1]);
    LoadBalancingLossBackward(group, k, 0.3f, 1.0f, piece, kernels::Write::kAdd);
  }
  EXPECT_EQ(dp.ToVector<float>(), whole_dp.ToVector<float>());
  EXPECT_EQ(dl.ToVector<float>(), whole_dl.ToVector<float>());
}

// The loss aux + z + sum(gates * c) of one group in double, with the expert choices (and
// the jitter noise) held fixed; checks that the choices it would make agree. Softmax or
// sigmoid scores (probs = scores / their sum, gates from the scores); the aux loss over the
// whole group or, with seq_len > 0, the mean over its sequences of seq_len tokens.
struct Reference {
  int64_t T, d, E, k;
  bool normalize;
  float aux_coef, z_coef;
  std::vector<double> noise;  // (T, d), ones without jitter
  std::vector<int32_t> idx;   // (T, k)
  std::vector<double> c;      // (T, k)
  bool sigmoid = false;
  int64_t seq_len = 0;

  double Loss(const std::vector<double>& h, const std::vector<double>& wr,
              double* aux_out = nullptr, double* z_out = nullptr,
              std::vector<double>* gates_out = nullptr) const {
    const int64_t S = seq_len > 0 ? seq_len : T, parts = (T + S - 1) / S;
    std::vector<double> prob_sum(parts * E, 0.0);
    std::vector<int64_t> counts(parts * E, 0);
    double z = 0.0, gate_term = 0.0;
    for (int64_t t = 0; t < T; ++t) {
      std::vector<double> l(E, 0.0);
      for (int64_t e = 0; e < E; ++e) {
        for (int64_t j = 0; j < d; ++j) l[e] += h[t * d + j] * noise[t * d + j] * wr[j * E + e];
      }
      const double m = *std::max_element(l.begin(), l.end());
      double s = 0.0;
      for (double v : l) s += std::exp(v - m);
      const double lse = m + std::log(s);
      z += lse * lse;
      std::vector<double> p(E), score(E);
      double score_sum = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        score[e] = sigmoid ? 1.0 / (1.0 + std::exp(-l[e])) : std::exp(l[e] - lse);
        score_sum += score[e];
      }
      const int64_t part = t / S;
      for (int64_t e = 0; e < E; ++e) {
        p[e] = score[e] / score_sum;
        prob_sum[part * E + e] += p[e];
      }
      // The routing must be the fixed one.
      std::vector<int32_t> order(E);
      std::iota(order.begin(), order.end(), 0);
      std::stable_sort(order.begin(), order.end(),
                       [&](int32_t a, int32_t b) { return score[a] > score[b]; });
      double gsum = 0.0;
      for (int64_t j = 0; j < k; ++j) {
        EXPECT_EQ(order[j], idx[t * k + j]) << "perturbation changed the routing";
        gsum += score[idx[t * k + j]];
        ++counts[part * E + idx[t * k + j]];
      }
      for (int64_t j = 0; j < k; ++j) {
        const double g = score[idx[t * k + j]] / (normalize ? gsum : 1.0);
        gate_term += g * c[t * k + j];
        if (gates_out) gates_out->push_back(g);
      }
    }
    double aux = 0.0;
    for (int64_t q = 0; q < parts; ++q) {
      const double tokens = static_cast<double>(std::min(T, (q + 1) * S) - q * S);
      for (int64_t e = 0; e < E; ++e) {
        aux += static_cast<double>(counts[q * E + e]) / (tokens * k) * prob_sum[q * E + e] / tokens;
      }
    }
    aux *= aux_coef * E / parts;
    z *= static_cast<double>(z_coef) / T;
    if (aux_out) *aux_out = aux;
    if (z_out) *z_out = z;
    return aux + z + gate_term;
  }
};

TEST(AuxLossTest, RouterGradientsMatchFiniteDifferences) {
  const int64_t T = 7, d = 5, E = 6, k = 2;
  // Tolerance for analytic (fp32) vs central difference (fp64, step 1e-5: truncation
  // ~1e-10, round-off ~1e-11): |a - fd| <= 2e-6 + 1e-4 |fd|.
  const double kAtol = 2e-6, kRtol = 1e-4, kStep = 1e-5;
  for (ScoreFunction score : {ScoreFunction::kSoftmax, ScoreFunction::kSigmoid}) {
  for (int64_t seq_len : {0, 3}) {
  for (bool normalize : {false, true}) {
    for (float jitter : {0.0f, 0.2f}) {
      SCOPED_TRACE(testing::Message() << "score=" << ScoreFunctionName(score) << " seq_len="
                                      << seq_len << " normalize_gates=" << normalize
                                      << " jitter=" << jitter);
      MoEConfig config;
      config.d_model = d;
      config.num_experts = E;
      config.top_k = k;
      config.d_expert = 4;
      config.normalize_gates = normalize;
      config.jitter_eps = jitter;
      config.aux_loss_coef = 0.3f;
      config.z_loss_coef = 0.05f;
      config.score = score;
      config.aux_loss_scope = seq_len > 0 ? AuxLossScope::kSequence : AuxLossScope::kGroup;
      config.seq_len = seq_len;
      std::vector<float> h(T * d), wr(d * E), c(T * k);
      for (int64_t i = 0; i < T * d; ++i) h[i] = 2.0f * UniformAt({1, 1}, i) - 1.0f;
      for (int64_t i = 0; i < d * E; ++i) wr[i] = 2.0f * (2.0f * UniformAt({1, 2}, i) - 1.0f);
      for (int64_t i = 0; i < T * k; ++i) c[i] = 2.0f * UniformAt({1, 3}, i) - 1.0f;
      Tensor ht = Tensor::FromVector(h, {T, d});
      Tensor wrt = Tensor::FromVector(wr, {d, E});
      RouterOutput out = RouterForward(ht, wrt, Tensor(), config, /*training=*/true,
                                       RouterRng{config.seed, 3, 1, 40});
      ASSERT_EQ(out.jitter.on, jitter > 0.0f);

      Tensor dprobs = NaNs({T, E});  // written whole (kSet), as the MoE layer does
      Tensor dlogits = Tensor::Zeros({T, E}, DType::kF32);
      const BalanceTerms terms =
          BalanceTermsOf(out.probs, out.indices, LoadBalanceSumsOf(out.probs, out.indices),
                         config.aux_loss_scope, config.seq_len, {});
      ASSERT_EQ(terms.parts.size(), seq_len > 0 ? 3u : 1u);
      const float aux = BalanceLoss(terms, k, config.aux_loss_coef);
      BalanceLossBackward(terms, k, config.aux_loss_coef, 1.0f, dprobs, kernels::Write::kSet);
      const float z = ZLoss(out.logits, config.z_loss_coef, 1.0f, &dlogits);
      Tensor dh = Tensor::Zeros({T, d}, DType::kF32);
      Tensor dwr = Tensor::Zeros({d, E}, DType::kF32);
      RouterBackward(out, wrt, config, Tensor::FromVector(c, {T, k}), dprobs, dlogits, dh, dwr);

      Reference ref{T, d, E, k, normalize, config.aux_loss_coef, config.z_loss_coef, {}, {}, {}};
      ref.sigmoid = score == ScoreFunction::kSigmoid;
      ref.seq_len = seq_len;
      ref.noise.assign(T * d, 1.0);
      if (out.jitter.on) {
        const std::vector<float> n = JitterNoise(out).ToVector<float>();
        ref.noise.assign(n.begin(), n.end());
      }
      ref.idx = out.indices.ToVector<int32_t>();
      ref.c.assign(c.begin(), c.end());
      std::vector<double> hd(h.begin(), h.end()), wd(wr.begin(), wr.end());

      // The forward agrees with the reference.
      double ref_aux, ref_z;
      std::vector<double> ref_gates;
      ref.Loss(hd, wd, &ref_aux, &ref_z, &ref_gates);
      EXPECT_NEAR(aux, ref_aux, 1e-6 * std::abs(ref_aux) + 1e-7);
      EXPECT_NEAR(z, ref_z, 1e-6 * std::abs(ref_z) + 1e-7);
      const std::vector<float> gates = out.gates.ToVector<float>();
      for (int64_t i = 0; i < T * k; ++i) EXPECT_NEAR(gates[i], ref_gates[i], 1e-6);

      double worst = 0.0;  // largest fraction of the tolerance used
      auto check = [&](std::vector<double>& x, const std::vector<float>& analytic,
                       const char* what) {
        for (size_t i = 0; i < x.size(); ++i) {
          const double saved = x[i];
          x[i] = saved + kStep;
          const double up = ref.Loss(hd, wd);
          x[i] = saved - kStep;
          const double down = ref.Loss(hd, wd);
          x[i] = saved;
          const double fd = (up - down) / (2 * kStep);
          const double tol = kAtol + kRtol * std::abs(fd);
          worst = std::max(worst, std::abs(analytic[i] - fd) / tol);
          EXPECT_NEAR(analytic[i], fd, tol) << what << "[" << i << "]";
        }
      };
      check(wd, dwr.ToVector<float>(), "dWr");
      check(hd, dh.ToVector<float>(), "dh");
      std::printf("score=%s seq_len=%d normalize_gates=%d jitter=%.1f: gradients used %.1f%% "
                  "of the tolerance\n", ScoreFunctionName(score), static_cast<int>(seq_len),
                  normalize, jitter, 100.0 * worst);
    }
  }
  }
  }
}

// The sequence scope by hand: T = 4 tokens in sequences of 2, E = 2, k = 1.
//   sequence 0: probs (0.75, 0.25), (0.5, 0.5), both choose 0: f = (1, 0), P = (0.625, 0.375)
//     -> coef E (0.625) = 1.25 coef
//   sequence 1: probs (0.25, 0.75), (0.5, 0.5) choosing 1 and 0: f = (0.5, 0.5),
//     P = (0.375, 0.625) -> coef E (0.5) = coef
// aux = (1.25 + 1) / 2 coef; the group scope's f = (0.75, 0.25), P = (0.5, 0.5) gives coef.
// d aux / d probs[t, i] = grad coef E f^s_i / (T_s n): sequence 0 (1, 0) grad coef / 2,
// sequence 1 (0.5, 0.5) grad coef / 2.
TEST(AuxLossTest, SequenceScopeByHand) {
  const float coef = 0.1f;
  Tensor probs = Tensor::FromVector(
      std::vector<float>{0.75f, 0.25f, 0.5f, 0.5f, 0.25f, 0.75f, 0.5f, 0.5f}, {4, 2});
  Tensor idx = Tensor::FromVector(std::vector<int32_t>{0, 0, 1, 0}, {4, 1});
  const LoadBalanceSums group = LoadBalanceSumsOf(probs, idx);
  const BalanceTerms seq = BalanceTermsOf(probs, idx, group, AuxLossScope::kSequence, 2, {});
  ASSERT_EQ(seq.parts.size(), 2u);
  EXPECT_FLOAT_EQ(BalanceLoss(seq, 1, coef), 1.125f * coef);
  const BalanceTerms whole = BalanceTermsOf(probs, idx, group, AuxLossScope::kGroup, 2, {});
  EXPECT_FLOAT_EQ(BalanceLoss(whole, 1, coef), coef);
  Tensor dprobs = NaNs({4, 2});  // kSet: every part's rows written, nothing read
  BalanceLossBackward(seq, 1, coef, 2.0f, dprobs, kernels::Write::kSet);
  const std::vector<float> want = {0.1f, 0.0f, 0.1f, 0.0f, 0.05f, 0.05f, 0.05f, 0.05f};
  const std::vector<float> got = dprobs.ToVector<float>();
  for (int i = 0; i < 8; ++i) EXPECT_FLOAT_EQ(got[i], want[i]) << i;
  // A sequence as long as the group (or seq_len 0) is the group scope, bit for bit.
  const BalanceTerms one = BalanceTermsOf(probs, idx, group, AuxLossScope::kSequence, 4, {});
  EXPECT_EQ(BalanceLoss(one, 1, coef), BalanceLoss(whole, 1, coef));
}

// The global scope by hand: f is the given load, whatever this group chose.
//   load (0.25, 0.75), P = (0.5, 0.5) (the mean of the four rows): aux = coef 2 (0.5) = coef
//   d aux / d probs[t, i] = grad coef E load_i / T = 2 * 0.1 * 2 * (0.25, 0.75) / 4.
TEST(AuxLossTest, GlobalScopeUsesTheGivenLoad) {
  const float coef = 0.1f;
  Tensor probs = Tensor::FromVector(
      std::vector<float>{0.75f, 0.25f, 0.5f, 0.5f, 0.25f, 0.75f, 0.5f, 0.5f}, {4, 2});
  Tensor idx = Tensor::FromVector(std::vector<int32_t>{0, 0, 1, 0}, {4, 1});
  const std::vector<float> load = {0.25f, 0.75f};
  const BalanceTerms terms =
      BalanceTermsOf(probs, idx, LoadBalanceSumsOf(probs, idx), AuxLossScope::kGlobal, 2, load);
  EXPECT_FLOAT_EQ(BalanceLoss(terms, 1, coef), coef);
  Tensor dprobs = NaNs({4, 2});
  BalanceLossBackward(terms, 1, coef, 2.0f, dprobs, kernels::Write::kSet);
  const std::vector<float> got = dprobs.ToVector<float>();
  for (int t = 0; t < 4; ++t) {
    EXPECT_FLOAT_EQ(got[2 * t], 0.025f);
    EXPECT_FLOAT_EQ(got[2 * t + 1], 0.075f);
  }
  // The balanced load 1/E gives aux = coef whatever P (sum P = 1): a constant, no gradient
  // through a softmax or the sigmoid's normalisation.
  const std::vector<float> uniform = {0.5f, 0.5f};
  const BalanceTerms flat =
      BalanceTermsOf(probs, idx, LoadBalanceSumsOf(probs, idx), AuxLossScope::kGlobal, 2, uniform);
  EXPECT_FLOAT_EQ(BalanceLoss(flat, 1, coef), coef);
}

TEST(AuxLossTest, SumsOnTheDeviceGiveTheHostBits) {
  const int64_t T = 37, E = 6, k = 2;
  std::vector<float> logits(T * E), start(T * E);
  for (int64_t i = 0; i < T * E; ++i) {
    logits[i] = 4.0f * UniformAt({7, 8}, i) - 2.0f;
    start[i] = UniformAt({9, 10}, i) - 0.5f;  // dprobs already holding a gradient
  }
  const RouterOutput r = IdentityRoute(logits, T, E, k);
  const float coef = 0.013f, grad = 0.7f;
  const LoadBalanceSums host = LoadBalanceSumsOf(r.probs, r.indices);
  const float aux = LoadBalancingLossFromSums(host, k, coef);
  Tensor want = Tensor::FromVector(start, {T, E});
  LoadBalancingLossBackward(host, k, coef, grad, want, kernels::Write::kAdd);
  Tensor want_set = NaNs({T, E});
  LoadBalancingLossBackward(host, k, coef, grad, want_set, kernels::Write::kSet);

  StepReadback readback;
  readback.Reserve(3, Device::Cpu(), nullptr);  // slots before the group's, as in a step
  const LoadBalanceSums device = LoadBalanceSumsInto(r.probs, r.indices, coef, readback, nullptr);
  ASSERT_TRUE(device.on_device());
  EXPECT_EQ(device.values_slot, 3);
  Tensor got = Tensor::FromVector(start, {T, E});
  LoadBalancingLossBackward(device, k, coef, grad, got, kernels::Write::kAdd);
  EXPECT_EQ(got.ToVector<float>(), want.ToVector<float>());
  Tensor got_set = NaNs({T, E});
  LoadBalancingLossBackward(device, k, coef, grad, got_set, kernels::Write::kSet);
  EXPECT_EQ(got_set.ToVector<float>(), want_set.ToVector<float>());
  Tensor zeros = Tensor::Zeros({T, E}, DType::kF32);  // kSet: the bits of adding into zeros
  LoadBalancingLossBackward(host, k, coef, grad, zeros, kernels::Write::kAdd);
  EXPECT_EQ(std::memcmp(got_set.data<float>(), zeros.data<float>(), T * E * sizeof(float)), 0);
  const std::vector<double> slots = readback.ReadBack(nullptr);
  ASSERT_EQ(slots.size(), static_cast<size_t>(3 + E + 2));
  EXPECT_EQ(slots[3], static_cast<double>(aux));
  EXPECT_NE(aux, 0.0f);
  for (int64_t e = 0; e < E; ++e) {
    EXPECT_EQ(slots[4 + e], static_cast<double>(host.assignments[e])) << "expert " << e;
  }
  EXPECT_EQ(slots[4 + E], 0.0) << "no index outside [0, E)";
}

// A training step's terms (BalanceTermsInto: nothing read back) give the host terms' aux and
// gradient, bit for bit, in every scope: the sequence scope's parts whole and with a shorter
// last one, and the global scope's load.
TEST(AuxLossTest, TermsOnTheDeviceGiveTheHostBits) {
  const int64_t E = 6, k = 2;
  const std::vector<float> load = {0.05f, 0.3f, 0.1f, 0.25f, 0.2f, 0.1f};
  struct Case {
    AuxLossScope scope;
    int64_t T, seq_len;
  };
  const Case cases[] = {{AuxLossScope::kGroup, 40, 8},     {AuxLossScope::kSequence, 40, 8},
                        {AuxLossScope::kSequence, 37, 8},  {AuxLossScope::kSequence, 8, 8},
                        {AuxLossScope::kGlobal, 37, 8}};
  const float coef = 0.013f, grad = 0.7f;
  for (const Case& c : cases) {
    const std::string name = std::string(AuxLossScopeName(c.scope)) + " T=" +
                             std::to_string(c.T) + " seq " + std::to_string(c.seq_len);
    std::vector<float> logits(c.T * E);
    for (int64_t i = 0; i < c.T * E; ++i) logits[i] = 4.0f * UniformAt({11, 12}, i) - 2.0f;
    const RouterOutput r = IdentityRoute(logits, c.T, E, k);
    const std::vector<float> host_load =
        c.scope == AuxLossScope::kGlobal ? load : std::vector<float>{};
    const BalanceTerms host =
        BalanceTermsOf(r.probs, r.indices, LoadBalanceSumsOf(r.probs, r.indices), c.scope,
                       c.seq_len, host_load);
    const float aux = BalanceLoss(host, k, coef);
    Tensor want = NaNs({c.T, E});
    BalanceLossBackward(host, k, coef, grad, want, kernels::Write::kSet);

    StepReadback readback;
    readback.Reserve(2, Device::Cpu(), nullptr);  // slots before the group's, as in a step
    const LoadBalanceSums group = LoadBalanceSumsInto(r.probs, r.indices, coef, readback, nullptr);
    const BalanceTerms device =
        BalanceTermsInto(r.probs, r.indices, group, c.scope, c.seq_len,
                         c.scope == AuxLossScope::kGlobal ? Tensor::FromVector(load, {E})
                                                          : Tensor(),
                         k, coef, readback, nullptr);
    EXPECT_EQ(device.one_row(), host.parts.size() == 1) << name;
    Tensor got = NaNs({c.T, E});
    BalanceLossBackward(device, k, coef, grad, got, kernels::Write::kSet);
    EXPECT_EQ(std::memcmp(got.data<float>(), want.data<float>(), c.T * E * sizeof(float)), 0)
        << name << " dprobs";
    Tensor added = Tensor::FromVector(std::vector<float>(c.T * E, 0.25f), {c.T, E});
    Tensor added_host = added.Clone();
    BalanceLossBackward(device, k, coef, grad, added, kernels::Write::kAdd);
    BalanceLossBackward(host, k, coef, grad, added_host, kernels::Write::kAdd);
    EXPECT_EQ(added.ToVector<float>(), added_host.ToVector<float>()) << name << " kAdd";
    const std::vector<double> slots = readback.ReadBack(nullptr);
    ASSERT_GT(static_cast<int64_t>(slots.size()), device.aux_slot) << name;
    EXPECT_EQ(slots[device.aux_slot], static_cast<double>(aux)) << name << " aux";
    EXPECT_NE(aux, 0.0f) << name;
    // The group scope (and a sequence as long as the group) reuse the group's aux slot.
    const bool own_slot = (c.scope == AuxLossScope::kSequence && c.seq_len < c.T) ||
                          c.scope == AuxLossScope::kGlobal;
    EXPECT_EQ(device.aux_slot != group.values_slot, own_slot) << name;
  }
}

}  // namespace
}  // namespace switchyard::moe
